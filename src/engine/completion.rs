//! A finished request: lent to the poll's callback ([`CompletionRef`],
//! read from the completion entry and from what the engine kept of the
//! request, a buffer moved only on `take_buf`) or owned ([`Completion`]).
//! A shared receive's buffers stay in their slot while lent: the callback
//! reads them there (`buf`) and may post them again in place
//! (`repost_recv`). Buffers the callback leaves are dropped when it
//! returns: the device is done with them. The callback may post on the
//! engine it is lent from ([`CompletionRef::poster`]): the request it
//! holds is retired already, its entry released.

use crate::error::{site, Error};
use crate::sgl::{Local, Sgl};
use crate::sys::{self, ibv_wc_opcode as WcOpcode, ibv_wc_status as WcStatus};

use super::core::Engine;
use super::doorbell::{Provider, Verbs};
use super::flights::{Retired, NOT_PREPARED, UNREPORTED};
use super::prepared_table::Prepared;
use super::qp_slot::QpId;
use super::ring::NONE;

/// `Retired::more` of a shared receive whose buffers are still in the
/// slot lent to the callback (`SrqSlots::lend`), not in an overflow entry.
pub(crate) const IN_SLOT: u32 = NONE - 1;

/// Where a finished request was kept.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// Its queue pair's queue.
    Ring,
    /// The shared receive queue: its buffers stay in the slot lent to
    /// the callback (`SrqSlots::lend`; `kept.more` is `IN_SLOT`) until
    /// taken or posted again.
    Srq,
    /// Nothing: a raw post (its buffers were never the engine's).
    Raw,
}

/// One finished request, lent to the poll's callback with its buffers and
/// the engine it came from, for the callback's duration.
pub struct CompletionRef<'a, B, P: Provider = Verbs> {
    pub(crate) wc: &'a sys::ibv_wc,
    pub(crate) origin: Origin,
    /// What the engine kept of the request, its entry released: its first
    /// buffer here (dropped with this if the callback leaves it), the
    /// others, if any, in an overflow entry of table `side` (released by
    /// the router after the callback).
    pub(crate) kept: Retired<B>,
    pub(crate) side: bool,
    /// False for an unsignaled request completed by a later entry; true
    /// for every request a reset hands back as flushed.
    pub(crate) own_entry: bool,
    pub(crate) is_recv: bool,
    pub(crate) qp: Option<QpId>,
    /// What the callback may post on (see [`CompletionRef::poster`]).
    pub(crate) engine: &'a mut Engine<B, P>,
}

