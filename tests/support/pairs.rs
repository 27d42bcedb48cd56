//! Connected queue pairs for the device tests, made the way the device
//! connects: INIT -> RTR -> RTS with each other's endpoint on InfiniBand
//! and RoCE, through rdma_cm on iWARP (the only way there), in one process
//! and one thread (a listener on the device's address, a connect to it,
//! both engines' events read until both sides are ESTABLISHED).

use verbs::{
    Engine, EngineConfig, MemoryRegion, NicBuf, ProtectionDomain, QpConfig, QpId, QueuePair,
    RecvRequest, SrqConfig,
};

use super::is_iwarp;

/// `n` pairs: queue pair `i` of `a` connected to queue pair `i` of `b`.
pub fn engine_pairs<B: NicBuf>(
    a: &mut Engine<B>,
    b: &mut Engine<B>,
    config: &QpConfig,
    n: usize,
) -> (Vec<QpId>, Vec<QpId>) {
    if is_iwarp(a.context()) {
        return via_cm::pairs(a, Some(b), config, n);
    }
    let qa: Vec<QpId> = (0..n).map(|_| a.add_qp(config).unwrap()).collect();
    let qb: Vec<QpId> = (0..n).map(|_| b.add_qp(config).unwrap()).collect();
    for (&x, &y) in qa.iter().zip(&qb) {
        let (ex, ey) = (a.endpoint(x).unwrap(), b.endpoint(y).unwrap());
        a.connect(x, &ey).expect("connect a -> b");
        b.connect(y, &ex).expect("connect b -> a");
    }
    (qa, qb)
}

/// A server engine with a shared receive queue of `srq_depth`, filled with
/// receives of `msg`-byte buffers, and a client engine, one queue pair
/// each (`shallow_config`), connected: (server, client, the server's queue
/// pair, the client's).
pub fn srq_server_and_client(
    pd: &ProtectionDomain,
    srq_depth: u32,
    msg: usize,
) -> (Engine<MemoryRegion>, Engine<MemoryRegion>, QpId, QpId) {
    let with_srq = EngineConfig {
        cq_depth: Some(64),
        srq: Some(SrqConfig {
            max_wr: srq_depth,
            max_sge: 1,
        }),
        ..EngineConfig::default()
    };
    let mut server = Engine::new(pd, &with_srq).unwrap();
    let mut client = Engine::new(pd, &EngineConfig::default()).unwrap();
    let (s, c) = engine_pairs(&mut server, &mut client, &super::shallow_config(), 1);
    for _ in 0..srq_depth {
        let buf = MemoryRegion::new(pd, msg).unwrap();
        server
            .post_srq_recv(RecvRequest::new(buf))
            .map_err(|e| e.error)
            .unwrap();
    }
    (server, client, s[0], c[0])
}

/// Two queue pairs of one engine, connected to each other.
pub fn pair_on<B: NicBuf>(e: &mut Engine<B>, config: &QpConfig) -> (QpId, QpId) {
    if is_iwarp(e.context()) {
        let (x, y) = via_cm::pairs(e, None, config, 1);
        return (x[0], y[0]);
    }
    let (x, y) = (e.add_qp(config).unwrap(), e.add_qp(config).unwrap());
    let (ex, ey) = (e.endpoint(x).unwrap(), e.endpoint(y).unwrap());
    e.connect(x, &ey).expect("connect x -> y");
    e.connect(y, &ex).expect("connect y -> x");
    (x, y)
}

/// A connected pair of queue pairs, each on an engine of its own made
/// from `engine` (events, a separate receive CQ, ...).
pub fn connected_pair_in<B: NicBuf>(
    pd: &ProtectionDomain,
    config: &QpConfig,
    engine: &EngineConfig,
) -> (QueuePair<B>, QueuePair<B>) {
    let mut ea = Engine::new(pd, engine).expect("engine a");
    let mut eb = Engine::new(pd, engine).expect("engine b");
    let (qa, qb) = engine_pairs(&mut ea, &mut eb, config, 1);
    (front(ea, qa[0]), front(eb, qb[0]))
}

/// A queue pair with a completion queue of its own, connected to a new
/// queue pair of `engine` (returned too).
pub fn sender_to<B: NicBuf>(
    pd: &ProtectionDomain,
    engine: &mut Engine<B>,
    config: &QpConfig,
) -> (QueuePair<B>, QpId) {
    let depth = config.max_send_wr.max(1) + config.max_recv_wr.max(1);
    let own = EngineConfig {
        cq_depth: Some(depth),
        ..EngineConfig::default()
    };
    let mut mine = Engine::new(pd, &own).expect("the sender's engine");
    let (qa, qb) = engine_pairs(&mut mine, engine, config, 1);
    (front(mine, qa[0]), qb[0])
}

fn front<B: NicBuf>(engine: Engine<B>, qp: QpId) -> QueuePair<B> {
    match QueuePair::from_engine(engine, qp) {
        Ok(front) => front,
        Err((e, _)) => panic!("an engine of one queue pair: {e}"),
    }
}

