//! Runs the primer's first-suspect checklist (sections 4.2, 6, 7.4) on one
//! device and port, then a loopback self-test of every one-sided and
//! two-sided operation. One line per check: `[ok]`, `[warn]` or `[FAIL]`,
//! with what is wrong and how to fix it.
//!
//! ```text
//! cargo run --example doctor [-- --dev NAME] [--port N] [--gid-index N] [--max-mtu BYTES]
//!                               [--hop-limit N] [--traffic-class N]
//! ```
//! `--max-mtu`, `--hop-limit` and `--traffic-class` are what the self-test
//! connects with (`QpConfig::max_mtu`, `ConnectOptions`); the defaults are
//! the crate's. Exit status 1 when any check fails (warnings do not count),
//! 2 on bad usage.

use std::error::Error as StdError;
use std::fmt::Display;
use std::process::ExitCode;
use std::time::Duration;

use verbs::device::{
    choose_gid_index, validate_gid_index, GidType, LinkLayer, PortAttr, PortState,
};
use verbs::error::errno_name;
use verbs::sys::ibv_atomic_cap;
use verbs::{
    Access, ConnectOptions, Context, Deadline, Endpoint, GidEntry, HostBuf, Local, MemoryRegion,
    Mtu, NicBuf, PathInfo, ProtectionDomain, QpConfig, QueuePair, RecvRequest, RemoteSlice, SendOp,
    SendRequest,
};

const USAGE: &str = "usage: doctor [--dev NAME] [--port N] [--gid-index N] [--max-mtu BYTES] \
                     [--hop-limit N] [--traffic-class N]";
/// The memlock check registers this much: a typical application buffer pool.
const MEMLOCK_PROBE: usize = 64 << 20;
/// Linux's capability number of CAP_IPC_LOCK, which lifts the memlock limit.
const CAP_IPC_LOCK: u32 = 14;
/// Remote write, read and atomic.
const REMOTE: Access = Access::REMOTE;

type Qp = QueuePair<MemoryRegion>;
type TestResult = Result<String, Box<dyn StdError>>;
/// One self-test: given the PD and a connected pair (a sends, b receives).
type SelfTest = fn(&ProtectionDomain, &mut Qp, &mut Qp) -> TestResult;

struct Options {
    dev: Option<String>,
    port: u8,
    gid_index: Option<u32>,
    /// The self-test's `QpConfig::max_mtu`.
    max_mtu: Mtu,
    /// The self-test's GRH settings.
    connect: ConnectOptions,
}

/// Prints the check lines, keeps them, and counts them by outcome.
/// (`tests/rdma_diagnostics.rs` includes this file to run checks on tables
/// no device in CI has.)
#[derive(Default)]
pub(crate) struct Report {
    failed: usize,
    warned: usize,
    passed: usize,
    pub(crate) lines: Vec<String>,
}

