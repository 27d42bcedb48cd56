//! The doctor's loopback self-test: two queue pairs on the device,
//! connected to each other, run an RDMA write, a read, a send/receive and
//! (when the device has them) the atomics, checking every byte.

use std::error::Error as StdError;
use std::time::Duration;

use verbs::{
    ConnectOptions, Deadline, HostBuf, Local, MemoryRegion, PathInfo, ProtectionDomain, QpConfig,
    QueuePair, RecvRequest, RemoteSlice, SendOp, SendRequest,
};

use super::{Options, Report, REMOTE};

type Qp = QueuePair<MemoryRegion>;
type TestResult = Result<String, Box<dyn StdError>>;
/// One self-test: given the PD and a connected pair (a sends, b receives).
type SelfTest = fn(&ProtectionDomain, &mut Qp, &mut Qp) -> TestResult;

/// Two queue pairs on this device connected to each other, afresh for
/// each test, so that one failure (which moves a QP to ERR) does not flush
/// the tests after it.
pub(super) fn self_test(pd: &ProtectionDomain, opts: &Options, atomics: bool, r: &mut Report) {
    let config = QpConfig {
        port: opts.port,
        gid_index: opts.gid_index,
        remote_access: REMOTE,
        max_mtu: opts.max_mtu,
        ..QpConfig::default()
    };
    let connect = &opts.connect;
    match connected_pair(pd, &config, connect) {
        Ok((a, _, path)) => {
            r.ok(
                "loopback connect",
                format!(
                    "INIT->RTR->RTS, is_global={} sgid_index {} path MTU {}",
                    u8::from(path.is_global),
                    path.sgid_index,
                    path.path_mtu
                ),
            );
            report_grh(&a, &path, connect, r);
        }
        Err(e) => return r.fail("loopback connect", e),
    }
    let mut tests: Vec<(&str, SelfTest)> = vec![
        ("self-test RDMA write", write_test),
        ("self-test RDMA read", read_test),
        ("self-test send/recv", send_recv_test),
    ];
    if atomics {
        tests.push(("self-test atomics", atomic_test));
    } else {
        r.warn(
            "self-test atomics",
            "not run: the device reports atomic_cap NONE",
        );
    }
    for (name, test) in tests {
        match connected_pair(pd, &config, connect)
            .and_then(|(mut a, mut b, _)| test(pd, &mut a, &mut b))
        {
            Ok(msg) => r.ok(name, msg),
            Err(e) => r.fail(name, e),
        }
    }
}

fn connected_pair(
    pd: &ProtectionDomain,
    config: &QpConfig,
    connect: &ConnectOptions,
) -> Result<(Qp, Qp, PathInfo), Box<dyn StdError>> {
    let mut a = Qp::new(pd, config)?;
    let mut b = Qp::new(pd, config)?;
    let (ea, eb) = (a.endpoint()?, b.endpoint()?);
    let path = a.connect_with(&eb, connect)?;
    b.connect_with(&ea, connect)?;
    Ok((a, b, path))
}

/// The hop limit and traffic class the connection carries, as the device
/// reports them: on RoCE, Linux puts the IP route's hop limit in the GRH
/// whatever was asked (primer 4.3 sets 1, which the route overrides).
fn report_grh(qp: &Qp, path: &PathInfo, asked: &ConnectOptions, r: &mut Report) {
    if !path.is_global {
        return r.ok(
            "GRH",
            "not used (is_global=0): no hop limit or traffic class",
        );
    }
    match qp.query() {
        Ok(q) if q.hop_limit == asked.hop_limit => r.ok(
            "GRH",
            format!(
                "hop limit {}, traffic class {} (asked {})",
                q.hop_limit, q.traffic_class, asked.traffic_class
            ),
        ),
        Ok(q) => r.ok(
            "GRH",
            format!(
                "hop limit {} (asked {}: the kernel took the IP route's: its hoplimit, else \
                 net.ipv4.ip_default_ttl or the netdev's IPv6 hop_limit), traffic class {} \
                 (asked {})",
                q.hop_limit, asked.hop_limit, q.traffic_class, asked.traffic_class
            ),
        ),
        Err(e) => r.warn(
            "GRH",
            format!("cannot read what the connection carries: {e}"),
        ),
    }
}

fn deadline() -> Deadline {
    Deadline::after(Duration::from_secs(10))
}

/// Posts `req`, waits for its completion, and returns its buffer.
fn run(qp: &mut Qp, req: SendRequest<MemoryRegion>) -> Result<MemoryRegion, Box<dyn StdError>> {
    qp.post_send(req).map_err(|e| e.error)?;
    let mut c = qp.wait_one(deadline())?;
    c.result()?;
    Ok(c.take_buf()
        .ok_or("completion came back without its buffer")?)
}

