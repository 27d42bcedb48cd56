//! Test support: open the device a test was promised, and build a
//! loopback pair of connected queue pairs on it.
//!
//! `VERBS_TEST_DEVICE` names the device (else the first one); a missing
//! device fails the test. On iWARP (`siw0` in the test bed) queue pairs
//! connect only through rdma_cm: the context is librdmacm's and the pairs
//! are made with `verbs::cm` (tests/softroce/README.md lists the device
//! tests that do not apply there, and why).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use verbs::{Access, Context, Deadline, MemoryRegion, ProtectionDomain, QpConfig, QueuePair};

pub mod numbered;
mod pairs;
#[allow(unused_imports)] // each test binary uses some
pub use pairs::{
    cm_pair, connected_pair_in, engine_pairs, pair_on, sender_to, srq_server_and_client,
};

/// The first byte of `buf`.
pub fn first_byte(buf: &MemoryRegion) -> u8 {
    let mut b = [0u8; 1];
    verbs::HostBuf::read_at(buf, 0, &mut b).unwrap();
    b[0]
}

/// The IPv4 address of `ctx`'s netdev (rdma_cm connects by address):
/// the IPv4-mapped GID the crate chooses on RoCE; on iWARP, whose GID is
/// the netdev's MAC, the netdev's own address.
pub fn device_ipv4(ctx: &Context) -> std::net::Ipv4Addr {
    let table = ctx.gid_table(1).expect("read port 1's GID table");
    let gid = verbs::device::choose_gid(&table).expect("a usable GID");
    if let Some(v4) = gid.gid.ipv4() {
        return v4.into();
    }
    assert!(is_iwarp(ctx), "an IPv4-mapped GID on {}", ctx.name());
    // iWARP's GID entries name no netdev: `rdma link` does.
    let link = format!("{}/1", ctx.name());
    let (ok, out) = run(Command::new("rdma").args(["link", "show", &link]));
    assert!(ok, "rdma link show {link}");
    let dev = out
        .split_whitespace()
        .skip_while(|w| *w != "netdev")
        .nth(1)
        .unwrap_or_else(|| panic!("{link}'s netdev: {out}"))
        .to_string();
    let (ok, out) = run(Command::new("ip").args(["-o", "-4", "addr", "show", "dev", &dev]));
    assert!(ok, "ip addr show dev {dev}");
    out.split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|a| a.split('/').next()?.parse().ok())
        .unwrap_or_else(|| panic!("an IPv4 address on {dev}: {out}"))
}

/// True for an iWARP device (node type RNIC): it connects only through
/// rdma_cm, and has no UD, no atomics, no memory windows.
pub fn is_iwarp(ctx: &Context) -> bool {
    let path = format!("/sys/class/infiniband/{}/node_type", ctx.name());
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .starts_with("4:")
}

/// The device under test (`VERBS_TEST_DEVICE`, else the first). A test
/// that needs a device FAILS without one, never skips: run the suite with
/// `tests/softroce/cargo test`, which gives every device test a Soft-RoCE
/// device in a guest when the host has none.
///
/// On iWARP it is librdmacm's context of the device, so that queue pairs
/// rdma_cm makes can use its protection domains.
pub fn test_context(test: &str) -> Context {
    let name = std::env::var("VERBS_TEST_DEVICE")
        .ok()
        .filter(|s| !s.is_empty());
    let ctx = Context::open(name.as_deref()).unwrap_or_else(|e| {
        panic!("{test}: no RDMA device {name:?} ({e}); run device tests with tests/softroce/cargo test")
    });
    if !is_iwarp(&ctx) {
        return ctx;
    }
    cm_context(test, ctx.name())
}

#[cfg(feature = "rdmacm")]
fn cm_context(test: &str, name: &str) -> Context {
    let ctx = verbs::cm::context(Some(name))
        .unwrap_or_else(|e| panic!("{test}: librdmacm's context of {name}: {e}"));
    if is_soft_iwarp(&ctx) {
        cover_siw_key_hole(&ctx);
    }
    ctx
}

