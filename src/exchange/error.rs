//! Why an exchange step failed, worded for a one-line log.

use std::fmt;
use std::io;

use crate::endpoint::EndpointError;
use crate::wire::WireError;

/// Why an exchange step failed.
///
/// On a server every variant but [`ExchangeError::Io`] during `accept`
/// describes one client's fault: [`super::Server`] reports those through
/// its callback, drops the client and carries on.
#[derive(Debug)]
#[non_exhaustive]
pub enum ExchangeError {
    /// A socket call failed. `during` names the step (`"resolve"`,
    /// `"connect"`, `"accept"`, `"configure"`, `"read hello header"`,
    /// `"write reply"`, …); `source` keeps the [`io::ErrorKind`] and the
    /// raw OS error.
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
    /// The server closed the connection without replying to our hello:
    /// it refused the hello (most often: our token is missing or wrong)
    /// or it is not an exchange server.
    NoReply,
    /// Our own message could not be encoded (our endpoint fails
    /// validation, e.g. QPN 0).
    Encode(WireError),
    /// The peer's message was malformed: bad magic, wrong version,
    /// oversized, QPN 0 or 1, a region that wraps around, …
    Decode(WireError),
    /// The client's hello lacks the token this server requires
    /// (`presented: false`) or carries another one (`presented: true`).
    BadToken {
        /// Whether the hello carried a token at all.
        presented: bool,
    },
    /// The client's endpoint cannot be addressed from the server's port
    /// ([`crate::endpoint::Endpoint::check_addressable`]): a zero GID on
    /// RoCE, no unicast LID on InfiniBand, neither anywhere.
    Unaddressable(EndpointError),
    /// The client was dropped unserved to make room: `max_pending`
    /// handshakes were in progress and it was the oldest.
    Evicted {
        /// The server's [`super::ServerConfig::max_pending`].
        max_pending: usize,
    },
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
            ExchangeError::Io { during, source } => {
                write!(f, "endpoint exchange: {during} failed: {source}")
            }
            ExchangeError::TimedOut { during } => {
                write!(f, "endpoint exchange: deadline passed during {during}")
            }
            // A connect-and-close is what port scanners and TCP health
            // checks do: say so rather than "0 of 14 bytes".
            ExchangeError::PeerClosed { during, got: 0, .. } => write!(
                f,
                "endpoint exchange: peer closed the connection without sending anything ({during})"
            ),
            ExchangeError::PeerClosed { during, got, needed } => write!(
                f,
                "endpoint exchange: peer closed the connection during {during} after {got} of {needed} bytes"
            ),
            ExchangeError::NoReply => write!(
                f,
                "endpoint exchange: the server closed the connection without replying; \
                 it refused our hello (is the token right?) or is not an exchange server"
            ),
            ExchangeError::Encode(e) => {
                write!(f, "endpoint exchange: cannot encode our endpoint: {e}")
            }
            ExchangeError::Decode(e) => write!(f, "endpoint exchange: peer sent a bad message: {e}"),
            ExchangeError::BadToken { presented: false } => write!(
                f,
                "endpoint exchange: client presented no token, this server requires one"
            ),
            ExchangeError::BadToken { presented: true } => {
                write!(f, "endpoint exchange: client's token is wrong")
            }
            ExchangeError::Unaddressable(e) => write!(
                f,
                "endpoint exchange: no queue pair on this port can reach the client's endpoint: {e}"
            ),
            ExchangeError::Evicted { max_pending } => write!(
                f,
                "endpoint exchange: client dropped unserved: {max_pending} handshakes were in \
                 progress and it was the oldest"
            ),
        }
    }
}

impl std::error::Error for ExchangeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ExchangeError::Io { source, .. } => Some(source),
            ExchangeError::Encode(e) | ExchangeError::Decode(e) => Some(e),
            ExchangeError::Unaddressable(e) => Some(e),
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
            ExchangeError::NoReply => io::ErrorKind::ConnectionAborted,
            ExchangeError::Encode(_) => io::ErrorKind::InvalidInput,
            ExchangeError::Decode(_) => io::ErrorKind::InvalidData,
            ExchangeError::BadToken { .. } => io::ErrorKind::PermissionDenied,
            ExchangeError::Unaddressable(_) => io::ErrorKind::InvalidData,
            ExchangeError::Evicted { .. } => io::ErrorKind::ConnectionAborted,
        };
        match e {
            ExchangeError::Io { source, .. } if source.raw_os_error().is_some() => source,
            other => io::Error::new(kind, other),
        }
    }
}

/// An [`ExchangeError::Io`] for `during`.
pub(super) fn io_err(during: &'static str, source: io::Error) -> ExchangeError {
    ExchangeError::Io { during, source }
}

/// Socket timeouts report as `WouldBlock` (EAGAIN) on Unix and
/// `TimedOut` on Windows.
pub(super) fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}
