//! One UD queue pair serves many client queue pairs (issue 23): the server
//! echoes every datagram back to its sender, addressed from what arrived
//! (the GID in the receive's GRH, the QPN in the completion), and each
//! client checks every reply.
//!
//! ```text
//! tests/softroce/cluster 4 -- target/release/examples/ud_fanin    # node 0 serves, nodes 1..3 are clients
//! ud_fanin server [--nodes N] [OPTS]         # serve N-1 client nodes, then exit
//! ud_fanin client HOST [--node I] [OPTS]     # this node's clients against HOST's server
//! ud_fanin local [OPTS]                      # both in one process, one device
//!   --clients K   client queue pairs per client node (default 34)
//!   --rounds R    requests each client makes (default 20)
//!   --port P      TCP port of the exchange (default 18600)
//! ```
//! With no role, `VERBS_NODE_INDEX` (0: server), `VERBS_NODE_COUNT` and
//! `VERBS_PEERS` (the first is the server) decide, as in the cluster.
//! The exchange is one TCP line each way: the server's QPN, GID and Q_Key
//! to each client node, and "done" back when its clients are. Each side
//! prints one `RESULT` line; exit status 0 only if every reply came back
//! right and the server saw every client queue pair.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv6Addr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use verbs::{
    AhId, Arena, ArenaBuf, ArenaConfig, Context, Deadline, Engine, EngineConfig, Gid, Grh, HostBuf,
    Local, ProtectionDomain, QpConfig, QpId, RecvRequest, SendOp, SendRequest, Transport, UdDest,
    DEFAULT_QKEY, GRH_LEN,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request and its echo: client node, client, sequence number, magic.
const MSG: usize = 16;
const MAGIC: u32 = 0x5544_6d73;
/// Receive buffers: the GRH, then room for a message.
const RECV_LEN: usize = GRH_LEN + 64;
const SERVER_RECVS: usize = 1024;
/// How long a client waits for a reply before sending the request again
/// (UD drops silently; the server's echo is idempotent).
const RESEND: Duration = Duration::from_millis(500);
const RUN_LIMIT: Duration = Duration::from_secs(120);

#[derive(Clone, Copy)]
struct Opts {
    clients: usize,
    rounds: u32,
    port: u16,
    nodes: usize,
    node: u32,
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ud_fanin: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), BoxError> {
    let env = |k: &str| std::env::var(k).ok();
    let mut opts = Opts {
        clients: 34,
        rounds: 20,
        port: 18600,
        nodes: env("VERBS_NODE_COUNT")
            .and_then(|v| v.parse().ok())
            .unwrap_or(2),
        node: env("VERBS_NODE_INDEX")
            .and_then(|v| v.parse().ok())
            .unwrap_or(1),
    };
    let mut args = std::env::args().skip(1);
    let mut role = None;
    let mut host = None;
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "server" | "local" => role = Some(a.clone()),
            "client" => {
                role = Some(a.clone());
                host = Some(value()?);
            }
            "--clients" => opts.clients = value()?.parse()?,
            "--rounds" => opts.rounds = value()?.parse()?,
            "--port" => opts.port = value()?.parse()?,
            "--nodes" => opts.nodes = value()?.parse()?,
            "--node" => opts.node = value()?.parse()?,
            _ => return Err(format!("unknown argument {a}").into()),
        }
    }
    let role = match role {
        Some(r) => r,
        None if env("VERBS_NODE_INDEX").as_deref() == Some("0") => "server".into(),
        None => {
            host = env("VERBS_PEERS").and_then(|p| p.split_whitespace().next().map(String::from));
            "client".into()
        }
    };
    let ctx = Context::open(None)?;
    let pd = ProtectionDomain::new(&ctx)?;
    match role.as_str() {
        "server" => {
            let listener = TcpListener::bind(("0.0.0.0", opts.port))?;
            serve(&pd, listener, opts.nodes.saturating_sub(1), &opts)
        }
        "client" => clients(&pd, host.as_deref().ok_or("no server address")?, &opts),
        _ => {
            let listener = TcpListener::bind(("127.0.0.1", 0))?;
            opts.port = listener.local_addr()?.port();
            let server_pd = pd.clone();
            let server = std::thread::spawn(move || serve(&server_pd, listener, 1, &opts));
            let client = clients(&pd, "127.0.0.1", &opts);
            let served = server.join().map_err(|_| "the server thread panicked")?;
            client.and(served)
        }
    }
}

