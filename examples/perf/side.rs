//! The resources one side of a test runs on: queue pairs, the inbox the
//! peer targets, the arena local buffers are carved from, the timestamp
//! tables, all built and sized before the clock starts ([`Side::prepare`]),
//! so that the loops in [`super::loops`] allocate nothing.
//!
//! Included by `tests/rdma_zero_alloc.rs` too.

use std::ops::{Deref, DerefMut};

use verbs::{
    site, Arena, ArenaBuf, ArenaConfig, ConnectOptions, Endpoint, EngineConfig, Error, HostBuf,
    Local, MemoryRegion, Mtu, NicBuf, Prepared, PreparedRecv, PreparedSend, ProtectionDomain,
    QpConfig, QueuePair, RecvRequest, RemoteRegion, RemoteSlice, SendRequest,
};

use super::loops::{operation, repost};
use super::params::{Params, Test};

/// The queue pairs of `perf`: local buffers are carved from one arena.
pub type Qp = QueuePair<ArenaBuf>;

/// How queue pairs and memory are built (once per process).
#[derive(Clone, Copy, Debug)]
pub struct Setup {
    /// The test the resources are for.
    pub test: Test,
    /// Queue pairs per side.
    pub qps: usize,
    /// Largest message of the run (buffers are sized for it).
    pub max_size: usize,
    /// Bytes of the inbox: at least `max_size`, more where the peer
    /// spreads its requests over more (perftest's cycle buffer).
    pub inbox_len: usize,
    /// Requests in flight per QP.
    pub tx_depth: u32,
    /// Requests per post call.
    pub post_list: u32,
    /// Receives kept posted per QP (send tests).
    pub rx_depth: u32,
    /// Inline data to ask the device for.
    pub inline: u32,
    /// Port number.
    pub port: u8,
    /// GID index (`None`: chosen by the crate).
    pub gid_index: Option<u32>,
    /// Upper bound on the path MTU.
    pub mtu: Mtu,
    /// Bytes of local buffers per side at most: the safe API gives every
    /// request in flight a buffer of its own, so `tx_depth` x 8 MiB would
    /// not fit; above this, fewer requests are kept in flight.
    pub buf_mem: usize,
}

/// A lane's queue pair: connected through the endpoint exchange, or owned
/// by its rdma_cm connection (`-R`). Either way it is the queue pair.
pub enum Link {
    /// Created here, connected with [`Side::connect`].
    Verbs(Qp),
    /// Created and connected by rdma_cm.
    #[cfg(feature = "rdmacm")]
    Cm(verbs::cm::CmConnection<ArenaBuf>),
}

impl Deref for Link {
    type Target = Qp;
    #[inline]
    fn deref(&self) -> &Qp {
        match self {
            Link::Verbs(qp) => qp,
            #[cfg(feature = "rdmacm")]
            Link::Cm(conn) => conn,
        }
    }
}

impl DerefMut for Link {
    #[inline]
    fn deref_mut(&mut self) -> &mut Qp {
        match self {
            Link::Verbs(qp) => qp,
            #[cfg(feature = "rdmacm")]
            Link::Cm(conn) => conn,
        }
    }
}

/// One queue pair with the local buffers only it posts.
pub struct Lane {
    /// The queue pair.
    pub qp: Link,
    pub(crate) peer: Option<RemoteRegion>,
    /// Free buffers for the bandwidth sender's chains.
    pub(crate) sends: Vec<ArenaBuf>,
    /// The one request posted again and again, prepared with its buffer
    /// (`Params::prepared_send`).
    pub(crate) ping: Option<PreparedSend>,
    /// The prepared receives, posted again in turn (a latency test has
    /// one). A queue completes in post order, so with at most `recv_window`
    /// posted, the next one's previous post has completed.
    pub(crate) recvs: Vec<PreparedRecv>,
    /// Which of `recvs` is posted next.
    pub(crate) recv_next: usize,
    /// Most receives posted at once.
    pub(crate) recv_window: u64,
    /// Every request prepared for this run (released by the next prepare).
    pub(crate) prepared: Vec<Prepared>,
    /// Receive completions have a completion queue of their own (the
    /// send tests' queue pairs created here, as perftest's); else they
    /// come with the send completions (rdma_cm's queue pairs).
    pub(crate) recv_cq: bool,
    pub(crate) posted: u64,
    pub(crate) done: u64,
    pub(crate) recv_posted: u64,
    pub(crate) received: u64,
}

