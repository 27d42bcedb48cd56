//! Finding a silent dead peer on a reliable connection.
//!
//! An RC queue pair learns its peer is gone only when something it sent
//! goes unacknowledged: a peer that dies with nothing of ours in flight to
//! it holds its queue pair forever. A keepalive is a zero-length RDMA
//! Write naming no memory (address 0, key 0; a responder checks no key
//! for a zero-length Write, IBA C9-88): a live peer's queue pair
//! acknowledges it, touching nothing; a dead one never does, and the write
//! completes with `RETRY_EXC_ERR` after the connection's retries. The
//! peer's queue pair must allow `REMOTE_WRITE` (without it the probe is an
//! invalid request to it, `REM_INV_REQ_ERR`); it needs no memory
//! registered for remote writes.
//!
//! [`KeepaliveTable`] says which connections were silent for a round (the
//! caller's clock: the library keeps no time), so that only those are
//! probed.

use alloc::vec::Vec;

use crate::error::{site, Error, ErrorKind};
use crate::memory::NicBuf;
use crate::wr::{RemoteSlice, SendOp, SendRequest};

use super::config::Transport;
use super::core::Engine;
use super::doorbell::Provider;
use super::qp_slot::{QpId, QpState};

impl<B: NicBuf, P: Provider> Engine<B, P> {
    /// Posts a keepalive on `qp` with `tag` (its completion's tag; it
    /// holds no buffer): `SUCCESS` when the peer acknowledged it,
    /// `RETRY_EXC_ERR` when the peer is gone, `REM_INV_REQ_ERR` when its
    /// queue pair allows no remote write. Refused for a queue pair that is
    /// not this engine's or was removed (`NotFound`), not RC
    /// (`Unsupported`) or not in RTS (`BadState`), and as any send is when
    /// its queue is full.
    pub fn keepalive(&mut self, qp: QpId, tag: u64) -> Result<(), Error> {
        let slot = self.slot(qp)?;
        if slot.transport != Transport::Rc {
            return Err(Error::new(
                site!(
                    "keepalive",
                    "only a reliable connection (RC) acknowledges a keepalive",
                    "a UC or UD queue pair never learns whether its peer is there"
                ),
                ErrorKind::Unsupported,
            ));
        }
        if slot.state != QpState::RTS {
            return Err(Error::new(
                site!(
                    "keepalive",
                    "the queue pair is not connected (not in RTS)",
                    "connect it first; one in ERR has already found its peer gone"
                ),
                ErrorKind::BadState,
            ));
        }
        let probe = SendRequest::empty(SendOp::Write(RemoteSlice::unchecked(0, 0, 0))).tag(tag);
        self.post_send(qp, probe).map_err(|e| e.error)
    }
}

/// Which connections were heard from in the current round. One entry per
/// queue pair index (see [`QpId::index`]), made when a connection is added;
/// marking one heard allocates nothing.
#[derive(Debug, Default)]
pub struct KeepaliveTable {
    /// For each queue pair index: the connection there and whether it was
    /// heard from this round.
    entries: Vec<Option<(QpId, bool)>>,
    len: usize,
    /// The engine of the first queue pair added: a table serves one.
    engine: Option<u32>,
}

impl KeepaliveTable {
    /// An empty table with room for queue pair indexes below `capacity`.
    pub fn with_capacity(capacity: usize) -> KeepaliveTable {
        let mut entries = Vec::new();
        entries.resize(capacity, None);
        KeepaliveTable {
            entries,
            len: 0,
            engine: None,
        }
    }

    /// Connections held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no connection is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Holds `qp`, counted as heard from this round; replaces a removed
    /// queue pair whose index it took. Grows the table if its index is
    /// beyond it (a setup-time allocation). False (nothing held) for a
    /// queue pair of another engine than the first one added.
    pub fn add(&mut self, qp: QpId) -> bool {
        if *self.engine.get_or_insert(qp.engine) != qp.engine {
            return false;
        }
        let i = qp.index();
        if i >= self.entries.len() {
            self.entries.resize(i + 1, None);
        }
        if self.entries[i].is_none() {
            self.len += 1;
        }
        self.entries[i] = Some((qp, true));
        true
    }

    /// Forgets `qp`; false if the table did not hold it.
    pub fn remove(&mut self, qp: QpId) -> bool {
        match self.entries.get_mut(qp.index()) {
            Some(e) if e.is_some_and(|(held, _)| held == qp) => {
                *e = None;
                self.len -= 1;
                true
            }
            _ => false,
        }
    }

    /// Something arrived from `qp` (a queue pair the table does not hold
    /// is ignored).
    #[inline]
    pub fn heard_from(&mut self, qp: QpId) {
        if let Some(Some((held, heard))) = self.entries.get_mut(qp.index()) {
            if *held == qp {
                *heard = true;
            }
        }
    }

    /// Ends a round: calls `silent` for every connection not heard from
    /// through it, and starts the next one with none heard.
    pub fn end_round(&mut self, mut silent: impl FnMut(QpId)) {
        for (qp, heard) in self.entries.iter_mut().flatten() {
            if !core::mem::replace(heard, false) {
                silent(*qp);
            }
        }
    }

    /// Ends a round, posting a keepalive (with `tag`) on every connection
    /// silent through it; returns how many were posted. A refused one is
    /// no loss: a full send queue has requests in flight, which find a
    /// dead peer as well.
    pub fn probe_silent<B: NicBuf, P: Provider>(
        &mut self,
        engine: &mut Engine<B, P>,
        tag: u64,
    ) -> usize {
        let mut sent = 0;
        self.end_round(|qp| sent += usize::from(engine.keepalive(qp, tag).is_ok()));
        sent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qp(index: u32, generation: u32) -> QpId {
        QpId {
            engine: 7,
            index,
            generation,
        }
    }

    fn silent(t: &mut KeepaliveTable) -> Vec<QpId> {
        let mut v = Vec::new();
        t.end_round(|q| v.push(q));
        v
    }

    #[test]
    fn only_connections_silent_through_a_round_are_named() {
        let mut t = KeepaliveTable::with_capacity(2);
        t.add(qp(0, 1));
        t.add(qp(5, 1)); // beyond the capacity: grows
        assert_eq!(t.len(), 2);
        // Both were heard from when added.
        assert!(silent(&mut t).is_empty());
        t.heard_from(qp(5, 1));
        assert_eq!(silent(&mut t), [qp(0, 1)]);
        assert_eq!(silent(&mut t), [qp(0, 1), qp(5, 1)]);
    }

    #[test]
    fn a_stale_or_foreign_handle_neither_counts_nor_removes() {
        let mut t = KeepaliveTable::with_capacity(4);
        t.add(qp(1, 2));
        silent(&mut t);
        // The slot's previous queue pair, another engine's, an index
        // beyond the table.
        let foreign = QpId {
            engine: 8,
            index: 1,
            generation: 2,
        };
        assert!(!t.add(foreign));
        for other in [qp(1, 1), foreign, qp(900, 2)] {
            t.heard_from(other);
            assert!(!t.remove(other));
        }
        assert_eq!(silent(&mut t), [qp(1, 2)]);
        assert!(t.remove(qp(1, 2)));
        assert!(!t.remove(qp(1, 2)));
        assert!(t.is_empty() && silent(&mut t).is_empty());
        // A new queue pair in the same slot replaces the old one.
        assert!(t.add(qp(1, 2)) && t.add(qp(1, 3)));
        assert_eq!(t.len(), 1);
    }
}
