//! What an engine keeps per queue pair: its handle, state, the rings of its
//! two queues, what the state lets the data path post, and what connecting
//! needs (port, GID, PSN).

use crate::device::{GidEntry, PortAttr};
use crate::sys::{self, Zeroed};

use super::config::{QpConfig, Transport, MAX_CHAIN};
use super::ring::Ring;

pub use crate::sys::ibv_qp_state as QpState;

/// A queue pair of an engine: valid on the engine that made it, until the
/// queue pair is removed. A handle of another engine, or of a removed queue
/// pair, reaches nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QpId {
    pub(crate) engine: u32,
    pub(crate) index: u32,
    pub(crate) generation: u32,
}

/// Set in the generation of a datagram queue pair's `QpId` (the count
/// uses the other 31 bits): a completion's `QpId`, built from the slot's
/// generation that routing loads anyway, says whether its receive buffer
/// starts with a GRH at no extra cost on the poll.
pub(crate) const UD_GENERATION: u32 = 1 << 31;

impl QpId {
    /// True for a datagram (UD) queue pair.
    pub(crate) fn is_ud(&self) -> bool {
        self.generation & UD_GENERATION != 0
    }

    /// The queue pair's place in its engine (dense from 0): for tables the
    /// caller keeps per queue pair.
    pub fn index(&self) -> usize {
        self.index as usize
    }
}

/// `qp_num` of a vacant slot: QP numbers are 24-bit, so no completion
/// carries it.
pub(crate) const VACANT: u32 = u32::MAX;

/// What connecting a queue pair needs to know about it.
#[derive(Clone, Copy)]
pub(crate) struct QpInfo {
    pub(crate) config: QpConfig,
    pub(crate) port: PortAttr,
    pub(crate) gid: Option<GidEntry>,
    pub(crate) psn: u32,
    pub(crate) max_rd_atomic: u8,
    pub(crate) max_dest_rd_atomic: u8,
}

impl Default for QpInfo {
    fn default() -> Self {
        QpInfo {
            config: QpConfig::default(),
            port: PortAttr(sys::ibv_port_attr::zeroed()),
            gid: None,
            psn: 0,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
        }
    }
}

/// What a queue pair's completions count that its queues' windows do not
/// (see `counters.rs`): written by the router only, the errors on its cold
/// path.
#[derive(Clone, Copy, Default)]
pub(crate) struct Tally {
    pub(crate) errors: u64,
    pub(crate) srq_recvs: u64,
    pub(crate) bytes_received: u64,
}

/// One queue pair's bookkeeping. `Q` is the provider's handle.
pub(crate) struct QpSlot<Q> {
    /// `None` while the slot is vacant.
    pub(crate) qp: Option<Q>,
    /// The queue pair number, or `VACANT`.
    pub(crate) qp_num: u32,
    pub(crate) generation: u32,
    pub(crate) state: QpState,
    pub(crate) transport: Transport,
    pub(crate) send: Ring,
    pub(crate) recv: Ring,
    /// What the state lets the data path have in flight: the ring's
    /// capacity, or 0 where the state (or the shared receive queue) refuses
    /// posts. One comparison per post checks state and room.
    pub(crate) send_room: u64,
    pub(crate) recv_room: u64,
    /// Unsignaled sends since the last signaled one.
    pub(crate) unsignaled_run: u64,
    pub(crate) has_srq: bool,
    /// A placeholder for a slot a lane holds (`lane.rs`): if the engine
    /// still finds it when dropped, the lane was forgotten with the queue
    /// pair, which is then leaked, and so must its prepared requests be.
    pub(crate) lane_out: bool,
    /// Set by its first unreported send (`post_prepared_unreported`) and
    /// kept: until then no entry of its send queue is unreported, and the
    /// router asks none.
    pub(crate) unreported_sends: bool,
    /// What the device granted (scatter/gather entries, inline data).
    pub(crate) caps: sys::ibv_qp_cap,
    pub(crate) info: QpInfo,
    /// What its completions counted beyond its queues' windows.
    pub(crate) tally: Tally,
}

