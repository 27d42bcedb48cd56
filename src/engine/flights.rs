//! The engine's requests in flight: one table per completion queue, one
//! entry per request posted and not yet retired, whichever queue pair
//! posted it. Every request in flight may still owe its completion queue
//! an entry (a signaled one, or any after an error), so the table holds
//! as many requests as the completion queue holds completions: a post
//! that finds it full is refused, and the completion queue can never
//! overflow however many queue pairs share it (the completion-queue
//! credits of UCX's and Mooncake's workers). A queue pair's depth is a
//! maximum, not a reservation: 10,000 queue pairs of 128 + 128 fit one
//! completion queue of 32,767.
//!
//! An entry keeps a request's first buffer; the rest of a request of
//! several go to an entry of the overflow table (one per request at
//! most), so a one-buffer request costs one entry. Both tables are
//! reserved when the engine is made (the overflow table when the first
//! queue pair granted more than one scatter/gather entry is added), sized
//! by the completion queue, never grow after that, and are touched only
//! as far as requests fill them (but for the first `PREFILLED` entries,
//! made with the engine): a fresh engine's tables are mostly address
//! space, not memory. Released entries are reused last-in first-out, so
//! a loop with few requests in flight stays on a few warm entries.

use alloc::vec::Vec;

use crate::sgl::{Local, Sgl};
use crate::sys::ibv_wc_opcode as WcOpcode;

use super::ring::{Ring, NONE};

mod overflow;

use overflow::OverflowTable;

/// `Flight::prepared` of a request posted with its own buffers.
pub(crate) const NOT_PREPARED: u32 = u32::MAX;

/// Set in `Flight::prepared` for a post handed back only if it fails
/// (`Engine::post_prepared_unreported`): a prepared request's index stays
/// below it (`MAX_PREPARED`), and a request with its own buffers is never
/// posted unreported.
pub(crate) const UNREPORTED: u32 = 1 << 31;

/// Entries a table makes with its engine, before any request: a loop's
/// first requests take made entries (no data path pays for making them),
/// and a table of them is a few tens of KiB however deep its completion
/// queue.
const PREFILLED: u32 = if cfg!(test) { 8 } else { 256 };

/// What the table keeps of a posted request until it completes.
pub(crate) struct Flight<B> {
    /// The next request of its queue (or the next released entry).
    next: u32,
    /// Its overflow entry (its buffers after the first), or `NONE`.
    more: u32,
    /// The opcode a successful completion reports (for unsignaled requests,
    /// which get no completion entry of their own, and for errors, whose
    /// entry's opcode is undefined).
    pub(crate) opcode: WcOpcode,
    /// The prepared request this is a post of (its table index, with
    /// `UNREPORTED` for a post handed back only if it fails), or
    /// `NOT_PREPARED`; its buffers stay in that table.
    pub(crate) prepared: u32,
    /// That prepared request's generation.
    pub(crate) generation: u32,
    pub(crate) tag: u64,
    /// The request's first buffer (none for prepared, inline and bind posts).
    buf: Option<Local<B>>,
}

impl<B> Flight<B> {
    /// An entry holding nothing, linked to `next`.
    fn vacant(next: u32) -> Flight<B> {
        Flight {
            next,
            more: NONE,
            opcode: WcOpcode::SEND,
            prepared: NOT_PREPARED,
            generation: 0,
            tag: 0,
            buf: None,
        }
    }
}

/// What a retired request hands back, its entry released: what the
/// entry kept, its first buffer moved out, its others (a request of
/// several) still in their overflow entry `more` until the caller takes
/// or releases them.
pub(crate) struct Retired<B> {
    pub(crate) tag: u64,
    pub(crate) opcode: WcOpcode,
    pub(crate) prepared: u32,
    pub(crate) generation: u32,
    pub(crate) more: u32,
    pub(crate) first: Option<Local<B>>,
}

impl<B> Retired<B> {
    /// A request that kept nothing with its tag and opcode.
    #[inline(always)]
    pub(crate) fn bare(tag: u64, opcode: WcOpcode) -> Retired<B> {
        Retired {
            tag,
            opcode,
            prepared: NOT_PREPARED,
            generation: 0,
            more: NONE,
            first: None,
        }
    }
}

