//! What the server counts, as Prometheus text (exposition format 0.0.4):
//! per engine (each `--threads` shard has one) its posts, completions,
//! completion errors by WC status name and bytes, the service's own
//! counts, and the device port's hardware counters as the driver exposes
//! them in sysfs (RNR and retry counts among them). Served by scrape.rs.

use std::fmt::Write;
use std::path::Path;

use verbs::{EngineCounters, WcStatus, STATUS_SLOTS};

/// One shard's counts: its engine's and its service's.
#[derive(Clone, Default)]
pub struct ShardCounts {
    /// The shard's engine's own counters (`Engine::counters`), read when
    /// the shard publishes.
    pub engine: EngineCounters,
    pub requests: u64,
    pub malformed: u64,
    pub too_large: u64,
    pub unknown_op: u64,
    pub dropped: u64,
    pub conns_gone: u64,
    pub silent_gone: u64,
    pub conns: u64,
}

/// How one family's value is read from a shard's counts.
type Field = fn(&ShardCounts) -> u64;

impl ShardCounts {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &ShardCounts) {
        self.engine.add(&other.engine);
        self.requests += other.requests;
        self.malformed += other.malformed;
        self.too_large += other.too_large;
        self.unknown_op += other.unknown_op;
        self.dropped += other.dropped;
        self.conns_gone += other.conns_gone;
        self.silent_gone += other.silent_gone;
        self.conns += other.conns;
    }
}

/// A counter's or gauge's family: its help, type and one sample per
/// label set.
fn family(out: &mut String, name: &str, kind: &str, help: &str, samples: &[(String, u64)]) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (labels, value) in samples {
        let _ = writeln!(out, "{name}{{{labels}}} {value}");
    }
}

/// The text a scrape gets: every shard's counts, then the device port's
/// hardware counters (`hw`: name and value, as read by `hw_counters`).
pub fn render(shards: &[ShardCounts], device: &str, port: u8, hw: &[(String, u64)]) -> String {
    let mut out = String::with_capacity(4096);
    let per = |f: Field| -> Vec<(String, u64)> {
        shards
            .iter()
            .enumerate()
            .map(|(i, s)| (format!("shard=\"{i}\""), f(s)))
            .collect()
    };
    let counters: [(&str, &str, Field); 14] = [
        (
            "verbs_sends_posted_total",
            "Send-queue requests posted (responses, keepalives).",
            |s| s.engine.qps.sends_posted,
        ),
        (
            "verbs_sends_completed_total",
            "Send-queue requests handed back.",
            |s| s.engine.qps.sends_completed,
        ),
        (
            "verbs_recvs_completed_total",
            "Receives handed back (own queues and the shared one).",
            |s| s.engine.qps.recvs_completed + s.engine.qps.srq_recvs,
        ),
        (
            "verbs_bytes_received_total",
            "Bytes of the receives handed back.",
            |s| s.engine.qps.bytes_received,
        ),
        (
            "verbs_srq_posted",
            "Receives waiting on the shared receive queue.",
            |s| s.engine.srq_posted,
        ),
        ("rpc_requests_total", "Requests received.", |s| s.requests),
        ("rpc_malformed_total", "Requests answered MALFORMED.", |s| {
            s.malformed
        }),
        ("rpc_too_large_total", "Requests answered TOO_LARGE.", |s| {
            s.too_large
        }),
        (
            "rpc_unknown_op_total",
            "Requests with an unknown op.",
            |s| s.unknown_op,
        ),
        ("rpc_dropped_total", "Responses not sent.", |s| s.dropped),
        ("rpc_conns_gone_total", "Connections dropped.", |s| {
            s.conns_gone
        }),
        (
            "rpc_silent_gone_total",
            "Connections found dead by a keepalive.",
            |s| s.silent_gone,
        ),
        ("rpc_connections", "Connections held.", |s| s.conns),
        ("verbs_queue_pairs", "Queue pairs the engine holds.", |s| {
            s.engine.live_qps
        }),
    ];
    for (name, help, f) in counters {
        let kind = if name.ends_with("_total") {
            "counter"
        } else {
            "gauge"
        };
        family(&mut out, name, kind, help, &per(f));
    }
    let mut errors = Vec::new();
    for (i, s) in shards.iter().enumerate() {
        for (value, &count) in s.engine.errors_by_status.iter().enumerate() {
            let status = WcStatus(value as u32);
            if count > 0 && status != WcStatus::SUCCESS {
                let name = match (value < STATUS_SLOTS - 1, status.name()) {
                    (true, Some(name)) => name.to_string(),
                    _ => format!("OTHER_{}", value),
                };
                errors.push((format!("shard=\"{i}\",status=\"{name}\""), count));
            }
        }
    }
    family(
        &mut out,
        "verbs_completion_errors_total",
        "counter",
        "Failed completions by WC status.",
        &errors,
    );
    let hw: Vec<(String, u64)> = hw
        .iter()
        .map(|(name, v)| {
            let labels = format!("device=\"{device}\",port=\"{port}\",counter=\"{name}\"");
            (labels, *v)
        })
        .collect();
    family(
        &mut out,
        "verbs_port_hw_counter",
        "untyped",
        "The device port's hardware counters (sysfs hw_counters: RNR, retries, sequence errors, ...).",
        &hw,
    );
    out
}

