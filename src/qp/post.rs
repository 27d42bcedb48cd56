//! The safe data path: posting moves buffers into the queue pair's
//! in-flight table, polling hands them back with their completions.
//! No heap allocation, no lock: the work requests and scatter/gather lists
//! are built on the stack, the tables were sized at creation.
#![allow(unsafe_code)]

use core::mem::MaybeUninit;

use crate::cq::{WcOpcode, WcStatus, WorkCompletion};
use crate::error::{Error, ErrorKind};
use crate::memory::LocalBuf;
use crate::sys::{self, ibv_send_flags as F, Zeroed};
use crate::time::Deadline;
use crate::wr::{Local, RecvRequest, SendOp, SendRequest, MAX_SGE};

use super::completion_ref::{CompletionRef, Origin};
use super::inflight::{Completion, InFlight};
use super::{QpState, QueuePair};

/// Most completion entries one poll takes off a CQ.
const POLL_BATCH: usize = 16;

/// Most requests posted with one doorbell by [`QueuePair::post_send_chain`].
pub const MAX_CHAIN: usize = 32;

/// Work request ids: bit 63 marks the receive queue, bit 62 a send posted
/// through the raw API or a prepared receive (`PREPARED_RECV`); the rest
/// is the in-flight sequence number, or for a prepared receive the index
/// of its entry.
pub(super) const RECV_BIT: u64 = 1 << 63;
const RAW_BIT: u64 = 1 << 62;
pub(super) const SEQ_MASK: u64 = RAW_BIT - 1;

/// The id bits of a prepared receive, whose low 32 bits name its entry.
pub(super) const PREPARED_RECV: u64 = RECV_BIT | RAW_BIT;

/// What to check when a wait for a completion times out.
const DEAD_PEER_HINT: &str = "is the peer alive and connected? an RC QP retries for timeout x \
     retry_cnt (Soft-RoCE treats retry_cnt 7 as forever)";

/// A refused post: the error and the request, with its buffers, given back.
#[derive(Debug)]
pub struct PostError<R> {
    /// Why it was refused.
    pub error: Error,
    /// The request, untouched.
    pub request: R,
}

impl<R> core::fmt::Display for PostError<R> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        self.error.fmt(f)
    }
}

/// Scatter/gather entries of a request's local buffers (a prefix of
/// `locals`, as the request types keep them): their count and total length.
#[inline]
pub(super) fn fill_sges<B: LocalBuf>(
    locals: &[Option<Local<B>>; MAX_SGE],
    sges: &mut [sys::ibv_sge; MAX_SGE],
) -> Result<(i32, u64), Error> {
    let mut n = 0;
    let mut total = 0;
    for (sge, l) in sges.iter_mut().zip(locals) {
        let Some(l) = l else { break };
        let Ok(length) = u32::try_from(l.len) else {
            return Err(Error::invalid("post", "a scatter/gather entry over 4 GiB"));
        };
        *sge = sys::ibv_sge {
            addr: l.buf.addr() + l.offset as u64,
            length,
            lkey: l.buf.lkey(),
        };
        n += 1;
        total += u64::from(length);
    }
    Ok((n, total))
}

pub(super) fn expected_opcode(op: &SendOp) -> WcOpcode {
    match op {
        SendOp::Write(_) | SendOp::WriteImm(..) => WcOpcode::RDMA_WRITE,
        SendOp::Read(_) => WcOpcode::RDMA_READ,
        SendOp::Send | SendOp::SendImm(_) => WcOpcode::SEND,
        SendOp::FetchAdd { .. } => WcOpcode::FETCH_ADD,
        SendOp::CompareSwap { .. } => WcOpcode::COMP_SWAP,
    }
}

