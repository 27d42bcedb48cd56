//! The primer's first program: a client RDMA-Writes "Hello, RDMA!" into the
//! server's memory while the server's CPU only sleeps and prints it, then
//! RDMA-Reads it back.
//!
//! ```text
//! cargo run --example hello_write                 # both sides in one process, first device
//! cargo run --example hello_write server [OPTS]    # on one machine; serves client after client
//! cargo run --example hello_write client HOST [OPTS]
//!   --dev NAME        device (default: the first)
//!   --port N          TCP port of the connection exchange (default 18515)
//!   --gid-index N     GID index (default: chosen: RoCE v2, IPv4-mapped first)
//!   --token SECRET    the server reveals its memory only to clients that present it
//!   --once            the server serves one client and exits with its verdict
//!   --wire tutorial   speak the primer's 36-byte conn_info (talks to its server.c/client.c;
//!                     unauthenticated: anyone who connects learns the rkey)
//!   --cm              connect with rdma_cm instead (build with --features rdmacm);
//!                     the server's memory descriptor travels in the accept's private data
//!                     (unauthenticated: refused with --token, which it does not check)
//! ```
//! The server serves up to 8 clients at once, each with a protection
//! domain, a queue pair and a page of its own, made only once its hello
//! is valid; every stage has a deadline, so a client that stalls holds
//! its own slot for seconds and nobody else's. It logs a client it drops
//! (garbage, a port scan, a bad token, an endpoint its port cannot reach,
//! a silent or stalled client) in one line. Exit status 0 only if the
//! bytes really arrived (the server: with `--once`).

use std::net::{SocketAddr, TcpListener};
use std::process::ExitCode;
use std::thread::ScopedJoinHandle;
use std::time::Duration;

use verbs::exchange::{
    self, ExchangeError, Handshake, Server, ServerConfig, Session, Token, TutorialSide,
};
use verbs::wire::tutorial::{ConnInfo, TUTORIAL_BUF_SIZE, TUTORIAL_TCP_PORT};
use verbs::{
    Access, Context, Deadline, Endpoint, HostBuf, Local, MemoryRegion, NicBuf, ProtectionDomain,
    QpConfig, QueuePair, RemoteRegion, RemoteSlice, SendOp, SendRequest,
};

const BUF_SIZE: usize = 4096;
const INITIAL: &str = "(initial server memory)";
/// Clients served at once; more wait for a slot (a hello waits at most
/// the exchange's client timeout, 10 s).
const MAX_CLIENTS: usize = 8;
/// The most a client may take for a stage after its hello: the primer's
/// exchange, its sync, its read back.
const STAGE: Duration = Duration::from_secs(10);
const USAGE: &str = "usage: hello_write [server | client HOST] [--dev NAME] [--port N] [--gid-index N] [--token SECRET] [--once] [--wire tutorial] [--cm]";

#[derive(Clone, Debug)]
struct Options {
    dev: Option<String>,
    port: u16,
    gid_index: Option<u32>,
    token: Option<Token>,
    once: bool,
    tutorial: bool,
    cm: bool,
}

type Qp = QueuePair<MemoryRegion>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (role, host, opts) = match parse(&args) {
        Ok(parsed) => parsed,
        Err(msg) => {
            eprintln!("hello_write: {msg}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let result = if opts.cm {
        with_cm::run(&role, host.as_deref(), &opts)
    } else {
        match role.as_str() {
            "server" => server(&opts, None),
            "client" => client(&opts, &host.unwrap_or_default()),
            _ => loopback(&opts),
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hello_write: {e}");
            ExitCode::FAILURE
        }
    }
}

fn parse(args: &[String]) -> Result<(String, Option<String>, Options), String> {
    let mut opts = Options {
        dev: None,
        port: TUTORIAL_TCP_PORT,
        gid_index: None,
        token: None,
        once: false,
        tutorial: false,
        cm: false,
    };
    let mut rest = args.iter();
    let mut role = String::from("loopback");
    let mut host = None;
    while let Some(arg) = rest.next() {
        let mut value = |name: &str| rest.next().cloned().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "server" if role == "loopback" => role = arg.clone(),
            "client" if role == "loopback" => {
                role = arg.clone();
                host = Some(value("client")?);
            }
            "--dev" => opts.dev = Some(value("--dev")?),
            "--port" => {
                opts.port = value("--port")?
                    .parse()
                    .map_err(|_| "--port takes a number")?
            }
            "--gid-index" => {
                opts.gid_index = Some(
                    value("--gid-index")?
                        .parse()
                        .map_err(|_| "--gid-index takes a number")?,
                )
            }
            "--wire" => match value("--wire")?.as_str() {
                "tutorial" => opts.tutorial = true,
                "verbs" => opts.tutorial = false,
                other => return Err(format!("unknown wire format {other:?} (tutorial or verbs)")),
            },
            "--token" => {
                let secret = value("--token")?;
                opts.token =
                    Some(Token::new(secret.as_bytes()).map_err(|e| format!("--token: {e}"))?);
            }
            "--once" => opts.once = true,
            "--cm" => opts.cm = true,
            "-h" | "--help" => return Err("help".into()),
            other => return Err(format!("unexpected argument {other:?}")),
        }
    }
    if opts.cm && opts.token.is_some() {
        return Err("--token is not checked over --cm (rdma_cm's accept reveals the memory to the first client): leave one out".into());
    }
    Ok((role, host, opts))
}