/// The port's hardware counters from `dir`
/// (`/sys/class/infiniband/DEV/ports/PORT/hw_counters`): each file's name
/// and number, sorted; files that are not a plain number, or names that
/// are not plain identifiers, are left out. Empty if there is none.
pub fn hw_counters(dir: &Path) -> Vec<(String, u64)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<(String, u64)> = entries
        .flatten()
        .take(256)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let plain = !name.is_empty()
                && name.len() <= 64
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !plain || name == "lifespan" {
                return None;
            }
            let text = std::fs::read_to_string(e.path()).ok()?;
            Some((name, text.trim().parse().ok()?))
        })
        .collect();
    out.sort();
    out
}

/// The sysfs directory of `device`'s `port` hardware counters.
pub fn hw_dir(device: &str, port: u8) -> std::path::PathBuf {
    Path::new("/sys/class/infiniband")
        .join(device)
        .join("ports")
        .join(port.to_string())
        .join("hw_counters")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_family_with_its_type_and_labels() {
        let mut a = ShardCounts {
            requests: 5,
            conns: 2,
            ..ShardCounts::default()
        };
        a.engine.qps.sends_posted = 10;
        a.engine.errors_by_status[WcStatus::RETRY_EXC_ERR.0 as usize] = 2;
        a.engine.errors_by_status[STATUS_SLOTS - 1] = 1;
        let b = ShardCounts::default();
        let hw = vec![("rcvd_rnr_err".to_string(), 3)];
        let text = render(&[a, b], "rxe0", 1, &hw);
        for line in [
            "# TYPE verbs_sends_posted_total counter",
            "verbs_sends_posted_total{shard=\"0\"} 10",
            "verbs_sends_posted_total{shard=\"1\"} 0",
            "rpc_requests_total{shard=\"0\"} 5",
            "# TYPE rpc_connections gauge",
            "rpc_connections{shard=\"0\"} 2",
            "verbs_completion_errors_total{shard=\"0\",status=\"RETRY_EXC_ERR\"} 2",
            "verbs_completion_errors_total{shard=\"0\",status=\"OTHER_24\"} 1",
            "verbs_port_hw_counter{device=\"rxe0\",port=\"1\",counter=\"rcvd_rnr_err\"} 3",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line:?} missing in\n{text}"
            );
        }
        // Every sample line is NAME{LABELS} VALUE.
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            let (series, value) = l.rsplit_once(' ').unwrap();
            assert!(series.ends_with('}') && value.parse::<u64>().is_ok(), "{l}");
        }
    }

    #[test]
    fn reads_plain_numeric_counters_and_skips_the_rest() {
        let dir = std::env::temp_dir().join(format!("rpc_hw_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("retry_exceeded_err"), "7\n").unwrap();
        std::fs::write(dir.join("seq_naks"), "0\n").unwrap();
        std::fs::write(dir.join("lifespan"), "10\n").unwrap();
        std::fs::write(dir.join("not_a_number"), "x\n").unwrap();
        std::fs::write(dir.join("bad-name"), "1\n").unwrap();
        let got = hw_counters(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            got,
            [
                ("retry_exceeded_err".to_string(), 7),
                ("seq_naks".to_string(), 0)
            ]
        );
        assert!(hw_counters(Path::new("/nonexistent/hw")).is_empty());
    }
}