fn range(mr: MemoryRegion, len: usize) -> Result<Local<MemoryRegion>, verbs::Error> {
    Local::range(mr, 0, len).map_err(|(e, _)| e)
}

/// A byte pattern that differs at every offset, so a shifted copy shows.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

const LEN: usize = 3000;

fn write_test(pd: &ProtectionDomain, a: &mut Qp, _b: &mut Qp) -> TestResult {
    let target = MemoryRegion::with_access(pd, 4096, REMOTE)?;
    let remote = RemoteSlice::new(&target.remote().ok_or("no descriptor")?, 0, LEN as u64)?;
    let mut src = MemoryRegion::new(pd, 4096)?;
    let data = pattern(LEN);
    src.write_at(0, &data)?;
    run(a, SendRequest::new(SendOp::Write(remote), range(src, LEN)?))?;
    let mut landed = vec![0; LEN];
    target.read_at(0, &mut landed)?;
    match landed.iter().zip(&data).position(|(x, y)| x != y) {
        None => Ok(format!("{LEN} bytes landed byte-exact")),
        Some(at) => Err(format!("landed bytes differ from offset {at}").into()),
    }
}

fn read_test(pd: &ProtectionDomain, a: &mut Qp, _b: &mut Qp) -> TestResult {
    let mut source = MemoryRegion::with_access(pd, 4096, REMOTE)?;
    let data = pattern(LEN);
    source.write_at(0, &data)?;
    let remote = RemoteSlice::new(&source.remote().ok_or("no descriptor")?, 0, LEN as u64)?;
    let dst = run(
        a,
        SendRequest::new(
            SendOp::Read(remote),
            range(MemoryRegion::new(pd, 4096)?, LEN)?,
        ),
    )?;
    if dst.as_slice()?[..LEN] == data[..] {
        Ok(format!("{LEN} bytes read back byte-exact"))
    } else {
        Err("the bytes read differ from the source".into())
    }
}

/// The receive is posted before the send: without it the sender gets
/// RNR_RETRY_EXC_ERR (primer 6.4).
fn send_recv_test(pd: &ProtectionDomain, a: &mut Qp, b: &mut Qp) -> TestResult {
    b.post_recv(RecvRequest::new(MemoryRegion::new(pd, 4096)?))
        .map_err(|e| e.error)?;
    let mut msg = MemoryRegion::new(pd, 4096)?;
    let data = pattern(LEN);
    msg.write_at(0, &data)?;
    run(a, SendRequest::new(SendOp::Send, range(msg, LEN)?))?;
    let mut c = b.wait_one(deadline())?;
    c.result()?;
    let inbox = c.take_buf().ok_or("receive came back without its buffer")?;
    if c.byte_len as usize == LEN && inbox.as_slice()?[..LEN] == data[..] {
        Ok(format!("{LEN}-byte message received intact"))
    } else {
        Err(format!(
            "received {} bytes that differ from the {LEN} sent",
            c.byte_len
        )
        .into())
    }
}

fn atomic_test(pd: &ProtectionDomain, a: &mut Qp, _b: &mut Qp) -> TestResult {
    let mut target = MemoryRegion::with_access(pd, 4096, REMOTE)?;
    target.write_at(8, &40u64.to_ne_bytes())?;
    let word = RemoteSlice::new(&target.remote().ok_or("no descriptor")?, 8, 8)?;
    let word_now = |t: &MemoryRegion| -> Result<u64, verbs::Error> {
        let mut b = [0; 8];
        t.read_at(8, &mut b)?;
        Ok(u64::from_ne_bytes(b))
    };
    let fetched = |mr: &MemoryRegion| -> Result<u64, verbs::Error> {
        Ok(u64::from_ne_bytes(
            mr.as_slice()?[..8].try_into().expect("8 bytes"),
        ))
    };

    let op = SendOp::FetchAdd {
        remote: word,
        add: 2,
    };
    let result = run(
        a,
        SendRequest::new(op, range(MemoryRegion::new(pd, 4096)?, 8)?),
    )?;
    let (old, now) = (fetched(&result)?, word_now(&target)?);
    if (old, now) != (40, 42) {
        return Err(format!("fetch-add 40+2 returned {old}, left {now} (want 40, 42)").into());
    }
    let op = SendOp::CompareSwap {
        remote: word,
        compare: 42,
        swap: 7,
    };
    let result = run(a, SendRequest::new(op, range(result, 8)?))?;
    let (old, now) = (fetched(&result)?, word_now(&target)?);
    if (old, now) != (42, 7) {
        return Err(format!("compare-swap 42->7 returned {old}, left {now} (want 42, 7)").into());
    }
    Ok("fetch-add 40+2 -> 42, compare-swap 42 -> 7".into())
}
