//! All-to-all RC between the nodes of `tests/softroce/cluster`: every node
//! connects K queue pairs to every other node (endpoints exchanged over
//! TCP with `verbs::exchange`, one handshake per queue pair), all on one
//! engine, then each queue pair carries a Write (into the slot the peer
//! gave it) and a Send both ways. Every buffer must come back exactly
//! once, to the queue pair that posted it, and every byte land where it
//! was sent. Run by `tests/softroce/mesh`.
//!
//! ```text
//! mesh [--qps K] [--port P]     (default 16 queue pairs per peer, port 18600)
//! ```
//! Reads VERBS_NODE_INDEX and VERBS_PEERS (every node's address, in node
//! order). Prints one `RESULT node=I ...` line; exits non-zero on any
//! failure.

mod wiring;

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::time::Instant;

use verbs::endpoint::RemoteRegion;
use verbs::{
    Access, Arena, ArenaBuf, ArenaConfig, Engine, EngineConfig, HostBuf, Local, ProtectionDomain,
    QpConfig, QpId, RecvRequest, RemoteSlice, SendOp, SendRequest, WcOpcode,
};

/// Bytes each queue pair writes, and sends.
const LEN: usize = 64;

/// What node `from` writes (op 1) or sends (op 2) to node `to` on their
/// queue pair `k`: both ends compute it.
fn pattern(from: usize, to: usize, k: usize, op: u64) -> Vec<u8> {
    let seed = (((from as u64) << 16 | (to as u64) << 8) << 16 | k as u64) << 4 | op;
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..LEN)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn env(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| format!("{name} is not set (run under tests/softroce/cluster)"))
}