/// Fills `wr` for `op`, checking what the NIC would otherwise reject late.
#[inline]
fn fill_op(wr: &mut sys::ibv_send_wr, op: &SendOp, local_len: u64) -> Result<(), Error> {
    use sys::ibv_wr_opcode as O;
    let rdma = |wr: &mut sys::ibv_send_wr, r: &crate::wr::RemoteSlice| -> Result<(), Error> {
        if local_len > r.len {
            return Err(Error::invalid(
                "post_send",
                "local data longer than the remote slice",
            ));
        }
        wr.wr.rdma = sys::ibv_send_wr_rdma {
            remote_addr: r.addr,
            rkey: r.rkey,
        };
        Ok(())
    };
    let atomic = |wr: &mut sys::ibv_send_wr,
                  r: &crate::wr::RemoteSlice,
                  a: u64,
                  b: u64|
     -> Result<(), Error> {
        if r.addr % 8 != 0 || r.len < 8 {
            return Err(Error::invalid(
                "post_send(atomic)",
                "the remote target must be an 8-byte aligned word",
            )
            .with_hint("atomics work on 8-byte aligned 64-bit words"));
        }
        if local_len != 8 {
            return Err(Error::invalid(
                "post_send(atomic)",
                "the local result buffer must be exactly 8 bytes",
            ));
        }
        wr.wr.atomic = sys::ibv_send_wr_atomic {
            remote_addr: r.addr,
            compare_add: a,
            swap: b,
            rkey: r.rkey,
        };
        Ok(())
    };
    match op {
        SendOp::Write(r) => {
            wr.opcode = O::RDMA_WRITE;
            rdma(wr, r)
        }
        SendOp::WriteImm(r, imm) => {
            wr.opcode = O::RDMA_WRITE_WITH_IMM;
            wr.imm_data = imm.to_be();
            rdma(wr, r)
        }
        SendOp::Read(r) => {
            wr.opcode = O::RDMA_READ;
            rdma(wr, r)
        }
        SendOp::Send => {
            wr.opcode = O::SEND;
            Ok(())
        }
        SendOp::SendImm(imm) => {
            wr.opcode = O::SEND_WITH_IMM;
            wr.imm_data = imm.to_be();
            Ok(())
        }
        SendOp::FetchAdd { remote, add } => {
            wr.opcode = O::ATOMIC_FETCH_AND_ADD;
            atomic(wr, remote, *add, 0)
        }
        SendOp::CompareSwap {
            remote,
            compare,
            swap,
        } => {
            wr.opcode = O::ATOMIC_CMP_AND_SWP;
            atomic(wr, remote, *compare, *swap)
        }
    }
}

impl<B: LocalBuf> QueuePair<B> {
    #[inline]
    pub(super) fn check_can_send(&self, call: &'static str, extra: u64) -> Result<(), Error> {
        if self.send.len() + extra > self.send_room {
            return Err(self.cannot_send(call));
        }
        Ok(())
    }

    #[cold]
    fn cannot_send(&self, call: &'static str) -> Error {
        if self.state != QpState::RTS {
            return Error::new(call, ErrorKind::BadState)
                .with_detail("sends need the queue pair in RTS")
                .with_hint(
                    "connect() first; after an error completion the QP is in ERR: reset() it",
                );
        }
        Error::new(call, ErrorKind::QueueFull)
            .with_detail("the send queue holds max_send_wr requests in flight")
            .with_hint(
                "poll completions to return buffers, or create the QP with a deeper send queue",
            )
    }

    /// Refuses inline data the device cannot take: above the granted
    /// `max_inline_data`, or for an operation that carries none.
    #[inline]
    fn check_inline(&self, call: &'static str, op: &SendOp, len: u64) -> Result<(), Error> {
        let too_long = len > u64::from(self.caps.max_inline_data);
        let no_data_out = matches!(
            op,
            SendOp::Read(_) | SendOp::FetchAdd { .. } | SendOp::CompareSwap { .. }
        );
        if too_long || no_data_out {
            return Err(inline_refused(call, too_long));
        }
        Ok(())
    }

    /// Fills `sges` from `req`'s buffers and `wr`'s operation, and checks
    /// inline data against the device; returns the number of entries.
    #[inline]
    pub(super) fn fill_checked(
        &self,
        call: &'static str,
        req: &SendRequest<B>,
        wr: &mut sys::ibv_send_wr,
        sges: &mut [sys::ibv_sge; MAX_SGE],
    ) -> Result<i32, Error> {
        let (num_sge, len) = fill_sges(&req.locals, sges)?;
        fill_op(wr, &req.op, len)?;
        if req.flags.inline {
            self.check_inline(call, &req.op, len)?;
        }
        Ok(num_sge)
    }

