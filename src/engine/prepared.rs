//! Prepared requests: built and checked once, then posted again and again,
//! as perftest posts one prebuilt work request. A post stamps an id and
//! rings the doorbell; the ring records it, so its completion is matched by
//! sequence number like any other (a stale or replayed one reaches
//! nothing). The buffers stay in the table entry until released; between
//! posts they are copied into and out of, or lent. All of that is refused
//! while the entry's latest post is in flight: queues complete in order, so
//! that one post in flight is exactly when the device may use them.

use alloc::vec::Vec;

use crate::error::{Error, ErrorKind};
use crate::memory::{HostBuf, NicBuf};
use crate::sgl::Sgl;
use crate::site;
use crate::sys::ibv_wc_opcode as WcOpcode;
use crate::wr::{RecvRequest, SendRequest};

use super::check::{check_send, completes_as};
use super::core::Engine;
use super::doorbell::{send_flags, PreparedWr, Provider};
use super::post::PostError;
use super::qp_slot::QpId;

/// Engine ids kept in a prepared handle's key (30 bits).
pub(crate) const ENGINE_ID_MASK: u32 = (1 << 30) - 1;
/// Set in the key of a released entry: no handle's key has it.
const RELEASED: u64 = 1 << 32;
/// Set in the key of an entry whose buffer was lent since its entries were
/// built (a loan can swap it): a post's one key test misses and rebuilds.
const LENT: u64 = 1 << 33;
/// `Entry::last_post` of a request never posted: no ring holds it.
const NEVER: u64 = u64::MAX;

/// A send a queue pair keeps for posting again: valid on its engine until
/// released (or its queue pair removed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PreparedSend {
    index: u32,
    key: u64,
}

/// A receive a queue pair keeps for posting again (see [`PreparedSend`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PreparedRecv {
    index: u32,
    key: u64,
}

/// The prepared request a completion is a post of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Prepared {
    /// A send.
    Send(PreparedSend),
    /// A receive.
    Recv(PreparedRecv),
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::PreparedSend {}
    impl Sealed for super::PreparedRecv {}
}

/// [`PreparedSend`] or [`PreparedRecv`]: what the prepared-request calls
/// take, so one name serves both without a run-time choice.
pub trait PreparedHandle: sealed::Sealed + Copy {
    #[doc(hidden)]
    const RECV: bool;
    #[doc(hidden)]
    fn parts(self) -> (u32, u64);
}

impl PreparedHandle for PreparedSend {
    const RECV: bool = false;
    fn parts(self) -> (u32, u64) {
        (self.index, self.key)
    }
}

impl PreparedHandle for PreparedRecv {
    const RECV: bool = true;
    fn parts(self) -> (u32, u64) {
        (self.index, self.key)
    }
}

/// One kept request.
pub(crate) struct Entry<B> {
    /// The queue pair's slot (its entries are released with it).
    qp: u32,
    wr: PreparedWr,
    sgl: Sgl<B>,
    tag: u64,
    opcode: WcOpcode,
    signaled: bool,
    /// Sequence number of the latest post (`NEVER` before the first).
    last_post: u64,
    /// `engine << 34 | generation`, with `RELEASED` / `LENT`.
    key: u64,
}

/// The prepared requests of one engine, sends and receives apart. Entries
/// are reused after release, so a loop that prepares and releases does not
/// grow the table.
pub(crate) struct PreparedTable<B> {
    engine: u32,
    sends: Vec<Entry<B>>,
    recvs: Vec<Entry<B>>,
}

impl<B> PreparedTable<B> {
    pub(crate) fn new(engine: u32) -> PreparedTable<B> {
        PreparedTable {
            engine,
            sends: Vec::new(),
            recvs: Vec::new(),
        }
    }

    fn table(&mut self, recv: bool) -> &mut Vec<Entry<B>> {
        if recv {
            &mut self.recvs
        } else {
            &mut self.sends
        }
    }

