//! One connection to a peer, every read and write bounded by a deadline.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use super::error::{io_err, is_timeout, ExchangeError};
use super::timeouts::Timeouts;
use crate::endpoint::Endpoint;
use crate::time::Deadline;
use crate::wire::tutorial::{ConnInfo, CONN_INFO_LEN};
use crate::wire::{self, Kind, Message, Token, WireError, HEADER_LEN, MAX_MESSAGE_LEN};

/// The byte [`Session::sync`] sends and expects (`'S'`).
pub const SYNC_BYTE: u8 = b'S';

/// Which side of the primer's exchange we play: it fixes who writes first.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum TutorialSide {
    /// Write our `conn_info`, then read the peer's (`tcp_server_exchange`).
    Server,
    /// Read the peer's `conn_info`, then write ours (`tcp_client_exchange`).
    Client,
}

/// One connected peer: the stream on which endpoints are exchanged, kept
/// afterwards as a control channel ([`Session::sync`]).
///
/// `S` is a `TcpStream` unless the caller layered something (TLS) under
/// the session with [`Session::new`]; it must implement
/// [`super::Timeouts`] so that deadlines bound every call. After any
/// error the session is in an unknown position in the byte stream: drop
/// it.
#[derive(Debug)]
pub struct Session<S = TcpStream> {
    stream: S,
    peer: Option<SocketAddr>,
}

impl<S> Session<S> {
    /// A session over a stream the caller connected and set up (a TLS
    /// stream, a proxy). Its address is unknown to the session.
    pub fn new(stream: S) -> Session<S> {
        Session { stream, peer: None }
    }

    /// The peer's address when the session knows it (TCP sessions made
    /// by this module), for logs and for deciding whom to trust.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// The underlying stream.
    pub fn stream(&self) -> &S {
        &self.stream
    }

    /// The underlying stream, e.g. to send the caller's own frames
    /// between two exchange calls.
    pub fn stream_mut(&mut self) -> &mut S {
        &mut self.stream
    }

    /// The underlying stream, for callers that keep the connection after
    /// the exchange. Its timeouts are whatever the last call left.
    pub fn into_stream(self) -> S {
        self.stream
    }
}

impl Session<TcpStream> {
    /// Wraps a TCP stream the caller connected by other means, set up as
    /// this module sets up its own (blocking, `TCP_NODELAY`).
    pub fn from_stream(stream: TcpStream) -> io::Result<Session> {
        let peer = stream.peer_addr()?;
        Session::configure(stream, peer).map_err(io::Error::from)
    }

    pub(super) fn configure(stream: TcpStream, peer: SocketAddr) -> Result<Session, ExchangeError> {
        // Accepted sockets may inherit O_NONBLOCK on some platforms; our
        // reads rely on blocking + SO_RCVTIMEO.
        stream
            .set_nonblocking(false)
            .map_err(|e| io_err("configure", e))?;
        // Small request/response messages: do not let Nagle delay them.
        stream
            .set_nodelay(true)
            .map_err(|e| io_err("configure", e))?;
        Ok(Session {
            stream,
            peer: Some(peer),
        })
    }
}

impl<S: Read + Write + Timeouts> Session<S> {
    /// The client's side: sends our hello (`ours`, and `token` if the
    /// server wants one), then reads and returns the server's endpoint,
    /// all by `deadline`.
    ///
    /// The client speaks first and so shows its own endpoint to whatever
    /// answers at the address: share regions in it only with a server you
    /// reach over a path you trust. A server that refuses the hello
    /// closes without a word, which is [`ExchangeError::NoReply`].
    pub fn client_exchange(
        &mut self,
        ours: &Endpoint,
        token: Option<&Token>,
        deadline: Deadline,
    ) -> Result<Endpoint, ExchangeError> {
        self.send_hello(ours, token, deadline)?;
        self.read_reply(deadline)
    }

