//! The doorbell: where the engine hands work requests to the device. Every
//! pointer a work request carries is set here, and every post here records
//! (or is recorded by the caller in the same step) who owns the memory the
//! request names until it completes.
//!
//! # Safety
//!
//! The one engine module allowed `unsafe`. A post is sound because, for as
//! long as the device may use a request's memory:
//! - an own-buffer request's buffers are in its ring slot, moved there by
//!   the function that posted it ([`send`], [`recv`]), and a ring slot is
//!   emptied only by a completion of its sequence number or a later one
//!   (`ring.rs`, `poll.rs`) or after its queue pair was destroyed
//!   successfully (`core.rs`);
//! - a prepared request's buffers stay in its table entry, which refuses
//!   loans, copies and release while its latest post is in flight
//!   (`prepared.rs`, `PreparedTable::idle`);
//! - a shared-receive-queue receive's buffers are in its slot until its
//!   completion or the queue's successful destroy (`srq.rs`);
//! - a window bind names a window and a region its [`ExposedBuf`] keeps
//!   alive (`memory/exposed.rs`), and inline data is copied by the provider
//!   during the post.
//!
//! [`ExposedBuf`]: crate::ExposedBuf
#![allow(unsafe_code)]

use alloc::boxed::Box;
use alloc::sync::Arc;
use core::mem::MaybeUninit;
use core::ptr::NonNull;

use crate::error::Error;
use crate::memory::{ArenaBuf, NicBuf};
use crate::raw::{PageMemory, PostFailed, RawCq, RawMr, RawMw, RawQp, RawSrq};
use crate::sgl::{Sgl, MAX_SGE};
use crate::site;
use crate::sys::{self, ibv_send_flags as F, ibv_wr_opcode as O, Zeroed};
use crate::wr::SendOp;

use super::ring::Ring;

/// Where an engine's work requests go: the device ([`Verbs`]) or, in the
/// crate's own tests, a simulated device that checks the bookkeeping.
pub trait Provider {
    /// A queue pair's handle.
    type Qp;
    /// A completion queue's handle.
    type Cq;
    /// A shared receive queue's handle.
    type Srq;

    /// Posts `wrs` as one chain on `qp`'s send queue.
    ///
    /// # Safety
    ///
    /// As `RawQp::post_send`: every scatter/gather entry names memory
    /// that stays valid, and that only the device touches, until the
    /// request completes (or a later signaled one on this queue does).
    unsafe fn post_send(
        &mut self,
        qp: &Self::Qp,
        wrs: &mut [sys::ibv_send_wr],
    ) -> Result<(), PostFailed>;

    /// Posts `wrs` as one chain on `qp`'s receive queue.
    ///
    /// # Safety
    ///
    /// As [`Provider::post_send`], until each receive completes.
    unsafe fn post_recv(
        &mut self,
        qp: &Self::Qp,
        wrs: &mut [sys::ibv_recv_wr],
    ) -> Result<(), PostFailed>;

    /// Posts `wrs` as one chain on the shared receive queue.
    ///
    /// # Safety
    ///
    /// As [`Provider::post_recv`].
    unsafe fn post_srq_recv(
        &mut self,
        srq: &Self::Srq,
        wrs: &mut [sys::ibv_recv_wr],
    ) -> Result<(), PostFailed>;

    /// Takes up to `out.len()` completions off `cq`.
    fn poll<'a>(
        &mut self,
        cq: &Self::Cq,
        out: &'a mut [MaybeUninit<sys::ibv_wc>],
    ) -> Result<&'a [sys::ibv_wc], Error>;

    /// Destroys a queue pair; on failure it is leaked and so must be the
    /// buffers posted to it.
    fn destroy_qp(&mut self, qp: Self::Qp) -> Result<(), Error>;

    /// Destroys the shared receive queue; on failure as `destroy_qp`.
    fn destroy_srq(&mut self, srq: Self::Srq) -> Result<(), Error>;
}

/// The device: every call goes to libibverbs through the raw layer.
pub struct Verbs {
    pub(crate) pd: crate::pd::ProtectionDomain,
    /// False where windows do not enforce their bounds (Soft-RoCE).
    pub(crate) windows_bounded: bool,
}

