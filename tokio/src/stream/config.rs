//! How a stream is sized and how long it waits.

use std::time::Duration;

use verbs::exchange::Token;
use verbs::ConnectOptions;

/// The sizes and timings of an [`super::RdmaStream`]; both ends should
/// agree on `slot_size` (a message larger than the peer's receive slot
/// fails the connection).
#[derive(Clone, Debug)]
pub struct StreamConfig {
    /// Bytes per message: a write is cut into messages of at most this.
    pub slot_size: usize,
    /// Receives posted for data: the messages the peer may have in flight
    /// (its credits) before it must wait for this side to read.
    pub recv_slots: u32,
    /// Send buffers: messages this side may have in flight.
    pub send_slots: u32,
    /// A read or write waiting this long with nothing heard from the peer
    /// sends a keepalive (a zero-length RDMA Write); a peer that is gone
    /// never acknowledges it, and the wait fails after the transport's
    /// retries (`connect`). `None`: never (a silent peer then blocks a
    /// read forever, as TCP without keepalives).
    pub keepalive: Option<Duration>,
    /// The RC transport's timeouts and retries: a peer that does not
    /// acknowledge within `timeout` x (`retry_cnt` + 1) is gone.
    pub connect: ConnectOptions,
    /// The token the server demands / the client presents.
    pub token: Option<Token>,
    /// The whole connection setup (TCP connect, exchange) must finish
    /// within this.
    pub setup_timeout: Duration,
    /// The device (`None`: the first).
    pub device: Option<String>,
}

impl Default for StreamConfig {
    /// 16 messages of 16 KiB each way (576 KiB registered per stream), a
    /// keepalive after 10 s of silence (an idle connection costs one timer
    /// wake-up per period; TCP waits hours), a peer gone after 7 x 268 ms
    /// without an acknowledgement, 10 s to set up.
    fn default() -> Self {
        StreamConfig {
            slot_size: 16 << 10,
            recv_slots: 16,
            send_slots: 16,
            keepalive: Some(Duration::from_secs(10)),
            connect: ConnectOptions {
                timeout: 16,
                retry_cnt: 6,
                ..ConnectOptions::default()
            },
            token: None,
            setup_timeout: Duration::from_secs(10),
            device: None,
        }
    }
}