impl<B, P: Provider> CompletionRef<'_, B, P> {
    /// The queue pair the request was posted on (for a shared receive, the
    /// one the message arrived on); `None` when that queue pair was removed.
    #[inline]
    pub fn qp(&self) -> Option<QpId> {
        self.qp
    }

    /// The caller's tag (for a raw post, its id).
    #[inline]
    pub fn tag(&self) -> u64 {
        match self.origin {
            Origin::Raw => super::id::decode(self.wc.wr_id).raw_id(),
            _ => self.kept.tag,
        }
    }

    /// True for a receive.
    #[inline]
    pub fn is_recv(&self) -> bool {
        self.is_recv
    }

    /// The outcome (`SUCCESS` for an unsignaled request completed by a
    /// later one on its queue).
    #[inline]
    pub fn status(&self) -> WcStatus {
        if self.own_entry {
            self.wc.status
        } else {
            WcStatus::SUCCESS
        }
    }

    /// What completed (what was posted, where the entry cannot say: an
    /// unsignaled request, or an error, whose entry's opcode is undefined).
    #[inline]
    pub fn opcode(&self) -> WcOpcode {
        let failed = self.wc.status != WcStatus::SUCCESS;
        match self.origin {
            Origin::Ring if !self.own_entry || failed => self.kept.opcode,
            Origin::Srq if failed => WcOpcode::RECV,
            _ => self.wc.opcode,
        }
    }

    /// Bytes received, read or fetched (0 for unsignaled requests).
    #[inline]
    pub fn byte_len(&self) -> u32 {
        if self.own_entry {
            self.wc.byte_len
        } else {
            0
        }
    }

    /// Immediate data (host order), if the completion carried one.
    #[inline]
    pub fn imm(&self) -> Option<u32> {
        (self.own_entry && self.wc.wc_flags.contains(sys::ibv_wc_flags::WITH_IMM))
            .then(|| u32::from_be(self.wc.imm_data))
    }

    /// For a datagram receive, the sender's queue pair number (0 otherwise).
    #[inline]
    pub fn src_qp(&self) -> u32 {
        if self.own_entry {
            self.wc.src_qp
        } else {
            0
        }
    }

    /// The entry's flags as the library wrote them: `GRH` (a datagram
    /// receive whose first [`crate::grh::GRH_LEN`] bytes hold the routing
    /// header), `WITH_IMM`, ... (empty for an unsignaled request).
    #[inline]
    pub fn wc_flags(&self) -> sys::ibv_wc_flags {
        if self.own_entry {
            self.wc.wc_flags
        } else {
            sys::ibv_wc_flags::EMPTY
        }
    }

    /// Where a receive's payload starts in its buffer: [`crate::grh::GRH_LEN`]
    /// on a datagram queue pair when the entry has `IBV_WC_GRH` (every UD
    /// receive on RoCE), else 0; [`CompletionRef::byte_len`] counts those
    /// bytes too. A connected queue pair's buffer holds no GRH, whatever
    /// the flag says (rxe sets it on RoCE receives of every transport).
    #[inline]
    pub fn payload_offset(&self) -> usize {
        // Only a datagram queue pair's receives start with a GRH (rxe flags
        // `IBV_WC_GRH` on RoCE receives of every transport).
        grh_offset(self.qp.is_some_and(|q| q.is_ud()), self.wc_flags())
    }

    /// False for an unsignaled request (completed by a later request's
    /// entry, with no entry of its own).
    #[inline]
    pub fn signaled(&self) -> bool {
        self.own_entry
    }

    /// The provider's vendor error code.
    #[inline]
    pub fn vendor_err(&self) -> u32 {
        if self.own_entry {
            self.wc.vendor_err
        } else {
            0
        }
    }

    /// The prepared request this was a post of (its buffers stayed with it).
    #[inline]
    pub fn prepared(&self) -> Option<Prepared> {
        let k = &self.kept;
        (self.origin == Origin::Ring && k.prepared != NOT_PREPARED).then(|| {
            self.engine
                .prepared
                .handle(self.is_recv, k.prepared & !UNREPORTED, k.generation)
        })
    }

    /// `Ok` on success, else the error with the primer's meaning; a flush
    /// says it is the consequence of an earlier error.
    #[inline]
    pub fn result(&self) -> Result<(), Error> {
        // The opcode only on failure (its origin's match off the success
        // path), and values, not `&self`, to the cold call: an inlined
        // callback's completion can stay in registers.
        let status = self.status();
        if status == WcStatus::SUCCESS {
            return Ok(());
        }
        Err(completion_error(status, self.opcode(), self.is_recv))
    }

    /// The first buffer the request still holds, to read in place
    /// ([`crate::HostBuf::read_at`]): while lent it is posted nowhere, so
    /// no peer writes it, and a post of it again (`repost_recv`, `&mut
    /// self`) waits for this borrow to end. `None` once taken, posted
    /// again, or for a request whose buffers stay elsewhere (a prepared
    /// request's, a raw post's).
    #[inline]
    pub fn buf(&self) -> Option<&B> {
        if self.kept.more == IN_SLOT {
            return self.engine.srq.as_ref().and_then(|s| s.lent_first());
        }
        self.kept.first.as_ref().map(|l| &l.buf)
    }

    /// Takes the first buffer the request still holds (`None` once it is
    /// posted again).
    #[inline]
    pub fn take_buf(&mut self) -> Option<B> {
        // The common case on `kept` alone, as `Flights::take_first`; the
        // others out of line, given values rather than `self`, so that an
        // inlined callback's completion can live in registers.
        match self.kept.first.take() {
            Some(l) => Some(l.buf),
            None if self.kept.more != NONE => {
                let (buf, more) = take_elsewhere(&mut *self.engine, self.kept.more, self.side);
                self.kept.more = more;
                buf
            }
            None => None,
        }
    }

    /// Every buffer the request still holds, as a list; none left here.
    pub(crate) fn take_sgl(&mut self) -> Sgl<B> {
        if self.kept.more == IN_SLOT {
            (self.kept.first, self.kept.more) = from_slot(&mut *self.engine, self.side);
        }
        let sgl = self.engine.flights[usize::from(self.side)].take_sgl(&mut self.kept);
        // Its overflow entry, if any, is released: nothing to release if
        // the callback panics.
        self.engine.lent = NONE;
        sgl
    }

    /// Holds the buffers of `sgl` again (what `take_sgl` took).
    pub(crate) fn hold(&mut self, sgl: &mut Sgl<B>) {
        self.engine.flights[usize::from(self.side)].hold(&mut self.kept, sgl);
        if self.kept.more != NONE {
            self.engine.lent = self.kept.more | u32::from(self.side) << 31;
        }
    }

    /// The full completion, with every buffer the request still holds.
    #[inline]
    pub fn into_owned(mut self) -> Completion<B> {
        Completion {
            qp: self.qp,
            tag: self.tag(),
            is_recv: self.is_recv,
            status: self.status(),
            opcode: self.opcode(),
            byte_len: self.byte_len(),
            imm: self.imm(),
            signaled: self.signaled(),
            vendor_err: self.vendor_err(),
            src_qp: self.src_qp(),
            wc_flags: self.wc_flags(),
            prepared: self.prepared(),
            sgl: self.take_sgl(),
        }
    }
}

