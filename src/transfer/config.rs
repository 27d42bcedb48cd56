//! What a transfer is given: its operation and sizes, the planes (one
//! engine per device, with that device's copy of every chunk's local
//! buffer and the peer's region reachable through it), and the peer's
//! half of a reconnection.

use alloc::vec::Vec;
use core::time::Duration;

use crate::endpoint::{Endpoint, RemoteRegion};
use crate::engine::{Provider, QpConfig, Verbs};

use super::bound::PathOptions;
use super::device::PlaneEngine;

/// The one-sided operation every chunk is.
///
/// Only these two: re-posting a Write or Read of the same disjoint range
/// puts the same bytes in the same place, so a chunk whose outcome a
/// failure left unknown is simply posted again. A Send is not: the first
/// may have been delivered (only its ACK lost), and a second consumes
/// another receive and hands the peer the message twice; nor is an atomic
/// (a fetch-and-add applied twice adds twice) or a Write-with-immediate
/// (its immediate is a Send's notification).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransferOp {
    /// Local chunk buffers to the peer's regions.
    Write,
    /// The peer's regions into local chunk buffers.
    Read,
}

/// How a transfer runs.
#[derive(Clone, Copy, Debug)]
pub struct TransferConfig {
    /// Write or Read.
    pub op: TransferOp,
    /// Bytes moved (from offset 0 of every plane's remote region).
    pub len: u64,
    /// Bytes per chunk (the last may be shorter). 256 KiB by default: large
    /// enough that per-request costs vanish, small enough that a failed
    /// path's unfinished chunks are little to resend.
    pub chunk_len: u64,
    /// Chunks in flight per path.
    pub depth: u32,
    /// Retry policy, traffic class, hop limit, flow labels.
    pub paths: PathOptions,
    /// Wait before the first probe of a failed path; doubled after each
    /// failed probe up to [`TransferConfig::probe_backoff_max`].
    pub probe_backoff: Duration,
    /// Longest wait between probes.
    pub probe_backoff_max: Duration,
    /// Probe and re-admit failed paths (else a failed path stays down).
    pub readmit: bool,
    /// How a failed path's replacement queue pair is made (see
    /// [`PeerControl`]); `max_send_wr` must exceed `depth`.
    pub qp: QpConfig,
    /// Read the planes' asynchronous events while running, and fail a
    /// plane's paths on `PORT_ERR` (the events are consumed: another
    /// reader of the same contexts would miss them).
    pub port_events: bool,
    /// Events kept for [`super::Transfer::trace`] (every post with its
    /// PSNs, completion, failure, reset and connection); 0, the default,
    /// keeps none. The room is taken once, in `Transfer::new`.
    pub trace: usize,
}

impl Default for TransferConfig {
    fn default() -> Self {
        TransferConfig {
            op: TransferOp::Write,
            len: 0,
            chunk_len: 256 << 10,
            depth: 4,
            paths: PathOptions::default(),
            probe_backoff: Duration::from_millis(200),
            probe_backoff_max: Duration::from_secs(2),
            readmit: true,
            qp: QpConfig::default(),
            port_events: true,
            trace: 0,
        }
    }
}

impl TransferConfig {
    /// How many chunks `len` makes.
    pub fn chunks(&self) -> usize {
        if self.chunk_len == 0 {
            return 0;
        }
        self.len.div_ceil(self.chunk_len) as usize
    }

    /// Chunk `c`'s offset and length.
    pub fn chunk_range(&self, c: usize) -> (u64, u64) {
        let offset = c as u64 * self.chunk_len;
        (offset, self.chunk_len.min(self.len - offset))
    }
}

/// One plane: a device's engine, that device's local buffer for every
/// chunk, and the peer's region reachable through it.
///
/// One engine per device because an engine's queue pairs share its
/// completion queue and protection domain, both of one device context;
/// the transfer polls the planes' engines in turn. Each chunk has a local
/// buffer per plane because memory registered with one device is not
/// addressable by another, and the crate's buffers own their memory
/// alone: the same bytes cannot (safely) be registered twice. For a Write
/// the caller fills every plane's buffers; for a Read,
/// [`super::Transfer::placement`] says which plane's buffer holds a
/// chunk's bytes (and for a Write, which plane's remote region).
pub struct Plane<B, P: Provider = Verbs> {
    /// The engine holding this plane's paths: the transfer's alone.
    pub engine: PlaneEngine<B, P>,
    /// The port the paths use (read when deciding whether to probe).
    pub port: u8,
    /// Chunk `c`'s local buffer, at least `chunk_range(c).1` bytes.
    pub bufs: Vec<Option<B>>,
    /// The peer's region on this plane; byte `i` of the transfer is at
    /// offset `i`.
    pub remote: RemoteRegion,
}

/// The peer's half of bringing a failed path back: the transfer has
/// replaced its failed queue pair with a fresh one (`ours`); the peer must
/// do the same with its end of the path (destroy it, create a new one),
/// connect the new one to `ours`, and answer with its endpoint.
///
/// Fresh queue pairs, not the old ones reset: a reset queue pair keeps its
/// QPN, so packets of its earlier life still in the network (a request,
/// an ACK delayed behind a stalled host) reach the new connection, where
/// only the new random PSN keeps them out. A new QPN leaves them nowhere
/// to land.
///
/// Called from [`super::Transfer::step`]; blocking there holds up the
/// other paths, so an implementation should answer within milliseconds
/// or give up (`None`, retried after the backoff).
pub trait PeerControl {
    /// Reconnects the peer's end of path `path`; its new endpoint, or
    /// `None` when it cannot now.
    fn reconnect(&mut self, path: usize, ours: &Endpoint) -> Option<Endpoint>;
}

/// A peer that cannot be asked: failed paths stay down.
pub struct NoPeerControl;

impl PeerControl for NoPeerControl {
    fn reconnect(&mut self, _path: usize, _ours: &Endpoint) -> Option<Endpoint> {
        None
    }
}
