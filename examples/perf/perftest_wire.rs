//! `--perftest-wire`: two hosts, the other one running perftest's `ib_*`
//! tools (or a `perf` speaking their wire). The messages are in
//! [`super::perftest_msg`]; this module sends them when perftest 4.5-0.17's
//! mains do (`src/write_bw.c`, `read_bw.c`, `write_lat.c`, `read_lat.c`,
//! `atomic_lat.c`, `send_lat.c`):
//!
//! - After the version, page size, cache line and MTU messages come rounds
//!   of key messages, queue pair 0's ("one") or every queue pair's in turn
//!   ("each"), each round a barrier too. write_bw, read_bw: each, each,
//!   one. write_lat, read_lat, atomic_lat: one, each, each, one.
//!   send_lat: each, one, each, then one before every size (once both
//!   sides have posted that size's receives). Both sides connect their
//!   queue pairs after the first "each"; the run starts after the last.
//! - Nothing else between the sizes of `-a`: the peer may write the next
//!   size before this side has prepared it, so the inbox is never cleared
//!   ([`Side::clear_inbox`]).
//! - The client starts the ping-pong of send_lat, the server that of
//!   write_lat. Only the client runs bw, read_lat and atomic_lat:
//!   perftest's server waits for a closing round. The bw client then sends
//!   its last size's report, which the server prints.
//! - Last, one more round and "done", except in write_lat, which closes.
//!
//! The options (`-s -n -a -q -t -I`) do not travel: as with perftest, both
//! sides must be given the same.
//!
//! The server validates each of the client's messages before it sends its
//! own ([`super::perftest_peer`]), so its key (the inbox's address and
//! rkey) goes out only after the client's key for that queue pair parsed.
//! A client that breaks the protocol before then is dropped and the next
//! one served; after then, the run ends with an error (its queue pairs and
//! inbox with it).

use std::net::TcpStream;
use std::time::Duration;

use verbs::device::LinkLayer;
use verbs::exchange::{self, Listener, Session};
use verbs::{ConnectOptions, Deadline, Mtu, ProtectionDomain};

use super::clock::Clock;
use super::loops;
use super::opts::Opts;
use super::params::Test;
use super::perftest_msg::{self as msg, Report};
use super::perftest_peer::{BadPeer, Keys, Peer, Round};
use super::report::{self, Bandwidth};
use super::side::Side;
use super::{open, BoxError, Output};

/// Time a run may take before the closing round.
const RUN: Duration = Duration::from_secs(3600);

/// How long to wait for the peer's "done".
const DONE_WAIT: Duration = Duration::from_secs(1);

/// What follows the run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum End {
    /// A round, the client's report, then as `Close`.
    Report,
    /// A round and "done".
    Close,
    /// Nothing.
    Nothing,
}

/// How one test uses the wire.
struct Script {
    /// Rounds before the run; the last one starts it.
    before: &'static [Round],
    /// A round before every size.
    round_per_size: bool,
    /// The client starts the run (else the server).
    client_first: bool,
    /// The server runs the sizes too (the ping-pongs).
    server_runs: bool,
    end: End,
}

/// The rounds of write_lat, read_lat and atomic_lat.
const LAT_ROUNDS: &[Round] = &[
    Round::One,
    Round::Each,
    Round::Connect,
    Round::Each,
    Round::One,
];

fn script(test: Test) -> Result<Script, BoxError> {
    use Round::{Connect, Each, One};
    Ok(match test {
        Test::WriteBw | Test::ReadBw => Script {
            before: &[Each, Connect, Each, One],
            round_per_size: false,
            client_first: true,
            server_runs: false,
            end: End::Report,
        },
        Test::WriteLat => Script {
            before: LAT_ROUNDS,
            round_per_size: false,
            client_first: false,
            server_runs: true,
            end: End::Nothing,
        },
        Test::ReadLat | Test::AtomicLat => Script {
            before: LAT_ROUNDS,
            round_per_size: false,
            client_first: true,
            server_runs: false,
            end: End::Close,
        },
        Test::SendLat => Script {
            before: &[Each, Connect, One, Each],
            round_per_size: true,
            client_first: true,
            server_runs: true,
            end: End::Close,
        },
        Test::SendBw => return Err("send_bw does not speak perftest's wire".into()),
    })
}