fn arena(pd: &ProtectionDomain, buffers: usize) -> Result<Arena, BoxError> {
    let config = ArenaConfig {
        capacity: (buffers * 128).next_power_of_two().max(1 << 20),
        max_buffers: buffers as u32 + 16,
        ..ArenaConfig::default()
    };
    Ok(Arena::new(pd, &config)?)
}

fn ud_config(send: u32, recv: u32) -> QpConfig {
    QpConfig {
        transport: Transport::Ud,
        max_send_wr: send,
        max_recv_wr: recv,
        max_sge: 1,
        ..QpConfig::default()
    }
}

/// A received datagram the server still has to echo.
struct Echo {
    buf: ArenaBuf,
    from: Gid,
    qpn: u32,
    len: usize,
}

/// The server: one UD queue pair, echoing every datagram to its sender
/// until `nodes` client nodes said they are done.
fn serve(
    pd: &ProtectionDomain,
    listener: TcpListener,
    nodes: usize,
    opts: &Opts,
) -> Result<(), BoxError> {
    let started = Instant::now();
    let mut arena = arena(pd, SERVER_RECVS)?;
    let mut engine: Engine<ArenaBuf> = Engine::new(pd, &EngineConfig::default())?;
    let qp = engine.add_qp(&ud_config(SERVER_RECVS as u32, SERVER_RECVS as u32))?;
    engine.ready_ud(qp)?;
    for _ in 0..SERVER_RECVS {
        let buf = arena.alloc(RECV_LEN)?;
        engine
            .post_recv(qp, RecvRequest::new(buf))
            .map_err(|e| e.error)?;
    }
    let me = engine.endpoint(qp)?;
    let hello = format!(
        "{} {} {}\n",
        me.qpn,
        Ipv6Addr::from(me.gid.raw()),
        DEFAULT_QKEY
    );
    listener.set_nonblocking(true)?;
    // Each wait is named before it begins: a hung run's log says where.
    println!(
        "STAGE server: qpn {} ready; echoing until {nodes} client nodes are done",
        me.qpn
    );
    let mut peers: Vec<BufReader<TcpStream>> = Vec::new();
    let (mut done, mut requests, mut failed) = (0, 0u64, 0u64);
    let mut ahs: HashMap<Gid, AhId> = HashMap::new();
    let mut clients: HashSet<(Gid, u32)> = HashSet::new();
    let mut pending: Vec<Echo> = Vec::new();
    let mut spare: Vec<ArenaBuf> = Vec::new();
    while done < nodes {
        if started.elapsed() > RUN_LIMIT {
            return Err(
                format!("server: {done} of {nodes} client nodes done after {RUN_LIMIT:?}").into(),
            );
        }
        match listener.accept() {
            Ok((mut s, _)) => {
                s.set_nonblocking(false)?;
                s.write_all(hello.as_bytes())?;
                s.set_nonblocking(true)?;
                peers.push(BufReader::new(s));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e.into()),
        }
        peers.retain_mut(|p| {
            let mut line = String::new();
            match p.read_line(&mut line) {
                Ok(0) => false,
                Ok(_) if line.trim() == "done" => {
                    done += 1;
                    false
                }
                _ => true,
            }
        });
        engine.poll(|mut c| {
            let ok = c.result().is_ok();
            let (is_recv, qpn, len, grh) = (
                c.is_recv(),
                c.src_qp(),
                c.byte_len() as usize,
                c.payload_offset(),
            );
            let Some(buf) = c.take_buf() else { return };
            if !is_recv || !ok || grh != GRH_LEN || len < GRH_LEN + MSG {
                failed += u64::from(!ok);
                spare.push(buf);
                return;
            }
            match buf
                .as_slice()
                .ok()
                .and_then(Grh::from_bytes)
                .and_then(|g| g.source_gid())
            {
                Some(from) => pending.push(Echo {
                    buf,
                    from,
                    qpn,
                    len: len - GRH_LEN,
                }),
                None => spare.push(buf),
            }
        })?;
        // Every buffer that is not an echo in flight goes back to receiving.
        for buf in spare.drain(..) {
            engine
                .post_recv(qp, RecvRequest::new(buf))
                .map_err(|e| e.error)?;
        }
        let mut left = Vec::new();
        for echo in pending.drain(..) {
            let ah = match ahs.get(&echo.from) {
                Some(ah) => *ah,
                None => *ahs
                    .entry(echo.from)
                    .or_insert(engine.create_ah(qp, echo.from, 0)?),
            };
            let to = UdDest {
                ah,
                qpn: echo.qpn,
                qkey: DEFAULT_QKEY,
            };
            let local = Local::range(echo.buf, GRH_LEN, echo.len).map_err(|(e, _)| e)?;
            match engine.post_ud_send(qp, &to, SendRequest::new(SendOp::Send, local)) {
                Ok(()) => {
                    requests += 1;
                    clients.insert((echo.from, echo.qpn));
                }
                Err(e) if e.error.kind() == verbs::ErrorKind::QueueFull => {
                    let buf = e
                        .request
                        .into_bufs()
                        .next()
                        .ok_or("a refused echo lost its buffer")?;
                    left.push(Echo { buf, ..echo });
                }
                Err(e) => return Err(e.error.into()),
            }
        }
        pending = left;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "RESULT role=server nodes={nodes} clients={} requests={requests} ahs={} failed={failed} secs={secs:.2}",
        clients.len(),
        engine.ah_count()
    );
    let expected = nodes * opts.clients;
    if clients.len() < expected || failed > 0 {
        return Err(format!(
            "server saw {} client queue pairs, expected {expected}",
            clients.len()
        )
        .into());
    }
    Ok(())
}

