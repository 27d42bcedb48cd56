//! The endpoint exchange over loopback: the client speaks first and a
//! refused client learns nothing; deadlines; any stream under a session;
//! the primer's format byte for byte. No RDMA hardware involved.
#![cfg(feature = "std")]

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use verbs::endpoint::{Endpoint, Mtu, RemoteRegion};
use verbs::exchange::{
    connect, connect_and_exchange, ExchangeError, Listener, Session, Timeouts, TutorialSide,
};
use verbs::gid::Gid;
use verbs::time::Deadline;
use verbs::wire::tutorial::{ConnInfo, CONN_INFO_LEN};
use verbs::wire::{self, Message, Token, WireError};

/// Scheduling noise allowed past a deadline before calling it overrun.
const SLACK: Duration = Duration::from_millis(300);

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

/// Asserts that a call begun at `start` with a deadline `budget` later
/// returned at that deadline: not early, not much later.
fn assert_ended_at(start: Instant, budget: Duration) {
    let took = start.elapsed();
    assert!(
        took >= budget,
        "returned after {took:?}, before the deadline"
    );
    assert!(took <= budget + SLACK, "overran the deadline: {took:?}");
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
fn a_client_without_the_token_gets_nothing() {
    let listener = Listener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    for (presented, hello) in [(true, Some(Token::new(b"guess").unwrap())), (false, None)] {
        let client = thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(&hello_bytes(2, hello)).unwrap();
            received_until_closed(&mut s)
        });
        let err = listener
            .accept(ms(5000))
            .unwrap()
            .read_hello(Some(&token()), ms(5000))
            .unwrap_err();
        assert!(
            matches!(err, ExchangeError::BadToken { presented: p } if p == presented),
            "{err}"
        );
        assert_eq!(client.join().unwrap(), 0, "a refused client was sent bytes");
    }
    let client = thread::spawn(move || connect_and_exchange(addr, &endpoint(2, 1), None, ms(5000)));
    drop(
        listener
            .accept(ms(5000))
            .unwrap()
            .read_hello(Some(&token()), ms(5000)),
    );
    assert!(matches!(
        client.join().unwrap(),
        Err(ExchangeError::NoReply)
    ));
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
}
