//! How fast a dead path is found: the RC retry policy each path connects
//! with, the detection bound it implies, and the per-path connect options
//! (flow label, traffic class, hop limit) that go with it.

use core::time::Duration;

use crate::engine::ConnectOptions;
use crate::error::{site, Error};

/// The RC transport retry policy of every path: local ACK timeout code
/// and transport retry count.
///
/// The default, timeout 14 (67.1 ms per attempt) with 3 retries, favours
/// tail latency: a silent path is declared dead after about 268 ms, where
/// the primer's 14/7 waits 537 ms on a NIC (and forever on Soft-RoCE,
/// which treats 7 as "retry forever"). It does not go lower because a
/// spurious expiry is not free: on Soft-RoCE a timer shorter than the
/// ACK spacing of a long message (it acknowledges every 128 packets)
/// triggers go-back-N retransmissions and, measured in `FAULTS.md`,
/// spurious `RETRY_EXC_ERR` at timeout 12 and worse at 10; on a fabric,
/// congestion and PFC pauses play the same role. A spurious failure here
/// costs a reset, a re-spray and a re-admission, never data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Local ACK timeout code: one attempt waits 4.096 us x 2^timeout.
    pub timeout: u8,
    /// Transport retries after the first attempt (0..=6; 7 is refused,
    /// since Soft-RoCE then retries forever and no bound holds).
    pub retry_cnt: u8,
    /// Factor over the nominal time before the transfer's own watchdog
    /// declares a path with work in flight and no completion dead: covers
    /// timer and scheduling latency, an ACK that restarts the count, and
    /// the device that stalls instead of failing (Soft-RoCE after a link
    /// loss, `FAULTS.md`).
    pub slack: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            timeout: 14,
            retry_cnt: 3,
            slack: 3,
        }
    }
}

/// What a [`RetryPolicy`] promises about a path that goes silent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DetectionBound {
    /// One attempt: 4.096 us x 2^timeout.
    pub attempt: Duration,
    /// The device's own verdict, `RETRY_EXC_ERR` after the first attempt
    /// and every retry: attempt x (retry_cnt + 1).
    pub nominal: Duration,
    /// The transfer's watchdog: nominal x slack. A path with requests in
    /// flight and no completion for this long (of step-loop time) while
    /// other paths complete is failed by the transfer itself, whatever the
    /// device says; the bound the transfer reports. With every path silent
    /// it waits twice this (see the module docs).
    pub watchdog: Duration,
}

impl RetryPolicy {
    /// Refuses the policies under which no bound holds: timeout 0 (the
    /// spec's "infinite"), retry_cnt 7 (Soft-RoCE's "forever"), slack 0.
    pub fn validate(&self) -> Result<(), Error> {
        if self.timeout == 0 || self.timeout > 31 {
            return Err(Error::invalid(site!(
                "transfer::RetryPolicy",
                "timeout must be 1..=31 (0 means wait forever)"
            )));
        }
        if self.retry_cnt > 6 {
            return Err(Error::invalid(site!(
                "transfer::RetryPolicy",
                "retry_cnt must be 0..=6",
                "7 retries forever on Soft-RoCE: a dead path would never be reported"
            )));
        }
        if self.slack == 0 {
            return Err(Error::invalid(site!(
                "transfer::RetryPolicy",
                "slack must be at least 1"
            )));
        }
        Ok(())
    }

    /// The detection bound this policy implies.
    pub fn bound(&self) -> DetectionBound {
        // 4.096 us = 4096 ns; timeout <= 31 keeps this inside u64.
        let attempt = Duration::from_nanos(4096u64 << self.timeout.min(31));
        let nominal = attempt * (u32::from(self.retry_cnt) + 1);
        DetectionBound {
            attempt,
            nominal,
            watchdog: nominal * self.slack.max(1),
        }
    }
}

/// Routing and retry settings shared by every path of a transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathOptions {
    /// The retry policy (and so the detection bound).
    pub retry: RetryPolicy,
    /// GRH traffic class of every path (DSCP << 2 | ECN).
    pub traffic_class: u8,
    /// GRH hop limit of every path.
    pub hop_limit: u8,
    /// Path `i` gets flow label `1 + (flow_label_base + i) mod (2^20 - 1)`
    /// (20 bits, never 0, distinct for up to 2^20 - 1 paths):
    /// RoCEv2 derives the UDP source port from it, which ECMP hashes, so
    /// each queue pair takes its own route through a multipath fabric.
    pub flow_label_base: u32,
}

impl Default for PathOptions {
    fn default() -> Self {
        PathOptions {
            retry: RetryPolicy::default(),
            traffic_class: 0,
            hop_limit: 64,
            flow_label_base: 0x1_0000,
        }
    }
}

impl PathOptions {
    /// Path `index`'s flow label: distinct per path, 20 bits, never 0
    /// (0 means "no label", and the device picks the port on its own).
    pub fn flow_label(&self, index: usize) -> u32 {
        const LABELS: u64 = 0xF_FFFF;
        (1 + (u64::from(self.flow_label_base) + index as u64) % LABELS) as u32
    }

    /// The options path `index` connects (and reconnects) with.
    pub fn connect_options(&self, index: usize) -> ConnectOptions {
        ConnectOptions {
            timeout: self.retry.timeout,
            retry_cnt: self.retry.retry_cnt,
            // Writes and reads consume no receive: RNR never happens on a
            // transfer path, so the crate's default stays.
            traffic_class: self.traffic_class,
            hop_limit: self.hop_limit,
            flow_label: self.flow_label(index),
            ..ConnectOptions::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_bound_is_four_attempts_of_67_ms() {
        let b = RetryPolicy::default().bound();
        assert_eq!(b.attempt, Duration::from_nanos(67_108_864));
        assert_eq!(b.nominal, Duration::from_nanos(4 * 67_108_864));
        assert_eq!(b.watchdog, b.nominal * 3);
        assert!(b.nominal < Duration::from_millis(270));
    }

    #[test]
    fn policies_without_a_bound_are_refused() {
        let ok = RetryPolicy::default();
        assert!(ok.validate().is_ok());
        for bad in [
            RetryPolicy { timeout: 0, ..ok },
            RetryPolicy { retry_cnt: 7, ..ok },
            RetryPolicy { slack: 0, ..ok },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn every_path_gets_its_own_nonzero_flow_label() {
        let o = PathOptions {
            flow_label_base: 0xF_FFFD,
            ..PathOptions::default()
        };
        let labels: alloc::vec::Vec<u32> = (0..4).map(|i| o.flow_label(i)).collect();
        assert_eq!(labels, [0xF_FFFE, 0xF_FFFF, 1, 2]);
        let c = PathOptions::default().connect_options(3);
        assert_eq!(c.flow_label, 0x1_0004);
        assert_eq!((c.timeout, c.retry_cnt), (14, 3));
    }
}
