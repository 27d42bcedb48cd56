//! Polling: each completion is routed by its work request id (checked
//! against the queue pair's number and its queue's window, or the shared
//! receive slot's generation) and hands back the buffers of every request
//! it finishes. A completion that names nothing in flight (stale,
//! duplicated, foreign) reaches no buffer. Never blocks, never allocates.
//!
//! Each finished request is retired before it is lent (its entry released,
//! its buffers moved into the [`CompletionRef`]), and the router keeps no
//! borrow of the engine across the callback: the callback may post on the
//! engine (`poster.rs`), and a request it posts is one more in flight,
//! after the ones this completion finishes.

use core::mem::MaybeUninit;

use crate::error::{site, Error, ErrorKind};
use crate::memory::NicBuf;
use crate::sys::{self, ibv_wc_opcode as WcOpcode, ibv_wc_status as WcStatus};
use crate::time::Deadline;

use super::completion::{Completion, CompletionRef, Origin, IN_SLOT};
use super::config::Queue;
use super::core::Engine;
use super::doorbell::Provider;
use super::flights::Retired;
use super::id::{self, WrId};
use super::lend::Chain;
use super::qp_slot::{QpId, QpState};
use super::ring::NONE;

/// Most completion entries one poll takes off a CQ.
pub(crate) const POLL_BATCH: usize = 16;

/// What to check when a wait for a completion times out.
pub(crate) const DEAD_PEER: &crate::error::Site = site!(
    "wait for a completion",
    "",
    "is the peer alive and connected? an RC QP retries for timeout x retry_cnt (Soft-RoCE treats retry_cnt 7 as forever); a Send waits for the peer's receive forever with rnr_retry 7, the default (the port's RNR counters show it: `rdma statistic show`)"
);

/// The completions of one poll not yet routed. If the caller's callback
/// panics, dropping this releases the entry it was lent and routes the
/// rest (and the one it was on: routing is idempotent) without calling
/// back, so no request stays stranded.
struct Unrouted<'e, 'w, B: NicBuf, P: Provider> {
    engine: &'e mut Engine<B, P>,
    rest: &'w [sys::ibv_wc],
    each_own: bool,
}

impl<B: NicBuf, P: Provider> Drop for Unrouted<'_, '_, B, P> {
    #[inline(always)]
    fn drop(&mut self) {
        let e = &*self.engine;
        let detached = e.flights[0].detached & e.flights[1].detached != NONE;
        if !self.rest.is_empty() || e.lent != NONE || detached {
            self.route_rest();
        }
    }
}

impl<B: NicBuf, P: Provider> Unrouted<'_, '_, B, P> {
    /// Only after a callback panicked.
    #[cold]
    #[inline(never)]
    fn route_rest(&mut self) {
        if let Some(srq) = self.engine.srq.as_mut() {
            srq.release_lent();
        }
        self.engine.release_lent();
        for flights in &mut self.engine.flights {
            flights.release_detached();
        }
        for wc in self.rest {
            self.engine.retire_as(wc, self.each_own, &mut |_| {});
        }
    }
}

