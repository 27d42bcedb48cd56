//! [`RdmaStream`]: a byte stream over one RC queue pair.
//!
//! Each side posts `recv_slots` receives for data (plus a few for control
//! messages) and the peer holds that many credits: a write is cut into
//! Sends of at most `slot_size` bytes, one credit each, and waits when the
//! credits or its send buffers run out (back-pressure). The receiver
//! copies into the caller's buffer, posts the receive again and returns
//! the credit: in the immediate data of its next Send, or in a zero-length
//! control Send once half of them are owed. The immediate's top bit is
//! the end of the stream (`poll_shutdown`).

mod config;
mod flow;
mod io;
mod parts;
mod wakers;

pub use config::StreamConfig;
pub(crate) use parts::{verbs_io, AnswerError, Parts};

use std::net::SocketAddr;
use std::pin::Pin;

use tokio::time::Sleep;
use verbs::{Arena, ArenaBuf, Context, ProtectionDomain};

use crate::channel::Core;
use flow::Flow;
use wakers::Wakers;

/// A reliable, ordered byte stream over an RC queue pair, for tokio:
/// `AsyncRead` + `AsyncWrite` (so `hyper_util::rt::TokioIo` and tonic run
/// over it).
///
/// Owns its own engine, queue pair and registered buffers (no lock, no
/// sharing: `Send`, moves with its task). Reads copy out of the receive
/// ring into the caller's buffer; writes copy into send buffers.
///
/// - A write is posted when `poll_write` returns; `poll_flush` has
///   nothing to push (it reports a failure seen). `poll_shutdown` sends
///   the end of the stream (the peer reads EOF once it has read
///   everything) and returns once the peer's device acknowledged every
///   byte, or at once if the peer ended its own first (it may be gone).
/// - A peer that is gone is an error: its writes fail after the
///   transport's retries, and a read or write waiting longer than
///   `StreamConfig::keepalive` probes it.
/// - Dropping the stream destroys its queue pair: bytes not yet
///   acknowledged may not arrive (as a TCP reset). Shut down first (hyper
///   does).
pub struct RdmaStream {
    core: Core<ArenaBuf>,
    /// See `AsyncEngine::armed`.
    armed: bool,
    flow: Flow,
    wakers: Wakers,
    keepalive: Option<Pin<Box<Sleep>>>,
    keepalive_every: Option<std::time::Duration>,
    /// Last: its registration is freed only once every buffer is back
    /// (dropped with the engine and the flow, above).
    _arena: Arena,
}

impl RdmaStream {
    /// Connects to an [`crate::RdmaListener`] at `addr` on the first
    /// device (or `config.device`): the exchange over TCP, then the
    /// queue pairs. Opens the device each time; many connections from
    /// one process want [`RdmaStream::connect_with`].
    pub async fn connect(addr: SocketAddr, config: &StreamConfig) -> std::io::Result<RdmaStream> {
        let pd = open(config.device.as_deref())?;
        RdmaStream::connect_with(&pd, addr, config).await
    }

    /// As [`RdmaStream::connect`], on a protection domain the caller
    /// opened (its device).
    pub async fn connect_with(
        pd: &ProtectionDomain,
        addr: SocketAddr,
        config: &StreamConfig,
    ) -> std::io::Result<RdmaStream> {
        let (pd, config) = (pd.clone(), config.clone());
        let parts = tokio::task::spawn_blocking(move || Parts::dial(&pd, addr, &config))
            .await
            .map_err(std::io::Error::other)??;
        RdmaStream::from_parts(parts)
    }

    /// Registers the parts' completion channel with the current runtime.
    pub(crate) fn from_parts(parts: Parts) -> std::io::Result<RdmaStream> {
        let Parts {
            engine,
            qp,
            send_free,
            arena,
            config,
        } = parts;
        let core = Core::new(engine).map_err(|(e, _engine)| verbs_io(e))?;
        let keepalive = config
            .keepalive
            .map(|every| Box::pin(tokio::time::sleep(every)));
        Ok(RdmaStream {
            core,
            armed: false,
            flow: Flow::new(qp, send_free, &config),
            wakers: Wakers::new(),
            keepalive,
            keepalive_every: config.keepalive,
            _arena: arena,
        })
    }
}

impl std::fmt::Debug for RdmaStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaStream")
            .field("flow", &self.flow)
            .finish_non_exhaustive()
    }
}

/// The device's protection domain.
pub(crate) fn open(device: Option<&str>) -> std::io::Result<ProtectionDomain> {
    let ctx = Context::open(device).map_err(verbs_io)?;
    ProtectionDomain::new(&ctx).map_err(verbs_io)
}
