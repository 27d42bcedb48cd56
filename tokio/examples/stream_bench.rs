//! RdmaStream against tokio's TcpStream over the same two guests, in one
//! run, taking turns (TCP, RDMA, TCP: TCP's two runs are the noise); the
//! async engine against the synchronous one for one request-reply; and
//! the CPU of an idle server holding 64 connections.
//!
//! ```text
//! stream_bench server [--port N]            # RDMA on N, TCP on N+1, HTTP on N+2/N+3, raw verbs on N+4
//! stream_bench client HOST [--port N] [--rounds R] [--quick]
//! ```
//! `tests/softroce/tokio_bench` runs it across two guests.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use verbs_tokio::{ListenerConfig, RdmaListener, RdmaStream, StreamConfig};

#[path = "stream_bench/http.rs"]
mod http;
#[path = "stream_bench/raw.rs"]
mod raw;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a connection asks of the server in its first 16 bytes.
const PING: u32 = 0;
const SINK: u32 = 1;
const IDLE: u32 = 2;
const QUIT: u32 = 3;

fn stream_config() -> StreamConfig {
    StreamConfig {
        slot_size: 64 << 10,
        recv_slots: 16,
        send_slots: 16,
        ..StreamConfig::default()
    }
}

/// The HTTP connections' rings: 64 of them at once.
fn small_config() -> StreamConfig {
    StreamConfig {
        slot_size: 8 << 10,
        recv_slots: 8,
        send_slots: 8,
        ..StreamConfig::default()
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opt = |name: &str, default: u64| -> u64 {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let port = opt("--port", 18700) as u16;
    let result = match args.first().map(String::as_str) {
        Some("server") => server(port).await,
        Some("client") => {
            let host = args.get(1).cloned().unwrap_or_default();
            let quick = args.iter().any(|a| a == "--quick");
            client(&host, port, opt("--rounds", 3) as usize, quick).await
        }
        _ => {
            Err("usage: stream_bench server | client HOST [--port N] [--rounds R] [--quick]".into())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stream_bench: {e}");
            ExitCode::FAILURE
        }
    }
}

// ---- the server ----

async fn server(port: u16) -> Result<(), BoxError> {
    let any = |p: u16| -> SocketAddr { ([0, 0, 0, 0], p).into() };
    let log = |peer: SocketAddr, e: &dyn std::fmt::Display| println!("dropped {peer}: {e}");
    let config = |stream| ListenerConfig {
        stream,
        ..ListenerConfig::default()
    };
    let rdma = RdmaListener::bind(any(port), config(stream_config()), log).await?;
    let tcp = TcpListener::bind(any(port + 1)).await?;
    let rdma_http = RdmaListener::bind(any(port + 2), config(small_config()), log).await?;
    let tcp_http = TcpListener::bind(any(port + 3)).await?;
    std::thread::spawn(move || raw::serve(any(port + 4)));
    let idle = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    tokio::spawn(http::serve_rdma(rdma_http));
    tokio::spawn(http::serve_tcp(tcp_http));
    let tcp_loop = {
        let idle = idle.clone();
        tokio::spawn(async move {
            loop {
                let (s, _) = tcp.accept().await?;
                s.set_nodelay(true)?;
                tokio::spawn(serve_conn(s, idle.clone()));
            }
            #[allow(unreachable_code)]
            Ok::<(), std::io::Error>(())
        })
    };
    let rdma_loop = tokio::spawn(async move {
        loop {
            let (s, _) = rdma.accept().await?;
            tokio::spawn(serve_conn(s, idle.clone()));
        }
        #[allow(unreachable_code)]
        Ok::<(), std::io::Error>(())
    });
    tokio::select! {
        r = tcp_loop => r??,
        r = rdma_loop => r??,
    }
    Ok(())
}

/// One connection: its 16-byte header says what to do.
async fn serve_conn<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    idle: std::sync::Arc<tokio::sync::Semaphore>,
) -> std::io::Result<()> {
    let mut head = [0u8; 16];
    s.read_exact(&mut head).await?;
    let kind = u32::from_le_bytes(head[0..4].try_into().unwrap());
    let size = u32::from_le_bytes(head[4..8].try_into().unwrap()) as usize;
    let count = u64::from_le_bytes(head[8..16].try_into().unwrap());
    let mut buf = vec![0u8; size.max(1)];
    match kind {
        PING => {
            for _ in 0..count {
                s.read_exact(&mut buf).await?;
                s.write_all(&buf).await?;
                s.flush().await?;
            }
        }
        SINK => {
            let mut left = size as u64 * count;
            while left > 0 {
                let n = s.read(&mut buf).await?;
                if n == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                left -= n as u64;
            }
            s.write_all(b"k").await?;
            s.flush().await?;
        }
        IDLE => {
            // Held open; `count` connections are measured once all arrived.
            idle.add_permits(1);
            if idle.available_permits() as u64 >= count {
                let _all = idle.acquire_many(count as u32).await;
                let cpu = idle_cpu(Duration::from_secs(10)).await;
                println!(
                    "IDLE {count} connections: {:.3} % of a core over 10 s",
                    cpu * 100.0
                );
            }
            let mut byte = [0u8; 1];
            let _ = s.read(&mut byte).await; // until the client closes
            return Ok(());
        }
        QUIT => {
            println!("the client is done");
            std::process::exit(0);
        }
        _ => return Err(std::io::ErrorKind::InvalidData.into()),
    }
    s.shutdown().await
}

/// This process's CPU over `span` (user + system, /proc/self/stat), as a
/// fraction of one core.
async fn idle_cpu(span: Duration) -> f64 {
    let ticks = || -> u64 {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let after = stat.rsplit(')').next().unwrap_or("");
        let f: Vec<&str> = after.split_whitespace().collect();
        // Fields 14 and 15 (utime, stime) are 12 and 13 after the name.
        f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
            + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
    };
    let (t0, w0) = (ticks(), Instant::now());
    tokio::time::sleep(span).await;
    let (t1, w1) = (ticks(), Instant::now());
    // USER_HZ is 100 on Linux.
    (t1 - t0) as f64 / 100.0 / (w1 - w0).as_secs_f64()
}

// ---- the client ----

enum Via {
    Tcp,
    Rdma,
}

struct Dial {
    host: String,
    port: u16,
    pd: verbs::ProtectionDomain,
}

impl Dial {
    async fn addr(&self, port: u16) -> Result<SocketAddr, BoxError> {
        Ok(tokio::net::lookup_host((self.host.as_str(), port))
            .await?
            .next()
            .ok_or("no address")?)
    }

    /// A TCP connection; the server may not listen yet (as the RDMA
    /// exchange, retried for a while).
    async fn tcp(&self, port: u16) -> Result<TcpStream, BoxError> {
        let addr = self.addr(port).await?;
        let mut tries = 0;
        let s = loop {
            match TcpStream::connect(addr).await {
                Ok(s) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused && tries < 300 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e.into()),
            }
        };
        s.set_nodelay(true)?;
        Ok(s)
    }

    async fn rdma(&self, port: u16, config: &StreamConfig) -> Result<RdmaStream, BoxError> {
        Ok(RdmaStream::connect_with(&self.pd, self.addr(port).await?, config).await?)
    }
}

