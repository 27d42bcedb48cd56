//! Prepared requests: built and checked once, then posted again and again,
//! as perftest posts one prebuilt work request. A send's post only stamps a
//! sequence number and rings the doorbell; a receive's id is fixed when it
//! is prepared (it names the entry, which counts its posts in flight: a
//! receive queue completes every request with an entry of its own, so no
//! in-flight slot is needed). A completion hands no buffer back, because
//! the buffers stay with the queue pair until
//! [`QueuePair::release_prepared`].
//!
//! Between posts, [`QueuePair::write_prepared`] and
//! [`QueuePair::read_prepared`] copy in and out and
//! [`QueuePair::prepared_buf`] lends the first buffer; all are refused
//! while any post of the request is in flight. A loan may swap the buffer,
//! so the next post rebuilds the scatter/gather entries from whatever
//! buffer the entry holds: one swapped in is used (and owned) the same way.
#![allow(unsafe_code)]

use alloc::vec::Vec;
use core::mem::MaybeUninit;

use crate::cq::WcOpcode;
use crate::error::{Error, ErrorKind};
use crate::memory::LocalBuf;
use crate::sys::{self, ibv_send_flags as F, Zeroed};
use crate::wr::{Local, RecvRequest, SendRequest, MAX_SGE};

use super::post::{
    expected_opcode, fill_sges, flags, post_hint, signal_decision, PostError, PREPARED_RECV,
};
use super::QueuePair;

/// A request a queue pair keeps for posting again: a handle, valid on the
/// queue pair that prepared it until released.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Prepared {
    index: u32,
    recv: bool,
    /// `key(qp_num, generation)`, the generation of the entry when
    /// prepared: a handle kept past its release does not reach the request
    /// prepared next in the same entry, nor one of another queue pair.
    key: u64,
}

/// An entry's key: the QP number (24 bits) and the entry's generation.
#[inline(always)]
fn key(qp_num: u32, generation: u32) -> u64 {
    u64::from(qp_num) << 32 | u64::from(generation)
}

/// Set in the key of a released entry: no handle's key has it.
const RELEASED: u64 = 1 << 63;

/// Set in the key of an entry whose buffer `prepared_buf` lent out since
/// its scatter/gather entries were built (the loan could swap it): a post's
/// one key test misses, and its cold path rebuilds them.
const LENT: u64 = 1 << 62;

/// The generation's bits of a key.
const GENERATION: u64 = u32::MAX as u64;

/// `Entry::last_post` of a request never posted: no queue reaches it.
const NEVER: u64 = u64::MAX;

impl Prepared {
    /// The handle of a post the in-flight table recorded.
    #[inline(always)]
    pub(crate) fn of_post(index: u32, generation: u32, qp_num: u32, recv: bool) -> Prepared {
        Prepared {
            index,
            recv,
            key: key(qp_num, generation),
        }
    }

    /// The generation of the entry this handle names.
    #[inline(always)]
    pub(crate) fn generation(&self) -> u32 {
        self.key as u32
    }

    /// True for a receive.
    pub fn is_recv(&self) -> bool {
        self.recv
    }
}

/// One kept request.
pub(crate) struct Entry<B> {
    /// The send work request, filled once (unused for receives); a post
    /// sets its id and flags. Its `sg_list` points at `sges`, set by
    /// `PreparedTable::insert`, the only place entries move.
    wr: sys::ibv_send_wr,
    /// The receive work request (unused for sends), its id and `sg_list`
    /// set by `PreparedTable::insert`.
    recv_wr: sys::ibv_recv_wr,
    /// Built from `bufs` and `spans`; rebuilt at the next post after
    /// `prepared_buf` lent a buffer out (`LENT`), which could swap it.
    sges: [sys::ibv_sge; MAX_SGE],
    /// Offset and length of each scatter/gather entry in its buffer.
    spans: [(usize, u32); MAX_SGE],
    bufs: [Option<B>; MAX_SGE],
    nbufs: usize,
    tag: u64,
    opcode: WcOpcode,
    signaled: bool,
    /// Send flags but `SIGNALED`, which is decided at each post.
    flags: F,
    /// A send: sequence number of its latest post (`NEVER` before the
    /// first). Queues complete in post order, so the buffers are the NIC's
    /// exactly while that post is in flight; its completion needs no visit
    /// here.
    last_post: u64,
    /// A receive: its posts in flight, counted down by its completions.
    in_flight: u32,
    /// `key(qp_num, generation)`, the generation bumped at every release;
    /// with `RELEASED` set while the entry is free for the next prepare.
    key: u64,
}