impl Provider for Verbs {
    type Qp = RawQp;
    type Cq = Arc<RawCq>;
    type Srq = Arc<RawSrq>;

    #[inline(always)]
    unsafe fn post_send(
        &mut self,
        qp: &RawQp,
        wrs: &mut [sys::ibv_send_wr],
    ) -> Result<(), PostFailed> {
        // SAFETY: the caller's contract is RawQp::post_send's.
        unsafe { qp.post_send(wrs) }
    }

    #[inline(always)]
    unsafe fn post_recv(
        &mut self,
        qp: &RawQp,
        wrs: &mut [sys::ibv_recv_wr],
    ) -> Result<(), PostFailed> {
        // SAFETY: the caller's contract is RawQp::post_recv's.
        unsafe { qp.post_recv(wrs) }
    }

    #[inline(always)]
    unsafe fn post_srq_recv(
        &mut self,
        srq: &Arc<RawSrq>,
        wrs: &mut [sys::ibv_recv_wr],
    ) -> Result<(), PostFailed> {
        // SAFETY: the caller's contract is RawSrq::post_recv's.
        unsafe { srq.post_recv(wrs) }
    }

    #[inline(always)]
    fn poll<'a>(
        &mut self,
        cq: &Arc<RawCq>,
        out: &'a mut [MaybeUninit<sys::ibv_wc>],
    ) -> Result<&'a [sys::ibv_wc], Error> {
        cq.poll(out)
    }

    fn destroy_qp(&mut self, qp: RawQp) -> Result<(), Error> {
        qp.destroy()
    }

    fn destroy_srq(&mut self, srq: Arc<RawSrq>) -> Result<(), Error> {
        match Arc::try_unwrap(srq) {
            Ok(srq) => srq.destroy(),
            // A leaked queue pair still holds it: it stays, and so must its buffers.
            Err(shared) => {
                core::mem::forget(shared);
                Err(Error::os(
                    site!("ibv_destroy_srq", "a leaked queue pair still uses it"),
                    libc::EBUSY,
                ))
            }
        }
    }
}

/// What the ring records of a posted send besides its buffers.
#[derive(Clone, Copy)]
pub(crate) struct SendMeta {
    pub(crate) tag: u64,
    pub(crate) opcode: sys::ibv_wc_opcode,
    pub(crate) signaled: bool,
}

