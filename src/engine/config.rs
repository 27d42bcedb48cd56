//! What an engine and its queue pairs are built with. The defaults suit
//! most RC users.

use crate::endpoint::Mtu;
use crate::memory::Access;
use crate::sgl::MAX_SGE;
use crate::sys;

/// Most requests posted with one doorbell by [`crate::engine::Engine::post_send_chain`].
pub const MAX_CHAIN: usize = 32;

/// A queue pair's transport (primer 1.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Transport {
    /// Reliable connected: acknowledged, retransmitted, in order; every
    /// operation (Send, Write, Read, atomics).
    #[default]
    Rc,
    /// Unreliable connected: RC without acknowledgements. What it gives up:
    /// - no ACKs: a send's completion says it left, not that it arrived;
    /// - no retransmission: a lost packet loses its whole message, silently
    ///   (neither side gets an error; the receiver drops the rest of it);
    /// - no receiver-not-ready wait: a Send or Write-with-immediate that
    ///   finds no posted receive is dropped;
    /// - no RDMA Read and no atomics (they need a response): refused with
    ///   [`ErrorKind::Unsupported`](crate::error::ErrorKind::Unsupported) before
    ///   anything is posted.
    ///
    /// Write, Write-with-immediate and Send remain.
    Uc,
    /// Unreliable datagram: one queue pair talks to any number of peers,
    /// each message addressed on its own (an address handle, the peer's
    /// QPN and Q_Key: [`crate::engine::UdDest`]). What it gives up and
    /// asks for:
    /// - Send and Send-with-immediate only, posted with
    ///   [`crate::engine::Engine::post_ud_send`]; RDMA Write, Read and atomics are
    ///   refused with [`ErrorKind::Unsupported`](crate::error::ErrorKind::Unsupported)
    ///   before anything is posted, and so is `post_send` (it names no
    ///   destination);
    /// - a message is at most the port's active MTU (and
    ///   [`QpConfig::max_mtu`]): larger is refused before posting
    ///   ([`crate::engine::Engine::ud_max_payload`]);
    /// - no acknowledgement, no retransmission, no receiver-not-ready wait:
    ///   a message that finds no posted receive, or a receive too short, is
    ///   dropped silently;
    /// - every receive starts with [`crate::grh::GRH_LEN`] bytes the device fills
    ///   with the packet's routing header: a receive buffer needs room for
    ///   them and the payload (`post_recv` and `prepare_recv` refuse one
    ///   shorter than `GRH_LEN + 1`; a shared receive queue's receives are
    ///   not the queue pair's to check: size them yourself).
    ///
    /// Prepared sends, memory windows and the [`crate::qp::QueuePair`] front
    /// are connected-only: a UD queue pair lives on an [`crate::engine::Engine`].
    ///
    /// Connected with [`crate::engine::Engine::ready_ud`] (INIT -> RTR -> RTS, no
    /// peer), never with `connect`.
    Ud,
}

impl Transport {
    pub(crate) fn qp_type(self) -> sys::ibv_qp_type {
        match self {
            Transport::Rc => sys::ibv_qp_type::RC,
            Transport::Uc => sys::ibv_qp_type::UC,
            Transport::Ud => sys::ibv_qp_type::UD,
        }
    }
}

/// Sizes and policies of one queue pair. Its retry policies (transport
/// retries, and receiver-not-ready retries: forever by default, see
/// [`ConnectOptions::rnr_retry`] for why and how to see them) are set when
/// it connects.
#[derive(Clone, Copy, Debug)]
pub struct QpConfig {
    /// RC (default), UC or UD.
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
    /// also bound it). For UD, the largest message.
    pub max_mtu: Mtu,
    /// UD only: the Q_Key the queue pair accepts (a datagram carrying
    /// another is dropped) and that peers put in their sends to it.
    /// Values with the top bit set are privileged (the kernel wants
    /// `CAP_NET_RAW`) and refused.
    pub qkey: u32,
}

