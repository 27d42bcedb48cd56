//! The doorbell: where the engine hands work requests to the device. Every
//! pointer a work request carries is set here, and every post here records
//! (or is recorded by the caller in the same step) who owns the memory the
//! request names until it completes.
//!
//! # Safety
//!
//! The one engine module allowed `unsafe`. A post is sound because, for as
//! long as the device may use a request's memory:
//! - an own-buffer request's buffers are in its entry of the engine's
//!   table of requests in flight, moved there by the function that posted
//!   it ([`send`], [`recv`]), and an entry is emptied only by a completion
//!   of its sequence number or a later one on its queue (`flights.rs`,
//!   `poll.rs`) or after its queue pair was destroyed successfully
//!   (`core.rs`);
//! - a prepared request's buffers stay in its table entry, which refuses
//!   loans, copies and release while its latest post is in flight
//!   (`prepared.rs`, `PreparedTable::idle`); a lane's copies of its
//!   entries' requests ([`LaneWrs`], and a shared-receive lane's
//!   [`ReplyRing`]) live no longer than the lane's borrow of the engine,
//!   which holds the entries' buffers meanwhile (and keeps them, leaked,
//!   if the lane is forgotten), and gives them back with each entry's
//!   latest post recorded;
//! - a shared-receive-queue receive's buffers are in its slot from its
//!   post until its completion lends them (the slot no longer posted),
//!   and stay there until taken out or posted again in place (`srq.rs`),
//!   or until the queue's successful destroy; the slot's kept work
//!   request ([`SrqWr`]) points at a heap block of entries it owns, which
//!   the provider reads only during a post;
//! - a window bind names a window (keeping its buffer, an [`ExposedBuf`])
//!   that the engine holds from the post until the bind is no longer in
//!   flight, and leaks with its queue pair if the destroy fails
//!   (`bind.rs`), and a region its arena keeps while any buffer lives;
//!   inline data is copied by the provider during the post;
//! - a datagram names an address handle the engine's table keeps alive
//!   while any UD send is in flight (`ah_table.rs`).
//!
//! [`ExposedBuf`]: crate::memory::ExposedBuf
#![allow(unsafe_code)]

use core::mem::MaybeUninit;

mod build;
mod lane_wr;
mod prepared_wr;
mod provider;
mod raw_send;
mod reply_ring;
mod srq_wr;
mod ud;

use crate::error::{site, Error};
use crate::memory::{ArenaBuf, NicBuf};
use crate::raw::{PageMemory, RawMr, RawMw, RawQp};
use crate::sgl::{Sgl, MAX_SGE};
use crate::sys::{self, ibv_send_flags as F, ibv_wr_opcode as O, Zeroed};
use crate::wr::SendOp;

use super::flights::{Flights, NOT_PREPARED};
use super::ring::Ring;
pub(crate) use build::check_atomic_result;
use build::send_wr;

pub(crate) use build::{send_flags, SendMeta};
pub(crate) use lane_wr::LaneWrs;
pub(crate) use prepared_wr::PreparedWr;
pub use provider::{Provider, Verbs};
pub(crate) use raw_send::send_raw;
pub use raw_send::RawSend;
pub(crate) use reply_ring::{ReplyAt, ReplyRing};
pub(crate) use srq_wr::SrqWr;
pub(crate) use ud::{send_ud, UdTarget};

/// One send of the caller's: its operation and buffers, and how to post it.
pub(crate) struct OwnSend<'a, B> {
    pub(crate) op: &'a SendOp,
    pub(crate) sgl: &'a mut Sgl<B>,
    pub(crate) meta: SendMeta,
    pub(crate) fence: bool,
    pub(crate) solicited: bool,
    /// Only requests of [`crate::memory::HostBuf`]s get here with it set (see
    /// `SendRequest::inline`): the provider reads their bytes at post time.
    pub(crate) inline: bool,
}

/// Posts one send (`op` on `sgl`, with `tag` and `flags`) on `qp` and
/// records it at the tail of `ring`, its buffers moved into `flights`:
/// [`send`] without a chain to count, clear and walk. The caller checked
/// the room (the queue's and the table's); `check` checks the operation
/// on the length its list adds up to, once built (nothing is posted if it
/// refuses), and gives the opcode its completion reports.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // one per part of the post; inlined into its caller
pub(crate) fn send_one<B: NicBuf, P: Provider>(
    prov: &mut P,
    qp: &P::Qp,
    qp_index: u32,
    flights: &mut Flights<B>,
    ring: &mut Ring,
    max_sge: u32,
    op: &SendOp,
    sgl: &mut Sgl<B>,
    tag: u64,
    flags: F,
    check: impl FnOnce(&SendOp, u64) -> Result<sys::ibv_wc_opcode, Error>,
) -> Result<(), Error> {
    let mut sges = [const { MaybeUninit::<sys::ibv_sge>::uninit() }; MAX_SGE];
    let (num, total) = sgl.build(max_sge, &mut sges)?;
    let mut wr = send_wr(op, super::id::ring(false, qp_index, ring.next_seq()), flags);
    // Checked (an atomic's result length too), and its completion's
    // opcode found, right after the request is built, which matched the
    // same operation: the compiler then dispatches on it once for all.
    let completes = check(op, total)?;
    wr.num_sge = num;
    wr.sg_list = sges.as_mut_ptr().cast();
    // SAFETY: as in `send`: the first `num` entries (all the provider
    // reads) were built just now from the request's list, which moves
    // into its table entry below.
    unsafe { prov.post_send(qp, core::slice::from_mut(&mut wr)) }.map_err(|f| f.error)?;
    flights.push(ring, tag, completes, sgl);
    Ok(())
}

