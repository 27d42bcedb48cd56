//! Two hosts: `perf TEST server` and `perf TEST client HOST`. A TCP
//! connection checks both run the same options and carries the barriers
//! between sizes; the queue pairs are connected with the crate's endpoint
//! exchange over it (the client's hello, then the server's reply, per
//! queue pair), or by rdma_cm with `-R`. The client is the initiator
//! (and the bandwidth sender); both sides print write_lat and send_lat
//! results, the client all others. A client with `--perftest-wire`, and
//! a server whose client's first byte is a digit (perftest's version
//! string; ours starts `perf/`), speak perftest's exchange instead
//! ([`super::perftest_wire`]).

use std::io::{Read, Write};
use std::time::Duration;

use verbs::exchange::{self, Session};
use verbs::Deadline;

use super::clock::Clock;
use super::loops;
use super::opts::Opts;
use super::side::Side;
use super::{open, perftest_wire, rdma_cm, BoxError, Output};

/// Time one size's run may take end to end (the barrier after it).
const RUN: Duration = Duration::from_secs(3600);

/// Runs this side; `host` is the server's address for a client.
pub fn run(opts: &Opts, clock: &Clock, host: Option<&str>) -> Result<(), BoxError> {
    if let (true, Some(h)) = (opts.perftest_wire, host) {
        return perftest_wire::client(opts, clock, h);
    }
    let setup = opts.setup()?;
    let deadline = Deadline::after(opts.setup_timeout);
    // Listening before the client learns (from the TCP handshake) to connect.
    let cm_listener = match (opts.rdma_cm, host) {
        (true, None) => Some(rdma_cm::Listener::bind(opts)?),
        _ => None,
    };
    let session = match host {
        Some(h) => exchange::connect((h, opts.tcp_port), deadline)?,
        None => {
            let listener = exchange::Listener::bind(("0.0.0.0", opts.tcp_port))?;
            eprintln!("perf: waiting for a client on TCP port {}", opts.tcp_port);
            let session = listener.accept(deadline)?;
            if opts.perftest_wire
                || (!opts.rdma_cm && perftest_wire::speaks_perftest(&session, deadline))
            {
                return perftest_wire::server(opts, clock, &listener, session.into_stream());
            }
            session
        }
    };
    let mut session = agree(session, &opts.fingerprint(), deadline)?;
    let mut side = match (&cm_listener, host) {
        (Some(l), _) => l.accept(opts, &setup)?,
        (None, Some(h)) if opts.rdma_cm => rdma_cm::connect(opts, &setup, h)?,
        _ => {
            let mut side = Side::new(&open(opts)?, &setup)?;
            let mut peers = Vec::new();
            for ep in side.endpoints()? {
                // The client speaks first (wire v2); no token: the peer
                // already matched our options line on this connection.
                let peer = match host {
                    Some(_) => session.client_exchange(&ep, None, deadline)?,
                    None => session.server_exchange(&ep, None, deadline)?,
                };
                peers.push(peer);
            }
            side.connect(&peers, &verbs::ConnectOptions::default())?;
            side
        }
    };
    let initiator = host.is_some();
    let mode = if initiator { "client" } else { "server" };
    let mut out = Output::new(opts, &side, clock, mode)?;
    // The ping-pong latency tests measure on both sides; in the others
    // only the initiator does (the passive side's NIC answers for it).
    let reports = initiator || (opts.test.is_latency() && opts.test.peer_is_active());
    for size in opts.sizes() {
        let p = opts.params(&side, size, initiator, clock)?;
        side.prepare(&p)?;
        out.note_depth(&p, side.depth());
        // Both sides prepared (receives posted, inboxes cleared) before
        // either starts.
        session.sync(Deadline::after(opts.setup_timeout))?;
        loops::warm_up(&mut side, &p)?;
        loops::run(&mut side, &p)?;
        session.sync(Deadline::after(RUN))?;
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
fn agree(session: Session, mine: &str, deadline: Deadline) -> Result<Session, BoxError> {
    let mut stream = session.into_stream();
    // A zero timeout is refused: a passed deadline times out at once.
    let left = deadline.remaining().max(Duration::from_millis(1));
    stream.set_read_timeout(Some(left))?;
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