    /// Stores `entry` in a released slot if there is one (allocates
    /// otherwise: setup time) and returns its index and key.
    fn insert(&mut self, recv: bool, mut entry: Entry<B>) -> (u32, u64) {
        let engine = u64::from(self.engine) << 34;
        let table = self.table(recv);
        let index = match table.iter().position(|e| e.key & RELEASED != 0) {
            Some(i) => {
                entry.key = engine | (table[i].key as u32).wrapping_add(1) as u64;
                table[i] = entry;
                i
            }
            None => {
                entry.key = engine;
                table.push(entry);
                table.len() - 1
            }
        };
        (index as u32, table[index].key)
    }

    /// The live entry `(index, key)` names, loans allowed.
    fn entry(&mut self, recv: bool, index: u32, key: u64) -> Result<&mut Entry<B>, Error> {
        match self.table(recv).get_mut(index as usize) {
            Some(e) if e.key & !LENT == key => Ok(e),
            _ => Err(gone()),
        }
    }

    /// Drops the entries of queue pair `qp`, which was destroyed: the device
    /// no longer touches their buffers.
    pub(crate) fn release_qp(&mut self, qp: u32) {
        for e in self.sends.iter_mut().chain(self.recvs.iter_mut()) {
            if e.qp == qp && e.key & RELEASED == 0 {
                e.key |= RELEASED;
                e.key &= !LENT;
                drop(core::mem::take(&mut e.sgl));
            }
        }
    }

    /// Leaks the buffers of queue pair `qp`'s entries: its destroy failed.
    pub(crate) fn leak_qp(&mut self, qp: u32) {
        for e in self.sends.iter_mut().chain(self.recvs.iter_mut()) {
            if e.qp == qp && e.key & RELEASED == 0 {
                e.key |= RELEASED;
                core::mem::forget(core::mem::take(&mut e.sgl));
            }
        }
    }

    /// The request of a ring slot's `(index, generation)`, as a handle.
    pub(crate) fn handle(&self, recv: bool, index: u32, generation: u32) -> Prepared {
        let key = u64::from(self.engine) << 34 | u64::from(generation);
        if recv {
            Prepared::Recv(PreparedRecv { index, key })
        } else {
            Prepared::Send(PreparedSend { index, key })
        }
    }
}

#[cold]
fn gone() -> Error {
    Error::new(
        site!(
            "prepared request",
            "not prepared on this engine, or released"
        ),
        ErrorKind::NotFound,
    )
}

#[cold]
fn busy(call: &'static crate::error::Site) -> Error {
    Error::new(call, ErrorKind::BadState)
}

#[cold]
fn no_buffer() -> Error {
    Error::invalid(site!("prepared request", "the request has no buffer"))
}

impl<B: NicBuf, P: Provider> Engine<B, P> {
    /// Keeps `req` for posting on `qp` with [`Engine::post_prepared`]: its
    /// operation, flags and tag are checked and fixed now, and its buffers
    /// stay with the engine until [`Engine::release_prepared`]. Setup time:
    /// may allocate a table entry.
    #[allow(clippy::result_large_err)] // the request comes back unboxed
    pub fn prepare_send(
        &mut self,
        qp: QpId,
        req: SendRequest<B>,
    ) -> Result<PreparedSend, PostError<SendRequest<B>>> {
        let built = self.slot(qp).and_then(|slot| {
            check_send(slot, &req.op, req.sgl.total_len() as u64, req.flags.inline)?;
            let f = req.flags;
            PreparedWr::send(
                &req.op,
                &req.sgl,
                slot.caps.max_send_sge,
                send_flags(false, f.fence, f.solicited, f.inline),
            )
        });
        let wr = match built {
            Ok(wr) => wr,
            Err(error) => {
                return Err(PostError {
                    error,
                    request: req,
                })
            }
        };
        let SendRequest {
            tag,
            op,
            sgl,
            flags,
        } = req;
        let entry = Entry {
            qp: qp.index,
            wr,
            sgl,
            tag,
            opcode: completes_as(&op),
            signaled: flags.signaled,
            last_post: NEVER,
            key: 0,
        };
        let (index, key) = self.prepared.insert(false, entry);
        Ok(PreparedSend { index, key })
    }

