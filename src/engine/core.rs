//! The engine: one completion queue (or a send/receive pair), an optional
//! shared receive queue, the table of requests in flight of each completion
//! queue (which owns their buffers), and any number of queue pairs, each
//! with the windows of its two queues. One owner (`&mut`) per engine; many
//! engines per process, one per polling thread.

use alloc::vec::Vec;
use core::sync::atomic::{AtomicU32, Ordering};

use crate::error::{site, Error, ErrorKind};
use crate::memory::NicBuf;

use super::ah_table::AhTable;
use super::bind_table::BindTable;
use super::config::Queue;
use super::counters::Counted;
use super::doorbell::{Provider, Verbs};
use super::flights::Flights;
use super::id::MAX_QPS;
use super::prepared_table::PreparedTable;
use super::qp_slot::{QpId, QpSlot, QpState, UD_GENERATION};
use super::ring::Ring;
use super::srq::SrqSlots;

/// What a post works on, borrowed apart from one engine: the provider, a
/// queue pair's slot, the tables of requests in flight.
pub(crate) type Parts<'e, B, P> = (
    &'e mut P,
    &'e mut QpSlot<<P as Provider>::Qp>,
    &'e mut [Flights<B>; 2],
);

/// Engines made so far: each gets its own id, so a handle of one engine
/// reaches nothing on another.
static ENGINES: AtomicU32 = AtomicU32::new(1);

/// Many queue pairs sharing one completion queue (or a send/receive pair)
/// and optionally one shared receive queue: the object a service's polling
/// thread owns (UCX calls it a worker).
///
/// Posting moves a request's buffers into the engine's table of requests
/// in flight; polling routes each completion, by its work request id, to
/// its queue pair's queue and hands the buffers back with the queue pair's
/// [`QpId`]. No allocation and no lock on either. The engine holds at most
/// as many requests in flight, over all its queue pairs, as its completion
/// queue holds completions (a post beyond that is refused `QueueFull`: poll
/// first), so the completion queue never overflows; a queue pair's depths
/// are a maximum for that queue pair, not a share of the completion queue.
/// `P` is where work requests go: the device, unless the crate's own tests
/// put a simulated one there.
pub struct Engine<B, P: Provider = Verbs> {
    pub(crate) id: u32,
    pub(crate) prov: P,
    pub(crate) cq: P::Cq,
    /// The receive queues' own CQ (`EngineConfig::separate_recv_cq`).
    pub(crate) recv_cq: Option<P::Cq>,
    /// The requests in flight on each CQ (`flights.rs`): the send queues'
    /// (with one CQ, every queue's) and the receive queues' of a separate
    /// receive CQ.
    pub(crate) flights: [Flights<B>; 2],
    /// Which of them receives go to: 1 with a separate receive CQ.
    pub(crate) recv_side: usize,
    /// The overflow entry of the request lent to a poll's callback
    /// (`side << 31 | index`), or `NONE`: released when the callback
    /// returns, or by the router's guard if it unwinds.
    pub(crate) lent: u32,
    pub(crate) qps: Vec<QpSlot<P::Qp>>,
    /// Indices of vacant slots, reused first (never a leaked queue pair's).
    pub(crate) vacant: Vec<u32>,
    /// `(qp_num, index)` of every live queue pair, sorted: routes the
    /// completions whose id names no slot (shared receives, raw posts).
    pub(crate) by_qpn: Vec<(u32, u32)>,
    pub(crate) srq: Option<SrqSlots<B, P::Srq>>,
    pub(crate) prepared: PreparedTable<B>,
    /// Sleep on a completion channel in `wait` (else spin).
    pub(crate) events: bool,
    /// The address handles UD sends name (`ah_table.rs`): dropped after
    /// the queue pairs, leaked if one of them was.
    pub(crate) ahs: AhTable,
    /// What new queue pairs were last set up from (`addressing.rs`).
    pub(crate) addressing: Option<super::addressing::Addressing>,
    /// Window binds posted and not yet claimed (`bind.rs`): each window
    /// (with its buffer) stays here until its bind is no longer in flight;
    /// dropped after the queue pairs, leaked if one of them was.
    pub(crate) binds: BindTable<P::Window>,
    /// The channel the ids of queue pairs rdma_cm made report on
    /// (`adopt.rs`): made with the first, read only through this engine.
    #[cfg(feature = "rdmacm")]
    pub(crate) cm_channel: Option<alloc::sync::Arc<crate::raw::cm::RawCmChannel>>,
    /// What its counters keep beside the slots (`counters.rs`).
    pub(crate) counted: Counted,
}