/// One completion queue's requests in flight (see the module docs).
pub(crate) struct Flights<B> {
    entries: Vec<Flight<B>>,
    /// Released entries, linked through `next`.
    free: u32,
    capacity: u32,
    /// Requests the table can still take: entries neither in use nor
    /// reserved by a lane.
    available: u32,
    /// While no more than this many are available, every send asks for
    /// a completion (`Flights::crowded`).
    crowded: u32,
    overflow: OverflowTable<B>,
    /// The first of the requests the router detached and has not lent yet
    /// (`detach`), or `NONE`: released by the router's guard if a callback
    /// unwinds.
    pub(crate) detached: u32,
}

impl<B> Flights<B> {
    /// A table for `capacity` requests: reserved here (setup time), its
    /// first `PREFILLED` entries made (what a data path's first requests
    /// take), the others as requests first reach them.
    pub(crate) fn new(capacity: u32) -> Flights<B> {
        // An entry's index has 31 bits (`Engine::lent` adds the table's).
        let capacity = capacity.min(1 << 30);
        let made = capacity.min(PREFILLED);
        let mut entries = Vec::with_capacity(capacity as usize);
        entries.extend((0..made).map(|e| Flight::vacant(if e + 1 < made { e + 1 } else { NONE })));
        Flights {
            entries,
            free: if made > 0 { 0 } else { NONE },
            capacity,
            available: capacity,
            crowded: capacity.div_ceil(2),
            overflow: OverflowTable::new(),
            detached: NONE,
        }
    }

    /// Reserves the overflow table (setup time), for queue pairs granted
    /// more than one scatter/gather entry per request.
    pub(crate) fn allow_overflow(&mut self) {
        // One more than the entries: the request lent to a poll's callback
        // keeps its overflow entry, its own entry already released.
        self.overflow.reserve(self.capacity as usize + 1);
    }

    /// Requests it can still take.
    #[inline(always)]
    pub(crate) fn available(&self) -> u32 {
        self.available
    }

    /// True when the send posted `ahead` requests from now must ask for a
    /// completion: then at most half the table is available. A full table
    /// then always holds a signaled request (the one that filled it), so
    /// it empties again: unsignaled sends alone, spread over many queue
    /// pairs, cannot fill it with requests that never complete.
    #[inline(always)]
    pub(crate) fn crowded(&self, ahead: u32) -> bool {
        self.available <= self.crowded.saturating_add(ahead)
    }

    /// Takes `n` entries' room for a lane, whose posts only count.
    pub(crate) fn reserve(&mut self, n: u32) -> bool {
        match self.available.checked_sub(n) {
            Some(left) => {
                self.available = left;
                true
            }
            None => false,
        }
    }

    /// Gives back room `reserve` took.
    pub(crate) fn unreserve(&mut self, n: u32) {
        self.available += n;
    }

    /// An entry for a new request (its index, and itself to fill in);
    /// the caller checked `available`.
    #[inline(always)]
    fn take(&mut self) -> (u32, &mut Flight<B>) {
        debug_assert!(self.available > 0);
        self.available -= 1;
        let e = self.free;
        // `NONE` is past the end: one test for an empty list and the bounds.
        if e as usize >= self.entries.len() {
            return self.fresh();
        }
        let f = &mut self.entries[e as usize];
        self.free = f.next;
        (e, f)
    }

    /// An entry never used: within the capacity reserved at creation (a
    /// free list that is empty means every entry made is in use, and
    /// fewer than the capacity are), so it never reallocates.
    #[cold]
    #[inline(never)]
    fn fresh(&mut self) -> (u32, &mut Flight<B>) {
        debug_assert!(self.entries.len() < self.entries.capacity());
        let e = self.entries.len() as u32;
        self.entries.push(Flight::vacant(NONE));
        (e, &mut self.entries[e as usize])
    }

    /// Appends entry `e` to `ring`'s chain.
    #[inline(always)]
    fn link(&mut self, ring: &mut Ring, e: u32) {
        if ring.first == NONE {
            ring.first = e;
        } else {
            self.entries[ring.last as usize].next = e;
        }
        ring.last = e;
    }