impl<B: LocalBuf> Entry<B> {
    /// An entry of the request whose entries `fill_sges` built into `sges`.
    fn new(
        wr: sys::ibv_send_wr,
        sges: [sys::ibv_sge; MAX_SGE],
        locals: &mut [Option<Local<B>>; MAX_SGE],
    ) -> Entry<B> {
        let mut entry = Entry {
            wr,
            recv_wr: sys::ibv_recv_wr {
                wr_id: 0,
                next: core::ptr::null_mut(),
                sg_list: core::ptr::null_mut(),
                num_sge: 0,
            },
            sges,
            spans: [(0, 0); MAX_SGE],
            bufs: [None, None, None, None],
            nbufs: 0,
            tag: 0,
            opcode: WcOpcode::SEND,
            signaled: true,
            flags: F::EMPTY,
            last_post: NEVER,
            in_flight: 0,
            key: 0, // set by `PreparedTable::insert`
        };
        for (i, l) in locals.iter_mut().enumerate() {
            let Some(l) = l.take() else { break };
            // `fill_sges` checked that every length fits in 32 bits.
            entry.spans[i] = (l.offset, l.len as u32);
            entry.bufs[i] = Some(l.buf);
            entry.nbufs = i + 1;
        }
        entry.wr.num_sge = entry.nbufs as i32;
        entry.recv_wr.num_sge = entry.nbufs as i32;
        entry
    }

    /// Rebuilds the scatter/gather entries from the buffers held now, after
    /// a loan (`LENT`).
    fn rebuild_sges(&mut self) -> Result<(), Error> {
        for i in 0..self.nbufs {
            let (offset, length) = self.spans[i];
            let Some(buf) = &self.bufs[i] else {
                return Err(gone());
            };
            // A buffer swapped in through `prepared_buf` may be shorter.
            if offset + length as usize > buf.len() {
                return Err(Error::invalid(
                    "post_prepared",
                    "the buffer is shorter than the prepared range",
                ));
            }
            self.sges[i] = sys::ibv_sge {
                addr: buf.addr() + offset as u64,
                length,
                lkey: buf.lkey(),
            };
        }
        self.key &= !LENT;
        Ok(())
    }

    fn take_bufs(&mut self) -> impl Iterator<Item = B> {
        // Only a live entry (no `RELEASED`) is released.
        let generation = (self.key as u32).wrapping_add(1);
        self.key = RELEASED | (self.key & !(GENERATION | LENT)) | u64::from(generation);
        self.nbufs = 0;
        core::mem::take(&mut self.bufs).into_iter().flatten()
    }
}

/// The prepared requests of one queue pair, per queue. Entries are reused
/// after release, so a loop that prepares and releases per run does not
/// grow the table.
pub(crate) struct PreparedTable<B> {
    /// The queue pair's number: handles of other queue pairs are refused.
    qp_num: u32,
    sends: Vec<Entry<B>>,
    recvs: Vec<Entry<B>>,
}

impl<B: LocalBuf> PreparedTable<B> {
    pub(crate) fn new(qp_num: u32) -> PreparedTable<B> {
        PreparedTable {
            qp_num,
            sends: Vec::new(),
            recvs: Vec::new(),
        }
    }

    #[inline(always)]
    fn queue(&mut self, recv: bool) -> &mut Vec<Entry<B>> {
        if recv {
            &mut self.recvs
        } else {
            &mut self.sends
        }
    }

