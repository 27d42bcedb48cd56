//! The passive side, for one admitted client: one region per plane for
//! the peer to write (or read), one engine per plane holding its end of
//! every path, and a loop that answers the client: reconnect a path, and
//! at the end assemble the chunks from the planes they landed on and
//! compare checksums. `door.rs` admits the client.

use std::time::Duration;

use verbs::exchange::{Handshake, Session};
use verbs::{
    Access, Context, Deadline, Endpoint, Engine, EngineConfig, HostBuf, MemoryRegion,
    ProtectionDomain, QpConfig, QpId,
};

use crate::door::{self, Setup};
use crate::proto::{self, Checksum};
use crate::{BoxError, Opts};

/// The most a client may take to connect its paths and sync.
const PATHS_WITHIN: Duration = Duration::from_secs(60);
/// Longest the server waits for an admitted client's next word: a whole
/// transfer between the sync and `DONE`, far beyond any drill case.
const IDLE: Duration = Duration::from_secs(120);

struct Plane {
    engine: Engine<MemoryRegion>,
    region: MemoryRegion,
    qps: Vec<QpId>,
}

/// Serves the client whose first hello is `hello`; true when both
/// checksums matched. `devs` are the server's devices, plane order.
pub fn serve(opts: &Opts, devs: &[String], mut hello: Handshake) -> Result<bool, BoxError> {
    let setup = door::read_setup(&mut hello, devs.len(), opts.max_mib)?;
    let Setup {
        len,
        qps,
        chunk_len,
        ..
    } = setup;
    // Only now, the client admitted and its setup within bounds: memory.
    let devs = &devs[..setup.planes];
    let mut planes = Vec::new();
    for dev in devs {
        planes.push(open_plane(dev, len as usize, qps)?);
    }
    if setup.read {
        // A read: every plane's region holds the source.
        let mut chunk = vec![0u8; chunk_len.min(len) as usize];
        for c in 0..len.div_ceil(chunk_len) {
            let offset = c * chunk_len;
            let n = chunk_len.min(len - offset) as usize;
            proto::generate(offset, &mut chunk[..n]);
            for plane in &mut planes {
                plane.region.write_at(offset as usize, &chunk[..n])?;
            }
        }
    }
    // Path 0 is the first hello's: connected before our endpoint (and
    // the region with it) is revealed. The client connects its end with
    // the path's flow label and retry policy; this end only answers.
    let first = planes[0].qps[0];
    let deadline = Deadline::after(PATHS_WITHIN);
    // Not past the hello's own time: its reply would fail after it anyway.
    proto::connect_retrying(deadline.min(hello.expires()), || {
        planes[0].engine.connect(first, hello.peer_endpoint())
    })?;
    let mut session = hello.reply(&ours(&planes[0], first)?)?;
    for plane in &mut planes {
        for qp in plane.qps.clone() {
            if qp != first {
                session = answer(session, plane, qp, deadline)?;
            }
        }
    }
    session.sync(deadline)?;
    println!(
        "server: {} planes ({}) x {qps} queue pairs, {} MiB each, {}",
        planes.len(),
        devs.join(","),
        len >> 20,
        if setup.read {
            "to be read"
        } else {
            "to be written"
        }
    );
    let mut verdict = None;
    loop {
        let (cmd, a, _) = match (proto::recv(&mut session, IDLE), verdict) {
            (Ok(frame), _) => frame,
            (Err(_), Some(ok)) => return Ok(ok),
            (Err(e), None) => return Err(e.into()),
        };
        match cmd {
            proto::REPATH => session = repath(&mut planes, qps, a as usize, session)?,
            proto::DONE => {
                let count = len.div_ceil(chunk_len) as usize;
                let mut placement = vec![0u8; count];
                proto::recv_bytes(&mut session, &mut placement)?;
                let mut sums = vec![0u8; 8 * count];
                proto::recv_bytes(&mut session, &mut sums)?;
                let expected: Vec<u64> = sums
                    .chunks(8)
                    .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
                    .collect();
                // The client read: the source is the same on every plane.
                let placement = if setup.read {
                    vec![0; count]
                } else {
                    placement
                };
                if let Some(c) = opts.zero_chunk.filter(|_| verdict.is_none()) {
                    let offset = c as u64 * chunk_len;
                    if offset < len {
                        let zeros = vec![0u8; chunk_len.min(len - offset) as usize];
                        for plane in &mut planes {
                            plane.region.write_at(offset as usize, &zeros)?;
                        }
                        println!("server: chunk {c} zeroed on every plane (--zero-chunk)");
                    }
                }
                let (ours, bad) = checksum(&planes, len, chunk_len, &placement, &expected)?;
                proto::send(&mut session, proto::DONE, ours, bad.len() as u64)?;
                let named: Vec<u8> = bad
                    .iter()
                    .take(proto::BAD_NAMED as usize)
                    .flat_map(|&c| (c as u32).to_le_bytes())
                    .collect();
                proto::send_bytes(&mut session, &named)?;
                for &c in bad.iter().take(proto::BAD_NAMED as usize) {
                    explain(&planes, len, chunk_len, c, placement[c], expected[c])?;
                }
                let per_plane: Vec<usize> = (0..planes.len())
                    .map(|p| placement.iter().filter(|&&x| usize::from(x) == p).count())
                    .collect();
                let ok = ours == a && bad.is_empty();
                println!(
                    "server: checksum server={ours:#018x} client={a:#018x} {}, {} chunks differ; chunks per plane {per_plane:?}",
                    if ok { "match" } else { "MISMATCH" },
                    bad.len()
                );
                // The client may send differing chunks again and say DONE
                // again; the last verdict stands once it hangs up.
                verdict = Some(ok);
            }
            other => return Err(format!("unknown command {:?}", other as char).into()),
        }
    }
}

