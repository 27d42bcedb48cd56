//! The endpoint exchange over loopback: one server facing every hostile
//! client the audit tried, each followed by a legitimate client served by
//! the same server; a refused client learns nothing; deadlines; any
//! stream under a session; the primer's format byte for byte. No RDMA
//! hardware involved.
#![cfg(feature = "std")]

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc::{self, Receiver};
use std::thread;
use std::time::{Duration, Instant};

use verbs::device::LinkLayer;
use verbs::endpoint::{Endpoint, EndpointError, Mtu, RemoteRegion};
use verbs::exchange::{
    connect, connect_and_exchange, ExchangeError, Listener, Server, ServerConfig, Session,
    Timeouts, TutorialSide,
};
use verbs::gid::Gid;
use verbs::time::Deadline;
use verbs::wire::tutorial::{ConnInfo, CONN_INFO_LEN};
use verbs::wire::{self, Message, Token, WireError};

/// How far past its deadline a call may return and still count as bounded
/// by it: generous, since a busy machine can keep a thread off the CPU
/// for a long while. It tells a call that honours its deadline from one
/// that waits for something else (a stage's longer timeout, or forever).
fn overrun_allowed(deadline: Duration) -> Duration {
    deadline * 10
}

/// The test server's hello stage: short, so the attacks that wait it
/// out keep the suite fast.
const HELLO_TIMEOUT: Duration = Duration::from_millis(500);

/// The test server's whole allowance per client.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);

fn endpoint(qpn: u32, regions: usize) -> Endpoint {
    Endpoint {
        qpn,
        psn: qpn ^ 0x5a5a,
        lid: 0,
        gid: Gid::from_ipv4([127, 0, 0, 1]),
        mtu: Mtu::MTU_1024,
        regions: (0..regions as u64)
            .map(|i| RemoteRegion {
                addr: 0x7f00_0000_0000 + i * 0x1000,
                len: 0x1000,
                rkey: 0x100 + i as u32,
            })
            .collect(),
    }
}

fn ms(n: u64) -> Deadline {
    Deadline::after(Duration::from_millis(n))
}

fn token() -> Token {
    Token::new(b"0123456789abcdef-shared").unwrap()
}

/// The server's endpoint: what only accepted clients may learn.
fn server_endpoint() -> Endpoint {
    endpoint(0x11, 2)
}

/// A hello's bytes, for clients that then tamper with them.
fn hello_bytes(qpn: u32, token: Option<Token>) -> Vec<u8> {
    wire::encode(&Message::hello(endpoint(qpn, 1), token)).unwrap()
}

/// One [`Server`] for a whole scenario. Every client it refuses arrives
/// on `refused` with the error's `Debug` (to check the variant) and
/// `Display` (the one-line log).
struct TestServer {
    server: Server,
    addr: SocketAddr,
    refused: Receiver<(SocketAddr, String, String)>,
    stash: HashMap<SocketAddr, (String, String)>,
}

impl TestServer {
    fn start(config: ServerConfig) -> TestServer {
        let (refused_tx, refused) = mpsc::channel();
        let report = move |peer, e: &ExchangeError| {
            let _ = refused_tx.send((peer, format!("{e:?}"), e.to_string()));
        };
        let server = Server::bind("127.0.0.1:0", config, report).unwrap();
        TestServer {
            addr: server.local_addr(),
            server,
            refused,
            stash: HashMap::new(),
        }
    }

    /// Why the server refused the client at `client` (its local address),
    /// as (`Debug`, `Display`), waiting up to 5 s.
    fn refusal_of(&mut self, client: SocketAddr) -> (String, String) {
        let until = Instant::now() + Duration::from_secs(5);
        while !self.stash.contains_key(&client) {
            let left = until.saturating_duration_since(Instant::now());
            match self.refused.recv_timeout(left) {
                Ok((peer, debug, display)) => {
                    self.stash.insert(peer, (debug, display));
                }
                Err(_) => panic!("the server never reported {client}"),
            }
        }
        self.stash.remove(&client).unwrap()
    }

    /// A legitimate client (`qpn`, with the right token) is served by the
    /// same server within its deadlines: each side gets the other's
    /// endpoint, and the session works as a control channel.
    fn serves_a_legit_client(&mut self, qpn: u32) {
        self.serves(endpoint(qpn, 1));
    }