impl<B: NicBuf, P: Provider> Engine<B, P> {
    /// An engine around `cq` (and `recv_cq`) and `srq`, whose CQs hold
    /// `cqe` and `recv_cqe` completions.
    pub(crate) fn assemble(
        prov: P,
        cq: P::Cq,
        cqe: u32,
        recv_cq: Option<(P::Cq, u32)>,
        srq: Option<SrqSlots<B, P::Srq>>,
        events: bool,
    ) -> Engine<B, P> {
        let id = ENGINES.fetch_add(1, Ordering::Relaxed) & super::prepared_table::ENGINE_ID_MASK;
        let mut room = [cqe, recv_cq.as_ref().map_or(0, |(_, n)| *n)];
        let recv_side = usize::from(recv_cq.is_some());
        if let Some(s) = &srq {
            // Every posted shared receive completes on the receive side once.
            room[recv_side] = room[recv_side].saturating_sub(s.capacity() as u32);
        }
        let mut flights = [Flights::new(room[0]), Flights::new(room[1])];
        if srq.as_ref().is_some_and(|s| s.max_sge > 1) {
            // A shared receive's buffers after its first wait there while
            // its completion is lent.
            flights[recv_side].allow_overflow();
        }
        Engine {
            id,
            prov,
            cq,
            recv_cq: recv_cq.map(|(cq, _)| cq),
            flights,
            recv_side,
            lent: super::ring::NONE,
            qps: Vec::new(),
            vacant: Vec::new(),
            by_qpn: Vec::new(),
            srq,
            prepared: PreparedTable::new(id),
            events,
            ahs: AhTable::new(),
            addressing: None,
            binds: BindTable::new(),
            #[cfg(feature = "rdmacm")]
            cm_channel: None,
            counted: Counted::new(),
        }
    }

    /// Places a new queue pair (created by the provider, in RESET) whose
    /// queues hold at most `send_depth` and `recv_depth` requests.
    pub(crate) fn place(
        &mut self,
        qp: P::Qp,
        qp_num: u32,
        send_depth: u32,
        recv_depth: u32,
        caps: crate::sys::ibv_qp_cap,
        info: super::qp_slot::QpInfo,
    ) -> Result<QpId, (Error, P::Qp)> {
        let has_srq = self.srq.is_some();
        let recv_depth = if has_srq { 0 } else { recv_depth };
        let index = match self.vacant.pop() {
            Some(i) => i,
            None if self.qps.len() < MAX_QPS as usize => {
                self.qps.push(vacant_slot());
                (self.qps.len() - 1) as u32
            }
            None => {
                return Err((
                    Error::new(
                        site!("Engine::add_qp", "the engine holds 2^20 queue pairs"),
                        ErrorKind::QueueFull,
                    ),
                    qp,
                ))
            }
        };
        let old = &self.qps[index as usize];
        // A reused index continues the old queue pair's sequence numbers, so
        // its stale completions fall outside the new one's window.
        let send = Ring::new(send_depth, old.send.next_seq().wrapping_add(1 << 20));
        let recv = Ring::new(recv_depth, old.recv.next_seq().wrapping_add(1 << 20));
        // The top bit says "datagram" (qp_slot.rs, UD_GENERATION): a
        // completion then knows where its payload starts without a lookup.
        let ud = if info.config.transport == super::config::Transport::Ud {
            UD_GENERATION
        } else {
            0
        };
        let generation = (old.generation.wrapping_add(1) & !UD_GENERATION) | ud;
        if caps.max_send_sge > 1 {
            self.flights[0].allow_overflow();
        }
        if caps.max_recv_sge > 1 && !has_srq {
            self.flights[self.recv_side].allow_overflow();
        }
        self.qps[index as usize] =
            QpSlot::new(qp, qp_num, generation, send, recv, caps, has_srq, info);
        let at = self.by_qpn.partition_point(|&(n, _)| n < qp_num);
        self.by_qpn.insert(at, (qp_num, index));
        Ok(QpId {
            engine: self.id,
            index,
            generation,
        })
    }

    /// The live slot `qp` names on this engine.
    #[inline(always)]
    pub(crate) fn slot(&self, qp: QpId) -> Result<&QpSlot<P::Qp>, Error> {
        match self.qps.get(qp.index as usize) {
            // A slot left vacant has a generation no handle has.
            Some(s) if qp.engine == self.id && s.generation == qp.generation => Ok(s),
            _ => Err(no_such_qp()),
        }
    }

    /// As [`Engine::slot`], mutably.
    #[inline(always)]
    pub(crate) fn slot_mut(&mut self, qp: QpId) -> Result<&mut QpSlot<P::Qp>, Error> {
        match self.qps.get_mut(qp.index as usize) {
            // A slot left vacant has a generation no handle has.
            Some(s) if qp.engine == self.id && s.generation == qp.generation => Ok(s),
            _ => Err(no_such_qp()),
        }
    }

    /// The provider and the live slot `qp` names, borrowed apart (to post).
    #[inline(always)]
    pub(crate) fn split(&mut self, qp: QpId) -> Result<(&mut P, &mut QpSlot<P::Qp>), Error> {
        let (prov, slot, _) = self.parts(qp)?;
        Ok((prov, slot))
    }