fn header(kind: u32, size: usize, count: u64) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&kind.to_le_bytes());
    h[4..8].copy_from_slice(&(size as u32).to_le_bytes());
    h[8..16].copy_from_slice(&count.to_le_bytes());
    h
}

/// `count` round trips of `size` bytes; each one's time.
async fn ping<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    size: usize,
    count: u64,
) -> Result<Vec<Duration>, BoxError> {
    s.write_all(&header(PING, size, count)).await?;
    let out = vec![0x5au8; size];
    let mut back = vec![0u8; size];
    let mut times = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let t = Instant::now();
        s.write_all(&out).await?;
        s.flush().await?;
        s.read_exact(&mut back).await?;
        times.push(t.elapsed());
    }
    s.shutdown().await?;
    Ok(times)
}

/// `count` writes of `size` bytes; MB/s until the server has them all.
async fn sink<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    size: usize,
    count: u64,
) -> Result<f64, BoxError> {
    s.write_all(&header(SINK, size, count)).await?;
    let out = vec![0x5au8; size];
    let t = Instant::now();
    for _ in 0..count {
        s.write_all(&out).await?;
    }
    s.flush().await?;
    let mut k = [0u8; 1];
    s.read_exact(&mut k).await?;
    Ok((size as u64 * count) as f64 / t.elapsed().as_secs_f64() / 1e6)
}

