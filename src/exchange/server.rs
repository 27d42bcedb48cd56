//! A server that keeps serving: connections accepted as fast as they
//! come, many hellos read at once each bounded in time, bad clients
//! reported and dropped.
//!
//! One thread blocks in `accept` and then takes every connection the
//! kernel's backlog holds, so the backlog (std listens with 128) is
//! drained as connections arrive rather than between polls: a burst of
//! idle connections does not fill it and leave a real client's SYN
//! unanswered for the second a retransmission takes.
//! Each accepted connection gets a short-lived thread that reads and
//! judges its hello with the socket's timeouts, the one tool safe std
//! offers to bound a blocking read (no `poll(2)`, no dependency). A
//! silent or trickling client thus holds a thread and a socket for at
//! most [`ServerConfig::hello_timeout`] and never delays anyone else.
//!
//! Hellos in progress are bounded by [`ServerConfig::max_pending`]. When
//! another client connects beyond that, the *oldest* is shut down to make
//! room rather than the newcomer turned away: a real client sends its
//! hello within a round trip of connecting, so the oldest pending
//! connections are the ones sitting silent. A flood of idle connections
//! therefore cannot lock out a real client, which would only be pushed
//! out if `max_pending` connections arrived within its own round trip.
//!
//! Refused clients are reported through a callback as it happens, on the
//! server's threads, so no queue of reports grows while the caller is
//! busy; valid hellos wait (at most `max_pending` of them) for
//! [`Server::next_client`].

use std::io;
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs,
};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use super::acceptor::{accept_loop, Shared, State};
use super::error::{io_err, ExchangeError};
use super::handshake::Handshake;
use super::server_config::ServerConfig;
use super::session::time_left;
use crate::time::Deadline;

/// The server side of this crate's exchange, for a server that must keep
/// serving whatever connects.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use verbs::exchange::{Server, ServerConfig};
/// use verbs::Deadline;
/// # let ours: verbs::Endpoint = todo!();
/// let server = Server::bind("0.0.0.0:18515", ServerConfig::default(), |peer, err| {
///     eprintln!("refused {peer}: {err}")
/// })?;
/// loop {
///     let hs = server.next_client(Deadline::NEVER)?;
///     // qp.connect(hs.peer_endpoint())?;
///     let mut session = hs.reply(&ours)?;
///     session.sync(Deadline::after(Duration::from_secs(60)))?;
/// }
/// # }
/// ```
pub struct Server {
    shared: Arc<Shared>,
    addr: SocketAddr,
    acceptor: Option<JoinHandle<()>>,
}

impl Server {
    /// Binds exactly where the caller says (no default interface) and
    /// starts accepting. `rejected` hears of every client dropped, with
    /// its address and why: a one-line log. It runs on the server's
    /// threads, so it must be quick and must not panic (that would stop
    /// the acceptor). Refuses a config with zero `max_pending` or a zero
    /// timeout.
    pub fn bind(
        addr: impl ToSocketAddrs,
        config: ServerConfig,
        rejected: impl Fn(SocketAddr, &ExchangeError) + Send + Sync + 'static,
    ) -> io::Result<Server> {
        Server::from_std(TcpListener::bind(addr)?, config, rejected)
    }

    /// Serves on a listener the caller already bound.
    pub fn from_std(
        listener: TcpListener,
        config: ServerConfig,
        rejected: impl Fn(SocketAddr, &ExchangeError) + Send + Sync + 'static,
    ) -> io::Result<Server> {
        if config.max_pending == 0
            || config.hello_timeout.is_zero()
            || config.client_timeout.is_zero()
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "ServerConfig: max_pending and both timeouts must be above zero",
            ));
        }
        // The acceptor blocks in accept; Listener users may have left it
        // non-blocking.
        listener.set_nonblocking(false)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            config,
            report: Box::new(rejected),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        });
        let for_acceptor = shared.clone();
        let acceptor = thread::Builder::new()
            .name("verbs-accept".into())
            .spawn(move || accept_loop(&for_acceptor, &listener))?;
        Ok(Server {
            shared,
            addr,
            acceptor: Some(acceptor),
        })
    }

    /// The bound address, e.g. to learn the port chosen for port 0.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The configuration serving under.
    pub fn config(&self) -> &ServerConfig {
        &self.shared.config
    }

    /// Hellos being read right now (at most [`ServerConfig::max_pending`]).
    pub fn pending(&self) -> usize {
        self.shared.lock().pending.len()
    }

    /// Waits until `deadline` for a client whose hello is valid and
    /// returns it, nothing of ours sent yet ([`Handshake::reply`] does).
    /// Clients whose hello waited past their `client_timeout` are dropped
    /// and reported instead.
    ///
    /// Several threads may wait here at once; each client goes to one.
    ///
    /// An error is the server's, never a client's: the deadline passed
    /// ([`ExchangeError::TimedOut`]) or `accept` failed in a way that is
    /// not about one connection (e.g. out of file descriptors; the
    /// acceptor retries after a pause). The server stays usable either
    /// way.
    pub fn next_client(&self, deadline: Deadline) -> Result<Handshake, ExchangeError> {
        let mut state = self.shared.lock();
        loop {
            if let Some(e) = state.accept_error.take() {
                return Err(io_err("accept", e));
            }
            while let Some((peer, handshake)) = state.ready.pop_front() {
                if !handshake.expires().passed() {
                    return Ok(handshake);
                }
                drop(state);
                let late = ExchangeError::TimedOut {
                    during: "the wait for next_client (client_timeout)",
                };
                (self.shared.report)(peer, &late);
                state = self.shared.lock();
            }
            let changed = &self.shared.changed;
            state = match time_left(deadline, "the wait for a client")? {
                Some(left) => {
                    let woken = changed.wait_timeout(state, left);
                    woken.unwrap_or_else(PoisonError::into_inner).0
                }
                None => changed.wait(state).unwrap_or_else(PoisonError::into_inner),
            };
        }
    }
}

impl Drop for Server {
    /// Stops accepting, closes every connection not handed out, and
    /// frees the port before returning (unless waking the acceptor
    /// fails, in which case it exits at the next connection).
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.stopped = true;
        for p in state.pending.drain(..) {
            let _ = p.socket.shutdown(Shutdown::Both);
        }
        state.ready.clear();
        drop(state);
        // A blocking accept only returns for a connection: make one.
        let ip = match self.addr.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => Ipv4Addr::LOCALHOST.into(),
            IpAddr::V6(ip) if ip.is_unspecified() => Ipv6Addr::LOCALHOST.into(),
            ip => ip,
        };
        let wake = SocketAddr::new(ip, self.addr.port());
        if TcpStream::connect_timeout(&wake, Duration::from_secs(1)).is_ok() {
            if let Some(acceptor) = self.acceptor.take() {
                let _ = acceptor.join();
            }
        }
    }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("Server")
            .field("addr", &self.addr)
            .field("config", &self.shared.config)
            .field("pending", &state.pending.len())
            .field("ready", &state.ready.len())
            .finish()
    }
}
