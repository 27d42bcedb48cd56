//! `-R`: the queue pairs are created and connected by rdma_cm, which
//! resolves the address and route, picks GID, port and MTU, and walks the
//! QPs to RTS (primer 7.1), as perftest's `-R`. Each side's inbox travels
//! in the private data of the connect and of the accept; all of a side's
//! QPs share one protection domain, the first connection's, so the arena
//! and inbox are registered once. Two hosts still check options and meet
//! at barriers over TCP (see [`super::remote`]).

#[cfg(feature = "rdmacm")]
pub use with_cm::{connect, loopback, Listener};
#[cfg(not(feature = "rdmacm"))]
pub use without_cm::{connect, loopback, Listener};

#[cfg(feature = "rdmacm")]
mod with_cm {
    use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs};

    use verbs::cm::{self, CmConnection, CmListener};
    use verbs::{ArenaBuf, Context, Deadline, Error, ProtectionDomain, QpConfig, RemoteRegion};

    use super::super::opts::Opts;
    use super::super::side::{qp_config, Link, Setup, Side};
    use super::super::BoxError;

    /// A bound rdma_cm listener (bound before the peer is told to connect).
    pub struct Listener(CmListener);

    impl Listener {
        /// Listens on `-p` on every RDMA address of this host.
        pub fn bind(opts: &Opts) -> Result<Listener, BoxError> {
            let any = SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), opts.tcp_port);
            Ok(Listener(CmListener::bind(any)?))
        }

        /// Accepts `setup.qps` connections into one side.
        pub fn accept(&self, opts: &Opts, setup: &Setup) -> Result<Side, BoxError> {
            accept_side(&self.0, opts, setup, Deadline::after(opts.setup_timeout))
        }
    }

    /// Connects `setup.qps` queue pairs to the server at `host` (`-p`).
    pub fn connect(opts: &Opts, setup: &Setup, host: &str) -> Result<Side, BoxError> {
        let addr = (host, opts.tcp_port)
            .to_socket_addrs()
            .map_err(|e| format!("-R: resolving {host}: {e}"))?
            .find(SocketAddr::is_ipv4)
            .ok_or_else(|| format!("-R: {host} has no IPv4 address"))?;
        connect_side(addr, opts, setup, Deadline::after(opts.setup_timeout))
    }

    /// Both sides in this process: a listener on the device's own IPv4
    /// address (rdma_cm binds to an RDMA netdev) accepting on a thread.
    pub fn loopback(opts: &Opts, setup: &Setup) -> Result<(Side, Side), BoxError> {
        let ctx = Context::open(opts.dev.as_deref())?;
        let table = ctx.gid_table(1)?;
        let ip = verbs::device::choose_gid(&table)
            .and_then(|e| e.gid.ipv4())
            .ok_or("-R: the device has no IPv4 address (rdma_cm resolves by address)")?;
        drop(ctx);
        let addr = SocketAddr::new(Ipv4Addr::from(ip).into(), opts.tcp_port);
        let listener = CmListener::bind(addr)?;
        let deadline = Deadline::after(opts.setup_timeout);
        std::thread::scope(|s| {
            let server = s
                .spawn(|| accept_side(&listener, opts, setup, deadline).map_err(|e| e.to_string()));
            let client = connect_side(addr, opts, setup, deadline);
            let server = server.join().map_err(|_| "the accepting thread panicked")?;
            Ok((client?, server?))
        })
    }

    fn accept_side(
        listener: &CmListener,
        opts: &Opts,
        setup: &Setup,
        deadline: Deadline,
    ) -> Result<Side, BoxError> {
        side_of(
            opts,
            setup,
            || Ok(listener.request(deadline)?),
            |req| req.pd(),
            |req, pd, config, inbox| {
                let peer = inbox_of(req.peer_private_data())?;
                Ok((req.accept_in(pd, config, inbox, deadline)?, peer))
            },
        )
    }

    fn connect_side(
        addr: SocketAddr,
        opts: &Opts,
        setup: &Setup,
        deadline: Deadline,
    ) -> Result<Side, BoxError> {
        side_of(
            opts,
            setup,
            || Ok(cm::resolve(addr, deadline)?),
            |resolved| resolved.pd(),
            |resolved, pd, config, inbox| {
                let conn = resolved.connect_in(pd, config, inbox, deadline)?;
                let peer = inbox_of(conn.peer_private_data())?;
                Ok((conn, peer))
            },
        )
    }

    /// A side of `setup.qps` connections: `next` waits for the next one
    /// (a connect request, a resolved route), `join` connects it in the
    /// side's PD, sending this side's inbox, and names the peer's.
    fn side_of<P>(
        opts: &Opts,
        setup: &Setup,
        mut next: impl FnMut() -> Result<P, BoxError>,
        pd_of: impl Fn(&P) -> &ProtectionDomain,
        mut join: impl FnMut(P, &ProtectionDomain, &QpConfig, &[u8]) -> Result<Joined, BoxError>,
    ) -> Result<Side, BoxError> {
        let mut built: Option<(QpConfig, Side)> = None;
        for _ in 0..setup.qps.max(1) {
            let pending = next()?;
            let (config, side) = match &mut built {
                Some(b) => b,
                None => built.insert(first_of_side(pd_of(&pending), opts, setup)?),
            };
            let inbox = cm::encode_regions(side.inbox.remote().as_slice());
            // Every connection in the first one's PD, where the memory is.
            let (conn, peer) = join(pending, side.inbox.pd(), config, &inbox)?;
            // rdma_cm gives the queue pair one CQ for both queues.
            side.add_lane(Link::Cm(conn), peer, false);
        }
        Ok(built.ok_or("-R: no connection")?.1)
    }

    /// A connection and the peer's inbox.
    type Joined = (CmConnection<ArenaBuf>, Option<RemoteRegion>);

    /// The side's QP configuration and memory, in the first connection's PD.
    fn first_of_side(
        pd: &ProtectionDomain,
        opts: &Opts,
        setup: &Setup,
    ) -> Result<(QpConfig, Side), BoxError> {
        let dev = pd.context().name();
        if opts.dev.as_deref().is_some_and(|d| d != dev) {
            return Err(format!(
                "-R: rdma_cm routed over {dev}, not the -d device: it picks the device by address"
            )
            .into());
        }
        let config = qp_config(pd, setup)?;
        Ok((config, Side::without_qps(pd, setup)?))
    }

    /// The peer's inbox, from its private data (none for send tests,
    /// whose inbox grants no remote access).
    fn inbox_of(private: &[u8]) -> Result<Option<RemoteRegion>, Error> {
        Ok(cm::decode_regions(private)?.first().copied())
    }
}

#[cfg(not(feature = "rdmacm"))]
mod without_cm {
    use super::super::opts::Opts;
    use super::super::side::{Setup, Side};
    use super::super::BoxError;

    const NEEDS: &str =
        "-R needs the rdmacm feature: cargo run --release --features rdmacm --example perf -- ... -R";

    /// Stands in for the rdma_cm listener; never built.
    pub struct Listener;

    impl Listener {
        pub fn bind(_: &Opts) -> Result<Listener, BoxError> {
            Err(NEEDS.into())
        }

        pub fn accept(&self, _: &Opts, _: &Setup) -> Result<Side, BoxError> {
            Err(NEEDS.into())
        }
    }

    pub fn connect(_: &Opts, _: &Setup, _: &str) -> Result<Side, BoxError> {
        Err(NEEDS.into())
    }

    pub fn loopback(_: &Opts, _: &Setup) -> Result<(Side, Side), BoxError> {
        Err(NEEDS.into())
    }
}
