//! The TCP side channel between client and server: fixed 17-byte frames
//! (a command byte and two little-endian u64 arguments), every read and
//! write bounded by a deadline, plus the crate's endpoint exchange on the
//! same connection (the client speaks first: its hello, then the server's
//! reply). Fixed frames mean no buffering, so frames go straight to the
//! `Session`'s own socket between two exchange calls.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use verbs::exchange::Session;
use verbs::{Deadline, Endpoint};

use crate::BoxError;

/// Server -> client on accept: (process id, generation).
pub const HELLO: u8 = b'W';
/// Client -> server: hash `len` bytes at `offset`; reply `HASHED` (hash, 0).
pub const HASH: u8 = b'H';
pub const HASHED: u8 = b'h';
/// Client -> server: reset your QP and exchange endpoints again.
pub const RECONNECT: u8 = b'R';
/// Client -> server: die now, abruptly (the `kill` drill).
pub const KILL: u8 = b'K';
/// Client -> server: all done; reply `BYE`, then exit 0.
pub const QUIT: u8 = b'Q';
pub const BYE: u8 = b'q';

const FRAME: usize = 17;

/// One side channel connection: frames, endpoint exchanges and barriers,
/// all on the session's socket.
pub struct Chan {
    session: Session,
}

impl Chan {
    pub fn new(session: Session) -> Chan {
        Chan { session }
    }

    fn stream(&mut self) -> &mut TcpStream {
        self.session.stream_mut()
    }

    pub fn send(&mut self, cmd: u8, a: u64, b: u64) -> io::Result<()> {
        let mut frame = [0u8; FRAME];
        frame[0] = cmd;
        frame[1..9].copy_from_slice(&a.to_le_bytes());
        frame[9..].copy_from_slice(&b.to_le_bytes());
        // A frame fits any socket buffer: the write never waits for the peer.
        let stream = self.stream();
        stream.set_write_timeout(Some(Duration::from_secs(10)))?;
        stream.write_all(&frame)
    }

    /// The next frame, or an error once `deadline` passes (a frame cut in
    /// half by the deadline leaves the stream unusable: the caller gives up).
    pub fn recv(&mut self, deadline: Deadline) -> io::Result<(u8, u64, u64)> {
        let mut frame = [0u8; FRAME];
        let left = deadline.remaining();
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        let stream = self.stream();
        stream.set_read_timeout((deadline != Deadline::NEVER).then_some(left))?;
        stream.read_exact(&mut frame)?;
        let word = |r: std::ops::Range<usize>| u64::from_le_bytes(frame[r].try_into().unwrap());
        Ok((frame[0], word(1..9), word(9..FRAME)))
    }

    /// Receives a frame that must be `cmd`.
    pub fn expect(&mut self, cmd: u8, deadline: Deadline) -> Result<(u64, u64), BoxError> {
        let (got, a, b) = self.recv(deadline)?;
        if got != cmd {
            return Err(format!(
                "side channel: expected {:?}, got {:?}",
                cmd as char, got as char
            )
            .into());
        }
        Ok((a, b))
    }

    /// The client's side of the endpoint exchange (the crate's wire
    /// format): sends `local`, returns the server's endpoint, by `deadline`.
    pub fn client_exchange(
        &mut self,
        local: &Endpoint,
        deadline: Deadline,
    ) -> Result<Endpoint, BoxError> {
        Ok(self.session.client_exchange(local, None, deadline)?)
    }

    /// The server's side: reads and checks the client's endpoint, only
    /// then sends `local`; returns the client's endpoint, by `deadline`.
    pub fn server_exchange(
        &mut self,
        local: &Endpoint,
        deadline: Deadline,
    ) -> Result<Endpoint, BoxError> {
        Ok(self.session.server_exchange(local, None, deadline)?)
    }

    /// Both sides reached the same point (e.g. both QPs are connected).
    pub fn sync(&mut self, deadline: Deadline) -> Result<(), BoxError> {
        Ok(self.session.sync(deadline)?)
    }
}

/// A 64-bit digest of a byte range, computed the same way on both sides in
/// 8-byte words (FNV-1a style multiply plus a shift to mix high bits down).
#[derive(Clone, Copy)]
pub struct Digest(u64);

impl Digest {
    pub fn new() -> Digest {
        Digest(0xcbf2_9ce4_8422_2325)
    }

    /// Feeds `bytes`; every chunk but the last must be a multiple of 8 long.
    pub fn update(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0 ^ u64::from_le_bytes(w)).wrapping_mul(0x0000_0100_0000_01b3);
            self.0 ^= self.0 >> 29;
        }
    }

    pub fn value(self) -> u64 {
        self.0
    }
}