    /// A client presenting `ours` (and the right token) is served: each
    /// side gets the other's endpoint, and the session works as a
    /// control channel.
    fn serves(&mut self, ours: Endpoint) {
        let addr = self.addr;
        let sent = ours.clone();
        let client = thread::spawn(move || {
            let (mut session, theirs) =
                connect_and_exchange(addr, &sent, Some(&token()), ms(5000)).unwrap();
            session.sync(ms(5000)).unwrap();
            theirs
        });
        let hs = self.server.next_client(ms(5000)).unwrap();
        assert_eq!(hs.peer_endpoint(), &ours);
        let mut session = hs.reply(&server_endpoint()).unwrap();
        session.sync(ms(5000)).unwrap();
        assert_eq!(client.join().unwrap(), server_endpoint());
    }
}

/// Connects, sends `bytes` (then, if `close`, half-closes), and reads
/// until the server hangs up. Returns our address and how many bytes the
/// server sent (a refused client must get none).
fn attack(addr: SocketAddr, bytes: &[u8], close: bool) -> (SocketAddr, usize) {
    let mut s = TcpStream::connect(addr).unwrap();
    let me = s.local_addr().unwrap();
    let _ = s.write_all(bytes);
    if close {
        let _ = s.shutdown(Shutdown::Write);
    }
    (me, received_until_closed(&mut s))
}

/// Bytes the peer sends before closing (a reset counts as a close).
fn received_until_closed(s: &mut TcpStream) -> usize {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = Vec::new();
    match s.read_to_end(&mut got) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("the server neither closed nor reset: {e}"),
    }
    got.len()
}

/// Runs `attack`, checks the client got nothing and the server's report
/// starts with `debug` (the error's `Debug`) and says `log` on one line.
fn refused(srv: &mut TestServer, bytes: &[u8], close: bool, debug: &str, log: &str) {
    let (me, got) = attack(srv.addr, bytes, close);
    assert_eq!(got, 0, "a refused client was sent {got} bytes");
    let (was, said) = srv.refusal_of(me);
    assert!(was.starts_with(debug), "wanted {debug}, got {was}");
    assert!(said.contains(log) && !said.contains('\n'), "{said}");
}

