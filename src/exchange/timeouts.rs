//! How a deadline reaches a blocking read or write on any stream.
//!
//! A [`super::Session`] promises that no call outlives its deadline. Safe
//! std code cannot interrupt a blocked `read` from outside, so the only
//! tool is the stream's own timeout: before every read or write the
//! session hands the stream the time remaining, through [`Timeouts`].
//! `TcpStream` implements it with `SO_RCVTIMEO`/`SO_SNDTIMEO`. A stream
//! layered on a socket (TLS, say) implements it by forwarding to that
//! socket, which bounds the layer's own reads too. A stream with no
//! timeouts at all is wrapped in [`Untimed`], which says in the type that
//! the caller, not the session, keeps it from blocking forever.
//!
//! A trait rather than a `Read + Write` bound alone, so that forgetting
//! the timeouts is a compile error, not a server that a silent peer can
//! hold forever.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A stream whose blocking reads and writes can be bounded in time.
///
/// The session calls these before every read or write with the time left
/// until its deadline (never zero: it gives up itself once the deadline
/// has passed), or `None` for [`crate::time::Deadline::NEVER`]. A call
/// that hits the bound must fail with `WouldBlock` or `TimedOut`, as
/// socket timeouts do; the session then checks its deadline.
///
/// For a TLS stream over a `TcpStream`, forward to the socket:
///
/// ```
/// use std::io;
/// use std::net::TcpStream;
/// use std::time::Duration;
/// use verbs::exchange::Timeouts;
///
/// /// Some TLS library's stream, owning the socket it runs over.
/// struct Tls {
///     sock: TcpStream,
///     // ... the library's session state
/// }
///
/// impl Timeouts for Tls {
///     fn limit_reads(&mut self, limit: Option<Duration>) -> io::Result<()> {
///         self.sock.set_read_timeout(limit)
///     }
///     fn limit_writes(&mut self, limit: Option<Duration>) -> io::Result<()> {
///         self.sock.set_write_timeout(limit)
///     }
/// }
/// ```
pub trait Timeouts {
    /// Bounds each following read to `limit` (`None`: unbounded).
    fn limit_reads(&mut self, limit: Option<Duration>) -> io::Result<()>;

    /// Bounds each following write to `limit` (`None`: unbounded).
    fn limit_writes(&mut self, limit: Option<Duration>) -> io::Result<()>;
}

impl Timeouts for TcpStream {
    fn limit_reads(&mut self, limit: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(limit)
    }

    fn limit_writes(&mut self, limit: Option<Duration>) -> io::Result<()> {
        self.set_write_timeout(limit)
    }
}

impl<T: Timeouts + ?Sized> Timeouts for &mut T {
    fn limit_reads(&mut self, limit: Option<Duration>) -> io::Result<()> {
        (**self).limit_reads(limit)
    }

    fn limit_writes(&mut self, limit: Option<Duration>) -> io::Result<()> {
        (**self).limit_writes(limit)
    }
}

/// A stream the session cannot bound: [`Timeouts`] does nothing.
///
/// Deadlines are then only checked between reads and writes, so a peer
/// that sends nothing blocks a read for as long as the stream lets it:
/// the stream must enforce its own timeouts (a socket timeout set once,
/// a transport with keepalives, an in-memory pipe in a test).
#[derive(Debug)]
pub struct Untimed<S>(pub S);

impl<S> Timeouts for Untimed<S> {
    fn limit_reads(&mut self, _: Option<Duration>) -> io::Result<()> {
        Ok(())
    }

    fn limit_writes(&mut self, _: Option<Duration>) -> io::Result<()> {
        Ok(())
    }
}

impl<S: Read> Read for Untimed<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }

    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        self.0.read_vectored(bufs)
    }
}

impl<S: Write> Write for Untimed<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.0.write_vectored(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}