/// Soft-iWARP (Linux 6.1, rdma-core 44) gives each queue the device maps
/// into the process a key, its page offset in the context's mmap space,
/// and libsiw takes the key 0x90000 (page 144) for its "invalid key": the
/// completion queue, queue pair or SRQ whose queue lands there fails to be
/// created, without an errno, and so does each next one (the same offset
/// is free again). librdmacm's context is one per process, shared by every
/// test of a binary, so a completion queue of 65536 entries (2 MiB) is
/// made on it first and kept: it covers pages 0 to 511, and no later
/// queue can start on page 144.
#[cfg(feature = "rdmacm")]
fn cover_siw_key_hole(ctx: &Context) {
    use std::sync::{Mutex, OnceLock};
    static COVER: OnceLock<Mutex<verbs::Engine<MemoryRegion>>> = OnceLock::new();
    COVER.get_or_init(|| {
        let pd = ProtectionDomain::new(ctx).expect("a PD on siw0");
        let config = verbs::EngineConfig {
            cq_depth: Some(65536),
            ..verbs::EngineConfig::default()
        };
        Mutex::new(verbs::Engine::new(&pd, &config).expect("siw0's covering CQ"))
    });
}

#[cfg(not(feature = "rdmacm"))]
fn cm_context(test: &str, name: &str) -> Context {
    panic!(
        "{test}: {name} is iWARP, which connects only through rdma_cm: run with --features rdmacm"
    )
}

/// A generous deadline for one operation on a TCG guest.
pub fn deadline() -> Deadline {
    Deadline::after(Duration::from_secs(20))
}

/// The QP configuration of the tests: everything remote allowed at the QP
/// level, so that the memory regions' own access flags are what is tested.
pub fn config() -> QpConfig {
    QpConfig {
        remote_access: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        ..QpConfig::default()
    }
}

/// [`config`] with queues 8 deep and one entry per request: small enough
/// that a test fills them, as the engine and reply tests do.
pub fn shallow_config() -> QpConfig {
    QpConfig {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_sge: 1,
        ..config()
    }
}

/// A protection domain on the device under test and a connected loopback
/// pair in it.
pub fn pd_and_pair<B: verbs::NicBuf>(test: &str) -> (ProtectionDomain, QueuePair<B>, QueuePair<B>) {
    let ctx = test_context(test);
    let pd = ProtectionDomain::new(&ctx).expect("alloc PD");
    let (a, b) = connected_pair(&pd);
    (pd, a, b)
}

/// Two RC queue pairs on one device, connected to each other (loopback).
pub fn connected_pair<B: verbs::NicBuf>(pd: &ProtectionDomain) -> (QueuePair<B>, QueuePair<B>) {
    connected_pair_with(pd, &config(), &verbs::ConnectOptions::default())
}

/// As [`connected_pair`] with explicit settings.
pub fn connected_pair_with<B: verbs::NicBuf>(
    pd: &ProtectionDomain,
    config: &QpConfig,
    opts: &verbs::ConnectOptions,
) -> (QueuePair<B>, QueuePair<B>) {
    if is_iwarp(pd.context()) {
        return cm_pair(pd, config);
    }
    let mut a = QueuePair::new(pd, config).expect("create QP a");
    let mut b = QueuePair::new(pd, config).expect("create QP b");
    let (ea, eb) = (a.endpoint().unwrap(), b.endpoint().unwrap());
    a.connect_with(&eb, opts).expect("connect a -> b");
    b.connect_with(&ea, opts).expect("connect b -> a");
    (a, b)
}

/// A region with remote write, read and atomic access.
pub fn remote_region(pd: &ProtectionDomain, len: usize) -> MemoryRegion {
    MemoryRegion::with_access(
        pd,
        len,
        Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
    )
    .expect("register a remote region")
}

/// A distinct byte pattern for `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The example binary `name` next to this test binary
/// (target/<profile>/deps/TEST-HASH -> target/<profile>/examples/NAME).
/// A plain `cargo test` builds the examples; a filtered
/// `cargo test --test T` does not (run `cargo build --examples` first).
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .unwrap_or_else(|| panic!("unexpected test binary location {}", exe.display()));
    let bin = profile_dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "the example binary {} does not exist: build it first with `cargo build --examples` \
         (a plain `cargo test` builds it; `cargo test --test ...` alone does not)",
        bin.display()
    );
    refuse_stale(&bin);
    bin
}

/// Fails if a source the example was built from (per its dep-info file) is
/// newer than the binary: the test would judge old code.
fn refuse_stale(bin: &Path) {
    let Ok(depinfo) = std::fs::read_to_string(bin.with_extension("d")) else {
        return;
    };
    let Ok(built) = std::fs::metadata(bin).and_then(|m| m.modified()) else {
        return;
    };
    let Some((_, deps)) = depinfo.lines().next().and_then(|l| l.split_once(": ")) else {
        return;
    };
    // Paths are separated by spaces; a space inside a path is "\ ".
    let deps = deps.replace("\\ ", "\u{0}");
    let newer: Vec<String> = deps
        .split_whitespace()
        .map(|p| p.replace('\u{0}', " "))
        .filter(|p| {
            std::fs::metadata(p)
                .and_then(|m| m.modified())
                .is_ok_and(|t: SystemTime| t > built)
        })
        .collect();
    assert!(
        newer.is_empty(),
        "{} is older than {newer:?}: rebuild it (`cargo build --examples`)",
        bin.display()
    );
}