#[test]
fn one_server_survives_every_attack() {
    let mut srv = TestServer::start(ServerConfig {
        token: Some(token()),
        hello_timeout: HELLO_TIMEOUT,
        client_timeout: CLIENT_TIMEOUT,
        max_pending: 64,
        ..ServerConfig::default()
    });
    srv.serves_a_legit_client(2);

    let hello = hello_bytes(7, Some(token()));
    let edit = |at: usize, with: &[u8]| {
        let mut h = hello.clone();
        h[at..at + with.len()].copy_from_slice(with);
        h
    };
    // QPN 0 and 1 patched in after encoding (which refuses them).
    let qpn_at = wire::HEADER_LEN + token().as_bytes().len();
    let wrong = Token::new(b"0123456789abcdef-sharee").unwrap();
    // Claims refused from the header alone: the client keeps its side
    // open, so the server must not wait for a body.
    let header = |count: u16, body_len: u32| {
        let mut h = b"VRBS\x00\x02\x01\x00".to_vec();
        h.extend_from_slice(&count.to_be_bytes());
        h.extend_from_slice(&body_len.to_be_bytes());
        h
    };
    let truncated = format!(
        "PeerClosed {{ during: \"read hello body\", got: 6, needed: {} }}",
        hello.len() - wire::HEADER_LEN
    );
    #[rustfmt::skip]
    let attacks: Vec<(Vec<u8>, bool, &str, &str)> = vec![
        // (bytes, half-close after, Debug starts with, Display says)
        ((0..32u8).map(|i| i.wrapping_mul(37) ^ 0xa5).collect(), false, "Decode(BadMagic(", "bad magic"),
        (edit(3, b"X"), false, "Decode(BadMagic(1448231512))", "(VRBX)"),
        (edit(4, &1u16.to_be_bytes()), false, "Decode(BadVersion(1))", "version 1"),
        (hello[..20].to_vec(), true, &truncated, "after 6 of"),
        (vec![], true, "PeerClosed { during: \"read hello header\", got: 0", "without sending anything"),
        (b"GET / HTTP/1.0\r\n\r\n".to_vec(), false, "Decode(BadMagic(", "(GET )"),
        (wire::encode(&Message::reply(endpoint(9, 1))).unwrap(), false, "Decode(Inconsistent(", "a reply where a hello"),
        (hello_bytes(10, Some(wrong)), false, "BadToken { presented: true }", "token is wrong"),
        (hello_bytes(10, None), false, "BadToken { presented: false }", "no token"),
        (edit(qpn_at, &0u32.to_be_bytes()), false, "Decode(ReservedQpn(0))", "qpn 0 is reserved"),
        (edit(qpn_at, &1u32.to_be_bytes()), false, "Decode(ReservedQpn(1))", "qpn 1 is reserved"),
        // The multicast QPN: no reliable-connected queue pair has it.
        (edit(qpn_at, &0xff_ffffu32.to_be_bytes()), false, "Decode(ReservedQpn(16777215))", "is multicast"),
        (header(65, 28 + 20 * 65), false, "Decode(Inconsistent(", "region count above"),
        (header(1, u32::MAX), false, "Decode(Oversized {", "too large"),
    ];
    // Each refusal names its cause, not the hello timeout: the server did
    // not wait it out.
    for (i, (bytes, close, debug, log)) in attacks.iter().enumerate() {
        refused(&mut srv, bytes, *close, debug, log);
        srv.serves_a_legit_client(20 + i as u32);
    }

    // A client holding the wrong token or none learns only that it was refused.
    for token in [Some(&wrong), None] {
        let err = connect_and_exchange(srv.addr, &endpoint(10, 1), token, ms(5000));
        assert!(matches!(err, Err(ExchangeError::NoReply)), "{err:?}");
    }
    srv.serves_a_legit_client(10);

    silent_and_trickling_clients_are_cut_at_the_hello_timeout(&mut srv);
    a_flood_of_silent_connections_does_not_lock_out_a_client(&mut srv);
}

fn silent_and_trickling_clients_are_cut_at_the_hello_timeout(srv: &mut TestServer) {
    let mut silent = TcpStream::connect(srv.addr).unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let connected = Instant::now();
    // Served while the silent one is still pending.
    srv.serves_a_legit_client(13);
    assert_eq!(received_until_closed(&mut silent), 0);
    // Cut by the hello's deadline: not before it, and before the next
    // deadline that could have cut it (the client's whole allowance).
    let held = connected.elapsed();
    assert!(
        held >= HELLO_TIMEOUT - Duration::from_millis(50) && held < CLIENT_TIMEOUT,
        "the silent client was held {held:?}"
    );
    let (debug, _) = srv.refusal_of(silent_addr);
    assert_eq!(debug, "TimedOut { during: \"read hello header\" }");

    // A valid hello, one byte per 100 ms: every read makes progress, so
    // only the stage deadline stops it.
    let hello = hello_bytes(14, Some(token()));
    let addr = srv.addr;
    let trickler = thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        let me = s.local_addr().unwrap();
        let started = Instant::now();
        // The read paces the drip and notices the server hanging up.
        s.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let (mut received, mut sent) = (0, 0);
        for byte in &hello {
            if s.write_all(&[*byte]).is_err() {
                break;
            }
            sent += 1;
            match s.read(&mut [0u8; 64]) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Ok(n) if n > 0 => received += n,
                _ => break,
            }
        }
        (me, started.elapsed(), received, sent, hello.len())
    });
    srv.serves_a_legit_client(15);
    let (me, held, received, sent, len) = trickler.join().unwrap();
    assert_eq!(received, 0);
    // The drip takes at least 100 ms a byte: cut before its end, it was cut
    // by the stage's deadline, not by a read's.
    assert!(
        sent < len,
        "the trickler sent all {len} bytes of its hello (held {held:?})"
    );
    let (debug, _) = srv.refusal_of(me);
    assert!(
        debug.starts_with("TimedOut { during: \"read hello"),
        "{debug}"
    );
    srv.serves_a_legit_client(16);
}