    /// Keeps `req` for posting on `qp`'s receive queue with
    /// [`Engine::post_prepared`] (not with a shared receive queue).
    #[allow(clippy::result_large_err)] // the request comes back unboxed
    pub fn prepare_recv(
        &mut self,
        qp: QpId,
        req: RecvRequest<B>,
    ) -> Result<PreparedRecv, PostError<RecvRequest<B>>> {
        let built = self.slot(qp).and_then(|slot| {
            if slot.has_srq {
                return Err(super::check::cannot_recv(slot.state, true));
            }
            PreparedWr::recv(&req.sgl, slot.caps.max_recv_sge)
        });
        let wr = match built {
            Ok(wr) => wr,
            Err(error) => {
                return Err(PostError {
                    error,
                    request: req,
                })
            }
        };
        let RecvRequest { tag, sgl } = req;
        let entry = Entry {
            qp: qp.index,
            wr,
            sgl,
            tag,
            opcode: WcOpcode::RECV,
            signaled: true,
            last_post: NEVER,
            key: 0,
        };
        let (index, key) = self.prepared.insert(true, entry);
        Ok(PreparedRecv { index, key })
    }

    /// Posts a prepared request (again). Its completion comes back from
    /// [`Engine::poll`] with the request's tag, its [`Prepared`] handle and
    /// no buffers. A request may be posted again before an earlier post of
    /// it completed: one source buffer behind a whole window of Writes.
    #[inline(always)]
    pub fn post_prepared<H: PreparedHandle>(&mut self, p: H) -> Result<(), Error> {
        self.post_prepared_as(p, true)
    }

    /// [`Engine::post_prepared`] for a send, unsignaled this time (unless
    /// the queue needs a signal: see `SendRequest::unsignaled`).
    #[inline(always)]
    pub fn post_prepared_unsignaled(&mut self, p: PreparedSend) -> Result<(), Error> {
        self.post_prepared_as(p, false)
    }

    #[inline(always)]
    fn post_prepared_as<H: PreparedHandle>(
        &mut self,
        p: H,
        as_prepared: bool,
    ) -> Result<(), Error> {
        let (index, key) = p.parts();
        let table = if H::RECV {
            &mut self.prepared.recvs
        } else {
            &mut self.prepared.sends
        };
        let entry = match table.get_mut(index as usize) {
            // One test for engine, generation, liveness and no loan.
            Some(e) if e.key == key => e,
            other => rebuilt(other, key, &self.qps, H::RECV)?,
        };
        let slot = &mut self.qps[entry.qp as usize];
        let qp = slot.qp.as_ref().ok_or_else(gone)?;
        if H::RECV {
            if slot.recv.len() >= slot.recv_room {
                return Err(super::check::cannot_recv(slot.state, slot.has_srq));
            }
            let seq = slot.recv.next_seq();
            super::doorbell::recv_prepared(&mut self.prov, qp, entry.qp, seq, &mut entry.wr)?;
            entry.last_post = seq;
            let s = slot.recv.push(entry.tag, WcOpcode::RECV, true);
            s.prepared = index;
            s.generation = key as u32;
            return Ok(());
        }
        if slot.send.len() >= slot.send_room {
            return Err(super::check::cannot_send(slot.state));
        }
        let asked = as_prepared && entry.signaled;
        // A signaled post (the latency tests' every one) reads no run.
        let mut run = if asked { 0 } else { slot.unsignaled_run };
        let signaled =
            asked || super::qp_slot::signal_decision(&mut run, slot.send.capacity(), false, 0);
        let seq = slot.send.next_seq();
        super::doorbell::send_prepared(&mut self.prov, qp, entry.qp, seq, &mut entry.wr, signaled)
            .map_err(super::check::post_hint)?;
        entry.last_post = seq;
        slot.unsignaled_run = run;
        let s = slot.send.push(entry.tag, entry.opcode, signaled);
        s.prepared = index;
        s.generation = key as u32;
        Ok(())
    }