impl Report {
    fn ok(&mut self, check: &str, msg: impl Display) {
        self.passed += 1;
        self.print(format!("[ok]   {check}: {msg}"));
    }
    fn warn(&mut self, check: &str, msg: impl Display) {
        self.warned += 1;
        self.print(format!("[warn] {check}: {msg}"));
    }
    fn fail(&mut self, check: &str, msg: impl Display) {
        self.failed += 1;
        self.print(format!("[FAIL] {check}: {msg}"));
    }
    fn print(&mut self, line: String) {
        println!("{line}");
        self.lines.push(line);
    }
    /// The process exit status: 1 when a check failed (warnings do not count).
    pub(crate) fn exit_status(&self) -> u8 {
        u8::from(self.failed > 0)
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match parse(&args) {
        Ok(opts) => opts,
        Err(msg) => {
            eprintln!("doctor: {msg}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let mut report = Report::default();
    diagnose(&opts, &mut report);
    println!(
        "doctor: {} ok, {} warnings, {} failed",
        report.passed, report.warned, report.failed
    );
    ExitCode::from(report.exit_status())
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut opts = Options {
        dev: None,
        port: 1,
        gid_index: None,
        max_mtu: QpConfig::default().max_mtu,
        connect: ConnectOptions::default(),
    };
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let value = rest.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--dev" => opts.dev = Some(value?.clone()),
            "--port" => opts.port = value?.parse().map_err(|_| "--port takes a number 1..255")?,
            "--gid-index" => {
                opts.gid_index = Some(value?.parse().map_err(|_| "--gid-index takes a number")?)
            }
            "--max-mtu" => {
                opts.max_mtu = value?
                    .parse()
                    .ok()
                    .and_then(Mtu::from_bytes)
                    .ok_or("--max-mtu takes 256, 512, 1024, 2048 or 4096")?
            }
            "--hop-limit" => {
                opts.connect.hop_limit = value?
                    .parse()
                    .map_err(|_| "--hop-limit takes a number 0..255")?
            }
            "--traffic-class" => {
                opts.connect.traffic_class = value?
                    .parse()
                    .map_err(|_| "--traffic-class takes a number 0..255")?
            }
            other => return Err(format!("unexpected argument {other:?}")),
        }
    }
    Ok(opts)
}

/// The checks in the order a connection needs them; a check whose
/// prerequisite failed is not run (its failure would only repeat the cause).
fn diagnose(opts: &Options, r: &mut Report) {
    let ctx = match Context::open(opts.dev.as_deref()) {
        Ok(ctx) => {
            r.ok("device", format!("{} opens", ctx.name()));
            ctx
        }
        Err(e) => {
            let names: Vec<String> = verbs::devices()
                .unwrap_or_default()
                .into_iter()
                .map(|d| d.name)
                .collect();
            if names.is_empty() {
                r.fail("device", e);
            } else {
                r.fail("device", format!("{e} (present: {})", names.join(", ")));
            }
            return;
        }
    };
    let port = match ctx.query_port(opts.port) {
        Ok(port) => port,
        Err(e) => return r.fail("port", e),
    };
    let table = match ctx.gid_table(opts.port) {
        Ok(table) => table,
        Err(e) => return r.fail("GID table", e),
    };
    // The fixes below name the port's network device (RoCE) when there is one.
    let netdev = table.iter().find_map(|e| e.netdev());
    let active = check_port_state(opts.port, &port, netdev.as_deref(), r);
    let gid = check_gids(opts.gid_index, &port, &table, r);
    // RoCE addresses by GID only: without one the GID line said it all.
    let needs_gid = port.link_layer() != LinkLayer::INFINIBAND;
    let addressed = !(needs_gid && gid.is_none()) && check_addressing(&port, gid, r);
    check_mtu(&port, netdev.as_deref(), opts.max_mtu, r);

    let pd = match ProtectionDomain::new(&ctx) {
        Ok(pd) => pd,
        Err(e) => return r.fail("protection domain", e),
    };
    check_memlock(&pd, r);
    check_access(&pd, r);
    report_rnr(ctx.name(), opts.port, r);

    if !(active && addressed) {
        return r.fail(
            "loopback self-test",
            "not run: fix the port/GID/addressing failures above first",
        );
    }
    let atomics = ctx
        .query_device()
        .is_ok_and(|d| d.atomic_cap() != ibv_atomic_cap::NONE);
    self_test(&pd, opts, atomics, r);
}

fn check_port_state(num: u8, port: &PortAttr, netdev: Option<&str>, r: &mut Report) -> bool {
    let check = format!("port {num} state");
    if port.state() == PortState::ACTIVE {
        r.ok(&check, "ACTIVE");
        return true;
    }
    let fix = if port.link_layer() == LinkLayer::INFINIBAND {
        "check the cable and that a subnet manager (opensm) runs".to_string()
    } else {
        let dev = netdev.unwrap_or("DEV");
        format!("`ip link set {dev} up`, check the cable/link (`rdma link`)")
    };
    r.fail(
        &check,
        format!("{} (needs ACTIVE); fix: {fix}", port.state()),
    );
    false
}

/// Checks the table, then the index verbs will use (forced or automatic):
/// it exists and is populated, is routable, is RoCE v2. Returns the entry.
pub(crate) fn check_gids(
    forced: Option<u32>,
    port: &PortAttr,
    table: &[GidEntry],
    r: &mut Report,
) -> Option<GidEntry> {
    let len = port.gid_tbl_len();
    let usable: Vec<&GidEntry> = table.iter().filter(|e| !e.gid.is_zero()).collect();
    let auto = choose_gid_index(table);
    match auto {
        Some(i) => r.ok(
            "GID table",
            format!(
                "{} of {len} entries populated; automatic choice: index {i}",
                usable.len()
            ),
        ),
        None => r.fail(
            "GID table",
            format!(
                "no usable entry (0 of {len}); fix: give the port's netdev an IP address \
                 (`ip addr add ADDR dev DEV`); `rdma link` shows the netdev"
            ),
        ),
    }

    let (index, how) = match (forced, auto) {
        (Some(i), _) => (i, "forced"),
        (None, Some(i)) => (i, "automatic"),
        (None, None) => return None,
    };
    let auto_text = auto.map_or("none".to_string(), |i| i.to_string());
    let entry = match validate_gid_index(table, index, len) {
        Ok(e) => e,
        Err(_) if index >= len => {
            r.fail(
                "GID index",
                format!(
                    "{index} ({how}) is past the table ({len} entries); fix: omit --gid-index \
                     (automatic: {auto_text}) or pick one `devinfo` lists"
                ),
            );
            return None;
        }
        Err(_) => {
            r.fail(
                "GID index",
                format!(
                    "{index} ({how}) is an empty (zero) entry; fix: omit --gid-index \
                     (automatic: {auto_text}) or pick one `devinfo` lists"
                ),
            );
            return None;
        }
    };
    let netdev = entry.netdev().unwrap_or_else(|| "-".into());
    r.ok(
        "GID index",
        format!(
            "{index} ({how}): {} {} on {netdev}",
            entry.gid,
            version(entry.gid_type)
        ),
    );

    // On InfiniBand every GID is fe80:: (the default subnet prefix) and
    // type IB: scope and RoCE version do not apply.
    if port.link_layer() != LinkLayer::ETHERNET {
        return Some(entry);
    }
    let routable = usable.iter().find(|e| !e.gid.is_link_local());
    match (entry.gid.is_link_local(), routable) {
        (false, _) => r.ok(
            "GID scope",
            format!("{} is routable (not link-local)", entry.gid),
        ),
        (true, Some(other)) => r.warn(
            "GID scope",
            format!(
                "index {index} is link-local ({}): reaches only the same L2 link; \
                 fix: use routable index {} ({})",
                entry.gid, other.index, other.gid
            ),
        ),
        (true, None) => r.warn(
            "GID scope",
            "only link-local GIDs: works on one L2 link only; fix: give the netdev an IP address",
        ),
    }
    if entry.gid_type == GidType::ROCE_V2 {
        r.ok("GID type", "RoCE v2 (UDP/IP, routable)");
    } else {
        let v2 = usable
            .iter()
            .find(|e| e.gid == entry.gid && e.gid_type == GidType::ROCE_V2)
            .map_or(String::new(), |e| {
                format!(" (index {} is the v2 entry)", e.index)
            });
        r.warn(
            "GID type",
            format!(
                "index {index} is {}: not routable, and a v2 peer will not answer; fix: use \
                 the RoCE v2 entry{v2}",
                version(entry.gid_type)
            ),
        );
    }
    Some(entry)
}

/// is_global for the link layer (primer 4.3, 6.2, 6.3): the plan verbs
/// makes for a peer that looks like this port.
fn check_addressing(port: &PortAttr, gid: Option<GidEntry>, r: &mut Report) -> bool {
    let layer = port.link_layer();
    if layer == LinkLayer::INFINIBAND && port.lid() == 0 {
        r.fail(
            "addressing",
            "InfiniBand port with LID 0: no subnet manager assigned one; fix: run opensm",
        );
        return false;
    }
    let mtu = Mtu(port.active_mtu().0);
    let me = Endpoint {
        qpn: 1,
        psn: 0,
        lid: port.lid(),
        gid: gid.map(|g| g.gid).unwrap_or_default(),
        mtu,
        regions: Vec::new(),
    };
    match PathInfo::plan(layer, gid, mtu, &me, false) {
        Ok(p) if p.is_global => r.ok(
            "addressing",
            format!("{layer}: is_global=1, GRH with sgid_index {}", p.sgid_index),
        ),
        Ok(_) => r.ok(
            "addressing",
            format!("{layer}: is_global=0, route by LID {}", port.lid()),
        ),
        Err(e) => {
            r.fail("addressing", e);
            return false;
        }
    }
    true
}

/// RoCE's active MTU is the largest IB MTU that fits the netdev's MTU
/// (less headers): 1500 gives 1024, 9000 gives 4096 (primer 4.6). A
/// `--max-mtu` below it caps the path on purpose (a hop that carries less).
fn check_mtu(port: &PortAttr, netdev: Option<&str>, cap: Mtu, r: &mut Report) {
    let (active, max) = (Mtu(port.active_mtu().0), Mtu(port.max_mtu().0));
    if cap.0 < active.0 {
        return r.ok(
            "MTU",
            format!(
                "path capped at {cap} by --max-mtu (QpConfig::max_mtu), below the port's \
                 active {active}: right when a hop on the path carries less, else more packets \
                 per message for nothing"
            ),
        );
    }
    if active.0 >= max.0 {
        return r.ok("MTU", format!("active {active} = max {max}"));
    }
    let fix = match (port.link_layer(), netdev) {
        (LinkLayer::ETHERNET, Some(dev)) => {
            let dev_mtu = std::fs::read_to_string(format!("/sys/class/net/{dev}/mtu"))
                .map_or("?".into(), |s| s.trim().to_string());
            format!(
                "netdev {dev} MTU {dev_mtu} caps it; for {max}: `ip link set {dev} mtu 9000` \
                 on both hosts and every switch"
            )
        }
        (LinkLayer::ETHERNET, None) => {
            "raise the netdev MTU (9000) on both hosts and every switch".into()
        }
        _ => "check the subnet manager's and switches' MTU".into(),
    };
    r.warn("MTU", format!("active {active} < max {max}: {fix}"));
}

/// Registering pins pages, which counts against RLIMIT_MEMLOCK unless the
/// process has CAP_IPC_LOCK (root usually does): so the limit alone does
/// not decide, the registration does.
fn check_memlock(pd: &ProtectionDomain, r: &mut Report) {
    let limit = memlock_limit();
    let limit_text = limit.map_or("unlimited".into(), |l| format!("{} KiB", l >> 10));
    let too_low = limit.is_some_and(|l| l < MEMLOCK_PROBE as u64);
    let probe = format!("{} MiB", MEMLOCK_PROBE >> 20);
    let fix = "fix: `ulimit -l unlimited` (or memlock in /etc/security/limits.conf, \
               LimitMEMLOCK=infinity for a systemd service)";
    match MemoryRegion::new(pd, MEMLOCK_PROBE) {
        Err(e) if matches!(e.errno(), Some(libc::ENOMEM | libc::EPERM | libc::EAGAIN)) => r.fail(
            "memlock",
            format!(
                "limit {limit_text}: registering {probe} failed ({}); {fix}",
                errno_name(e.errno().unwrap_or_default())
            ),
        ),
        Err(e) => r.fail(
            "memlock",
            format!("limit {limit_text}: registering {probe} failed: {e}"),
        ),
        Ok(_) if too_low && has_cap_ipc_lock() => r.warn(
            "memlock",
            format!(
                "limit {limit_text} < {probe}, works only through CAP_IPC_LOCK (root); \
                 for other users, {fix}"
            ),
        ),
        Ok(_) if too_low => r.warn(
            "memlock",
            format!("limit {limit_text} < {probe}, yet {probe} registered; {fix}"),
        ),
        Ok(_) => r.ok(
            "memlock",
            format!("limit {limit_text}; a {probe} region registered"),
        ),
    }
}

/// The soft RLIMIT_MEMLOCK in bytes, `None` when unlimited.
fn memlock_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes one `rlimit` through a valid, exclusive pointer.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) };
    (rc == 0 && lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur)
}

