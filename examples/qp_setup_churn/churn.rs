//! Connection churn on one engine: queue pairs added, connected, used and
//! removed again and again, and what the process holds meanwhile (its
//! resident heap, its descriptors, the objects the crate leaked), which
//! must not grow with the cycles.

use std::time::Duration;

use verbs::{
    Deadline, Engine, Error, HostBuf, Local, MemoryRegion, ProtectionDomain, QpConfig, RecvRequest,
    SendOp, SendRequest, WcOpcode,
};

/// What the process holds, between cycles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    /// Anonymous resident memory (the heap), KiB, from
    /// /proc/self/smaps_rollup (exact: a page table walk).
    pub anon_kib: u64,
    /// Open descriptors (/proc/self/fd).
    pub fds: usize,
    /// `verbs::leaked_objects()`: destroys that failed.
    pub leaked: usize,
}

/// What the process holds now.
pub fn held() -> Held {
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").expect("smaps_rollup");
    let anon_kib = rollup
        .lines()
        .find_map(|l| l.strip_prefix("Anonymous:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("Anonymous: in smaps_rollup");
    let fds = std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count();
    Held {
        anon_kib,
        fds,
        leaked: verbs::leaked_objects(),
    }
}

/// The queue pairs of the churn: small, one buffer per request.
pub fn config() -> QpConfig {
    QpConfig {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_sge: 1,
        max_inline_data: 0,
        ..QpConfig::default()
    }
}

/// `cycles` times: two queue pairs added to `engine`, connected to each
/// other (loopback), every `every`-th time a Send from one into a receive
/// of the other (its bytes checked), both removed. `sample(cycle)` is
/// called after cycle 0 and every `sample_every` cycles after it.
pub fn churn(
    engine: &mut Engine<MemoryRegion>,
    pd: &ProtectionDomain,
    cycles: u64,
    every: u64,
    sample_every: u64,
    mut sample: impl FnMut(u64),
) -> Result<(), Error> {
    let config = config();
    let mut bufs = Some((MemoryRegion::new(pd, 64)?, MemoryRegion::new(pd, 64)?));
    for cycle in 0..cycles {
        let x = engine.add_qp(&config)?;
        let y = engine.add_qp(&config)?;
        let (ex, ey) = (engine.endpoint(x)?, engine.endpoint(y)?);
        engine.connect(x, &ey)?;
        engine.connect(y, &ex)?;
        if cycle % every.max(1) == 0 {
            let (mut out, inbox) = bufs.take().expect("the buffers came back");
            out.write_at(0, &cycle.to_le_bytes())?;
            engine
                .post_recv(y, RecvRequest::new(inbox))
                .map_err(|e| e.error)?;
            let send = Local::range(out, 0, 8).map_err(|(e, _)| e)?;
            engine
                .post_send(x, SendRequest::new(SendOp::Send, send))
                .map_err(|e| e.error)?;
            let (mut sent, mut got) = (None, None);
            while sent.is_none() || got.is_none() {
                engine.wait(Deadline::after(Duration::from_secs(20)), |mut c| {
                    c.result().expect("a successful completion");
                    let buf = c.take_buf();
                    if c.opcode() == WcOpcode::RECV {
                        got = buf;
                    } else {
                        sent = buf;
                    }
                })?;
            }
            let inbox = got.expect("the receive's buffer");
            let mut word = [0u8; 8];
            inbox.read_at(0, &mut word)?;
            assert_eq!(u64::from_le_bytes(word), cycle, "cycle {cycle}'s Send");
            bufs = Some((sent.expect("the Send's buffer"), inbox));
        }
        engine.remove_qp(x)?;
        engine.remove_qp(y)?;
        if cycle == 0 || (cycle + 1) % sample_every.max(1) == 0 {
            sample(cycle + 1);
        }
    }
    Ok(())
}