    /// Records a request posted at the tail of `ring`: its tag, the opcode
    /// its completion reports, and its buffers, moved out of `sgl`. The
    /// caller checked `available`.
    #[inline(always)]
    pub(crate) fn push(&mut self, ring: &mut Ring, tag: u64, opcode: WcOpcode, sgl: &mut Sgl<B>) {
        let more = match sgl.len() {
            0 | 1 => NONE,
            _ => self.overflow.spill(sgl.take_rest()),
        };
        let (e, f) = self.take();
        f.next = NONE;
        f.more = more;
        f.tag = tag;
        f.opcode = opcode;
        f.prepared = NOT_PREPARED;
        // A released entry holds no buffer: nothing to drop. Taken out of
        // the list straight into the entry (not through a local first).
        core::mem::forget(core::mem::replace(&mut f.buf, sgl.take_head()));
        self.link(ring, e);
        ring.push_filled();
    }

    /// Records a post of prepared request `prepared` (its buffers stay in
    /// its table), or an inline or bind post (`NOT_PREPARED`: no buffers);
    /// `unreported`, the router hands it back only if it fails.
    #[inline(always)]
    pub(crate) fn push_bare(
        &mut self,
        ring: &mut Ring,
        tag: u64,
        opcode: WcOpcode,
        prepared: u32,
        generation: u32,
        unreported: bool,
    ) {
        let prepared = if unreported {
            prepared | UNREPORTED
        } else {
            prepared
        };
        let e = self.fill(tag, opcode, prepared, generation);
        self.link(ring, e);
        ring.push_filled();
    }

    /// A new entry, without buffers: its index.
    #[inline(always)]
    fn fill(&mut self, tag: u64, opcode: WcOpcode, prepared: u32, generation: u32) -> u32 {
        let (e, f) = self.take();
        f.next = NONE;
        f.more = NONE;
        f.tag = tag;
        f.opcode = opcode;
        f.prepared = prepared;
        f.generation = generation;
        e
    }

    /// Detaches the oldest `n` requests of `ring` (as `Ring::through`
    /// counted them) for the router to retire one by one (`retire`): the
    /// queue's window moves past them and their chain is cut off its own
    /// at once, so the queue is whole while each is lent to a callback
    /// that may post on it. Returns the first of them (the chain ends in
    /// `NONE`).
    #[inline(always)]
    pub(crate) fn detach(&mut self, ring: &mut Ring, n: u64) -> u32 {
        let first = ring.first;
        if n == ring.len() {
            // All of them (a queue's one signaled request completes them
            // all, in a stream): nothing to walk.
            ring.first = NONE;
        } else {
            self.cut(ring, n);
        }
        ring.pop_counted(n);
        first
    }

    /// `detach` of fewer requests than the queue holds: walks to the last.
    #[inline(never)]
    fn cut(&mut self, ring: &mut Ring, n: u64) {
        let mut last = ring.first;
        for _ in 1..n {
            last = self.entries[last as usize].next;
        }
        let f = &mut self.entries[last as usize];
        ring.first = core::mem::replace(&mut f.next, NONE);
    }

    /// Retires detached entry `e`: released, what it kept handed back,
    /// with the next entry of its detached chain.
    #[inline(always)]
    pub(crate) fn retire(&mut self, e: u32) -> (Retired<B>, u32) {
        let f = &mut self.entries[e as usize];
        let next = f.next;
        let kept = Retired {
            tag: f.tag,
            opcode: f.opcode,
            prepared: f.prepared,
            generation: f.generation,
            more: f.more,
            first: f.buf.take(),
        };
        f.next = self.free;
        self.free = e;
        self.available += 1;
        (kept, next)
    }

    /// Releases detached entry `e` if it was posted unreported (a prepared
    /// post: its buffers stay in its table): the next entry of its chain.
    #[inline(always)]
    pub(crate) fn release_unreported(&mut self, e: u32) -> Option<u32> {
        let f = &mut self.entries[e as usize];
        if !(UNREPORTED..NOT_PREPARED).contains(&f.prepared) {
            return None;
        }
        let next = core::mem::replace(&mut f.next, self.free);
        self.free = e;
        self.available += 1;
        Some(next)
    }

