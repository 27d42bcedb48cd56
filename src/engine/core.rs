//! The engine: one completion queue (or a send/receive pair), an optional
//! shared receive queue, and any number of queue pairs, each with the rings
//! that own its requests' buffers. One owner (`&mut`) per engine; many
//! engines per process, one per polling thread.

use alloc::vec::Vec;
use core::sync::atomic::{AtomicU32, Ordering};

use crate::error::{site, Error, ErrorKind};
use crate::memory::NicBuf;

use super::ah_table::AhTable;
use super::bind_table::BindTable;
use super::completion::CompletionRef;
use super::doorbell::{Provider, Verbs};
use super::id::MAX_QPS;
use super::prepared_table::PreparedTable;
use super::qp_slot::{QpId, QpSlot, QpState, UD_GENERATION, VACANT};
use super::ring::Ring;
use super::srq::SrqSlots;

/// Engines made so far: each gets its own id, so a handle of one engine
/// reaches nothing on another.
static ENGINES: AtomicU32 = AtomicU32::new(1);

/// Many queue pairs sharing one completion queue (or a send/receive pair)
/// and optionally one shared receive queue: the object a service's polling
/// thread owns (UCX calls it a worker).
///
/// Posting moves a request's buffers into its queue pair's ring; polling
/// routes each completion, by its work request id, to that ring and hands
/// the buffers back with the queue pair's [`QpId`]. No allocation and no
/// lock on either. `P` is where work requests go: the device, unless the
/// crate's own tests put a simulated one there.
pub struct Engine<B, P: Provider = Verbs> {
    pub(crate) id: u32,
    pub(crate) prov: P,
    pub(crate) cq: P::Cq,
    /// The receive queues' own CQ (`EngineConfig::separate_recv_cq`).
    pub(crate) recv_cq: Option<P::Cq>,
    /// Completions each CQ can still take on for new queue pairs: every
    /// ring's capacity counts against its CQ, so a CQ never overflows.
    pub(crate) cq_room: [u64; 2],
    pub(crate) qps: Vec<QpSlot<B, P::Qp>>,
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
        let recv_room = recv_cq.as_ref().map_or(0, |(_, n)| u64::from(*n));
        let mut cq_room = [u64::from(cqe), recv_room];
        if let Some(s) = &srq {
            // Every posted shared receive completes on the receive side once.
            let side = usize::from(recv_cq.is_some());
            cq_room[side] = cq_room[side].saturating_sub(s.capacity() as u64);
        }
        Engine {
            id,
            prov,
            cq,
            recv_cq: recv_cq.map(|(cq, _)| cq),
            cq_room,
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
        }
    }

    /// Places a new queue pair (created by the provider, in RESET) with
    /// rings of `send_depth` and `recv_depth`, refused when its CQs could
    /// not hold every completion of its rings.
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
        let recv_side = usize::from(self.recv_cq.is_some());
        let mut room = self.cq_room;
        let fits = room[0]
            .checked_sub(u64::from(send_depth))
            .map(|r| room[0] = r)
            .is_some()
            && room[recv_side]
                .checked_sub(u64::from(recv_depth))
                .map(|r| room[recv_side] = r)
                .is_some();
        if !fits {
            return Err((cq_full(), qp));
        }
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
        self.qps[index as usize] =
            QpSlot::new(qp, qp_num, generation, send, recv, caps, has_srq, info);
        self.cq_room = room;
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
    pub(crate) fn slot(&self, qp: QpId) -> Result<&QpSlot<B, P::Qp>, Error> {
        match self.qps.get(qp.index as usize) {
            Some(s) if qp.engine == self.id && s.generation == qp.generation && s.is_live() => {
                Ok(s)
            }
            _ => Err(no_such_qp()),
        }
    }

    /// As [`Engine::slot`], mutably.
    #[inline(always)]
    pub(crate) fn slot_mut(&mut self, qp: QpId) -> Result<&mut QpSlot<B, P::Qp>, Error> {
        match self.qps.get_mut(qp.index as usize) {
            Some(s) if qp.engine == self.id && s.generation == qp.generation && s.is_live() => {
                Ok(s)
            }
            _ => Err(no_such_qp()),
        }
    }

    /// The provider and the live slot `qp` names, borrowed apart (to post).
    #[inline(always)]
    pub(crate) fn split(&mut self, qp: QpId) -> Result<(&mut P, &mut QpSlot<B, P::Qp>), Error> {
        match self.qps.get_mut(qp.index as usize) {
            Some(s) if qp.engine == self.id && s.generation == qp.generation && s.is_live() => {
                Ok((&mut self.prov, s))
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

    /// Destroys `qp` and drops the buffers it still owned (in flight, or
    /// in its prepared requests): after a successful destroy the device no
    /// longer touches them. If the destroy fails, the queue pair and all of
    /// them are leaked instead, and the error says so.
    pub fn remove_qp(&mut self, qp: QpId) -> Result<(), Error> {
        self.remove_qp_with(qp, |_| {})
    }

    /// [`Engine::remove_qp`], handing back through `on_done`, as flushed,
    /// every request the queue pair still held, once its destroy
    /// succeeded (the device is then done with their buffers): for a
    /// caller that must get its buffers back from a queue pair it could
    /// not reset. A failed destroy hands back nothing.
    pub(crate) fn remove_qp_with(
        &mut self,
        qp: QpId,
        mut on_done: impl FnMut(CompletionRef<'_, B>),
    ) -> Result<(), Error> {
        self.slot(qp)?;
        self.teardown_slot(qp.index, &mut on_done)
    }

    /// Destroys the queue pair in slot `index` (see `remove_qp_with`).
    fn teardown_slot(
        &mut self,
        index: u32,
        on_done: &mut impl FnMut(CompletionRef<'_, B>),
    ) -> Result<(), Error> {
        let slot = &mut self.qps[index as usize];
        let Some(handle) = slot.qp.take() else {
            return Ok(());
        };
        let (send_cap, recv_cap) = (slot.send.capacity(), slot.recv.capacity());
        let qp_num = slot.qp_num;
        self.by_qpn.retain(|&(n, _)| n != qp_num);
        if let Err(e) = self.prov.destroy_qp(handle) {
            // The device may still reach every buffer posted to it: leak the
            // rings (moved out, forgotten) and the prepared requests, and
            // never reuse the index (the live queue pair may still complete).
            let dead = core::mem::replace(&mut self.qps[index as usize], vacant_slot());
            core::mem::forget(dead);
            self.prepared.leak_qp(index);
            self.binds.leak_qp(index);
            self.ahs.pin();
            return Err(e.leaked(site!(
                "ibv_destroy_qp",
                "the queue pair and every buffer posted to it were leaked"
            )));
        }
        // Destroyed: like RESET, it holds no work request; what its rings
        // still hold goes back as flushed.
        self.qps[index as usize].set_state(QpState::RESET);
        self.retire_all(self.id_of(index), on_done)?;
        let slot = &mut self.qps[index as usize];
        slot.qp_num = VACANT;
        // Its completions still queued hold ids of the old window: dropping
        // the rings' buffers now is sound, the device is done with them.
        let keep_send = slot.send.next_seq();
        let keep_recv = slot.recv.next_seq();
        slot.send = Ring::new(0, keep_send);
        slot.recv = Ring::new(0, keep_recv);
        self.prepared.release_qp(index);
        let recv_side = usize::from(self.recv_cq.is_some());
        self.cq_room[0] += send_cap;
        self.cq_room[recv_side] += recv_cap;
        self.vacant.push(index);
        Ok(())
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

fn vacant_slot<B, Q>() -> QpSlot<B, Q> {
    QpSlot::new_vacant()
}

#[cold]
fn no_such_qp() -> Error {
    Error::new(
        site!(
            "queue pair handle",
            "not a queue pair of this engine, or removed"
        ),
        ErrorKind::NotFound,
    )
}

#[cold]
fn cq_full() -> Error {
    Error::new(
        site!(
            "Engine::add_qp",
            "the completion queue cannot hold every completion of another queue pair's queues",
            "a larger EngineConfig::cq_depth, or smaller max_send_wr/max_recv_wr"
        ),
        ErrorKind::QueueFull,
    )
}
