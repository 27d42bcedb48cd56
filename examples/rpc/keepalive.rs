//! The server's connections, each kept alive when silent.
//!
//! An RC queue pair learns its peer is gone only when something it sent
//! goes unacknowledged. A client that dies between a response and its next
//! request leaves nothing in flight, and its queue pair would be held
//! forever. So a connection silent for a whole round gets a keepalive: a
//! zero-length RDMA Write naming no memory (address 0, key 0; no key is
//! checked for zero bytes, IBA C9-88). A live client's queue pair
//! acknowledges it, touching nothing; a dead one's never does, and the
//! write fails after the retries, which drops the connection like any
//! other failed completion. Clients allow REMOTE_WRITE at their queue
//! pairs for it, and register no memory a peer may write.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use verbs::{ArenaBuf, Engine, QpId, RemoteSlice, SendOp, SendRequest};

/// How long a connection may be silent before it is asked whether it is
/// there. A dead client is dropped within about this plus the retries.
pub const ROUND: Duration = Duration::from_millis(500);

/// A keepalive's tag (a response's is 0).
pub const TAG: u64 = 1;

pub struct Connections {
    /// Whether each connection was heard from in the current round.
    heard: HashMap<QpId, bool>,
    round_ends: Instant,
}

impl Connections {
    pub fn new() -> Connections {
        Connections {
            heard: HashMap::new(),
            round_ends: Instant::now() + ROUND,
        }
    }

    pub fn len(&self) -> usize {
        self.heard.len()
    }

    pub fn add(&mut self, qp: QpId) {
        self.heard.insert(qp, true);
    }

    /// Forgets `qp`; false if it was not a connection.
    pub fn remove(&mut self, qp: QpId) -> bool {
        self.heard.remove(&qp).is_some()
    }

    /// A request arrived on `qp`.
    pub fn heard_from(&mut self, qp: QpId) {
        if let Some(heard) = self.heard.get_mut(&qp) {
            *heard = true;
        }
    }

    /// Once a round: a keepalive to every connection silent through it.
    /// Returns how many went out. A full send queue is no loss: its
    /// connection has requests in flight, which find a dead client too.
    pub fn keep_alive(&mut self, engine: &mut Engine<ArenaBuf>, now: Instant) -> usize {
        if now < self.round_ends {
            return 0;
        }
        self.round_ends = now + ROUND;
        let mut sent = 0;
        for (&qp, heard) in self.heard.iter_mut() {
            if !std::mem::replace(heard, false) {
                let probe =
                    SendRequest::empty(SendOp::Write(RemoteSlice::unchecked(0, 0, 0))).tag(TAG);
                sent += usize::from(engine.post_send(qp, probe).is_ok());
            }
        }
        sent
    }
}