/// Flags of a send: the caller's, plus `SIGNALED` as decided.
#[inline(always)]
pub(crate) fn send_flags(signaled: bool, fence: bool, solicited: bool, inline: bool) -> F {
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

/// The work request of `op` with `wr_id` and `flags`, its scatter/gather
/// list not yet attached. Only data opcodes can be built here: no bind,
/// invalidate or TSO, whose union members carry pointers.
#[inline(always)]
fn send_wr(op: &SendOp, wr_id: u64, flags: F) -> sys::ibv_send_wr {
    let mut wr = sys::ibv_send_wr::zeroed();
    wr.wr_id = wr_id;
    wr.send_flags = flags;
    let rdma = |r: &crate::wr::RemoteSlice| sys::ibv_send_wr_wr {
        rdma: sys::ibv_send_wr_rdma {
            remote_addr: r.addr,
            rkey: r.rkey,
        },
    };
    let atomic = |r: &crate::wr::RemoteSlice, compare_add: u64, swap: u64| sys::ibv_send_wr_wr {
        atomic: sys::ibv_send_wr_atomic {
            remote_addr: r.addr,
            compare_add,
            swap,
            rkey: r.rkey,
        },
    };
    match op {
        SendOp::Write(r) => {
            wr.opcode = O::RDMA_WRITE;
            wr.wr = rdma(r);
        }
        SendOp::WriteImm(r, imm) => {
            wr.opcode = O::RDMA_WRITE_WITH_IMM;
            wr.imm_data = imm.to_be();
            wr.wr = rdma(r);
        }
        SendOp::Read(r) => {
            wr.opcode = O::RDMA_READ;
            wr.wr = rdma(r);
        }
        SendOp::Send => wr.opcode = O::SEND,
        SendOp::SendImm(imm) => {
            wr.opcode = O::SEND_WITH_IMM;
            wr.imm_data = imm.to_be();
        }
        SendOp::FetchAdd { remote, add } => {
            wr.opcode = O::ATOMIC_FETCH_AND_ADD;
            wr.wr = atomic(remote, *add, 0);
        }
        SendOp::CompareSwap {
            remote,
            compare,
            swap,
        } => {
            wr.opcode = O::ATOMIC_CMP_AND_SWP;
            wr.wr = atomic(remote, *compare, *swap);
        }
    }
    wr
}

/// An atomic writes its 8-byte result into the local entries: refuse a
/// list that does not hold exactly 8 bytes, so the device never writes past
/// the buffer it was given.
#[inline(always)]
fn check_atomic_result(op: &SendOp, total: u64) -> Result<(), Error> {
    if matches!(op, SendOp::FetchAdd { .. } | SendOp::CompareSwap { .. }) && total != 8 {
        return Err(Error::invalid(site!(
            "post_send(atomic)",
            "the local result buffer must be exactly 8 bytes"
        )));
    }
    Ok(())
}

/// One send of the caller's: its operation and buffers, and how to post it.
pub(crate) struct OwnSend<'a, B> {
    pub(crate) op: &'a SendOp,
    pub(crate) sgl: &'a mut Sgl<B>,
    pub(crate) meta: SendMeta,
    pub(crate) fence: bool,
    pub(crate) solicited: bool,
    /// Only requests of [`crate::HostBuf`]s get here with it set (see
    /// `SendRequest::inline`): the provider reads their bytes at post time.
    pub(crate) inline: bool,
}

