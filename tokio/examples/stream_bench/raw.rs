//! One request-reply on the verbs themselves: the same Sends waited for
//! by the synchronous engine (`Engine::wait`, asleep in poll(2) on the
//! completion channel) and by `AsyncEngine` (asleep in tokio's epoll), in
//! turns: what the runtime adds.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use verbs::exchange::{self, Server, ServerConfig};
use verbs::{
    Deadline, EngineConfig, MemoryRegion, ProtectionDomain, QpConfig, QueuePair, RecvRequest,
    SendOp,
};
use verbs_tokio::AsyncEngine;

use super::{percentile, BoxError};

const SIZE: usize = 64;
const DEPTH: u32 = 16;

fn queue_pair(pd: &ProtectionDomain) -> Result<QueuePair<MemoryRegion>, verbs::Error> {
    let config = QpConfig {
        max_recv_wr: DEPTH,
        ..QpConfig::default()
    };
    let events = EngineConfig {
        events: true,
        ..EngineConfig::default()
    };
    let mut qp = QueuePair::with_engine(pd, &config, &events)?;
    for _ in 0..DEPTH {
        qp.post_recv(RecvRequest::new(MemoryRegion::new(pd, SIZE)?))
            .map_err(|e| e.error)?;
    }
    Ok(qp)
}

/// The echo side, on threads of its own: each client's Send answered by
/// a Send, until the client's queue pair is gone.
pub(crate) fn serve(addr: SocketAddr) {
    let run = || -> Result<(), BoxError> {
        let pd = ProtectionDomain::new(&verbs::Context::open(None)?)?;
        let server = Server::bind(addr, ServerConfig::default(), |_, _| {})?;
        loop {
            let hello = server.next_client(Deadline::NEVER)?;
            let mut qp = queue_pair(&pd)?;
            qp.connect(hello.peer_endpoint())?;
            let _session = hello.reply(&qp.endpoint()?)?;
            std::thread::spawn(move || {
                let mut reply = [0u8; SIZE];
                loop {
                    let mut got = None;
                    let forever = Deadline::after(Duration::from_secs(3600));
                    if qp
                        .wait(forever, |mut c| {
                            if c.is_recv() && c.result().is_ok() {
                                got = c.take_buf();
                            }
                        })
                        .is_err()
                    {
                        return;
                    }
                    if let Some(buf) = got {
                        let _ = verbs::HostBuf::read_at(&buf, 0, &mut reply);
                        if qp.post_recv(RecvRequest::new(buf)).is_err()
                            || qp.post_inline(SendOp::Send, &reply, 0, true).is_err()
                        {
                            return;
                        }
                    }
                }
            });
        }
    };
    if let Err(e) = run() {
        eprintln!("raw server: {e}");
    }
}

fn connect(pd: &ProtectionDomain, addr: &SocketAddr) -> Result<QueuePair<MemoryRegion>, BoxError> {
    let mut qp = queue_pair(pd)?;
    let deadline = Deadline::after(Duration::from_secs(10));
    let (_session, theirs) = exchange::connect_and_exchange(addr, &qp.endpoint()?, None, deadline)?;
    qp.connect(&theirs)?;
    Ok(qp)
}

/// As [`connect`], on an engine of its own (for `AsyncEngine`).
fn connect_engine(
    pd: &ProtectionDomain,
    addr: &SocketAddr,
) -> Result<(verbs::Engine<MemoryRegion>, verbs::QpId), BoxError> {
    let events = EngineConfig {
        events: true,
        ..EngineConfig::default()
    };
    let mut engine = verbs::Engine::new(pd, &events)?;
    let qp = engine.add_qp(&QpConfig {
        max_recv_wr: DEPTH,
        ..QpConfig::default()
    })?;
    for _ in 0..DEPTH {
        engine
            .post_recv(qp, RecvRequest::new(MemoryRegion::new(pd, SIZE)?))
            .map_err(|e| e.error)?;
    }
    let deadline = Deadline::after(Duration::from_secs(10));
    let (_session, theirs) =
        exchange::connect_and_exchange(addr, &engine.endpoint(qp)?, None, deadline)?;
    engine.connect(qp, &theirs)?;
    Ok((engine, qp))
}

/// One round trip: send, then wait (synchronously) for the reply.
fn sync_round_trips(qp: &mut QueuePair<MemoryRegion>, n: usize) -> Result<Vec<Duration>, BoxError> {
    let msg = [7u8; SIZE];
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        qp.post_inline(SendOp::Send, &msg, 0, true)?;
        let mut reply = None;
        while reply.is_none() {
            qp.wait(Deadline::after(Duration::from_secs(30)), |mut c| {
                if c.is_recv() {
                    reply = c.take_buf();
                }
            })?;
        }
        times.push(t.elapsed());
        qp.post_recv(RecvRequest::new(reply.unwrap()))
            .map_err(|e| e.error)?;
    }
    Ok(times)
}

/// The same with the waits as futures on a current-thread runtime.
async fn async_round_trips(
    engine: &mut AsyncEngine<MemoryRegion>,
    qp: verbs::QpId,
    n: usize,
) -> Result<Vec<Duration>, BoxError> {
    let msg = [7u8; SIZE];
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        engine
            .engine_mut()
            .post_inline(qp, SendOp::Send, &msg, 0, true)?;
        let buf = loop {
            let mut c = engine.next_completion().await?;
            if c.is_recv {
                break c.take_buf().ok_or("a receive without its buffer")?;
            }
        };
        times.push(t.elapsed());
        engine
            .engine_mut()
            .post_recv(qp, RecvRequest::new(buf))
            .map_err(|e| e.error)?;
    }
    Ok(times)
}

/// Sync, async, sync per round on two connections: medians of p50.
pub(crate) fn compare(addr: &SocketAddr, rounds: usize, n: usize) -> Result<(), BoxError> {
    let pd = ProtectionDomain::new(&verbs::Context::open(None)?)?;
    let mut sync_qp = connect(&pd, addr)?;
    let (async_engine, qp_id) = connect_engine(&pd, addr)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut engine = rt.block_on(async { AsyncEngine::new(async_engine).map_err(|(e, _)| e) })?;
    let (mut sync_a, mut sync_b, mut asyn) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        sync_a.push(percentile(&mut sync_round_trips(&mut sync_qp, n)?, 0.5));
        asyn.push(percentile(
            &mut rt.block_on(async_round_trips(&mut engine, qp_id, n))?,
            0.5,
        ));
        sync_b.push(percentile(&mut sync_round_trips(&mut sync_qp, n)?, 0.5));
    }
    let med = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (a, b, x) = (med(sync_a), med(sync_b), med(asyn));
    let sync = (a + b) / 2.0;
    println!(
        "ASYNC | 64 B Send round trip p50 | sync Engine::wait {sync:.1} us | AsyncEngine {x:.1} us | +{:.1} us, {:.3} | sync A/A {:.3} |",
        x - sync,
        x / sync,
        b / a
    );
    Ok(())
}