fn main() {
    if let Err(e) = run() {
        eprintln!("mesh: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let (mut k_per_peer, mut port) = (16usize, 18600u16);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--qps" => k_per_peer = value.parse().map_err(|e| format!("--qps: {e}"))?,
            "--port" => port = value.parse().map_err(|e| format!("--port: {e}"))?,
            _ => {
                return Err(format!(
                    "unknown option {flag}; usage: mesh [--qps K] [--port P]"
                ))
            }
        }
    }
    let me: usize = env("VERBS_NODE_INDEX")?
        .parse()
        .map_err(|e| format!("{e}"))?;
    let peers: Vec<Ipv4Addr> = env("VERBS_PEERS")?
        .split_whitespace()
        .map(|a| a.parse().map_err(|e| format!("VERBS_PEERS: {a}: {e}")))
        .collect::<Result<_, _>>()?;
    let n = peers.len();
    let slot = |j: usize, k: usize| j * k_per_peer + k;
    let err = |what: &'static str| move |e: verbs::Error| format!("{what}: {e}");

    // One engine, K queue pairs per peer (none to ourselves), and for each
    // a landing slot the peer writes into.
    let started = Instant::now();
    let ctx = verbs::Context::open(None).map_err(err("open the device"))?;
    let pd = ProtectionDomain::new(&ctx).map_err(err("PD"))?;
    let config = QpConfig {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_sge: 1,
        remote_access: Access::REMOTE_WRITE,
        ..QpConfig::default()
    };
    let total = (n - 1) * k_per_peer;
    let engine_config = EngineConfig {
        cq_depth: Some(total as u32 * 8),
        ..EngineConfig::default()
    };
    let mut engine: Engine<ArenaBuf> = Engine::new(&pd, &engine_config).map_err(err("engine"))?;
    let mut memory = Arena::new(
        &pd,
        &ArenaConfig {
            capacity: 4 << 20,
            max_buffers: 4 * (n * k_per_peer) as u32 + 16,
            whole_region_access: Access::REMOTE_WRITE,
            ..ArenaConfig::default()
        },
    )
    .map_err(err("arena"))?;
    let whole = memory
        .whole_region()
        .ok_or("the arena grants no remote access")?;
    let mut landing = memory.alloc(n * k_per_peer * LEN).map_err(err("landing"))?;
    landing
        .write_at(0, &vec![0; n * k_per_peer * LEN])
        .map_err(err("zero"))?;
    let mut qps: Vec<Option<QpId>> = vec![None; n * k_per_peer];
    let mut ours: Vec<Vec<verbs::Endpoint>> = vec![Vec::new(); n];
    for j in (0..n).filter(|&j| j != me) {
        for k in 0..k_per_peer {
            let qp = engine.add_qp(&config).map_err(err("add_qp"))?;
            let mut endpoint = engine.endpoint(qp).map_err(err("endpoint"))?;
            endpoint.regions.push(RemoteRegion {
                addr: whole.addr + (landing.offset() + slot(j, k) * LEN) as u64,
                len: LEN as u64,
                rkey: whole.rkey,
            });
            qps[slot(j, k)] = Some(qp);
            ours[j].push(endpoint);
        }
    }
    let created = started.elapsed();

    // Each wait is named before it begins: a hung run's log says where.
    println!(
        "STAGE node {me}: {total} queue pairs made; exchanging endpoints with {} peers",
        n - 1
    );
    let exchange = Instant::now();
    let server = wiring::serve(me, &peers, port, ours.clone()).map_err(|e| format!("bind: {e}"))?;
    let mut links = wiring::dial(me, &peers, port, &ours)?;
    links.extend(server.join().map_err(|_| "the server thread panicked")??);
    let exchange = exchange.elapsed();
    if links.len() != total {
        return Err(format!("{} links, {total} expected", links.len()));
    }

    // Connect, post a receive on every queue pair, and only then let the
    // peers send (the first barrier).
    let connect = Instant::now();
    let mut posted: HashMap<u64, usize> = HashMap::new();
    let tag = |j: usize, k: usize, op: u64| (slot(j, k) as u64) << 4 | op;
    for l in &links {
        let qp = qps[slot(l.peer, l.k)].expect("a queue pair per link");
        engine.connect(qp, &l.theirs).map_err(err("connect"))?;
        let inbox = memory.alloc(LEN).map_err(err("alloc"))?;
        posted.insert(tag(l.peer, l.k, 3), inbox.offset());
        engine
            .post_recv(qp, RecvRequest::new(inbox).tag(tag(l.peer, l.k, 3)))
            .map_err(|e| format!("post_recv: {}", e.error))?;
    }
    let connect = connect.elapsed();
    println!("STAGE node {me}: connected; waiting for every peer to be ready");
    wiring::barrier(&mut links, "ready")?;

    let traffic = Instant::now();
    for l in &links {
        let qp = qps[slot(l.peer, l.k)].expect("a queue pair per link");
        let region = l
            .theirs
            .regions
            .first()
            .ok_or("a peer endpoint without its slot")?;
        let dst = RemoteSlice::new(region, 0, LEN as u64).map_err(err("slice"))?;
        for (op, send) in [(1, SendOp::Write(dst)), (2, SendOp::Send)] {
            let mut buf = memory.alloc(LEN).map_err(err("alloc"))?;
            buf.write_at(0, &pattern(me, l.peer, l.k, op))
                .map_err(err("write_at"))?;
            posted.insert(tag(l.peer, l.k, op), buf.offset());
            let local = Local::range(buf, 0, LEN).map_err(|(e, _)| format!("range: {e}"))?;
            let req = SendRequest::new(send, local).tag(tag(l.peer, l.k, op));
            engine
                .post_send(qp, req)
                .map_err(|e| format!("post_send: {}", e.error))?;
        }
    }
    println!(
        "STAGE node {me}: traffic posted; waiting for {} completions",
        3 * total
    );
    let mut failure = None;
    let mut back = 0;
    let deadline = verbs::Deadline::after(std::time::Duration::from_secs(60));
    while back < 3 * total && failure.is_none() {
        engine
            .wait(deadline, |mut c| {
                back += 1;
                let t = c.tag();
                let (j, k) = (
                    (t >> 4) as usize / k_per_peer,
                    (t >> 4) as usize % k_per_peer,
                );
                let problem = if let Err(e) = c.result() {
                    Some(format!("node {j} queue pair {k}: {e}"))
                } else if c.qp() != qps[slot(j, k)] {
                    Some(format!("tag {t:#x} came back to another queue pair"))
                } else {
                    match (posted.remove(&t), c.take_buf()) {
                        (Some(offset), Some(buf)) if buf.offset() == offset => {
                            let mut got = vec![0; LEN];
                            let _ = buf.read_at(0, &mut got);
                            let recv = c.opcode() == WcOpcode::RECV;
                            (recv && got != pattern(j, me, k, 2)).then(|| {
                                format!("node {j} queue pair {k}: the Send's bytes differ")
                            })
                        }
                        _ => Some(format!("tag {t:#x}: not its buffer, or back twice")),
                    }
                };
                failure = failure.take().or(problem);
            })
            .map_err(err("wait"))?;
    }
    let traffic = traffic.elapsed();
    if let Some(f) = failure {
        return Err(f);
    }
    // Each Send came after its Write on the same queue pair: all landed.
    let mut landed = vec![0; n * k_per_peer * LEN];
    landing.read_at(0, &mut landed).map_err(err("read_at"))?;
    for l in &links {
        let s = slot(l.peer, l.k) * LEN;
        if landed[s..s + LEN] != pattern(l.peer, me, l.k, 1)[..] {
            return Err(format!(
                "node {} queue pair {}: the Write did not land",
                l.peer, l.k
            ));
        }
    }
    // Nobody tears a queue pair down while a peer may still need its ACKs.
    println!("STAGE node {me}: verified; waiting for every peer to be done");
    wiring::barrier(&mut links, "done")?;
    println!(
        "RESULT node={me} nodes={n} qps={total} create_ms={} exchange_ms={} connect_ms={} \
         traffic_ms={} buffers_back={back}",
        created.as_millis(),
        exchange.as_millis(),
        connect.as_millis(),
        traffic.as_millis()
    );
    Ok(())
}
