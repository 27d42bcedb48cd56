//! Who exchanges endpoints with whom: every node serves the nodes below
//! it (a `verbs::exchange::Server` on a thread of its own, so it answers
//! while its main thread is a client) and is a client of the nodes above
//! it. One handshake per queue pair, in order: a client starts its
//! queue pair k+1 only once k is answered, so the server, handing out
//! its clients in arrival order, meets each peer's queue pairs in order
//! and knows which of its own to answer with. The sessions stay open as
//! the barriers of the run.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use verbs::exchange::{connect, ExchangeError, Server, ServerConfig, Session, SYNC_BYTE};
use verbs::{Deadline, Endpoint};

/// The peer's endpoint for one of our queue pairs, and the session it
/// came over.
pub struct Link {
    pub peer: usize,
    pub k: usize,
    pub theirs: Endpoint,
    pub session: Session,
}

/// How long the whole exchange may take (guests boot at their own pace).
const EXCHANGE_BUDGET: Duration = Duration::from_secs(120);

/// Starts serving the nodes below `me`: `ours[j][k]` answers peer j's
/// queue pair k. Returns the links once all `me * k` have come.
pub fn serve(
    me: usize,
    peers: &[Ipv4Addr],
    port: u16,
    ours: Vec<Vec<Endpoint>>,
) -> std::io::Result<JoinHandle<Result<Vec<Link>, String>>> {
    let config = ServerConfig {
        hello_timeout: Duration::from_secs(20),
        client_timeout: Duration::from_secs(60),
        ..ServerConfig::default()
    };
    let server = Server::bind((peers[me], port), config, |peer, e| {
        eprintln!("mesh: refused {peer}: {e}")
    })?;
    let peers = peers.to_vec();
    Ok(thread::spawn(move || {
        let k_per_peer = ours.first().map_or(0, Vec::len);
        let mut next_k = vec![0; peers.len()];
        let mut links = Vec::new();
        let until = Deadline::after(EXCHANGE_BUDGET);
        while links.len() < me * k_per_peer {
            let hs = server
                .next_client(until)
                .map_err(|e| format!("next_client: {e}"))?;
            let theirs = hs.peer_endpoint().clone();
            let from = theirs.gid.ipv4().map(Ipv4Addr::from);
            let peer = peers[..me]
                .iter()
                .position(|&p| Some(p) == from)
                .ok_or_else(|| format!("a hello from {from:?}, not a node below {me}"))?;
            let k = next_k[peer];
            if k == k_per_peer {
                return Err(format!("node {peer} sent more than {k_per_peer} hellos"));
            }
            next_k[peer] += 1;
            let session = hs
                .reply(&ours[peer][k])
                .map_err(|e| format!("reply to node {peer}: {e}"))?;
            links.push(Link {
                peer,
                k,
                theirs,
                session,
            });
        }
        Ok(links)
    }))
}

/// Exchanges `ours[j][k]` with every node j above `me`, queue pair by
/// queue pair.
pub fn dial(
    me: usize,
    peers: &[Ipv4Addr],
    port: u16,
    ours: &[Vec<Endpoint>],
) -> Result<Vec<Link>, String> {
    let until = Deadline::after(EXCHANGE_BUDGET);
    let mut links = Vec::new();
    for (peer, &addr) in peers.iter().enumerate().skip(me + 1) {
        for (k, endpoint) in ours[peer].iter().enumerate() {
            let fail = |e: ExchangeError| format!("exchange with node {peer} ({addr}): {e}");
            let mut session = connect_until(SocketAddr::from((addr, port)), until).map_err(fail)?;
            let theirs = session
                .client_exchange(endpoint, None, until)
                .map_err(fail)?;
            links.push(Link {
                peer,
                k,
                theirs,
                session,
            });
        }
    }
    Ok(links)
}

/// Connects by `until`, trying again after any failure: a peer still
/// booting answers "no route to host" (its ARP reply missing), which
/// `verbs::exchange::connect` takes as final. (Only the connection is
/// retried: a hello sent twice would count as the next queue pair's.)
fn connect_until(addr: SocketAddr, until: Deadline) -> Result<Session, ExchangeError> {
    loop {
        match connect(addr, until) {
            Err(_) if !until.passed() => thread::sleep(Duration::from_millis(100)),
            done => return done,
        }
    }
}

/// A barrier with every peer: one byte each way on every session, all
/// written before any is read (syncing the sessions one by one would
/// wait in a cycle: node 1 on node 2, 2 on 3, 3 on 1).
pub fn barrier(links: &mut [Link], what: &str) -> Result<(), String> {
    let fail = |(peer, k): (usize, usize), e: &dyn std::fmt::Display| {
        format!("{what}: node {peer} queue pair {k}: {e}")
    };
    for l in links.iter_mut() {
        let at = (l.peer, l.k);
        l.session
            .stream_mut()
            .write_all(&[SYNC_BYTE])
            .map_err(|e| fail(at, &e))?;
    }
    for l in links.iter_mut() {
        let at = (l.peer, l.k);
        let stream = l.session.stream_mut();
        stream
            .set_read_timeout(Some(EXCHANGE_BUDGET))
            .map_err(|e| fail(at, &e))?;
        let mut byte = [0u8];
        stream.read_exact(&mut byte).map_err(|e| fail(at, &e))?;
        if byte[0] != SYNC_BYTE {
            return Err(fail(at, &format!("byte {:#x}, not the sync byte", byte[0])));
        }
    }
    Ok(())
}
