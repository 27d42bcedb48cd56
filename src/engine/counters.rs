//! What an engine and each of its queue pairs have done: requests posted
//! and completed, completions that failed (by status), receives from the
//! shared receive queue, bytes received. Cheap enough to leave on: the
//! posts and completions are the queues' windows of sequence numbers the
//! engine keeps anyway (read, never written, here); an error is counted
//! on the router's cold path; a receive's bytes are one add where the
//! router hands it back. Read on demand into plain `Copy` values.
//!
//! What the device counts per port (RNR NAKs, retries) is read from sysfs
//! on demand ([`PortCounters::read`]), never on the data path.

use crate::sys::ibv_wc_status as WcStatus;

use super::qp_slot::QpSlot;

/// Entries of [`EngineCounters::errors_by_status`]: one per status
/// libibverbs defines (`IBV_WC_SUCCESS` = 0 to `IBV_WC_TM_RNDV_INCOMPLETE`
/// = 23), the last for any status above those.
pub const STATUS_SLOTS: usize = 25;

/// One queue pair's counters since it was added (`Engine::qp_counters`).
/// While a lane holds the queue pair, its counters are the lane's: they
/// are read again once the lane ends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpCounters {
    /// Send-queue requests posted (Sends, Writes, Reads, atomics, binds;
    /// prepared, inline and a lane's included; raw posts, whose ids the
    /// engine does not keep, are not).
    pub sends_posted: u64,
    /// Send-queue requests handed back: completed, unsignaled ones with
    /// the signaled one that completes them, failed and flushed ones too.
    pub sends_completed: u64,
    /// Receives posted to its own receive queue.
    pub recvs_posted: u64,
    /// Receives of its own receive queue handed back (failed and flushed
    /// ones too).
    pub recvs_completed: u64,
    /// Receives of the engine's shared receive queue that arrived on it.
    pub srq_recvs: u64,
    /// Completions with a status other than success (flushes included),
    /// of either queue or of the shared receive queue.
    pub errors: u64,
    /// Bytes of the receives the engine's poll handed back (the
    /// completions' `byte_len`: its own queue's and the shared queue's; a
    /// lane counts its receives, not their bytes).
    pub bytes_received: u64,
}

impl QpCounters {
    pub(crate) fn add(&mut self, o: &QpCounters) {
        self.sends_posted += o.sends_posted;
        self.sends_completed += o.sends_completed;
        self.recvs_posted += o.recvs_posted;
        self.recvs_completed += o.recvs_completed;
        self.srq_recvs += o.srq_recvs;
        self.errors += o.errors;
        self.bytes_received += o.bytes_received;
    }
}

/// An engine's counters since it was made (`Engine::counters`): the sums
/// of [`QpCounters`] over every queue pair it has held, removed ones
/// included, and its errors by status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineCounters {
    /// The sums over its queue pairs, live and removed.
    pub qps: QpCounters,
    /// Completions by status, indexed by its value (`WcStatus::RNR_RETRY_EXC_ERR.0`
    /// and so on; the last entry counts statuses above
    /// `STATUS_SLOTS - 2`). Entry 0 (success) stays 0.
    pub errors_by_status: [u64; STATUS_SLOTS],
    /// Queue pairs it holds now.
    pub live_qps: u64,
    /// Receives posted to its shared receive queue and not yet completed.
    pub srq_posted: u64,
}

impl EngineCounters {
    /// Adds `other`'s counts to these (several engines' totals, as a
    /// server of one engine per thread reports them).
    pub fn add(&mut self, other: &EngineCounters) {
        self.qps.add(&other.qps);
        for (sum, n) in self.errors_by_status.iter_mut().zip(other.errors_by_status) {
            *sum += n;
        }
        self.live_qps += other.live_qps;
        self.srq_posted += other.srq_posted;
    }

    /// Completions that failed with `status`.
    pub fn errors_with(&self, status: WcStatus) -> u64 {
        self.errors_by_status[status_slot(status)]
    }
}

