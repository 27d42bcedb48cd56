//! A transfer's own record of what it did to every chunk and path, off
//! unless [`TransferConfig::trace`](super::TransferConfig::trace) asks for
//! it: each post with its queue pair number and the PSNs it occupies,
//! each completion, failure, reset and connection. Kept in a buffer sized
//! once, so tracing allocates nothing while the transfer runs; events past
//! its capacity are counted, not kept.

use alloc::vec::Vec;
use core::fmt;
use std::time::Instant;

use crate::sys::ibv_wc_status as WcStatus;

use super::path::FailCause;

/// What happened (see [`TraceEvent`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceKind {
    /// The path's queue pair was connected: its first send PSN, and the
    /// peer's queue pair and first PSN when the transfer connected it (0
    /// for the paths it was given connected).
    Connected {
        /// Our first send PSN (the peer's expected PSN).
        psn: u32,
        /// The peer's queue pair number.
        peer_qpn: u32,
        /// The peer's first send PSN.
        peer_psn: u32,
        /// The path MTU in bytes.
        mtu: u32,
    },
    /// A chunk was posted; it occupies PSNs `first..=last` of the queue
    /// pair (one per MTU of bytes, at least one), if nothing before it
    /// was retried.
    Posted {
        /// The chunk.
        chunk: u32,
        /// Its first PSN.
        first: u32,
        /// Its last PSN.
        last: u32,
    },
    /// A probe (a zero-length Write) was posted at `psn`.
    Probe {
        /// Its PSN.
        psn: u32,
    },
    /// A chunk's post completed; `counted` says whether it settled the
    /// chunk (done, or waiting again).
    Completed {
        /// The chunk.
        chunk: u32,
        /// The completion's status.
        status: WcStatus,
        /// Its byte count (0 for a flush).
        bytes: u32,
        /// Whether it changed the chunk's state.
        counted: bool,
    },
    /// The probe completed.
    ProbeDone {
        /// The completion's status.
        status: WcStatus,
    },
    /// The path was failed.
    Failed {
        /// Why.
        cause: FailCause,
    },
    /// The path's queue pair was reset (`ok`) or the reset failed; it
    /// held `held` requests when the reset began, at the `Failed` just
    /// before. The engine waits at most 100 ms for the device's flushes,
    /// then takes back the rest itself at RESET: completions of the path
    /// recorded 100 ms or more after its `Failed` are those.
    Reset {
        /// Whether the reset succeeded.
        ok: bool,
        /// Requests in flight on it when the reset began.
        held: u32,
    },
}

/// One traced event: when (since the transfer started), on which path,
/// which of its queue pairs (`generation` counts its connections, 0 for
/// the one it was given) and its number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    /// Microseconds since the transfer started.
    pub at_us: u64,
    /// The path.
    pub path: u16,
    /// The path's connection: 0 for the queue pair it was given, then one
    /// more for each replacement.
    pub generation: u32,
    /// The queue pair's number.
    pub qpn: u32,
    /// What happened.
    pub kind: TraceKind,
}

impl fmt::Display for TraceEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:>10.6} path {} gen {} qpn {:#x} ",
            self.at_us as f64 / 1e6,
            self.path,
            self.generation,
            self.qpn
        )?;
        match self.kind {
            TraceKind::Connected {
                psn,
                peer_qpn,
                peer_psn,
                mtu,
            } => write!(
                f,
                "connected psn {psn:#08x} to qpn {peer_qpn:#x} psn {peer_psn:#08x} mtu {mtu}"
            ),
            TraceKind::Posted { chunk, first, last } => {
                write!(f, "posted chunk {chunk} psn {first:#08x}..={last:#08x}")
            }
            TraceKind::Probe { psn } => write!(f, "probe psn {psn:#08x}"),
            TraceKind::Completed {
                chunk,
                status,
                bytes,
                counted,
            } => write!(
                f,
                "completed chunk {chunk} {status} {bytes} bytes{}",
                if counted { "" } else { " (ignored)" }
            ),
            TraceKind::ProbeDone { status } => write!(f, "probe done {status}"),
            TraceKind::Failed { cause } => write!(f, "failed {cause:?}"),
            TraceKind::Reset { ok, held } => {
                let ok = if ok { "ok" } else { "FAILED" };
                write!(f, "reset {ok}, {held} held")
            }
        }
    }
}

/// The events kept so far and how many did not fit.
#[derive(Debug)]
pub(crate) struct Trace {
    events: Vec<TraceEvent>,
    dropped: u64,
    started: Instant,
}

impl Trace {
    /// Room for `capacity` events (0: tracing is off).
    pub fn new(capacity: usize, started: Instant) -> Trace {
        Trace {
            events: Vec::with_capacity(capacity),
            dropped: 0,
            started,
        }
    }

    /// Keeps `kind` for `path`, when tracing is on and there is room.
    #[inline]
    pub fn record(&mut self, path: u16, generation: u32, qpn: u32, kind: TraceKind) {
        if self.events.capacity() == 0 {
            return;
        }
        if self.events.len() == self.events.capacity() {
            self.dropped += 1;
            return;
        }
        let at_us = self.started.elapsed().as_micros() as u64;
        self.events.push(TraceEvent {
            at_us,
            path,
            generation,
            qpn,
            kind,
        });
    }

    /// The events kept, and the number that did not fit.
    pub fn events(&self) -> (&[TraceEvent], u64) {
        (&self.events, self.dropped)
    }
}

/// The PSNs a request of `len` bytes occupies on a path of `mtu` bytes:
/// one per MTU, at least one (a zero-length Write is one packet).
pub(crate) fn packets(len: u64, mtu: u32) -> u32 {
    (len.div_ceil(u64::from(mtu.max(1))) as u32).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_trace_counts_what_it_drops_and_allocates_nothing_more() {
        let mut t = Trace::new(2, Instant::now());
        for c in 0..5 {
            t.record(
                1,
                0,
                17,
                TraceKind::Posted {
                    chunk: c,
                    first: 0,
                    last: 0,
                },
            );
        }
        let (kept, dropped) = t.events();
        assert_eq!((kept.len(), dropped), (2, 3));
        let mut off = Trace::new(0, Instant::now());
        off.record(0, 0, 0, TraceKind::Reset { ok: true, held: 0 });
        assert_eq!(off.events(), (&[][..], 0));
    }

    #[test]
    fn a_write_occupies_one_psn_per_mtu_and_at_least_one() {
        assert_eq!(packets(256 << 10, 1024), 256);
        assert_eq!(packets(1025, 1024), 2);
        assert_eq!(packets(0, 1024), 1);
    }
}