fn a_flood_of_silent_connections_does_not_lock_out_a_client(srv: &mut TestServer) {
    let flood: Vec<TcpStream> = (0..200)
        .map(|_| TcpStream::connect(srv.addr).unwrap())
        .collect();
    let started = Instant::now();
    srv.serves_a_legit_client(17);
    let pending = srv.server.pending();
    assert!(pending <= 64, "{pending} pending");
    // Each is evicted (64 pending at most) or times out, is reported
    // once, and gets nothing. The bound allows for a connection the
    // kernel held unaccepted until its SYN-ACK was resent (1 s), which a
    // burst on a starved machine can cause before the acceptor drains it.
    let mut evicted = 0;
    for mut s in flood {
        assert_eq!(received_until_closed(&mut s), 0);
        let (debug, _) = srv.refusal_of(s.local_addr().unwrap());
        match debug.as_str() {
            "Evicted { max_pending: 64 }" => evicted += 1,
            "TimedOut { during: \"read hello header\" }" => {}
            other => panic!("a silent client refused as {other}"),
        }
    }
    println!(
        "the flood was resolved {:?} after it began",
        started.elapsed()
    );
    assert!(evicted > 0, "200 connections and none evicted");
    srv.serves_a_legit_client(18);
}

/// Endpoints a server must refuse, each with the reason it must give.
type Refusals = Vec<(Endpoint, EndpointError)>;

/// A server refuses, before revealing anything, what no queue pair on its
/// port can reach: on RoCE a zero GID, on InfiniBand a LID that is not
/// unicast (a zero GID with a unicast LID is the usual InfiniBand
/// endpoint), and on a port it was not told of, an endpoint with neither
/// a GID nor a LID. Each refused client gets nothing; a valid one is
/// served after it.
#[test]
fn a_server_refuses_what_its_port_cannot_address() {
    let at = |qpn: u32, lid: u16, gid: Gid| Endpoint {
        lid,
        gid,
        ..endpoint(qpn, 1)
    };
    let v4 = Gid::from_ipv4([10, 0, 0, 2]);
    #[rustfmt::skip]
    let ports: [(Option<LinkLayer>, Refusals, Vec<Endpoint>); 3] = [
        (Some(LinkLayer::ETHERNET),
         vec![(at(30, 0, Gid::ZERO), EndpointError::ZeroGid),
              (at(31, 7, Gid::ZERO), EndpointError::ZeroGid)],
         vec![at(32, 0, v4)]),
        (Some(LinkLayer::INFINIBAND),
         vec![(at(40, 0, v4), EndpointError::NotUnicastLid(0)),
              (at(41, 0xc000, Gid::ZERO), EndpointError::NotUnicastLid(0xc000)),
              (at(42, 0xffff, v4), EndpointError::NotUnicastLid(0xffff))],
         vec![at(43, 5, Gid::ZERO), at(44, 0xbfff, v4)]),
        (None,
         vec![(at(50, 0, Gid::ZERO), EndpointError::NoAddress)],
         vec![at(51, 7, Gid::ZERO), at(52, 0, v4)]),
    ];
    for (link_layer, refused_eps, served) in ports {
        let mut srv = TestServer::start(ServerConfig {
            token: Some(token()),
            link_layer,
            ..ServerConfig::default()
        });
        for (ep, why) in refused_eps {
            let hello = wire::encode(&Message::hello(ep, Some(token()))).unwrap();
            let debug = format!("Unaddressable({why:?})");
            refused(
                &mut srv,
                &hello,
                false,
                &debug,
                "no queue pair on this port can reach",
            );
        }
        for ep in served {
            srv.serves(ep);
        }
    }
}

/// What a client sends after its hello rides with it: the server reads
/// it from the handshake before it replies (here: how much the client
/// asks for), and the client reads the reply afterwards.
#[test]
fn a_request_rides_with_the_hello_and_is_read_before_the_reply() {
    let srv = TestServer::start(ServerConfig::default());
    let addr = srv.addr;
    let client = thread::spawn(move || {
        let mut session = connect(addr, ms(5000)).unwrap();
        session
            .send_hello(&endpoint(0x21, 0), None, ms(5000))
            .unwrap();
        session
            .stream_mut()
            .write_all(&64u32.to_be_bytes())
            .unwrap();
        session.read_reply(ms(5000)).unwrap()
    });
    let mut hs = srv.server.next_client(ms(5000)).unwrap();
    let mut asked = [0u8; 4];
    let left = hs.expires().remaining().max(Duration::from_millis(1));
    let stream = hs.session_mut().stream_mut();
    stream.set_read_timeout(Some(left)).unwrap();
    stream.read_exact(&mut asked).unwrap();
    assert_eq!(u32::from_be_bytes(asked), 64);
    hs.reply(&server_endpoint()).unwrap();
    assert_eq!(client.join().unwrap(), server_endpoint());
}

