//! The diagnostic examples on a real device (rxe in a Soft-RoCE guest in
//! CI): `devinfo` shows the GID table, `doctor` passes on a healthy device
//! and fails, naming the cause, where the primer's pitfalls are staged.
//!
//! The examples must be built: a plain `cargo test` builds them (see
//! `support::example`).

mod support;

// The doctor's own checks, run in-process on GID tables no CI device has.
#[allow(dead_code)]
#[path = "../examples/doctor/main.rs"]
mod doctor;

use std::process::Command;
use std::sync::{RwLock, RwLockReadGuard};

use verbs::device::{choose_gid, GidType, LinkLayer, PortState};
use verbs::sys::ibv_atomic_cap;
use verbs::{Context, GidEntry, Mtu};

/// Linux's capability number of CAP_IPC_LOCK.
const CAP_IPC_LOCK: u32 = 14;

/// Held to change the port's netdev (write) or to run the doctor on it as
/// it is (read): the tests of one file share a guest.
static NETDEV: RwLock<()> = RwLock::new(());

fn netdev_as_is() -> RwLockReadGuard<'static, ()> {
    NETDEV.read().unwrap_or_else(|e| e.into_inner())
}

fn doctor(ctx: &Context, extra: &[&str]) -> (bool, String) {
    let (code, out) = doctor_exit(ctx, extra);
    (code == Some(0), out)
}

/// The doctor's exit code and output.
fn doctor_exit(ctx: &Context, extra: &[&str]) -> (Option<i32>, String) {
    support::run_with_code(
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
    let _netdev = netdev_as_is();
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
        "addressing",
    ]
    .into_iter()
    .chain(self_tests)
    {
        assert!(line(&out, check).starts_with("[ok]"), "{check} passes");
    }
    let rnr = line(&out, "RNR");
    assert!(
        rnr.starts_with("[ok]   RNR: a Send the peer has no receive for waits for one")
            && rnr.contains(&format!("`rdma statistic show link {}/1`", ctx.name())),
        "{rnr}"
    );
    if support::is_soft_roce(&ctx) {
        assert!(
            rnr.contains("rcvd_rnr_err") && rnr.contains("send_rnr_err"),
            "{rnr}"
        );
    }
    if ctx.query_port(1).unwrap().link_layer() == LinkLayer::ETHERNET {
        assert!(line(&out, "GID scope").starts_with("[ok]"));
        let gid_type = line(&out, "GID type");
        assert!(
            gid_type.starts_with("[ok]") && gid_type.contains("RoCE v2"),
            "{gid_type}"
        );
    }
}

#[test]
fn doctor_says_which_hop_limit_and_traffic_class_the_connection_carries() {
    let _netdev = netdev_as_is();
    let ctx = support::test_context("doctor_says_which_hop_limit_and_traffic_class");
    let (code, out) = doctor_exit(&ctx, &[]);
    assert_eq!(code, Some(0));
    let grh = line(&out, "GRH");
    let (code, asked_1) = doctor_exit(&ctx, &["--hop-limit", "1", "--traffic-class", "104"]);
    assert_eq!(code, Some(0));
    let grh_asked_1 = line(&asked_1, "GRH");
    if ctx.query_port(1).unwrap().link_layer() != LinkLayer::ETHERNET {
        assert!(grh.contains("not used (is_global=0)"), "{grh}");
        return;
    }
    // RoCE: the kernel puts the IP route's hop limit in the GRH.
    let table = ctx.gid_table(1).unwrap();
    let hop = support::route_hop_limit(choose_gid(&table).expect("a usable GID"));
    let default = verbs::ConnectOptions::default();
    let expected = if hop == default.hop_limit {
        format!("[ok]   GRH: hop limit {hop}, traffic class 0 (asked 0)")
    } else {
        format!(
            "[ok]   GRH: hop limit {hop} (asked {}: the kernel took",
            default.hop_limit
        )
    };
    assert!(grh.starts_with(&expected), "{grh}");
    assert!(
        grh_asked_1.starts_with(&format!(
            "[ok]   GRH: hop limit {hop} (asked 1: the kernel took the IP route's"
        )) && grh_asked_1.ends_with("traffic class 104 (asked 104)"),
        "{grh_asked_1}"
    );
}

