//! A gRPC service with tonic over RdmaStream: one unary and one
//! server-streaming method, the messages written with prost's derives
//! and the service and client by hand (what tonic-build would generate:
//! no protoc, no build script). HTTP/2 is hyper's, over the stream.
//!
//! ```text
//! cargo run -p verbs-tokio --example grpc                   # both in one process
//! cargo run -p verbs-tokio --example grpc server [--port N] [--conns N]
//! cargo run -p verbs-tokio --example grpc client HOST [--port N] [--conns N] [--calls N]
//! ```
//! Each client connection makes `--calls` unary calls and one streaming
//! call of `--calls` replies, checking every reply.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::task::{Context, Poll};

use hyper_util::rt::{TokioExecutor, TokioIo};
use tonic::codegen::{http, tokio_stream, BoxFuture, Service};
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;
use verbs_tokio::{ListenerConfig, RdmaListener, RdmaStream, StreamConfig};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `message` echoed `count` times (the stream) or once.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EchoRequest {
    #[prost(string, tag = "1")]
    pub message: String,
    #[prost(uint32, tag = "2")]
    pub count: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct EchoReply {
    #[prost(string, tag = "1")]
    pub message: String,
    #[prost(uint32, tag = "2")]
    pub index: u32,
}

const UNARY: &str = "/verbs.Echo/Unary";
const STREAM: &str = "/verbs.Echo/Stream";

fn reply(req: &EchoRequest, index: u32) -> EchoReply {
    EchoReply {
        message: format!("{} #{index}", req.message),
        index,
    }
}

/// The service: a tower service of HTTP/2 requests, routing by path.
#[derive(Clone, Copy)]
struct EchoService;

type ReplyStream = tokio_stream::Iter<std::vec::IntoIter<Result<EchoReply, Status>>>;

impl tonic::server::UnaryService<EchoRequest> for EchoService {
    type Response = EchoReply;
    type Future = BoxFuture<Response<EchoReply>, Status>;
    fn call(&mut self, req: Request<EchoRequest>) -> Self::Future {
        Box::pin(async move { Ok(Response::new(reply(req.get_ref(), 0))) })
    }
}

impl tonic::server::ServerStreamingService<EchoRequest> for EchoService {
    type Response = EchoReply;
    type ResponseStream = ReplyStream;
    type Future = BoxFuture<Response<ReplyStream>, Status>;
    fn call(&mut self, req: Request<EchoRequest>) -> Self::Future {
        let req = req.into_inner();
        let replies: Vec<_> = (0..req.count).map(|i| Ok(reply(&req, i))).collect();
        Box::pin(async move { Ok(Response::new(tokio_stream::iter(replies))) })
    }
}

impl<B> Service<http::Request<B>> for EchoService
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let codec = ProstCodec::<EchoReply, EchoRequest>::default();
        let mut grpc = tonic::server::Grpc::new(codec);
        match req.uri().path() {
            UNARY => Box::pin(async move { Ok(grpc.unary(EchoService, req).await) }),
            STREAM => Box::pin(async move { Ok(grpc.server_streaming(EchoService, req).await) }),
            _ => Box::pin(async move { Ok(Status::unimplemented("no such method").into_http()) }),
        }
    }
}

/// The client's transport: hyper's HTTP/2 connection over one stream.
#[derive(Clone)]
struct Http2(hyper::client::conn::http2::SendRequest<tonic::body::Body>);

impl Service<http::Request<tonic::body::Body>> for Http2 {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = hyper::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(self.0.send_request(req))
    }
}

/// What tonic-build would generate for the client, and the task that
/// drives its HTTP/2 connection.
struct EchoClient {
    grpc: tonic::client::Grpc<Http2>,
    driver: tokio::task::JoinHandle<Result<(), hyper::Error>>,
}