impl Lane {
    /// The first `len` bytes of the peer's inbox.
    pub(crate) fn remote(&self, len: usize) -> Result<RemoteSlice, Error> {
        let peer = self.peer.ok_or_else(|| {
            Error::invalid(site!("perf", "the peer shared no memory for this test"))
        })?;
        RemoteSlice::new(&peer, 0, len as u64)
    }
}

/// Timestamps of one run, preallocated by [`Side::prepare`].
#[derive(Default)]
pub struct Stamps {
    /// Ticks just before request `i` (all QPs, in post order) was posted.
    pub posted: Vec<u64>,
    /// (index of the request, ticks) per signaled send completion: request
    /// `index` and every one before it had completed at `ticks`.
    pub completed: Vec<(u64, u64)>,
}

/// One side of a test: its queue pairs, the memory the peer targets, the
/// arena its local buffers come from, and its timestamps.
pub struct Side {
    /// Queue pairs.
    pub lanes: Vec<Lane>,
    /// What the peer writes, reads or updates (and polls in write_lat).
    pub inbox: MemoryRegion,
    /// Timestamps of the last run.
    pub stamps: Stamps,
    pub(crate) arena: Arena,
    pub(crate) depth: u32,
    pub(crate) buf_mem: usize,
    /// [`Side::prepare`] zeroes the inbox (the default). Off where no
    /// barrier keeps the peer from writing the next size's first message
    /// before this side prepares it (perftest's wire): the write_lat wait
    /// then relies on the peer writing each byte once per size, as the
    /// doubling sweep does.
    pub clear_inbox: bool,
}

impl Side {
    /// Creates the queue pairs (in INIT), the inbox and the buffer arena.
    pub fn new(pd: &ProtectionDomain, s: &Setup) -> Result<Side, Error> {
        let mut side = Side::without_qps(pd, s)?;
        let config = qp_config(pd, s)?;
        let engine = engine_config(s);
        for _ in 0..s.qps.max(1) {
            let qp = QueuePair::with_engine(pd, &config, &engine)?;
            side.add_lane(Link::Verbs(qp), None, engine.separate_recv_cq);
        }
        Ok(side)
    }

    /// Two sides in `pd`, each QP connected to its twin on the other: the
    /// loopback test on one device.
    pub fn loopback_pair(pd: &ProtectionDomain, s: &Setup) -> Result<(Side, Side), Error> {
        let mut a = Side::new(pd, s)?;
        let mut b = Side::new(pd, s)?;
        let (ea, eb) = (a.endpoints()?, b.endpoints()?);
        a.connect(&eb, &ConnectOptions::default())?;
        b.connect(&ea, &ConnectOptions::default())?;
        Ok((a, b))
    }

    /// The inbox and the buffer arena; the queue pairs come with
    /// [`Side::add_lane`] (rdma_cm creates them as it connects).
    pub fn without_qps(pd: &ProtectionDomain, s: &Setup) -> Result<Side, Error> {
        let inbox = MemoryRegion::with_access(
            pd,
            s.inbox_len.max(s.max_size).max(8),
            s.test.remote_access(),
        )?;
        let per_lane = (s.tx_depth.max(1) + s.rx_depth) as usize;
        let want = s.qps.max(1) * per_lane * slot(s.max_size);
        let arena = Arena::new(
            pd,
            &ArenaConfig {
                capacity: want.min(s.buf_mem) + want.min(s.buf_mem) / 8 + (1 << 20),
                max_buffers: (s.qps.max(1) * per_lane + 64) as u32,
                ..ArenaConfig::default()
            },
        )?;
        Ok(Side {
            lanes: Vec::with_capacity(s.qps.max(1)),
            inbox,
            stamps: Stamps::default(),
            arena,
            depth: 0,
            buf_mem: s.buf_mem,
            clear_inbox: true,
        })
    }