/// Our end of path `qp` on `plane`, with the plane's region.
fn ours(plane: &Plane, qp: QpId) -> Result<Endpoint, BoxError> {
    let mut ours = plane.engine.endpoint(qp)?;
    ours.regions
        .push(plane.region.remote().ok_or("region not shared")?);
    Ok(ours)
}

/// The client's next hello, for `qp` of `plane`: read and checked, our
/// end connected to it (which refuses an endpoint our port cannot reach),
/// and only then our endpoint sent.
fn answer(
    session: Session,
    plane: &mut Plane,
    qp: QpId,
    deadline: Deadline,
) -> Result<Session, BoxError> {
    let hello = session.read_hello(None, deadline)?;
    proto::connect_retrying(deadline, || plane.engine.connect(qp, hello.peer_endpoint()))?;
    Ok(hello.reply(&ours(plane, qp)?)?)
}

/// The client lost path `path` and replaced its end with a fresh queue
/// pair: replace ours too (a new QPN, so nothing of the old connection
/// reaches the new one), exchange endpoints again, connect.
fn repath(
    planes: &mut [Plane],
    qps: usize,
    path: usize,
    session: Session,
) -> Result<Session, BoxError> {
    let plane = planes.get_mut(path / qps).ok_or("no such path")?;
    let old = plane.qps[path % qps];
    let was = plane.engine.query(old).map(|a| a.state.to_string());
    let removed = plane.engine.remove_qp(old);
    let fresh = plane.engine.add_qp(&qp_config())?;
    plane.qps[path % qps] = fresh;
    let hello = session.read_hello(None, Deadline::after(Duration::from_secs(2)))?;
    let connected = proto::connect_retrying(Deadline::after(Duration::from_secs(2)), || {
        plane.engine.connect(fresh, hello.peer_endpoint())
    });
    println!(
        "server: path {path} replaced (old QP was {}{}), new QP connected: {}",
        was.unwrap_or_else(|e| e.to_string()),
        removed.map_or_else(|e| format!(", its destroy failed: {e}"), |_| String::new()),
        connected
            .as_ref()
            .map_or_else(|e| e.to_string(), |_| "ok".into())
    );
    // Answered even when the connect failed: the path's probe then fails
    // and is tried again later, and this client was shown the region
    // when it first connected the path.
    Ok(hello.reply(&ours(plane, fresh)?)?)
}

fn qp_config() -> QpConfig {
    QpConfig {
        remote_access: Access::REMOTE_WRITE | Access::REMOTE_READ,
        ..QpConfig::default()
    }
}

fn open_plane(dev: &str, len: usize, qps: usize) -> Result<Plane, BoxError> {
    let ctx = Context::open(Some(dev))?;
    let pd = ProtectionDomain::new(&ctx)?;
    let region = MemoryRegion::with_access(&pd, len, Access::REMOTE_WRITE | Access::REMOTE_READ)?;
    let mut engine = Engine::new(&pd, &EngineConfig::default())?;
    let qps = (0..qps)
        .map(|_| engine.add_qp(&qp_config()))
        .collect::<Result<_, _>>()?;
    Ok(Plane {
        engine,
        region,
        qps,
    })
}

/// The checksum of the transfer's bytes, each chunk read from the plane
/// whose region holds its final copy, and the chunks whose own checksum
/// is not the client's.
fn checksum(
    planes: &[Plane],
    len: u64,
    chunk_len: u64,
    placement: &[u8],
    expected: &[u64],
) -> Result<(u64, Vec<usize>), BoxError> {
    let mut sum = Checksum::new();
    let mut bad = Vec::new();
    let mut chunk = vec![0u8; chunk_len.min(len) as usize];
    for (c, &plane) in placement.iter().enumerate() {
        let bytes = read_chunk(planes, len, chunk_len, c, plane, &mut chunk)?;
        sum.update(bytes);
        let mut one = Checksum::new();
        one.update(bytes);
        if expected.get(c) != Some(&one.value()) {
            bad.push(c);
        }
    }
    Ok((sum.value(), bad))
}

fn read_chunk<'a>(
    planes: &[Plane],
    len: u64,
    chunk_len: u64,
    c: usize,
    plane: u8,
    out: &'a mut [u8],
) -> Result<&'a [u8], BoxError> {
    let offset = c as u64 * chunk_len;
    let n = chunk_len.min(len - offset) as usize;
    let plane = planes
        .get(usize::from(plane))
        .ok_or("placement names no plane")?;
    plane.region.read_at(offset as usize, &mut out[..n])?;
    Ok(&out[..n])
}

/// What a differing chunk holds on every plane: the client's bytes, none
/// (zeros: never written there), or others, and from which 4 KiB page on.
fn explain(
    planes: &[Plane],
    len: u64,
    chunk_len: u64,
    c: usize,
    placed: u8,
    expected: u64,
) -> Result<(), BoxError> {
    let mut line = format!("server: chunk {c} BAD (placed on plane {placed}):");
    let mut chunk = vec![0u8; chunk_len.min(len) as usize];
    for p in 0..planes.len() {
        let bytes = read_chunk(planes, len, chunk_len, c, p as u8, &mut chunk)?;
        let mut one = Checksum::new();
        one.update(bytes);
        let zero_pages = bytes
            .chunks(4096)
            .filter(|page| page.iter().all(|&b| b == 0))
            .count();
        let first_zero = bytes
            .chunks(4096)
            .position(|page| page.iter().all(|&b| b == 0));
        line.push_str(&format!(
            " plane {p} {}, {zero_pages} zero pages (first {first_zero:?});",
            if one.value() == expected {
                "matches"
            } else {
                "differs"
            },
        ));
    }
    println!("{line}");
    Ok(())
}
