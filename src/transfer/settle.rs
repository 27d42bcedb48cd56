//! Settling one completion of a plane's engine against the transfer: a
//! chunk's buffer back in its slot and the chunk done (or waiting
//! again, its path failed), a probe's path re-admitted; and the tags
//! that say which chunk (or probe) and path a request was.

use std::time::Duration;

use crate::engine::{CompletionRef, Provider};
use crate::memory::NicBuf;
use crate::sys::ibv_wc_status as WcStatus;

use super::chunks::ChunkTable;
use super::config::TransferConfig;
use super::path::{FailCause, Path, PathState};
use super::trace::{Trace, TraceKind};

/// A tag's bit marking a probe (no chunk, no buffer).
const PROBE: u64 = 1 << 63;

/// The work request tag of chunk `chunk` on `path`.
pub(crate) fn chunk_tag(path: usize, chunk: usize) -> u64 {
    ((path as u64) << 32) | chunk as u64
}

/// The tag of `path`'s probe.
pub(crate) fn probe_tag(path: usize) -> u64 {
    PROBE | ((path as u64) << 32)
}

/// Where a completion settles: the chunk table, the polled plane's
/// buffers, the paths and the trace.
pub(crate) struct Settle<'a, B> {
    pub config: &'a TransferConfig,
    pub bufs: &'a mut [Option<B>],
    pub chunks: &'a mut ChunkTable,
    pub paths: &'a mut [Path],
    pub trace: &'a mut Trace,
}

impl<B: NicBuf> Settle<'_, B> {
    /// Settles one completion of plane `plane`'s engine: a chunk's buffer
    /// goes back to its slot; a success completes the chunk, a failure (or
    /// flush) queues it again and fails its path; a probe's success
    /// re-admits its path.
    pub(crate) fn settle<P: Provider>(&mut self, mut c: CompletionRef<'_, B, P>, plane: u16) {
        let tag = c.tag();
        let status = c.status();
        let ok = status == WcStatus::SUCCESS;
        let index = ((tag >> 32) & 0xFFFF) as u16;
        let Some(path) = self.paths.get_mut(usize::from(index)) else {
            return;
        };
        if path.stats.plane != plane {
            return;
        }
        // Every request on a plane's engine is the transfer's own
        // (`PlaneEngine`), but only one of the path's queue pair now
        // settles anything for it.
        if c.qp() != Some(path.stats.qp) {
            return;
        }
        let (generation, qpn) = (path.generation, path.qpn);
        if tag & PROBE != 0 {
            self.trace
                .record(index, generation, qpn, TraceKind::ProbeDone { status });
            if path.stats.state == PathState::Probing {
                if ok && !path.failing {
                    path.stats.state = PathState::Up;
                    path.stats.readmissions += 1;
                    path.backoff = Duration::ZERO;
                    path.silent = Duration::ZERO;
                } else {
                    path.fail(FailCause::ProbeFailed);
                }
            }
            return;
        }
        let chunk = (tag & 0xFFFF_FFFF) as usize;
        if chunk >= self.bufs.len() {
            return;
        }
        if let Some(buf) = c.take_buf() {
            self.bufs[chunk] = Some(buf);
        }
        path.stats.in_flight = path.stats.in_flight.saturating_sub(1);
        let counted = if ok {
            let done = self.chunks.completed(chunk, index, plane);
            if done {
                path.completed(self.config.chunk_range(chunk).1);
            }
            done
        } else {
            path.fail(if status == WcStatus::WR_FLUSH_ERR {
                FailCause::Flushed
            } else {
                FailCause::Completion(status)
            });
            self.chunks.lost(chunk, index)
        };
        let kind = TraceKind::Completed {
            chunk: chunk as u32,
            status,
            bytes: c.byte_len(),
            counted,
        };
        self.trace.record(index, generation, qpn, kind);
    }
}
