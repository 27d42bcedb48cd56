//! The passive side: exposes one region, answers the client's requests on
//! the side channel (hash a range, reconnect, die, quit) and otherwise
//! sleeps in a bounded read while the client's RDMA traffic lands.

use std::time::{Duration, Instant};

use verbs::exchange::Listener;
use verbs::{
    Access, Arena, ArenaConfig, Context, Deadline, ExposedBuf, ProtectionDomain, QpConfig,
    QueuePair,
};

use crate::chan::{self, Chan, Digest};
use crate::events::Watcher;
use crate::{BoxError, Opts, Qp};

/// Longest the server waits for the next command: longer than the slowest
/// drill (10,000 operations under 2 % loss), short enough that a vanished
/// client cannot keep it forever.
const IDLE: Duration = Duration::from_secs(600);

pub fn run(opts: &Opts) -> Result<(), BoxError> {
    let t0 = Instant::now();
    let ctx = Context::open(opts.dev.as_deref())?;
    let pd = ProtectionDomain::new(&ctx)?;
    let mut arena = Arena::new(
        &pd,
        &ArenaConfig {
            // Room for the region plus the allocator's alignment slack.
            capacity: opts.region + (1 << 20),
            ..ArenaConfig::default()
        },
    )?;
    // Least privilege: the peer gets exactly this buffer, nothing else of the arena.
    let buf = arena.alloc(opts.region)?;
    let region = ExposedBuf::register(buf, Access::REMOTE_WRITE | Access::REMOTE_READ)
        .map_err(|(e, _)| e)?;
    let config = QpConfig {
        remote_access: Access::REMOTE_WRITE | Access::REMOTE_READ,
        ..QpConfig::default()
    };
    let mut qp: Qp = QueuePair::new(&pd, &config)?;
    let watcher = Watcher::start(&ctx, "server", t0, qp.engine().raw_id(qp.id())?);
    let listener = Listener::bind(("0.0.0.0", opts.port))?;
    println!(
        "server: generation {} pid {} qpn {} region {} MiB, listening on port {}",
        opts.generation,
        std::process::id(),
        qp.qp_num(),
        opts.region >> 20,
        opts.port
    );

    println!("STAGE server: waiting for the client to connect (120 s)");
    let mut chan = Chan::new(listener.accept(Deadline::after(Duration::from_secs(120)))?);
    println!("STAGE server: client connected; exchanging endpoints");
    chan.send(chan::HELLO, u64::from(std::process::id()), opts.generation)?;
    // The client speaks first: its endpoint is read and checked before
    // ours (with the region's rkey) is revealed.
    let attach = |qp: &mut Qp, chan: &mut Chan| -> Result<(), BoxError> {
        let deadline = Deadline::after(Duration::from_secs(30));
        let mut local = qp.endpoint()?;
        local.regions.push(region.remote());
        let peer = chan.server_exchange(&local, deadline)?;
        qp.connect(&peer)?;
        chan.sync(deadline)
    };
    attach(&mut qp, &mut chan)?;
    println!("STAGE server: connected; serving the client's commands");

    loop {
        let (cmd, a, b) = chan.recv(Deadline::after(IDLE))?;
        match cmd {
            chan::HASH => {
                let (offset, len) = (a as usize, b as usize);
                let mut digest = Digest::new();
                let mut chunk = vec![0u8; 64 << 10];
                let mut at = offset;
                while at < offset + len {
                    let n = chunk.len().min(offset + len - at);
                    region.read_at(at, &mut chunk[..n])?;
                    digest.update(&chunk[..n]);
                    at += n;
                }
                chan.send(chan::HASHED, digest.value(), 0)?;
            }
            chan::RECONNECT => {
                // The responder may or may not have noticed the fault
                // (silence leaves it in RTS; a bad request moves it to ERR).
                println!(
                    "server: reconnect asked; my QP was in {}",
                    qp.query()?.state
                );
                qp.reset(Deadline::after(Duration::from_secs(10)), |_| {})?;
                attach(&mut qp, &mut chan)?;
                println!("server: reconnected, QP in {}", qp.state()?);
            }
            chan::KILL => {
                println!("server: told to die; aborting (no cleanup, like a crash)");
                std::process::abort();
            }
            chan::QUIT => {
                chan.send(chan::BYE, 0, 0)?;
                let seen = watcher.seen();
                println!(
                    "server: done; async events seen: {}",
                    if seen.is_empty() {
                        "none".to_string()
                    } else {
                        seen.join(",")
                    }
                );
                return Ok(());
            }
            other => return Err(format!("unknown command {:?}", other as char).into()),
        }
    }
}