    /// The first half of [`Session::client_exchange`]: sends our hello by
    /// `deadline`. What the caller writes next rides with the hello: the
    /// server reads it before it replies ([`super::Handshake::session_mut`]),
    /// e.g. the size of what the client asks it to allocate.
    pub fn send_hello(
        &mut self,
        ours: &Endpoint,
        token: Option<&Token>,
        deadline: Deadline,
    ) -> Result<(), ExchangeError> {
        let hello = Message::hello(ours.clone(), token.copied());
        self.write_message(&hello, deadline, "write hello")
    }

    /// The second half of [`Session::client_exchange`]: reads the
    /// server's reply by `deadline` and returns its endpoint.
    /// [`ExchangeError::NoReply`] when the server refused us.
    pub fn read_reply(&mut self, deadline: Deadline) -> Result<Endpoint, ExchangeError> {
        // A refusing server closes; if our hello was not read to the end
        // the close arrives as a reset.
        match self.read_message(Kind::Reply, deadline) {
            Ok(reply) => Ok(reply.endpoint),
            Err(ExchangeError::PeerClosed {
                during: "read reply header",
                got: 0,
                ..
            }) => Err(ExchangeError::NoReply),
            Err(ExchangeError::Io {
                during: "read reply header",
                source,
            }) if source.kind() == io::ErrorKind::ConnectionReset => Err(ExchangeError::NoReply),
            Err(e) => Err(e),
        }
    }

    /// Exchanges the primer's raw `conn_info` in the primer's order, to
    /// interoperate with its C programs: as [`TutorialSide::Server`]
    /// write first and then read, as [`TutorialSide::Client`] read first
    /// and then write. The result is unchecked;
    /// [`ConnInfo::to_endpoint`] validates it.
    ///
    /// Unauthenticated: the server side reveals its `conn_info` (buffer
    /// address and `rkey`) to whoever connected. See [`crate::wire::tutorial`].
    pub fn exchange_tutorial(
        &mut self,
        ours: &ConnInfo,
        side: TutorialSide,
        deadline: Deadline,
    ) -> Result<ConnInfo, ExchangeError> {
        let out = ours.to_bytes();
        let mut theirs = [0u8; CONN_INFO_LEN];
        let accept_all = |_: &[u8]| Ok(());
        if side == TutorialSide::Server {
            self.write_all_by(&out, deadline, "write conn_info")?;
        }
        self.read_exact_by(&mut theirs, deadline, "read conn_info", accept_all)?;
        if side == TutorialSide::Client {
            self.write_all_by(&out, deadline, "write conn_info")?;
        }
        Ok(ConnInfo::from_bytes(&theirs))
    }

    /// A barrier: sends [`SYNC_BYTE`] and waits for the peer's, so each
    /// side knows the other reached the same point (e.g. "my RDMA writes
    /// are done, you may read the buffer"). Any other byte is a
    /// [`WireError::Inconsistent`] decode error.
    pub fn sync(&mut self, deadline: Deadline) -> Result<(), ExchangeError> {
        self.write_all_by(&[SYNC_BYTE], deadline, "sync write")?;
        let mut byte = [0u8; 1];
        self.read_exact_by(&mut byte, deadline, "sync read", |_| Ok(()))?;
        if byte[0] != SYNC_BYTE {
            return Err(ExchangeError::Decode(WireError::Inconsistent(
                "sync byte was not 0x53 ('S')",
            )));
        }
        Ok(())
    }

    /// Encodes and sends `msg` by `deadline`.
    pub(super) fn write_message(
        &mut self,
        msg: &Message,
        deadline: Deadline,
        during: &'static str,
    ) -> Result<(), ExchangeError> {
        let mut out = [0u8; MAX_MESSAGE_LEN];
        let len = wire::encode_into(msg, &mut out).map_err(ExchangeError::Encode)?;
        self.write_all_by(&out[..len], deadline, during)
    }