/// Two queue pairs connected through rdma_cm in one process (the way
/// iWARP connects): a listener on the device's address accepts on a
/// thread while this one connects, both in `pd` (librdmacm's context).
#[cfg(feature = "rdmacm")]
pub fn cm_pair<B: NicBuf>(
    pd: &ProtectionDomain,
    config: &QpConfig,
) -> (QueuePair<B>, QueuePair<B>) {
    use super::deadline;
    use verbs::cm;
    let addr = via_cm::listen_addr(pd);
    let listener = cm::CmListener::bind(addr).expect("rdma_bind_addr + rdma_listen");
    std::thread::scope(|s| {
        let server = s.spawn(|| {
            listener
                .request(deadline())
                .expect("a connect request")
                .accept_in::<B>(pd, config, b"", deadline())
                .expect("rdma_accept")
                .into_queue_pair()
        });
        let a = cm::resolve(addr, deadline())
            .expect("rdma_resolve_addr + rdma_resolve_route")
            .connect_in::<B>(pd, config, b"", deadline())
            .expect("rdma_connect")
            .into_queue_pair();
        (a, server.join().expect("the accepting thread"))
    })
}

#[cfg(not(feature = "rdmacm"))]
pub fn cm_pair<B: NicBuf>(
    pd: &ProtectionDomain,
    _config: &QpConfig,
) -> (QueuePair<B>, QueuePair<B>) {
    via_cm::needs_rdmacm(pd.context())
}

#[cfg(feature = "rdmacm")]
mod via_cm {
    use std::net::SocketAddr;
    use std::time::Duration;

    use verbs::cm::CmEventType;
    use verbs::{Engine, NicBuf, ProtectionDomain, QpConfig, QpId};

    use super::super::{deadline, device_ipv4};

    pub use verbs::cm::{resolve, CmListener};

    /// An address on the device of `pd` with a port no other listener of
    /// this process uses (tests of one binary run in parallel; binaries
    /// one at a time).
    pub fn listen_addr(pd: &ProtectionDomain) -> SocketAddr {
        use std::sync::atomic::{AtomicU16, Ordering};
        static NEXT: AtomicU16 = AtomicU16::new(0);
        let port = 21000
            + (std::process::id() % 50) as u16 * 200
            + NEXT.fetch_add(1, Ordering::Relaxed) % 200;
        SocketAddr::new(device_ipv4(pd.context()).into(), port)
    }

    /// `n` pairs through rdma_cm: one end placed on `a`, the other on `b`
    /// (or on `a` too), each connected before the next.
    pub fn pairs<B: NicBuf>(
        a: &mut Engine<B>,
        mut b: Option<&mut Engine<B>>,
        config: &QpConfig,
        n: usize,
    ) -> (Vec<QpId>, Vec<QpId>) {
        let addr = listen_addr(a.pd());
        let listener = CmListener::bind(addr).expect("rdma_bind_addr + rdma_listen");
        let (mut qa, mut qb) = (Vec::new(), Vec::new());
        for _ in 0..n {
            let (x, y) = one(a, b.as_deref_mut(), &listener, addr, config)
                .unwrap_or_else(|e| panic!("an rdma_cm pair: {e}"));
            qa.push(x);
            qb.push(y);
        }
        (qa, qb)
    }

    /// One pair: a connecting queue pair placed on `a`, the accepting one
    /// on `b` (or `a`), both ESTABLISHED. On failure nothing of it is left.
    fn one<B: NicBuf>(
        a: &mut Engine<B>,
        mut b: Option<&mut Engine<B>>,
        listener: &CmListener,
        addr: SocketAddr,
        config: &QpConfig,
    ) -> Result<(QpId, QpId), verbs::Error> {
        let x = resolve(addr, deadline())?.place(a, config)?;
        a.cm_connect(x, b"")?;
        let req = listener.request(deadline())?;
        let target = match b.as_deref_mut() {
            Some(b) => b,
            None => &mut *a,
        };
        let y = match req.place(target, config) {
            Ok(y) => y,
            Err(e) => {
                a.remove_qp(x)?;
                return Err(e);
            }
        };
        target.cm_accept(y, b"")?;
        established(a, b, [x, y]);
        Ok((x, y))
    }

    /// Reads both engines' events until both queue pairs are ESTABLISHED.
    fn established<B: NicBuf>(a: &mut Engine<B>, mut b: Option<&mut Engine<B>>, qps: [QpId; 2]) {
        let until = deadline();
        let mut up = [false; 2];
        while up != [true; 2] {
            assert!(!until.passed(), "both ends ESTABLISHED in time: {up:?}");
            let mut engines: Vec<&mut Engine<B>> = vec![&mut *a];
            engines.extend(b.as_deref_mut());
            for e in engines {
                while let Some(ev) = e.cm_event().expect("rdma_get_cm_event") {
                    let Some(i) = qps.iter().position(|&q| Some(q) == ev.qp()) else {
                        continue;
                    };
                    match ev.kind() {
                        CmEventType::ESTABLISHED => up[i] = true,
                        other => panic!("{other:?} instead of ESTABLISHED: {:?}", ev.error()),
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

#[cfg(not(feature = "rdmacm"))]
mod via_cm {
    use verbs::{Context, Engine, NicBuf, QpConfig, QpId};

    pub fn needs_rdmacm(ctx: &Context) -> ! {
        panic!(
            "{} is iWARP, which connects only through rdma_cm: run with --features rdmacm",
            ctx.name()
        )
    }

    pub fn pairs<B: NicBuf>(
        a: &mut Engine<B>,
        _: Option<&mut Engine<B>>,
        _: &QpConfig,
        _: usize,
    ) -> (Vec<QpId>, Vec<QpId>) {
        needs_rdmacm(a.context())
    }
}