/// Posts `sends` (a prefix of `Some`) as one chain on `qp` (one doorbell) and moves each posted
/// request's buffers into `ring`, whose next sequence numbers their ids
/// carry. Returns how many were posted, with the provider's refusal if it
/// took fewer than all. The caller checked the ring's room for all of them.
pub(crate) fn send<B: NicBuf, P: Provider>(
    prov: &mut P,
    qp: &P::Qp,
    qp_index: u32,
    ring: &mut Ring<B>,
    max_sge: u32,
    sends: &mut [Option<OwnSend<'_, B>>],
) -> (usize, Result<(), Error>) {
    const CHAIN: usize = super::MAX_CHAIN;
    let n = sends.iter().take_while(|s| s.is_some()).count().min(CHAIN);
    let mut wrs = [const { MaybeUninit::<sys::ibv_send_wr>::uninit() }; CHAIN];
    let mut sges = [[sys::ibv_sge::default(); MAX_SGE]; CHAIN];
    let first = ring.next_seq();
    for i in 0..n {
        let Some(s) = &sends[i] else { break };
        let built = s
            .sgl
            .build(max_sge, &mut sges[i])
            .and_then(|(num, total)| check_atomic_result(s.op, total).map(|()| num));
        let num = match built {
            Ok(num) => num,
            Err(e) => return (0, Err(e)),
        };
        let flags = send_flags(s.meta.signaled, s.fence, s.solicited, s.inline);
        let mut wr = send_wr(
            s.op,
            super::id::ring(false, qp_index, first + i as u64),
            flags,
        );
        wr.num_sge = num;
        wr.sg_list = sges[i].as_mut_ptr();
        wrs[i].write(wr);
    }
    // SAFETY: the first `n` entries were written in the loop above.
    let chain =
        unsafe { core::slice::from_raw_parts_mut(wrs.as_mut_ptr().cast::<sys::ibv_send_wr>(), n) };
    // SAFETY: each request's entries were built just now from its own list
    // (`Sgl::build`: buffers registered, ranges inside them), and every
    // posted request's list moves into its ring slot below, before anyone
    // can reach it again; a slot is emptied only on its completion (module
    // docs). The entries live on this frame for the call.
    let result = unsafe { prov.post_send(qp, chain) };
    let posted = match &result {
        Ok(()) => n,
        Err(f) => f.posted.min(n),
    };
    for s in sends.iter_mut().take(posted).flatten() {
        let slot = ring.push(s.meta.tag, s.meta.opcode, s.meta.signaled);
        s.sgl.move_into(&mut slot.sgl);
    }
    (posted, result.map_err(|f| f.error))
}

/// Posts a send whose `data` the provider copies into the work request
/// (`IBV_SEND_INLINE`): nothing stays with the queue. The caller checked
/// the ring's room and the granted inline size.
pub(crate) fn send_inline<B, P: Provider>(
    prov: &mut P,
    qp: &P::Qp,
    qp_index: u32,
    ring: &mut Ring<B>,
    op: &SendOp,
    data: &[u8],
    meta: SendMeta,
) -> Result<(), Error> {
    let mut sge = sys::ibv_sge {
        addr: data.as_ptr() as u64,
        length: u32::try_from(data.len())
            .map_err(|_| Error::invalid(site!("post_inline", "inline data over 4 GiB")))?,
        lkey: 0,
    };
    let mut wr = send_wr(
        op,
        super::id::ring(false, qp_index, ring.next_seq()),
        send_flags(meta.signaled, false, false, true),
    );
    wr.num_sge = 1;
    wr.sg_list = &mut sge;
    // SAFETY: with IBV_SEND_INLINE the provider copies `data` into the work
    // queue during the call; `data` and `sge` outlive it.
    unsafe { prov.post_send(qp, core::slice::from_mut(&mut wr)) }.map_err(|f| f.error)?;
    ring.push(meta.tag, meta.opcode, meta.signaled);
    Ok(())
}

/// Posts receives on `qp`, moving each posted one's buffers into `ring`.
/// The caller checked the ring's room.
pub(crate) fn recv<B: NicBuf, P: Provider>(
    prov: &mut P,
    qp: &P::Qp,
    qp_index: u32,
    ring: &mut Ring<B>,
    max_sge: u32,
    sgl: &mut Sgl<B>,
    tag: u64,
) -> Result<(), Error> {
    let mut sges = [sys::ibv_sge::default(); MAX_SGE];
    let (num, _) = sgl.build(max_sge, &mut sges)?;
    let mut wr = sys::ibv_recv_wr {
        wr_id: super::id::ring(true, qp_index, ring.next_seq()),
        next: core::ptr::null_mut(),
        sg_list: sges.as_mut_ptr(),
        num_sge: num,
    };
    // SAFETY: the entries were built just now from `sgl`, which moves into
    // the ring slot below; a slot is emptied only on its completion.
    unsafe { prov.post_recv(qp, core::slice::from_mut(&mut wr)) }.map_err(|f| f.error)?;
    let slot = ring.push(tag, sys::ibv_wc_opcode::RECV, true);
    sgl.move_into(&mut slot.sgl);
    Ok(())
}

/// Posts a receive on the shared receive queue with id `wr_id` (its slot
/// and generation); the caller moves `sgl` into that slot on success.
pub(crate) fn srq_recv<B: NicBuf, P: Provider>(
    prov: &mut P,
    srq: &P::Srq,
    max_sge: u32,
    sgl: &mut Sgl<B>,
    wr_id: u64,
    slot: &mut Sgl<B>,
) -> Result<(), Error> {
    let mut sges = [sys::ibv_sge::default(); MAX_SGE];
    let (num, _) = sgl.build(max_sge, &mut sges)?;
    let mut wr = sys::ibv_recv_wr {
        wr_id,
        next: core::ptr::null_mut(),
        sg_list: sges.as_mut_ptr(),
        num_sge: num,
    };
    // SAFETY: the entries were built just now from `sgl`, which moves into
    // the receive's slot below; the slot is emptied only on its completion
    // (srq.rs) or after the queue's successful destroy.
    unsafe { prov.post_srq_recv(srq, core::slice::from_mut(&mut wr)) }.map_err(|f| f.error)?;
    sgl.move_into(slot);
    Ok(())
}

/// A prepared request's work requests and entries, built once. The entries
/// live in a heap block of their own, so the requests' pointers to them
/// stay valid however the table that holds this value moves or grows.
pub(crate) struct PreparedWr {
    send: sys::ibv_send_wr,
    recv: sys::ibv_recv_wr,
    /// From `Box::leak`; freed in `Drop`.
    sges: NonNull<[sys::ibv_sge; MAX_SGE]>,
}

// SAFETY: the entries block is owned by this value alone and the requests
// point only into it; nothing is shared across threads.
unsafe impl Send for PreparedWr {}

impl PreparedWr {
    fn with(
        sges: [sys::ibv_sge; MAX_SGE],
        mut send: sys::ibv_send_wr,
        num: i32,
        recv_num: i32,
    ) -> PreparedWr {
        let sges = NonNull::from(Box::leak(Box::new(sges)));
        send.sg_list = sges.as_ptr().cast();
        let recv = sys::ibv_recv_wr {
            wr_id: 0,
            next: core::ptr::null_mut(),
            sg_list: sges.as_ptr().cast(),
            num_sge: recv_num,
        };
        send.num_sge = num;
        PreparedWr { send, recv, sges }
    }

    /// The work request of a send of `op` on `sgl`.
    pub(crate) fn send<B: NicBuf>(
        op: &SendOp,
        sgl: &Sgl<B>,
        max_sge: u32,
        flags: F,
    ) -> Result<PreparedWr, Error> {
        let mut sges = [sys::ibv_sge::default(); MAX_SGE];
        let (num, total) = sgl.build(max_sge, &mut sges)?;
        check_atomic_result(op, total)?;
        Ok(PreparedWr::with(sges, send_wr(op, 0, flags), num, 0))
    }

    /// The work request of a receive into `sgl`.
    pub(crate) fn recv<B: NicBuf>(sgl: &Sgl<B>, max_sge: u32) -> Result<PreparedWr, Error> {
        let mut sges = [sys::ibv_sge::default(); MAX_SGE];
        let (num, _) = sgl.build(max_sge, &mut sges)?;
        Ok(PreparedWr::with(sges, sys::ibv_send_wr::zeroed(), 0, num))
    }

    /// Rebuilds the entries from `sgl` (after a loan that may have swapped
    /// a buffer); the list must still have the same shape.
    pub(crate) fn rebuild<B: NicBuf>(&mut self, sgl: &Sgl<B>, max_sge: u32) -> Result<(), Error> {
        let mut sges = [sys::ibv_sge::default(); MAX_SGE];
        let (num, _) = sgl.build(max_sge, &mut sges)?;
        if num != self.send.num_sge.max(self.recv.num_sge) {
            return Err(Error::invalid(site!(
                "post_prepared",
                "the prepared request's buffers changed shape"
            )));
        }
        // SAFETY: the block is owned by `self` (leaked in `with`), and no
        // post of it is in flight (the caller rebuilds only an idle entry).
        unsafe { self.sges.as_ptr().write(sges) };
        Ok(())
    }

    /// The send's flags but `SIGNALED`, which each post decides.
    pub(crate) fn flags(&self) -> F {
        self.send.send_flags.without(F::SIGNALED)
    }
}

impl Drop for PreparedWr {
    fn drop(&mut self) {
        // SAFETY: leaked by `with`, freed once; the table drops an entry
        // only when no post of it is in flight (or leaks it).
        drop(unsafe { Box::from_raw(self.sges.as_ptr()) });
    }
}

/// Posts a prepared send as request `seq` of queue pair `qp_index`. The
/// caller records the post in the ring (`push`, with the entry's index) and
/// as the entry's latest post.
#[inline(always)]
pub(crate) fn send_prepared<P: Provider>(
    prov: &mut P,
    qp: &P::Qp,
    qp_index: u32,
    seq: u64,
    wr: &mut PreparedWr,
    signaled: bool,
) -> Result<(), Error> {
    wr.send.wr_id = super::id::ring(false, qp_index, seq);
    let base = wr.flags();
    wr.send.send_flags = if signaled { base | F::SIGNALED } else { base };
    // SAFETY: `wr` points at its own entries' block (stable on the heap),
    // built from the buffers the entry owns; the entry refuses loans, copies
    // and release while this post (its latest) is in flight.
    unsafe { prov.post_send(qp, core::slice::from_mut(&mut wr.send)) }.map_err(|f| f.error)
}

/// Posts a prepared receive as request `seq` of queue pair `qp_index`; the
/// caller records it as `send_prepared` says.
#[inline(always)]
pub(crate) fn recv_prepared<P: Provider>(
    prov: &mut P,
    qp: &P::Qp,
    qp_index: u32,
    seq: u64,
    wr: &mut PreparedWr,
) -> Result<(), Error> {
    wr.recv.wr_id = super::id::ring(true, qp_index, seq);
    // SAFETY: as in `send_prepared`.
    unsafe { prov.post_recv(qp, core::slice::from_mut(&mut wr.recv)) }.map_err(|f| f.error)
}

/// Posts the bind of `mw` to `buf` (in its arena's region) with `rkey` and
/// `access`, signaled, as request `seq` of the queue pair. On success the
/// caller makes the window keep `buf`.
pub(crate) fn bind(
    qp: &RawQp,
    qp_index: u32,
    seq: u64,
    mw: &RawMw<ArenaBuf>,
    buf: &ArenaBuf,
    rkey: u32,
    access: sys::ibv_access_flags,
) -> Result<(), Error> {
    let mr: &RawMr<PageMemory> = buf.shared().mr();
    let mut wr = sys::ibv_send_wr::zeroed();
    wr.wr_id = super::id::ring(false, qp_index, seq);
    wr.opcode = O::BIND_MW;
    wr.send_flags = F::SIGNALED;
    wr.bind_mw_or_tso.bind_mw = sys::ibv_send_wr_bind_mw {
        mw: mw.as_ptr(),
        rkey,
        bind_info: sys::ibv_mw_bind_info {
            mr: mr.as_ptr(),
            addr: buf.addr(),
            length: buf.len() as u64,
            mw_access_flags: access,
        },
    };
    // SAFETY: the window and the region are live handles: the caller makes
    // the window keep `buf` once this post succeeds, and the buffer's arena
    // keeps the region while any buffer lives; the bind reads no memory.
    unsafe { qp.post_send(core::slice::from_mut(&mut wr)) }.map_err(|f| f.error)
}

/// Work requests the safe layer does not build (another opcode, a flag it
/// does not offer), checked by nobody: [`crate::Engine::post_send_raw`]
/// posts them as they are. Their completions come back from `poll` with
/// their own `wr_id` as the tag and no buffers.
pub struct RawSend<'a> {
    wrs: &'a mut [sys::ibv_send_wr],
}