pub(crate) fn percentile(times: &mut [Duration], p: f64) -> f64 {
    times.sort_unstable();
    let at = ((times.len() as f64 - 1.0) * p).round() as usize;
    times[at].as_secs_f64() * 1e6
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One measure taken TCP, RDMA, TCP per round: medians over the rounds
/// of each, and the ratio RDMA / TCP with TCP's second run / first.
struct Row {
    name: String,
    tcp: Vec<f64>,
    tcp_again: Vec<f64>,
    rdma: Vec<f64>,
}

impl Row {
    fn print(&self, unit: &str) {
        let (a, b, r) = (
            median(self.tcp.clone()),
            median(self.tcp_again.clone()),
            median(self.rdma.clone()),
        );
        let tcp = (a + b) / 2.0;
        println!(
            "ROW | {} | {tcp:.1} {unit} | {r:.1} {unit} | {:.3} | {:.3} |",
            self.name,
            r / tcp,
            b / a
        );
    }
}

async fn client(host: &str, port: u16, rounds: usize, quick: bool) -> Result<(), BoxError> {
    let pd = verbs::ProtectionDomain::new(&verbs::Context::open(None)?)?;
    let dial = Dial {
        host: host.to_string(),
        port,
        pd,
    };
    let scale = if quick { 10 } else { 1 };
    println!("ROW | measure | TCP | RDMA | RDMA / TCP | TCP A/A |");
    for (size, count) in [(64usize, 2000u64), (4096, 1000), (65536, 200)] {
        let count = (count / scale).max(20);
        let mut rows = [
            new_row(format!("round trip p50, {}", bytes(size))),
            new_row(format!("round trip p99, {}", bytes(size))),
        ];
        for _ in 0..rounds {
            for via in [Via::Tcp, Via::Rdma, Via::Tcp] {
                let mut t = match via {
                    Via::Tcp => ping(dial.tcp(dial.port + 1).await?, size, count).await?,
                    Via::Rdma => {
                        ping(dial.rdma(dial.port, &stream_config()).await?, size, count).await?
                    }
                };
                let (p50, p99) = (percentile(&mut t, 0.5), percentile(&mut t, 0.99));
                for (row, v) in rows.iter_mut().zip([p50, p99]) {
                    push(row, &via, v);
                }
            }
        }
        rows.iter().for_each(|r| r.print("us"));
    }
    for size in [64usize << 10, 256 << 10, 1 << 20] {
        let count = ((32u64 << 20) / size as u64 / scale).max(4);
        let mut row = new_row(format!("throughput, {} writes", bytes(size)));
        for _ in 0..rounds {
            for via in [Via::Tcp, Via::Rdma, Via::Tcp] {
                let v = match via {
                    Via::Tcp => sink(dial.tcp(dial.port + 1).await?, size, count).await?,
                    Via::Rdma => {
                        sink(dial.rdma(dial.port, &stream_config()).await?, size, count).await?
                    }
                };
                push(&mut row, &via, v);
            }
        }
        row.print("MB/s");
    }
    for conns in [1usize, 16, 64] {
        let requests = (2000 / conns as u64 / scale).max(5);
        let mut rps = new_row(format!("HTTP/1.1 requests/s, {conns} connections"));
        let mut p99 = new_row(format!("HTTP/1.1 p99, {conns} connections"));
        for _ in 0..rounds {
            for via in [Via::Tcp, Via::Rdma, Via::Tcp] {
                let (r, p) = http::load(&dial, &via, conns, requests).await?;
                push(&mut rps, &via, r);
                push(&mut p99, &via, p);
            }
        }
        rps.print("req/s");
        p99.print("us");
    }
    // On a thread of its own: it runs its own runtime (and blocks).
    let raw_addr = dial.addr(dial.port + 4).await?;
    let n = (5000 / scale as usize).max(100);
    let compared =
        std::thread::spawn(move || raw::compare(&raw_addr, rounds, n).map_err(|e| e.to_string()));
    tokio::task::spawn_blocking(move || compared.join())
        .await?
        .map_err(|_| "the sync/async comparison panicked")??;
    idle(&dial, 64).await?;
    let mut quit = dial.tcp(dial.port + 1).await?;
    quit.write_all(&header(QUIT, 0, 0)).await?;
    Ok(())
}

fn new_row(name: String) -> Row {
    Row {
        name,
        tcp: Vec::new(),
        tcp_again: Vec::new(),
        rdma: Vec::new(),
    }
}

/// Files `v` under TCP's first or second run, or RDMA's.
fn push(row: &mut Row, via: &Via, v: f64) {
    match via {
        Via::Rdma => row.rdma.push(v),
        Via::Tcp if row.tcp.len() > row.tcp_again.len() => row.tcp_again.push(v),
        Via::Tcp => row.tcp.push(v),
    }
}

fn bytes(n: usize) -> String {
    match n {
        n if n >= 1 << 20 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

/// `n` idle RDMA connections held while the server measures its CPU.
async fn idle(dial: &Dial, n: u64) -> Result<(), BoxError> {
    let mut held = Vec::new();
    for _ in 0..n {
        let mut s = dial.rdma(dial.port, &small_config()).await?;
        s.write_all(&header(IDLE, 0, n)).await?;
        s.flush().await?;
        held.push(s);
    }
    println!("IDLE holding {n} connections while the server measures (10 s)");
    tokio::time::sleep(Duration::from_secs(12)).await;
    for mut s in held {
        let _ = s.shutdown().await;
    }
    Ok(())
}