impl<B: NicBuf, P: Provider> Engine<B, P> {
    /// Polls the completion queue(s) once, up to 16 entries each, and hands
    /// every finished request to `on_done` with its buffers, in completion
    /// order: an unsignaled request is handed back (as `SUCCESS`, not
    /// signaled) when the next signaled request of its queue completes; a
    /// post of [`Engine::post_prepared_unreported`] only if it fails.
    /// Returns the number handed back.
    #[inline]
    pub fn poll(
        &mut self,
        mut on_done: impl FnMut(CompletionRef<'_, B, P>),
    ) -> Result<usize, Error> {
        // One call site, so that the router is inlined here.
        let sides = 1 + usize::from(self.recv_cq.is_some());
        let mut delivered = 0;
        for side in 0..sides {
            delivered += self.poll_cq(side == 1, POLL_BATCH, &mut on_done)?;
        }
        Ok(delivered)
    }

    /// [`Engine::poll`] on one side's completion queue, when receives have
    /// their own (`EngineConfig::separate_recv_cq`): a wait for one kind
    /// never takes the other off its queue. With one queue, `Queue::Send`
    /// polls it and `Queue::Recv` finds nothing.
    #[inline]
    pub fn poll_queue(
        &mut self,
        queue: Queue,
        mut on_done: impl FnMut(CompletionRef<'_, B, P>),
    ) -> Result<usize, Error> {
        match queue {
            Queue::Send => self.poll_cq(false, POLL_BATCH, &mut on_done),
            Queue::Recv if self.recv_cq.is_some() => self.poll_cq(true, POLL_BATCH, &mut on_done),
            Queue::Recv => Ok(0),
        }
    }

    /// Takes at most `max` entries off one CQ and routes them.
    #[inline]
    pub(crate) fn poll_cq(
        &mut self,
        recv_side: bool,
        max: usize,
        on_done: &mut impl FnMut(CompletionRef<'_, B, P>),
    ) -> Result<usize, Error> {
        let mut wcs = [const { MaybeUninit::<sys::ibv_wc>::uninit() }; POLL_BATCH];
        let cq = match &self.recv_cq {
            Some(recv_cq) if recv_side => recv_cq,
            _ => &self.cq,
        };
        let polled = self.prov.poll(cq, &mut wcs[..max.clamp(1, POLL_BATCH)])?;
        Ok(self.route(polled, on_done))
    }

    /// Routes the completions `polled` off a CQ, each to what it finishes;
    /// returns the number of requests handed back.
    #[inline]
    pub(crate) fn route(
        &mut self,
        polled: &[sys::ibv_wc],
        on_done: &mut impl FnMut(CompletionRef<'_, B, P>),
    ) -> usize {
        self.route_as(polled, false, on_done)
    }

    /// [`Engine::route`]; with `each_own`, every request an entry finishes
    /// takes it as its own (a reset's flush: none of them is known to have
    /// run), not only the last.
    #[inline]
    fn route_as(
        &mut self,
        polled: &[sys::ibv_wc],
        each_own: bool,
        on_done: &mut impl FnMut(CompletionRef<'_, B, P>),
    ) -> usize {
        let mut delivered = 0;
        let mut pending = Unrouted {
            engine: self,
            rest: polled,
            each_own,
        };
        while let [wc, rest @ ..] = pending.rest {
            delivered += pending.engine.retire_as(wc, each_own, on_done);
            pending.rest = rest;
        }
        delivered
    }

    /// Hands back what completion `wc` finishes. Idempotent: a second call
    /// with the same entry finds nothing left to hand back. Only under an
    /// `Unrouted` guard (`route_as`), which releases a lent entry whose
    /// callback panicked.
    #[inline]
    fn retire_as(
        &mut self,
        wc: &sys::ibv_wc,
        each_own: bool,
        on_done: &mut impl FnMut(CompletionRef<'_, B, P>),
    ) -> usize {
        match id::decode(wc.wr_id) {
            WrId::Ring { recv, qp, seq } => {
                let Some(slot) = self.qps.get_mut(qp as usize) else {
                    return 0;
                };
                // A vacant slot's number matches no completion.
                if slot.qp_num != wc.qp_num {
                    return 0;
                }
                let ring = if recv { &slot.recv } else { &slot.send };
                let count = ring.through(seq);
                if count == 0 {
                    return 0;
                }
                if wc.status != WcStatus::SUCCESS {
                    slot.set_state(QpState::ERR); // every later request will flush
                    slot.tally.errors += 1;
                    self.counted.error(wc.status);
                } else if recv {
                    slot.tally.bytes_received += u64::from(wc.byte_len);
                }
                let id = QpId {
                    engine: self.id,
                    index: qp,
                    generation: slot.generation,
                };
                let side = recv & self.recv_cq.is_some();
                let unreported = slot.unreported_sends & !recv;
                let ring = if recv { &mut slot.recv } else { &mut slot.send };
                let first = self.flights[usize::from(side)].detach(ring, count);
                let chain = Chain {
                    first,
                    count,
                    side,
                    recv,
                    each_own,
                    qp: id,
                };
                // Two copies of the loop: a queue never posted unreported
                // (every plain path) asks its entries nothing.
                if unreported {
                    self.lend_chain::<true>(wc, chain, on_done)
                } else {
                    self.lend_chain::<false>(wc, chain, on_done)
                }
            }
            WrId::Srq { .. } => {
                let qp = self.by_qp_num(wc.qp_num);
                let side = self.recv_cq.is_some();
                let Some(srq) = self.srq.as_mut() else {
                    return 0;
                };
                // Its buffers stay in the slot, lent: `CompletionRef::buf`,
                // `repost_recv`, `take_buf` reach them there.
                let Some(tag) = srq.lend(wc.wr_id) else {
                    return 0;
                };
                if let Some(q) = qp {
                    let slot = &mut self.qps[q.index as usize];
                    slot.tally.srq_recvs += 1;
                    if wc.status == WcStatus::SUCCESS {
                        slot.tally.bytes_received += u64::from(wc.byte_len);
                    }
                }
                if wc.status != WcStatus::SUCCESS {
                    self.counted.error(wc.status);
                    if let Some(q) = qp {
                        let slot = &mut self.qps[q.index as usize];
                        slot.set_state(QpState::ERR);
                        slot.tally.errors += 1;
                    }
                }
                on_done(CompletionRef {
                    wc,
                    origin: Origin::Srq,
                    kept: Retired {
                        more: IN_SLOT,
                        ..Retired::bare(tag, WcOpcode::RECV)
                    },
                    side,
                    own_entry: true,
                    is_recv: true,
                    qp,
                    engine: self,
                });
                // What the callback left in the slot is dropped, the slot
                // free (by `Unrouted` if the callback panicked).
                if let Some(srq) = self.srq.as_mut() {
                    srq.release_lent();
                }
                if self.lent != NONE {
                    // Taken out of the slot, several buffers, some left.
                    self.release_lent();
                }
                1
            }
            WrId::Raw(_) => {
                let qp = self.by_qp_num(wc.qp_num);
                if wc.status != WcStatus::SUCCESS {
                    self.counted.error(wc.status);
                    if let Some(q) = qp {
                        let slot = &mut self.qps[q.index as usize];
                        slot.set_state(QpState::ERR);
                        slot.tally.errors += 1;
                    }
                }
                on_done(CompletionRef {
                    wc,
                    origin: Origin::Raw,
                    kept: Retired::bare(0, WcOpcode::SEND),
                    side: false,
                    own_entry: true,
                    is_recv: false,
                    qp,
                    engine: self,
                });
                1
            }
        }
    }

    /// Hands back every request still in `qp`'s queues as flushed, without a
    /// completion from the device. Only for a queue pair the device holds
    /// no work request of: in RESET (or destroyed).
    pub(crate) fn retire_all(
        &mut self,
        qp: QpId,
        on_done: &mut impl FnMut(CompletionRef<'_, B, P>),
    ) -> Result<(), Error> {
        let slot = self.slot(qp)?;
        debug_assert!(
            slot.state == QpState::RESET,
            "only a queue pair in RESET owns no work request"
        );
        let qp_num = slot.qp_num;
        let flush = |recv: bool, tail: u64| {
            let mut wc = <sys::ibv_wc as sys::Zeroed>::zeroed();
            wc.wr_id = id::ring(recv, qp.index, tail.wrapping_sub(1));
            wc.status = WcStatus::WR_FLUSH_ERR;
            wc.qp_num = qp_num;
            wc
        };
        let wcs = [
            flush(false, slot.send.next_seq()),
            flush(true, slot.recv.next_seq()),
        ];
        self.route_as(&wcs, true, on_done);
        Ok(())
    }

    /// A reset's bookkeeping half: `qp` to ERR (the device flushes what it
    /// holds), the flushes handed back while `settling()` says to wait for
    /// them, then RESET, where the device owns no work request and the rest
    /// is handed back as flushed.
    pub(crate) fn flush_to_reset(
        &mut self,
        qp: QpId,
        mut settling: impl FnMut() -> bool,
        on_done: &mut impl FnMut(CompletionRef<'_, B, P>),
    ) -> Result<(), Error> {
        self.set_state(qp, QpState::ERR)?;
        while self.in_flight(qp)? != (0, 0) && settling() {
            self.poll(&mut *on_done)?;
        }
        self.set_state(qp, QpState::RESET)?;
        self.retire_all(qp, on_done)?;
        self.slot_mut(qp)?.unsignaled_run = 0;
        Ok(())
    }

    /// Moves `qp` to ERR or RESET through the provider.
    fn set_state(&mut self, qp: QpId, state: QpState) -> Result<(), Error> {
        let (prov, slot) = self.split(qp)?;
        let handle = slot
            .qp
            .as_ref()
            .ok_or(Error::invalid(site!("queue pair")))?;
        prov.set_state(handle, state)?;
        slot.set_state(state);
        Ok(())
    }

    /// Waits for the next completion entry and returns its request, taking
    /// one entry off the CQ at a time (later ones stay queued). The
    /// unsignaled requests an entry finishes with it are dropped here
    /// (their buffers freed, the device done with them): with unsignaled
    /// requests, use [`Engine::poll`].
    pub fn wait_one(&mut self, deadline: Deadline) -> Result<Completion<B>, Error> {
        loop {
            let mut last = None;
            let mut keep = |c: CompletionRef<'_, B, P>| last = Some(c.into_owned());
            if self.poll_cq(false, 1, &mut keep)? == 0 && self.recv_cq.is_some() {
                self.poll_cq(true, 1, &mut keep)?;
            }
            if let Some(c) = last {
                return Ok(c);
            }
            if deadline.passed() {
                return Err(Error::new(DEAD_PEER, ErrorKind::TimedOut));
            }
            core::hint::spin_loop();
        }
    }
}
