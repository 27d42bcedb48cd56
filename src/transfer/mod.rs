//! Multipath transfers: one logical RDMA Write or Read of a large range,
//! cut into chunks sprayed over several RC queue pairs spread across
//! devices, ports and planes; a failed path's unfinished chunks are
//! posted again on the others, and the path is reset, probed and
//! re-admitted once it works again.
//!
//! - `bound`: the retry policy every path connects with, the detection
//!   bound it implies ([`DetectionBound`]), and each path's
//!   [`ConnectOptions`](crate::engine::ConnectOptions) (its own flow label, so
//!   RoCEv2 gives it its own UDP source port for ECMP to hash).
//! - `config`: what a transfer is given ([`TransferConfig`], [`Plane`],
//!   [`PeerControl`]) and why only Writes and Reads ([`TransferOp`]).
//! - `chunks`: where every chunk is; `path`: what a path may do and did.
//! - `device`: a plane's engine ([`PlaneEngine`]) and its control path.
//! - `spray`: posting and polling; `settle`: what a completion settles; `trace`: what it did,
//!   when asked; `readmit`: the watchdog,
//!   port events, reset, probe and re-admission, and the step loop.
//!
//! # Shape
//!
//! One engine per device (a *plane*), because an engine's queue pairs
//! share one completion queue and protection domain, and both belong to
//! one device context. It is a [`PlaneEngine`]: made empty, its paths
//! added and connected by the caller, posted on and polled by the
//! transfer alone, so every completion is one of the transfer's own
//! posts. The transfer owns the planes' engines and polls them in turn
//! from one thread: [`Transfer::step`]
//! posts, polls every plane once, and handles failures;
//! [`Transfer::run`] steps to the end. Between steps,
//! [`Transfer::progress`] and [`Transfer::paths`] show the bytes, rate,
//! resends and state of the whole and of every path.
//!
//! Memory registered with one device cannot be used by another, and the
//! crate's buffers own their memory alone, so every plane holds its own
//! buffer per chunk (for a Write the caller fills each plane's copy; for
//! a Read the bytes land in the buffer of the plane that completed the
//! chunk) and the peer exposes one region per plane. [`Transfer::placement`]
//! says which plane holds each chunk's final bytes, locally (Read) or at
//! the peer (Write); the peer needs that map to assemble what it received.
//!
//! # Failures
//!
//! A path fails on an error completion (`RETRY_EXC_ERR` after the retry
//! policy's attempts, `LOC_QP_OP_ERR` when Soft-RoCE cannot route, any
//! other), on a `PORT_ERR` event of its plane, on a refused post, or when
//! its watchdog ([`DetectionBound::watchdog`]) sees requests in flight and
//! no completion (a device that stalls instead of failing: Soft-RoCE after
//! a link loss, `FAULTS.md`). The watchdog counts only time the step loop
//! ran (a gap between steps adds at most 50 ms: a starved host is not a
//! dead path), and when no path at all was heard in the last half bound
//! (a stalled host or peer, which no re-routing cures) it waits twice the
//! bound; a path silent while others complete is failed at the bound. Its queue pair is reset at once: every
//! request it held comes back flushed, each chunk waits again at the front
//! of the queue and goes out on the paths still up. After a backoff, and
//! only while its port is active, a fresh queue pair replaces it, the
//! peer is asked ([`PeerControl`]) to replace its end too, both connect
//! (new QPNs, so no packet of the old connection can land in the new); a
//! zero-length RDMA Write probes the path, and its success re-admits it.
//!
//! Re-posting is safe because chunks are one-sided Writes or Reads of
//! disjoint ranges: doing one again puts the same bytes in the same
//! place. Sends, atomics and Writes with immediate are never re-sprayed
//! (see [`TransferOp`]): their effect at the peer is not idempotent.

mod bound;
mod chunks;
mod config;
mod device;
#[cfg(test)]
mod failures;
mod path;
mod readmit;
#[cfg(test)]
mod replay;
mod settle;
#[cfg(test)]
mod sim;
mod spray;
mod trace;

pub use bound::{DetectionBound, PathOptions, RetryPolicy};
pub use chunks::{ChunkState, ChunkTable};
pub use config::{NoPeerControl, PeerControl, Plane, TransferConfig, TransferOp};
pub use device::PlaneEngine;
pub use path::{FailCause, PathState, PathStats};
pub use spray::{Progress, Step, Transfer};
pub use trace::{TraceEvent, TraceKind};