/// Both sides in one process on one device, talking over 127.0.0.1 exactly
/// as two machines would.
fn loopback(opts: &Options) -> Result<(), BoxError> {
    let listener = TcpListener::bind(("127.0.0.1", 0))?;
    let port = listener.local_addr()?.port();
    let opts = Options {
        port,
        ..opts.clone()
    };
    println!("[main] loopback on one device: server and client in one process, exchange on 127.0.0.1:{port}");
    let server_opts = Options {
        once: true,
        ..opts.clone()
    };
    let server =
        std::thread::spawn(move || server(&server_opts, Some(listener)).map_err(|e| e.to_string()));
    let client_result = client(&opts, "127.0.0.1");
    let server_result = server.join().map_err(|_| "server thread panicked")?;
    client_result?;
    server_result?;
    println!("[main] success: the server's memory was written by RDMA and read back");
    Ok(())
}

/// The side that only exposes memory and watches it change, for clients
/// one after another and several at once (or one, with `--once`).
fn server(opts: &Options, listener: Option<TcpListener>) -> Result<(), BoxError> {
    let ctx = Context::open(opts.dev.as_deref())?;
    let port = QpConfig::default().port;
    let listener = match listener {
        Some(l) => l,
        None => TcpListener::bind(("0.0.0.0", opts.port))?,
    };
    println!(
        "[server] device {}, waiting for clients on TCP port {}...",
        ctx.name(),
        listener.local_addr()?.port()
    );
    if opts.tutorial {
        let listener = exchange::Listener::from_std(listener)?;
        return serve_all(opts, &ctx, || {
            listener.accept(Deadline::NEVER).map(Client::Tutorial)
        });
    }
    let config = ServerConfig {
        token: opts.token,
        // Refuse, before anything is made or revealed, an endpoint this
        // port cannot reach (a zero GID on RoCE).
        link_layer: Some(ctx.query_port(port)?.link_layer()),
        ..ServerConfig::default()
    };
    let server = Server::from_std(listener, config, |peer, err| {
        println!("[server] dropped {peer}: {err}")
    })?;
    serve_all(opts, &ctx, || {
        server.next_client(Deadline::NEVER).map(Client::Ours)
    })
}

/// A client as the server first meets it: on our wire with its hello read
/// and valid, on the primer's with nothing exchanged yet.
enum Client {
    Ours(Handshake),
    Tutorial(Session),
}

impl Client {
    fn peer_addr(&self) -> Option<SocketAddr> {
        match self {
            Client::Ours(hello) => hello.peer_addr(),
            Client::Tutorial(session) => session.peer_addr(),
        }
    }
}