#[test]
fn doctor_mtu_line_names_what_caps_the_path_mtu() {
    let _netdev = NETDEV.write().unwrap_or_else(|e| e.into_inner());
    let ctx = support::test_context("doctor_mtu_line_names_what_caps_the_path_mtu");
    let port = ctx.query_port(1).unwrap();
    let (active, max) = (Mtu(port.active_mtu().0), Mtu(port.max_mtu().0));
    let roce = port.link_layer() == LinkLayer::ETHERNET;
    let dev = roce.then(|| support::netdev_of(&ctx.gid_table(1).unwrap()));

    // As the port is: Soft-RoCE on a 1500-byte netdev runs 1024 of 4096.
    let (code, out) = doctor_exit(&ctx, &[]);
    assert_eq!(code, Some(0), "an MTU below the port's maximum only warns");
    let mtu = line(&out, "MTU");
    if active.0 < max.0 {
        assert!(
            mtu.starts_with(&format!("[warn] MTU: active {active} < max {max}")),
            "{mtu}"
        );
        if let Some(dev) = &dev {
            assert!(
                mtu.contains(&format!("`ip link set {dev} mtu 9000`")),
                "{mtu}"
            );
        }
    } else {
        assert_eq!(mtu, format!("[ok]   MTU: active {active} = max {max}"));
    }

    // Capped below the port's active MTU: the connection follows the cap.
    let (code, out) = doctor_exit(&ctx, &["--max-mtu", "512"]);
    assert_eq!(code, Some(0));
    let mtu = line(&out, "MTU");
    assert!(
        mtu.starts_with(&format!(
            "[ok]   MTU: path capped at 512 by --max-mtu (QpConfig::max_mtu), below the port's active {active}"
        )),
        "{mtu}"
    );
    assert!(line(&out, "loopback connect").ends_with("path MTU 512"));

    // Jumbo frames lift the active MTU to the maximum: in the guest only,
    // whose netdev is the test's to change.
    if support::in_guest() {
        let dev = dev.expect("Soft-RoCE in the guest is RoCE");
        assert!(active.0 < max.0, "the guest's netdev starts at 1500 bytes");
        let mtu_now = |ctx: &Context| Mtu(ctx.query_port(1).unwrap().active_mtu().0);
        let old = std::fs::read_to_string(format!("/sys/class/net/{dev}/mtu")).unwrap();
        support::ip(&["link", "set", &dev, "mtu", "9000"]);
        let _back = support::IpOnDrop {
            args: ["link", "set", &dev, "mtu", old.trim()]
                .map(String::from)
                .to_vec(),
            settled: || mtu_now(&ctx) == active,
        };
        support::wait_for("the active MTU at the maximum", || mtu_now(&ctx) == max);
        let (code, out) = doctor_exit(&ctx, &[]);
        assert_eq!(code, Some(0));
        assert_eq!(
            line(&out, "MTU"),
            format!("[ok]   MTU: active {max} = max {max}")
        );
        assert!(line(&out, "loopback connect").ends_with(&format!("path MTU {max}")));
    }
}