/// Whether the client's first byte is a digit: perftest's version string
/// ("6.06"); perf's own client starts with its options line ("perf/1").
pub fn speaks_perftest(session: &Session, deadline: Deadline) -> bool {
    let stream = session.stream();
    let mut first = [0u8; 1];
    let wait = deadline.remaining().max(Duration::from_millis(1));
    stream.set_read_timeout(Some(wait)).is_ok()
        && matches!(stream.peek(&mut first), Ok(1))
        && first[0].is_ascii_digit()
}

/// The client: to the server at `host` (an `ib_*` server, say).
pub fn client(opts: &Opts, clock: &Clock, host: &str) -> Result<(), BoxError> {
    let script = script(opts.test)?;
    let pd = open(opts)?;
    let deadline = Deadline::after(opts.setup_timeout);
    let stream = exchange::connect((host, opts.tcp_port), deadline)?.into_stream();
    let mut peer = Peer {
        stream,
        server: false,
        revealed: false,
    };
    let ready = set_up(&mut peer, opts, &pd, &script, deadline)?;
    measure(&mut peer, opts, clock, &script, ready)
}

/// The server: `first` is the first client's connection. One that breaks
/// the protocol before our key went out is dropped, and the next one
/// taken from `listener`.
pub fn server(
    opts: &Opts,
    clock: &Clock,
    listener: &Listener,
    first: TcpStream,
) -> Result<(), BoxError> {
    let script = script(opts.test)?;
    let pd = open(opts)?;
    let mut stream = first;
    loop {
        let mut peer = Peer {
            stream,
            server: true,
            revealed: false,
        };
        match set_up(
            &mut peer,
            opts,
            &pd,
            &script,
            Deadline::after(opts.setup_timeout),
        ) {
            Ok(ready) => return measure(&mut peer, opts, clock, &script, ready),
            Err(e) if !peer.revealed && e.is::<BadPeer>() => {
                eprintln!("perf: dropped a client, nothing revealed: {e}");
                drop(peer); // closes its connection now, not after the next accept
                let next = listener.accept(Deadline::after(opts.setup_timeout))?;
                stream = next.into_stream();
            }
            Err(e) => return Err(e),
        }
    }
}

/// A side connected to the peer, one round before the run.
struct Ready {
    side: Side,
    keys: Keys,
    last: Round,
    version: f64,
    deadline: Deadline,
}

/// The version, page size, cache line and MTU messages, then the rounds
/// before the last, connecting where the script says.
fn set_up(
    peer: &mut Peer,
    opts: &Opts,
    pd: &ProtectionDomain,
    script: &Script,
    deadline: Deadline,
) -> Result<Ready, BoxError> {
    let mut setup = opts.setup()?;
    let port = pd.context().query_port(opts.ib_port)?;
    let our_mtu = Mtu(port.active_mtu().0.min(setup.mtu.0));
    let version = peer.swap(
        &msg::version(),
        msg::VERSION_LEN,
        msg::parse_version,
        false,
        deadline,
    )?;
    let page = msg::int(msg::PAGE_SIZE);
    let cycle = peer.swap(&page, 4, msg::parse_cycle_buffer, false, deadline)?;
    let line = msg::int(msg::CACHE_LINE);
    peer.swap(&line, 4, msg::parse_cache_line, false, deadline)?;
    let their_mtu = peer.swap(&msg::mtu(our_mtu), 2, msg::parse_mtu, false, deadline)?;
    let mtu = Mtu(our_mtu.0.min(their_mtu.0));
    // perftest's bw client spreads its requests over the larger cycle buffer.
    setup.inbox_len = setup.max_size.max(cycle.max(msg::PAGE_SIZE) as usize);
    let mut side = Side::new(pd, &setup)?;
    side.clear_inbox = false;
    let link = side.lanes[0].qp.port()?.link_layer();
    let with_gid = opts.gid_index.is_some() || link == LinkLayer::ETHERNET;
    let out_reads = match opts.test {
        Test::ReadLat | Test::ReadBw | Test::AtomicLat => {
            u16::from(pd.context().query_device()?.max_qp_rd_atom()).max(1)
        }
        _ => 1,
    };
    let mut keys = Keys::new(&side, with_gid, out_reads)?;
    let (&last, rounds) = script.before.split_last().ok_or("no rounds")?;
    for &round in rounds {
        if round == Round::Connect {
            let peers = keys.endpoints(mtu, setup.inbox_len as u64, opts.test)?;
            let options = ConnectOptions {
                force_grh: with_gid,
                ..ConnectOptions::default()
            };
            side.connect(&peers, &options)?;
        } else {
            keys.round(peer, round, deadline)?;
        }
    }
    Ok(Ready {
        side,
        keys,
        last,
        version,
        deadline,
    })
}

