//! A request/response server's loop, as a service writes it with this
//! crate: an `Engine` with a shared receive queue, one RC queue pair on it,
//! a ring of prepared replies on that queue pair (registered and checked
//! once, as a C server keeps its reply buffers), and a shared-receive lane
//! (`Engine::srq_lane`) that holds the queue pair while the loop runs:
//! each request is read where it landed, answered from the next reply in
//! the ring and posted again in its slot (the same buffer and entries, as
//! a C server posts its `ibv_recv_wr` again).
//! `tests/softroce/critpath rpc_srv` counts its loop per request against
//! `tests/softroce/rpc_srv.c`, the same loop in C with the same verbs;
//! that program's client role drives both (28 bytes each way over TCP:
//! QPN, PSN, MTU code, GID).
//!
//! ```text
//! rpc_srv -p PORT -n N      serve N requests of the one client, then exit
//! ```
//!
//! Per request: the receive's completion, its 8-byte id copied into the
//! next reply (`SrqRequest::reply`: refused while the send queue is full,
//! which is also when that reply's last post could still be in flight),
//! the reply posted unsignaled (the lane asks for a completion every half
//! queue, which covers the ones before it), the receive posted again in
//! its slot. A server with many queue pairs on one shared receive queue
//! answers from the poll's callback instead (`CompletionRef::buf`,
//! `Poster::write_prepared`, `post_prepared_unreported`, `repost_recv`),
//! or with a reply built per request (`CompletionRef::reply`, as
//! `examples/rpc` does): each costs more per request (docs/PERF.md).

use std::cell::Cell;
use std::io::{Read, Write};
use std::net::TcpListener;

use verbs::{
    Arena, ArenaBuf, ArenaConfig, CompletionRef, Context, Endpoint, Engine, EngineConfig, Error,
    Gid, Mtu, PreparedSend, ProtectionDomain, QpConfig, Queue, RecvRequest, SendOp, SendRequest,
    SrqConfig, SrqLane,
};

const MSG: usize = 32;
const SRQ_DEPTH: u32 = 16;
const SEND_DEPTH: usize = 64;

fn usage() -> ! {
    eprintln!("usage: rpc_srv -p PORT -n N");
    std::process::exit(2)
}

fn main() -> Result<(), Error> {
    let (mut port, mut n) = (18515u16, 1000u64);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "-p" => port = value.parse().unwrap_or_else(|_| usage()),
            "-n" => n = value.parse().unwrap_or_else(|_| usage()),
            _ => usage(),
        }
    }
    let ctx = Context::open(None)?;
    let pd = ProtectionDomain::new(&ctx)?;
    let mut arena = Arena::new(
        &pd,
        &ArenaConfig {
            capacity: 1 << 20,
            max_buffers: SRQ_DEPTH + SEND_DEPTH as u32 + 64,
            ..ArenaConfig::default()
        },
    )?;
    let config = EngineConfig {
        cq_depth: Some(SRQ_DEPTH + SEND_DEPTH as u32),
        srq: Some(SrqConfig {
            max_wr: SRQ_DEPTH,
            max_sge: 1,
        }),
        ..EngineConfig::default()
    };
    let mut engine: Engine<ArenaBuf> = Engine::new(&pd, &config)?;
    let qp = engine.add_qp(&QpConfig {
        max_send_wr: SEND_DEPTH as u32,
        max_recv_wr: 0,
        max_sge: 1,
        ..QpConfig::default()
    })?;
    for _ in 0..SRQ_DEPTH {
        engine
            .post_srq_recv(RecvRequest::new(arena.alloc(MSG)?))
            .map_err(|e| e.error)?;
    }
    // One reply per post the send queue holds: the lane uses them in turn.
    let mut ring: Vec<PreparedSend> = Vec::with_capacity(SEND_DEPTH);
    for _ in 0..SEND_DEPTH {
        let reply = SendRequest::new(SendOp::Send, arena.alloc(MSG)?);
        ring.push(engine.prepare_send(qp, reply).map_err(|e| e.error)?);
    }

    // The endpoint exchange (rpc_srv.c's wire): the client's, then ours
    // once our queue pair is ready for its first request.
    let listener = TcpListener::bind(("0.0.0.0", port)).unwrap_or_else(io);
    let (mut stream, _) = listener.accept().unwrap_or_else(io);
    let mut wire = [0u8; 28];
    stream.read_exact(&mut wire).unwrap_or_else(io);
    let word = |at: usize| u32::from_le_bytes(wire[at..at + 4].try_into().expect("4 bytes"));
    let mut gid = [0u8; 16];
    gid.copy_from_slice(&wire[12..]);
    let peer = Endpoint {
        qpn: word(0),
        psn: word(4),
        lid: 0,
        gid: Gid::from(gid),
        mtu: Mtu(word(8)),
        regions: Vec::new(),
    };
    let ours = engine.endpoint(qp)?;
    engine.connect(qp, &peer)?;
    let mut reply = [0u8; 28];
    reply[0..4].copy_from_slice(&ours.qpn.to_le_bytes());
    reply[4..8].copy_from_slice(&ours.psn.to_le_bytes());
    reply[8..12].copy_from_slice(&ours.mtu.0.to_le_bytes());
    reply[12..].copy_from_slice(&<[u8; 16]>::from(ours.gid));
    stream.write_all(&reply).unwrap_or_else(io);

    // The loop: a lane holds the queue pair and answers from the ring.
    let mut lane = engine.srq_lane(&ring)?;
    serve(&mut lane, n)
}

/// Answers `n` requests: each one's 8-byte id copied into the next reply.
fn serve(lane: &mut SrqLane<'_, ArenaBuf>, n: u64) -> Result<(), Error> {
    // Not the lane's: a failed receive, or another queue pair's.
    let failed = Cell::new(None);
    let mut on_other = |c: CompletionRef<'_, ArenaBuf>| {
        if let Err(e) = c.result() {
            failed.set(Some(e));
        }
    };
    let mut replies = 0u64;
    while replies < n {
        let Some(mut request) = lane.poll(Queue::Send, &mut on_other)? else {
            if let Some(e) = failed.get() {
                return Err(e);
            }
            continue;
        };
        let mut id = [0u8; 8];
        request.read(0, &mut id)?;
        request.reply(0, &id)?;
        request.repost()?;
        replies += 1;
    }
    Ok(())
}

fn io<T>(e: std::io::Error) -> T {
    eprintln!("rpc_srv: {e}");
    std::process::exit(1)
}