/// True when the effective capability set (`CapEff` in /proc/self/status) has CAP_IPC_LOCK.
fn has_cap_ipc_lock() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let hex = s
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))?
                .trim()
                .to_string();
            u64::from_str_radix(&hex, 16).ok()
        })
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// A region registered for remote access hands out a descriptor (rkey);
/// a local-only one must not (least privilege, and the rkey/lkey mix-up).
fn check_access(pd: &ProtectionDomain, r: &mut Report) {
    match MemoryRegion::with_access(pd, 4096, REMOTE) {
        Ok(mr) => match mr.remote() {
            Some(d) if (d.addr, d.len, d.rkey) == (mr.addr(), mr.len() as u64, mr.rkey()) => r.ok(
                "remote region",
                format!(
                    "REMOTE_WRITE|READ|ATOMIC: descriptor of {} bytes, rkey {:#x} \
                     (lkey {:#x} stays local)",
                    d.len,
                    d.rkey,
                    mr.lkey()
                ),
            ),
            other => r.fail(
                "remote region",
                format!("wrong descriptor {other:?} for {mr:?}"),
            ),
        },
        Err(e) => r.fail("remote region", e),
    }
    match MemoryRegion::new(pd, 4096) {
        Ok(mr) if mr.remote().is_none() && !mr.access().grants_remote() && !mr.peer_writable() => {
            r.ok("local region", "local-only region exposes no rkey")
        }
        Ok(mr) => r.fail(
            "local region",
            format!("local-only region exposes {:?}", mr.remote()),
        ),
        Err(e) => r.fail("local region", e),
    }
}