/// Asserts that a call begun at `start` with a deadline `budget` later
/// returned at that deadline: not before it, and bounded by it.
fn assert_ended_at(start: Instant, budget: Duration) {
    let took = start.elapsed();
    assert!(
        took >= budget,
        "returned after {took:?}, before the deadline"
    );
    assert!(
        took <= budget + overrun_allowed(budget),
        "not bounded by its deadline of {budget:?}: {took:?}"
    );
}

#[test]
fn tutorial_wire_interoperates_both_ways_byte_exactly() {
    let info = |qpn| {
        let mut ep = endpoint(qpn, 1);
        ep.psn = 0;
        ConnInfo::from_endpoint(&ep).unwrap()
    };
    let (ours, theirs) = (info(0x55), info(0x66));

    // Our server against what the primer's client.c does: read 36, write 36.
    let listener = Listener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let c_client = thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        let mut got = [0u8; CONN_INFO_LEN];
        s.read_exact(&mut got).unwrap();
        s.write_all(&theirs.to_bytes()).unwrap();
        got
    });
    let mut session = listener.accept(ms(5000)).unwrap();
    let got = session
        .exchange_tutorial(&ours, TutorialSide::Server, ms(5000))
        .unwrap();
    assert_eq!(got, theirs);
    assert_eq!(c_client.join().unwrap(), ours.to_bytes());

    // Our client against what the primer's server.c does: write 36, read 36.
    let c_server = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = c_server.local_addr().unwrap();
    let c_server = thread::spawn(move || {
        let (mut s, _) = c_server.accept().unwrap();
        s.write_all(&theirs.to_bytes()).unwrap();
        let mut got = [0u8; CONN_INFO_LEN];
        s.read_exact(&mut got).unwrap();
        got
    });
    let mut session = connect(addr, ms(5000)).unwrap();
    let got = session
        .exchange_tutorial(&ours, TutorialSide::Client, ms(5000))
        .unwrap();
    assert_eq!(got, theirs);
    assert_eq!(c_server.join().unwrap(), ours.to_bytes());
}

#[test]
fn client_may_start_before_the_server() {
    let addr = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let client = thread::spawn(move || {
        connect_and_exchange(addr, &endpoint(0x99, 1), None, ms(5000)).unwrap()
    });
    // Deliberately late, so the client is refused at least once first.
    thread::sleep(Duration::from_millis(150));
    let listener = Listener::bind(addr).unwrap();
    let session = listener.accept(ms(5000)).unwrap();
    let hs = session.read_hello(None, ms(5000)).unwrap();
    assert_eq!(hs.peer_endpoint(), &endpoint(0x99, 1));
    assert_eq!(hs.peer_addr().map(|a| a.ip()), Some(addr.ip()));
    let _session = hs.reply(&server_endpoint()).unwrap();
    let (_, theirs) = client.join().unwrap();
    assert_eq!(theirs, server_endpoint());
}

#[test]
fn deadlines_bound_both_ends() {
    // Nobody listening: the last refusal, at the deadline.
    let addr = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let start = Instant::now();
    let err = connect(addr, ms(300)).unwrap_err();
    assert_eq!(err.kind(), Some(io::ErrorKind::ConnectionRefused), "{err}");
    assert_ended_at(start, Duration::from_millis(300));

    // A server that accepts and never answers.
    let mute = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = mute.local_addr().unwrap();
    let start = Instant::now();
    let err = connect_and_exchange(addr, &endpoint(2, 1), None, ms(400)).unwrap_err();
    assert!(
        matches!(
            err,
            ExchangeError::TimedOut {
                during: "read reply header"
            }
        ),
        "{err}"
    );
    assert_ended_at(start, Duration::from_millis(400));

    // A server no client comes to.
    let server = Server::bind("127.0.0.1:0", ServerConfig::default(), |_, _| {}).unwrap();
    let start = Instant::now();
    let err = server.next_client(ms(300)).unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert_ended_at(start, Duration::from_millis(300));

    // Dropping the server frees its port at once.
    let addr = server.local_addr();
    drop(server);
    Server::bind(addr, ServerConfig::default(), |_, _| {}).unwrap();
}

