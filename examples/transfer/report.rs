//! What the client prints: the live progress line, and the machine-read
//! `RESULT` line with the figures around a cut.

use std::io::Write;
use std::time::{Duration, Instant};

use verbs::transfer::{PathStats, Transfer};
use verbs::ArenaBuf;

use crate::Opts;

/// Planes a sample keeps bytes for (the client takes at most 8).
pub const MAX_PLANES: usize = 8;

/// The transfer's bytes at one moment, in all and per plane.
#[derive(Clone, Copy)]
pub struct Sample {
    pub at: Instant,
    pub bytes: u64,
    pub resent: u64,
    pub per_plane: [u64; MAX_PLANES],
}

impl Sample {
    pub fn of(t: &Transfer<ArenaBuf>) -> Sample {
        let mut per_plane = [0; MAX_PLANES];
        for s in t.paths() {
            per_plane[usize::from(s.plane) % MAX_PLANES] += s.bytes;
        }
        Sample {
            at: Instant::now(),
            bytes: per_plane.iter().sum(),
            resent: t.progress().resent_bytes,
            per_plane,
        }
    }
}

/// When `--at-half`'s line was written, and the bytes done then.
pub type Trigger = Option<(Instant, u64)>;

/// Every path's first failure after the `--at-half` line.
pub type Failed = Vec<Option<Instant>>;

/// One line for a person: the whole, then every path.
pub fn progress_line(t: &Transfer<ArenaBuf>, devs: &[String], qps: usize, tty: bool) {
    let p = t.progress();
    let mut line = format!(
        "[{:5.1}s] {:6.1}/{:.1} MiB {:3}% {:6.1} MB/s resent {:.1} MiB |",
        p.elapsed.as_secs_f64(),
        p.bytes as f64 / 1048576.0,
        p.total as f64 / 1048576.0,
        (p.bytes * 100).checked_div(p.total).unwrap_or(100),
        p.rate / 1e6,
        p.resent_bytes as f64 / 1048576.0
    );
    for (i, s) in t.paths().enumerate() {
        line.push_str(&format!(
            " {}/{} {} {:.1}",
            devs[usize::from(s.plane)],
            i % qps,
            s.state.name(),
            s.rate / 1e6
        ));
    }
    if tty {
        print!("\r\x1b[K{line}");
        let _ = std::io::stdout().flush();
    } else {
        println!("{line}");
    }
}

/// The machine-readable summary; with a cut (a `PORT_ERR` seen, or
/// `--cut-at`), the times from it and the rate of the planes that
/// survived it, by which the rest and the re-sent bytes are timed.
pub fn result_line(
    t: &Transfer<ArenaBuf>,
    opts: &Opts,
    samples: &[Sample],
    trigger: Trigger,
    failed: &Failed,
    (bad_chunks, repaired): (u64, u64),
    ok: bool,
) -> String {
    let p = t.progress();
    let (started, finished, first_failure) = t.times();
    let finished = finished.unwrap_or_else(Instant::now);
    let secs = (finished - started).as_secs_f64();
    let sum = |f: fn(&PathStats) -> u64| t.paths().map(f).sum::<u64>();
    let mut line = format!(
        "RESULT op={} bytes={} planes={} qps={} chunk_kib={} secs={:.3} mbs={:.2} resent_bytes={} failures={} readmissions={} failed_probes={} nominal_ms={} bound_ms={} bad_chunks={bad_chunks} repaired={repaired}",
        if opts.read { "read" } else { "write" },
        p.total,
        t.planes().len(),
        opts.qps,
        opts.chunk_kib,
        secs,
        p.total as f64 / secs / 1e6,
        p.resent_bytes,
        sum(|s| u64::from(s.failures)),
        sum(|s| u64::from(s.readmissions)),
        sum(|s| u64::from(s.failed_probes)),
        t.bound().nominal.as_millis(),
        t.bound().watchdog.as_millis(),
    );
    let ms = |d: Option<Duration>| d.map_or(-1, |d| d.as_millis() as i64);
    let frac = |bytes: u64| bytes as f64 / p.total.max(1) as f64;
    if let Some((at, bytes)) = trigger {
        line.push_str(&format!(
            " half_ms={} half_frac={:.3}",
            ms(at.checked_duration_since(started)),
            frac(bytes)
        ));
    }
    let cut_planes: Vec<usize> = (0..t.planes().len())
        .filter(|&i| t.port_events(i).0.is_some())
        .collect();
    let port_err = cut_planes.iter().filter_map(|&i| t.port_events(i).0).min();
    let timer = opts.cut_at.map(|s| opts.t0 + Duration::from_secs_f64(s));
    let cut = match (port_err, timer) {
        (Some(at), _) => Some((at, "port_err")),
        (None, Some(at)) if at < finished => Some((at, "timer")),
        _ => None,
    };
    if let Some((cut, how)) = cut {
        let zero = Sample {
            at: started,
            bytes: 0,
            resent: 0,
            per_plane: [0; MAX_PLANES],
        };
        let at_cut = samples
            .iter()
            .take_while(|s| s.at <= cut)
            .last()
            .copied()
            .unwrap_or(zero);
        let end = samples.last().copied().unwrap_or(zero);
        // The planes that kept running: every plane without PORT_ERR.
        let survivors = |s: &Sample| -> u64 {
            (0..t.planes().len().min(MAX_PLANES))
                .filter(|i| !cut_planes.contains(i))
                .map(|i| s.per_plane[i])
                .sum()
        };
        let span = finished.saturating_duration_since(cut).as_secs_f64();
        let surv = survivors(&end).saturating_sub(survivors(&at_cut)) as f64 / span.max(1e-9);
        let at_rate = |bytes: u64| {
            if surv > 0.0 {
                (bytes as f64 / surv * 1000.0) as i64
            } else {
                -1
            }
        };
        // Detection: from the `--at-half` line (the link going down takes
        // `ip` a moment, and the device another) to the first failure of a
        // cut plane's path; without it, from the cut to the first failure.
        let paths: Vec<&PathStats> = t.paths().collect();
        let cut_plane_failed = failed
            .iter()
            .zip(&paths)
            .filter(|(_, s)| cut_planes.contains(&usize::from(s.plane)))
            .filter_map(|(f, _)| *f)
            .min();
        let detect = match trigger {
            Some((from, _)) => cut_plane_failed.and_then(|f| f.checked_duration_since(from)),
            None => first_failure.and_then(|f| f.checked_duration_since(cut)),
        };
        let resent = end.resent.saturating_sub(at_cut.resent);
        line.push_str(&format!(
            " cut_from={how} cut_ms={} cut_frac={:.3} detect_ms={} cut_to_done_ms={} done_at_cut={} surv_mbs={:.2} rest_ms={} resent_after_cut={resent} resent_ms={}",
            ms(cut.checked_duration_since(started)),
            frac(at_cut.bytes),
            ms(detect),
            ms(finished.checked_duration_since(cut)),
            at_cut.bytes,
            surv / 1e6,
            at_rate(p.total - at_cut.bytes),
            at_rate(resent),
        ));
    }
    line.push_str(if ok {
        " checksum=match"
    } else {
        " checksum=MISMATCH"
    });
    line
}