    /// [`signal_decision`] on this queue pair's send queue.
    #[inline]
    fn decide_signal(&mut self, asked: bool, remaining_in_chain: u64) -> bool {
        signal_decision(
            &mut self.unsignaled_run,
            self.send.capacity(),
            asked,
            remaining_in_chain,
        )
    }

    /// Fills `wr` (zeroed by the caller) and `sges` for `req`.
    #[inline]
    fn build_send(
        &mut self,
        req: &SendRequest<B>,
        wr: &mut sys::ibv_send_wr,
        sges: &mut [sys::ibv_sge; MAX_SGE],
        seq: u64,
        remaining: u64,
    ) -> Result<bool, Error> {
        wr.num_sge = self.fill_checked("post_send", req, wr, sges)?;
        wr.sg_list = sges.as_mut_ptr();
        let signaled = self.decide_signal(req.flags.signaled, remaining);
        wr.wr_id = seq;
        let f = req.flags;
        wr.send_flags = flags(signaled, f.fence, f.solicited, f.inline);
        Ok(signaled)
    }

    /// Posts one send-queue request. Its buffers belong to the queue pair
    /// until [`poll`](QueuePair::poll) hands them back with the completion.
    // Always inlined, as are post_recv and poll: out of line, the call and
    // the large Result returned through memory cost about as much as the
    // checks (callgrind).
    #[inline(always)]
    // The refused request comes back by value (no Box: no allocation).
    #[allow(clippy::result_large_err)]
    pub fn post_send(&mut self, mut req: SendRequest<B>) -> Result<(), PostError<SendRequest<B>>> {
        let mut wr = sys::ibv_send_wr::zeroed();
        let mut sges = [sys::ibv_sge::default(); MAX_SGE];
        let run = self.unsignaled_run;
        let seq = self.send.next_seq();
        let built = self
            .check_can_send("post_send", 1)
            .and_then(|()| self.build_send(&req, &mut wr, &mut sges, seq, 0));
        let signaled = match built {
            Ok(s) => s,
            Err(error) => {
                return Err(PostError {
                    error,
                    request: req,
                })
            }
        };
        let mut bad = core::ptr::null_mut();
        // SAFETY: live QP; `wr` and `sges` are valid for the call and point
        // at buffers owned by `req`, which moves into the in-flight table
        // below and stays there until the request completes.
        let rc = unsafe { sys::verbs_shim_post_send(self.qp.as_ptr(), &mut wr, &mut bad) };
        if let Err(error) = crate::ret::check_rc("ibv_post_send", rc) {
            self.unsignaled_run = run;
            return Err(PostError {
                error: post_hint(error),
                request: req,
            });
        }
        let opcode = expected_opcode(&req.op);
        self.send.push(req.tag, opcode, signaled, &mut req.locals);
        // `push` took every buffer: nothing is left to drop (and the
        // compiler cannot see that).
        core::mem::forget(req);
        Ok(())
    }

