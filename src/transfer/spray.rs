//! The transfer itself: chunks sprayed over every path that is up, each
//! completion settled against its chunk, failed paths' chunks queued
//! again. The post and poll path allocates nothing: the chunk table, the
//! paths and every buffer slot were sized in [`Transfer::new`].

use alloc::vec::Vec;
use std::time::{Duration, Instant};

use crate::engine::{Engine, Provider, QpId, Queue, Verbs};
use crate::error::{site, Error, ErrorKind};
use crate::memory::NicBuf;
use crate::sgl::Local;
use crate::wr::{RemoteSlice, SendOp, SendRequest};

use super::bound::DetectionBound;
use super::chunks::ChunkTable;
use super::config::{Plane, TransferConfig, TransferOp};
use super::device::PlaneDevice;
use super::path::{FailCause, Path, PathState, PathStats};
use super::settle::{chunk_tag, Settle};
use super::trace::{packets, Trace, TraceEvent, TraceKind};

/// What one step did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// Completions settled (and chunks posted) in this step.
    pub events: usize,
    /// Every chunk is done.
    pub done: bool,
}

/// The whole transfer at a glance.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Progress {
    /// Bytes of completed chunks.
    pub bytes: u64,
    /// Bytes in all.
    pub total: u64,
    /// Chunks completed, and in all.
    pub chunks_done: usize,
    /// Chunks in all.
    pub chunks: usize,
    /// Since [`Transfer::new`].
    pub elapsed: Duration,
    /// Bytes per second, summed over the paths' rate windows.
    pub rate: f64,
    /// Bytes posted again after their path failed.
    pub resent_bytes: u64,
    /// Paths up now, and in all.
    pub paths_up: usize,
    /// Paths in all.
    pub paths: usize,
}

/// One logical transfer sprayed over several paths. See the module docs.
pub struct Transfer<B: NicBuf, P: Provider = Verbs> {
    pub(crate) config: TransferConfig,
    pub(crate) planes: Vec<Plane<B, P>>,
    pub(crate) paths: Vec<Path>,
    pub(crate) chunks: ChunkTable,
    pub(crate) bound: DetectionBound,
    pub(crate) started: Instant,
    pub(crate) finished: Option<Instant>,
    pub(crate) resent_bytes: u64,
    /// When each plane last saw `PORT_ERR`, and `PORT_ACTIVE`.
    pub(crate) port_err_at: Vec<Option<Instant>>,
    pub(crate) port_active_at: Vec<Option<Instant>>,
    pub(crate) first_failure: Option<Instant>,
    pub(crate) last_event_check: Instant,
    /// The last step, and the step-loop time since any path completed
    /// anything (the watchdog's view of a transfer silent as a whole).
    pub(crate) last_step: Instant,
    pub(crate) all_silent: Duration,
    pub(crate) trace: Trace,
}

