//! The engine's address handles, owned by it and named by [`AhId`]: a UD
//! send's destination. The engine, not the caller, decides when one is
//! destroyed, so no posted send can outlive the handle it names.
//!
//! The rule: an address handle is destroyed only while no UD queue pair of
//! the engine has a send in flight (`Engine::remove_ah` refuses otherwise;
//! cheap, exact enough, and needs nothing on the data path), or when the
//! engine drops it after every queue pair was destroyed. Once a queue pair
//! was leaked (its destroy failed, so the device may still send with any
//! handle), the table is pinned: its handles are never destroyed.

use alloc::vec::Vec;

use crate::error::{site, Error, ErrorKind};
use crate::raw::RawAh;

/// An address handle of an engine: valid on the engine that created it
/// (so in its protection domain, on its device), until it is removed. A
/// handle of another engine, or of a removed one, reaches nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AhId {
    pub(crate) engine: u32,
    pub(crate) index: u32,
    pub(crate) generation: u32,
}

struct AhSlot {
    ah: Option<RawAh>,
    generation: u32,
}

/// The handles, by index; a removed one's index is reused with the next
/// generation.
pub(crate) struct AhTable {
    slots: Vec<AhSlot>,
    vacant: Vec<u32>,
    /// A queue pair was leaked: never destroy a handle.
    pinned: bool,
}

impl AhTable {
    pub(crate) const fn new() -> AhTable {
        AhTable {
            slots: Vec::new(),
            vacant: Vec::new(),
            pinned: false,
        }
    }

    /// Keeps `ah` and returns its id on engine `engine`.
    pub(crate) fn insert(&mut self, engine: u32, ah: RawAh) -> AhId {
        let index = match self.vacant.pop() {
            Some(i) => i,
            None => {
                self.slots.push(AhSlot {
                    ah: None,
                    generation: 0,
                });
                (self.slots.len() - 1) as u32
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.generation = slot.generation.wrapping_add(1);
        slot.ah = Some(ah);
        AhId {
            engine,
            index,
            generation: slot.generation,
        }
    }

    /// The live handle `id` names on engine `engine`.
    #[inline]
    pub(crate) fn get(&self, engine: u32, id: AhId) -> Result<&RawAh, Error> {
        match self.slots.get(id.index as usize) {
            Some(AhSlot {
                ah: Some(ah),
                generation,
            }) if id.engine == engine && *generation == id.generation => Ok(ah),
            _ => Err(no_such_ah()),
        }
    }

    /// Takes the handle `id` names out of the table (the caller checked
    /// that no posted send names it); `id` reaches nothing from now on.
    /// `None` when the table is pinned: the handle is leaked instead.
    pub(crate) fn take(&mut self, engine: u32, id: AhId) -> Result<Option<RawAh>, Error> {
        self.get(engine, id)?;
        let ah = self.slots[id.index as usize].ah.take();
        self.vacant.push(id.index);
        if self.pinned {
            core::mem::forget(ah);
            return Ok(None);
        }
        Ok(ah)
    }

    /// Never destroy a handle from now on (a queue pair was leaked).
    pub(crate) fn pin(&mut self) {
        self.pinned = true;
    }

    /// Live handles.
    pub(crate) fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.ah.is_some()).count()
    }
}

impl Drop for AhTable {
    fn drop(&mut self) {
        if self.pinned {
            // A leaked queue pair may still send with any of them.
            for slot in self.slots.drain(..) {
                core::mem::forget(slot);
            }
        }
    }
}

#[cold]
fn no_such_ah() -> Error {
    Error::new(
        site!(
            "address handle",
            "not an address handle of this engine (so of another protection domain or device), or removed"
        ),
        ErrorKind::NotFound,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_table_knows_no_id() {
        let t = AhTable::new();
        let id = AhId {
            engine: 1,
            index: 0,
            generation: 1,
        };
        assert_eq!(
            t.get(1, id).err().map(|e| e.kind()),
            Some(ErrorKind::NotFound)
        );
        assert_eq!(t.len(), 0);
    }
}
