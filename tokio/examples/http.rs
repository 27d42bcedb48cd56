//! HTTP/1.1 and HTTP/2 with hyper over RdmaStream (hyper-util's tokio
//! adapter), many connections at once, every response checked.
//!
//! ```text
//! cargo run -p verbs-tokio --example http                   # both in one process
//! cargo run -p verbs-tokio --example http server [--port N] [--conns N] [--h2]
//! cargo run -p verbs-tokio --example http client HOST [--port N] [--conns N] [--requests N] [--h2]
//! ```
//! The client opens `--conns` connections at once and sends `--requests`
//! POSTs on each (on one HTTP/2 connection they are in flight together);
//! the answer to `/hello/<conn>/<i>` with body B is `<conn>/<i>:` then B
//! reversed, and each is checked. The server serves connections as they
//! come (with `--conns N`, exits after N, non-zero if any failed).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Instant;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use verbs_tokio::{ListenerConfig, RdmaListener, RdmaStream, StreamConfig};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Clone)]
struct Args {
    role: String,
    host: String,
    port: u16,
    conns: usize,
    requests: usize,
    h2: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        role: "loopback".into(),
        host: "127.0.0.1".into(),
        port: 18601,
        conns: 16,
        requests: 8,
        h2: false,
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
            "--conns" => a.conns = num("--conns")?,
            "--requests" => a.requests = num("--requests")?,
            "--h2" => a.h2 = true,
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
            eprintln!("http: {e}");
            return ExitCode::from(2);
        }
    };
    let result = match args.role.as_str() {
        "server" => {
            async {
                let l = bind(([0, 0, 0, 0], args.port).into()).await?;
                serve(l, args.conns, args.h2).await
            }
            .await
        }
        "client" => client(&args).await,
        _ => {
            async {
                let l = bind(([127, 0, 0, 1], 0).into()).await?;
                let args = Args {
                    port: l.local_addr().port(),
                    ..args.clone()
                };
                let served = tokio::spawn(serve(l, args.conns, args.h2));
                client(&args).await?;
                served.await?
            }
            .await
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("http: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn bind(addr: SocketAddr) -> Result<RdmaListener, BoxError> {
    let l = RdmaListener::bind(addr, config(), |peer, e| {
        println!("[server] dropped {peer}: {e}")
    })
    .await?;
    println!("[server] HTTP over RDMA on {}", l.local_addr());
    Ok(l)
}

/// Small rings: many connections, small messages.
fn config() -> ListenerConfig {
    ListenerConfig {
        stream: stream_config(),
        ..ListenerConfig::default()
    }
}

fn stream_config() -> StreamConfig {
    StreamConfig {
        slot_size: 8 << 10,
        recv_slots: 8,
        send_slots: 8,
        ..StreamConfig::default()
    }
}

/// The answer to `/hello/<conn>/<i>` with `body`.
fn answer(path: &str, body: &[u8]) -> Vec<u8> {
    let mut out = path.trim_start_matches("/hello/").as_bytes().to_vec();
    out.push(b':');
    out.extend(body.iter().rev());
    out
}

async fn handle(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_string();
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => Bytes::new(),
    };
    Ok(Response::new(Full::new(Bytes::from(answer(&path, &body)))))
}

/// Serves connections as they come; with `conns` > 0, exits after that many.
async fn serve(l: RdmaListener, conns: usize, h2: bool) -> Result<(), BoxError> {
    let mut tasks = tokio::task::JoinSet::new();
    let mut accepted = 0;
    while conns == 0 || accepted < conns {
        let (stream, _) = l.accept().await?;
        accepted += 1;
        tasks.spawn(async move {
            let io = TokioIo::new(stream);
            let service = hyper::service::service_fn(handle);
            if h2 {
                hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(io, service)
                    .await
            } else {
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await
            }
        });
    }
    let mut failed = 0;
    while let Some(done) = tasks.join_next().await {
        if let Err(e) = done? {
            println!("[server] a connection failed: {e:?}");
            failed += 1;
        }
    }
    println!("[server] served {accepted} connections, {failed} failed");
    if failed > 0 {
        return Err(format!("{failed} connections failed").into());
    }
    Ok(())
}

async fn client(args: &Args) -> Result<(), BoxError> {
    let addr: SocketAddr = tokio::net::lookup_host((args.host.as_str(), args.port))
        .await?
        .next()
        .ok_or("no address")?;
    let pd = verbs::ProtectionDomain::new(&verbs::Context::open(None)?)?;
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for conn in 0..args.conns {
        let (pd, requests, h2) = (pd.clone(), args.requests, args.h2);
        tasks.spawn(async move {
            let stream = RdmaStream::connect_with(&pd, addr, &stream_config()).await?;
            one_connection(stream, conn, requests, h2).await
        });
    }
    let mut checked = 0;
    while let Some(done) = tasks.join_next().await {
        checked += done??;
    }
    let (conns, proto) = (args.conns, if args.h2 { "HTTP/2" } else { "HTTP/1.1" });
    println!(
        "[client] {checked} {proto} responses over {conns} concurrent connections, every one checked, in {:.2?}",
        started.elapsed()
    );
    Ok(())
}

/// `requests` POSTs on one connection, each answer checked; the count.
async fn one_connection(
    stream: RdmaStream,
    conn: usize,
    requests: usize,
    h2: bool,
) -> Result<usize, BoxError> {
    let io = TokioIo::new(stream);
    let request = |i: usize| {
        let body = format!("request {i} of connection {conn}");
        let req = Request::post(format!("http://verbs.example/hello/{conn}/{i}"))
            .body(Full::new(Bytes::from(body.clone())))
            .expect("a valid request");
        (req, answer(&format!("/hello/{conn}/{i}"), body.as_bytes()))
    };
    let check = |i: usize, got: &[u8], want: &[u8]| -> Result<(), BoxError> {
        if got != want {
            return Err(format!("connection {conn} request {i}: wrong answer").into());
        }
        Ok(())
    };
    if h2 {
        let (sender, conn_task) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await?;
        let driver = tokio::spawn(conn_task);
        let mut inflight = tokio::task::JoinSet::new();
        for i in 0..requests {
            let mut sender = sender.clone();
            let (req, want) = request(i);
            inflight.spawn(async move {
                let resp = sender.send_request(req).await?;
                let got = resp.into_body().collect().await?.to_bytes();
                Ok::<_, BoxError>((i, got, want))
            });
        }
        while let Some(done) = inflight.join_next().await {
            let (i, got, want) = done??;
            check(i, &got, &want)?;
        }
        drop(sender);
        driver.await??;
    } else {
        let (mut sender, conn_task) = hyper::client::conn::http1::handshake(io).await?;
        let driver = tokio::spawn(conn_task);
        for i in 0..requests {
            let (req, want) = request(i);
            let resp = sender.send_request(req).await?;
            let got = resp.into_body().collect().await?.to_bytes();
            check(i, &got, &want)?;
        }
        drop(sender);
        driver.await??;
    }
    Ok(requests)
}
