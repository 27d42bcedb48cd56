//! End-to-end tests of `examples/hello_write`: the example binary itself,
//! run as a user would, in one process (loopback) and against an independent
//! C implementation of the primer's programs (tests/fixtures/tutorial_peer.c)
//! in both roles, over the primer's 36-byte wire format, and as a server
//! that keeps serving after hostile clients; and `examples/transfer`'s
//! server under the same kind of probes (its front door).
//!
//! The example binaries are those `cargo test` (without a target filter) or
//! `cargo build --examples` leaves in `target/<profile>/examples`;
//! this test only runs them. The C peer is compiled with `cc ... -libverbs`
//! into a directory under /tmp when a test needs it.

#[path = "support/children.rs"]
mod children;
mod support;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use children::{finish, require_line, require_success, Running, CHILD_LIMIT, POLL};

use verbs::exchange::{self, Session};
use verbs::wire::tutorial::{ConnInfo, CONN_INFO_LEN};
use verbs::{Deadline, Endpoint, Gid, Mtu, RemoteRegion};

const BEFORE: &[&str] = &["[server] before:  '(initial server memory)'"];
/// The server, only sleeping, printing what the client wrote into its memory.
const WATCHED: &[&str] = &["[server] t=", ": 'Hello, RDMA from client at PID "];
const AFTER: &[&str] = &["[server] after:   'Hello, RDMA from client at PID "];
const READ_BACK: &[&str] = &["[client] RDMA Read got: 'Hello, RDMA from client at PID "];

/// The device under test and the GID index the crate chooses on it (what
/// hello_write will use), for the C peer.
fn device_and_gid(test: &str) -> (String, u32) {
    let ctx = support::test_context(test);
    let table = ctx.gid_table(1).expect("read port 1's GID table");
    let index = verbs::device::choose_gid_index(&table)
        .unwrap_or_else(|| panic!("no usable GID on {}: {table:?}", ctx.name()));
    (ctx.name().to_string(), index)
}

/// What a plausible client on the device under test presents: its GID
/// (so the server's port can address it) and a QPN nobody has.
fn plausible_endpoint(test: &str, qpn: u32) -> Endpoint {
    let ctx = support::test_context(test);
    let table = ctx.gid_table(1).expect("read port 1's GID table");
    let gid: Gid = verbs::device::choose_gid(&table).expect("a usable GID").gid;
    Endpoint {
        qpn,
        psn: 0,
        lid: 0,
        gid,
        mtu: Mtu::MTU_1024,
        regions: vec![RemoteRegion {
            addr: 0x10_0000,
            len: 4096,
            rkey: 0x1234,
        }],
    }
}

/// Clients that present a valid hello and then stall, holding their
/// connections: on our wire one that never answers the server's first
/// sync, and one that answers it (the server then watches its memory for
/// a write that never comes) and never says it has read back; on the
/// primer's wire one that sends its `conn_info` and nothing more.
fn stalled_clients(addr: SocketAddr, wire: &[&str], ep: &Endpoint) -> Vec<Box<dyn Send>> {
    let deadline = || Deadline::after(Duration::from_secs(60));
    if wire.is_empty() {
        let mut held: Vec<Box<dyn Send>> = Vec::new();
        for syncs in [false, true] {
            let (mut session, _) = exchange::connect_and_exchange(addr, ep, None, deadline())
                .expect("a valid hello is answered");
            if syncs {
                session.sync(deadline()).expect("the server's first sync");
            }
            held.push(Box::new(session));
        }
        return held;
    }
    let mut session: Session = exchange::connect(addr, deadline()).expect("connect");
    let mut theirs = [0u8; CONN_INFO_LEN];
    let stream = session.stream_mut();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    stream
        .read_exact(&mut theirs)
        .expect("the server's conn_info");
    let ours = ConnInfo::from_endpoint(ep).expect("a valid conn_info");
    stream
        .write_all(&ours.to_bytes())
        .expect("send our conn_info");
    vec![Box::new(session)]
}

