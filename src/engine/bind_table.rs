//! The window binds an engine holds (`bind.rs`): one entry per bind posted
//! and not yet claimed, its window inside, reused once claimed.

use alloc::vec::Vec;

use super::qp_slot::QpId;

/// A window bind the engine holds until its completion; claimed once with
/// `Engine::claim_bind` (not `Clone`). Dropped unclaimed, its window stays
/// with the engine until the engine is dropped.
#[derive(Debug)]
pub(crate) struct BindTicket {
    engine: u32,
    index: u32,
    generation: u32,
}

/// One bind posted and not yet claimed.
struct Pending<W> {
    qp: QpId,
    /// Its sequence number on the queue pair's send queue.
    seq: u64,
    /// `None` once claimed (the entry is then free).
    window: Option<W>,
    generation: u32,
    /// Its queue pair's destroy failed: the device may still bind it.
    leaked: bool,
}

/// The binds an engine holds, in entries reused once claimed.
pub(crate) struct BindTable<W> {
    entries: Vec<Pending<W>>,
    free: Vec<u32>,
}

impl<W> BindTable<W> {
    pub(crate) const fn new() -> Self {
        BindTable {
            entries: Vec::new(),
            free: Vec::new(),
        }
    }

    /// The queue pair in slot `index` was leaked: so are its binds.
    pub(crate) fn leak_qp(&mut self, index: u32) {
        for p in &mut self.entries {
            if p.window.is_some() && p.qp.index == index {
                p.leaked = true;
            }
        }
    }

    /// Keeps `window`, whose bind is request `seq` of `qp` on engine
    /// `engine` (for good if `leaked`); the ticket claims it back.
    pub(crate) fn insert(
        &mut self,
        engine: u32,
        qp: QpId,
        seq: u64,
        window: W,
        leaked: bool,
    ) -> BindTicket {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.entries.push(Pending {
                    qp,
                    seq,
                    window: None,
                    generation: 0,
                    leaked: false,
                });
                (self.entries.len() - 1) as u32
            }
        };
        let p = &mut self.entries[index as usize];
        p.qp = qp;
        p.seq = seq;
        p.window = Some(window);
        p.leaked = leaked;
        BindTicket {
            engine,
            index,
            generation: p.generation,
        }
    }

    /// The queue pair, sequence number and leak of `ticket`'s bind, if
    /// the ticket is of this table (engine `engine`) and unclaimed.
    pub(crate) fn find(&self, engine: u32, ticket: &BindTicket) -> Option<(QpId, u64, bool)> {
        let p = self.entries.get(ticket.index as usize)?;
        let ours = ticket.engine == engine && p.generation == ticket.generation;
        (ours && p.window.is_some()).then_some((p.qp, p.seq, p.leaked))
    }

    /// Takes `ticket`'s window out (`find` found it); the entry is free.
    pub(crate) fn take(&mut self, ticket: &BindTicket) -> Option<W> {
        let p = self.entries.get_mut(ticket.index as usize)?;
        let window = p.window.take()?;
        p.generation = p.generation.wrapping_add(1);
        self.free.push(ticket.index);
        Some(window)
    }
}

impl<W> Drop for BindTable<W> {
    fn drop(&mut self) {
        // The device may still bind a leaked queue pair's windows.
        for p in &mut self.entries {
            if p.leaked {
                core::mem::forget(p.window.take());
            }
        }
    }
}