impl<B, P: Provider> core::fmt::Debug for CompletionRef<'_, B, P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CompletionRef")
            .field("qp", &self.qp)
            .field("tag", &self.tag())
            .field("is_recv", &self.is_recv)
            .field("status", &self.status())
            .field("opcode", &self.opcode())
            .field("byte_len", &self.byte_len())
            .field("signaled", &self.signaled())
            .finish()
    }
}

/// A finished request: its status and the buffers it owned, returned.
#[derive(Debug)]
pub struct Completion<B> {
    /// The queue pair (see [`CompletionRef::qp`]).
    pub qp: Option<QpId>,
    /// The caller's tag.
    pub tag: u64,
    /// True for a receive.
    pub is_recv: bool,
    /// The outcome. For an unsignaled request completed by a later signaled
    /// one on the same queue, `SUCCESS`.
    pub status: WcStatus,
    /// What completed.
    pub opcode: WcOpcode,
    /// Bytes received, read or fetched (0 for unsignaled requests).
    pub byte_len: u32,
    /// Immediate data (host order), if the completion carried one.
    pub imm: Option<u32>,
    /// False for an unsignaled request (no completion entry of its own).
    pub signaled: bool,
    /// The provider's vendor error code.
    pub vendor_err: u32,
    /// For a datagram receive, the sender's queue pair number.
    pub src_qp: u32,
    /// The entry's flags (see [`CompletionRef::wc_flags`]).
    pub wc_flags: sys::ibv_wc_flags,
    prepared: Option<Prepared>,
    sgl: Sgl<B>,
}

impl<B> Completion<B> {
    /// `Ok` on success, else the error with the primer's meaning.
    #[inline]
    pub fn result(&self) -> Result<(), Error> {
        check_status(self.status, self.opcode, self.is_recv)
    }

    /// The prepared request this was a post of (no buffers come back).
    pub fn prepared(&self) -> Option<Prepared> {
        self.prepared
    }

    /// Where a receive's payload starts in its buffer (see
    /// [`CompletionRef::payload_offset`]).
    pub fn payload_offset(&self) -> usize {
        grh_offset(self.qp.is_some_and(|q| q.is_ud()), self.wc_flags)
    }

    /// Takes the first buffer back (most requests have exactly one).
    #[inline]
    pub fn take_buf(&mut self) -> Option<B> {
        self.sgl.take_first()
    }

    /// All buffers back, in scatter/gather order.
    pub fn into_bufs(self) -> impl Iterator<Item = B> {
        self.sgl.into_bufs()
    }
}

/// Where a receive's payload starts: after the GRH on a datagram queue
/// pair whose entry says it holds one.
#[inline]
fn grh_offset(ud: bool, flags: sys::ibv_wc_flags) -> usize {
    if ud && flags.contains(sys::ibv_wc_flags::GRH) {
        crate::grh::GRH_LEN
    } else {
        0
    }
}

#[inline(always)]
pub(crate) fn check_status(status: WcStatus, opcode: WcOpcode, is_recv: bool) -> Result<(), Error> {
    if status == WcStatus::SUCCESS {
        return Ok(());
    }
    Err(completion_error(status, opcode, is_recv))
}

#[cold]
fn completion_error(status: WcStatus, opcode: WcOpcode, is_recv: bool) -> Error {
    let site = if is_recv {
        site!("receive completion")
    } else {
        site!("send completion")
    };
    Error::completion(site, status, opcode)
}

/// `take_buf` of a buffer not in `kept.first`: in the lent slot (`more`
/// is `IN_SLOT`: its buffers move out, the slot free, those after the
/// first into an overflow entry of table `side`) or in overflow entry
/// `more`. Returns the buffer and what `kept.more` is now.
#[cold]
#[inline(never)]
fn take_elsewhere<B, P: Provider>(
    engine: &mut Engine<B, P>,
    more: u32,
    side: bool,
) -> (Option<B>, u32) {
    let mut kept = Retired {
        more,
        ..Retired::bare(0, WcOpcode::RECV)
    };
    if more == IN_SLOT {
        (kept.first, kept.more) = from_slot(engine, side);
    }
    let buf = engine.flights[usize::from(side)].take_first(&mut kept);
    (buf, kept.more)
}

/// The buffers of the shared receive lent in its slot, moved out (the
/// slot free): the first, and the overflow entry of table `side` holding
/// the others (released by the router after the callback), or `NONE`.
#[cold]
fn from_slot<B, P: Provider>(engine: &mut Engine<B, P>, side: bool) -> (Option<Local<B>>, u32) {
    let mut kept = Retired::bare(0, WcOpcode::RECV);
    if let Some(mut sgl) = engine.srq.as_mut().and_then(|s| s.take_lent()) {
        engine.flights[usize::from(side)].hold(&mut kept, &mut sgl);
        if kept.more != NONE {
            engine.lent = kept.more | u32::from(side) << 31;
        }
    }
    (kept.first.take(), kept.more)
}
