//! [`RdmaListener`]: streams accepted over [`verbs::exchange::Server`]
//! (hellos read many at once, each bounded in time, bad clients reported
//! and dropped, an optional token), handed to tasks.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Mutex};
use verbs::exchange::{ExchangeError, Handshake, Server, ServerConfig};
use verbs::{Deadline, ErrorKind, ProtectionDomain};

use crate::stream::{open, verbs_io, AnswerError, Parts, RdmaStream, StreamConfig};

/// How often the thread handing hellos over looks whether the listener
/// is gone (an idle listener's only wake-up; a dropped one frees its port
/// within this).
const HANDOFF_CHECK: Duration = Duration::from_secs(1);

/// What a listener demands of clients and gives each stream.
#[derive(Clone, Debug, Default)]
pub struct ListenerConfig {
    /// The exchange server's bounds (token, timeouts, pending hellos).
    pub server: ServerConfig,
    /// Each accepted stream's sizes and timings (`token` and
    /// `setup_timeout` are the server's).
    pub stream: StreamConfig,
}

/// Called with every client dropped before it became a stream.
type Rejected = dyn Fn(SocketAddr, &dyn std::fmt::Display) + Send + Sync;

/// Accepts [`RdmaStream`]s. Any number of tasks may call
/// [`RdmaListener::accept`] at once; each client goes to one of them.
///
/// Cancel-safe: a dropped `accept` loses no client (valid hellos wait in
/// a queue, bounded by `ServerConfig::max_pending`, until they expire).
pub struct RdmaListener {
    hellos: Mutex<mpsc::Receiver<Handshake>>,
    pd: ProtectionDomain,
    config: StreamConfig,
    addr: SocketAddr,
    rejected: Arc<Rejected>,
}

impl RdmaListener {
    /// Binds exactly where the caller says and starts reading hellos.
    /// `rejected` hears of every client dropped (garbage, a bad token,
    /// silence, gone before our reply): a one-line log; it runs on the
    /// server's threads and must be quick.
    pub async fn bind(
        addr: SocketAddr,
        config: ListenerConfig,
        rejected: impl Fn(SocketAddr, &dyn std::fmt::Display) + Send + Sync + 'static,
    ) -> io::Result<RdmaListener> {
        let pd = open(config.stream.device.as_deref())?;
        RdmaListener::bind_with(&pd, addr, config, rejected).await
    }

    /// As [`RdmaListener::bind`], on the caller's protection domain.
    pub async fn bind_with(
        pd: &ProtectionDomain,
        addr: SocketAddr,
        mut config: ListenerConfig,
        rejected: impl Fn(SocketAddr, &dyn std::fmt::Display) + Send + Sync + 'static,
    ) -> io::Result<RdmaListener> {
        if config.server.token.is_none() {
            config.server.token = config.stream.token;
        }
        let rejected: Arc<Rejected> = Arc::new(rejected);
        let report = rejected.clone();
        let server_config = config.server.clone();
        let server = tokio::task::spawn_blocking(move || {
            Server::bind(addr, server_config, move |peer, e: &ExchangeError| {
                report(peer, e)
            })
        })
        .await
        .map_err(io::Error::other)??;
        let addr = server.local_addr();
        let (tx, rx) = mpsc::channel(config.server.max_pending.max(1));
        std::thread::Builder::new()
            .name("verbs-tokio-hellos".into())
            .spawn(move || hand_over(&server, &tx))?;
        Ok(RdmaListener {
            hellos: Mutex::new(rx),
            pd: pd.clone(),
            config: config.stream,
            addr,
            rejected,
        })
    }

    /// The bound address (to learn the port chosen for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The next client whose hello was valid, as a connected stream.
    /// A client that fails between its hello and our reply is reported
    /// and skipped; an error is the listener's own (the device, memory).
    pub async fn accept(&self) -> io::Result<(RdmaStream, Option<SocketAddr>)> {
        loop {
            let hello = self.hellos.lock().await.recv().await.ok_or_else(|| {
                io::Error::new(io::ErrorKind::BrokenPipe, "the exchange server stopped")
            })?;
            let peer = hello.peer_addr();
            let (pd, config) = (self.pd.clone(), self.config.clone());
            let answered = tokio::task::spawn_blocking(move || Parts::answer(&pd, hello, &config))
                .await
                .map_err(io::Error::other)?;
            match answered {
                Ok(parts) => return Ok((RdmaStream::from_parts(parts)?, peer)),
                Err(AnswerError::Client(e)) => {
                    if let Some(peer) = peer {
                        (self.rejected)(peer, &e);
                    }
                }
                Err(AnswerError::Local(e)) => return Err(verbs_io(e)),
            }
        }
    }
}

/// The thread between the exchange server and the listener's queue,
/// until the listener is dropped (then the server stops and frees the
/// port).
fn hand_over(server: &Server, tx: &mpsc::Sender<Handshake>) {
    loop {
        match server.next_client(Deadline::after(HANDOFF_CHECK)) {
            Ok(hello) => {
                if tx.blocking_send(hello).is_err() {
                    return;
                }
            }
            Err(_) if tx.is_closed() => return,
            // A deadline passed, or accept failed (the server pauses and
            // retries): look again.
            Err(_) => {}
        }
    }
}

// The kinds the stream maps verbs errors to are tokio's too.
const _: ErrorKind = ErrorKind::TimedOut;
