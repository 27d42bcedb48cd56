//! What `perf` measures: the seven tests and the knobs of one measured
//! run (one message size).

use verbs::Access;

/// The seven tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Test {
    /// RDMA Write ping-pong.
    WriteLat,
    /// RDMA Read round trips.
    ReadLat,
    /// Send/receive ping-pong.
    SendLat,
    /// Fetch-and-add round trips.
    AtomicLat,
    /// RDMA Write stream.
    WriteBw,
    /// RDMA Read stream.
    ReadBw,
    /// Send stream into posted receives.
    SendBw,
}

impl Test {
    /// Every test, in perftest's order.
    pub const ALL: [Test; 7] = [
        Test::WriteLat,
        Test::ReadLat,
        Test::SendLat,
        Test::AtomicLat,
        Test::WriteBw,
        Test::ReadBw,
        Test::SendBw,
    ];

    /// The subcommand name (`write_lat`).
    pub fn name(self) -> &'static str {
        match self {
            Test::WriteLat => "write_lat",
            Test::ReadLat => "read_lat",
            Test::SendLat => "send_lat",
            Test::AtomicLat => "atomic_lat",
            Test::WriteBw => "write_bw",
            Test::ReadBw => "read_bw",
            Test::SendBw => "send_bw",
        }
    }

    /// The test a subcommand names.
    pub fn from_name(name: &str) -> Option<Test> {
        Test::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Latency (ping-pong or round trips) rather than bandwidth.
    pub fn is_latency(self) -> bool {
        matches!(
            self,
            Test::WriteLat | Test::ReadLat | Test::SendLat | Test::AtomicLat
        )
    }

    /// Uses the peer's receive queue.
    pub fn is_send(self) -> bool {
        matches!(self, Test::SendLat | Test::SendBw)
    }

    /// May carry its data inline (Write and Send; Read and atomics fetch).
    pub fn can_inline(self) -> bool {
        matches!(
            self,
            Test::WriteLat | Test::SendLat | Test::WriteBw | Test::SendBw
        )
    }

    /// Whether the passive side runs a loop too (else its CPU stays idle).
    pub fn peer_is_active(self) -> bool {
        matches!(self, Test::WriteLat | Test::SendLat | Test::SendBw)
    }

    /// What the peer may do to a side's inbox (least privilege).
    pub fn remote_access(self) -> Access {
        match self {
            Test::WriteLat | Test::WriteBw => Access::REMOTE_WRITE,
            Test::ReadLat | Test::ReadBw => Access::REMOTE_READ,
            Test::AtomicLat => Access::REMOTE_ATOMIC,
            Test::SendLat | Test::SendBw => Access::EMPTY,
        }
    }
}

/// The knobs of one measured run (one message size).
#[derive(Clone, Copy, Debug)]
pub struct Params {
    /// Which loop.
    pub test: Test,
    /// Message size in bytes.
    pub size: usize,
    /// Iterations per QP.
    pub iters: u64,
    /// Requests in flight per QP (bandwidth tests).
    pub tx_depth: u32,
    /// Every `cq_mod`-th request per QP is signaled, and the last.
    pub cq_mod: u32,
    /// Requests per post call (one doorbell per call).
    pub post_list: u32,
    /// Largest size sent inline (0: never); at most what the device granted.
    pub inline: usize,
    /// Receives kept posted per QP (send tests).
    pub rx_depth: u32,
    /// This side starts the ping-pong / is the bandwidth sender.
    pub initiator: bool,
    /// One CPU spin-wait hint (`pause` on x86) per empty poll, as
    /// `QueuePair::wait` does. Off: re-poll at once, perftest's loop.
    pub spin_hint: bool,
    /// The bandwidth sender posts own-buffer requests (`--plain`).
    pub plain: bool,
    /// Post and complete one window before measuring (perftest's
    /// `--perform_warm_up`; only `write_bw` and `read_bw` have it).
    pub warm_up: bool,
    /// Ticks without progress before a wait gives up (a dead peer).
    pub stall: u64,
}

impl Params {
    /// Requests carry their data inline (`SendRequest::inline`), the NIC
    /// never reading their buffer: Write and Send up to the inline size,
    /// chained or not.
    pub fn inline_path(&self) -> bool {
        self.test.can_inline() && self.size <= self.inline
    }

    /// Requests come from one prepared request, its buffer carved once and
    /// posted again and again: the latency tests' only request, and the
    /// bandwidth sender's one source behind the whole window (perftest's
    /// single buffer, chained as perftest's list with `-l`), unless
    /// `--plain` asks for own-buffer requests (each then owns a buffer).
    pub fn prepared_send(&self) -> bool {
        self.test.is_latency() || (self.initiator && !self.plain)
    }
}