/// What a client queue pair is waiting for.
struct Client {
    qp: QpId,
    seq: u32,
    sent_at: Instant,
    acked: bool,
}

fn message(node: u32, client: u32, seq: u32) -> [u8; MSG] {
    let mut m = [0u8; MSG];
    for (i, v) in [node, client, seq, MAGIC].into_iter().enumerate() {
        m[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
    }
    m
}

/// The server's QPN, GID and Q_Key, from its first line (retrying the
/// connection while the server boots).
fn hello(host: &str, port: u16) -> Result<(TcpStream, u32, Gid, u32), BoxError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let stream = loop {
        match TcpStream::connect((host, port)) {
            Ok(s) => break s,
            Err(e) if Instant::now() > deadline => return Err(e.into()),
            Err(_) => std::thread::sleep(Duration::from_millis(250)),
        }
    };
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line)?;
    let mut it = line.split_whitespace();
    let qpn = it.next().ok_or("no QPN")?.parse()?;
    let gid = Gid::from(it.next().ok_or("no GID")?.parse::<Ipv6Addr>()?);
    let qkey = it.next().ok_or("no Q_Key")?.parse()?;
    Ok((stream, qpn, gid, qkey))
}

/// This node's client queue pairs: each sends `rounds` requests, one at a
/// time, and checks each echo (its bytes, the server's QPN and GID).
fn clients(pd: &ProtectionDomain, host: &str, opts: &Opts) -> Result<(), BoxError> {
    println!(
        "STAGE client node {}: asking {host}:{} for the server's address",
        opts.node, opts.port
    );
    let (mut stream, server_qpn, server_gid, qkey) = hello(host, opts.port)?;
    let started = Instant::now();
    let k = opts.clients;
    let mut arena = arena(pd, k * 8)?;
    let mut engine: Engine<ArenaBuf> = Engine::new(pd, &EngineConfig::default())?;
    let mut all = Vec::with_capacity(k);
    let mut by_qp = HashMap::new();
    for i in 0..k {
        let qp = engine.add_qp(&ud_config(4, 4))?;
        engine.ready_ud(qp)?;
        for _ in 0..2 {
            engine
                .post_recv(qp, RecvRequest::new(arena.alloc(RECV_LEN)?))
                .map_err(|e| e.error)?;
        }
        by_qp.insert(qp, i);
        all.push(Client {
            qp,
            seq: 0,
            sent_at: started,
            acked: true,
        });
    }
    // One address handle for every client: they share the engine's port.
    let to = UdDest {
        ah: engine.create_ah(all[0].qp, server_gid, 0)?,
        qpn: server_qpn,
        qkey,
    };
    let (mut replies, mut resent, mut stale, mut bad) = (0u64, 0u64, 0u64, 0u64);
    let mut finished = 0;
    let mut back: Vec<(usize, ArenaBuf, Option<[u8; MSG]>)> = Vec::new();
    println!(
        "STAGE client node {}: server qpn {server_qpn}; {k} clients x {} rounds",
        opts.node, opts.rounds
    );
    while finished < k {
        if started.elapsed() > RUN_LIMIT {
            return Err(format!("node {}: {finished} of {k} clients finished", opts.node).into());
        }
        for (i, c) in all.iter_mut().enumerate() {
            let due = c.acked && c.seq < opts.rounds || !c.acked && c.sent_at.elapsed() > RESEND;
            if !due || engine.in_flight(c.qp)?.0 >= 2 {
                continue;
            }
            resent += u64::from(!c.acked);
            let mut buf = arena.alloc(MSG)?;
            buf.write_at(0, &message(opts.node, i as u32, c.seq))?;
            engine
                .post_ud_send(c.qp, &to, SendRequest::new(SendOp::Send, buf))
                .map_err(|e| e.error)?;
            c.acked = false;
            c.sent_at = Instant::now();
        }
        engine
            .wait(Deadline::after(Duration::from_millis(50)), |mut c| {
                let i = c
                    .qp()
                    .and_then(|q| by_qp.get(&q).copied())
                    .unwrap_or(usize::MAX);
                let ok = c.result().is_ok() && i != usize::MAX;
                let is_recv = c.is_recv();
                let from_server = c.src_qp() == server_qpn && c.payload_offset() == GRH_LEN;
                let len = c.byte_len() as usize;
                let Some(buf) = c.take_buf() else { return };
                if !is_recv || !ok {
                    bad += u64::from(!ok);
                    return; // a send's buffer: dropped back to the arena
                }
                let mut m = [0u8; MSG];
                let right = from_server
                    && len == GRH_LEN + MSG
                    && buf.read_at(GRH_LEN, &mut m).is_ok()
                    && buf
                        .as_slice()
                        .ok()
                        .and_then(Grh::from_bytes)
                        .and_then(|g| g.source_gid())
                        == Some(server_gid);
                back.push((i, buf, right.then_some(m)));
            })
            .or_else(|e| {
                if e.kind() == verbs::ErrorKind::TimedOut {
                    Ok(0)
                } else {
                    Err(e)
                }
            })?;
        for (i, buf, msg) in back.drain(..) {
            let c = &mut all[i];
            engine
                .post_recv(c.qp, RecvRequest::new(buf))
                .map_err(|e| e.error)?;
            match msg {
                Some(m) if !c.acked && m == message(opts.node, i as u32, c.seq) => {
                    replies += 1;
                    c.acked = true;
                    c.seq += 1;
                    finished += usize::from(c.seq == opts.rounds);
                }
                // An echo of a request sent again, arriving after the first.
                Some(m) if m[..8] == message(opts.node, i as u32, 0)[..8] => stale += 1,
                _ => bad += 1,
            }
        }
    }
    stream.write_all(b"done\n")?;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "RESULT role=client node={} clients={k} replies={replies} resent={resent} stale={stale} bad={bad} secs={secs:.2}",
        opts.node
    );
    if bad > 0 || replies != k as u64 * u64::from(opts.rounds) {
        return Err(format!("node {}: {bad} bad replies", opts.node).into());
    }
    Ok(())
}