impl EchoClient {
    async fn connect(stream: RdmaStream) -> Result<EchoClient, BoxError> {
        let (send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await?;
        let driver = tokio::spawn(conn);
        let origin = http::Uri::from_static("http://verbs.example");
        Ok(EchoClient {
            grpc: tonic::client::Grpc::with_origin(Http2(send), origin),
            driver,
        })
    }

    /// Ends the connection as a peer should: with its last handle gone,
    /// hyper sends GOAWAY and shuts the stream down, which waits for the
    /// server's device to acknowledge it. A process that exits without
    /// this destroys its queue pair under the server, which finds the
    /// peer gone (its keepalive probe fails) and counts a failure.
    async fn close(self) -> Result<(), BoxError> {
        drop(self.grpc);
        self.driver.await??;
        Ok(())
    }

    async fn unary(&mut self, req: EchoRequest) -> Result<EchoReply, Status> {
        self.grpc
            .ready()
            .await
            .map_err(|e| Status::unknown(e.to_string()))?;
        let path = http::uri::PathAndQuery::from_static(UNARY);
        let codec = ProstCodec::<EchoRequest, EchoReply>::default();
        Ok(self
            .grpc
            .unary(Request::new(req), path, codec)
            .await?
            .into_inner())
    }

    async fn stream(&mut self, req: EchoRequest) -> Result<Vec<EchoReply>, Status> {
        self.grpc
            .ready()
            .await
            .map_err(|e| Status::unknown(e.to_string()))?;
        let path = http::uri::PathAndQuery::from_static(STREAM);
        let codec = ProstCodec::<EchoRequest, EchoReply>::default();
        let mut replies = self
            .grpc
            .server_streaming(Request::new(req), path, codec)
            .await?
            .into_inner();
        let mut all = Vec::new();
        while let Some(r) = replies.message().await? {
            all.push(r);
        }
        Ok(all)
    }
}

struct Args {
    role: String,
    host: String,
    port: u16,
    conns: usize,
    calls: u32,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        role: "loopback".into(),
        host: "127.0.0.1".into(),
        port: 18602,
        conns: 4,
        calls: 16,
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
            "--calls" => a.calls = num("--calls")? as u32,
            other => return Err(format!("unexpected argument {other:?}")),
        }
    }
    Ok(a)
}

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("grpc: {e}");
            return ExitCode::from(2);
        }
    };
    let result = match args.role.as_str() {
        "server" => {
            async { serve(bind(([0, 0, 0, 0], args.port).into()).await?, args.conns).await }.await
        }
        "client" => client(&args).await,
        _ => {
            async {
                let l = bind(([127, 0, 0, 1], 0).into()).await?;
                args.port = l.local_addr().port();
                let served = tokio::spawn(serve(l, args.conns));
                client(&args).await?;
                served.await?
            }
            .await
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("grpc: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn bind(addr: SocketAddr) -> Result<RdmaListener, BoxError> {
    let l = RdmaListener::bind(addr, ListenerConfig::default(), |peer, e| {
        println!("[server] dropped {peer}: {e}")
    })
    .await?;
    println!("[server] gRPC over RDMA on {}", l.local_addr());
    Ok(l)
}

/// Serves `conns` connections (0: forever), each with hyper's HTTP/2.
async fn serve(l: RdmaListener, conns: usize) -> Result<(), BoxError> {
    let mut tasks = tokio::task::JoinSet::new();
    let mut accepted = 0;
    while conns == 0 || accepted < conns {
        let (stream, _) = l.accept().await?;
        accepted += 1;
        tasks.spawn(async move {
            let service = hyper::service::service_fn(|req| EchoService.call(req));
            hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await
        });
    }
    let mut failed = 0;
    while let Some(done) = tasks.join_next().await {
        if let Err(e) = done? {
            println!("[server] a connection failed: {e:?}");
            failed += 1;
        }
    }
    println!("[server] served {accepted} gRPC connections, {failed} failed");
    match failed {
        0 => Ok(()),
        n => Err(format!("{n} connections failed").into()),
    }
}

async fn client(args: &Args) -> Result<(), BoxError> {
    let addr: SocketAddr = tokio::net::lookup_host((args.host.as_str(), args.port))
        .await?
        .next()
        .ok_or("no address")?;
    let pd = verbs::ProtectionDomain::new(&verbs::Context::open(None)?)?;
    let mut tasks = tokio::task::JoinSet::new();
    for conn in 0..args.conns {
        let (pd, calls) = (pd.clone(), args.calls);
        tasks.spawn(async move {
            let stream = RdmaStream::connect_with(&pd, addr, &StreamConfig::default()).await?;
            let mut client = EchoClient::connect(stream).await?;
            for i in 0..calls {
                let req = EchoRequest {
                    message: format!("conn {conn} call {i}"),
                    count: 1,
                };
                let got = client.unary(req.clone()).await?;
                if got != reply(&req, 0) {
                    return Err::<u32, BoxError>(format!("unary {conn}/{i}: {got:?}").into());
                }
            }
            let req = EchoRequest {
                message: format!("conn {conn} stream"),
                count: calls,
            };
            let all = client.stream(req.clone()).await?;
            let want: Vec<_> = (0..calls).map(|i| reply(&req, i)).collect();
            if all != want {
                return Err(format!("stream {conn}: {} replies, not as sent", all.len()).into());
            }
            client.close().await?;
            Ok(calls + 1)
        });
    }
    let mut ok = 0;
    while let Some(done) = tasks.join_next().await {
        ok += done??;
    }
    println!(
        "[client] {ok} gRPC calls over {} connections ({} unary and 1 server-streaming of {} replies each), all checked",
        args.conns, args.calls, args.calls
    );
    Ok(())
}