    /// Releases what is left of the detached chain (`detached`), dropping
    /// the buffers its entries keep (the device is done with them): what a
    /// callback that panicked left of its completion's requests.
    #[cold]
    pub(crate) fn release_detached(&mut self) {
        let mut e = core::mem::replace(&mut self.detached, NONE);
        while e != NONE {
            let (kept, next) = self.retire(e);
            drop(kept.first);
            if kept.more != NONE {
                self.release_overflow(kept.more);
            }
            e = next;
        }
    }

    /// Takes the first buffer `kept` still holds.
    #[inline(always)]
    pub(crate) fn take_first(&mut self, kept: &mut Retired<B>) -> Option<B> {
        match kept.first.take() {
            Some(l) => Some(l.buf),
            None if kept.more != NONE => self.overflow.take_one(kept.more),
            None => None,
        }
    }

    /// Every buffer `kept` still holds, as a list; none left in it (its
    /// overflow entry released).
    pub(crate) fn take_sgl(&mut self, kept: &mut Retired<B>) -> Sgl<B> {
        let rest = match core::mem::replace(&mut kept.more, NONE) {
            NONE => None,
            more => Some(self.overflow.unspill(more)),
        };
        Sgl::from_parts(kept.first.take(), rest)
    }

    /// `kept` holds the buffers of `sgl` (it holds none).
    pub(crate) fn hold(&mut self, kept: &mut Retired<B>, sgl: &mut Sgl<B>) {
        let (first, rest) = sgl.move_out();
        kept.first = first;
        kept.more = match rest {
            None => NONE,
            Some(rest) => self.overflow.spill(rest),
        };
    }

    /// Releases overflow entry `more` with the buffers it holds (a
    /// request lent to a callback that panicked).
    #[cold]
    pub(crate) fn release_overflow(&mut self, more: u32) {
        drop(self.overflow.unspill(more));
    }

    /// The entries of `ring`'s chain, oldest first.
    pub(crate) fn chain<'a>(&'a self, ring: &Ring) -> impl Iterator<Item = &'a Flight<B>> + 'a {
        let mut at = ring.first;
        core::iter::from_fn(move || {
            let f = self.entries.get(at as usize)?;
            at = f.next;
            Some(f)
        })
    }

    /// Releases every entry of `ring`'s chain, dropping the buffers they
    /// keep: only where the device is done with them (a lane's start,
    /// whose entries keep none; a destroyed queue pair's requests go back
    /// as flushed instead, `Engine::retire_all`). The window stays as it
    /// is.
    pub(crate) fn release_chain(&mut self, ring: &mut Ring) {
        while ring.first != NONE {
            let e = ring.first;
            let f = &mut self.entries[e as usize];
            ring.first = f.next;
            let buf = f.buf.take();
            let more = core::mem::replace(&mut f.more, NONE);
            f.next = self.free;
            self.free = e;
            self.available += 1;
            drop(buf);
            if more != NONE {
                drop(self.overflow.unspill(more));
            }
        }
        ring.last = NONE;
    }

    /// Leaks the buffers of `ring`'s chain (its queue pair's destroy
    /// failed: the device may still use them) and keeps its entries taken
    /// (it may still complete them, so their completion queue room stays
    /// counted).
    pub(crate) fn leak_chain(&mut self, ring: &mut Ring) {
        let mut at = ring.first;
        while let Some(f) = self.entries.get_mut(at as usize) {
            at = f.next;
            core::mem::forget(f.buf.take());
            let more = core::mem::replace(&mut f.more, NONE);
            self.overflow.leak(more);
        }
        ring.first = NONE;
        ring.last = NONE;
    }

    /// Gives each request `ring` counts in flight an entry naming the
    /// prepared request `post(seq)` says (its tag, opcode, index and
    /// generation): a lane's posts, which only counted, handed back to the
    /// engine. The caller made the room available (`unreserve`).
    pub(crate) fn adopt(
        &mut self,
        ring: &mut Ring,
        mut post: impl FnMut(u64) -> (u64, WcOpcode, u32, u32),
    ) {
        debug_assert!(ring.first == NONE);
        let head = ring.next_seq() - ring.len();
        for seq in head..ring.next_seq() {
            let (tag, opcode, prepared, generation) = post(seq);
            let e = self.fill(tag, opcode, prepared, generation);
            self.link(ring, e);
        }
    }
}