/// Runs `cmd`, shows its output (visible with --nocapture or on failure),
/// and returns whether it succeeded and its stdout.
pub fn run(cmd: &mut Command) -> (bool, String) {
    let (status, stdout) = run_shown(cmd);
    (status.success(), stdout)
}

/// Runs `cmd`, prints the command, its output and its status; returns the
/// status and stdout.
fn run_shown(cmd: &mut Command) -> (std::process::ExitStatus, String) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    println!(
        "$ {cmd:?}\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("-> {}", out.status);
    (out.status, stdout)
}

/// The hop limit Linux gives a RoCE connection through `gid`: resolving the
/// peer's MAC through the IP route, it takes the route's hop limit too,
/// whatever the application asked for (`net.ipv4.ip_default_ttl`, or the
/// netdev's IPv6 hop limit, unless a route sets `hoplimit`).
pub fn route_hop_limit(gid: &verbs::GidEntry) -> u8 {
    let path = match (gid.gid.ipv4(), gid.netdev()) {
        (Some(_), _) => "/proc/sys/net/ipv4/ip_default_ttl".to_string(),
        (None, Some(dev)) => format!("/proc/sys/net/ipv6/conf/{dev}/hop_limit"),
        (None, None) => panic!("a RoCE GID without a netdev: {gid:?}"),
    };
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{path}: {text:?}: {e}"))
}

/// As [`run`], with the exit code (`None` when a signal ended it).
pub fn run_with_code(cmd: &mut Command) -> (Option<i32>, String) {
    let (status, stdout) = run_shown(cmd);
    (status.code(), stdout)
}

/// True inside the Soft-RoCE guest, whose network a test may change (a
/// host's is not the test's to touch).
pub fn in_guest() -> bool {
    std::env::var("VERBS_IN_GUEST").as_deref() == Ok("1")
}

/// Runs `ip ARGS` (iproute2), which must succeed.
pub fn ip(args: &[&str]) {
    let (ok, _) = run(Command::new("ip").args(args));
    assert!(ok, "ip {args:?}");
}

/// Waits up to 10 s for `done`: the kernel applies a netdev change to the
/// RDMA port and its GID table asynchronously.
pub fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(std::time::Instant::now() < until, "{what} within 10 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `ip ARGS` when dropped, undoing a change to the guest's network,
/// then waits until `settled`.
pub struct IpOnDrop<F: FnMut() -> bool> {
    /// The undoing `ip` arguments.
    pub args: Vec<String>,
    /// True once the device is back as it was.
    pub settled: F,
}

impl<F: FnMut() -> bool> Drop for IpOnDrop<F> {
    fn drop(&mut self) {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        ip(&args);
        wait_for("the netdev back as it was", &mut self.settled);
    }
}

/// The network device of a RoCE port, from its GID table.
pub fn netdev_of(table: &[verbs::GidEntry]) -> String {
    table
        .iter()
        .find_map(verbs::GidEntry::netdev)
        .expect("a RoCE port's GIDs name its netdev")
}

/// `ADDR/PREFIX` of `dev`'s IPv4 address `addr`, as `ip addr add` takes it.
pub fn ipv4_with_prefix(dev: &str, addr: &std::net::Ipv4Addr) -> String {
    let (ok, out) = run(Command::new("ip").args(["-o", "-4", "addr", "show", "dev", dev]));
    assert!(ok, "ip addr show dev {dev}");
    out.split_whitespace()
        .find(|w| w.starts_with(&format!("{addr}/")))
        .unwrap_or_else(|| panic!("{addr} in {out}"))
        .to_string()
}

/// True when `ctx` is Soft-iWARP (`siw`, vendor id "bmt"), whose
/// statuses some tests know apart from other devices'.
pub fn is_soft_iwarp(ctx: &Context) -> bool {
    const SIW_VENDOR_ID: u32 = 0x62_6d74;
    ctx.query_device().expect("query the device").0.vendor_id == SIW_VENDOR_ID
}

/// True when `ctx` is Soft-RoCE (its vendor id is `RXE_VENDOR_ID`), whose
/// statuses and counters some tests know apart from a NIC's.
pub fn is_soft_roce(ctx: &Context) -> bool {
    const RXE_VENDOR_ID: u32 = 0xFF_FFFF;
    ctx.query_device().expect("query the device").0.vendor_id == RXE_VENDOR_ID
}
