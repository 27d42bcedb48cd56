//! The client of a request-reply test: numbered requests of `MSG` bytes
//! (the number, then its low byte to the end), a few in flight, each
//! reply checked in order against its request's number (marked) and
//! bytes. The server under test answers with [`answer`].

use verbs::{
    Engine, HostBuf, MemoryRegion, ProtectionDomain, QpId, RecvRequest, SendOp, SendRequest,
};

/// Bytes of a request and of its reply.
pub const MSG: usize = 64;
/// What an answer XORs into its request's number.
pub const MARK: u64 = 0xA5A5_0000_0000_5A5A;

/// The reply to `request` (at least `MSG` bytes): its number marked,
/// then its other bytes.
pub fn answer(request: &[u8]) -> [u8; MSG] {
    let mut reply = [0u8; MSG];
    reply.copy_from_slice(&request[..MSG]);
    let n = u64::from_le_bytes(reply[..8].try_into().unwrap());
    reply[..8].copy_from_slice(&(n ^ MARK).to_le_bytes());
    reply
}

/// The number of `request`.
pub fn number(request: &[u8]) -> u64 {
    u64::from_le_bytes(request[..8].try_into().unwrap())
}

pub struct NumberedClient {
    pub sent: u64,
    pub received: u64,
    total: u64,
    in_flight: u64,
    spare: Vec<MemoryRegion>,
}

impl NumberedClient {
    /// A client of `total` requests, `in_flight` at once, its receives
    /// posted on `qp`.
    pub fn new(
        pd: &ProtectionDomain,
        engine: &mut Engine<MemoryRegion>,
        qp: QpId,
        total: u64,
        in_flight: u64,
    ) -> NumberedClient {
        for _ in 0..in_flight {
            let buf = MemoryRegion::new(pd, MSG).unwrap();
            engine
                .post_recv(qp, RecvRequest::new(buf))
                .map_err(|e| e.error)
                .unwrap();
        }
        NumberedClient {
            sent: 0,
            received: 0,
            total,
            in_flight,
            spare: Vec::new(),
        }
    }

    /// True once every reply came back.
    pub fn done(&self) -> bool {
        self.received == self.total
    }

    /// Sends the next requests, up to `in_flight` ahead of the replies.
    pub fn send(&mut self, pd: &ProtectionDomain, engine: &mut Engine<MemoryRegion>, qp: QpId) {
        while self.sent < self.total && self.sent < self.received + self.in_flight {
            let mut request = self
                .spare
                .pop()
                .unwrap_or_else(|| MemoryRegion::new(pd, MSG).unwrap());
            request.write_at(0, &self.sent.to_le_bytes()).unwrap();
            request.write_at(8, &[self.sent as u8; MSG - 8]).unwrap();
            engine
                .post_send(qp, SendRequest::new(SendOp::Send, request))
                .map_err(|e| e.error)
                .unwrap();
            self.sent += 1;
        }
    }

    /// Takes what completed: each reply checked and its receive posted
    /// again, each sent request's buffer kept for the next.
    pub fn poll(&mut self, engine: &mut Engine<MemoryRegion>) {
        engine
            .poll(|mut done| {
                done.result().unwrap();
                if !done.is_recv() {
                    self.spare.extend(done.take_buf());
                    return;
                }
                let mut got = [0u8; MSG];
                done.buf().unwrap().read_at(0, &mut got).unwrap();
                let received = self.received;
                assert_eq!(number(&got) ^ MARK, received, "reply {received}");
                assert_eq!(got[8..], [received as u8; MSG - 8], "reply {received}");
                self.received += 1;
                done.repost_recv().unwrap();
            })
            .unwrap();
    }
}
