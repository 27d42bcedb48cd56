//! An echo server and client over RdmaStream.
//!
//! ```text
//! cargo run -p verbs-tokio --example echo                  # both in one process
//! cargo run -p verbs-tokio --example echo server [--port N] [--clients N]
//! cargo run -p verbs-tokio --example echo client HOST [--port N] [--bytes N] [--clients N]
//! ```
//! Each client writes its bytes, shuts its side down, reads the echo to
//! EOF and checks it byte for byte; the server echoes each connection
//! (with `--clients N` it exits after N, non-zero if any failed).

use std::net::SocketAddr;
use std::process::ExitCode;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use verbs_tokio::{ListenerConfig, RdmaListener, RdmaStream, StreamConfig};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

struct Args {
    role: String,
    host: String,
    port: u16,
    bytes: usize,
    clients: usize,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        role: "loopback".into(),
        host: "127.0.0.1".into(),
        port: 18600,
        bytes: 1 << 20,
        clients: 4,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut num = |name: &str| -> Result<usize, String> {
            it.next()
                .and_then(|v| v.parse().ok())
                .ok_or(format!("{name} takes a number"))
        };
        match arg.as_str() {
            "server" => a.role = arg,
            "client" => {
                a.role = arg;
                a.host = it.next().ok_or("client HOST")?;
            }
            "--port" => a.port = num("--port")? as u16,
            "--bytes" => a.bytes = num("--bytes")?,
            "--clients" => a.clients = num("--clients")?,
            other => return Err(format!("unexpected argument {other:?}")),
        }
    }
    Ok(a)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("echo: {e}");
            return ExitCode::from(2);
        }
    };
    let result = match args.role.as_str() {
        "server" => server(&args, ([0, 0, 0, 0], args.port).into()).await,
        "client" => client(&args).await,
        _ => loopback(args).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("echo: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn loopback(mut args: Args) -> Result<(), BoxError> {
    args.port = 0;
    let listener = bind(([127, 0, 0, 1], 0).into()).await?;
    args.port = listener.local_addr().port();
    let clients = args.clients;
    let served = tokio::spawn(serve(listener, clients));
    client(&args).await?;
    served.await??;
    Ok(())
}

async fn bind(addr: SocketAddr) -> Result<RdmaListener, BoxError> {
    let l = RdmaListener::bind(addr, ListenerConfig::default(), |peer, e| {
        println!("[server] dropped {peer}: {e}")
    })
    .await?;
    println!("[server] listening on {}", l.local_addr());
    Ok(l)
}

async fn server(args: &Args, addr: SocketAddr) -> Result<(), BoxError> {
    serve(bind(addr).await?, args.clients).await
}

/// Echoes `clients` connections at once, then reports.
async fn serve(listener: RdmaListener, clients: usize) -> Result<(), BoxError> {
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (mut s, peer) = listener.accept().await?;
        tasks.push(tokio::spawn(async move {
            let mut data = Vec::new();
            s.read_to_end(&mut data).await?;
            s.write_all(&data).await?;
            s.shutdown().await?;
            println!("[server] {peer:?}: echoed {} bytes", data.len());
            Ok::<_, std::io::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    println!("[server] served {clients} clients");
    Ok(())
}

async fn client(args: &Args) -> Result<(), BoxError> {
    let addr: SocketAddr = tokio::net::lookup_host((args.host.as_str(), args.port))
        .await?
        .next()
        .ok_or("no address")?;
    let config = StreamConfig::default();
    let pd = verbs::ProtectionDomain::new(&verbs::Context::open(None)?)?;
    let mut tasks = Vec::new();
    for i in 0..args.clients {
        let (pd, config, bytes) = (pd.clone(), config.clone(), args.bytes);
        tasks.push(tokio::spawn(async move {
            let data: Vec<u8> = (0..bytes).map(|b| (b * 7 + i) as u8).collect();
            let mut s = RdmaStream::connect_with(&pd, addr, &config).await?;
            let (mut r, mut w) = tokio::io::split(&mut s);
            let writer = async {
                w.write_all(&data).await?;
                w.shutdown().await
            };
            let mut back = Vec::with_capacity(bytes);
            let (written, read) = tokio::join!(writer, r.read_to_end(&mut back));
            written?;
            read?;
            if back != data {
                return Err::<(), BoxError>(format!("client {i}: the echo differs").into());
            }
            Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    println!(
        "[client] {} clients: {} bytes each echoed and checked",
        args.clients, args.bytes
    );
    Ok(())
}
