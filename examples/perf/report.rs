//! From timestamps to perftest's figures, printed as perftest prints them
//! (same column headers, same JSON keys).

use super::clock::Clock;

/// perftest's latency header.
pub const LAT_HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";

/// perftest's bandwidth header (its "MB" are 2^20 bytes, as here).
pub const BW_HEADER: &str =
    " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]";

/// Samples dropped from the top before the statistics (perftest's
/// `LAT_MEASURE_TAIL`): a preemption or a page fault, not the path.
const DROP_LARGEST: usize = 2;

/// One line of a latency report, in microseconds.
#[derive(Clone, Copy, Debug, Default)]
pub struct Latency {
    /// Message size.
    pub size: usize,
    /// Iterations run (timestamps taken).
    pub iters: u64,
    /// Smallest sample.
    pub t_min: f64,
    /// Largest sample kept.
    pub t_max: f64,
    /// Median ("typical").
    pub t_typical: f64,
    /// Mean.
    pub t_avg: f64,
    /// Standard deviation (population, in floating point).
    pub t_stdev: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
    /// 99.9th percentile (nearest rank).
    pub p999: f64,
}

/// Latency from the post timestamps: consecutive differences (one round
/// trip each), halved for ping-pong tests (one way), sorted, the largest
/// [`DROP_LARGEST`] dropped. Percentiles are nearest-rank over the kept
/// samples; perftest indexes one past that, which at 99.9 % of 1000
/// iterations lands on a dropped sample, so its 99.9 % column equals its
/// t_max there. Ours stays within the kept samples.
pub fn latency(size: usize, posted: &[u64], halve: bool, clock: &Clock) -> Latency {
    let scale = if halve { 2.0 } else { 1.0 };
    let mut d: Vec<f64> = posted
        .windows(2)
        .map(|w| clock.us(w[1].wrapping_sub(w[0])) / scale)
        .collect();
    d.sort_by(f64::total_cmp);
    let keep = d.len().saturating_sub(DROP_LARGEST).max(d.len().min(1));
    let d = &d[..keep];
    if d.is_empty() {
        return Latency {
            size,
            iters: posted.len() as u64,
            ..Latency::default()
        };
    }
    let n = d.len();
    let median = if n % 2 == 0 {
        (d[n / 2 - 1] + d[n / 2]) / 2.0
    } else {
        d[n / 2]
    };
    let avg = d.iter().sum::<f64>() / n as f64;
    let var = d.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / n as f64;
    let rank = |p: f64| d[((n as f64 * p).ceil() as usize).clamp(1, n) - 1];
    Latency {
        size,
        iters: posted.len() as u64,
        t_min: d[0],
        t_max: d[n - 1],
        t_typical: median,
        t_avg: avg,
        t_stdev: var.sqrt(),
        p99: rank(0.99),
        p999: rank(0.999),
    }
}

/// One line of a bandwidth report.
#[derive(Clone, Copy, Debug, Default)]
pub struct Bandwidth {
    /// Message size.
    pub size: usize,
    /// Messages (all QPs).
    pub iters: u64,
    /// Best rate over any stretch from a post to a later signaled completion, MiB/s.
    pub peak: f64,
    /// bytes x messages / (last completion - first post), MiB/s.
    pub average: f64,
    /// Messages per second over the same span, millions.
    pub msg_rate: f64,
}

/// Most (post, completion) pairs the peak search looks at: posts are
/// sampled at a stride above this (perftest looks at every pair).
const PEAK_PAIRS: usize = 20_000_000;

/// Bandwidth from the timestamps of a run of `posted.len()` messages.
pub fn bandwidth(
    size: usize,
    posted: &[u64],
    completed: &[(u64, u64)],
    clock: &Clock,
) -> Bandwidth {
    let n = posted.len();
    let (Some(&first), Some(&(_, last))) = (posted.first(), completed.last()) else {
        return Bandwidth::default();
    };
    let span_s = clock.us(last.wrapping_sub(first)) / 1e6;
    let mib = (1u64 << 20) as f64;
    let average = size as f64 * n as f64 / span_s / mib;
    // Peak: the least time per message over any window from the post of
    // request i to a signaled completion j >= i (j covers i..=j).
    let stride = (n * completed.len() / PEAK_PAIRS).max(1);
    let mut best = f64::INFINITY;
    for i in (0..n).step_by(stride) {
        let start = completed.partition_point(|&(j, _)| (j as usize) < i);
        for &(j, t) in &completed[start..] {
            let per = t.wrapping_sub(posted[i]) as f64 / (j as usize - i + 1) as f64;
            best = best.min(per);
        }
    }
    let peak = size as f64 / (clock.us(1) * best / 1e6) / mib;
    Bandwidth {
        size,
        iters: n as u64,
        peak: if best.is_finite() { peak } else { average },
        average,
        msg_rate: n as f64 / span_s / 1e6,
    }
}

/// A latency line under [`LAT_HEADER`].
pub fn latency_line(l: &Latency) -> String {
    format!(
        " {:<7} {:<13} {:<14.2} {:<12.2} {:<16.2} {:<14.2} {:<15.2} {:<22.2} {:.2}",
        l.size, l.iters, l.t_min, l.t_max, l.t_typical, l.t_avg, l.t_stdev, l.p99, l.p999
    )
}