impl<'a> RawSend<'a> {
    /// Wraps `wrs` (posted as one chain; their `next` pointers are set at
    /// the post).
    ///
    /// # Safety
    ///
    /// - Every scatter/gather entry names memory registered in the queue
    ///   pair's protection domain that stays valid, and that nothing but the
    ///   device reads or writes, until the request's completion (or that of
    ///   a later signaled request on its queue) has been polled; every
    ///   pointer a request carries (a window, an address handle) stays valid
    ///   as long.
    /// - Each `wr_id` is below [`crate::RAW_ID_LIMIT`].
    /// - The requests fit the queue beside the engine's own: at most the
    ///   send ring's room (`max_send_wr` minus the requests in flight), or
    ///   the completion queue can overflow.
    pub unsafe fn new(wrs: &'a mut [sys::ibv_send_wr]) -> RawSend<'a> {
        RawSend { wrs }
    }
}

/// Posts a raw chain, marking each id as a raw post's.
pub(crate) fn send_raw<P: Provider>(
    prov: &mut P,
    qp: &P::Qp,
    raw: RawSend<'_>,
) -> Result<(), Error> {
    for wr in raw.wrs.iter_mut() {
        wr.wr_id = super::id::raw(wr.wr_id);
    }
    // SAFETY: `RawSend::new`'s contract is the post's.
    unsafe { prov.post_send(qp, raw.wrs) }.map_err(|f| f.error)
}