/// Serves every client `next` brings, each on a thread of its own, at
/// most [`MAX_CLIENTS`] at once; with `--once` only the first, and
/// returns its verdict.
fn serve_all(
    opts: &Options,
    ctx: &Context,
    mut next: impl FnMut() -> Result<Client, ExchangeError>,
) -> Result<(), BoxError> {
    if opts.once {
        return serve(opts, ctx, next()?);
    }
    std::thread::scope(|scope| {
        let mut running: Vec<ScopedJoinHandle<'_, ()>> = Vec::new();
        loop {
            running.retain(|t| !t.is_finished());
            if running.len() >= MAX_CLIENTS {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            let client = next()?;
            running.push(scope.spawn(move || {
                let who = client.peer_addr();
                let who = who.map_or_else(|| "a client".to_string(), |a| a.to_string());
                match serve(opts, ctx, client) {
                    Ok(()) => println!("[server] {who}: done"),
                    Err(e) => println!("[server] dropped {who}: {e}"),
                }
            }));
        }
    })
}

/// One client: a protection domain and a page of its own (so what it
/// learns reaches nothing of any other client's), then its story.
fn serve(opts: &Options, ctx: &Context, client: Client) -> Result<(), BoxError> {
    let pd = ProtectionDomain::new(ctx)?;
    let mut mr =
        MemoryRegion::with_access(&pd, BUF_SIZE, Access::REMOTE_WRITE | Access::REMOTE_READ)?;
    mr.write_at(0, &cstring(INITIAL))?;
    match client {
        Client::Ours(hello) => serve_ours(opts, &pd, &mut mr, hello),
        Client::Tutorial(session) => serve_tutorial(opts, &pd, &mut mr, session),
    }
}

/// One client of our wire: its hello was read and validated before we
/// reveal anything; a queue pair of its own, our endpoint with the region
/// only now, then the story.
fn serve_ours(
    opts: &Options,
    pd: &ProtectionDomain,
    mr: &mut MemoryRegion,
    hello: Handshake,
) -> Result<(), BoxError> {
    let mut qp = new_qp(opts, pd, Access::REMOTE_WRITE | Access::REMOTE_READ)?;
    let peer = hello.peer_endpoint().clone();
    println!(
        "[server] client QPN {}, GID {}; our QPN {}",
        peer.qpn,
        peer.gid,
        qp.qp_num()
    );
    qp.connect(&peer)?;
    // Printed before the reply: once the client has our rkey it may write.
    println!("[server] before:  '{}'", text(mr));
    let mut local = qp.endpoint()?;
    local
        .regions
        .push(mr.remote().expect("remote access was granted"));
    let bound = hello.expires();
    let mut session = hello.reply(&local)?;
    session.sync(bound)?; // the client knows we are watching
    let seen = watch(mr);
    // Stay up until the client has read the memory back.
    session.sync(Deadline::after(STAGE))?;
    verdict(mr, seen, "")
}

/// One client of the primer's wire (server first, unauthenticated).
fn serve_tutorial(
    opts: &Options,
    pd: &ProtectionDomain,
    mr: &mut MemoryRegion,
    mut session: Session,
) -> Result<(), BoxError> {
    println!("[server] before:  '{}'", text(mr));
    let mut qp = new_qp(opts, pd, Access::REMOTE_WRITE | Access::REMOTE_READ)?;
    qp.set_psn(0)?;
    let mut local = qp.endpoint()?;
    local
        .regions
        .push(mr.remote().expect("remote access was granted"));
    let info = ConnInfo::from_endpoint(&tutorial_endpoint(local))?;
    let peer = session
        .exchange_tutorial(&info, TutorialSide::Server, Deadline::after(STAGE))?
        .to_endpoint(TUTORIAL_BUF_SIZE)?;
    println!("[server] peer QPN {}, GID {}", peer.qpn, peer.gid);
    qp.connect(&peer)?;
    let seen = watch(mr);
    std::thread::sleep(Duration::from_secs(5)); // the primer's client reads back after 2 s; leave margin
    verdict(mr, seen, "")
}

fn new_qp(opts: &Options, pd: &ProtectionDomain, remote: Access) -> Result<Qp, BoxError> {
    let config = QpConfig {
        gid_index: opts.gid_index,
        remote_access: remote,
        ..QpConfig::default()
    };
    Ok(QueuePair::new(pd, &config)?)
}

/// The server's last word: its memory after the client is done, and
/// whether a client's greeting arrived in it.
fn verdict(mr: &MemoryRegion, seen: bool, note: &str) -> Result<(), BoxError> {
    let after = text(mr);
    println!("[server] after:   '{after}'{note}");
    if seen && after.starts_with("Hello, RDMA") {
        Ok(())
    } else {
        Err("the server's memory never changed".into())
    }
}

/// The side that writes into the server's memory and reads it back.
fn client(opts: &Options, host: &str) -> Result<(), BoxError> {
    let ctx = Context::open(opts.dev.as_deref())?;
    let pd = ProtectionDomain::new(&ctx)?;
    let mut qp = new_qp(opts, &pd, Access::EMPTY)?;
    let mut mr = MemoryRegion::new(&pd, BUF_SIZE)?;
    let message = format!("Hello, RDMA from client at PID {}!", std::process::id());
    mr.write_at(0, &cstring(&message))?;
    println!(
        "[client] device {}, QPN {}, connecting to {host}:{}...",
        ctx.name(),
        qp.qp_num(),
        opts.port
    );

    let deadline = Deadline::after(Duration::from_secs(60));
    let (mut session, peer) = if opts.tutorial {
        let mut session: Session = exchange::connect((host, opts.port), deadline)?;
        qp.set_psn(0)?;
        let mut local = qp.endpoint()?;
        local.regions.push(RemoteRegion {
            addr: mr.addr(),
            len: BUF_SIZE as u64,
            rkey: mr.rkey(),
        });
        let info = ConnInfo::from_endpoint(&tutorial_endpoint(local))?;
        let peer = session
            .exchange_tutorial(&info, TutorialSide::Client, deadline)?
            .to_endpoint(TUTORIAL_BUF_SIZE)?;
        (session, peer)
    } else {
        exchange::connect_and_exchange(
            (host, opts.port),
            &qp.endpoint()?,
            opts.token.as_ref(),
            deadline,
        )?
    };
    let region = *peer.regions.first().ok_or("the server shared no memory")?;
    println!(
        "[client] peer addr={:#x}, rkey={:#x}",
        region.addr, region.rkey
    );
    qp.connect(&peer)?;
    if !opts.tutorial {
        session.sync(deadline)?; // the server is watching its memory now
    }

    // As the primer, the tutorial client gives the server 2 s to see it.
    let pause = Duration::from_secs(if opts.tutorial { 2 } else { 0 });
    let got = write_then_read(&mut qp, mr, &region, &message, pause)?;
    if !opts.tutorial {
        session.sync(Deadline::after(Duration::from_secs(60)))?;
    }
    same_as_sent(&got, &message)
}

/// The client's part of the story: RDMA Write `message` (with its NUL,
/// already at the start of `mr`) into the server's `region`, wait `pause`,
/// RDMA Read the region back; returns what came back.
fn write_then_read(
    qp: &mut Qp,
    mr: MemoryRegion,
    region: &RemoteRegion,
    message: &str,
    pause: Duration,
) -> Result<String, BoxError> {
    let len = message.len() + 1;
    let dst = RemoteSlice::new(region, 0, len as u64)?;
    let local = Local::range(mr, 0, len).map_err(|(e, _)| e)?;
    let mut mr = roundtrip(qp, SendOp::Write(dst), local)?;
    println!("[client] RDMA Write completed.");
    std::thread::sleep(pause);
    mr.write_at(0, &[0u8; BUF_SIZE])?;
    let src = RemoteSlice::new(region, 0, BUF_SIZE as u64)?;
    let mr = roundtrip(qp, SendOp::Read(src), Local::whole(mr))?;
    let got = text(&mr);
    println!("[client] RDMA Read got: '{got}'");
    Ok(got)
}

/// The client's verdict: the memory read back is the message written.
fn same_as_sent(got: &str, message: &str) -> Result<(), BoxError> {
    if got == message {
        Ok(())
    } else {
        Err(format!("read back {got:?}, expected {message:?}").into())
    }
}

/// Posts one request and waits (with a deadline) for its completion.
fn roundtrip(
    qp: &mut Qp,
    op: SendOp,
    local: Local<MemoryRegion>,
) -> Result<MemoryRegion, BoxError> {
    qp.post_send(SendRequest::new(op, local))
        .map_err(|e| e.error)?;
    let mut done = qp.wait_one(Deadline::after(Duration::from_secs(30)))?;
    done.result()?;
    Ok(done
        .take_buf()
        .expect("the buffer comes back with its completion"))
}

/// The primer's programs assume PSN 0 and a 1024-byte path MTU.
fn tutorial_endpoint(mut ep: Endpoint) -> Endpoint {
    ep.psn = 0;
    ep.mtu = verbs::Mtu::MTU_1024;
    ep
}

fn cstring(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// The server's part of the story: sleep, print the memory, until the
/// client's write shows up (true) or 10 s pass (false).
fn watch(mr: &MemoryRegion) -> bool {
    println!("[server] sleeping, doing nothing but printing my memory...");
    for t in 0..50 {
        std::thread::sleep(Duration::from_millis(200));
        let now = text(mr);
        println!("[server] t={:.1}s: '{now}'", f64::from(t + 1) * 0.2);
        if now != INITIAL {
            return true;
        }
    }
    false
}

/// The NUL-terminated string at the start of the region (copied out: a peer may be writing it).
fn text(mr: &MemoryRegion) -> String {
    let mut buf = [0u8; BUF_SIZE];
    mr.read_at(0, &mut buf).expect("in range");
    let end = buf.iter().position(|&b| b == 0).unwrap_or(BUF_SIZE);
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

#[cfg(feature = "rdmacm")]
mod with_cm;

#[cfg(not(feature = "rdmacm"))]
mod with_cm {
    pub fn run(_: &str, _: Option<&str>, _: &super::Options) -> Result<(), super::BoxError> {
        Err("--cm needs the rdmacm feature: cargo run --features rdmacm --example hello_write -- --cm".into())
    }
}