    /// The provider, the live slot `qp` names and the engine's tables of
    /// requests in flight, borrowed apart (to post and record the post).
    #[inline(always)]
    pub(crate) fn parts(&mut self, qp: QpId) -> Result<Parts<'_, B, P>, Error> {
        match self.qps.get_mut(qp.index as usize) {
            // A slot left vacant has a generation no handle has.
            Some(s) if qp.engine == self.id && s.generation == qp.generation => {
                Ok((&mut self.prov, s, &mut self.flights))
            }
            _ => Err(no_such_qp()),
        }
    }

    /// Records that someone else (the connection manager, a simulated
    /// device) moved `qp` to `state`.
    #[cfg_attr(not(any(test, feature = "rdmacm")), allow(dead_code))]
    pub(crate) fn mark_state(&mut self, qp: QpId, state: QpState) -> Result<(), Error> {
        self.slot_mut(qp)?.set_state(state);
        Ok(())
    }

    /// The handle of the live queue pair in slot `index`.
    pub(crate) fn id_of(&self, index: u32) -> QpId {
        QpId {
            engine: self.id,
            index,
            generation: self.qps[index as usize].generation,
        }
    }

    /// The queue pair whose number a completion carries (for shared
    /// receives and raw posts, whose ids name no slot).
    pub(crate) fn by_qp_num(&self, qp_num: u32) -> Option<QpId> {
        let at = self
            .by_qpn
            .binary_search_by_key(&qp_num, |&(n, _)| n)
            .ok()?;
        Some(self.id_of(self.by_qpn[at].1))
    }

    /// Every live queue pair.
    pub fn qps(&self) -> impl Iterator<Item = QpId> + '_ {
        (0..self.qps.len() as u32)
            .filter(|&i| self.qps[i as usize].is_live())
            .map(|i| self.id_of(i))
    }

    /// Requests in flight on `qp`'s send and receive queues.
    pub fn in_flight(&self, qp: QpId) -> Result<(u64, u64), Error> {
        let s = self.slot(qp)?;
        Ok((s.send.len(), s.recv.len()))
    }

    /// Requests the engine can still take in flight on `queue`'s completion
    /// queue (with one completion queue, both name it): a post beyond
    /// them is refused `QueueFull` until completions are polled.
    pub fn room(&self, queue: Queue) -> u32 {
        let side = match queue {
            Queue::Send => 0,
            Queue::Recv => self.recv_side,
        };
        self.flights[side].available()
    }

    /// Receives posted on the shared receive queue and not yet completed.
    pub fn srq_posted(&self) -> usize {
        self.srq.as_ref().map_or(0, |s| s.posted())
    }

    /// The state this engine last moved `qp` to (ERR once a completion failed).
    pub fn state(&self, qp: QpId) -> Result<QpState, Error> {
        Ok(self.slot(qp)?.state)
    }

    /// The queue pair number.
    pub fn qp_num(&self, qp: QpId) -> Result<u32, Error> {
        Ok(self.slot(qp)?.qp_num)
    }

    /// What the device granted `qp`: queue depths, scatter/gather entries,
    /// inline size.
    pub fn caps(&self, qp: QpId) -> Result<crate::sys::ibv_qp_cap, Error> {
        Ok(self.slot(qp)?.caps)
    }
}

impl<B, P: Provider> Drop for Engine<B, P> {
    fn drop(&mut self) {
        // Queue pairs first (they hold the SRQ and the CQs), each destroyed
        // before its buffers are dropped; a failure leaks them.
        let mut leaked = false;
        for index in 0..self.qps.len() {
            // A lane forgotten with its queue pair: leaked, never destroyed.
            leaked |= self.qps[index].lane_out;
            let Some(handle) = self.qps[index].qp.take() else {
                continue;
            };
            if self.prov.destroy_qp(handle).is_err() {
                leaked = true;
                core::mem::forget(core::mem::replace(&mut self.qps[index], vacant_slot()));
            }
        }
        if leaked {
            // Requests in flight may belong to a leaked queue pair (one
            // forgotten with its lane can be found no other way).
            for side in 0..2 {
                core::mem::forget(core::mem::replace(&mut self.flights[side], Flights::new(0)));
            }
            // A leaked queue pair may still send with any address handle.
            self.ahs.pin();
            // Prepared requests and binds may belong to a leaked queue pair.
            core::mem::forget(core::mem::replace(
                &mut self.prepared,
                PreparedTable::new(self.id),
            ));
            core::mem::forget(core::mem::replace(&mut self.binds, BindTable::new()));
        }
        if let Some(srq) = self.srq.take() {
            let (handle, slots) = srq.into_parts();
            if leaked || self.prov.destroy_srq(handle).is_err() {
                core::mem::forget(slots);
            }
        }
    }
}

pub(crate) fn vacant_slot<Q>() -> QpSlot<Q> {
    QpSlot::new_vacant()
}

#[cold]
pub(crate) fn no_such_qp() -> Error {
    Error::new(
        site!(
            "queue pair handle",
            "not a queue pair of this engine, or removed"
        ),
        ErrorKind::NotFound,
    )
}