impl<B: NicBuf, P: Provider> Transfer<B, P>
where
    Engine<B, P>: PlaneDevice<B, P>,
{
    /// A transfer over `paths`, each a queue pair of `planes[plane]`'s
    /// engine, already connected with
    /// `config.paths.connect_options(index)`. Checks the buffers, regions
    /// and queue depths before anything is posted.
    pub fn new(
        planes: Vec<Plane<B, P>>,
        paths: &[(u16, QpId)],
        config: TransferConfig,
    ) -> Result<Transfer<B, P>, Error> {
        config.paths.retry.validate()?;
        let count = config.chunks();
        if config.chunk_len == 0 || config.depth == 0 || paths.is_empty() {
            return Err(Error::invalid(site!(
                "Transfer::new",
                "chunk_len, depth and the path list must not be empty"
            )));
        }
        if paths.len() > usize::from(u16::MAX) || count > u32::MAX as usize {
            return Err(Error::invalid(site!(
                "Transfer::new",
                "at most 65535 paths and 2^32 chunks"
            )));
        }
        for plane in &planes {
            if plane.bufs.len() != count || plane.remote.len < config.len {
                return Err(Error::invalid(site!(
                    "Transfer::new",
                    "every plane needs one buffer per chunk and a remote region of len bytes"
                )));
            }
            for (c, buf) in plane.bufs.iter().enumerate() {
                if buf
                    .as_ref()
                    .is_none_or(|b| (b.len() as u64) < config.chunk_range(c).1)
                {
                    return Err(Error::invalid(site!(
                        "Transfer::new",
                        "a chunk buffer is missing or shorter than its chunk"
                    )));
                }
            }
        }
        // A plane's engine is made empty (`PlaneEngine::new`) and only
        // the transfer posts on it: nothing may be in flight yet.
        for plane in &planes {
            let engine = &plane.engine.0;
            if engine.srq_posted() != 0
                || engine
                    .qps()
                    .any(|q| engine.in_flight(q).ok() != Some((0, 0)))
            {
                return Err(Error::new(
                    site!(
                        "Transfer::new",
                        "a plane's engine holds requests the transfer did not post"
                    ),
                    ErrorKind::BadState,
                ));
            }
        }
        if config.qp.max_send_wr <= config.depth {
            return Err(Error::invalid(site!(
                "Transfer::new",
                "replacement queue pairs (TransferConfig::qp) need max_send_wr above depth"
            )));
        }
        let now = Instant::now();
        let mut built = Vec::with_capacity(paths.len());
        for (i, &(plane, qp)) in paths.iter().enumerate() {
            let engine = &planes
                .get(usize::from(plane))
                .ok_or(Error::invalid(site!(
                    "Transfer::new",
                    "a path names no plane"
                )))?
                .engine
                .0;
            // The chunks in flight and the probe must fit the send queue.
            if engine.caps(qp)?.max_send_wr <= config.depth {
                return Err(Error::new(
                    site!(
                        "Transfer::new",
                        "a path's send queue holds no more than depth requests",
                        "QpConfig::max_send_wr above TransferConfig::depth"
                    ),
                    ErrorKind::QueueFull,
                ));
            }
            let mut path = Path::new(plane, qp, config.paths.flow_label(i), now);
            (path.qpn, path.next_psn, path.mtu) = engine.describe(qp)?;
            built.push(path);
        }
        let mut trace = Trace::new(config.trace, now);
        for (i, p) in built.iter().enumerate() {
            let kind = TraceKind::Connected {
                psn: p.next_psn,
                peer_qpn: 0,
                peer_psn: 0,
                mtu: p.mtu,
            };
            trace.record(i as u16, 0, p.qpn, kind);
        }
        let n = planes.len();
        Ok(Transfer {
            config,
            planes,
            paths: built,
            chunks: ChunkTable::new(count),
            bound: config.paths.retry.bound(),
            started: now,
            finished: None,
            resent_bytes: 0,
            port_err_at: alloc::vec![None; n],
            port_active_at: alloc::vec![None; n],
            first_failure: None,
            last_event_check: now,
            last_step: now,
            all_silent: Duration::ZERO,
            trace,
        })
    }

    /// Posts chunks on every path that is up, one per path in turn, until
    /// the paths are full or no chunk waits. Returns how many were posted.
    pub(crate) fn post(&mut self) -> usize {
        let mut posted = 0;
        loop {
            let before = posted;
            for index in 0..self.paths.len() {
                if self.chunks.waiting() == 0 {
                    return posted;
                }
                if self.post_one(index) {
                    posted += 1;
                }
            }
            if posted == before {
                return posted;
            }
        }
    }

    /// Posts the next waiting chunk on path `index`, if it is up with room.
    fn post_one(&mut self, index: usize) -> bool {
        let config = &self.config;
        let path = &mut self.paths[index];
        if path.stats.state != PathState::Up || path.failing || path.stats.in_flight >= config.depth
        {
            return false;
        }
        let Some(c) = self.chunks.next_waiting() else {
            return false;
        };
        let plane = &mut self.planes[usize::from(path.stats.plane)];
        let Some(buf) = plane.bufs[c].take() else {
            // Leaked with a queue pair that could be neither reset nor
            // destroyed (`strand`): another plane carries it.
            self.chunks.put_back(c);
            return false;
        };
        let (offset, len) = config.chunk_range(c);
        let remote = match RemoteSlice::new(&plane.remote, offset, len) {
            Ok(r) => r,
            Err(_) => unreachable_checked_range(),
        };
        let local = match Local::range(buf, 0, len as usize) {
            Ok(l) => l,
            Err((_, buf)) => {
                plane.bufs[c] = Some(buf);
                self.chunks.put_back(c);
                return false;
            }
        };
        let op = match config.op {
            TransferOp::Write => SendOp::Write(remote),
            TransferOp::Read => SendOp::Read(remote),
        };
        let req = SendRequest::new(op, local).tag(chunk_tag(index, c));
        match plane.engine.0.post_send(path.stats.qp, req) {
            Ok(()) => {
                if path.stats.in_flight == 0 {
                    // The watchdog counts from the first post into an idle path.
                    path.silent = Duration::ZERO;
                }
                let first = path.next_psn;
                path.next_psn = (first + packets(len, path.mtu)) & crate::endpoint::MAX_PSN;
                let last = path.next_psn.wrapping_sub(1) & crate::endpoint::MAX_PSN;
                let kind = TraceKind::Posted {
                    chunk: c as u32,
                    first,
                    last,
                };
                self.trace
                    .record(index as u16, path.generation, path.qpn, kind);
                path.stats.in_flight += 1;
                if self.chunks.posted(c, index as u16) {
                    path.stats.resent_chunks += 1;
                    self.resent_bytes += len;
                }
                true
            }
            Err(e) => {
                plane.bufs[c] = e.request.into_bufs().next();
                self.chunks.put_back(c);
                // The engine full (its completion queue's room, which its
                // paths share, all in flight): the next poll makes room;
                // no fault of this path's.
                let full =
                    e.error.kind() == ErrorKind::QueueFull && plane.engine.0.room(Queue::Send) == 0;
                if !full {
                    path.fail(FailCause::PostRefused);
                }
                false
            }
        }
    }

    /// Polls every plane's engine once; returns the completions settled.
    pub(crate) fn poll(&mut self) -> Result<usize, Error> {
        let mut settled = 0;
        for p in 0..self.planes.len() {
            let (engine, mut to) = self.settle_on(p);
            settled += engine.poll(|c| to.settle(c, p as u16))?;
        }
        Ok(settled)
    }

    /// Plane `p`'s engine, and where its completions settle.
    pub(crate) fn settle_on(&mut self, p: usize) -> (&mut Engine<B, P>, Settle<'_, B>) {
        let Plane { engine, bufs, .. } = &mut self.planes[p];
        let to = Settle {
            config: &self.config,
            bufs,
            chunks: &mut self.chunks,
            paths: &mut self.paths,
            trace: &mut self.trace,
        };
        (&mut engine.0, to)
    }

    /// What the transfer traced (see [`TransferConfig::trace`]), and how
    /// many events did not fit.
    pub fn trace(&self) -> (&[TraceEvent], u64) {
        self.trace.events()
    }

    /// The detection bound the paths were connected for.
    pub fn bound(&self) -> DetectionBound {
        self.bound
    }

    /// The whole transfer's progress.
    pub fn progress(&self) -> Progress {
        let bytes = self.paths.iter().map(|p| p.stats.bytes).sum();
        Progress {
            bytes,
            total: self.config.len,
            chunks_done: self.chunks.done(),
            chunks: self.chunks.len(),
            elapsed: self.finished.unwrap_or_else(Instant::now) - self.started,
            rate: self.paths.iter().map(|p| p.stats.rate).sum(),
            resent_bytes: self.resent_bytes,
            paths_up: self
                .paths
                .iter()
                .filter(|p| p.stats.state == PathState::Up)
                .count(),
            paths: self.paths.len(),
        }
    }

    /// Every path's counters and state, in path order.
    pub fn paths(&self) -> impl Iterator<Item = &PathStats> + '_ {
        self.paths.iter().map(|p| &p.stats)
    }

    /// The plane whose memory holds chunk `c`'s final bytes (its local
    /// buffer for a Read, its remote region for a Write), once done.
    pub fn placement(&self, c: usize) -> Option<u16> {
        self.chunks.placement(c)
    }

    /// Sends done chunk `c` again: for an end-to-end check (a checksum at
    /// the peer) that found its bytes wrong, which no completion status
    /// can rule out. Step or run the transfer to the end again.
    pub fn redo(&mut self, c: usize) -> bool {
        let redone = c < self.chunks.len() && self.chunks.redo(c);
        if redone {
            self.finished = None;
        }
        redone
    }

    /// The path whose post completed chunk `c`, once done.
    pub fn done_by(&self, c: usize) -> Option<u16> {
        if c < self.chunks.len() {
            self.chunks.done_by(c)
        } else {
            None
        }
    }

    /// How often chunk `c` was posted (more than once: re-sprayed).
    pub fn posts(&self, c: usize) -> u16 {
        if c < self.chunks.len() {
            self.chunks.posts(c)
        } else {
            0
        }
    }

    /// The planes, with their engines and buffers (all back once done).
    pub fn planes(&self) -> &[Plane<B, P>] {
        &self.planes
    }

    /// Ends the transfer, giving the planes back.
    pub fn into_planes(self) -> Vec<Plane<B, P>> {
        self.planes
    }

    /// When the transfer started, finished, and first lost a path.
    pub fn times(&self) -> (Instant, Option<Instant>, Option<Instant>) {
        (self.started, self.finished, self.first_failure)
    }

    /// When plane `p` last reported `PORT_ERR` and `PORT_ACTIVE`.
    pub fn port_events(&self, p: usize) -> (Option<Instant>, Option<Instant>) {
        (
            self.port_err_at.get(p).copied().flatten(),
            self.port_active_at.get(p).copied().flatten(),
        )
    }
}

/// `new` checked every chunk's range against every plane's region.
#[cold]
fn unreachable_checked_range() -> ! {
    unreachable!("chunk ranges were checked against the regions in Transfer::new")
}
