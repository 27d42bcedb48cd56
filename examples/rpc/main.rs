//! A request/response service over RC Send/Recv with a shared receive
//! queue, or over UD (`--ud`: one datagram queue pair serves every
//! client), and its load generator: closed-loop clients whose connections
//! may be spread over several nodes, stepped through load levels, each
//! level's latency percentiles and rate printed for the whole cluster.
//! Made for `tests/softroce/cluster` (see tests/softroce/rpc).
//!
//! ```text
//! rpc server [--port N] [--dev D] [--max-payload B] [--srq-depth D]
//!            [--max-conns C] [--seconds S] [--allow-stop] [--sleep-after N] [--ud]
//!            [--metrics PORT] [--threads N]
//! rpc client HOST [--port N] [--dev D] [--conns 1,4,16,64,256] [--size B]
//!            [--seconds S] [--op echo|invert] [--nodes K --rank R --leader ADDR]
//!            [--max-payload B] [--stop] [--bad] [--rnr K] [--hellos K]
//!            [--sleep-after N] [--ud]
//!   server   runs until a client's stop (with --allow-stop) or --seconds,
//!            printing one line per second (requests/s, connections, errors)
//!   --threads N  (server, RC) N shards, each a thread with its own engine,
//!            shared receive queue and arena; the acceptor hands each new
//!            client to the next shard in turn (--max-conns split over them)
//!   --metrics PORT  (server) serve `GET /metrics` over HTTP on PORT:
//!            Prometheus text of its counts and the device port's hardware
//!            counters (metrics.rs, scrape.rs)
//!   --conns  load levels: total connections over all K client nodes (this
//!            node opens its share); one RESULT line per level (on rank 0)
//!   --nodes/--rank/--leader  the client nodes keep in step through the
//!            leader (rank 0) at ADDR, port N+1
//!   --bad    send requests the server must refuse, check each answer
//!   --rnr K  (RC) K connections that never post a receive, one request
//!            each: check the server drops every one (its RNR bound)
//!   --hellos K  (UD) K handshakes naming made-up GIDs: the server must
//!            answer them and make nothing for them
//!   --ud     datagrams (both sides): payloads up to a datagram less the
//!            header; a request unanswered for 500 ms is sent again
//!   --stop   (rank 0) ask the server to stop at the end
//!   --sleep-after N  (both) after N empty polls in a row, sleep on the
//!            completion channel until the next completion (default 0:
//!            always spin, the lowest latency; sleeping leaves the CPU to
//!            others, such as the other guests of a test bed on few cores)
//! ```
//! The message format is in proto.rs: a 16-byte header (magic, op,
//! status, length, request id), then the payload.

mod barrier;
mod client;
#[path = "../perf/clock.rs"]
mod clock;
mod metrics;
mod nap;
mod peers;
mod probes;
mod proto;
mod refusals;
mod scrape;
mod server;
mod server_ud;
mod shard;
mod stats;

use std::process::ExitCode;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One registration for `count` buffers of `len` bytes.
pub fn arena(
    pd: &verbs::ProtectionDomain,
    count: usize,
    len: usize,
) -> Result<verbs::Arena, verbs::Error> {
    verbs::Arena::new(
        pd,
        &verbs::ArenaConfig {
            capacity: (count * len.next_multiple_of(64)).max(1 << 20),
            max_buffers: count as u32 + 64,
            ..verbs::ArenaConfig::default()
        },
    )
}

#[derive(Clone)]
pub struct Opts {
    pub host: String,
    pub port: u16,
    pub dev: Option<String>,
    pub max_payload: u32,
    pub srq_depth: u32,
    pub max_conns: u32,
    pub seconds: u64,
    pub allow_stop: bool,
    pub sweep: Vec<u32>,
    pub size: usize,
    pub op: proto::Op,
    pub nodes: usize,
    pub rank: usize,
    pub leader: String,
    pub stop: bool,
    pub bad: bool,
    pub rnr: usize,
    pub hellos: usize,
    pub sleep_after: u32,
    pub ud: bool,
    pub metrics: Option<u16>,
    pub threads: usize,
}

const USAGE: &str =
    "usage: rpc server [OPTIONS] | rpc client HOST [OPTIONS] (see the source's header)";

