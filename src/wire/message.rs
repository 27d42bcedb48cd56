//! A message: an endpoint, which way it travels, and the hello's token.

use crate::endpoint::Endpoint;

use super::error::WireError;
use super::token::Token;
use crate::endpoint::is_peer_qpn;

/// Which way a message travels.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    /// Client to server, first: the client's endpoint and maybe a token.
    Hello = 1,
    /// Server to client, only after a valid hello: the server's endpoint.
    Reply = 2,
}

impl Kind {
    /// The kind byte on the wire.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The kind a wire byte names, if any.
    pub const fn from_code(code: u8) -> Option<Kind> {
        match code {
            1 => Some(Kind::Hello),
            2 => Some(Kind::Reply),
            _ => None,
        }
    }
}

/// One message: an endpoint, which way it travels, and (hello only) the
/// token the client presents.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Message {
    /// Hello or reply.
    pub kind: Kind,
    /// The token a hello presents; always `None` in a reply.
    pub token: Option<Token>,
    /// The sender's endpoint.
    pub endpoint: Endpoint,
}

impl Message {
    /// A client's hello.
    pub fn hello(endpoint: Endpoint, token: Option<Token>) -> Message {
        Message {
            kind: Kind::Hello,
            token,
            endpoint,
        }
    }

    /// A server's reply.
    pub fn reply(endpoint: Endpoint) -> Message {
        Message {
            kind: Kind::Reply,
            token: None,
            endpoint,
        }
    }

    /// What both [`super::encode`] and [`super::decode`] require: the endpoint passes
    /// [`Endpoint::validate`] (24-bit QPN and PSN, known MTU, at most
    /// [`crate::endpoint::MAX_REGIONS`] regions none of which wraps around), its QPN is
    /// one a peer can have ([`super::MIN_PEER_QPN`]`..=`[`super::MAX_PEER_QPN`]), and a
    /// reply carries no token.
    pub fn validate(&self) -> Result<(), WireError> {
        self.endpoint.validate()?;
        if !is_peer_qpn(self.endpoint.qpn) {
            return Err(WireError::ReservedQpn(self.endpoint.qpn));
        }
        if self.kind == Kind::Reply && self.token.is_some() {
            return Err(WireError::Inconsistent("a reply carries no token"));
        }
        Ok(())
    }
}
