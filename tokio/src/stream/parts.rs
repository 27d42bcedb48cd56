//! What a stream is made of before its descriptor meets the reactor:
//! built, connected and exchanged on a blocking thread.

use verbs::exchange::{self, ExchangeError, Handshake};
use verbs::{
    site, Access, Arena, ArenaBuf, ArenaConfig, Deadline, Endpoint, Engine, EngineConfig, Error,
    ErrorKind, ProtectionDomain, QpConfig, QpId, RecvRequest,
};

use super::config::StreamConfig;

/// Receives beyond the data slots, for the peer's control messages
/// (credits, end of stream): the peer has at most this many in flight.
pub(crate) const CTRL_SLOTS: u32 = 4;

/// An engine with one queue pair, its receives posted, its send buffers.
pub(crate) struct Parts {
    pub(crate) engine: Engine<ArenaBuf>,
    pub(crate) qp: QpId,
    pub(crate) send_free: Vec<ArenaBuf>,
    /// Dropped after every buffer (the stream's last field).
    pub(crate) arena: Arena,
    pub(crate) config: StreamConfig,
}

impl Parts {
    /// An engine (with a completion channel), an RC queue pair in INIT with
    /// every receive posted, and the send buffers, in one registration.
    pub(crate) fn new(pd: &ProtectionDomain, config: &StreamConfig) -> Result<Parts, Error> {
        let slot = config.slot_size.next_multiple_of(64);
        if config.slot_size == 0
            || slot > 1 << 30
            || config.recv_slots == 0
            || config.send_slots == 0
            || config.recv_slots > 1 << 16
            || config.send_slots > 1 << 16
        {
            return Err(Error::invalid(site!(
                "StreamConfig",
                "slot_size must be 1 B..1 GiB, recv_slots and send_slots 1..65536"
            )));
        }
        let recvs = config.recv_slots + CTRL_SLOTS;
        // Data, control messages, one keepalive.
        let sends = config.send_slots + CTRL_SLOTS + 1;
        let buffers = (recvs + config.send_slots) as usize;
        let mut arena = Arena::new(
            pd,
            &ArenaConfig {
                capacity: (buffers * slot + buffers * 64).next_multiple_of(1 << 16),
                max_buffers: buffers as u32 + 8,
                front_cache: 0,
                ..ArenaConfig::default()
            },
        )?;
        // Twice what can be in flight, where the device allows: an engine
        // signals every send once half its completion queue's room is
        // taken, which the posted receives alone would do at once, and
        // every acknowledgement would wake the stream again.
        let most = pd.context().query_device()?.max_cqe();
        let cq_depth = (2 * (recvs + sends)).min(most.max(recvs + sends));
        let mut engine = Engine::new(
            pd,
            &EngineConfig {
                events: true,
                cq_depth: Some(cq_depth),
                ..EngineConfig::default()
            },
        )?;
        let qp = engine.add_qp(&QpConfig {
            max_send_wr: sends,
            max_recv_wr: recvs,
            max_sge: 1,
            max_inline_data: 0,
            // For the peer's keepalives only: no memory allows remote access.
            remote_access: Access::REMOTE_WRITE,
            ..QpConfig::default()
        })?;
        for _ in 0..recvs {
            let buf = arena.alloc(slot)?;
            engine
                .post_recv(qp, RecvRequest::new(buf))
                .map_err(|e| e.error)?;
        }
        let mut send_free = Vec::with_capacity(config.send_slots as usize);
        for _ in 0..config.send_slots {
            send_free.push(arena.alloc(slot)?);
        }
        Ok(Parts {
            engine,
            qp,
            send_free,
            arena,
            config: config.clone(),
        })
    }

    pub(crate) fn endpoint(&self) -> Result<Endpoint, Error> {
        self.engine.endpoint(self.qp)
    }

    pub(crate) fn connect(&mut self, peer: &Endpoint) -> Result<(), Error> {
        self.engine
            .connect_with(self.qp, peer, &self.config.connect)
            .map(drop)
    }

    /// The client's side, blocking: the exchange (we speak first), then
    /// INIT -> RTR -> RTS toward the server's queue pair.
    pub(crate) fn dial(
        pd: &ProtectionDomain,
        addr: std::net::SocketAddr,
        config: &StreamConfig,
    ) -> Result<Parts, std::io::Error> {
        let deadline = Deadline::after(config.setup_timeout);
        let mut parts = Parts::new(pd, config).map_err(verbs_io)?;
        let ours = parts.endpoint().map_err(verbs_io)?;
        let (_session, theirs) =
            exchange::connect_and_exchange(addr, &ours, config.token.as_ref(), deadline)
                .map_err(exchange_io)?;
        parts.connect(&theirs).map_err(verbs_io)?;
        Ok(parts)
    }

    /// The server's side, blocking, for a client whose hello was valid:
    /// connect toward it, then reveal our endpoint.
    pub(crate) fn answer(
        pd: &ProtectionDomain,
        hello: Handshake,
        config: &StreamConfig,
    ) -> Result<Parts, AnswerError> {
        let mut parts = Parts::new(pd, config).map_err(AnswerError::Local)?;
        parts
            .connect(hello.peer_endpoint())
            .map_err(AnswerError::Local)?;
        let ours = parts.endpoint().map_err(AnswerError::Local)?;
        hello.reply(&ours).map_err(AnswerError::Client)?;
        Ok(parts)
    }
}

/// Why a client whose hello was valid did not become a stream.
#[derive(Debug)]
pub(crate) enum AnswerError {
    /// This side's resources (the device, memory): the server's problem.
    Local(Error),
    /// The client went away before our reply.
    Client(ExchangeError),
}

pub(crate) fn verbs_io(e: Error) -> std::io::Error {
    let kind = match e.kind() {
        ErrorKind::TimedOut => std::io::ErrorKind::TimedOut,
        ErrorKind::InvalidArgument => std::io::ErrorKind::InvalidInput,
        ErrorKind::NotFound => std::io::ErrorKind::NotFound,
        ErrorKind::Completion if e.is_flush() => std::io::ErrorKind::ConnectionAborted,
        ErrorKind::Completion if e.wc_status() == Some(verbs::WcStatus::RETRY_EXC_ERR) => {
            std::io::ErrorKind::ConnectionReset
        }
        _ => std::io::ErrorKind::Other,
    };
    std::io::Error::new(kind, e)
}

pub(crate) fn exchange_io(e: ExchangeError) -> std::io::Error {
    std::io::Error::from(e)
}
