//! Out-of-band endpoint exchange over TCP, bounded by deadlines.
//!
//! RC queue pairs cannot be connected until each side knows the other's
//! [`Endpoint`]; this module moves those over an ordinary TCP connection,
//! in [`crate::wire`]'s format or (for the primer's C programs) in
//! [`tutorial`]'s raw `conn_info` format.
//!
//! Every blocking call takes an absolute [`Instant`] deadline rather than
//! a timeout, so a caller's whole connection setup shares one budget, and
//! a peer that trickles one byte at a time cannot stretch it: each read or
//! write is given only the time *remaining* until the deadline.
//!
//! There is no `unsafe` and no helper thread: [`Listener::accept`] polls a
//! non-blocking listener with short sleeps (1 ms doubling to at most
//! 10 ms), trading up to 10 ms of accept latency for not needing
//! `poll(2)`; reads and writes use the socket's own timeouts.
//!
//! After any error a [`Session`] is in an unknown position in the byte
//! stream: drop it. A [`Listener`] is never affected by one session's
//! failure and can accept the next peer.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::thread;
use std::time::{Duration, Instant};

use crate::endpoint::Endpoint;
use crate::wire::tutorial::{self, ConnInfo, CONN_INFO_LEN};
use crate::wire::{self, WireError, HEADER_LEN, MAX_MESSAGE_LEN};

/// Longest sleep between two non-blocking `accept` attempts.
const ACCEPT_POLL_MAX: Duration = Duration::from_millis(10);

/// First sleep after a refused connect (doubles up to [`CONNECT_RETRY_MAX`]).
const CONNECT_RETRY_MIN: Duration = Duration::from_millis(5);

/// Longest sleep between two connect attempts to a not-yet-listening peer.
const CONNECT_RETRY_MAX: Duration = Duration::from_millis(50);

/// The byte [`Session::sync`] sends and expects (`'S'`).
pub const SYNC_BYTE: u8 = b'S';

/// Why an exchange step failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum ExchangeError {
    /// A socket call failed. `during` names the step (`"resolve"`,
    /// `"connect"`, `"accept"`, `"configure"`, `"read header"`,
    /// `"read body"`, `"write"`, …); `source` keeps the
    /// [`io::ErrorKind`] and the raw OS error.
    Io {
        /// The step that failed.
        during: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// The deadline passed during `during`.
    TimedOut {
        /// The step that was still waiting.
        during: &'static str,
    },
    /// The peer closed the connection after `got` of `needed` bytes.
    PeerClosed {
        /// The read that hit end of stream.
        during: &'static str,
        /// Bytes of this read received before the close.
        got: usize,
        /// Bytes this read needed.
        needed: usize,
    },
    /// Our own endpoint could not be encoded (it fails validation).
    Encode(WireError),
    /// The peer's message was malformed.
    Decode(WireError),
}

impl ExchangeError {
    /// The I/O error kind behind an [`ExchangeError::Io`], for callers
    /// deciding whether to retry.
    pub fn kind(&self) -> Option<io::ErrorKind> {
        match self {
            ExchangeError::Io { source, .. } => Some(source.kind()),
            _ => None,
        }
    }

    /// The raw OS error (`errno`) behind an [`ExchangeError::Io`], if any.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            ExchangeError::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// The wire error behind [`ExchangeError::Encode`] or
    /// [`ExchangeError::Decode`].
    pub fn wire_error(&self) -> Option<&WireError> {
        match self {
            ExchangeError::Encode(e) | ExchangeError::Decode(e) => Some(e),
            _ => None,
        }
    }

    /// True for [`ExchangeError::TimedOut`]: the deadline, not the peer,
    /// ended the step.
    pub fn is_timeout(&self) -> bool {
        matches!(self, ExchangeError::TimedOut { .. })
    }
}

