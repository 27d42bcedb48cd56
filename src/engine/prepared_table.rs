//! The table of prepared requests: their handles (keyed by engine and
//! generation), their entries (work requests and buffers), and reuse of
//! released entries.

use alloc::vec::Vec;

use crate::error::{site, Error, ErrorKind};
use crate::sgl::Sgl;
use crate::sys::ibv_wc_opcode as WcOpcode;

use super::doorbell::PreparedWr;

/// Engine ids kept in a prepared handle's key (30 bits).
pub(crate) const ENGINE_ID_MASK: u32 = (1 << 30) - 1;
/// Set in the key of a released entry: no handle's key has it.
pub(super) const RELEASED: u64 = 1 << 32;
/// Set in the key of an entry whose buffer was lent since its entries were
/// built (a loan can swap it): a post's one key test misses and rebuilds.
pub(super) const LENT: u64 = 1 << 33;
/// Prepared requests a table holds at most: an index stays below
/// `flights::UNREPORTED`, which marks a post in flight.
const MAX_PREPARED: usize = (1 << 31) - 1;
/// `Entry::last_post` of a request never posted: no ring holds it.
pub(super) const NEVER: u64 = u64::MAX;

/// A send a queue pair keeps for posting again: valid on its engine until
/// released (or its queue pair removed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PreparedSend {
    pub(super) index: u32,
    pub(super) key: u64,
}

/// A receive a queue pair keeps for posting again (see [`PreparedSend`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PreparedRecv {
    pub(super) index: u32,
    pub(super) key: u64,
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
    pub(super) qp: u32,
    pub(super) wr: PreparedWr,
    pub(super) sgl: Sgl<B>,
    pub(super) tag: u64,
    pub(super) opcode: WcOpcode,
    pub(super) signaled: bool,
    /// Sequence number of the latest post (`NEVER` before the first).
    pub(super) last_post: u64,
    /// `engine << 34 | generation`, with `RELEASED` / `LENT`.
    pub(super) key: u64,
}

/// The prepared requests of one engine, sends and receives apart. Entries
/// are reused after release, so a loop that prepares and releases does not
/// grow the table.
pub(crate) struct PreparedTable<B> {
    pub(super) engine: u32,
    pub(super) sends: Vec<Entry<B>>,
    pub(super) recvs: Vec<Entry<B>>,
}

impl<B> PreparedTable<B> {
    pub(crate) fn new(engine: u32) -> PreparedTable<B> {
        PreparedTable {
            engine,
            sends: Vec::new(),
            recvs: Vec::new(),
        }
    }

    pub(super) fn table(&mut self, recv: bool) -> &mut Vec<Entry<B>> {
        if recv {
            &mut self.recvs
        } else {
            &mut self.sends
        }
    }

    /// Refuses a new entry when the table holds `MAX_PREPARED` live ones.
    pub(super) fn check_room(&self, recv: bool) -> Result<(), Error> {
        let table = if recv { &self.recvs } else { &self.sends };
        if table.len() < MAX_PREPARED || table.iter().any(|e| e.key & RELEASED != 0) {
            return Ok(());
        }
        Err(Error::new(
            site!(
                "prepare a request",
                "the engine holds 2^31 - 1 prepared requests of this kind",
                "release some (release_prepared)"
            ),
            ErrorKind::QueueFull,
        ))
    }

    /// Stores `entry` in a released slot if there is one (allocates
    /// otherwise: setup time; `check_room` first) and returns its index
    /// and key.
    pub(super) fn insert(&mut self, recv: bool, mut entry: Entry<B>) -> (u32, u64) {
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
    pub(super) fn entry(
        &mut self,
        recv: bool,
        index: u32,
        key: u64,
    ) -> Result<&mut Entry<B>, Error> {
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
pub(super) fn gone() -> Error {
    Error::new(
        site!(
            "prepared request",
            "not prepared on this engine, or released"
        ),
        ErrorKind::NotFound,
    )
}
