//! What a server demands of its clients and how much each may hold.

use core::time::Duration;

use crate::sys::ibv_link_layer as LinkLayer;
use crate::wire::Token;

/// What a [`super::Server`] demands of clients and how much each may hold.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// When set, a client's hello must carry this token; a client without
    /// it is sent nothing and reported as [`super::ExchangeError::BadToken`].
    pub token: Option<Token>,
    /// The link layer of the port clients will be connected on
    /// (`ctx.query_port(port)?.link_layer()`): a hello whose endpoint that
    /// port cannot address (RoCE: a zero GID; InfiniBand: no unicast LID)
    /// is sent nothing and reported as
    /// [`super::ExchangeError::Unaddressable`]. `None` refuses only what
    /// no port can address ([`crate::endpoint::Endpoint::check_addressable`]).
    pub link_layer: Option<LinkLayer>,
    /// Time from connect until the whole hello must be in (the stage a
    /// silent or trickling client stretches).
    pub hello_timeout: Duration,
    /// Time from connect until our reply must be written: the most one
    /// client may take of the server, including the wait for
    /// [`super::Server::next_client`] to hand it out.
    pub client_timeout: Duration,
    /// Most hellos read at once (one thread each), and most valid hellos
    /// kept waiting for [`super::Server::next_client`]; beyond either, the oldest
    /// is dropped.
    pub max_pending: usize,
}

impl Default for ServerConfig {
    /// No token, no port known, 2 s for the hello, 10 s per client, 64
    /// pending.
    fn default() -> Self {
        ServerConfig {
            token: None,
            link_layer: None,
            hello_timeout: Duration::from_secs(2),
            client_timeout: Duration::from_secs(10),
            max_pending: 64,
        }
    }
}