    /// The live entry `p` names, refused while its latest post is in flight.
    fn idle_entry<H: PreparedHandle>(
        &mut self,
        p: H,
        call: &'static crate::error::Site,
    ) -> Result<&mut Entry<B>, Error> {
        let (index, key) = p.parts();
        let entry = self.prepared.entry(H::RECV, index, key)?;
        let slot = &self.qps[entry.qp as usize];
        let ring = if H::RECV { &slot.recv } else { &slot.send };
        if entry.last_post != NEVER && ring.contains(entry.last_post) {
            return Err(busy(call));
        }
        Ok(entry)
    }

    /// The first buffer of a prepared request, to read what a receive or a
    /// Read brought or to write what the next post sends. Refused while a
    /// post of the request is in flight. The next post rebuilds the
    /// request's entries from the buffer held then (one swapped in is used).
    pub fn prepared_buf<H: PreparedHandle>(&mut self, p: H) -> Result<&mut B, Error> {
        let entry = self.idle_entry(
            p,
            site!(
                "prepared_buf",
                "a post of this prepared request is still in flight",
                "poll until its completion comes back"
            ),
        )?;
        entry.key |= LENT;
        entry.sgl.buf_mut(0).ok_or_else(no_buffer)
    }

    /// Ends a prepared request and hands its buffers back (in
    /// scatter/gather order). Refused while a post of it is in flight.
    pub fn release_prepared<H: PreparedHandle>(
        &mut self,
        p: H,
    ) -> Result<impl Iterator<Item = B>, Error> {
        let entry = self.idle_entry(
            p,
            site!(
                "release_prepared",
                "a post of this prepared request is still in flight",
                "poll until its completion comes back"
            ),
        )?;
        entry.key = (entry.key & !LENT) | RELEASED;
        Ok(core::mem::take(&mut entry.sgl).into_bufs())
    }
}

impl<B: HostBuf, P: Provider> Engine<B, P> {
    /// Copies `src` into the first buffer of a prepared request at `offset`
    /// (from the buffer's start), for the next post to send. Refused while
    /// a post of the request is in flight. Cheaper than a loan, which makes
    /// the next post rebuild the request's entries.
    #[inline(always)]
    pub fn write_prepared<H: PreparedHandle>(
        &mut self,
        p: H,
        offset: usize,
        src: &[u8],
    ) -> Result<(), Error> {
        let entry = self.idle_entry(
            p,
            site!(
                "write_prepared",
                "a post of this prepared request is still in flight",
                "poll until its completion comes back"
            ),
        )?;
        entry
            .sgl
            .buf_mut(0)
            .ok_or_else(no_buffer)?
            .write_at(offset, src)
    }

    /// Copies from the first buffer of a prepared request at `offset` into
    /// `dst` (what a receive or a Read brought). Refused while a post of the
    /// request is in flight.
    #[inline]
    pub fn read_prepared<H: PreparedHandle>(
        &mut self,
        p: H,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<(), Error> {
        let entry = self.idle_entry(
            p,
            site!(
                "read_prepared",
                "a post of this prepared request is still in flight",
                "poll until its completion comes back"
            ),
        )?;
        entry
            .sgl
            .buf_mut(0)
            .ok_or_else(no_buffer)?
            .read_at(offset, dst)
    }
}

/// `post_prepared`'s cold path: the entry after a loan, its entries rebuilt
/// from the buffers it holds now.
#[cold]
fn rebuilt<'a, B: NicBuf, Q>(
    entry: Option<&'a mut Entry<B>>,
    key: u64,
    qps: &[super::qp_slot::QpSlot<B, Q>],
    recv: bool,
) -> Result<&'a mut Entry<B>, Error> {
    match entry {
        Some(e) if e.key == key | LENT => {
            let caps = qps[e.qp as usize].caps;
            let max_sge = if recv {
                caps.max_recv_sge
            } else {
                caps.max_send_sge
            };
            e.wr.rebuild(&e.sgl, max_sge)?;
            e.key &= !LENT;
            Ok(e)
        }
        _ => Err(gone()),
    }
}