    /// Adds a queue pair; `peer` is the peer's inbox if already known;
    /// `recv_cq`: its receive completions have a completion queue of
    /// their own.
    pub fn add_lane(&mut self, qp: Link, peer: Option<RemoteRegion>, recv_cq: bool) {
        self.lanes.push(Lane {
            qp,
            peer,
            sends: Vec::new(),
            ping: None,
            recvs: Vec::new(),
            recv_next: 0,
            recv_window: 0,
            prepared: Vec::new(),
            recv_cq,
            posted: 0,
            done: 0,
            recv_posted: 0,
            received: 0,
        });
    }

    /// This side's endpoints (one per QP), each sharing the inbox.
    pub fn endpoints(&self) -> Result<Vec<Endpoint>, Error> {
        self.lanes
            .iter()
            .map(|l| {
                let mut ep = l.qp.endpoint()?;
                ep.regions.extend(self.inbox.remote());
                Ok(ep)
            })
            .collect()
    }

    /// Connects QP i to the peer's endpoint i.
    pub fn connect(&mut self, peers: &[Endpoint], options: &ConnectOptions) -> Result<(), Error> {
        if peers.len() != self.lanes.len() {
            return Err(Error::invalid(site!(
                "perf connect",
                "the peer has another number of QPs"
            )));
        }
        for (lane, peer) in self.lanes.iter_mut().zip(peers) {
            lane.qp.connect_with(peer, options)?;
            lane.peer = peer.regions.first().copied();
        }
        Ok(())
    }

    /// Requests in flight per QP the last [`Side::prepare`] allowed (the
    /// tx depth, unless buffer memory capped it).
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Gets ready for one run: carves this size's buffers, clears the
    /// inbox, posts the receives, sizes the timestamp tables. Call on both
    /// sides before either starts [`run`].
    pub fn prepare(&mut self, p: &Params) -> Result<(), Error> {
        let prepared_send = p.prepared_send();
        let mut sends = match (p.test.is_latency(), p.initiator) {
            _ if prepared_send => 1,
            (false, true) => p.tx_depth.max(1),
            _ => 0,
        } as usize;
        let posts = if p.test.is_send() && (p.test.is_latency() || !p.initiator) {
            (p.rx_depth.max(1) as u64).min(p.iters) as usize
        } else {
            0
        };
        // The latency tests keep `posts` receives posted from ONE prepared
        // receive, as perftest reposts its one receive request: every
        // message lands in the same buffer. (Cycling through hundreds of
        // buffers cost send_lat 4-6 % under TCG.) The send_bw receiver
        // gives each receive its own buffer.
        let mut recvs = if p.test.is_latency() {
            posts.min(1)
        } else {
            posts
        };
        // A chained request owns its buffer: past the memory budget, keep
        // fewer in flight rather than share one buffer among many.
        let budget = (self.buf_mem / slot(p.size) / self.lanes.len()).max(2);
        if sends + recvs > budget {
            let s = (sends * budget / (sends + recvs)).max(usize::from(sends > 0));
            recvs = (budget - s).max(usize::from(recvs > 0));
            sends = s;
        }
        // Each send_bw receive has its own buffer: the budget may cut them.
        let posts = if p.test.is_latency() { posts } else { recvs };
        self.depth = if prepared_send {
            p.tx_depth.max(1)
        } else {
            sends as u32
        };
        let len = p.size.max(1);
        for lane in &mut self.lanes {
            // Back to the arena before carving again.
            lane.sends.clear();
            lane.ping = None;
            lane.recvs.clear();
            for h in lane.prepared.drain(..) {
                match h {
                    Prepared::Send(h) => drop(lane.qp.release_prepared(h)?),
                    Prepared::Recv(h) => drop(lane.qp.release_prepared(h)?),
                }
            }
        }
        for lane in &mut self.lanes {
            if prepared_send {
                let local = Local::range(self.arena.alloc(len)?, 0, p.size).map_err(|(e, _)| e)?;
                let mut req = SendRequest::new(operation(lane, p)?, local);
                if p.inline_path() {
                    req = req.inline();
                }
                let h = lane.qp.prepare_send(req).map_err(|e| e.error)?;
                lane.ping = Some(h);
                lane.prepared.push(Prepared::Send(h));
            } else {
                lane.sends.reserve(sends);
                for _ in 0..sends {
                    lane.sends.push(self.arena.alloc(len)?);
                }
            }
            lane.recvs.reserve(recvs);
            for _ in 0..recvs {
                let local = Local::range(self.arena.alloc(len)?, 0, p.size).map_err(|(e, _)| e)?;
                let h = lane
                    .qp
                    .prepare_recv(RecvRequest::new(local))
                    .map_err(|e| e.error)?;
                lane.prepared.push(Prepared::Recv(h));
                lane.recvs.push(h);
            }
            lane.recv_next = 0;
            lane.recv_window = posts as u64;
            lane.posted = 0;
            lane.done = 0;
            lane.recv_posted = 0;
            lane.received = 0;
            repost(lane, p)?;
        }
        let zeros = [0u8; 4096];
        let clear = if self.clear_inbox { p.size } else { 0 };
        for at in (0..clear.min(self.inbox.len())).step_by(zeros.len()) {
            let n = zeros.len().min(p.size - at);
            self.inbox.write_at(at, &zeros[..n])?;
        }
        let total = p.iters as usize * self.lanes.len();
        self.stamps.posted.clear();
        self.stamps.posted.resize(total, 0);
        self.stamps.completed.clear();
        self.stamps.completed.reserve(total + 1);
        Ok(())
    }
}