/// What the engine keeps for its counters beside its slots: the counts of
/// removed queue pairs, and the errors by status.
pub(crate) struct Counted {
    pub(crate) gone: QpCounters,
    pub(crate) by_status: [u64; STATUS_SLOTS],
}

impl Counted {
    pub(crate) const fn new() -> Counted {
        Counted {
            gone: QpCounters {
                sends_posted: 0,
                sends_completed: 0,
                recvs_posted: 0,
                recvs_completed: 0,
                srq_recvs: 0,
                errors: 0,
                bytes_received: 0,
            },
            by_status: [0; STATUS_SLOTS],
        }
    }

    /// A failed completion (the router's cold path).
    #[cold]
    pub(crate) fn error(&mut self, status: WcStatus) {
        self.by_status[status_slot(status)] += 1;
    }

    /// Keeps what a queue pair counted as it leaves its slot.
    pub(crate) fn retire_slot<Q>(&mut self, slot: &QpSlot<Q>) {
        self.gone.add(&of_slot(slot));
    }
}

fn status_slot(status: WcStatus) -> usize {
    (status.0 as usize).min(STATUS_SLOTS - 1)
}

pub(crate) fn of_slot<Q>(slot: &QpSlot<Q>) -> QpCounters {
    QpCounters {
        sends_posted: slot.send.posted(),
        sends_completed: slot.send.completed(),
        recvs_posted: slot.recv.posted(),
        recvs_completed: slot.recv.completed(),
        srq_recvs: slot.tally.srq_recvs,
        errors: slot.tally.errors,
        bytes_received: slot.tally.bytes_received,
    }
}

/// A port's counters of the device's own (`/sys/class/infiniband/DEV/ports/PORT/hw_counters`),
/// read on demand. Each is `None` where the driver does not expose it;
/// the names differ by driver (rxe's, then mlx5's, are tried).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortCounters {
    /// RNR NAKs this port received: a peer had no receive posted
    /// (rxe `rcvd_rnr_err`).
    pub rnr_naks_received: Option<u64>,
    /// RNR NAKs this port sent: a message found no receive posted here
    /// (rxe `send_rnr_err`).
    pub rnr_naks_sent: Option<u64>,
    /// Requests sent again after a timeout or a NAK (rxe
    /// `completer_retry_err`, mlx5 `local_ack_timeout_err`).
    pub retries: Option<u64>,
    /// Requests that failed with every retry used (rxe
    /// `retry_exceeded_err`).
    pub retries_exceeded: Option<u64>,
    /// Requests that failed with every RNR retry used (rxe
    /// `retry_rnr_exceeded_err`, mlx5 `rnr_nak_retry_err`).
    pub rnr_retries_exceeded: Option<u64>,
    /// Requests received out of sequence (rxe `out_of_seq_request`, mlx5
    /// `out_of_sequence`).
    pub out_of_sequence: Option<u64>,
}

#[cfg(feature = "std")]
impl PortCounters {
    /// Reads port `port` of the device `ctx` opened. Not for the data
    /// path: a few files read from sysfs.
    pub fn read(ctx: &crate::device::Context, port: u8) -> PortCounters {
        let dir = std::format!(
            "/sys/class/infiniband/{}/ports/{port}/hw_counters",
            ctx.name()
        );
        let one = |names: &[&str]| {
            names.iter().find_map(|n| {
                std::fs::read_to_string(std::format!("{dir}/{n}"))
                    .ok()
                    .and_then(|t| t.trim().parse().ok())
            })
        };
        PortCounters {
            rnr_naks_received: one(&["rcvd_rnr_err"]),
            rnr_naks_sent: one(&["send_rnr_err"]),
            retries: one(&["completer_retry_err", "local_ack_timeout_err"]),
            retries_exceeded: one(&["retry_exceeded_err"]),
            rnr_retries_exceeded: one(&["retry_rnr_exceeded_err", "rnr_nak_retry_err"]),
            out_of_sequence: one(&["out_of_seq_request", "out_of_sequence"]),
        }
    }
}