#[test]
fn doctor_warns_on_a_forced_roce_v1_gid() {
    let ctx = support::test_context("doctor_warns_on_a_forced_roce_v1_gid");
    let port = ctx.query_port(1).unwrap();
    assert_eq!(
        port.link_layer(),
        LinkLayer::ETHERNET,
        "GID types are RoCE's"
    );
    // Soft-RoCE lists RoCE v2 entries only; a ConnectX lists each address
    // twice, v1 and v2. Add the v1 twin of the entry verbs picks.
    let mut table = ctx.gid_table(1).unwrap();
    let v2 = *choose_gid(&table).expect("a usable GID");
    let free = (0..port.gid_tbl_len())
        .find(|i| table.iter().all(|e| e.index != *i))
        .expect("a free index");
    table.push(GidEntry {
        index: free,
        gid_type: GidType::ROCE_V1,
        ..v2
    });
    let mut report = doctor::Report::default();
    let chosen = doctor::check_gids(Some(free), &port, &table, &mut report);
    assert_eq!(chosen.map(|e| e.gid_type), Some(GidType::ROCE_V1));
    let out = report.lines.join("\n");
    let index = line(&out, "GID index");
    assert!(
        index.starts_with(&format!("[ok]   GID index: {free} (forced)"))
            && index.contains("RoCE v1"),
        "{index}"
    );
    let gid_type = line(&out, "GID type");
    assert_eq!(
        gid_type,
        format!(
            "[warn] GID type: index {free} is RoCE v1: not routable, and a v2 peer will not \
             answer; fix: use the RoCE v2 entry (index {} is the v2 entry)",
            v2.index
        )
    );
    assert_eq!(
        report.exit_status(),
        0,
        "v1 works between v1 peers: a warning"
    );
}

#[test]
fn doctor_names_the_devices_present_when_the_one_asked_for_is_missing() {
    let ctx = support::test_context("doctor_names_the_devices_present");
    let (code, out) = support::run_with_code(
        Command::new(support::example("doctor")).args(["--dev", "no_such_device0"]),
    );
    assert_eq!(code, Some(1));
    let device = line(&out, "device");
    assert!(
        device.starts_with("[FAIL] device:")
            && device.contains("present: ")
            && device.contains(ctx.name()),
        "{device}"
    );
}

#[test]
fn doctor_fails_the_memlock_check_under_a_low_limit() {
    let _netdev = netdev_as_is();
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
    let (code, out) = support::run_with_code(&mut cmd);
    assert_eq!(code, Some(1));
    let memlock = line(&out, "memlock");
    assert!(memlock.starts_with("[FAIL]"), "{memlock}");
    assert!(
        memlock.contains("64 KiB") && memlock.contains("ulimit -l unlimited"),
        "{memlock}"
    );
}

#[test]
fn doctor_warns_when_only_cap_ipc_lock_lifts_a_low_memlock_limit() {
    let _netdev = netdev_as_is();
    let ctx = support::test_context("doctor_warns_when_only_cap_ipc_lock_lifts");
    let (code, out) = support::run_with_code(
        Command::new("prlimit")
            .arg("--memlock=65536:65536")
            .arg(support::example("doctor"))
            .args(["--dev", ctx.name()]),
    );
    let memlock = line(&out, "memlock");
    if has_cap_ipc_lock() {
        assert_eq!(code, Some(0), "a warning does not fail");
        assert!(
            memlock.starts_with(
                "[warn] memlock: limit 64 KiB < 64 MiB, works only through CAP_IPC_LOCK"
            ),
            "{memlock}"
        );
    } else {
        assert_eq!(code, Some(1));
        assert!(memlock.starts_with("[FAIL]"), "{memlock}");
    }
}

#[test]
fn doctor_flags_a_forced_link_local_gid() {
    let _netdev = netdev_as_is();
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
    let (code, out) = doctor_exit(&ctx, &["--gid-index", &ll.index.to_string()]);
    assert_eq!(
        code,
        Some(0),
        "one L2 link is enough for loopback: a warning"
    );
    let scope = line(&out, "GID scope");
    let expected = format!("[warn] GID scope: index {} is link-local ({}): reaches only the same L2 link; fix: use routable index", ll.index, ll.gid);
    assert!(scope.starts_with(&expected), "{scope}");
}

