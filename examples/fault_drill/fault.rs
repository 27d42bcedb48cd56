//! Faults the client injects on its own guest's link (it runs as root in
//! the Soft-RoCE bed), and the detection bound the transport implies.

use std::process::Command;

use crate::BoxError;

/// Runs an iproute2 tool. The guest's PATH is the host user's, which may
/// lack the sbin directories, so those are tried as well.
fn run(tool: &str, args: &[&str]) -> Result<String, BoxError> {
    let mut last = None;
    for dir in ["", "/usr/sbin/", "/sbin/", "/usr/bin/", "/bin/"] {
        match Command::new(format!("{dir}{tool}")).args(args).output() {
            Ok(out) if out.status.success() => {
                return Ok(String::from_utf8_lossy(&out.stdout).into_owned())
            }
            Ok(out) => {
                return Err(format!(
                    "`{tool} {}` failed ({}): {}",
                    args.join(" "),
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                )
                .into())
            }
            Err(e) => last = Some(e),
        }
    }
    Err(format!(
        "cannot run {tool}: {}",
        last.map(|e| e.to_string()).unwrap_or_default()
    )
    .into())
}

/// Every packet leaving `iface` is dropped; the link and its routes stay
/// up, so the sender sees silence, the pure retry-exhaustion case.
pub fn blackhole(iface: &str) -> Result<(), BoxError> {
    run(
        "tc",
        &[
            "qdisc", "replace", "dev", iface, "root", "netem", "loss", "100%",
        ],
    )
    .map(drop)
}

/// Removes the root qdisc `blackhole` installed.
pub fn unblackhole(iface: &str) -> Result<(), BoxError> {
    run("tc", &["qdisc", "del", "dev", iface, "root"]).map(drop)
}

/// A pulled cable: the netdev goes down, so does the rxe port (PORT_ERR).
pub fn link(iface: &str, up: bool) -> Result<(), BoxError> {
    let state = if up { "up" } else { "down" };
    run("ip", &["link", "set", "dev", iface, state]).map(drop)
}

/// The qdisc on `iface`, one line: shows what `pair` injected (netem loss/delay).
pub fn qdisc(iface: &str) -> String {
    match run("tc", &["qdisc", "show", "dev", iface]) {
        Ok(s) => s
            .lines()
            .find(|l| l.contains("root"))
            .unwrap_or("")
            .trim()
            .to_string(),
        Err(e) => format!("unknown ({e})"),
    }
}

/// How long an RC requester may take to report `RETRY_EXC_ERR` once the
/// peer goes silent: the IB formula, 4.096 us x 2^timeout per attempt,
/// for the first try and `retry_cnt` retries, times `slack`.
///
/// rxe (drivers/infiniband/sw/rxe, Linux 6.1) arms one retransmit timer of
/// `max(1, nsecs_to_jiffies(4096 << timeout))` jiffies, i.e. the period
/// rounded DOWN to jiffies (4 ms at HZ=250), so it never exceeds the
/// nominal period; on expiry it retries from the oldest unacknowledged
/// PSN while its counter lasts (reset on every ACK that makes progress)
/// and completes the oldest request with `RETRY_EXC_ERR` on the expiry
/// after the last retry. Beware: rxe treats retry_cnt 7 as "retry
/// forever" (`if (qp->comp.retry_cnt != 7) qp->comp.retry_cnt--`), so a
/// bound exists only for 0..=6. The slack covers what a TCG guest adds:
/// softirq and timer latency on oversubscribed virtual CPUs, the ACK of
/// a request sent just before the cut restarting the count, and the
/// completion event waking this thread.
#[derive(Clone, Copy, Debug)]
pub struct Bound {
    pub nominal_ms: f64,
    pub bound_ms: f64,
}

impl Bound {
    pub fn retry_exceeded(timeout: u8, retry_cnt: u8, slack: f64) -> Option<Bound> {
        if retry_cnt >= 7 {
            return None; // infinite on rxe: no bound to assert
        }
        let per_try_ms = 4.096e-3 * f64::from(1u32 << timeout.min(31));
        let nominal_ms = per_try_ms * f64::from(retry_cnt + 1);
        Some(Bound {
            nominal_ms,
            bound_ms: nominal_ms * slack,
        })
    }
}