/// The last round, the run, and what follows it.
fn measure(
    peer: &mut Peer,
    opts: &Opts,
    clock: &Clock,
    script: &Script,
    ready: Ready,
) -> Result<(), BoxError> {
    let Ready {
        mut side,
        mut keys,
        last,
        version,
        deadline,
    } = ready;
    let role = if peer.server { "server" } else { "client" };
    let mode = format!("{role}, perftest's out-of-band wire (the peer's version {version:.2})");
    let mut out = Output::new(opts, &side, clock, &mode)?;
    let runs = !peer.server || script.server_runs;
    let initiator = peer.server != script.client_first;
    let sizes = if runs { opts.sizes() } else { Vec::new() };
    // The peer may start once the last round is through: the first size's
    // receives are posted and requests prepared before it.
    if let Some(&first) = sizes.first() {
        side.prepare(&opts.params(&side, first, initiator, clock)?)?;
    }
    keys.round(peer, last, deadline)?;
    let mut mine = None;
    for (i, &size) in sizes.iter().enumerate() {
        let p = opts.params(&side, size, initiator, clock)?;
        if i > 0 {
            side.prepare(&p)?;
        }
        out.note_depth(&p, side.depth());
        if script.round_per_size {
            keys.round(peer, Round::One, Deadline::after(opts.setup_timeout))?;
        }
        loops::warm_up(&mut side, &p)?;
        loops::run(&mut side, &p)?;
        out.result(&side, &p);
        if script.end == End::Report {
            let s = &side.stamps;
            mine = Some(report::bandwidth(size, &s.posted, &s.completed, clock));
        }
    }
    if script.end != End::Nothing {
        // The passive server waits here for the whole run.
        keys.round(peer, Round::One, Deadline::after(RUN))?;
        let tail = Deadline::after(opts.setup_timeout);
        if script.end == End::Report {
            if let Some(b) = exchange_report(peer, mine, tail)? {
                out.bandwidth(&b);
            }
            keys.round(peer, Round::One, tail)?;
        }
        peer.send(msg::DONE, false, tail)?;
        // perftest never reads it; reading the peer's lets this side close
        // without a reset.
        let _ = peer.receive(&mut [0u8; msg::DONE.len()], Deadline::after(DONE_WAIT));
    }
    if runs || script.end == End::Report {
        out.finish();
    } else {
        eprintln!("perf: done (the client reports the figures)");
    }
    Ok(())
}

/// The bw report: the client sends `mine` (its last size's figures), the
/// server reads the client's and returns it. What the server sends is
/// never read (perftest's server sends whatever its memory held).
fn exchange_report(
    peer: &mut Peer,
    mine: Option<Bandwidth>,
    deadline: Deadline,
) -> Result<Option<Bandwidth>, BoxError> {
    let b = mine.unwrap_or_default();
    let ours = Report {
        size: b.size as u64,
        iters: b.iters,
        peak: b.peak,
        average: b.average,
        msg_rate: b.msg_rate,
    }
    .encode();
    let mut theirs = [[0u8; msg::REPORT_FIELD]; 5];
    for (o, t) in ours.iter().zip(&mut theirs) {
        *t = peer.swap(
            o,
            o.len(),
            |m| Ok(m.try_into().unwrap_or_default()),
            false,
            deadline,
        )?;
    }
    if !peer.server {
        return Ok(None);
    }
    let r = Report::parse(&theirs).map_err(BadPeer)?;
    Ok(Some(Bandwidth {
        size: r.size as usize,
        iters: r.iters,
        peak: r.peak,
        average: r.average,
        msg_rate: r.msg_rate,
    }))
}
