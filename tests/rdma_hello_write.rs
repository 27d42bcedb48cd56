//! End-to-end tests of `examples/hello_write.rs`: the example binary itself,
//! run as a user would, in one process (loopback) and against an independent
//! C implementation of the primer's programs (tests/fixtures/tutorial_peer.c)
//! in both roles, over the primer's 36-byte wire format, and as a server
//! that keeps serving after hostile clients.
//!
//! The example binary is the one `cargo test` (without a target filter) or
//! `cargo build --example hello_write` leaves in `target/<profile>/examples`;
//! this test only runs it. The C peer is compiled with `cc ... -libverbs`
//! into a directory under /tmp when a test needs it.

mod support;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use verbs::exchange::{self, Session};
use verbs::wire::tutorial::{ConnInfo, CONN_INFO_LEN};
use verbs::{Deadline, Endpoint, Gid, Mtu, RemoteRegion};

/// Every child must be done by then (a TCG guest is slow; the programs'
/// own waits are at most 60 s).
const CHILD_LIMIT: Duration = Duration::from_secs(150);
/// Once one side has failed, how long the other may still take.
const GRACE: Duration = Duration::from_secs(15);
/// How often a running child is looked at.
const POLL: Duration = Duration::from_millis(20);

/// What a finished (or stopped) child left behind.
struct Outcome {
    name: String,
    status: Option<ExitStatus>,
    /// Why it was killed, if it was.
    killed: Option<&'static str>,
    stdout: String,
    stderr: String,
}

impl Outcome {
    fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let how = match (self.killed, self.status) {
            (Some(why), _) => format!("killed: {why}"),
            (None, Some(s)) => s.to_string(),
            (None, None) => "killed".to_string(),
        };
        writeln!(f, "----- {} ({how}) stdout:", self.name)?;
        write!(f, "{}", self.stdout)?;
        writeln!(f, "----- {} stderr:", self.name)?;
        write!(f, "{}", self.stderr)
    }
}

/// A child with its output drained by two threads (so a full pipe never
/// blocks it). Killed on drop unless it was waited for.
struct Running {
    name: String,
    child: Child,
    status: Option<ExitStatus>,
    killed: Option<&'static str>,
    readers: Option<(JoinHandle<String>, JoinHandle<String>)>,
}

impl Running {
    fn spawn(name: &str, cmd: &mut Command) -> Running {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} ({cmd:?}): {e}"));
        let out = drain(child.stdout.take().expect("piped"));
        let err = drain(child.stderr.take().expect("piped"));
        Running {
            name: name.to_string(),
            child,
            status: None,
            killed: None,
            readers: Some((out, err)),
        }
    }

    /// True once the child has exited.
    fn exited(&mut self) -> bool {
        if self.status.is_none() {
            self.status = self.child.try_wait().expect("try_wait");
        }
        self.status.is_some()
    }

    fn stop(&mut self, why: &'static str) {
        if !self.exited() {
            self.killed = Some(why);
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    fn outcome(mut self) -> Outcome {
        let (out, err) = self.readers.take().expect("collected once");
        Outcome {
            name: self.name.clone(),
            status: self.status,
            killed: self.killed,
            stdout: out.join().unwrap_or_default(),
            stderr: err.join().unwrap_or_default(),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn drain(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// Waits for all children: each must exit within [`CHILD_LIMIT`]; once one
/// has failed the others get [`GRACE`], then whatever still runs is killed.
fn finish(mut children: Vec<Running>) -> Vec<Outcome> {
    let mut until = Instant::now() + CHILD_LIMIT;
    let mut why = "time limit";
    let mut failed = false;
    loop {
        let mut running = 0;
        for c in &mut children {
            if !c.exited() {
                running += 1;
            } else if !failed && !c.status.is_some_and(|s| s.success()) {
                failed = true;
                until = until.min(Instant::now() + GRACE);
                why = "still running after the other side failed";
            }
        }
        if running == 0 {
            break;
        }
        if Instant::now() >= until {
            children.iter_mut().for_each(|c| c.stop(why));
            break;
        }
        std::thread::sleep(POLL);
    }
    children.into_iter().map(Running::outcome).collect()
}

/// Panics with every side's output unless all exited 0; prints it anyway
/// (shown with `--nocapture`).
fn require_success(what: &str, outcomes: &[Outcome]) {
    let all: String = outcomes.iter().map(|o| o.to_string()).collect();
    println!("{what}:\n{all}");
    let bad: Vec<&str> = outcomes
        .iter()
        .filter(|o| !o.ok())
        .map(|o| o.name.as_str())
        .collect();
    assert!(bad.is_empty(), "{what}: {bad:?} failed\n{all}");
}

/// Panics (with every side's output) unless one line of `o`'s stdout
/// contains all of `needles`.
fn require_line(what: &str, o: &Outcome, needles: &[&str], all: &[Outcome]) {
    if !o
        .stdout
        .lines()
        .any(|l| needles.iter().all(|n| l.contains(n)))
    {
        let all: String = all.iter().map(|o| o.to_string()).collect();
        panic!(
            "{what}: {}'s stdout has no line containing all of {needles:?}\n{all}",
            o.name
        );
    }
}

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