    /// Stores `entry`, in a released slot if there is one (allocates
    /// otherwise: setup time), and returns its handle.
    fn insert(&mut self, recv: bool, mut entry: Entry<B>) -> Prepared {
        let qp_num = self.qp_num;
        let table = self.queue(recv);
        let memory = table.as_ptr();
        let index = match table.iter().position(|e| e.key & RELEASED != 0) {
            Some(i) => {
                entry.key = key(qp_num, table[i].key as u32);
                table[i] = entry;
                i
            }
            None => {
                entry.key = key(qp_num, 0);
                table.push(entry);
                table.len() - 1
            }
        };
        if recv {
            table[index].recv_wr.wr_id = PREPARED_RECV | index as u64;
        }
        // Entries move only here: the new one, and all of them when the
        // table grew into new memory. From now to the next insert, each
        // one's requests point at its own scatter/gather entries, so a post
        // sets no pointer.
        let moved = if table.as_ptr() == memory {
            index..index + 1
        } else {
            0..table.len()
        };
        for e in &mut table[moved] {
            e.wr.sg_list = e.sges.as_mut_ptr();
            e.recv_wr.sg_list = e.sges.as_mut_ptr();
        }
        Prepared {
            index: index as u32,
            recv,
            key: table[index].key,
        }
    }

    /// Counts down a post of receive `index`, which its completion names,
    /// and returns its tag and generation; `None` if none is in flight.
    #[inline(always)]
    pub(crate) fn complete_recv(&mut self, index: u32) -> Option<(u64, u32)> {
        let e = self.recvs.get_mut(index as usize)?;
        e.in_flight = e.in_flight.checked_sub(1)?;
        Some((e.tag, e.key as u32))
    }

    /// The posts of prepared receives in flight: summed here, off the data
    /// path, rather than counted on every post and completion.
    pub(crate) fn recvs_in_flight(&self) -> u64 {
        self.recvs.iter().map(|e| u64::from(e.in_flight)).sum()
    }

    /// The live entry `p` names on this queue pair.
    #[inline(always)]
    fn entry(&mut self, p: Prepared) -> Result<&mut Entry<B>, Error> {
        match self.queue(p.recv).get_mut(p.index as usize) {
            Some(e) if e.key & !LENT == p.key => Ok(e),
            _ => Err(gone()),
        }
    }

    /// The live entry `p` names, its scatter/gather entries built from the
    /// buffers it holds now: what a post needs.
    #[inline(always)]
    fn ready_entry(&mut self, p: Prepared) -> Result<&mut Entry<B>, Error> {
        match self.queue(p.recv).get_mut(p.index as usize) {
            // One test for queue pair, generation, liveness and no loan.
            Some(e) if e.key == p.key => Ok(e),
            other => rebuilt(other, p.key),
        }
    }
}

/// `ready_entry`'s cold path: the entry after a loan, rebuilt.
#[cold]
fn rebuilt<B: LocalBuf>(entry: Option<&mut Entry<B>>, key: u64) -> Result<&mut Entry<B>, Error> {
    match entry {
        Some(e) if e.key == key | LENT => {
            e.rebuild_sges()?;
            Ok(e)
        }
        _ => Err(gone()),
    }
}

#[cold]
fn gone() -> Error {
    Error::invalid(
        "prepared request",
        "not prepared on this queue pair, or released",
    )
}

#[cold]
fn no_buffer(call: &'static str) -> Error {
    Error::invalid(call, "the request has no buffer")
}

#[cold]
fn busy(call: &'static str) -> Error {
    Error::new(call, ErrorKind::BadState)
        .with_detail("a post of this prepared request is still in flight")
        .with_hint("poll until its completion comes back")
}

impl<B: LocalBuf> QueuePair<B> {
    /// Keeps `req` for posting with [`QueuePair::post_prepared`]: its
    /// operation, flags and tag are checked and fixed now, and its buffers
    /// stay with the queue pair until [`QueuePair::release_prepared`].
    /// Setup time: may allocate a table entry.
    #[allow(clippy::result_large_err)]
    pub fn prepare_send(
        &mut self,
        mut req: SendRequest<B>,
    ) -> Result<Prepared, PostError<SendRequest<B>>> {
        let mut wr = sys::ibv_send_wr::zeroed();
        let mut sges = [sys::ibv_sge::default(); MAX_SGE];
        if let Err(error) = self.fill_checked("prepare_send", &req, &mut wr, &mut sges) {
            return Err(PostError {
                error,
                request: req,
            });
        }
        let mut entry = Entry::new(wr, sges, &mut req.locals);
        let f = req.flags;
        entry.flags = flags(false, f.fence, f.solicited, f.inline);
        entry.tag = req.tag;
        entry.opcode = expected_opcode(&req.op);
        entry.signaled = req.flags.signaled;
        Ok(self.prepared.insert(false, entry))
    }

