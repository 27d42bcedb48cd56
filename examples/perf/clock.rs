//! Timestamps for the measured loops.
//!
//! On x86-64 a timestamp is the time-stamp counter (`rdtsc`): one
//! unprivileged instruction, no system call, no vDSO page, so taking one
//! per post costs nanoseconds and never perturbs the loop. It is turned
//! into microseconds with a rate measured once at start-up against
//! `CLOCK_MONOTONIC` ([`Clock::calibrate`]), not read from `/proc/cpuinfo`
//! (a guest's or a throttled CPU's "cpu MHz" may be stale). That needs an
//! invariant TSC (constant rate in every P/C-state), which every x86-64 CPU
//! of the last decade and QEMU's guests have; [`Clock::source`] says when
//! the flag is missing. Elsewhere a timestamp is `CLOCK_MONOTONIC` itself
//! in nanoseconds.
//!
//! Included by `tests/rdma_zero_alloc.rs` too: nothing here allocates after
//! start-up.

use std::time::{Duration, Instant};

/// A timestamp in ticks of [`Clock`]: the TSC on x86-64, else nanoseconds.
#[inline(always)]
pub fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `rdtsc` has no preconditions; it reads a counter every
        // x86-64 CPU has and user mode may read (CR4.TSD is clear on Linux).
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        verbs::time::now_ns()
    }
}

/// The rate of [`ticks`], to turn tick differences into microseconds.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    ticks_per_us: f64,
    invariant: bool,
}

impl Clock {
    /// Measures the tick rate against the monotonic clock over `window`
    /// (100 ms gives about 1e-5 relative error; the loops never run during it).
    pub fn calibrate(window: Duration) -> Clock {
        if !cfg!(target_arch = "x86_64") {
            return Clock {
                ticks_per_us: 1000.0,
                invariant: true,
            };
        }
        // Bracket each reading of Instant by two TSC reads and keep the
        // midpoint, so a preemption between the two clocks shows as a wide
        // bracket; take the narrower of a few tries.
        let sample = || {
            (0..5)
                .map(|_| {
                    let a = ticks();
                    let t = Instant::now();
                    let b = ticks();
                    (b - a, a + (b - a) / 2, t)
                })
                .min_by_key(|s| s.0)
                .map(|(_, tsc, t)| (tsc, t))
                .expect("five samples")
        };
        let (tsc0, t0) = sample();
        std::thread::sleep(window);
        let (tsc1, t1) = sample();
        let us = (t1 - t0).as_secs_f64() * 1e6;
        Clock {
            ticks_per_us: (tsc1 - tsc0) as f64 / us,
            invariant: tsc_is_invariant(),
        }
    }

    /// `ticks` as microseconds.
    pub fn us(&self, ticks: u64) -> f64 {
        ticks as f64 / self.ticks_per_us
    }

    /// `us` microseconds as ticks (for stall limits).
    pub fn ticks_in(&self, d: Duration) -> u64 {
        (d.as_secs_f64() * 1e6 * self.ticks_per_us) as u64
    }

    /// A line for the report header: what the timestamps are.
    pub fn source(&self) -> String {
        if cfg!(target_arch = "x86_64") {
            let warn = if self.invariant {
                ""
            } else {
                " (WARNING: no constant_tsc flag: figures may be off)"
            };
            format!(
                "TSC at {:.1} MHz, calibrated against CLOCK_MONOTONIC{warn}",
                self.ticks_per_us
            )
        } else {
            "CLOCK_MONOTONIC".to_string()
        }
    }
}

/// True when the TSC runs at a constant rate: the CPU says so
/// (`constant_tsc`), or the kernel itself keeps time with it (its
/// clocksource is `tsc`, as in QEMU guests, which do not pass the flag).
/// Unknown counts as true: nothing to warn about.
fn tsc_is_invariant() -> bool {
    let source = "/sys/devices/system/clocksource/clocksource0/current_clocksource";
    if std::fs::read_to_string(source).is_ok_and(|s| s.trim() == "tsc") {
        return true;
    }
    std::fs::read_to_string("/proc/cpuinfo")
        .map(|s| s.contains("constant_tsc") || !s.contains("flags"))
        .unwrap_or(true)
}