fn parse(args: &[String]) -> Result<(String, Opts), String> {
    let mut o = Opts {
        host: String::new(),
        port: 18600,
        dev: None,
        max_payload: 4096,
        srq_depth: 512,
        max_conns: 512,
        seconds: 0,
        allow_stop: false,
        sweep: vec![1],
        size: 64,
        op: proto::Op::ECHO,
        nodes: 1,
        rank: 0,
        leader: String::new(),
        stop: false,
        bad: false,
        rnr: 0,
        hellos: 0,
        sleep_after: 0,
        ud: false,
        metrics: None,
        threads: 1,
    };
    let mut it = args.iter();
    let role = it.next().cloned().ok_or("a role: server or client")?;
    match role.as_str() {
        "client" => o.host = it.next().cloned().ok_or("client needs HOST")?,
        "server" => {}
        other => return Err(format!("unknown role {other:?}")),
    }
    let mut client_seconds = None;
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--allow-stop" => o.allow_stop = true,
            "--stop" => o.stop = true,
            "--bad" => o.bad = true,
            "--ud" => o.ud = true,
            _ => {
                let v = it.next().ok_or(format!("{flag} needs a value"))?;
                let bad = |e: &dyn std::fmt::Display| format!("{flag} {v}: {e}");
                match flag.as_str() {
                    "--port" => o.port = v.parse().map_err(|e| bad(&e))?,
                    "--threads" => o.threads = v.parse().map_err(|e| bad(&e))?,
                    "--metrics" => o.metrics = Some(v.parse().map_err(|e| bad(&e))?),
                    "--dev" => o.dev = Some(v.clone()),
                    "--max-payload" => o.max_payload = v.parse().map_err(|e| bad(&e))?,
                    "--srq-depth" => o.srq_depth = v.parse().map_err(|e| bad(&e))?,
                    "--max-conns" => o.max_conns = v.parse().map_err(|e| bad(&e))?,
                    "--seconds" => client_seconds = Some(v.parse().map_err(|e| bad(&e))?),
                    "--size" => o.size = v.parse().map_err(|e| bad(&e))?,
                    "--nodes" => o.nodes = v.parse().map_err(|e| bad(&e))?,
                    "--rank" => o.rank = v.parse().map_err(|e| bad(&e))?,
                    "--leader" => o.leader = v.clone(),
                    "--sleep-after" => o.sleep_after = v.parse().map_err(|e| bad(&e))?,
                    "--rnr" => o.rnr = v.parse().map_err(|e| bad(&e))?,
                    "--hellos" => o.hellos = v.parse().map_err(|e| bad(&e))?,
                    "--conns" => {
                        o.sweep = v
                            .split(',')
                            .map(|c| c.parse().map_err(|e| bad(&e)))
                            .collect::<Result<_, _>>()?
                    }
                    "--op" => {
                        o.op = match v.as_str() {
                            "echo" => proto::Op::ECHO,
                            "invert" => proto::Op::INVERT,
                            _ => return Err(bad(&"echo or invert")),
                        }
                    }
                    _ => return Err(format!("unknown option {flag}")),
                }
            }
        }
    }
    o.seconds = client_seconds.unwrap_or(if role == "client" { 2 } else { 0 });
    if o.nodes == 0 || o.rank >= o.nodes {
        return Err("--rank must be below --nodes".into());
    }
    if o.size > o.max_payload as usize {
        return Err(format!(
            "--size {} is over --max-payload {}",
            o.size, o.max_payload
        ));
    }
    if o.threads == 0 || o.threads > 64 || (o.ud && o.threads > 1) {
        return Err("--threads is 1 to 64, and 1 with --ud".into());
    }
    if o.leader.is_empty() {
        o.leader = "127.0.0.1".into();
    }
    Ok((role, o))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (role, opts) = match parse(&args) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("rpc: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let result = if role == "server" && opts.ud {
        server_ud::run(&opts).map(|()| true)
    } else if role == "server" {
        server::run(&opts).map(|()| true)
    } else {
        client::run(&opts)
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("rpc {role}: {e}");
            ExitCode::FAILURE
        }
    }
}