    /// Keeps `req` for posting with [`QueuePair::post_prepared`], as
    /// [`QueuePair::prepare_send`] does for sends.
    #[allow(clippy::result_large_err)]
    pub fn prepare_recv(
        &mut self,
        mut req: RecvRequest<B>,
    ) -> Result<Prepared, PostError<RecvRequest<B>>> {
        let mut sges = [sys::ibv_sge::default(); MAX_SGE];
        if let Err(error) = fill_sges(&req.locals, &mut sges) {
            return Err(PostError {
                error,
                request: req,
            });
        }
        let mut entry = Entry::new(sys::ibv_send_wr::zeroed(), sges, &mut req.locals);
        entry.tag = req.tag;
        entry.opcode = WcOpcode::RECV;
        Ok(self.prepared.insert(true, entry))
    }

    /// Posts a prepared request (again). Its completion comes back from
    /// [`poll`](QueuePair::poll) with the request's tag,
    /// [`Completion::prepared`](super::Completion::prepared) set and no
    /// buffers. A request may be posted again before an earlier post of it
    /// completed: one source buffer behind a whole window of Writes, as
    /// perftest's bandwidth tests post it.
    #[inline(always)]
    pub fn post_prepared(&mut self, p: Prepared) -> Result<(), Error> {
        self.post_prepared_as(p, true)
    }

    /// [`QueuePair::post_prepared`] for a send, unsignaled this time (unless
    /// the queue needs a signal: see [`SendRequest::unsignaled`]).
    #[inline(always)]
    pub fn post_prepared_unsignaled(&mut self, p: Prepared) -> Result<(), Error> {
        self.post_prepared_as(p, false)
    }

    /// Posts `p`, signaled as prepared if `as_prepared`, else unsignaled.
    #[inline(always)]
    fn post_prepared_as(&mut self, p: Prepared, as_prepared: bool) -> Result<(), Error> {
        if p.recv {
            return self.post_prepared_recv(p);
        }
        self.check_can_send("post_prepared", 1)?;
        let seq = self.send.next_seq();
        let entry = self.prepared.ready_entry(p)?;
        let asked = as_prepared && entry.signaled;
        // A signaled post (the latency tests' every one) reads no run.
        let mut run = if asked { 0 } else { self.unsignaled_run };
        let signaled = asked || signal_decision(&mut run, self.send.capacity(), false, 0);
        entry.wr.wr_id = seq;
        entry.wr.send_flags = if signaled {
            entry.flags | F::SIGNALED
        } else {
            entry.flags
        };
        // Written by the provider only on failure, and never read here.
        let mut bad = MaybeUninit::uninit();
        // SAFETY: live QP; `wr` and the `sges` it points at (set by
        // `insert`, where entries move) are valid for the call and name
        // buffers the entry owns, which stay in the table, out of reach
        // (`idle_entry` refuses `prepared_buf` and release while this post,
        // recorded as `last_post`, is in flight), until the completion is
        // polled.
        let rc =
            unsafe { sys::verbs_shim_post_send(self.qp.as_ptr(), &mut entry.wr, bad.as_mut_ptr()) };
        crate::ret::check_rc("ibv_post_send", rc).map_err(post_hint)?;
        entry.last_post = seq;
        self.unsignaled_run = run;
        self.send
            .push_prepared(entry.tag, entry.opcode, signaled, p.index, p.generation());
        Ok(())
    }