impl fmt::Display for ExchangeError {
    /// Says which step failed and why.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExchangeError::Io { during, source } => write!(f, "endpoint exchange: {during} failed: {source}"),
            ExchangeError::TimedOut { during } => {
                write!(f, "endpoint exchange: deadline passed during {during}")
            }
            ExchangeError::PeerClosed { during, got, needed } => write!(
                f,
                "endpoint exchange: peer closed the connection during {during} after {got} of {needed} bytes"
            ),
            ExchangeError::Encode(e) => write!(f, "endpoint exchange: cannot encode our endpoint: {e}"),
            ExchangeError::Decode(e) => write!(f, "endpoint exchange: peer sent a bad message: {e}"),
        }
    }
}

impl std::error::Error for ExchangeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ExchangeError::Io { source, .. } => Some(source),
            ExchangeError::Encode(e) | ExchangeError::Decode(e) => Some(e),
            _ => None,
        }
    }
}

impl From<ExchangeError> for io::Error {
    /// For callers that return `io::Result`: keeps the OS error as is and
    /// maps the rest onto the nearest [`io::ErrorKind`].
    fn from(e: ExchangeError) -> Self {
        let kind = match &e {
            ExchangeError::Io { source, .. } => source.kind(),
            ExchangeError::TimedOut { .. } => io::ErrorKind::TimedOut,
            ExchangeError::PeerClosed { .. } => io::ErrorKind::UnexpectedEof,
            ExchangeError::Encode(_) => io::ErrorKind::InvalidInput,
            ExchangeError::Decode(_) => io::ErrorKind::InvalidData,
        };
        match e {
            ExchangeError::Io { source, .. } if source.raw_os_error().is_some() => source,
            other => io::Error::new(kind, other),
        }
    }
}

fn io_err(during: &'static str, source: io::Error) -> ExchangeError {
    ExchangeError::Io { during, source }
}

/// Time left until `deadline`, or `None` once it has passed.
fn remaining(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
}

/// Socket timeouts report as `WouldBlock` (EAGAIN) on Unix and
/// `TimedOut` on Windows.
fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// A TCP listener for the server side of the exchange.
///
/// It is non-blocking underneath so [`Listener::accept`] can honour a
/// deadline. A peer that misbehaves (connects and vanishes, sends
/// garbage, stalls) produces an error from `accept` or from that
/// session's calls only; the listener stays usable for the next peer.
#[derive(Debug)]
pub struct Listener {
    inner: TcpListener,
}

impl Listener {
    /// Binds exactly where the caller says (e.g. `"0.0.0.0:18515"`, or
    /// `"127.0.0.1:0"` for an ephemeral port in tests) — no default
    /// address, because which interface to expose is the caller's call.
    pub fn bind(addr: impl ToSocketAddrs) -> io::Result<Listener> {
        let inner = TcpListener::bind(addr)?;
        inner.set_nonblocking(true)?;
        Ok(Listener { inner })
    }

    /// Wraps a listener the caller already bound (made non-blocking here).
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
    /// Polls with sleeps of at most 10 ms (no busy spin, no thread).
    /// Connections that were reset or aborted before we took them are
    /// skipped silently; any other accept error is returned, and the
    /// listener remains usable.
    pub fn accept(&self, deadline: Instant) -> Result<Session, ExchangeError> {
        let mut pause = Duration::from_millis(1);
        loop {
            match self.inner.accept() {
                Ok((stream, peer)) => return Session::configure(stream, peer),
                Err(e) if is_timeout(&e) => {}
                // A peer that vanished before we took it: try the next
                // one at once, still bounded by the deadline.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted
                            | io::ErrorKind::ConnectionAborted
                            | io::ErrorKind::ConnectionReset
                    ) =>
                {
                    if remaining(deadline).is_none() {
                        return Err(ExchangeError::TimedOut { during: "accept" });
                    }
                    continue;
                }
                Err(e) => return Err(io_err("accept", e)),
            }
            let Some(left) = remaining(deadline) else {
                return Err(ExchangeError::TimedOut { during: "accept" });
            };
            thread::sleep(pause.min(left));
            pause = (pause * 2).min(ACCEPT_POLL_MAX);
        }
    }
}

