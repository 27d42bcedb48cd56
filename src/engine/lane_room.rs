//! A lane's room in the engine's tables of requests in flight. A lane's
//! posts keep no entries (they only count), so while it lives it holds its
//! queues' whole depth there instead: the completion queue keeps room for
//! every post the lane may make, and nobody else can take it. When it
//! starts, the entries of the posts already in flight (all of its own
//! requests) are traded for that reservation; when it ends, each post
//! still in flight gets an entry again out of it, and the rest goes back.

use crate::error::{site, Error, ErrorKind};
use crate::memory::NicBuf;

use super::core::Engine;
use super::doorbell::Provider;
use super::flights::{Flight, UNREPORTED};
use super::prepared_table::{PreparedRecv, PreparedSend};
use super::qp_slot::QpSlot;

#[cold]
fn not_ours(recv: bool) -> Error {
    Error::invalid(if recv {
        site!(
            "lane",
            "the queue pair has receives in flight that are not posts of this lane's"
        )
    } else {
        site!(
            "lane",
            "the queue pair has sends in flight that are not posts of this lane's"
        )
    })
}

#[cold]
fn no_room() -> Error {
    Error::new(
        site!(
            "lane",
            "the engine's completion queue has no room for the queue pair's whole depth, which a lane holds",
            "poll completions first, or a larger EngineConfig::cq_depth"
        ),
        ErrorKind::QueueFull,
    )
}

impl<B: NicBuf, P: Provider> Engine<B, P> {
    /// Checks that everything in flight on queue pair `qp`'s queues the
    /// lane takes (the receive queue only with `recv`) is a post of its
    /// requests, then trades their entries for a reservation of those
    /// queues' depth; returns the room reserved in each table. Refused,
    /// with nothing changed, when the tables lack the room.
    pub(super) fn lane_room(
        &mut self,
        qp: u32,
        send: PreparedSend,
        recv: Option<PreparedRecv>,
    ) -> Result<[u32; 2], Error> {
        let side = self.recv_side;
        let slot = &mut self.qps[qp as usize];
        // A post of the lane's request, reported or not.
        let ours = |f: &Flight<B>, index: u32, key: u64| {
            f.prepared & !UNREPORTED == index && f.generation == key as u32
        };
        let flights = &mut self.flights;
        if !flights[0]
            .chain(&slot.send)
            .all(|f| ours(f, send.index, send.key))
        {
            return Err(not_ours(false));
        }
        let mut reserved = [0u32; 2];
        let mut need = [0u32; 2];
        reserved[0] = slot.send.capacity() as u32;
        need[0] = reserved[0] - slot.send.len() as u32;
        if let Some(r) = recv {
            if !flights[side]
                .chain(&slot.recv)
                .all(|f| ours(f, r.index, r.key))
            {
                return Err(not_ours(true));
            }
            let depth = slot.recv.capacity() as u32;
            reserved[side] += depth;
            need[side] += depth - slot.recv.len() as u32;
        }
        if (0..2).any(|s| flights[s].available() < need[s]) {
            return Err(no_room());
        }
        flights[0].release_chain(&mut slot.send);
        if recv.is_some() {
            flights[side].release_chain(&mut slot.recv);
        }
        for (s, n) in reserved.iter().enumerate() {
            let taken = flights[s].reserve(*n);
            debug_assert!(taken, "checked above");
        }
        Ok(reserved)
    }

    /// A lane's end: each of its posts still in flight on `slot` (the
    /// lane's, not yet back in the engine) gets an entry again naming its
    /// prepared request, out of the room `reserved`; the rest is returned.
    pub(super) fn lane_back(
        &mut self,
        slot: &mut QpSlot<P::Qp>,
        send: PreparedSend,
        recv: Option<PreparedRecv>,
        reserved: [u32; 2],
    ) {
        for (s, n) in reserved.iter().enumerate() {
            self.flights[s].unreserve(*n);
        }
        let e = &self.prepared.sends[send.index as usize];
        let post = (e.tag, e.opcode, send.index, send.key as u32);
        self.flights[0].adopt(&mut slot.send, |_| post);
        if let Some(r) = recv {
            let e = &self.prepared.recvs[r.index as usize];
            let post = (e.tag, e.opcode, r.index, r.key as u32);
            self.flights[self.recv_side].adopt(&mut slot.recv, |_| post);
        }
    }
}
