//! The server's machinery: the acceptor thread, the hello threads, and
//! the table they share with [`super::Server`].

use std::collections::VecDeque;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::Duration;

use super::connect::is_transient_accept_error;
use super::error::{io_err, is_timeout, ExchangeError};
use super::handshake::Handshake;
use super::server_config::ServerConfig;
use super::session::Session;
use crate::time::Deadline;

/// Stack for a hello thread: it holds one message buffer and small frames.
const HELLO_STACK: usize = 128 << 10;

/// Most connections taken from the backlog in one go.
const MAX_BATCH: usize = 1024;

/// Pause after an accept error that is not about one connection (out of
/// file descriptors, say), so the acceptor does not spin on it.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// Called once for every client the server drops, with its address and
/// why; from the server's own threads, so it must be quick.
pub(super) type RejectReport = dyn Fn(SocketAddr, &ExchangeError) + Send + Sync;

/// What the acceptor, the hello threads and [`super::Server`] share.
pub(super) struct Shared {
    pub(super) config: ServerConfig,
    pub(super) report: Box<RejectReport>,
    pub(super) state: Mutex<State>,
    /// Signalled when `ready` or `accept_error` gains an entry.
    pub(super) changed: Condvar,
}

#[derive(Default)]
pub(super) struct State {
    /// Hellos in progress, oldest first.
    pub(super) pending: Vec<Pending>,
    /// Valid hellos not handed out yet, oldest first.
    pub(super) ready: VecDeque<(SocketAddr, Handshake)>,
    /// The last accept failure not about one connection, for
    /// [`super::Server::next_client`] to return.
    pub(super) accept_error: Option<io::Error>,
    pub(super) next_id: u64,
    pub(super) stopped: bool,
}

/// A connection whose hello a thread is reading.
pub(super) struct Pending {
    pub(super) id: u64,
    pub(super) peer: SocketAddr,
    /// Another handle on the socket, to shut it down on eviction.
    pub(super) socket: TcpStream,
}

impl Shared {
    /// The state, even if a thread panicked holding it: every update
    /// leaves it consistent.
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn evicted(&self) -> ExchangeError {
        ExchangeError::Evicted {
            max_pending: self.config.max_pending,
        }
    }
}

/// The acceptor thread, until the server is dropped: blocks for a
/// connection, then takes every other one the backlog holds without
/// blocking, and admits them together. A burst is thus drained at the
/// speed of `accept`, and only its newest `max_pending` connections cost
/// a thread.
pub(super) fn accept_loop(shared: &Arc<Shared>, listener: &TcpListener) {
    let mut batch = Vec::new();
    loop {
        let first = listener
            .set_nonblocking(false)
            .and_then(|()| listener.accept());
        if shared.lock().stopped {
            return;
        }
        let mut failure = match first {
            Ok(conn) => {
                batch.push(conn);
                None
            }
            Err(e) if is_transient_accept_error(&e) => None,
            Err(e) => Some(e),
        };
        if failure.is_none() {
            failure = drain(listener, &mut batch).err();
        }
        admit(shared, &mut batch);
        if let Some(e) = failure {
            shared.lock().accept_error = Some(e);
            shared.changed.notify_all();
            thread::sleep(ACCEPT_ERROR_PAUSE);
        }
    }
}

/// Appends to `batch` the connections the backlog holds, without waiting.
fn drain(listener: &TcpListener, batch: &mut Vec<(TcpStream, SocketAddr)>) -> io::Result<()> {
    listener.set_nonblocking(true)?;
    while batch.len() < MAX_BATCH {
        match listener.accept() {
            Ok(conn) => batch.push(conn),
            Err(e) if is_timeout(&e) => break,
            Err(e) if is_transient_accept_error(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Makes room for `batch` (connections in arrival order) by evicting the
/// oldest hellos, pending ones first, then starts a hello thread for each
/// connection left.
fn admit(shared: &Arc<Shared>, batch: &mut Vec<(TcpStream, SocketAddr)>) {
    let max = shared.config.max_pending;
    let reply_by = Deadline::after(shared.config.client_timeout);
    let hello_by = Deadline::after(shared.config.hello_timeout).min(reply_by);
    let mut evicted = Vec::new();
    let mut failed = Vec::new();
    let mut state = shared.lock();
    let excess = (state.pending.len() + batch.len()).saturating_sub(max);
    let from_pending = excess.min(state.pending.len());
    for oldest in state.pending.drain(..from_pending) {
        // Wakes its thread, which then finds the stream closed.
        let _ = oldest.socket.shutdown(Shutdown::Both);
        evicted.push(oldest.peer);
    }
    // The rest of the excess never gets a thread: closed on the spot.
    evicted.extend(batch.drain(..excess - from_pending).map(|(_, peer)| peer));
    let mut starts = Vec::with_capacity(batch.len());
    for (stream, peer) in batch.drain(..) {
        match stream.try_clone() {
            Ok(socket) => {
                let id = state.next_id;
                state.next_id += 1;
                state.pending.push(Pending { id, peer, socket });
                starts.push((id, stream, peer));
            }
            Err(e) => failed.push((peer, io_err("configure", e))),
        }
    }
    drop(state);
    for peer in evicted {
        (shared.report)(peer, &shared.evicted());
    }
    for (peer, e) in failed {
        (shared.report)(peer, &e);
    }
    for (id, stream, peer) in starts {
        let for_hello = shared.clone();
        let spawned = thread::Builder::new()
            .name("verbs-hello".into())
            .stack_size(HELLO_STACK)
            .spawn(move || {
                let config = &for_hello.config;
                let result = read_hello(stream, peer, config, hello_by, reply_by);
                finish(&for_hello, id, peer, result);
            });
        if let Err(e) = spawned {
            // The closure, and with it the stream, is gone: drop the entry.
            shared.lock().pending.retain(|p| p.id != id);
            (shared.report)(peer, &io_err("spawn a hello thread", e));
        }
    }
}

/// A hello thread's work. A refused client's connection is shut down
/// here, at once, although the server's other handle on it lives until
/// [`finish`] removes it.
fn read_hello(
    stream: TcpStream,
    peer: SocketAddr,
    config: &ServerConfig,
    hello_by: Deadline,
    reply_by: Deadline,
) -> Result<Handshake, ExchangeError> {
    let mut session = Session::configure(stream, peer)?;
    match session.read_valid_hello(config.token.as_ref(), config.link_layer, hello_by) {
        Ok(endpoint) => Ok(Handshake::new(session, endpoint, reply_by)),
        Err(e) => {
            let _ = session.stream().shutdown(Shutdown::Both);
            Err(e)
        }
    }
}

/// Files a hello thread's outcome: a valid hello joins the ready queue
/// (evicting the oldest there if full), a refused one is reported. A
/// hello evicted meanwhile was reported already and is dropped.
fn finish(shared: &Shared, id: u64, peer: SocketAddr, result: Result<Handshake, ExchangeError>) {
    let mut state = shared.lock();
    let Some(at) = state.pending.iter().position(|p| p.id == id) else {
        return;
    };
    state.pending.remove(at);
    let report = match result {
        Ok(handshake) => {
            let full = state.ready.len() >= shared.config.max_pending;
            let dropped = full.then(|| state.ready.pop_front()).flatten();
            state.ready.push_back((peer, handshake));
            shared.changed.notify_all();
            dropped.map(|(oldest, _)| (oldest, shared.evicted()))
        }
        Err(e) => Some((peer, e)),
    };
    drop(state);
    if let Some((peer, e)) = report {
        (shared.report)(peer, &e);
    }
}
