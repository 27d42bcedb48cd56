//! The doctor's checks of the device, port and host, one [`Report`] line
//! (or a few) each: port state, the GID table and index, addressing, MTU,
//! the memlock limit, region access and what RNR does.

use verbs::device::{
    choose_gid_index, validate_gid_index, GidType, LinkLayer, PortAttr, PortState,
};
use verbs::error::errno_name;
use verbs::{
    ConnectOptions, Endpoint, GidEntry, HostBuf, MemoryRegion, Mtu, NicBuf, PathInfo,
    ProtectionDomain,
};

use super::{Report, REMOTE};

/// The memlock check registers this much: a typical application buffer pool.
const MEMLOCK_PROBE: usize = 64 << 20;
/// Linux's capability number of CAP_IPC_LOCK, which lifts the memlock limit.
const CAP_IPC_LOCK: u32 = 14;

pub(super) fn check_port_state(
    num: u8,
    port: &PortAttr,
    netdev: Option<&str>,
    r: &mut Report,
) -> bool {
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
pub(super) fn check_addressing(port: &PortAttr, gid: Option<GidEntry>, r: &mut Report) -> bool {
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
pub(super) fn check_mtu(port: &PortAttr, netdev: Option<&str>, cap: Mtu, r: &mut Report) {
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
pub(super) fn check_memlock(pd: &ProtectionDomain, r: &mut Report) {
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
pub(super) fn check_access(pd: &ProtectionDomain, r: &mut Report) {
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
pub(super) fn report_rnr(dev: &str, port: u8, r: &mut Report) {
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
fn version(t: GidType) -> String {
    match t {
        GidType::ROCE_V1 => "RoCE v1".into(),
        GidType::ROCE_V2 => "RoCE v2".into(),
        GidType::IB => "IB".into(),
        other => other.to_string(),
    }
}
