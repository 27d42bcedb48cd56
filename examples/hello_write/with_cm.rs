//! The same story over rdma_cm: the connection manager finds GID, LID and
//! MTU itself; the server's region travels in the accept's private data.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use verbs::cm::{self, CmConnection, CmListener};
use verbs::{Access, Context, Deadline, HostBuf, MemoryRegion, QpConfig};

use super::{
    cstring, same_as_sent, text, verdict, watch, write_then_read, BoxError, Options, BUF_SIZE,
    INITIAL,
};

fn deadline() -> Deadline {
    Deadline::after(Duration::from_secs(60))
}

pub fn run(role: &str, host: Option<&str>, opts: &Options) -> Result<(), BoxError> {
    match role {
        "server" => server(CmListener::bind(SocketAddr::new(
            Ipv4Addr::UNSPECIFIED.into(),
            opts.port,
        ))?),
        "client" => {
            let ip: IpAddr = host
                .unwrap_or_default()
                .parse()
                .map_err(|_| "--cm takes the server's IP address")?;
            client(SocketAddr::new(ip, opts.port))
        }
        _ => {
            // Loopback: the device's own IPv4 address (rdma_cm binds to an RDMA netdev).
            let ctx = Context::open(opts.dev.as_deref())?;
            let table = ctx.gid_table(1)?;
            let ip = verbs::device::choose_gid(&table)
                .ok_or("no usable GID")?
                .gid
                .ipv4()
                .ok_or("no IPv4 GID")?;
            let addr = SocketAddr::new(Ipv4Addr::from(ip).into(), opts.port);
            println!("[main] loopback over rdma_cm on {addr}");
            let listener = CmListener::bind(addr)?;
            let srv = std::thread::spawn(move || server(listener).map_err(|e| e.to_string()));
            let c = client(addr);
            srv.join().map_err(|_| "server thread panicked")??;
            c?;
            println!("[main] success: the server's memory was written by RDMA and read back");
            Ok(())
        }
    }
}

fn config(remote: Access) -> QpConfig {
    QpConfig {
        remote_access: remote,
        ..QpConfig::default()
    }
}

fn server(listener: CmListener) -> Result<(), BoxError> {
    println!("[server] waiting for an rdma_cm connect request...");
    let req = listener.request(deadline())?;
    let mut mr = MemoryRegion::with_access(
        req.pd(),
        BUF_SIZE,
        Access::REMOTE_WRITE | Access::REMOTE_READ,
    )?;
    mr.write_at(0, &cstring(INITIAL))?;
    // Printed before accepting: no peer can reach the memory yet.
    println!("[server] before:  '{}'", text(&mr));
    let private = cm::encode_regions(&[mr.remote().expect("remote access was granted")]);
    let mut conn: CmConnection<MemoryRegion> = req.accept(
        &config(Access::REMOTE_WRITE | Access::REMOTE_READ),
        &private,
        deadline(),
    )?;
    let qpn = conn.qp_num();
    println!(
        "[server] connected on {} (QPN {qpn})",
        conn.context().name()
    );
    let seen = watch(&mr);
    conn.wait_disconnected(deadline())?; // the client disconnects after reading back
    verdict(&mr, seen, " (client disconnected)")
}

/// Connects, trying again while the server is not listening yet (the
/// peer answers REJECTED at once): started together, the client may
/// be first, as the TCP exchange allows for too.
fn connect_when_listening(addr: SocketAddr) -> Result<CmConnection<MemoryRegion>, BoxError> {
    let deadline = deadline();
    loop {
        match cm::connect(addr, &config(Access::EMPTY), b"", deadline) {
            Err(e)
                if e.cm_event().is_some_and(|(event, _)| {
                    cm::CmEventType(event) == cm::CmEventType::REJECTED
                }) && !deadline.passed() =>
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            other => return Ok(other?),
        }
    }
}

fn client(addr: SocketAddr) -> Result<(), BoxError> {
    println!("[client] rdma_cm connect to {addr}...");
    let mut conn = connect_when_listening(addr)?;
    let region = *cm::decode_regions(conn.peer_private_data())?
        .first()
        .ok_or("no region shared")?;
    println!(
        "[client] peer addr={:#x}, rkey={:#x} (from the accept's private data)",
        region.addr, region.rkey
    );
    let message = format!(
        "Hello, RDMA from client at PID {} (rdma_cm)!",
        std::process::id()
    );
    let mut mr = MemoryRegion::new(conn.pd(), BUF_SIZE)?;
    mr.write_at(0, &cstring(&message))?;
    // A pause so that the server prints the greeting before the read.
    let pause = Duration::from_millis(500);
    let got = write_then_read(&mut conn, mr, &region, &message, pause)?;
    conn.disconnect()?;
    same_as_sent(&got, &message)
}