/// Posts `sends` (a prefix of `Some`) as one chain on `qp` (one doorbell)
/// and records each posted request at the tail of `ring`, whose next
/// sequence numbers their ids carry, its buffers moved into `flights`.
/// Returns how many were posted, with the provider's refusal if it took
/// fewer than all. The caller checked the room for all of them.
pub(crate) fn send<B: NicBuf, P: Provider>(
    prov: &mut P,
    qp: &P::Qp,
    qp_index: u32,
    flights: &mut Flights<B>,
    ring: &mut Ring,
    max_sge: u32,
    sends: &mut [Option<OwnSend<'_, B>>],
) -> (usize, Result<(), Error>) {
    const CHAIN: usize = super::config::MAX_CHAIN;
    let n = sends.iter().take_while(|s| s.is_some()).count().min(CHAIN);
    let mut wrs = [const { MaybeUninit::<sys::ibv_send_wr>::uninit() }; CHAIN];
    // Each request's entries, the first `num_sge` of them built.
    let mut sges = [const { [const { MaybeUninit::<sys::ibv_sge>::uninit() }; MAX_SGE] }; CHAIN];
    let first = ring.next_seq();
    for i in 0..n {
        let Some(s) = &sends[i] else { break };
        let entries = &mut sges[i];
        let built = s
            .sgl
            .build(max_sge, entries)
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
        wr.sg_list = entries.as_mut_ptr().cast();
        wrs[i].write(wr);
    }
    // SAFETY: the first `n` entries were written in the loop above.
    let chain =
        unsafe { core::slice::from_raw_parts_mut(wrs.as_mut_ptr().cast::<sys::ibv_send_wr>(), n) };
    // SAFETY: each request's first `num_sge` entries (all the provider
    // reads) were built just now from its own list (`Sgl::build`: buffers
    // registered, ranges inside them), and every
    // posted request's list moves into its table entry below, before
    // anyone can reach it again; an entry is emptied only on its completion
    // (module docs). The entries live on this frame for the call.
    let result = unsafe { prov.post_send(qp, chain) };
    let posted = match &result {
        Ok(()) => n,
        Err(f) => f.posted.min(n),
    };
    for s in sends.iter_mut().take(posted).flatten() {
        flights.push(ring, s.meta.tag, s.meta.opcode, s.sgl);
    }
    (posted, result.map_err(|f| f.error))
}

/// Posts a send whose `data` the provider copies into the work request
/// (`IBV_SEND_INLINE`): nothing stays with the queue. The caller checked
/// the room and the granted inline size.
#[allow(clippy::too_many_arguments)] // one per part of the post; one caller
pub(crate) fn send_inline<B, P: Provider>(
    prov: &mut P,
    qp: &P::Qp,
    qp_index: u32,
    flights: &mut Flights<B>,
    ring: &mut Ring,
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
    flights.push_bare(ring, meta.tag, meta.opcode, NOT_PREPARED, 0, false);
    Ok(())
}

/// Posts a receive on `qp` and records it at the tail of `ring`, its
/// buffers moved into `flights`. The caller checked the room.
#[allow(clippy::too_many_arguments)] // one per part of the post; two callers
pub(crate) fn recv<B: NicBuf, P: Provider>(
    prov: &mut P,
    qp: &P::Qp,
    qp_index: u32,
    flights: &mut Flights<B>,
    ring: &mut Ring,
    max_sge: u32,
    sgl: &mut Sgl<B>,
    tag: u64,
) -> Result<(), Error> {
    let mut sges = [const { MaybeUninit::<sys::ibv_sge>::uninit() }; MAX_SGE];
    let (num, _) = sgl.build(max_sge, &mut sges)?;
    let mut wr = sys::ibv_recv_wr {
        wr_id: super::id::ring(true, qp_index, ring.next_seq()),
        next: core::ptr::null_mut(),
        sg_list: sges.as_mut_ptr().cast(),
        num_sge: num,
    };
    // SAFETY: the first `num` entries (all the provider reads) were built
    // just now from `sgl`, which moves into its table entry below; an
    // entry is emptied only on its completion.
    unsafe { prov.post_recv(qp, core::slice::from_mut(&mut wr)) }.map_err(|f| f.error)?;
    flights.push(ring, tag, sys::ibv_wc_opcode::RECV, sgl);
    Ok(())
}

/// Posts a receive on the shared receive queue with id `wr_id` (its slot
/// and generation), its entries built into the slot's request `slot_wr`;
/// on success `sgl` moves into the slot's list, `slot_sgl` (empty).
pub(crate) fn srq_recv<B: NicBuf, P: Provider>(
    prov: &mut P,
    srq: &P::Srq,
    max_sge: u32,
    sgl: &mut Sgl<B>,
    wr_id: u64,
    slot_wr: &mut SrqWr,
    slot_sgl: &mut Sgl<B>,
) -> Result<(), Error> {
    let (num, _) = sgl.build(max_sge, slot_wr.entries())?;
    // A copy with this post's id and count: refused, the slot's request
    // is left as it was.
    let mut wr = *slot_wr.wr();
    wr.wr_id = wr_id;
    wr.num_sge = num;
    // SAFETY: the first `num` entries (all the provider reads, during the
    // call) were built just now from `sgl`, which moves into the receive's
    // slot below; the slot keeps it until a completion lends it and a take
    // frees it (srq.rs), or after the queue's successful destroy.
    unsafe { prov.post_srq_recv(srq, core::slice::from_mut(&mut wr)) }.map_err(|f| f.error)?;
    slot_wr.built(num);
    sgl.move_into(slot_sgl);
    Ok(())
}

/// Posts the shared receive lent in its slot again, in place: the slot's
/// request `wr`, with the id it holds (its new generation, stamped by the
/// caller), the same buffers and entries, nothing built or checked.
#[inline(always)]
pub(crate) fn srq_repost<P: Provider>(
    prov: &mut P,
    srq: &P::Srq,
    wr: &mut SrqWr,
) -> Result<(), Error> {
    // SAFETY: a lent slot was posted by `srq_recv`, which built its
    // request's first `num_sge` entries from the list it moved into the
    // slot; the list has stayed there since (a take frees the slot, and a
    // free slot's next post builds its entries again; nothing lends a
    // slot's buffers by `&mut`), and NicBuf's contract keeps a live
    // buffer's range and key: the entries are current. The buffers stay
    // in the slot until its next completion lends them, as after
    // `srq_recv`.
    unsafe { prov.post_srq_recv(srq, core::slice::from_mut(wr.wr())) }.map_err(|f| f.error)
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
/// `access`, signaled, as request `wr_id` of the queue pair. On success the
/// caller makes the window keep `buf`.
pub(crate) fn bind(
    qp: &RawQp,
    wr_id: u64,
    mw: &RawMw<ArenaBuf>,
    buf: &ArenaBuf,
    rkey: u32,
    access: sys::ibv_access_flags,
) -> Result<(), Error> {
    let mr: &RawMr<PageMemory> = buf.shared().mr();
    let mut wr = sys::ibv_send_wr::zeroed();
    wr.wr_id = wr_id;
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
    // the window keep `buf` once this post succeeds and hands it to the
    // engine until the bind's completion (`Engine::bind_posted`), and the
    // buffer's arena keeps the region while any buffer lives; the bind
    // reads no memory.
    unsafe { qp.post_send(core::slice::from_mut(&mut wr)) }.map_err(|f| f.error)
}

/// Posts copies of prepared sends `wrs` (each with whether it is signaled)
/// as one chain of requests `first`, `first + 1`, ... of queue pair
/// `qp_index`: one doorbell for up to `MAX_CHAIN`. Returns how many were
/// posted, with the provider's refusal if it took fewer. The caller records
/// each posted one as `send_prepared` says.
#[inline]
pub(crate) fn send_prepared_chain<'a, P: Provider>(
    prov: &mut P,
    qp: &P::Qp,
    qp_index: u32,
    first: u64,
    wrs: impl Iterator<Item = (&'a PreparedWr, bool)>,
) -> (usize, Result<(), Error>) {
    const CHAIN: usize = super::config::MAX_CHAIN;
    let mut chain = [const { MaybeUninit::<sys::ibv_send_wr>::uninit() }; CHAIN];
    let mut n = 0;
    for (wr, signaled) in wrs.take(CHAIN) {
        let mut copy = wr.send;
        copy.wr_id = super::id::ring(false, qp_index, first + n as u64);
        let base = wr.flags();
        copy.send_flags = if signaled { base | F::SIGNALED } else { base };
        chain[n].write(copy);
        n += 1;
    }
    // SAFETY: the first `n` entries were written in the loop above.
    let chain = unsafe {
        core::slice::from_raw_parts_mut(chain.as_mut_ptr().cast::<sys::ibv_send_wr>(), n)
    };
    // SAFETY: each copy points at its entry's own scatter/gather block (on
    // the heap, stable while the entry lives), built from the buffers the
    // entry owns; the caller records every posted copy as its entry's
    // latest post, so the entry refuses loans, copies and release until it
    // completes. The copies themselves live on this frame for the call.
    let result = unsafe { prov.post_send(qp, chain) };
    match result {
        Ok(()) => (n, Ok(())),
        Err(f) => (f.posted.min(n), Err(f.error)),
    }
}