    /// Reads one message of kind `expect` by `deadline`. The header is
    /// judged as it arrives and before the body is read, so garbage or an
    /// oversized claim fails at once instead of waiting for bytes that
    /// never come; nothing is allocated until the whole message is in.
    pub(super) fn read_message(
        &mut self,
        expect: Kind,
        deadline: Deadline,
    ) -> Result<Message, ExchangeError> {
        let (during_header, during_body) = match expect {
            Kind::Hello => ("read hello header", "read hello body"),
            Kind::Reply => ("read reply header", "read reply body"),
        };
        let mut msg = [0u8; MAX_MESSAGE_LEN];
        let (header, rest) = msg.split_at_mut(HEADER_LEN);
        self.read_exact_by(header, deadline, during_header, wire::check_prefix)?;
        let header = wire::parse_header(header).map_err(ExchangeError::Decode)?;
        if header.kind != expect {
            return Err(ExchangeError::Decode(WireError::Inconsistent(
                match expect {
                    Kind::Hello => "a reply where a hello was due (the peer acts as a server)",
                    Kind::Reply => "a hello where a reply was due (the peer acts as a client)",
                },
            )));
        }
        // parse_header bounds body_len by MAX_BODY_LEN == rest.len().
        let body = rest
            .get_mut(..header.body_len)
            .ok_or(ExchangeError::Decode(WireError::Oversized {
                claimed: header.body_len,
                max: wire::MAX_BODY_LEN,
            }))?;
        self.read_exact_by(body, deadline, during_body, |_| Ok(()))?;
        wire::decode(&msg[..HEADER_LEN + header.body_len]).map_err(ExchangeError::Decode)
    }

    /// `read_exact` bounded by `deadline`: the stream's timeout is reset
    /// to the time remaining before every `read`, so the total wait never
    /// exceeds the deadline however the peer paces its bytes. `check`
    /// judges the bytes received so far after every read.
    fn read_exact_by(
        &mut self,
        buf: &mut [u8],
        deadline: Deadline,
        during: &'static str,
        check: impl Fn(&[u8]) -> Result<(), WireError>,
    ) -> Result<(), ExchangeError> {
        let mut got = 0;
        while got < buf.len() {
            let left = time_left(deadline, during)?;
            self.stream
                .limit_reads(left)
                .map_err(|e| io_err("configure", e))?;
            match self.stream.read(&mut buf[got..]) {
                Ok(0) => {
                    return Err(ExchangeError::PeerClosed {
                        during,
                        got,
                        needed: buf.len(),
                    })
                }
                Ok(n) => {
                    got += n;
                    check(&buf[..got]).map_err(ExchangeError::Decode)?;
                }
                Err(e) if is_timeout(&e) || e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err(during, e)),
            }
        }
        Ok(())
    }

    /// `write_all` and `flush` bounded by `deadline`, like
    /// [`Session::read_exact_by`].
    fn write_all_by(
        &mut self,
        buf: &[u8],
        deadline: Deadline,
        during: &'static str,
    ) -> Result<(), ExchangeError> {
        let mut sent = 0;
        loop {
            let left = time_left(deadline, during)?;
            self.stream
                .limit_writes(left)
                .map_err(|e| io_err("configure", e))?;
            // A layered stream (TLS) may buffer: the message is only
            // sent once flushed.
            let step = match buf.get(sent..) {
                Some([]) | None => self.stream.flush().map(|()| None),
                Some(rest) => self.stream.write(rest).map(Some),
            };
            match step {
                Ok(None) => return Ok(()),
                Ok(Some(0)) => return Err(io_err(during, io::ErrorKind::WriteZero.into())),
                Ok(Some(n)) => sent += n,
                Err(e) if is_timeout(&e) || e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err(during, e)),
            }
        }
    }
}

/// The bound for the next call: the time left until `deadline`, `None`
/// for [`Deadline::NEVER`], or [`ExchangeError::TimedOut`] once it has
/// passed (sockets refuse a zero timeout).
pub(super) fn time_left(
    deadline: Deadline,
    during: &'static str,
) -> Result<Option<Duration>, ExchangeError> {
    if deadline == Deadline::NEVER {
        return Ok(None);
    }
    let left = deadline.remaining();
    if left.is_zero() {
        return Err(ExchangeError::TimedOut { during });
    }
    Ok(Some(left))
}