/// Connects to the server side of the exchange, retrying until
/// `deadline` while nobody listens yet, so the client may start first.
///
/// Each resolved address is tried in turn with `connect_timeout` bounded
/// by the time left. A refused, reset or aborted attempt is retried after
/// a short pause (5 ms doubling to 50 ms); other errors move on to the
/// next address and are returned if every address fails that way. When
/// the deadline passes the result is the last refusal as
/// [`ExchangeError::Io`] (`ConnectionRefused` says more than "timed
/// out"), or [`ExchangeError::TimedOut`] if attempts were timing out.
/// Name resolution itself is not bounded by the deadline (std offers no
/// way to); pass a literal address to avoid DNS.
pub fn connect(addr: impl ToSocketAddrs, deadline: Instant) -> Result<Session, ExchangeError> {
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
            let Some(left) = remaining(deadline) else {
                break;
            };
            match TcpStream::connect_timeout(addr, left) {
                Ok(stream) => return Session::configure(stream, *addr),
                Err(e) if is_timeout(&e) || e.kind() == io::ErrorKind::Interrupted => {
                    worth_retrying = true;
                    last = None;
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionRefused
                            | io::ErrorKind::ConnectionReset
                            | io::ErrorKind::ConnectionAborted
                    ) =>
                {
                    worth_retrying = true;
                    last = Some(e);
                }
                Err(e) => fatal = Some(e),
            }
        }
        if let (false, Some(e)) = (worth_retrying, fatal) {
            return Err(io_err("connect", e));
        }
        let Some(left) = remaining(deadline) else {
            return Err(match last {
                Some(e) => io_err("connect", e),
                None => ExchangeError::TimedOut { during: "connect" },
            });
        };
        thread::sleep(pause.min(left));
        pause = (pause * 2).min(CONNECT_RETRY_MAX);
    }
}

/// One connected peer: the stream on which endpoints are exchanged.
#[derive(Debug)]
pub struct Session {
    stream: TcpStream,
    peer: SocketAddr,
}

impl Session {
    /// Wraps a stream the caller connected by other means (a proxy, an
    /// existing control connection).
    pub fn from_stream(stream: TcpStream) -> io::Result<Session> {
        let peer = stream.peer_addr()?;
        Session::configure(stream, peer).map_err(io::Error::from)
    }

    fn configure(stream: TcpStream, peer: SocketAddr) -> Result<Session, ExchangeError> {
        // Accepted sockets may inherit O_NONBLOCK on some platforms; our
        // reads rely on blocking + SO_RCVTIMEO.
        stream
            .set_nonblocking(false)
            .map_err(|e| io_err("configure", e))?;
        // Small request/response messages: do not let Nagle delay them.
        stream
            .set_nodelay(true)
            .map_err(|e| io_err("configure", e))?;
        Ok(Session { stream, peer })
    }

    /// The peer's address, for logs and for a server deciding whom to trust.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// The underlying stream, for callers that keep the connection as a
    /// control channel after the exchange.
    pub fn into_stream(self) -> TcpStream {
        self.stream
    }

    /// Sends `local` and returns the peer's endpoint, both in
    /// [`crate::wire`]'s format, by `deadline`.
    ///
    /// Both sides write first, then read. That cannot deadlock: a message
    /// is at most [`MAX_MESSAGE_LEN`] (1320) bytes, below the smallest
    /// send buffer a TCP socket can have (a few KiB; the default is far
    /// larger), so each write completes into the kernel without the peer
    /// reading. The
    /// header is checked before the body is read, so a bad or oversized
    /// claim fails at once instead of waiting for bytes that never come.
    pub fn exchange(
        &mut self,
        local: &Endpoint,
        deadline: Instant,
    ) -> Result<Endpoint, ExchangeError> {
        let mut out = [0u8; MAX_MESSAGE_LEN];
        let len = wire::encode_into(local, &mut out).map_err(ExchangeError::Encode)?;
        self.write_all_by(&out[..len], deadline, "write")?;

        let mut msg = [0u8; MAX_MESSAGE_LEN];
        let (header, rest) = msg.split_at_mut(HEADER_LEN);
        self.read_exact_by(header, deadline, "read header")?;
        let body_len = wire::parse_header(header).map_err(ExchangeError::Decode)?;
        // parse_header bounds body_len by MAX_BODY_LEN == rest.len().
        let body = rest
            .get_mut(..body_len)
            .ok_or(ExchangeError::Decode(WireError::Oversized {
                claimed: body_len,
                max: wire::MAX_BODY_LEN,
            }))?;
        self.read_exact_by(body, deadline, "read body")?;
        wire::decode(&msg[..HEADER_LEN + body_len]).map_err(ExchangeError::Decode)
    }

