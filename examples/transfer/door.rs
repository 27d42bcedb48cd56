//! The server's front door: `verbs::exchange::Server` reads and judges
//! every client's first hello (token, an endpoint plane 0's port can
//! reach) with deadlines, then the setup riding behind it is held to the
//! configured bounds, all before anything is registered or revealed.
//! Admitted clients are served on threads of their own, a few at once;
//! one that fails or stalls is logged and dropped, and costs nobody else
//! their turn.

use std::thread::ScopedJoinHandle;
use std::time::Duration;

use verbs::exchange::{Handshake, Server, ServerConfig};
use verbs::{Context, Deadline};

use crate::proto;
use crate::{BoxError, Opts};

/// Queue pairs per plane a client may ask for (the client's own limit).
pub const MAX_QPS: usize = 64;
/// The smallest chunk a client may ask for (the client's own limit): it
/// bounds the per-chunk tables the server keeps at `len / 4 KiB` entries.
const MIN_CHUNK: u64 = 4 << 10;
/// The largest chunk (the client's own limit).
const MAX_CHUNK: u64 = 1 << 30;
/// The setup rides right behind the hello: it must be in this soon.
const SETUP_WITHIN: Duration = Duration::from_secs(10);
/// From a client's connect to the reply to its first hello, registering
/// its regions included; also the longest a valid hello waits for a slot.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);

/// What an admitted client asked for, within the server's bounds.
pub struct Setup {
    pub len: u64,
    pub planes: usize,
    pub qps: usize,
    pub read: bool,
    pub chunk_len: u64,
}

/// Serves client after client, [`Opts::max_clients`] at once; with
/// `--once` only the first one admitted, and returns its verdict.
pub fn run(opts: &Opts) -> Result<bool, BoxError> {
    let available = match &opts.devs {
        Some(list) => list.len(),
        None => verbs::devices()?.len(),
    };
    let devs = crate::devices(&opts.devs, available)?;
    // A first hello is for path 0, on plane 0: its port decides what
    // endpoint a client can present.
    let link_layer = Context::open(Some(&devs[0]))?.query_port(1)?.link_layer();
    let config = ServerConfig {
        token: opts.token,
        link_layer: Some(link_layer),
        client_timeout: CLIENT_TIMEOUT,
        ..ServerConfig::default()
    };
    let server = Server::bind(("0.0.0.0", opts.port), config, |peer, e| {
        println!("server: dropped {peer}: {e}")
    })?;
    println!(
        "server: listening on port {} (devices {}); at most {} clients at once, each at most {} MiB per plane{}",
        opts.port,
        devs.join(","),
        opts.max_clients,
        opts.max_mib,
        if opts.token.is_some() { ", token required" } else { "" }
    );
    if opts.once {
        let hello = server.next_client(Deadline::NEVER)?;
        return crate::server::serve(opts, &devs, hello);
    }
    std::thread::scope(|scope| {
        let mut running: Vec<ScopedJoinHandle<'_, ()>> = Vec::new();
        loop {
            running.retain(|t| !t.is_finished());
            if running.len() >= opts.max_clients {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            let hello = server.next_client(Deadline::NEVER)?;
            let who = hello
                .peer_addr()
                .map_or_else(|| "a client".into(), |a| a.to_string());
            let devs = &devs;
            running.push(
                scope.spawn(move || match crate::server::serve(opts, devs, hello) {
                    Ok(true) => println!("server: {who}: done, checksums match"),
                    Ok(false) => println!("server: {who}: done, checksums differ"),
                    Err(e) => println!("server: dropped {who}: {e}"),
                }),
            );
        }
    })
}

/// Reads the setup riding behind `hello` and holds it to the bounds:
/// at most `devices` planes, [`MAX_QPS`] queue pairs per plane and
/// `max_mib` MiB, chunks of [`MIN_CHUNK`] to [`MAX_CHUNK`].
pub fn read_setup(hello: &mut Handshake, devices: usize, max_mib: u64) -> Result<Setup, BoxError> {
    let by = hello.expires().min(Deadline::after(SETUP_WITHIN));
    let session = hello.session_mut();
    let (cmd, len, shape) = proto::recv(session, by.remaining())?;
    let (again, op, chunk_len) = proto::recv(session, by.remaining())?;
    if cmd != proto::SETUP || again != proto::SETUP {
        return Err("the client did not start with a setup".into());
    }
    let setup = Setup {
        len,
        planes: (shape >> 32) as usize,
        qps: (shape & 0xFFFF_FFFF) as usize,
        read: op == 1,
        chunk_len,
    };
    let refuse = |what: String| Err(format!("refused its setup: {what}").into());
    if len == 0 || len > max_mib << 20 {
        return refuse(format!("{len} bytes, at most {max_mib} MiB (--max-mib)"));
    }
    if setup.planes == 0 || setup.planes > devices {
        return refuse(format!("{} planes, {devices} devices here", setup.planes));
    }
    if setup.qps == 0 || setup.qps > MAX_QPS {
        return refuse(format!(
            "{} queue pairs per plane, at most {MAX_QPS}",
            setup.qps
        ));
    }
    if op > 1 {
        return refuse(format!("operation {op}, neither write (0) nor read (1)"));
    }
    if !(MIN_CHUNK..=MAX_CHUNK).contains(&chunk_len) {
        return refuse(format!(
            "chunks of {chunk_len} bytes, {MIN_CHUNK} to {MAX_CHUNK} allowed"
        ));
    }
    Ok(setup)
}