/// A bandwidth line under [`BW_HEADER`].
pub fn bandwidth_line(b: &Bandwidth) -> String {
    format!(
        " {:<10} {:<10}       {:<18.2} {:<20.2} {:.6}",
        b.size, b.iters, b.peak, b.average, b.msg_rate
    )
}

/// A JSON value: perftest's `--out_json` keys, valid JSON (perftest's own
/// file leaves keys unquoted).
pub enum Json {
    /// A string.
    Str(String),
    /// A number, printed with `decimals` decimals.
    Num(f64, usize),
    /// An integer.
    Int(u64),
    /// An object, keys in order.
    Obj(Vec<(&'static str, Json)>),
    /// An array.
    Arr(Vec<Json>),
}

impl Json {
    /// The document as text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.write(&mut out, 0);
        out
    }

    fn write(&self, out: &mut String, indent: usize) {
        let pad = |n: usize| " ".repeat(n * 2);
        match self {
            Json::Str(s) => {
                out.push('"');
                for c in s.chars() {
                    match c {
                        '"' => out.push_str("\\\""),
                        '\\' => out.push_str("\\\\"),
                        c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                        c => out.push(c),
                    }
                }
                out.push('"');
            }
            Json::Num(x, d) if x.is_finite() => out.push_str(&format!("{x:.d$}")),
            Json::Num(..) => out.push_str("null"),
            Json::Int(i) => out.push_str(&i.to_string()),
            Json::Obj(fields) => {
                out.push_str("{\n");
                for (i, (k, v)) in fields.iter().enumerate() {
                    out.push_str(&format!("{}\"{k}\": ", pad(indent + 1)));
                    v.write(out, indent + 1);
                    out.push_str(if i + 1 < fields.len() { ",\n" } else { "\n" });
                }
                out.push_str(&pad(indent));
                out.push('}');
            }
            Json::Arr(items) => {
                out.push_str("[\n");
                for (i, v) in items.iter().enumerate() {
                    out.push_str(&pad(indent + 1));
                    v.write(out, indent + 1);
                    out.push_str(if i + 1 < items.len() { ",\n" } else { "\n" });
                }
                out.push_str(&pad(indent));
                out.push(']');
            }
        }
    }
}

/// perftest's `results` object of a latency test.
pub fn latency_json(l: &Latency) -> Json {
    Json::Obj(vec![
        ("MsgSize", Json::Int(l.size as u64)),
        ("n_iterations", Json::Int(l.iters)),
        ("t_min", Json::Num(l.t_min, 2)),
        ("t_max", Json::Num(l.t_max, 2)),
        ("t_typical", Json::Num(l.t_typical, 2)),
        ("t_avg", Json::Num(l.t_avg, 2)),
        ("t_stdev", Json::Num(l.t_stdev, 2)),
        ("percentile_99", Json::Num(l.p99, 2)),
        ("percentile_99.9", Json::Num(l.p999, 2)),
    ])
}

/// perftest's `results` object of a bandwidth test.
pub fn bandwidth_json(b: &Bandwidth) -> Json {
    Json::Obj(vec![
        ("MsgSize", Json::Int(b.size as u64)),
        ("n_iterations", Json::Int(b.iters)),
        ("BW_peak", Json::Num(b.peak, 2)),
        ("BW_average", Json::Num(b.average, 2)),
        ("MsgRate", Json::Num(b.msg_rate, 6)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-3 * b.abs().max(1.0)
    }

    #[test]
    fn latency_halves_sorts_and_drops_the_two_largest() {
        let clock = Clock::calibrate(Duration::from_millis(1));
        let us = |x: u64| clock.ticks_in(Duration::from_micros(x));
        // Round trips of 2, 4, 6, 8, 10 us, plus two outliers.
        let mut t = vec![0u64];
        for rtt in [2, 4, 6, 8, 10, 900, 800] {
            t.push(t.last().unwrap() + us(rtt));
        }
        let l = latency(2, &t, true, &clock);
        assert_eq!(l.iters, 8);
        assert!(close(l.t_min, 1.0) && close(l.t_max, 5.0), "{l:?}");
        assert!(close(l.t_typical, 3.0) && close(l.t_avg, 3.0), "{l:?}");
        assert!(close(l.t_stdev, 2f64.sqrt()), "{l:?}");
        assert!(close(l.p99, 5.0) && close(l.p999, 5.0), "{l:?}");
    }

    #[test]
    fn bandwidth_is_bytes_over_first_post_to_last_completion() {
        let clock = Clock::calibrate(Duration::from_millis(1));
        let us = |x: u64| clock.ticks_in(Duration::from_micros(x));
        // 4 messages of 1 MiB posted at once, completed by 4 us.
        let posted = [0, 0, 0, 0];
        let completed = [(1, us(2)), (3, us(4))];
        let b = bandwidth(1 << 20, &posted, &completed, &clock);
        assert!(close(b.average, 1e6), "{b:?}");
        assert!(close(b.msg_rate, 1.0), "{b:?}");
        assert!(b.peak >= b.average * 0.999, "{b:?}");
    }

    #[test]
    fn json_is_valid_and_keeps_perftest_keys() {
        let text = latency_json(&Latency::default()).render();
        assert!(text.contains("\"percentile_99.9\": 0.00"));
        assert!(text.starts_with('{') && text.ends_with('}'));
    }
}