#[test]
fn client_refuses_a_server_that_answers_with_a_hello() {
    let fake = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = fake.local_addr().unwrap();
    let server = thread::spawn(move || {
        let (mut s, _) = fake.accept().unwrap();
        s.write_all(&hello_bytes(3, None)).unwrap();
        received_until_closed(&mut s)
    });
    let err = connect_and_exchange(addr, &endpoint(2, 1), None, ms(5000)).unwrap_err();
    assert!(
        err.to_string().contains("a hello where a reply was due"),
        "{err}"
    );
    server.join().unwrap();
}

/// A stand-in for a TLS stream: the session sees only Read + Write and
/// bounds its calls through the socket underneath.
struct Layered(TcpStream);

impl Read for Layered {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for Layered {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl Timeouts for Layered {
    fn limit_reads(&mut self, limit: Option<Duration>) -> io::Result<()> {
        self.0.set_read_timeout(limit)
    }
    fn limit_writes(&mut self, limit: Option<Duration>) -> io::Result<()> {
        self.0.set_write_timeout(limit)
    }
}

#[test]
fn session_over_a_layered_stream() {
    let listener = Listener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let client = thread::spawn(move || {
        let mut session = Session::new(Layered(TcpStream::connect(addr).unwrap()));
        let mut theirs = Vec::new();
        for qpn in [0x21, 0x22] {
            let ours = endpoint(qpn, 3);
            theirs.push(
                session
                    .client_exchange(&ours, Some(&token()), ms(5000))
                    .unwrap(),
            );
        }
        session.sync(ms(5000)).unwrap();
        // The server now stays silent: our deadline still holds.
        let start = Instant::now();
        let err = session.sync(ms(300)).unwrap_err();
        assert!(err.is_timeout(), "{err}");
        assert_ended_at(start, Duration::from_millis(300));
        theirs
    });
    let stream = listener.accept(ms(5000)).unwrap().into_stream();
    let hs = Session::new(Layered(stream))
        .read_hello(Some(&token()), ms(5000))
        .unwrap();
    assert_eq!(hs.peer_endpoint(), &endpoint(0x21, 3));
    assert_eq!(hs.peer_addr(), None, "a layered session knows no address");
    let mut session = hs.reply(&server_endpoint()).unwrap();
    // A second endpoint on the same session, as for a second queue pair.
    let second = session
        .server_exchange(&endpoint(0x12, 0), Some(&token()), ms(5000))
        .unwrap();
    assert_eq!(second, endpoint(0x22, 3));
    session.sync(ms(5000)).unwrap();
    let theirs = client.join().unwrap();
    assert_eq!(theirs, [server_endpoint(), endpoint(0x12, 0)]);
}

#[test]
fn sync_rejects_a_wrong_byte() {
    let listener = Listener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let peer = thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"X").unwrap();
        received_until_closed(&mut s)
    });
    let mut session = listener.accept(ms(5000)).unwrap();
    let err = session.sync(ms(5000)).unwrap_err();
    assert!(
        matches!(err, ExchangeError::Decode(WireError::Inconsistent(_))),
        "{err}"
    );
    drop(session);
    assert_eq!(peer.join().unwrap(), 1, "our own sync byte");
}

#[test]
fn errors_convert_to_io_errors() {
    let e: io::Error = ExchangeError::TimedOut {
        during: "read hello header",
    }
    .into();
    assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    assert!(e.to_string().contains("read hello header"));
    let e: io::Error = ExchangeError::Decode(WireError::BadVersion(3)).into();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    let e: io::Error = ExchangeError::BadToken { presented: true }.into();
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
    let e: io::Error = ExchangeError::Unaddressable(EndpointError::ZeroGid).into();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    assert!(e.to_string().contains("gid is zero"), "{e}");
}
