//! The server's side of one exchange: read and judge the client's hello,
//! and only then reveal our endpoint.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use super::error::ExchangeError;
use super::session::Session;
use super::timeouts::Timeouts;
use crate::endpoint::Endpoint;
use crate::sys::ibv_link_layer as LinkLayer;
use crate::time::Deadline;
use crate::wire::{Kind, Message, Token};

/// A client whose hello was read and found valid: well formed, with the
/// token the server requires, naming a usable endpoint. Nothing of ours
/// has been sent yet.
///
/// Look at [`Handshake::peer_endpoint`] (connect the queue pair to it, so
/// it is ready before the client learns ours), then [`Handshake::reply`].
/// Dropping a handshake closes the connection without a word.
#[derive(Debug)]
pub struct Handshake<S = TcpStream> {
    session: Session<S>,
    peer: Endpoint,
    expires: Deadline,
}

impl<S: Read + Write + Timeouts> Session<S> {
    /// The server's side over a connection the caller accepted (TLS, or a
    /// [`super::Listener`]): reads the client's hello by `deadline` and
    /// checks it, including `token` when given. [`Handshake::reply`] is
    /// then bounded by the same `deadline`: one budget for the client.
    ///
    /// On any error the session is dropped, which closes the connection:
    /// a refused client receives nothing. Without a token, the hello of
    /// any client is accepted, token or not. An endpoint no port can
    /// address is refused; what only some ports can address is for
    /// [`Endpoint::check_addressable`] with the port's link layer, or for
    /// connecting the queue pair, before [`Handshake::reply`].
    /// [`super::Server`] runs this for many clients at once.
    pub fn read_hello(
        mut self,
        token: Option<&Token>,
        deadline: Deadline,
    ) -> Result<Handshake<S>, ExchangeError> {
        let peer = self.read_valid_hello(token, None, deadline)?;
        Ok(Handshake::new(self, peer, deadline))
    }

    /// [`Session::read_hello`] and [`Handshake::reply`] in one call, on a
    /// session kept open (a control channel that already carried other
    /// messages, or several endpoints in a row): reads and checks the
    /// client's hello as [`Session::read_hello`] does, and only then
    /// sends `ours`. Returns the client's endpoint. After an error, drop
    /// the session: the client was told nothing.
    pub fn server_exchange(
        &mut self,
        ours: &Endpoint,
        token: Option<&Token>,
        deadline: Deadline,
    ) -> Result<Endpoint, ExchangeError> {
        let peer = self.read_valid_hello(token, None, deadline)?;
        self.write_message(&Message::reply(ours.clone()), deadline, "write reply")?;
        Ok(peer)
    }

    /// Reads a hello by `deadline` and returns its endpoint if it
    /// presents `token` (when one is required) and a port of `link_layer`
    /// can address it.
    pub(super) fn read_valid_hello(
        &mut self,
        token: Option<&Token>,
        link_layer: Option<LinkLayer>,
        deadline: Deadline,
    ) -> Result<Endpoint, ExchangeError> {
        let hello = self.read_message(Kind::Hello, deadline)?;
        check_token(token, hello.token.as_ref())?;
        hello
            .endpoint
            .check_addressable(link_layer)
            .map_err(ExchangeError::Unaddressable)?;
        Ok(hello.endpoint)
    }
}

impl<S> Handshake<S> {
    /// A client whose hello, `peer`, was read on `session` and found
    /// valid; the reply is due by `expires`.
    pub(super) fn new(session: Session<S>, peer: Endpoint, expires: Deadline) -> Self {
        Handshake {
            session,
            peer,
            expires,
        }
    }

    /// The client's endpoint, validated: a QPN a peer can have (not 0, 1
    /// or `0xFFFFFF`), 24-bit PSN, known MTU, at most 64 regions none of
    /// which wraps around, addressable from the server's port
    /// ([`super::ServerConfig::link_layer`]).
    pub fn peer_endpoint(&self) -> &Endpoint {
        &self.peer
    }

    /// The client's address, when known (TCP).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.session.peer_addr()
    }

    /// When the client's time is up: [`Handshake::reply`] fails after it.
    pub fn expires(&self) -> Deadline {
        self.expires
    }

    /// The session, to read what the client sent after its hello (a
    /// request riding with it, [`Session::send_hello`]) and decide on it
    /// before revealing anything or allocating for the client. Bound the
    /// reads by [`Handshake::expires`].
    pub fn session_mut(&mut self) -> &mut Session<S> {
        &mut self.session
    }
}

impl<S: Read + Write + Timeouts> Handshake<S> {
    /// Reveals `ours` to the client, by [`Handshake::expires`], and
    /// returns the session for use as a control channel.
    pub fn reply(self, ours: &Endpoint) -> Result<Session<S>, ExchangeError> {
        let mut session = self.session;
        session.write_message(&Message::reply(ours.clone()), self.expires, "write reply")?;
        Ok(session)
    }
}

/// Whether a hello presenting `presented` may be answered by a server
/// that requires `required`, comparing tokens in constant time.
fn check_token(required: Option<&Token>, presented: Option<&Token>) -> Result<(), ExchangeError> {
    match (required, presented) {
        (None, _) => Ok(()),
        (Some(_), None) => Err(ExchangeError::BadToken { presented: false }),
        (Some(required), Some(presented)) if required.ct_eq(presented) => Ok(()),
        (Some(_), Some(_)) => Err(ExchangeError::BadToken { presented: true }),
    }
}
