//! The HTTP/1.1 part of the bench: one hyper server on each transport,
//! closed-loop clients (each connection sends its next request when the
//! last answer is in).

use std::convert::Infallible;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

use super::{percentile, small_config, BoxError, Dial, Via};

async fn hello(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let body = req.into_body().collect().await.map(|b| b.to_bytes());
    Ok(Response::new(Full::new(body.unwrap_or_default())))
}

fn serve<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(s: S) {
    tokio::spawn(
        hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(s), hyper::service::service_fn(hello)),
    );
}

pub(crate) async fn serve_rdma(l: verbs_tokio::RdmaListener) -> std::io::Result<()> {
    loop {
        serve(l.accept().await?.0);
    }
}

pub(crate) async fn serve_tcp(l: tokio::net::TcpListener) -> std::io::Result<()> {
    loop {
        let (s, _) = l.accept().await?;
        s.set_nodelay(true)?;
        serve(s);
    }
}

async fn one<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    s: S,
    requests: u64,
) -> Result<Vec<Duration>, BoxError> {
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s)).await?;
    let driver = tokio::spawn(conn);
    let mut times = Vec::with_capacity(requests as usize);
    for i in 0..requests {
        let body = Bytes::from(format!("request {i}"));
        let req = Request::post("http://bench/").body(Full::new(body.clone()))?;
        let t = Instant::now();
        let got = send
            .send_request(req)
            .await?
            .into_body()
            .collect()
            .await?
            .to_bytes();
        times.push(t.elapsed());
        if got != body {
            return Err("a wrong answer".into());
        }
    }
    drop(send);
    driver.await??;
    Ok(times)
}

/// `conns` connections, `requests` each: (requests/s, p99 in µs).
pub(crate) async fn load(
    dial: &Dial,
    via: &Via,
    conns: usize,
    requests: u64,
) -> Result<(f64, f64), BoxError> {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..conns {
        match via {
            Via::Tcp => {
                let s = dial.tcp(dial.port + 3).await?;
                tasks.spawn(one(s, requests));
            }
            Via::Rdma => {
                let s = dial.rdma(dial.port + 2, &small_config()).await?;
                tasks.spawn(one(s, requests));
            }
        }
    }
    // Connections are made first: the clock runs over requests only.
    let t = Instant::now();
    let mut all = Vec::new();
    while let Some(done) = tasks.join_next().await {
        all.extend(done??);
    }
    let rps = all.len() as f64 / t.elapsed().as_secs_f64();
    Ok((rps, percentile(&mut all, 0.99)))
}
