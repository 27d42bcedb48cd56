//! Making TCP connections within a deadline: the client's connect (which
//! may start before the server listens) and a plain one-at-a-time accept.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::thread;
use std::time::Duration;

use super::error::{io_err, is_timeout, ExchangeError};
use super::session::{time_left, Session};
use crate::endpoint::Endpoint;
use crate::time::Deadline;
use crate::wire::Token;

/// Longest sleep between two non-blocking `accept` attempts.
const ACCEPT_POLL_MAX: Duration = Duration::from_millis(10);

/// First sleep after a refused connect (doubles up to [`CONNECT_RETRY_MAX`]).
const CONNECT_RETRY_MIN: Duration = Duration::from_millis(5);

/// Longest sleep between two connect attempts to a not-yet-listening peer.
const CONNECT_RETRY_MAX: Duration = Duration::from_millis(50);

/// Accept errors that concern one vanished peer, not the listener: skip
/// to the next connection.
pub(super) fn is_transient_accept_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::Interrupted
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// A TCP listener taking one connection at a time, within a deadline.
///
/// For the primer's format ([`Session::exchange_tutorial`]) and for
/// callers running their own accept loop. A server of this crate's
/// format that must survive hostile clients wants [`super::Server`]
/// instead, which reads many hellos at once with bounded time each.
#[derive(Debug)]
pub struct Listener {
    inner: TcpListener,
}

impl Listener {
    /// Binds exactly where the caller says (e.g. `"0.0.0.0:18515"`, or
    /// `"127.0.0.1:0"` for an ephemeral port in tests): no default
    /// address, because which interface to expose is the caller's call.
    pub fn bind(addr: impl ToSocketAddrs) -> io::Result<Listener> {
        Listener::from_std(TcpListener::bind(addr)?)
    }

    /// Wraps a listener the caller already bound (made non-blocking here,
    /// so [`Listener::accept`] can honour a deadline).
    pub fn from_std(inner: TcpListener) -> io::Result<Listener> {
        inner.set_nonblocking(true)?;
        Ok(Listener { inner })
    }

    /// The bound address, e.g. to learn the port chosen for port 0.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// Waits until `deadline` for one peer to connect.
    ///
    /// Polls with sleeps of at most 10 ms (no busy spin, no thread, no
    /// `poll(2)`). Connections reset or aborted before we took them are
    /// skipped; any other accept error is returned, and the listener
    /// remains usable.
    pub fn accept(&self, deadline: Deadline) -> Result<Session, ExchangeError> {
        let mut pause = Duration::from_millis(1);
        loop {
            match self.inner.accept() {
                Ok((stream, peer)) => return Session::configure(stream, peer),
                Err(e) if is_timeout(&e) => {}
                // Try the next at once, still within the deadline.
                Err(e) if is_transient_accept_error(&e) => {
                    time_left(deadline, "accept")?;
                    continue;
                }
                Err(e) => return Err(io_err("accept", e)),
            }
            let left = time_left(deadline, "accept")?.unwrap_or(ACCEPT_POLL_MAX);
            thread::sleep(pause.min(left));
            pause = (pause * 2).min(ACCEPT_POLL_MAX);
        }
    }
}

/// Connects to the server side of the exchange, retrying until
/// `deadline` while nobody listens yet, so the client may start first.
///
/// Each resolved address is tried in turn with `connect_timeout` bounded
/// by the time left. A refused, reset or aborted attempt, and one that
/// finds no route to the host or its network (a peer still booting does
/// not answer ARP yet), is retried after a short pause (5 ms doubling to
/// 50 ms); other errors move on to the next address and are returned if
/// every address fails that way. When
/// the deadline passes the result is the last refusal as
/// [`ExchangeError::Io`] (`ConnectionRefused` says more than "timed
/// out"), or [`ExchangeError::TimedOut`] if attempts were timing out.
/// Name resolution itself is not bounded by the deadline (std offers no
/// way to); pass a literal address to avoid DNS.
pub fn connect(addr: impl ToSocketAddrs, deadline: Deadline) -> Result<Session, ExchangeError> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| io_err("resolve", e))?
        .collect();
    if addrs.is_empty() {
        return Err(io_err(
            "resolve",
            io::Error::new(io::ErrorKind::InvalidInput, "address resolved to nothing"),
        ));
    }
    // A day stands in for "no deadline": connect_timeout needs a bound.
    let bound = |deadline: Deadline| {
        time_left(deadline, "connect").map(|left| left.unwrap_or(Duration::from_secs(86_400)))
    };
    let mut pause = CONNECT_RETRY_MIN;
    // What to report if the deadline passes: the latest refusal, or
    // `None` when the latest attempt timed out.
    let mut last: Option<io::Error> = None;
    loop {
        // Whether any address failed in a way worth retrying this round;
        // if none did, the last other error is final.
        let mut worth_retrying = false;
        let mut fatal = None;
        for addr in &addrs {
            let Ok(left) = bound(deadline) else {
                break;
            };
            match TcpStream::connect_timeout(addr, left) {
                Ok(stream) => return Session::configure(stream, *addr),
                Err(e) if is_timeout(&e) || e.kind() == io::ErrorKind::Interrupted => {
                    worth_retrying = true;
                    last = None;
                }
                Err(e) if not_yet(&e) => {
                    worth_retrying = true;
                    last = Some(e);
                }
                Err(e) => fatal = Some(e),
            }
        }
        if let (false, Some(e)) = (worth_retrying, fatal) {
            return Err(io_err("connect", e));
        }
        let Ok(left) = bound(deadline) else {
            return Err(match last {
                Some(e) => io_err("connect", e),
                None => ExchangeError::TimedOut { during: "connect" },
            });
        };
        thread::sleep(pause.min(left));
        pause = (pause * 2).min(CONNECT_RETRY_MAX);
    }
}

/// Whether a failed connect may succeed later: nobody listens yet, or the
/// host is not reachable yet (`EHOSTUNREACH`, `ENETUNREACH`: a booting
/// peer, a link coming up).
fn not_yet(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
    ) || matches!(
        e.raw_os_error(),
        Some(libc::EHOSTUNREACH | libc::ENETUNREACH)
    )
}

/// The whole client side: [`connect`], send our hello (with `token` if
/// the server requires one), read the server's reply; all by `deadline`.
/// Returns the session, for use as a control channel, and the server's
/// endpoint.
///
/// A server that refuses the hello closes without replying:
/// [`ExchangeError::NoReply`].
pub fn connect_and_exchange(
    addr: impl ToSocketAddrs,
    ours: &Endpoint,
    token: Option<&Token>,
    deadline: Deadline,
) -> Result<(Session, Endpoint), ExchangeError> {
    let mut session = connect(addr, deadline)?;
    let theirs = session.client_exchange(ours, token, deadline)?;
    Ok((session, theirs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_still_booting_is_retried_and_a_bad_address_is_not() {
        for errno in [libc::ECONNREFUSED, libc::EHOSTUNREACH, libc::ENETUNREACH] {
            assert!(not_yet(&io::Error::from_raw_os_error(errno)));
        }
        for errno in [libc::EADDRNOTAVAIL, libc::EACCES, libc::EINVAL] {
            assert!(!not_yet(&io::Error::from_raw_os_error(errno)));
        }
    }
}
