//! Out-of-band endpoint exchange over TCP (or any stream), bounded by
//! deadlines.
//!
//! RC queue pairs cannot be connected until each side knows the other's
//! [`Endpoint`](crate::endpoint::Endpoint); this module moves those over
//! an ordinary connection, in [`crate::wire`]'s format or (for the
//! primer's C programs) in [`crate::wire::tutorial`]'s raw `conn_info`.
//!
//! # Who speaks first
//!
//! In this crate's format the client speaks first: its hello carries its
//! endpoint and, if the server wants one, a [`Token`]. The server reads
//! and validates the whole hello before revealing anything (the format,
//! the token, a QPN a peer can have, an endpoint its port can reach:
//! [`ServerConfig::link_layer`]), and a client it refuses is sent
//! nothing, so a scanner, a client without the token or one presenting
//! what no peer can never learns a region's `rkey`. What a client sends
//! right behind its hello ([`Session::send_hello`]) can be judged too,
//! before the reply ([`Handshake::session_mut`]).
//!
//! - Client: [`connect_and_exchange`], or [`connect`] /
//!   [`Session::new`] then [`Session::client_exchange`].
//! - Server: [`Server::next_client`] reads many hellos at once, each
//!   bounded in time, reports and drops bad clients, and returns a
//!   [`Handshake`]; [`Handshake::reply`] reveals our endpoint. Over a
//!   stream accepted by other means (TLS): [`Session::read_hello`], or
//!   [`Session::server_exchange`] on a session already in use.
//! - The primer's format, where the server writes first and anyone who
//!   connects learns its `rkey`: [`Listener`] and
//!   [`Session::exchange_tutorial`].
//!
//! After the exchange both sides may keep the [`Session`] as a control
//! channel ([`Session::sync`]).
//!
//! # Deadlines
//!
//! Every blocking call takes an absolute [`Deadline`](crate::time::Deadline)
//! rather than a timeout, so a caller's whole connection setup shares one
//! budget, and a peer that trickles one byte at a time cannot stretch
//! it: each read or write is given only the time *remaining*, through
//! the stream's own timeouts ([`Timeouts`]). There is no `unsafe` and no
//! `poll(2)`: [`Listener`] polls a non-blocking socket with short sleeps,
//! and [`Server`] blocks in `accept` on a thread of its own and reads
//! each hello on a short-lived thread.
//!
//! After any error a [`Session`] is in an unknown position in the byte
//! stream: drop it. A [`Listener`] or [`Server`] is never affected by one
//! connection's failure.
#![forbid(unsafe_code)]

mod acceptor;
mod connect;
mod error;
mod handshake;
mod server;
mod server_config;
mod session;
mod timeouts;

pub use crate::wire::Token;
pub use connect::{connect, connect_and_exchange, Listener};
pub use error::ExchangeError;
pub use handshake::Handshake;
pub use server::Server;
pub use server_config::ServerConfig;
pub use session::{Session, TutorialSide, SYNC_BYTE};
pub use timeouts::{Timeouts, Untimed};
