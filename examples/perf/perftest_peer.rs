//! The connection to a peer speaking perftest's wire (module
//! `perftest_wire` says what goes when): one message for one, each checked
//! before use and each bounded by a deadline, and the rounds of key
//! messages, which must repeat what the peer's first round said.
//!
//! The server reads and parses each of the client's messages before it
//! writes its own, so its key message (the inbox's address and rkey) goes
//! out only after the client's key for that queue pair parsed, and
//! [`Peer::revealed`] says whether it has.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use verbs::{Access, Deadline, Endpoint, Gid, Mtu, RemoteRegion};

use super::params::Test;
use super::perftest_msg::{self as msg, Key};
use super::side::Side;
use super::BoxError;

/// One round of key messages, or where both sides connect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Round {
    /// Queue pair 0's key.
    One,
    /// Every queue pair's, in turn.
    Each,
    /// Connect the queue pairs (nothing on the wire).
    Connect,
}

/// The peer broke the protocol or the connection.
#[derive(Debug)]
pub struct BadPeer(pub String);

impl std::fmt::Display for BadPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "perftest's wire: {}", self.0)
    }
}

impl std::error::Error for BadPeer {}

/// The TCP connection to the peer.
pub struct Peer {
    pub stream: TcpStream,
    /// This side is the server: it reads first.
    pub server: bool,
    /// Our key has gone out.
    pub revealed: bool,
}

impl Peer {
    /// One exchange: `ours` for the peer's `len` bytes, which the server
    /// `parse`s before it answers. `key`: ours is a key message.
    pub fn swap<T>(
        &mut self,
        ours: &[u8],
        len: usize,
        parse: impl FnOnce(&[u8]) -> Result<T, String>,
        key: bool,
        deadline: Deadline,
    ) -> Result<T, BadPeer> {
        let mut buf = [0u8; msg::KEY_LEN_GID];
        let theirs = buf
            .get_mut(..len)
            .ok_or_else(|| BadPeer("a message longer than any".into()))?;
        if !self.server {
            self.send(ours, key, deadline)?;
        }
        self.receive(theirs, deadline)?;
        let value = parse(theirs).map_err(BadPeer)?;
        if self.server {
            self.send(ours, key, deadline)?;
        }
        Ok(value)
    }

    /// Writes one message, in one call when the socket takes it (perftest
    /// reads each with a single `read`).
    pub fn send(&mut self, m: &[u8], key: bool, deadline: Deadline) -> Result<(), BadPeer> {
        self.stream
            .set_write_timeout(Some(left(deadline)?))
            .and_then(|()| self.stream.write_all(m))
            .map_err(|e| io_error("sending", e))?;
        self.revealed |= key;
        Ok(())
    }

    /// Reads exactly `buf.len()` bytes by `deadline`.
    pub fn receive(&mut self, buf: &mut [u8], deadline: Deadline) -> Result<(), BadPeer> {
        let mut at = 0;
        while at < buf.len() {
            self.stream
                .set_read_timeout(Some(left(deadline)?))
                .map_err(|e| io_error("reading", e))?;
            match self.stream.read(&mut buf[at..]) {
                Ok(0) => return Err(BadPeer("the peer closed the connection".into())),
                Ok(n) => at += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_error("reading", e)),
            }
        }
        Ok(())
    }
}

/// The time left, or the error once it is up.
fn left(deadline: Deadline) -> Result<Duration, BadPeer> {
    if deadline.passed() {
        return Err(BadPeer("timed out waiting for the peer".into()));
    }
    Ok(deadline.remaining().max(Duration::from_millis(1)))
}

fn io_error(what: &str, e: io::Error) -> BadPeer {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => BadPeer(format!(
            "timed out {what} (is the peer running the same test?)"
        )),
        _ => BadPeer(format!("{what}: {e}")),
    }
}

/// The key messages: ours per queue pair, and the peer's as first read.
pub struct Keys {
    ours: Vec<Vec<u8>>,
    theirs: Vec<Option<Key>>,
    with_gid: bool,
    /// Our GID, in the messages that carry one.
    our_gid: Option<[u8; 16]>,
}

impl Keys {
    /// Our keys: each queue pair's endpoint and the inbox.
    pub fn new(side: &Side, with_gid: bool, out_reads: u16) -> Result<Keys, BoxError> {
        let endpoints = side.endpoints()?;
        let ours = endpoints
            .iter()
            .map(|ep| {
                let inbox = ep.regions.first();
                Key {
                    lid: ep.lid,
                    out_reads,
                    qpn: ep.qpn,
                    psn: ep.psn,
                    rkey: inbox.map_or(0, |r| r.rkey),
                    vaddr: inbox.map_or(0, |r| r.addr),
                    gid: with_gid.then(|| ep.gid.raw()),
                    srqn: 0,
                }
                .encode()
                .ok_or("a QPN or PSN over 24 bits")
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Keys {
            theirs: vec![None; ours.len()],
            ours,
            with_gid,
            our_gid: endpoints
                .first()
                .filter(|_| with_gid)
                .map(|ep| ep.gid.raw()),
        })
    }

    /// One round; the peer's keys must repeat what its first round said.
    pub fn round(
        &mut self,
        peer: &mut Peer,
        which: Round,
        deadline: Deadline,
    ) -> Result<(), BadPeer> {
        let n = if which == Round::Each {
            self.ours.len()
        } else {
            1
        };
        let with_gid = self.with_gid;
        for (i, (ours, theirs)) in self.ours.iter().zip(&mut self.theirs).enumerate().take(n) {
            let len = Key::len(with_gid);
            let key = peer.swap(ours, len, |m| Key::parse(m, with_gid), true, deadline)?;
            match theirs {
                None => *theirs = Some(key),
                Some(first) if *first == key => {}
                Some(_) => {
                    return Err(BadPeer(format!(
                        "queue pair {i}'s key changed between rounds (another test, or -q?)"
                    )))
                }
            }
        }
        Ok(())
    }

    /// The peer's endpoints: `mtu` agreed, its buffer taken as
    /// `remote_len` bytes long (perftest does not send the length; it
    /// allocates for its largest size or its cycle buffer, as we do).
    pub fn endpoints(
        &self,
        mtu: Mtu,
        remote_len: u64,
        test: Test,
    ) -> Result<Vec<Endpoint>, BoxError> {
        let v4 = |g: [u8; 16]| Gid::from_raw(g).ipv4().is_some();
        self.theirs
            .iter()
            .map(|k| {
                let k = k.ok_or("the peer sent no key for a queue pair")?;
                if let (Some(a), Some(b)) = (self.our_gid, k.gid) {
                    if v4(a) != v4(b) {
                        return Err("one GID is IPv4-mapped, the other not (as perftest, refused): choose -x so both are or neither".into());
                    }
                }
                let mut regions = Vec::new();
                if test.remote_access() != Access::EMPTY {
                    regions.push(RemoteRegion {
                        addr: k.vaddr,
                        len: remote_len,
                        rkey: k.rkey,
                    });
                }
                Ok(Endpoint {
                    qpn: k.qpn,
                    psn: k.psn,
                    lid: k.lid,
                    gid: Gid::from_raw(k.gid.unwrap_or_default()),
                    mtu,
                    regions,
                })
            })
            .collect()
    }
}