/// The Q_Key a UD queue pair gets by default (any non-privileged value
/// both sides agree on works).
pub const DEFAULT_QKEY: u32 = 0x1119_5ead;

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
            qkey: DEFAULT_QKEY,
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
    /// A completion channel, so [`crate::engine::Engine::wait`] sleeps instead of spinning.
    pub events: bool,
    /// Receive completions on a queue of their own, as perftest's send
    /// tests set up: [`crate::engine::Engine::poll_queue`] then takes one side's.
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

impl Queue {
    /// The completion queue this names among an engine's `cq` and
    /// `recv_cq`: `None` for `Recv` when receives share `cq`.
    #[inline(always)]
    pub(crate) fn of<'c, C>(self, cq: &'c C, recv_cq: &'c Option<C>) -> Option<&'c C> {
        match (self, recv_cq) {
            (Queue::Send, _) => Some(cq),
            (Queue::Recv, recv) => recv.as_ref(),
        }
    }
}

/// Transport parameters of the RTR and RTS transitions. The defaults are
/// the primer's (timeout 14, retry 7, RNR retry 7, min RNR timer 12),
/// except where the docs of a field say why not (`hop_limit`).
#[derive(Clone, Copy, Debug)]
pub struct ConnectOptions {
    /// Local ACK timeout, 4.096 us * 2^timeout (14: about 67 ms).
    pub timeout: u8,
    /// Transport retries before `RETRY_EXC_ERR` (at most 7; Soft-RoCE treats
    /// 7 as "forever", so a dead peer is then found only by your deadline:
    /// use 6 or less to get the error, after about timeout x (retry_cnt + 1)).
    pub retry_cnt: u8,
    /// Receiver-not-ready retries: how often a Send (or Write-with-immediate)
    /// that found no posted receive at the peer is tried again, each after
    /// the peer's RNR timer (`min_rnr_timer`), before it fails with
    /// `RNR_RETRY_EXC_ERR`. 7 means forever.
    ///
    /// 7 by default, as the primer: a peer briefly short of receives (a
    /// burst, a receiver thread descheduled or asleep on its completion
    /// channel) slows the sender down instead of tearing the connection
    /// down, which is what a low-latency RPC wants. A finite count tolerates
    /// only count x timer of receiver lag (6 x 0.64 ms, about 4 ms, on a
    /// NIC) before the queue pair goes to ERR and flushes everything in
    /// flight, and a longer timer would make every RNR wait that long.
    /// The cost: a receive the peer never posts is no error; the send, and
    /// everything posted after it, waits, and the caller sees only its own
    /// deadline pass. The port's RNR counters show it (`rdma statistic show
    /// link DEV/PORT`; Soft-RoCE counts `rcvd_rnr_err` at the sender and
    /// `send_rnr_err` at the receiver; `examples/doctor` prints them).
    /// 0 to 6 fail the send instead.
    pub rnr_retry: u8,
    /// Minimum RNR NAK timer code (12: 0.64 ms).
    pub min_rnr_timer: u8,
    /// GRH hop limit (RoCE: the IPv4 TTL / IPv6 hop limit). 64 by default,
    /// not the primer's 1: every router on a routed RoCEv2 path (L3 hops
    /// between racks or subnets) decrements it and drops the packet at 0,
    /// so 1 only reaches peers on the same subnet, and 64 changes nothing
    /// there.
    ///
    /// On RoCE, Linux overrides it: resolving the peer's MAC address
    /// through the IP route, the kernel puts the route's hop limit in the
    /// GRH (`net.ipv4.ip_default_ttl`, 64, unless the route sets
    /// `hoplimit`; the netdev's IPv6 hop limit for IPv6 GIDs), whatever is
    /// asked here; [`crate::engine::QpAttributes::hop_limit`] shows what is in
    /// effect. It is used as given on InfiniBand with a GRH.
    pub hop_limit: u8,
    /// GRH traffic class (RoCE: the IP header's DSCP and ECN bits, so DSCP
    /// 26 is `26 << 2`). Used as given.
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
            rnr_retry: 7,
            min_rnr_timer: 12,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
            service_level: 0,
            force_grh: false,
        }
    }
}
