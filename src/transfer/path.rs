//! One path: a connected RC queue pair on one plane's engine, what it may
//! do now (its state), and what it has done (its counters and rate).

use std::time::{Duration, Instant};

use crate::engine::QpId;
use crate::sys::ibv_wc_status as WcStatus;

/// What a path may do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathState {
    /// Carries chunks.
    Up,
    /// Failed; its queue pair is reset (in INIT, holding nothing) and
    /// waits for its next probe.
    Down,
    /// Reconnected; a probe (a zero-length RDMA Write) is in flight.
    Probing,
}

impl PathState {
    /// A short name for progress lines.
    pub fn name(self) -> &'static str {
        match self {
            PathState::Up => "up",
            PathState::Down => "down",
            PathState::Probing => "probing",
        }
    }
}

/// Why a path was last failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailCause {
    /// An error completion with this status (not a flush).
    Completion(WcStatus),
    /// Only flushes came back: the queue pair was already in ERR.
    Flushed,
    /// Requests in flight and no completion for the watchdog's time.
    Stalled,
    /// The device reported `PORT_ERR` for the plane.
    PortError,
    /// A post was refused (the queue pair is in ERR).
    PostRefused,
    /// The probe after a reconnection failed or timed out.
    ProbeFailed,
    /// The peer could not be asked to reconnect, or connecting failed.
    Reconnect,
    /// The caller asked for it ([`super::Transfer::fail_path`]).
    Requested,
}

/// A path's counters, readable while the transfer runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PathStats {
    /// Which plane (engine) the path's queue pair belongs to.
    pub plane: u16,
    /// The queue pair.
    pub qp: QpId,
    /// Its flow label.
    pub flow_label: u32,
    /// What it may do now.
    pub state: PathState,
    /// Bytes of chunks it completed.
    pub bytes: u64,
    /// Chunks it completed.
    pub chunks: u64,
    /// Chunks in flight on it now.
    pub in_flight: u32,
    /// Chunks it carried that had been posted before on a failed path.
    pub resent_chunks: u64,
    /// Times it failed.
    pub failures: u32,
    /// Times it was re-admitted after a successful probe.
    pub readmissions: u32,
    /// Probes that failed.
    pub failed_probes: u32,
    /// Why it last failed.
    pub last_cause: Option<FailCause>,
    /// Bytes per second over the last rate window (about 0.5 s).
    pub rate: f64,
}

/// A path with its bookkeeping.
#[derive(Debug)]
pub(crate) struct Path {
    pub stats: PathStats,
    /// Step-loop time since the last completion (or the first post into
    /// an idle path, or the probe) while the path had work: what the
    /// watchdog compares with its bound.
    pub silent: Duration,
    /// When a failed path may be probed next.
    pub next_probe: Instant,
    /// The wait before the next probe, doubled after each failed one.
    pub backoff: Duration,
    /// When it failed (the time it took to re-admit it is reported).
    pub failed_at: Option<Instant>,
    /// Set by a completion that failed it; the step resets it after polling.
    pub failing: bool,
    /// The queue pair's number, its connections so far (0: the one the
    /// path was given), its path MTU in bytes, and the PSN its next
    /// request starts at (for the trace).
    pub qpn: u32,
    pub generation: u32,
    pub mtu: u32,
    pub next_psn: u32,
    rate_window_start: Instant,
    rate_window_bytes: u64,
}

/// How long the rate of a path is averaged over.
const RATE_WINDOW: Duration = Duration::from_millis(500);

impl Path {
    pub fn new(plane: u16, qp: QpId, flow_label: u32, now: Instant) -> Path {
        Path {
            stats: PathStats {
                plane,
                qp,
                flow_label,
                state: PathState::Up,
                bytes: 0,
                chunks: 0,
                in_flight: 0,
                resent_chunks: 0,
                failures: 0,
                readmissions: 0,
                failed_probes: 0,
                last_cause: None,
                rate: 0.0,
            },
            silent: Duration::ZERO,
            next_probe: now,
            backoff: Duration::ZERO,
            failed_at: None,
            failing: false,
            qpn: 0,
            generation: 0,
            mtu: 1024,
            next_psn: 0,
            rate_window_start: now,
            rate_window_bytes: 0,
        }
    }

    /// A chunk of `len` bytes completed.
    pub fn completed(&mut self, len: u64) {
        self.stats.bytes += len;
        self.stats.chunks += 1;
        self.rate_window_bytes += len;
        self.silent = Duration::ZERO;
    }

    /// Closes the rate window when it is over.
    pub fn update_rate(&mut self, now: Instant) {
        let span = now.saturating_duration_since(self.rate_window_start);
        if span >= RATE_WINDOW {
            self.stats.rate = self.rate_window_bytes as f64 / span.as_secs_f64();
            self.rate_window_bytes = 0;
            self.rate_window_start = now;
        }
    }

    /// Marks the path as failing (the step resets it); the first cause wins.
    pub fn fail(&mut self, cause: FailCause) {
        if !self.failing && self.stats.state != PathState::Down {
            self.failing = true;
            self.stats.last_cause = Some(cause);
        }
    }

    /// True when requests (or a probe) are in flight.
    pub fn busy(&self) -> bool {
        self.stats.in_flight > 0 || self.stats.state == PathState::Probing
    }

    /// True when the path has been silent past `limit` while another path
    /// was heard within the last half of it (`all_silent`: the step-loop
    /// time since any path completed anything), or past twice `limit`
    /// regardless. A transfer silent as a whole points at a stalled host
    /// or peer, which failing paths cannot cure, rather than at this path.
    pub fn stalled(&self, limit: Duration, all_silent: Duration) -> bool {
        self.busy() && self.silent > limit && (all_silent <= limit / 2 || self.silent > limit * 2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn busy_path(silent_ms: u64) -> Path {
        let qp = QpId {
            engine: 0,
            index: 0,
            generation: 0,
        };
        let mut p = Path::new(0, qp, 1, Instant::now());
        p.stats.in_flight = 1;
        p.silent = Duration::from_millis(silent_ms);
        p
    }

    #[test]
    fn a_silent_path_among_live_ones_fails_at_the_bound() {
        let limit = Duration::from_millis(800);
        let heard = Duration::from_millis(100);
        assert!(!busy_path(800).stalled(limit, heard));
        assert!(busy_path(801).stalled(limit, heard));
        let mut idle = busy_path(5000);
        idle.stats.in_flight = 0;
        assert!(!idle.stalled(limit, heard), "no work, no verdict");
    }

    #[test]
    fn a_transfer_silent_as_a_whole_waits_twice_the_bound() {
        let limit = Duration::from_millis(800);
        let all = Duration::from_millis(900);
        assert!(!busy_path(900).stalled(limit, all));
        assert!(!busy_path(1600).stalled(limit, all));
        assert!(busy_path(1601).stalled(limit, all));
    }
}