#[test]
fn doctor_fails_gid_indexes_past_the_table_or_empty() {
    let _netdev = netdev_as_is();
    let ctx = support::test_context("doctor_fails_gid_indexes_past_the_table_or_empty");
    let len = ctx.query_port(1).unwrap().gid_tbl_len();
    let table = ctx.gid_table(1).expect("GID table");
    let empty = (0..len).find(|i| !table.iter().any(|e| e.index == *i && !e.gid.is_zero()));

    let (code, out) = doctor_exit(&ctx, &["--gid-index", &len.to_string()]);
    assert_eq!(code, Some(1));
    let gid = line(&out, "GID index");
    assert!(
        gid.starts_with("[FAIL]") && gid.contains("past the table"),
        "{gid}"
    );
    assert!(line(&out, "loopback self-test").starts_with("[FAIL]"));

    if let Some(i) = empty {
        let (code, out) = doctor_exit(&ctx, &["--gid-index", &i.to_string()]);
        assert_eq!(code, Some(1));
        let gid = line(&out, "GID index");
        assert!(gid.starts_with("[FAIL]") && gid.contains("empty"), "{gid}");
    }
}

#[test]
fn doctor_fails_a_port_that_is_down_and_warns_on_link_local_gids_only() {
    let _netdev = NETDEV.write().unwrap_or_else(|e| e.into_inner());
    let ctx = support::test_context("doctor_fails_a_port_that_is_down");
    let active = |ctx: &Context| ctx.query_port(1).unwrap().state() == PortState::ACTIVE;
    if !support::in_guest() {
        // A host's netdev is not the test's to take down: the port as it is.
        let (_, out) = doctor_exit(&ctx, &[]);
        assert!(line(&out, "port 1 state").starts_with("[ok]   port 1 state: ACTIVE"));
        return;
    }
    let table = ctx.gid_table(1).unwrap();
    let dev = support::netdev_of(&table);
    let as_it_was = |ctx: &Context| ctx.gid_table(1).is_ok_and(|t| t == table) && active(ctx);

    {
        support::ip(&["link", "set", &dev, "down"]);
        let _up = support::IpOnDrop {
            args: ["link", "set", &dev, "up"].map(String::from).to_vec(),
            settled: || as_it_was(&ctx),
        };
        support::wait_for("the port down", || !active(&ctx));
        let (code, out) = doctor_exit(&ctx, &[]);
        assert_eq!(code, Some(1));
        let state = line(&out, "port 1 state");
        assert!(
            state.starts_with("[FAIL] port 1 state:")
                && state.ends_with(&format!(
                    "(needs ACTIVE); fix: `ip link set {dev} up`, check the cable/link (`rdma link`)"
                )),
            "{state}"
        );
        assert!(line(&out, "loopback self-test").starts_with("[FAIL]"));
    }

    // Without its IPv4 address the netdev keeps only its IPv6 link-local GID.
    let routable = table
        .iter()
        .find(|e| e.gid.ipv4().is_some())
        .expect("an IPv4-mapped GID");
    let addr = support::ipv4_with_prefix(&dev, &routable.gid.ipv4().unwrap().into());
    support::ip(&["addr", "del", &addr, "dev", &dev]);
    let _address_back = support::IpOnDrop {
        args: ["addr", "add", &addr, "dev", &dev]
            .map(String::from)
            .to_vec(),
        settled: || as_it_was(&ctx),
    };
    let link_local_only = |ctx: &Context| {
        ctx.gid_table(1)
            .is_ok_and(|t| !t.is_empty() && t.iter().all(|e| e.gid.is_link_local()))
    };
    support::wait_for("only link-local GIDs", || link_local_only(&ctx));
    let (code, out) = doctor_exit(&ctx, &[]);
    assert_eq!(
        code,
        Some(0),
        "one L2 link is enough for loopback: a warning"
    );
    assert_eq!(
        line(&out, "GID scope"),
        "[warn] GID scope: only link-local GIDs: works on one L2 link only; fix: give the netdev \
         an IP address"
    );
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