    /// Posts up to [`MAX_CHAIN`] requests with one call (one doorbell),
    /// taking each posted request out of `reqs`. On a partial post the
    /// requests from the failed one on stay in `reqs`, untouched and not
    /// posted, and the error says so; `Ok(n)` is the number posted.
    pub fn post_send_chain(&mut self, reqs: &mut [Option<SendRequest<B>>]) -> Result<usize, Error> {
        let count = reqs
            .iter()
            .take_while(|r| r.is_some())
            .count()
            .min(MAX_CHAIN);
        if count == 0 {
            return Ok(0);
        }
        self.check_can_send("post_send_chain", count as u64)?;
        // Only the first `count` entries are written and handed to the
        // provider: zeroing all MAX_CHAIN of them (6 KiB) cost more per
        // request than building the requests did.
        let mut wrs = [const { MaybeUninit::<sys::ibv_send_wr>::uninit() }; MAX_CHAIN];
        let mut sges = [const { MaybeUninit::<[sys::ibv_sge; MAX_SGE]>::uninit() }; MAX_CHAIN];
        let mut signaled = [false; MAX_CHAIN];
        let run = self.unsignaled_run;
        let first = self.send.next_seq();
        for i in 0..count {
            let Some(req) = reqs[i].as_ref() else { break };
            let remaining = (count - 1 - i) as u64;
            let wr = wrs[i].write(sys::ibv_send_wr::zeroed());
            let sge = sges[i].write([sys::ibv_sge::default(); MAX_SGE]);
            match self.build_send(req, wr, sge, first + i as u64, remaining) {
                Ok(s) => signaled[i] = s,
                Err(e) => {
                    self.unsignaled_run = run;
                    return Err(e);
                }
            }
        }
        let chain = wrs.as_mut_ptr().cast::<sys::ibv_send_wr>();
        for i in 0..count - 1 {
            // SAFETY: entries 0..count were written in the loop above (it
            // returned early otherwise), and i + 1 < count.
            unsafe { (*chain.add(i)).next = chain.add(i + 1) };
        }
        let mut bad: *mut sys::ibv_send_wr = core::ptr::null_mut();
        // SAFETY: live QP; the chain (its first `count` entries, written
        // above, the last one's `next` NULL from zeroed()) and their SGEs
        // live on this stack frame for the call; the buffers they name are
        // owned by `reqs`, from which every posted request moves into the
        // in-flight table below.
        let rc = unsafe { sys::verbs_shim_post_send(self.qp.as_ptr(), chain, &mut bad) };
        let result = crate::ret::check_rc("ibv_post_send", rc);
        let posted = match result {
            Ok(()) => count,
            Err(_) if !bad.is_null() => {
                (bad as usize - chain as usize) / core::mem::size_of::<sys::ibv_send_wr>()
            }
            Err(_) => 0,
        };
        for (i, req) in reqs.iter_mut().enumerate().take(posted) {
            if let Some(mut req) = req.take() {
                let opcode = expected_opcode(&req.op);
                self.send
                    .push(req.tag, opcode, signaled[i], &mut req.locals);
                core::mem::forget(req); // emptied by `push`
            }
        }
        if let Err(e) = result {
            self.unsignaled_run = run;
            return Err(post_hint(e)
                .with_detail("partial post: the requests from the failed one on were not posted"));
        }
        Ok(posted)
    }

    /// Posts a Write, Write-with-immediate or Send whose data is copied into
    /// the work request itself (`IBV_SEND_INLINE`): no local buffer, no lkey,
    /// `data` is free again on return. Refused above the device's granted
    /// `max_inline_data`.
    #[inline]
    pub fn post_inline(
        &mut self,
        op: SendOp,
        data: &[u8],
        tag: u64,
        signaled: bool,
    ) -> Result<(), Error> {
        self.check_can_send("post_inline", 1)?;
        self.check_inline("post_inline", &op, data.len() as u64)?;
        let mut wr = sys::ibv_send_wr::zeroed();
        fill_op(&mut wr, &op, data.len() as u64)?;
        let mut sge = sys::ibv_sge {
            addr: data.as_ptr() as u64,
            length: data.len() as u32,
            lkey: 0,
        };
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        let run = self.unsignaled_run;
        let signaled = self.decide_signal(signaled, 0);
        wr.wr_id = self.send.next_seq();
        wr.send_flags = flags(signaled, false, false, true);
        let mut bad = core::ptr::null_mut();
        // SAFETY: live QP; with IBV_SEND_INLINE the provider copies `data`
        // during the call, so the borrow need not outlive it.
        let rc = unsafe { sys::verbs_shim_post_send(self.qp.as_ptr(), &mut wr, &mut bad) };
        if let Err(e) = crate::ret::check_rc("ibv_post_send", rc) {
            self.unsignaled_run = run;
            return Err(post_hint(e));
        }
        self.send.push_bufless(tag, expected_opcode(&op), signaled);
        Ok(())
    }