    /// A receive keeps no in-flight slot, so only the state (or a shared
    /// receive queue) is checked here; the provider refuses a full queue.
    #[inline(always)]
    fn post_prepared_recv(&mut self, p: Prepared) -> Result<(), Error> {
        if self.recv_room == 0 {
            return Err(self.cannot_recv());
        }
        let entry = self.prepared.ready_entry(p)?;
        // Written by the provider only on failure, and never read here.
        let mut bad = MaybeUninit::uninit();
        // SAFETY: live QP; the entry's `recv_wr` and the `sges` it points
        // at (set by `insert`, where entries move) are valid for the call
        // and name buffers the entry keeps out of reach (`idle_entry`
        // refuses while `in_flight`, counted below) until the receive
        // completes.
        let rc = unsafe {
            sys::verbs_shim_post_recv(self.qp.as_ptr(), &mut entry.recv_wr, bad.as_mut_ptr())
        };
        crate::ret::check_rc("ibv_post_recv", rc)?;
        entry.in_flight += 1;
        Ok(())
    }

    /// The first buffer of a prepared request, to read what a receive or a
    /// Read brought or to write what the next post sends. Refused while a
    /// post of the request is in flight.
    #[inline]
    pub fn prepared_buf(&mut self, p: Prepared) -> Result<&mut B, Error> {
        let entry = self.idle_entry(p, "prepared_buf")?;
        entry.key |= LENT;
        entry.bufs[0]
            .as_mut()
            .ok_or_else(|| no_buffer("prepared_buf"))
    }

    /// Copies `src` into the first buffer of a prepared request at `offset`
    /// (from the buffer's start), for the next post to send. Refused while
    /// a post of the request is in flight. Cheaper than
    /// [`QueuePair::prepared_buf`], which makes the next post rebuild the
    /// request's scatter/gather entries.
    // Always: a short copy of a known length folds to a few stores.
    #[inline(always)]
    pub fn write_prepared(&mut self, p: Prepared, offset: usize, src: &[u8]) -> Result<(), Error> {
        let at = self.prepared_range(p, offset, src.len(), "write_prepared")?;
        // SAFETY: `prepared_range` checked that no post is in flight and
        // that the range lies in the buffer, whose memory the entry owns
        // (`LocalBuf`); volatile, as a peer may reach an exposed buffer.
        unsafe { crate::memory::volatile_copy_in(at, src) };
        Ok(())
    }

    /// Copies from the first buffer of a prepared request at `offset` into
    /// `dst` (what a receive or a Read brought). Refused while a post of
    /// the request is in flight.
    #[inline]
    pub fn read_prepared(
        &mut self,
        p: Prepared,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<(), Error> {
        let at = self.prepared_range(p, offset, dst.len(), "read_prepared")?;
        // SAFETY: as in `write_prepared`.
        unsafe { crate::memory::volatile_copy_out(at, dst) };
        Ok(())
    }

    /// The address of `len` bytes at `offset` in the first buffer of `p`,
    /// checked to be in the buffer while no post of `p` is in flight.
    #[inline(always)]
    fn prepared_range(
        &mut self,
        p: Prepared,
        offset: usize,
        len: usize,
        call: &'static str,
    ) -> Result<*mut u8, Error> {
        let entry = self.idle_entry(p, call)?;
        let Some(buf) = &entry.bufs[0] else {
            return Err(no_buffer(call));
        };
        crate::memory::check_range(call, offset, len, buf.len())?;
        Ok((buf.addr() as usize + offset) as *mut u8)
    }

    /// Ends a prepared request and hands its buffers back (in
    /// scatter/gather order). Refused while a post of it is in flight.
    pub fn release_prepared(&mut self, p: Prepared) -> Result<impl Iterator<Item = B>, Error> {
        let entry = self.idle_entry(p, "release_prepared")?;
        Ok(entry.take_bufs())
    }

    /// The live entry `p` names, refused while a post of it is in flight.
    #[inline(always)]
    fn idle_entry(&mut self, p: Prepared, call: &'static str) -> Result<&mut Entry<B>, Error> {
        let entry = self.prepared.entry(p)?;
        let busy_now = if p.recv {
            entry.in_flight != 0
        } else {
            self.send.contains(entry.last_post)
        };
        if busy_now {
            return Err(busy(call));
        }
        Ok(entry)
    }
}
