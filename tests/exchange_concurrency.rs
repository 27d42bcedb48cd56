//! The exchange server under many clients at once (issue 23 §3): it
//! serves many handshakes concurrently, never reads more hellos at once
//! than `max_pending` (one thread each), and a client that connects and
//! then stalls its handshake holds up nobody. Host only, over loopback.
#![cfg(feature = "std")]

use std::io::{ErrorKind, Read};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use verbs::endpoint::{Endpoint, Mtu};
use verbs::exchange::{connect_and_exchange, Server, ServerConfig};
use verbs::gid::Gid;
use verbs::time::Deadline;

/// Clients that handshake at once.
const CLIENTS: u32 = 50;

fn endpoint(qpn: u32) -> Endpoint {
    Endpoint {
        qpn,
        psn: qpn ^ 0x5a5a,
        lid: 0,
        gid: Gid::from_ipv4([127, 0, 0, 1]),
        mtu: Mtu::MTU_1024,
        regions: Vec::new(),
    }
}

fn after(d: Duration) -> Deadline {
    Deadline::after(d)
}

/// Connects and sends nothing; waits until the server has it pending.
fn stalled_client(server: &Server) -> TcpStream {
    let before = server.pending();
    let s = TcpStream::connect(server.local_addr()).unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    while server.pending() <= before {
        assert!(
            Instant::now() < until,
            "the stalled client is never pending"
        );
        thread::sleep(Duration::from_millis(5));
    }
    s
}

/// True while the server has neither answered nor closed `s`.
fn still_waiting(s: &mut TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    matches!(s.read(&mut [0u8; 16]), Err(e) if e.kind() == ErrorKind::WouldBlock)
}

/// Starts `CLIENTS` client threads together, each retrying (a refused or
/// evicted client tries again) until it has the server's endpoint or
/// `budget` passes; returns each one's time to be served and its tries.
fn clients(addr: SocketAddr, budget: Duration) -> Vec<thread::JoinHandle<(Duration, u32)>> {
    let go = Arc::new(Barrier::new(CLIENTS as usize));
    (0..CLIENTS)
        .map(|i| {
            let go = go.clone();
            thread::spawn(move || {
                go.wait();
                let started = Instant::now();
                let until = after(budget);
                for tries in 1.. {
                    match connect_and_exchange(addr, &endpoint(100 + i), None, until) {
                        Ok((_, theirs)) => {
                            assert_eq!(theirs, endpoint(0x11));
                            return (started.elapsed(), tries);
                        }
                        Err(e) if !until.passed() => {
                            let _ = e;
                            thread::sleep(Duration::from_millis(10));
                        }
                        Err(e) => panic!("client {i} never served: {e}"),
                    }
                }
                unreachable!()
            })
        })
        .collect()
}

/// Answers `CLIENTS` distinct clients, each once.
fn serve_all(server: &Server) {
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < CLIENTS as usize {
        let hs = server.next_client(after(Duration::from_secs(10))).unwrap();
        let qpn = hs.peer_endpoint().qpn;
        assert!((100..100 + CLIENTS).contains(&qpn), "qpn {qpn}");
        hs.reply(&endpoint(0x11)).unwrap();
        seen.insert(qpn);
    }
}

#[test]
fn a_stalled_client_does_not_hold_up_fifty_others() {
    let config = ServerConfig {
        // Longer than the whole test: the stalled client stays stalled.
        hello_timeout: Duration::from_secs(30),
        client_timeout: Duration::from_secs(30),
        ..ServerConfig::default()
    };
    let server = Server::bind("127.0.0.1:0", config, |_, _| {}).unwrap();
    let mut stalled = stalled_client(&server);
    let started = Instant::now();
    let running = clients(server.local_addr(), Duration::from_secs(5));
    serve_all(&server);
    let mut slowest = Duration::ZERO;
    for c in running {
        let (took, tries) = c.join().unwrap();
        assert_eq!(
            tries, 1,
            "no client refused: {CLIENTS} fit max_pending (64)"
        );
        slowest = slowest.max(took);
    }
    let all = started.elapsed();
    // Every client was served (each within its 5 s) while the stalled one
    // still waits: it held none of them up.
    assert!(
        still_waiting(&mut stalled),
        "the stalled client is still pending, unanswered"
    );
    assert_eq!(
        server.pending(),
        1,
        "only the stalled client's hello is pending"
    );
    println!("{CLIENTS} clients served in {all:?} (slowest {slowest:?}) beside a stalled client");
}

#[test]
fn hellos_read_at_once_never_exceed_max_pending_and_stalled_clients_make_room() {
    const MAX_PENDING: usize = 8;
    let evicted = Arc::new(AtomicUsize::new(0));
    let counted = evicted.clone();
    let config = ServerConfig {
        hello_timeout: Duration::from_secs(30),
        client_timeout: Duration::from_secs(30),
        max_pending: MAX_PENDING,
        ..ServerConfig::default()
    };
    let server = Server::bind("127.0.0.1:0", config, move |_, e| {
        if format!("{e:?}").starts_with("Evicted") {
            counted.fetch_add(1, Ordering::Relaxed);
        }
    })
    .unwrap();
    let server = Arc::new(server);
    // Stalled clients fill every place: each client now pushes one out.
    let mut stalled: Vec<TcpStream> = (0..MAX_PENDING).map(|_| stalled_client(&server)).collect();

    // Samples the hellos in progress while the clients run.
    let done = Arc::new(AtomicBool::new(false));
    let monitor = {
        let (server, done) = (server.clone(), done.clone());
        thread::spawn(move || {
            let mut most = 0;
            while !done.load(Ordering::Relaxed) {
                most = most.max(server.pending());
                thread::sleep(Duration::from_micros(200));
            }
            most
        })
    };
    let started = Instant::now();
    let running = clients(server.local_addr(), Duration::from_secs(10));
    serve_all(&server);
    let tries: u32 = running.into_iter().map(|c| c.join().unwrap().1).sum();
    let all = started.elapsed();
    done.store(true, Ordering::Relaxed);
    let most = monitor.join().unwrap();

    assert!(
        most <= MAX_PENDING,
        "{most} hellos read at once, max_pending {MAX_PENDING}"
    );
    // The stalled clients were the oldest pending hellos, so they were
    // pushed out first, oldest first (as many as the burst needed room).
    let waiting: Vec<bool> = stalled.iter_mut().map(still_waiting).collect();
    assert!(!waiting[0], "the oldest stalled client was evicted");
    assert!(
        waiting.windows(2).all(|w| w[1] || !w[0]),
        "stalled clients evicted oldest first: {waiting:?}"
    );
    assert!(evicted.load(Ordering::Relaxed) >= 1);
    println!(
        "{CLIENTS} clients served in {all:?}, {tries} tries, at most {most} hellos pending \
         (max_pending {MAX_PENDING}), {} evicted",
        evicted.load(Ordering::Relaxed)
    );
}
