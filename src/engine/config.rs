//! What an engine and its queue pairs are built with. The defaults suit
//! most RC users.

use crate::endpoint::Mtu;
use crate::memory::Access;
use crate::sgl::MAX_SGE;
use crate::sys;

/// Most requests posted with one doorbell by [`crate::Engine::post_send_chain`].
pub const MAX_CHAIN: usize = 32;

/// A queue pair's transport (primer 1.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Transport {
    /// Reliable connected: acknowledged, retransmitted, in order; every
    /// operation (Send, Write, Read, atomics).
    #[default]
    Rc,
    /// Unreliable connected: RC without acknowledgements. Write and Send
    /// (with immediate) only, no Read and no atomics; nothing is
    /// retransmitted, so a lost packet loses its message without an error.
    Uc,
}

impl Transport {
    pub(crate) fn qp_type(self) -> sys::ibv_qp_type {
        match self {
            Transport::Rc => sys::ibv_qp_type::RC,
            Transport::Uc => sys::ibv_qp_type::UC,
        }
    }
}

/// Sizes and policies of one queue pair.
#[derive(Clone, Copy, Debug)]
pub struct QpConfig {
    /// RC (default) or UC.
    pub transport: Transport,
    /// Port number (from 1).
    pub port: u8,
    /// GID index; `None` chooses automatically (RoCE v2, IPv4-mapped,
    /// routable first). An explicit index always wins and is validated.
    pub gid_index: Option<u32>,
    /// Send queue depth: requests in flight at once.
    pub max_send_wr: u32,
    /// Receive queue depth (unused with the engine's shared receive queue).
    pub max_recv_wr: u32,
    /// Scatter/gather entries per request (at most [`MAX_SGE`]).
    pub max_sge: u32,
    /// Inline data asked for (the device may grant more or refuse).
    pub max_inline_data: u32,
    /// What the peer may do through this QP: `REMOTE_WRITE`, `REMOTE_READ`,
    /// `REMOTE_ATOMIC`. Least privilege: nothing unless asked for.
    pub remote_access: Access,
    /// Upper bound on the path MTU (the port's active MTU and the peer's
    /// also bound it).
    pub max_mtu: Mtu,
}

impl Default for QpConfig {
    fn default() -> Self {
        QpConfig {
            transport: Transport::Rc,
            port: 1,
            gid_index: None,
            max_send_wr: 128,
            max_recv_wr: 128,
            max_sge: MAX_SGE as u32,
            max_inline_data: 64,
            remote_access: Access::EMPTY,
            max_mtu: Mtu::MTU_4096,
        }
    }
}

/// A shared receive queue for every queue pair of an engine.
#[derive(Clone, Copy, Debug)]
pub struct SrqConfig {
    /// Receives it holds at once.
    pub max_wr: u32,
    /// Scatter/gather entries per receive (at most [`MAX_SGE`]).
    pub max_sge: u32,
}

impl Default for SrqConfig {
    fn default() -> Self {
        SrqConfig {
            max_wr: 1024,
            max_sge: 1,
        }
    }
}

/// How to build an engine: its completion queue(s) and, optionally, a
/// shared receive queue.
#[derive(Clone, Copy, Debug, Default)]
pub struct EngineConfig {
    /// Completions the queue must hold; `None`: 4096, or the device's
    /// maximum if lower. Every queue pair's depths count against it, so the
    /// queue can never overflow (an overflowed CQ is dead).
    pub cq_depth: Option<u32>,
    /// A completion channel, so [`crate::Engine::wait`] sleeps instead of spinning.
    pub events: bool,
    /// Receive completions on a queue of their own, as perftest's send
    /// tests set up: [`crate::Engine::poll_queue`] then takes one side's.
    pub separate_recv_cq: bool,
    /// A shared receive queue: every queue pair of the engine receives
    /// through it, and a receive comes back with its buffer.
    pub srq: Option<SrqConfig>,
}

/// Which completion queue to poll, when receives have their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queue {
    /// The send queues' completions (with one CQ: all of them).
    Send,
    /// The receive queues' completions.
    Recv,
}

/// Transport parameters of the RTR and RTS transitions. The defaults are
/// the primer's (timeout 14, retry 7, min RNR timer 12), except where the
/// docs of a field say why not.
#[derive(Clone, Copy, Debug)]
pub struct ConnectOptions {
    /// Local ACK timeout, 4.096 us * 2^timeout (14: about 67 ms).
    pub timeout: u8,
    /// Transport retries before `RETRY_EXC_ERR` (at most 7; Soft-RoCE treats
    /// 7 as "forever", so a dead peer is then found only by your deadline:
    /// use 6 or less to get the error, after about timeout x (retry_cnt + 1)).
    pub retry_cnt: u8,
    /// Receiver-not-ready retries (7: forever).
    pub rnr_retry: u8,
    /// Minimum RNR NAK timer code (12: 0.64 ms).
    pub min_rnr_timer: u8,
    /// GRH hop limit (RoCE: the IPv4 TTL / IPv6 hop limit). The primer's
    /// 1 keeps packets in one L2 subnet; 64 lets routed RoCEv2 reach peers
    /// across routers, and changes nothing on one subnet.
    pub hop_limit: u8,
    /// GRH traffic class (RoCE: DSCP and ECN bits).
    pub traffic_class: u8,
    /// GRH flow label (20 bits; RoCEv2 derives the UDP source port from it,
    /// which ECMP hashes: distinct labels spread flows over paths).
    pub flow_label: u32,
    /// Service level.
    pub service_level: u8,
    /// Force the GRH on InfiniBand (it is always used on RoCE).
    pub force_grh: bool,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 6,
            min_rnr_timer: 12,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
            service_level: 0,
            force_grh: false,
        }
    }
}