/// The queue pairs' configuration for `s`, with an inline size the
/// device takes.
pub fn qp_config(pd: &ProtectionDomain, s: &Setup) -> Result<QpConfig, Error> {
    let list = s.post_list.max(1);
    let config = QpConfig {
        port: s.port,
        gid_index: s.gid_index,
        // The latency tests have one signaled request in flight: a send
        // queue of tx_depth (1), as perftest's. The bandwidth tests get
        // twice the in-flight window: the crate signals a request by
        // itself once unsignaled ones fill half the send queue, which
        // must never pre-empt our own every-cq_mod-th signaling.
        max_send_wr: if s.test.is_latency() {
            s.tx_depth.max(1)
        } else {
            2 * (s.tx_depth.max(1) + list) + 2
        },
        max_recv_wr: if s.test.is_send() {
            s.rx_depth.max(1)
        } else {
            1
        },
        max_sge: 1,
        max_inline_data: s.inline,
        remote_access: s.test.remote_access(),
        max_mtu: s.mtu,
        ..QpConfig::default()
    };
    with_inline_the_device_takes(pd, config)
}

/// The completion queues of a queue pair created here (each has an
/// engine of its own): perftest's send tests give receives a CQ of their
/// own, polled apart from the send queue's.
pub fn engine_config(s: &Setup) -> EngineConfig {
    EngineConfig {
        separate_recv_cq: s.test.is_send(),
        ..EngineConfig::default()
    }
}

/// `config`, with its inline size halved until the device creates the QP:
/// some providers refuse (EINVAL) more than they support instead of
/// granting less; then the largest size that works is used (what the
/// granted caps report is the limit either way).
fn with_inline_the_device_takes(
    pd: &ProtectionDomain,
    mut config: QpConfig,
) -> Result<QpConfig, Error> {
    while config.max_inline_data > 0 {
        match QueuePair::<ArenaBuf>::new(pd, &config) {
            Ok(_) => return Ok(config),
            Err(e) if e.errno() == Some(libc::EINVAL) => {
                config.max_inline_data /= 2;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(config)
}

/// Bytes a buffer of `size` takes in the arena (cache-line aligned).
fn slot(size: usize) -> usize {
    size.max(1).next_multiple_of(64)
}