    /// Exchanges the primer's raw `conn_info` in the primer's order, to
    /// interoperate with its C programs: with `as_server` true, write
    /// first and then read (`tcp_server_exchange`); with `as_server`
    /// false, read first and then write (`tcp_client_exchange`). The
    /// result is unchecked; [`ConnInfo::to_endpoint`] validates it.
    pub fn exchange_tutorial(
        &mut self,
        local: &ConnInfo,
        as_server: bool,
        deadline: Instant,
    ) -> Result<ConnInfo, ExchangeError> {
        let out = local.to_bytes();
        let mut theirs = [0u8; CONN_INFO_LEN];
        if as_server {
            self.write_all_by(&out, deadline, "write conn_info")?;
            self.read_exact_by(&mut theirs, deadline, "read conn_info")?;
        } else {
            self.read_exact_by(&mut theirs, deadline, "read conn_info")?;
            self.write_all_by(&out, deadline, "write conn_info")?;
        }
        Ok(tutorial::ConnInfo::from_bytes(&theirs))
    }

    /// A barrier: sends [`SYNC_BYTE`] and waits for the peer's, so each
    /// side knows the other reached the same point (e.g. "my RDMA writes
    /// are done, you may read the buffer"). Any other byte is a
    /// [`WireError::Inconsistent`] decode error.
    pub fn sync(&mut self, deadline: Instant) -> Result<(), ExchangeError> {
        self.write_all_by(&[SYNC_BYTE], deadline, "sync write")?;
        let mut byte = [0u8; 1];
        self.read_exact_by(&mut byte, deadline, "sync read")?;
        if byte[0] != SYNC_BYTE {
            return Err(ExchangeError::Decode(WireError::Inconsistent(
                "sync byte was not 0x53 ('S')",
            )));
        }
        Ok(())
    }

    /// `read_exact` bounded by `deadline`: the socket timeout is reset to
    /// the time remaining before every `read`, so the total wait never
    /// exceeds the deadline however the peer paces its bytes.
    fn read_exact_by(
        &mut self,
        buf: &mut [u8],
        deadline: Instant,
        during: &'static str,
    ) -> Result<(), ExchangeError> {
        let mut got = 0;
        while got < buf.len() {
            let Some(left) = remaining(deadline) else {
                return Err(ExchangeError::TimedOut { during });
            };
            self.stream
                .set_read_timeout(Some(left))
                .map_err(|e| io_err("configure", e))?;
            match self.stream.read(&mut buf[got..]) {
                Ok(0) => {
                    return Err(ExchangeError::PeerClosed {
                        during,
                        got,
                        needed: buf.len(),
                    })
                }
                Ok(n) => got += n,
                Err(e) if is_timeout(&e) || e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err(during, e)),
            }
        }
        Ok(())
    }

    /// `write_all` bounded by `deadline`, like [`Session::read_exact_by`].
    fn write_all_by(
        &mut self,
        buf: &[u8],
        deadline: Instant,
        during: &'static str,
    ) -> Result<(), ExchangeError> {
        let mut sent = 0;
        while sent < buf.len() {
            let Some(left) = remaining(deadline) else {
                return Err(ExchangeError::TimedOut { during });
            };
            self.stream
                .set_write_timeout(Some(left))
                .map_err(|e| io_err("configure", e))?;
            match self.stream.write(&buf[sent..]) {
                Ok(0) => return Err(io_err(during, io::ErrorKind::WriteZero.into())),
                Ok(n) => sent += n,
                Err(e) if is_timeout(&e) || e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err(during, e)),
            }
        }
        Ok(())
    }
}