impl<Q> QpSlot<Q> {
    /// A live slot for `qp` in INIT's predecessor, RESET.
    #[allow(clippy::too_many_arguments)] // one per field it fills; called from one place
    pub(crate) fn new(
        qp: Q,
        qp_num: u32,
        generation: u32,
        send: Ring,
        recv: Ring,
        caps: sys::ibv_qp_cap,
        has_srq: bool,
        info: QpInfo,
    ) -> Self {
        QpSlot {
            qp: Some(qp),
            qp_num,
            generation,
            state: QpState::RESET,
            transport: info.config.transport,
            send,
            recv,
            send_room: 0,
            recv_room: 0,
            unsignaled_run: 0,
            has_srq,
            lane_out: false,
            unreported_sends: false,
            caps,
            info,
            tally: Tally::default(),
        }
    }

    /// A slot holding no queue pair.
    pub(crate) fn new_vacant() -> Self {
        QpSlot {
            qp: None,
            qp_num: VACANT,
            generation: 0,
            state: QpState::RESET,
            transport: Transport::Rc,
            send: Ring::new(0, 0),
            recv: Ring::new(0, 0),
            send_room: 0,
            recv_room: 0,
            unsignaled_run: 0,
            has_srq: false,
            lane_out: false,
            unreported_sends: false,
            caps: sys::ibv_qp_cap::default(),
            info: QpInfo::default(),
            tally: Tally::default(),
        }
    }

    /// What stands in the engine for `slot` while a lane holds it: vacant
    /// (no completion matches it, no call reaches it) and never reused,
    /// with what it had counted (`counters.rs`: a forgotten lane's queue
    /// pair keeps its counts).
    pub(crate) fn lent_to_lane(slot: &Self) -> Self {
        QpSlot {
            lane_out: true,
            send: slot.send.counts_only(),
            recv: slot.recv.counts_only(),
            tally: slot.tally,
            ..Self::new_vacant()
        }
    }

    /// Records the state the QP is now in, and what it lets the data path post.
    pub(crate) fn set_state(&mut self, state: QpState) {
        self.state = state;
        // A UD send names its destination: it posts through
        // `post_ud_send` only (which checks RTS and the ring itself), so
        // every other send path finds no room.
        self.send_room = if state == QpState::RTS && self.transport != Transport::Ud {
            self.send.capacity()
        } else {
            0
        };
        let receives = state != QpState::RESET && state != QpState::ERR && !self.has_srq;
        self.recv_room = if receives { self.recv.capacity() } else { 0 };
    }

    /// True while the slot holds a queue pair.
    pub(crate) fn is_live(&self) -> bool {
        self.qp_num != VACANT
    }
}

/// Signals a request if the caller asked, or if leaving it unsignaled could
/// let unsignaled requests fill the send queue (a deadlock: their entries
/// are freed only by a later signaled completion). `run` counts the
/// unsignaled requests since the last signaled one; `half` is half the
/// queue's capacity, rounded up (`Ring::half`); `remaining` the requests
/// after this one in the same chain.
#[inline(always)]
pub(crate) fn signal_decision(run: &mut u64, half: u64, asked: bool, remaining: u64) -> bool {
    if asked || *run + 1 + remaining >= half {
        *run = 0;
        true
    } else {
        *run += 1;
        false
    }
}

/// The signal decisions for a chain of `n` requests (at most `MAX_CHAIN`)
/// posted after a run of `run` unsignaled ones: request `i` is signaled
/// when `asked(i)` or when the queue needs it (`signal_decision`).
pub(crate) struct SignalPlan {
    pub(crate) signaled: [bool; MAX_CHAIN],
    /// The run after each request: what the queue pair's count becomes
    /// when the chain is posted through it.
    runs: [u64; MAX_CHAIN],
}

impl SignalPlan {
    #[inline(always)]
    pub(crate) fn new(run: u64, half: u64, n: usize, asked: impl Fn(usize) -> bool) -> Self {
        let mut plan = SignalPlan {
            signaled: [false; MAX_CHAIN],
            runs: [0; MAX_CHAIN],
        };
        let mut run = run;
        for i in 0..n.min(MAX_CHAIN) {
            let remaining = (n - 1 - i) as u64;
            plan.signaled[i] = signal_decision(&mut run, half, asked(i), remaining);
            plan.runs[i] = run;
        }
        plan
    }

    /// The run once the first `posted` requests were posted (`before`
    /// if none was).
    #[inline(always)]
    pub(crate) fn run_after(&self, posted: usize, before: u64) -> u64 {
        match posted {
            0 => before,
            n => self.runs[n - 1],
        }
    }
}
