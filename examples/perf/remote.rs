//! Two hosts: `perf TEST server` and `perf TEST client HOST`, connected
//! with the crate's TCP endpoint exchange. The client is the initiator
//! (and the bandwidth sender); both sides print latency results, the
//! client prints bandwidth results.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use verbs::exchange::{self, Session};

use super::clock::Clock;
use super::loops;
use super::opts::Opts;
use super::side::Side;
use super::{open, params, BoxError, Output};

/// Time for the peer to show up and for connection set-up.
const SETUP: Duration = Duration::from_secs(120);

/// Time one size's run may take end to end (the barrier after it).
const RUN: Duration = Duration::from_secs(3600);

/// Runs this side; `host` is the server's address for a client.
pub fn run(opts: &Opts, clock: &Clock, host: Option<&str>) -> Result<(), BoxError> {
    let (ctx, pd, setup) = open(opts)?;
    let mut side = Side::new(&pd, &setup)?;
    let deadline = Instant::now() + SETUP;
    let session = match host {
        Some(h) => exchange::connect((h, opts.tcp_port), deadline)?,
        None => {
            let listener = exchange::Listener::bind(("0.0.0.0", opts.tcp_port))?;
            eprintln!("perf: waiting for a client on TCP port {}", opts.tcp_port);
            listener.accept(deadline)?
        }
    };
    let mut session = agree(session, &opts.fingerprint(), deadline)?;
    let mut peers = Vec::new();
    for ep in side.endpoints() {
        peers.push(session.exchange(&ep, deadline)?);
    }
    let mtu = side.connect(&peers)?;
    let initiator = host.is_some();
    let mode = if initiator { "client" } else { "server" };
    let mut out = Output::new(opts, &ctx, &side, mtu, clock, mode);
    let reports = opts.test.is_latency() || initiator;
    for size in opts.sizes() {
        let p = params(opts, &side, size, initiator, clock);
        side.prepare(&p)?;
        out.note_depth(&p, side.depth());
        // Both sides prepared (receives posted, inboxes cleared) before
        // either starts.
        session.sync(Instant::now() + SETUP)?;
        loops::run(&mut side, &p)?;
        session.sync(Instant::now() + RUN)?;
        if reports {
            out.result(&side, &p);
        }
    }
    if reports {
        out.finish();
    } else {
        eprintln!("perf: done (the client reports the figures)");
    }
    Ok(())
}

/// Checks both sides run the same test with the same options: one line
/// each way on the exchange's TCP connection.
fn agree(session: Session, mine: &str, deadline: Instant) -> Result<Session, BoxError> {
    let mut stream = session.into_stream();
    stream.set_read_timeout(Some(deadline.saturating_duration_since(Instant::now())))?;
    stream.write_all(format!("{mine}\n").as_bytes())?;
    let theirs = read_line(&mut stream).map_err(|e| format!("reading the peer's options: {e}"))?;
    if theirs != mine {
        return Err(
            format!("the peer runs other options:\n  ours:   {mine}\n  theirs: {theirs}").into(),
        );
    }
    Ok(Session::from_stream(stream)?)
}

/// Reads one line byte by byte: the endpoint exchange follows on the same
/// stream, so nothing past the newline may be consumed.
fn read_line(stream: &mut impl Read) -> std::io::Result<String> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while line.len() < 1024 {
        if stream.read(&mut byte)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if byte[0] == b'\n' {
            return Ok(String::from_utf8_lossy(&line).into_owned());
        }
        line.push(byte[0]);
    }
    Err(std::io::Error::other("options line too long"))
}
