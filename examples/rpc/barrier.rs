//! Keeps several load-generating nodes in step: before each load level
//! every node says ready and waits for go; after it, each sends its
//! latency histogram to the leader (rank 0), which prints the level's row
//! for the whole cluster. Plain TCP, one connection per follower.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use crate::stats::{Histogram, BUCKETS};
use crate::BoxError;

/// How long a node waits for another's next message: a hang guard.
const WAIT: Duration = Duration::from_secs(120);
/// How long a follower waits for the leader to listen. The leader may run
/// other work first (in `tests/softroce/rpc`'s sweep, the ib_send_lat
/// floor, the bad requests and the metrics: over two minutes once in a
/// TCG guest on a busy host), so this only guards against a leader that
/// never comes; the test bed's guest timeout ends a run before it.
const JOIN_WAIT: Duration = Duration::from_secs(600);

pub enum Barrier {
    /// One node: nothing to wait for.
    Alone,
    Leader(Vec<TcpStream>),
    Follower(TcpStream),
}

impl Barrier {
    /// Rank 0 listens on `port` for `nodes - 1` followers; the others
    /// connect to `leader`.
    pub fn join(rank: usize, nodes: usize, leader: &str, port: u16) -> Result<Barrier, BoxError> {
        if nodes <= 1 {
            return Ok(Barrier::Alone);
        }
        if rank == 0 {
            let listener = TcpListener::bind(("0.0.0.0", port))?;
            let mut followers = Vec::new();
            for _ in 1..nodes {
                let (s, _) = listener.accept()?;
                s.set_read_timeout(Some(WAIT))?;
                s.set_nodelay(true)?;
                followers.push(s);
            }
            return Ok(Barrier::Leader(followers));
        }
        let since = Instant::now();
        loop {
            match TcpStream::connect((leader, port)) {
                Ok(s) => {
                    s.set_read_timeout(Some(WAIT))?;
                    s.set_nodelay(true)?;
                    return Ok(Barrier::Follower(s));
                }
                Err(e) if since.elapsed() < JOIN_WAIT => {
                    let _ = e;
                    thread::sleep(Duration::from_millis(100));
                }
                Err(e) => {
                    return Err(
                        format!("barrier: cannot reach the leader {leader}:{port}: {e}").into(),
                    )
                }
            }
        }
    }

    /// Returns once every node called it.
    pub fn wait(&mut self) -> Result<(), BoxError> {
        let mut b = [0u8; 1];
        match self {
            Barrier::Alone => {}
            Barrier::Leader(fs) => {
                for f in fs.iter_mut() {
                    f.read_exact(&mut b)?;
                }
                for f in fs.iter_mut() {
                    f.write_all(b"G")?;
                }
            }
            Barrier::Follower(s) => {
                s.write_all(b"R")?;
                s.read_exact(&mut b)?;
            }
        }
        Ok(())
    }

    /// The leader gets every node's histogram and error count merged into
    /// its own (and returns true); a follower sends its own (false).
    pub fn gather(&mut self, h: &mut Histogram, errors: &mut u64) -> Result<bool, BoxError> {
        match self {
            Barrier::Alone => Ok(true),
            Barrier::Leader(fs) => {
                let mut buf = vec![0u8; (BUCKETS + 2) * 8];
                for f in fs.iter_mut() {
                    f.read_exact(&mut buf)?;
                    h.merge(&Histogram::from_bytes(&buf[..(BUCKETS + 1) * 8]));
                    *errors += u64::from_le_bytes(buf[(BUCKETS + 1) * 8..].try_into().unwrap());
                }
                Ok(true)
            }
            Barrier::Follower(s) => {
                let mut buf = h.to_bytes();
                buf.extend_from_slice(&errors.to_le_bytes());
                s.write_all(&buf)?;
                Ok(false)
            }
        }
    }
}
