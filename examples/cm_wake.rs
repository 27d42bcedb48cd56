//! How long a server waiting on completions takes to learn that its
//! rdma_cm peer disconnected (issue 37's rping port): from the client's
//! call to `rdma_disconnect` to the server's `Engine::wait_with_cm`
//! returning, over many rounds (200 by default), one connection at a time,
//! on one engine.
//!
//! `tests/softroce/cargo run --release --features rdmacm --example cm_wake [ADDR] [ROUNDS]`
//! (ADDR: an address of the device under test; by default the IPv4
//! address of its chosen GID, which a RoCE port has; on siw0, 10.79.0.1).

#[cfg(not(feature = "rdmacm"))]
fn main() {
    eprintln!("cm_wake needs the rdmacm feature: --features rdmacm");
    std::process::exit(2);
}

#[cfg(feature = "rdmacm")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    use std::net::SocketAddr;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    use verbs::cm::{self, CmConnection, CmEventType, CmListener, Wake};
    use verbs::{Deadline, Engine, EngineConfig, MemoryRegion, QpConfig, RecvRequest};

    let mut args = std::env::args().skip(1);
    let ip = match args.next() {
        Some(a) => a.parse()?,
        None => {
            let dev = std::env::var("VERBS_TEST_DEVICE").ok();
            let ctx = cm::context(dev.as_deref())?;
            let table = ctx.gid_table(1)?;
            let gid = verbs::device::choose_gid(&table).ok_or("no usable GID")?;
            std::net::IpAddr::V4(
                gid.gid
                    .ipv4()
                    .ok_or("no IPv4 GID: give the address")?
                    .into(),
            )
        }
    };
    let rounds: usize = args.next().map_or(Ok(200), |r| r.parse())?;
    let addr = SocketAddr::new(ip, 18700);
    let listener = CmListener::bind(addr)?;
    let (disconnected, when) = mpsc::channel::<Instant>();
    let (ready, wait_ready) = mpsc::channel::<()>();
    let server = std::thread::spawn(move || -> Result<Vec<Duration>, verbs::Error> {
        let pd = listener.pd()?;
        let config = EngineConfig {
            events: true,
            ..EngineConfig::default()
        };
        let mut engine: Engine<MemoryRegion> = Engine::new(&pd, &config)?;
        let mut delays = Vec::new();
        for _ in 0..rounds {
            let qp = listener
                .request(Deadline::after(Duration::from_secs(30)))?
                .place(&mut engine, &QpConfig::default())?;
            let buf = MemoryRegion::new(&pd, 64)?;
            engine
                .post_recv(qp, RecvRequest::new(buf))
                .map_err(|e| e.error)?;
            engine.cm_accept(qp, b"")?;
            loop {
                let woke = engine.wait_with_cm(Deadline::after(Duration::from_secs(30)), |_| {})?;
                if matches!(&woke, Wake::Event(ev) if ev.kind() == CmEventType::ESTABLISHED) {
                    break;
                }
            }
            let _ = ready.send(());
            // Waiting for a completion that never comes: the disconnect
            // (its event, or the flush it brings) must end the wait.
            engine.wait_with_cm(Deadline::after(Duration::from_secs(60)), |_| {})?;
            let woke = Instant::now();
            let at = when.recv().map_err(|_| {
                verbs::Error::invalid(verbs::site!("cm_wake", "the client went away"))
            })?;
            delays.push(woke.saturating_duration_since(at));
            engine.remove_qp(qp)?;
            while engine.cm_event()?.is_some() {}
        }
        Ok(delays)
    });
    for _ in 0..rounds {
        let mut conn: CmConnection<MemoryRegion> = cm::connect(
            addr,
            &QpConfig::default(),
            b"",
            Deadline::after(Duration::from_secs(30)),
        )?;
        wait_ready.recv()?;
        std::thread::sleep(Duration::from_millis(5)); // the server is asleep
        let at = Instant::now();
        conn.disconnect()?;
        disconnected.send(at)?;
    }
    let mut delays = server.join().map_err(|_| "the server panicked")??;
    delays.sort();
    let at = |p: f64| delays[((delays.len() - 1) as f64 * p).round() as usize];
    println!(
        "disconnect -> server awake, {} rounds: min {:?}, median {:?}, p90 {:?}, p99 {:?}, max {:?}",
        delays.len(),
        delays[0],
        at(0.5),
        at(0.9),
        at(0.99),
        delays[delays.len() - 1]
    );
    Ok(())
}