    /// Posts a receive. Allowed from INIT on, so receives are in place
    /// before the peer's first send (else: RNR retries, `RNR_RETRY_EXC_ERR`).
    #[inline(always)]
    #[allow(clippy::result_large_err)]
    pub fn post_recv(&mut self, mut req: RecvRequest<B>) -> Result<(), PostError<RecvRequest<B>>> {
        if let Err(error) = self.check_can_recv() {
            return Err(PostError {
                error,
                request: req,
            });
        }
        let mut sges = [sys::ibv_sge::default(); MAX_SGE];
        let num_sge = match fill_sges(&req.locals, &mut sges) {
            Ok((n, _)) => n,
            Err(error) => {
                return Err(PostError {
                    error,
                    request: req,
                })
            }
        };
        let mut wr = sys::ibv_recv_wr {
            wr_id: RECV_BIT | self.recv.next_seq(),
            next: core::ptr::null_mut(),
            sg_list: sges.as_mut_ptr(),
            num_sge,
        };
        let mut bad = core::ptr::null_mut();
        // SAFETY: live QP; `wr`/`sges` valid for the call; the buffers move
        // into the in-flight table below until the receive completes.
        let rc = unsafe { sys::verbs_shim_post_recv(self.qp.as_ptr(), &mut wr, &mut bad) };
        if let Err(error) = crate::ret::check_rc("ibv_post_recv", rc) {
            return Err(PostError {
                error,
                request: req,
            });
        }
        self.recv
            .push(req.tag, WcOpcode::RECV, true, &mut req.locals);
        core::mem::forget(req); // emptied by `push`
        Ok(())
    }

    /// Refuses a receive unless the queue pair takes one now: past RESET,
    /// not in ERR, no shared receive queue, room in the receive queue.
    #[inline(always)]
    pub(super) fn check_can_recv(&self) -> Result<(), Error> {
        if self.recv.len() >= self.recv_room {
            return Err(self.cannot_recv());
        }
        Ok(())
    }

    #[cold]
    pub(super) fn cannot_recv(&self) -> Error {
        if self.state == QpState::RESET || self.state == QpState::ERR {
            Error::new("post_recv", ErrorKind::BadState)
                .with_detail("receives need INIT, RTR or RTS")
        } else if self.has_srq {
            Error::new("post_recv", ErrorKind::BadState)
                .with_detail("this queue pair receives through its shared receive queue")
        } else {
            Error::new("post_recv", ErrorKind::QueueFull)
                .with_detail("max_recv_wr receives already posted")
        }
    }

    /// Posts a memory-window bind (`IBV_WR_BIND_MW`, always signaled) that
    /// the arena built; it comes back from `poll` with opcode `BIND_MW`.
    pub(crate) fn post_bind(&mut self, wr: &mut sys::ibv_send_wr, tag: u64) -> Result<(), Error> {
        self.check_can_send("bind memory window", 1)?;
        wr.wr_id = self.send.next_seq();
        wr.send_flags = F::SIGNALED;
        self.unsignaled_run = 0;
        let mut bad = core::ptr::null_mut();
        // SAFETY: live QP; `wr` is a complete bind request whose window,
        // region and range the caller (arena::window) keeps alive until the
        // window is deallocated.
        let rc = unsafe { sys::verbs_shim_post_send(self.qp.as_ptr(), wr, &mut bad) };
        crate::ret::check_rc("ibv_post_send(BIND_MW)", rc).map_err(post_hint)?;
        self.send.push_bufless(tag, WcOpcode::BIND_MW, true);
        Ok(())
    }

    /// Posts a raw send work request chain, bypassing the in-flight table.
    /// Its completion comes back from [`poll`](QueuePair::poll) with the
    /// `wr_id` (below 2^62) as tag and no buffers.
    ///
    /// # Safety
    ///
    /// Every scatter/gather entry must name memory registered in this QP's
    /// PD that stays valid, and is neither read nor written by anyone but
    /// the NIC, until the request's completion (or that of a later signaled
    /// request) has been polled; `wr_id`s must be below 2^62.
    pub unsafe fn post_send_raw(&mut self, wr: &mut sys::ibv_send_wr) -> Result<(), Error> {
        let mut cur: *mut sys::ibv_send_wr = wr;
        while !cur.is_null() {
            // SAFETY: the caller passes a valid, NULL-terminated chain.
            unsafe {
                (*cur).wr_id |= RAW_BIT;
                cur = (*cur).next;
            }
        }
        let mut bad = core::ptr::null_mut();
        // SAFETY: live QP; the caller upholds the memory contract above.
        let rc = unsafe { sys::verbs_shim_post_send(self.qp.as_ptr(), wr, &mut bad) };
        crate::ret::check_rc("ibv_post_send", rc).map_err(post_hint)
    }

