//! What client and server say over TCP besides the endpoint exchanges
//! (fixed 17-byte frames: a command byte, two little-endian u64), the
//! checksum both compute, and the generated data.
//!
//! The conversation: the client's hello for its first path, with the two
//! `SETUP` frames riding right behind it; the server's reply (once the
//! hello is valid and the setup within its bounds); an endpoint exchange
//! per further path; a sync; then `REPATH` and `DONE` as needed.

use std::io::{self, Read, Write};
use std::time::Duration;

use verbs::exchange::Session;
use verbs::transfer::PeerControl;
use verbs::{Deadline, Endpoint};

/// Client -> server, right behind the first hello: (len, planes << 32 |
/// qps per plane), then (op, chunk_len).
pub const SETUP: u8 = b'S';
/// Client -> server: reset path `a` and exchange endpoints again.
pub const REPATH: u8 = b'R';
/// Client -> server: done; `a` is the client's checksum, then one placement
/// byte per chunk and each chunk's checksum (8 bytes, little-endian)
/// follow. Server -> client: `a` is the server's checksum, `b` how many
/// chunks differ, then the first [`BAD_NAMED`] of them (4 bytes each).
/// With chunks differing, the client may send them again and `DONE` again.
pub const DONE: u8 = b'D';
/// How many differing chunks the server names.
pub const BAD_NAMED: u64 = 64;
/// Rounds of sending differing chunks again (each followed by another
/// `DONE`) before the client gives up.
pub const REPAIR_ROUNDS: u32 = 3;

const FRAME: usize = 17;

/// The longest a run of bytes that travel together (a frame, the
/// placement and checksums after `DONE`) may take to arrive.
const TOGETHER: Duration = Duration::from_secs(120);

pub fn send(session: &mut Session, cmd: u8, a: u64, b: u64) -> io::Result<()> {
    let mut frame = [0u8; FRAME];
    frame[0] = cmd;
    frame[1..9].copy_from_slice(&a.to_le_bytes());
    frame[9..].copy_from_slice(&b.to_le_bytes());
    let stream = session.stream_mut();
    stream.set_write_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(&frame)
}

/// The next frame, all of it within `timeout` however the peer paces it.
pub fn recv(session: &mut Session, timeout: Duration) -> io::Result<(u8, u64, u64)> {
    let mut frame = [0u8; FRAME];
    read_by(session, &mut frame, Deadline::after(timeout))?;
    let word = |at: usize| u64::from_le_bytes(frame[at..at + 8].try_into().unwrap());
    Ok((frame[0], word(1), word(9)))
}

pub fn send_bytes(session: &mut Session, bytes: &[u8]) -> io::Result<()> {
    session.stream_mut().write_all(bytes)
}

pub fn recv_bytes(session: &mut Session, out: &mut [u8]) -> io::Result<()> {
    read_by(session, out, Deadline::after(TOGETHER))
}

/// `read_exact` by `deadline`: each read waits only for the time left.
fn read_by(session: &mut Session, out: &mut [u8], deadline: Deadline) -> io::Result<()> {
    let stream = session.stream_mut();
    let mut got = 0;
    while got < out.len() {
        let left = deadline.remaining();
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the peer took too long",
            ));
        }
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut out[got..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The client's half of re-admitting a path: ask the server to reset its
/// end, then exchange endpoints on the same connection.
pub struct Control<'a> {
    pub session: &'a mut Session,
}

impl PeerControl for Control<'_> {
    fn reconnect(&mut self, path: usize, ours: &Endpoint) -> Option<Endpoint> {
        let asked = send(self.session, REPATH, path as u64, 0);
        let answer = asked.map_err(|e| e.to_string()).and_then(|()| {
            let deadline = Deadline::after(Duration::from_secs(2));
            self.session
                .client_exchange(ours, None, deadline)
                .map_err(|e| e.to_string())
        });
        match answer {
            Ok(peer) => Some(peer),
            Err(e) => {
                eprintln!("client: path {path}: the server could not reconnect: {e}");
                None
            }
        }
    }
}

/// FNV-1a, 64 bits, over little-endian 8-byte words (bytes for a tail):
/// eight times fewer rounds than bytewise, which matters in an emulated
/// guest. Both sides feed the same chunks in the same order.
pub struct Checksum(u64);

impl Checksum {
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    pub fn new() -> Checksum {
        Checksum(0xcbf2_9ce4_8422_2325)
    }

    pub fn update(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.0 = (self.0 ^ u64::from_le_bytes(w.try_into().unwrap())).wrapping_mul(Self::PRIME);
        }
        for &b in words.remainder() {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(Self::PRIME);
        }
    }

    pub fn value(&self) -> u64 {
        self.0
    }
}

/// The generated source: each 8-byte word a splitmix64 output of its
/// index, so any chunk can be made on its own and no two words repeat.
pub fn generate(offset: u64, out: &mut [u8]) {
    for (i, word) in out.chunks_mut(8).enumerate() {
        let mut z = (offset / 8 + i as u64)
            .wrapping_add(1)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        word.copy_from_slice(&z.to_le_bytes()[..word.len()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checksum_sees_every_byte_and_its_place() {
        let mut a = vec![0u8; 4099];
        generate(0, &mut a);
        let sum = |b: &[u8]| {
            let mut c = Checksum::new();
            c.update(b);
            c.value()
        };
        let base = sum(&a);
        a[4098] ^= 1;
        assert_ne!(sum(&a), base);
        a[4098] ^= 1;
        a.swap(0, 8);
        assert_ne!(sum(&a), base);
    }
}

/// Runs a path's connect again while it fails with ETIMEDOUT, until
/// `deadline`: INIT -> RTR resolves the peer's link-layer address, and on
/// a lossy plane (the drill's 2 %) or a starved guest the kernel's
/// neighbour lookup can time out although the next one succeeds. A
/// failed transition leaves the queue pair in INIT, so trying again is
/// allowed; any other error is returned at once.
pub fn connect_retrying<T>(
    deadline: Deadline,
    mut connect: impl FnMut() -> Result<T, verbs::Error>,
) -> Result<T, verbs::Error> {
    loop {
        match connect() {
            Err(e) if e.errno() == Some(libc::ETIMEDOUT) && !deadline.passed() => {
                std::thread::sleep(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}