/// What a Send the peer has no receive for does with the crate's default
/// `rnr_retry`, and where to see it happen: with 7 (forever) it waits,
/// which only the port's RNR counters show.
fn report_rnr(dev: &str, port: u8, r: &mut Report) {
    let retries = ConnectOptions::default().rnr_retry;
    let behaviour = if retries >= 7 {
        "a Send the peer has no receive for waits for one (rnr_retry 7), it never fails".to_string()
    } else {
        format!(
            "a Send the peer has no receive for fails after {retries} retries (RNR_RETRY_EXC_ERR)"
        )
    };
    let dir = format!("/sys/class/infiniband/{dev}/ports/{port}/hw_counters");
    let mut counters: Vec<String> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let rnr = name.contains("rnr") || name == "out_of_buffer";
            let value = std::fs::read_to_string(entry.path()).ok().filter(|_| rnr)?;
            Some(format!("{name} {}", value.trim()))
        })
        .collect();
    counters.sort();
    let shown = if counters.is_empty() {
        "the port has no RNR counters".to_string()
    } else {
        counters.join(", ")
    };
    r.ok(
        "RNR",
        format!("{behaviour}; to see it: `rdma statistic show link {dev}/{port}` ({shown})"),
    );
}

/// Two queue pairs on this device connected to each other, afresh for
/// each test, so that one failure (which moves a QP to ERR) does not flush
/// the tests after it.
fn self_test(pd: &ProtectionDomain, opts: &Options, atomics: bool, r: &mut Report) {
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
    let (ea, eb) = (a.endpoint(), b.endpoint());
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

fn version(t: GidType) -> String {
    match t {
        GidType::ROCE_V1 => "RoCE v1".into(),
        GidType::ROCE_V2 => "RoCE v2".into(),
        GidType::IB => "IB".into(),
        other => other.to_string(),
    }
}