    /// Polls the completion queue once (each of the two with
    /// `QpConfig::separate_recv_cq`), up to 16 entries, and hands every
    /// finished request to `on_done` with its buffers, in completion order:
    /// an unsignaled request is handed back (as `SUCCESS`, `signaled:
    /// false`) when the next signaled request of its queue completes.
    /// Returns the number handed back. Never blocks, never allocates.
    #[inline(always)]
    pub fn poll(&mut self, mut on_done: impl FnMut(Completion<B>)) -> Result<usize, Error> {
        self.poll_both(|c| on_done(c.into_owned()))
    }

    /// [`QueuePair::poll`], lending each finished request instead of
    /// building a [`Completion`]: fields are read from the entry on demand
    /// and a buffer moves only on `take_buf`; buffers the callback leaves
    /// are dropped when it returns. The cheapest way to poll.
    #[inline(always)]
    pub fn poll_ref(&mut self, on_done: impl FnMut(CompletionRef<'_, B>)) -> Result<usize, Error> {
        self.poll_both(on_done)
    }

    /// [`QueuePair::poll_ref`] on the send queue's CQ only: with
    /// `QpConfig::separate_recv_cq`, receive completions stay queued for
    /// [`QueuePair::poll_recv_ref`]. Without it, the same as `poll_ref`.
    #[inline(always)]
    pub fn poll_send_ref(
        &mut self,
        mut on_done: impl FnMut(CompletionRef<'_, B>),
    ) -> Result<usize, Error> {
        self.poll_cq(false, POLL_BATCH, &mut on_done)
    }

    /// [`QueuePair::poll_ref`] on the receive queue's CQ only (see
    /// [`QueuePair::poll_send_ref`]).
    #[inline(always)]
    pub fn poll_recv_ref(
        &mut self,
        mut on_done: impl FnMut(CompletionRef<'_, B>),
    ) -> Result<usize, Error> {
        self.poll_cq(true, POLL_BATCH, &mut on_done)
    }

    /// Polls the send queue's CQ and, if separate, the receive queue's.
    #[inline(always)]
    fn poll_both(&mut self, mut on_done: impl FnMut(CompletionRef<'_, B>)) -> Result<usize, Error> {
        let mut delivered = self.poll_cq(false, POLL_BATCH, &mut on_done)?;
        if self.recv_cq.is_some() {
            delivered += self.poll_cq(true, POLL_BATCH, &mut on_done)?;
        }
        Ok(delivered)
    }

    /// Takes at most `max` (≤ `POLL_BATCH`) entries off the receive queue's
    /// CQ if `recv`, else off the send queue's (the same one unless
    /// separate).
    #[inline(always)]
    fn poll_cq(
        &mut self,
        recv: bool,
        max: usize,
        on_done: &mut impl FnMut(CompletionRef<'_, B>),
    ) -> Result<usize, Error> {
        let cq = match &self.recv_cq {
            Some(recv_cq) if recv => recv_cq.as_raw(),
            _ => self.cq.as_raw(),
        };
        // Uninitialized: zeroing 768 bytes per poll showed up in profiles.
        let mut wcs = [core::mem::MaybeUninit::<WorkCompletion>::uninit(); POLL_BATCH];
        let wcs = &mut wcs[..max.clamp(1, POLL_BATCH)];
        // SAFETY: the QP holds its CQs (`self.cq`, `self.recv_cq`) alive.
        let polled = unsafe { crate::cq::poll_uninit_raw(cq, wcs)? };
        // The common case apart: one successful completion of its queue's
        // oldest request. Out of the loop it carries none of the loop's
        // state (send_lat: 325 to 252 instructions per round trip).
        if let [wc] = polled {
            if wc.wr_id() & PREPARED_RECV == PREPARED_RECV {
                return Ok(self.retire_prepared_recv(wc, on_done));
            }
            let is_recv = wc.wr_id() & RECV_BIT != 0;
            let queue = self.in_flight_table(is_recv);
            // Raw and shared-receive-queue ids have bits set that no
            // sequence number reaches: `through` is 0 for them.
            if wc.status() == WcStatus::SUCCESS && queue.through(wc.wr_id() & !RECV_BIT) == 1 {
                on_done(CompletionRef {
                    wc,
                    origin: Origin::Slot(queue.pop_oldest()),
                    own_entry: true,
                    is_recv,
                });
                return Ok(1);
            }
        }
        let mut delivered = 0;
        for wc in polled {
            delivered += self.retire(wc, on_done);
        }
        Ok(delivered)
    }

    /// Polls until at least one request is handed back, or `deadline`
    /// passes (a `TimedOut` error: a dead peer never hangs the caller).
    pub fn wait(
        &mut self,
        deadline: Deadline,
        mut on_done: impl FnMut(Completion<B>),
    ) -> Result<usize, Error> {
        loop {
            let n = self.poll(&mut on_done)?;
            if n > 0 {
                return Ok(n);
            }
            if deadline.passed() {
                return Err(Error::new("wait for a completion", ErrorKind::TimedOut)
                    .with_hint(DEAD_PEER_HINT));
            }
            core::hint::spin_loop();
        }
    }

    /// Sleeps (no CPU) until at least one request is handed back, or
    /// `deadline` passes. Needs `QpConfig::events`. With `solicited_only`,
    /// only a solicited (or error) completion wakes the thread; others are
    /// handed back at the next wake-up.
    ///
    /// The sequence that cannot miss a wake-up: poll; arm; poll again (a
    /// completion may have arrived before arming, and produces no event);
    /// only then sleep on the channel, and read it until it would block.
    pub fn wait_event(
        &mut self,
        deadline: Deadline,
        solicited_only: bool,
        mut on_done: impl FnMut(Completion<B>),
    ) -> Result<usize, Error> {
        loop {
            let n = self.poll(&mut on_done)?;
            if n > 0 {
                return Ok(n);
            }
            self.cq.req_notify(solicited_only)?;
            let n = self.poll(&mut on_done)?;
            if n > 0 {
                return Ok(n);
            }
            if deadline.passed() {
                return Err(Error::new(
                    "wait for a completion event",
                    ErrorKind::TimedOut,
                ));
            }
            let ms = deadline.remaining().as_millis().clamp(1, i32::MAX as u128) as i32;
            self.cq.wait_readable(ms)?;
        }
    }

    /// Waits for the next completion entry and returns its request. It
    /// takes one entry off the CQ at a time, so later completions stay
    /// queued for the next call. For posting with unsignaled requests use
    /// [`QueuePair::wait`]: the unsignaled requests a completion returns
    /// with it are dropped here (their buffers freed, never lost to the NIC).
    pub fn wait_one(&mut self, deadline: Deadline) -> Result<Completion<B>, Error> {
        loop {
            let mut last = None;
            // Completions come in post order: the signaled one is the last.
            // One entry of one CQ per call: the receive CQ only when the
            // send CQ (if separate) had nothing.
            let mut keep = |c: CompletionRef<'_, B>| last = Some(c.into_owned());
            if self.poll_cq(false, 1, &mut keep)? == 0 && self.recv_cq.is_some() {
                self.poll_cq(true, 1, &mut keep)?;
            }
            if let Some(c) = last {
                return Ok(c);
            }
            if deadline.passed() {
                return Err(Error::new("wait for a completion", ErrorKind::TimedOut)
                    .with_hint(DEAD_PEER_HINT));
            }
            core::hint::spin_loop();
        }
    }

    /// The in-flight table of the receive queue if `recv`, else of the send
    /// queue.
    #[inline(always)]
    fn in_flight_table(&mut self, recv: bool) -> &mut InFlight<B> {
        if recv {
            &mut self.recv
        } else {
            &mut self.send
        }
    }

    /// Hands back the requests completion `wc` finishes: on its queue, every
    /// request up to the one it names (the earlier ones were unsignaled).
    #[inline(always)]
    fn retire(
        &mut self,
        wc: &WorkCompletion,
        on_done: &mut impl FnMut(CompletionRef<'_, B>),
    ) -> usize {
        let id = wc.wr_id();
        if id & PREPARED_RECV == PREPARED_RECV {
            return self.retire_prepared_recv(wc, on_done);
        }
        if wc.status() != WcStatus::SUCCESS {
            self.set_state(QpState::ERR); // every later request will flush
        }
        let is_recv = id & RECV_BIT != 0;
        let queue = self.in_flight_table(is_recv);
        // The ids of raw posts and of receives on a shared receive queue have
        // a bit set that no sequence number reaches: never in flight here.
        let mut count = queue.through(id & !RECV_BIT);
        // No slot here: a raw post (no buffers), or a receive on a shared
        // receive queue (its buffers are with the SRQ). Otherwise a stale id.
        let foreign = count == 0 && !is_recv && id & (crate::srq::SRQ_BIT | RAW_BIT) != 0;
        let mut handed_as_recv = is_recv;
        if foreign {
            count = 1;
            handed_as_recv = id & RAW_BIT == 0;
        }
        let delivered = count as usize;
        // One call site of `on_done`, so that the caller's closure is inlined.
        while count > 0 {
            count -= 1;
            on_done(CompletionRef {
                wc,
                origin: if foreign {
                    Origin::Foreign
                } else {
                    Origin::Slot(queue.pop_oldest())
                },
                own_entry: count == 0,
                is_recv: handed_as_recv,
            });
        }
        delivered
    }

    /// Hands back the prepared receive completion `wc` names (its entry,
    /// not a slot: see `PreparedTable::complete_recv`).
    #[inline(always)]
    fn retire_prepared_recv(
        &mut self,
        wc: &WorkCompletion,
        on_done: &mut impl FnMut(CompletionRef<'_, B>),
    ) -> usize {
        if wc.status() != WcStatus::SUCCESS {
            self.set_state(QpState::ERR); // every later request will flush
        }
        let index = wc.wr_id() as u32;
        // An id no receive in flight carries (never: ids are ours).
        let Some((tag, generation)) = self.prepared.complete_recv(index) else {
            return 0;
        };
        on_done(CompletionRef {
            wc,
            origin: Origin::PreparedRecv {
                tag,
                index,
                generation,
            },
            own_entry: true,
            is_recv: true,
        });
        1
    }
}

#[inline]
pub(super) fn flags(signaled: bool, fence: bool, solicited: bool, inline: bool) -> F {
    let mut f = F::EMPTY;
    if signaled {
        f |= F::SIGNALED;
    }
    if fence {
        f |= F::FENCE;
    }
    if solicited {
        f |= F::SOLICITED;
    }
    if inline {
        f |= F::INLINE;
    }
    f
}

/// Signals a request if the caller asked, or if leaving it unsignaled could
/// let unsignaled requests fill the send queue (a deadlock: their slots are
/// freed only by a later signaled completion). `run` counts the unsignaled
/// requests since the last signaled one.
#[inline(always)]
pub(super) fn signal_decision(run: &mut u64, capacity: u64, asked: bool, remaining: u64) -> bool {
    if asked || *run + 1 + remaining >= capacity / 2 {
        *run = 0;
        true
    } else {
        *run += 1;
        false
    }
}

#[cold]
pub(super) fn post_hint(e: Error) -> Error {
    match e.errno() {
        Some(libc::ENOMEM) => {
            e.with_hint("the send queue is full on the device side: poll completions")
        }
        Some(libc::EINVAL) => {
            e.with_hint("too many SGEs, inline data above max_inline_data, or a bad opcode for RC")
        }
        _ => e,
    }
}

#[cold]
fn inline_refused(call: &'static str, too_long: bool) -> Error {
    if too_long {
        return Error::invalid(
            call,
            "inline data larger than the max_inline_data the device granted",
        )
        .with_hint("use a registered buffer, or ask for more max_inline_data in QpConfig");
    }
    Error::invalid(
        call,
        "only Write, Write-with-immediate and Send can be inline",
    )
}