/// A directory under /tmp, removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Compiles the C peer; returns its directory (keep it alive) and binary.
fn build_peer(tag: &str) -> (TempDir, PathBuf) {
    let dir = PathBuf::from(format!(
        "/tmp/verbs-hello-write-{}-{tag}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    let dir = TempDir(dir);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tutorial_peer.c");
    let bin = dir.0.join("tutorial_peer");
    let cc = Running::spawn(
        "cc",
        Command::new("cc")
            .args(["-O2", "-Wall", "-o"])
            .arg(&bin)
            .arg(&src)
            .arg("-libverbs"),
    );
    let outcome = finish(vec![cc]);
    if !outcome[0].ok() || !outcome[0].stderr.is_empty() {
        require_success("compiling the C peer", &outcome);
    }
    (dir, bin)
}

/// A TCP port nobody listens on right now (the kernel's pick).
fn free_port() -> u16 {
    TcpListener::bind(("0.0.0.0", 0))
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral port")
        .port()
}

#[test]
fn loopback_in_one_process() {
    let (dev, _) = device_and_gid("hello_write loopback");
    let example = support::example("hello_write");
    let run = Running::spawn("hello_write", Command::new(&example).args(["--dev", &dev]));
    let outcomes = finish(vec![run]);
    require_success("hello_write (loopback)", &outcomes);
    let o = &outcomes[0];
    let what = "hello_write (loopback)";
    for needles in [BEFORE, WATCHED, AFTER, READ_BACK] {
        require_line(what, o, needles, &outcomes);
    }
}

/// The same story over rdma_cm (`--cm`): the connection manager resolves
/// the peer, the region travels in the accept's private data.
#[cfg(feature = "rdmacm")]
#[test]
fn loopback_over_rdma_cm() {
    let (dev, _) = device_and_gid("hello_write --cm loopback");
    let example = support::example("hello_write");
    let port = free_port().to_string();
    let run = Running::spawn(
        "hello_write --cm",
        Command::new(&example).args(["--cm", "--dev", &dev, "--port", &port]),
    );
    let outcomes = finish(vec![run]);
    require_success("hello_write --cm (loopback)", &outcomes);
    let what = "hello_write --cm (loopback)";
    // The same story as over TCP, so also what only the rdma_cm path prints:
    // its listener, and the region taken from the accept's private data.
    let over_cm: [&[&str]; 2] = [
        &["[main] loopback over rdma_cm on "],
        &["[client] peer addr=", "(from the accept's private data)"],
    ];
    for needles in [BEFORE, WATCHED, AFTER, READ_BACK]
        .into_iter()
        .chain(over_cm)
    {
        require_line(what, &outcomes[0], needles, &outcomes);
    }
}

/// Our client writes into the C server's memory (the primer's server.c role).
#[test]
fn our_client_against_c_server() {
    let (dev, gid) = device_and_gid("hello_write client vs C server");
    let example = support::example("hello_write");
    let (_dir, peer) = build_peer("server");
    let port = free_port().to_string();
    let server = Running::spawn(
        "C server",
        Command::new(&peer).args(["server", &dev, &gid.to_string(), &port]),
    );
    // The client retries until the server listens.
    let client = Running::spawn(
        "hello_write client",
        Command::new(&example).args([
            "client",
            "127.0.0.1",
            "--wire",
            "tutorial",
            "--port",
            &port,
            "--dev",
            &dev,
        ]),
    );
    let outcomes = finish(vec![server, client]);
    let what = "hello_write client vs tutorial_peer server";
    require_success(what, &outcomes);
    let (server, client) = (&outcomes[0], &outcomes[1]);
    for needles in [BEFORE, WATCHED, AFTER] {
        require_line(what, server, needles, &outcomes);
    }
    require_line(what, client, READ_BACK, &outcomes);
}

/// The C client (the primer's client.c role) writes into our server's memory.
#[test]
fn c_client_against_our_server() {
    let (dev, gid) = device_and_gid("C client vs hello_write server");
    let example = support::example("hello_write");
    let (_dir, peer) = build_peer("client");
    let port = free_port().to_string();
    let server = Running::spawn(
        "hello_write server",
        Command::new(&example).args([
            "server", "--once", "--wire", "tutorial", "--port", &port, "--dev", &dev,
        ]),
    );
    // The C client retries until the server listens.
    let client = Running::spawn(
        "C client",
        Command::new(&peer).args(["client", "127.0.0.1", &dev, &gid.to_string(), &port]),
    );
    let outcomes = finish(vec![server, client]);
    let what = "tutorial_peer client vs hello_write server";
    require_success(what, &outcomes);
    let (server, client) = (&outcomes[0], &outcomes[1]);
    for needles in [BEFORE, WATCHED, AFTER] {
        require_line(what, server, needles, &outcomes);
    }
    require_line(what, client, READ_BACK, &outcomes);
}

/// Connects to the server's port, retrying until it listens.
fn connect_when_listening(port: &str, server: &mut Running) -> TcpStream {
    let until = Instant::now() + CHILD_LIMIT;
    loop {
        if let Ok(s) = TcpStream::connect(format!("127.0.0.1:{port}")) {
            return s;
        }
        assert!(!server.exited(), "the server exited before it listened");
        assert!(Instant::now() < until, "the server never listened");
        std::thread::sleep(POLL);
    }
}

/// `hello_write server` (both wires) keeps serving: a port scan, garbage,
/// a health check and a client that connects and says nothing are
/// dropped, and two real clients after them (while the silent one, and
/// clients that sent a valid hello and then stalled, still hold their
/// connections) write into its memory and read back; the server is still
/// running at the end.
#[test]
fn our_server_survives_probes_and_serves_the_next_client() {
    let test = "hello_write server under probes";
    let (dev, _) = device_and_gid(test);
    let ep = plausible_endpoint(test, 0x4242);
    let example = support::example("hello_write");
    for wire in [&[][..], &["--wire", "tutorial"][..]] {
        let port = free_port().to_string();
        let what = format!("hello_write server {wire:?} under probes");
        let mut server = Running::spawn(
            "hello_write server",
            Command::new(&example)
                .args(["server", "--port", &port, "--dev", &dev])
                .args(wire),
        );
        // A port scan: connect, close.
        drop(connect_when_listening(&port, &mut server));
        // Garbage, then a health check.
        for probe in [&[0xffu8; 64][..], b"GET /health HTTP/1.0\r\n\r\n"] {
            let mut s = connect_when_listening(&port, &mut server);
            let _ = s.write_all(probe);
            let _ = s.shutdown(Shutdown::Write);
            let mut sink = Vec::new();
            let _ = s.read_to_end(&mut sink);
        }
        // Silent, held open while the real clients run.
        let silent = connect_when_listening(&port, &mut server);
        // Valid hellos, then nothing: also held while the real clients run,
        // each of whom must not wait its turn behind them.
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let stalled = stalled_clients(addr, wire, &ep);
        let mut outcomes = Vec::new();
        for i in 0..2 {
            let client = Running::spawn(
                &format!("hello_write client {i}"),
                Command::new(&example)
                    .args(["client", "127.0.0.1", "--port", &port, "--dev", &dev])
                    .args(wire),
            );
            outcomes.extend(finish(vec![client]));
        }
        drop(silent);
        drop(stalled);
        // The server prints what its memory holds 0.2 s into a client's
        // story; give the second client's line time to come out.
        std::thread::sleep(Duration::from_secs(2));
        assert!(!server.exited(), "{what}: the server exited");
        server.stop("the test is done with it");
        outcomes.push(server.outcome());
        let all: String = outcomes.iter().map(|o| o.to_string()).collect();
        for client in &outcomes[..2] {
            assert!(client.ok(), "{what}: {} failed\n{all}", client.name);
            require_line(&what, client, READ_BACK, &outcomes);
        }
        // The probes dropped with a line, and each client's message seen
        // in the server's memory.
        let server = &outcomes[2].stdout;
        let dropped = server
            .lines()
            .filter(|l| l.starts_with("[server] dropped "))
            .count();
        // At least the garbage and the health check (a port scan and a
        // silent client may still be pending, or end without a line).
        assert!(dropped >= 2, "{what}: probes dropped\n{all}");
        for client in &outcomes[..2] {
            let pid = client
                .stdout
                .split("client at PID ")
                .nth(1)
                .and_then(|r| r.split('!').next());
            let pid = pid.unwrap_or_else(|| panic!("{what}: no PID in {}\n{all}", client.name));
            let seen = format!("Hello, RDMA from client at PID {pid}!");
            assert!(
                server
                    .lines()
                    .any(|l| l.starts_with("[server] t=") && l.contains(&seen)),
                "{what}: the server never saw {}'s message\n{all}",
                client.name
            );
        }
    }
}

/// A frame of `examples/transfer`'s control protocol: a command byte and
/// two little-endian words.
fn transfer_frame(cmd: u8, a: u64, b: u64) -> Vec<u8> {
    let mut frame = vec![cmd];
    frame.extend_from_slice(&a.to_le_bytes());
    frame.extend_from_slice(&b.to_le_bytes());
    frame
}

/// A client's first hello to `examples/transfer`'s server with the setup
/// riding behind it: `mib` MiB on `planes` planes, one queue pair each,
/// written in 256 KiB chunks.
fn transfer_hello(ep: &Endpoint, mib: u64, planes: u64) -> Vec<u8> {
    let hello = verbs::wire::Message::hello(ep.clone(), None);
    let mut bytes = verbs::wire::encode(&hello).expect("a valid hello");
    bytes.extend(transfer_frame(b'S', mib << 20, planes << 32 | 1));
    bytes.extend(transfer_frame(b'S', 0, 256 << 10));
    bytes
}

/// Sends `bytes` to the server at `addr` and returns what it sent back
/// before it closed: nothing, from a front door that refused us.
fn refused_with_nothing(addr: SocketAddr, bytes: &[u8]) -> usize {
    let mut s = TcpStream::connect(addr).expect("connect");
    let _ = s.write_all(bytes);
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut got = Vec::new();
    match s.read_to_end(&mut got) {
        Ok(_) => got.len(),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => got.len(),
        Err(e) => panic!("the server neither answered nor closed: {e}"),
    }
}

/// `transfer server` is a front door: a port scan, garbage, a hello with
/// an all-zero GID, setups over its `--max-mib` or naming more planes
/// than it has, and a flood of silent connections are each dropped
/// without a byte of reply (nothing registered for them), while a client
/// that was admitted and stalls holds only its own slot; two real
/// transfers after them are served and verified, and the server is still
/// running at the end.
#[test]
fn transfer_server_survives_probes_and_serves_the_next_client() {
    let test = "transfer server under probes";
    let (dev, _) = device_and_gid(test);
    let ep = plausible_endpoint(test, 0x4343);
    let transfer = support::example("transfer");
    let port = free_port().to_string();
    let mut server = Running::spawn(
        "transfer server",
        Command::new(&transfer)
            .args(["server", "--port", &port, "--devs", &dev])
            .args(["--max-mib", "8", "--max-clients", "2"]),
    );
    drop(connect_when_listening(&port, &mut server)); // a port scan
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let zero_gid = Endpoint {
        gid: Gid::ZERO,
        ..ep.clone()
    };
    #[rustfmt::skip]
    let probes: [(&str, Vec<u8>); 4] = [
        ("garbage", vec![0xff; 64]),
        ("an all-zero GID", transfer_hello(&zero_gid, 4, 1)),
        ("768 MiB", transfer_hello(&ep, 768, 1)),
        ("9 planes", transfer_hello(&ep, 4, 9)),
    ];
    for (what, bytes) in &probes {
        assert_eq!(refused_with_nothing(addr, bytes), 0, "{what} was answered");
    }
    let silent: Vec<TcpStream> = (0..20)
        .map(|_| TcpStream::connect(addr).expect("connect"))
        .collect();
    // Admitted, its 4 MiB registered and the reply read, then nothing.
    let mut stalled = TcpStream::connect(addr).expect("connect");
    stalled.write_all(&transfer_hello(&ep, 4, 1)).unwrap();
    stalled
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut reply = [0u8; verbs::wire::HEADER_LEN];
    stalled
        .read_exact(&mut reply)
        .expect("an admitted client is answered");
    let mut outcomes = Vec::new();
    for i in 0..2 {
        let client = Running::spawn(
            &format!("transfer client {i}"),
            Command::new(&transfer)
                .args(["client", "127.0.0.1", "--port", &port, "--devs", &dev])
                .args(["--planes", "1", "--qps", "2", "--mib", "4"]),
        );
        outcomes.extend(finish(vec![client]));
    }
    drop((silent, stalled));
    assert!(!server.exited(), "the transfer server exited");
    server.stop("the test is done with it");
    outcomes.push(server.outcome());
    let what = "transfer server under probes";
    require_success(what, &outcomes[..2]);
    for client in &outcomes[..2] {
        require_line(
            what,
            client,
            &["checksum client=", " match, 0 chunks differ"],
            &outcomes,
        );
    }
    let server = &outcomes[2];
    // Each probe in one line, the oversized ask refused before any memory.
    for needles in [
        &["server: dropped ", "bad magic"][..],
        &[
            "server: dropped ",
            "no queue pair on this port can reach",
            "gid is zero",
        ],
        &[
            "server: dropped ",
            "refused its setup: 805306368 bytes, at most 8 MiB",
        ],
        &["server: dropped ", "refused its setup: 9 planes"],
        &["server: ", ": done, checksums match"],
    ] {
        require_line(what, server, needles, &outcomes);
    }
    assert!(
        !server.stdout.contains("768 MiB each"),
        "{what}: the oversized client got memory\n{}",
        server.stdout
    );
}
