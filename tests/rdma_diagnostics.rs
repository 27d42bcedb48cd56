//! The diagnostic examples on a real device (rxe in a Soft-RoCE guest in
//! CI): `devinfo` shows the GID table, `doctor` passes on a healthy device
//! and fails, naming the cause, where the primer's pitfalls are staged.
//!
//! The examples must be built: a plain `cargo test` builds them (see
//! `support::example`).

mod support;

use std::process::Command;

use verbs::device::LinkLayer;
use verbs::sys::ibv_atomic_cap;
use verbs::Context;

/// Linux's capability number of CAP_IPC_LOCK.
const CAP_IPC_LOCK: u32 = 14;

fn doctor(ctx: &Context, extra: &[&str]) -> (bool, String) {
    support::run(
        Command::new(support::example("doctor"))
            .args(["--dev", ctx.name()])
            .args(extra),
    )
}

/// The doctor line of `check`, e.g. `[FAIL] memlock: ...` (tags are padded).
fn line<'a>(out: &'a str, check: &str) -> &'a str {
    let name = format!("{check}:");
    out.lines()
        .find(|l| {
            l.split_once(']')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with(&name))
        })
        .unwrap_or_else(|| panic!("no {check:?} line in:\n{out}"))
}

#[test]
fn devinfo_lists_the_device_and_its_gid_table() {
    let ctx = support::test_context("devinfo_lists_the_device_and_its_gid_table");
    let name = ctx.name();
    let (ok, out) = support::run(Command::new(support::example("devinfo")).args(["--dev", name]));
    assert!(ok, "devinfo failed");
    assert!(
        out.lines()
            .any(|l| l.starts_with(&format!("{name}  GUID "))),
        "device line"
    );

    // Rows: DEV PORT INDEX GID [IPv4] VER NETDEV; one per populated GID of port 1.
    let rows: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|cols| cols.first() == Some(&name) && cols.get(1) == Some(&"1"))
        .collect();
    let table = ctx.gid_table(1).expect("GID table");
    let populated: Vec<_> = table.iter().filter(|e| !e.gid.is_zero()).collect();
    assert_eq!(rows.len(), populated.len(), "one row per populated GID");

    if ctx.query_port(1).unwrap().link_layer() == LinkLayer::ETHERNET {
        // RoCE with an IPv4 address (rxe0 on 10.77.0.1): an IPv4-mapped v2 row,
        // and it is the one verbs picks.
        let mapped = rows
            .iter()
            .find(|c| c[3].starts_with("0000:0000:0000:0000:0000:ffff:") && c.get(5) == Some(&"v2"))
            .unwrap_or_else(|| panic!("no IPv4-mapped RoCE v2 GID row in:\n{out}"));
        assert!(
            mapped[4].parse::<std::net::Ipv4Addr>().is_ok(),
            "IPv4 column: {mapped:?}"
        );
        let auto = format!("auto GID index: {} (::ffff:{}, v2)", mapped[2], mapped[4]);
        assert!(out.contains(&auto), "missing {auto:?}");
    }
}

#[test]
fn doctor_passes_every_check_on_a_healthy_device() {
    let ctx = support::test_context("doctor_passes_every_check_on_a_healthy_device");
    let (ok, out) = doctor(&ctx, &[]);
    assert!(ok, "doctor failed on a healthy device");
    assert!(!out.contains("[FAIL]"));
    let mut self_tests = vec![
        "self-test RDMA write",
        "self-test RDMA read",
        "self-test send/recv",
    ];
    if ctx.query_device().unwrap().atomic_cap() != ibv_atomic_cap::NONE {
        self_tests.push("self-test atomics");
    }
    for check in [
        "loopback connect",
        "memlock",
        "remote region",
        "local region",
    ]
    .into_iter()
    .chain(self_tests)
    {
        assert!(line(&out, check).starts_with("[ok]"), "{check} passes");
    }
}

#[test]
fn doctor_fails_the_memlock_check_under_a_low_limit() {
    let ctx = support::test_context("doctor_fails_the_memlock_check_under_a_low_limit");
    // CAP_IPC_LOCK (root in the guest) lifts the limit, so drop it too:
    // otherwise the 64 MiB registration succeeds and doctor only warns.
    let mut cmd = Command::new("prlimit");
    cmd.arg("--memlock=65536:65536");
    if has_cap_ipc_lock() {
        cmd.args([
            "setpriv",
            "--inh-caps=-ipc_lock",
            "--bounding-set=-ipc_lock",
            "--",
        ]);
    }
    cmd.arg(support::example("doctor"))
        .args(["--dev", ctx.name()]);
    let (ok, out) = support::run(&mut cmd);
    assert!(!ok, "doctor must exit non-zero");
    let memlock = line(&out, "memlock");
    assert!(memlock.starts_with("[FAIL]"), "{memlock}");
    assert!(
        memlock.contains("64 KiB") && memlock.contains("ulimit -l unlimited"),
        "{memlock}"
    );
}

#[test]
fn doctor_flags_a_forced_link_local_gid() {
    let ctx = support::test_context("doctor_flags_a_forced_link_local_gid");
    let table = ctx.gid_table(1).expect("GID table");
    let link_local = table.iter().find(|e| e.gid.is_link_local());
    let routable = table
        .iter()
        .any(|e| !e.gid.is_zero() && !e.gid.is_link_local());
    // Soft-RoCE (the CI device) has both; a device without them cannot
    // exercise this check, which must not pass silently.
    let (Some(ll), true) = (link_local, routable) else {
        panic!("port 1 lacks a link-local and a routable GID: this check cannot run here");
    };
    let (_, out) = doctor(&ctx, &["--gid-index", &ll.index.to_string()]);
    let scope = line(&out, "GID scope");
    assert!(
        (scope.starts_with("[warn]") || scope.starts_with("[FAIL]"))
            && scope.contains("link-local"),
        "{scope}"
    );
}

#[test]
fn doctor_fails_gid_indexes_past_the_table_or_empty() {
    let ctx = support::test_context("doctor_fails_gid_indexes_past_the_table_or_empty");
    let len = ctx.query_port(1).unwrap().gid_tbl_len();
    let table = ctx.gid_table(1).expect("GID table");
    let empty = (0..len).find(|i| !table.iter().any(|e| e.index == *i && !e.gid.is_zero()));

    let (ok, out) = doctor(&ctx, &["--gid-index", &len.to_string()]);
    assert!(!ok, "doctor must exit non-zero");
    let gid = line(&out, "GID index");
    assert!(
        gid.starts_with("[FAIL]") && gid.contains("past the table"),
        "{gid}"
    );
    assert!(line(&out, "loopback self-test").starts_with("[FAIL]"));

    if let Some(i) = empty {
        let (ok, out) = doctor(&ctx, &["--gid-index", &i.to_string()]);
        assert!(!ok, "doctor must exit non-zero");
        let gid = line(&out, "GID index");
        assert!(gid.starts_with("[FAIL]") && gid.contains("empty"), "{gid}");
    }
}

/// True when the effective capabilities (`CapEff` in /proc/self/status) have CAP_IPC_LOCK.
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
