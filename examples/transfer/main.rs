//! Moves a file or a generated buffer between two hosts over every plane
//! (RDMA device) at once with `verbs::transfer`: chunks sprayed over
//! several RC queue pairs per plane, a failed path's chunks sent again on
//! the others, the path re-admitted when it works again. Made for
//! `tests/softroce/pair --planes K` (see tests/softroce/transfer_drill).
//!
//! ```text
//! transfer server [--port N] [--devs rxe0,rxe1] [--token SECRET] [--max-mib M]
//!                 [--max-clients C] [--once] [--zero-chunk C]
//! transfer client HOST [--port N] [--devs rxe0,rxe1] [--token SECRET] [--planes K] [--qps Q]
//!                 [--mib M | --file PATH] [--read] [--chunk-kib C] [--depth D]
//!                 [--timeout T] [--retry R] [--slack X] [--tc TC] [--hop-limit H]
//!                 [--start-at SECS] [--cut-at SECS] [--at-half CMD] [--tick-ms MS]
//!                 [--fail-every MIB] [--no-readmit] [--trace]
//!   --token     (both) the server serves only clients whose hello carries it
//!   --max-mib   (server) the most a client may ask for, per plane (default 64):
//!               a larger request is refused before anything is registered
//!   --max-clients  (server) clients served at once (default 2); others wait
//!               for a slot, up to the exchange's client timeout (60 s)
//!   --once      (server) serve the first client whose hello is valid and exit
//!               with its verdict (as the drill does); otherwise serve on
//!   --zero-chunk  (server) zero chunk C on every plane before the first check,
//!               as if its write had never landed: the client's repair round
//!               must send it again
//!   --devs      the devices, one per plane, in plane order (default: every
//!               device, sorted by name; the client's --planes K takes the first K)
//!   --qps       queue pairs (paths) per plane (default 2)
//!   --mib       generated data (default 64); --file sends a file instead
//!   --read      the client RDMA-Reads the server's (generated) data instead
//!   --timeout/--retry/--slack  the retry policy (default 14/3/3: a dead path is
//!               failed within 805 ms, the device's own verdict nominally 268 ms)
//!   --start-at  start the transfer SECS after this process started (so a
//!               fault timed from the command start lands mid-transfer)
//!   --cut-at    the bed cuts a plane SECS after the command started: report the
//!               time from it (when no PORT_ERR event says when)
//!   --at-half   start `sh -c CMD` before the transfer with its stdin a pipe,
//!               and write a line to it once half the bytes are done (so CMD
//!               waits with everything loaded, e.g. `{ read _; echo link set
//!               eth1 down; } | ip -batch -`); the RESULT line gives the
//!               fraction done then and at the device's PORT_ERR
//!   --fail-every  fail the busiest live path every MIB MiB done (as a watchdog
//!               misled by a starved host would): its writes are on the wire
//!   --trace     print every post (with its queue pair and PSNs), completion,
//!               failure, reset and connection of the transfer at the end
//! ```
//! The client prints a progress line (total and per-path rate, path
//! states), then `checksum ...` and one machine-readable `RESULT ...`
//! line. Both sides compare every chunk's checksum too, and name the
//! chunks that differ; both exit non-zero when anything differs.
//!
//! The server is a front door (`verbs::exchange::Server`): the client
//! speaks first, its hello (token, endpoint) and the size it asks for are
//! judged before anything is registered or revealed, every stage has a
//! deadline, and a client it drops (logged in one line) costs nobody
//! else their turn.

mod client;
mod door;
mod proto;
mod report;
mod server;

use std::process::ExitCode;
use std::time::Instant;

use verbs::exchange::Token;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub struct Opts {
    pub t0: Instant,
    pub port: u16,
    pub devs: Option<Vec<String>>,
    pub planes: Option<usize>,
    pub qps: usize,
    pub mib: u64,
    pub file: Option<String>,
    pub read: bool,
    pub chunk_kib: u64,
    pub depth: u32,
    pub timeout: u8,
    pub retry: u8,
    pub slack: u32,
    pub traffic_class: u8,
    pub hop_limit: u8,
    pub start_at: Option<f64>,
    pub cut_at: Option<f64>,
    pub at_half: Option<String>,
    pub fail_every: u64,
    pub zero_chunk: Option<usize>,
    pub tick_ms: u64,
    pub readmit: bool,
    pub token: Option<Token>,
    pub max_mib: u64,
    pub max_clients: usize,
    pub once: bool,
    pub trace: bool,
}

const USAGE: &str = "usage: transfer server [--port N] [--devs A,B] [--token T] [--max-mib M] [--once] | transfer client HOST [OPTIONS] (see the source's header)";

fn parse(args: &[String]) -> Result<(String, Option<String>, Opts), String> {
    let mut o = Opts {
        t0: Instant::now(),
        port: 18530,
        devs: None,
        planes: None,
        qps: 2,
        mib: 64,
        file: None,
        read: false,
        chunk_kib: 256,
        depth: 4,
        timeout: 14,
        retry: 3,
        slack: 3,
        traffic_class: 0,
        hop_limit: 64,
        start_at: None,
        cut_at: None,
        at_half: None,
        fail_every: 0,
        zero_chunk: None,
        tick_ms: 1000,
        readmit: true,
        token: None,
        max_mib: 64,
        max_clients: 2,
        once: false,
        trace: false,
    };
    let mut it = args.iter();
    let role = it.next().cloned().ok_or("a role: server or client")?;
    let host = match role.as_str() {
        "client" => Some(it.next().cloned().ok_or("client needs HOST")?),
        "server" => None,
        other => return Err(format!("unknown role {other:?}")),
    };
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--read" => {
                o.read = true;
                continue;
            }
            "--no-readmit" => {
                o.readmit = false;
                continue;
            }
            "--once" => {
                o.once = true;
                continue;
            }
            "--trace" => {
                o.trace = true;
                continue;
            }
            _ => {}
        }
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let num = || {
            value
                .parse::<u64>()
                .map_err(|_| format!("{flag} takes a number"))
        };
        let secs = || {
            value
                .parse::<f64>()
                .map_err(|_| format!("{flag} takes seconds"))
        };
        match flag.as_str() {
            "--port" => o.port = num()? as u16,
            "--devs" => o.devs = Some(value.split(',').map(str::to_string).collect()),
            "--planes" => o.planes = Some(num()?.clamp(1, 8) as usize),
            "--qps" => o.qps = num()?.clamp(1, 64) as usize,
            "--mib" => o.mib = num()?.max(1),
            "--file" => o.file = Some(value.clone()),
            "--chunk-kib" => o.chunk_kib = num()?.clamp(4, 1 << 20),
            "--depth" => o.depth = num()?.clamp(1, 64) as u32,
            "--timeout" => o.timeout = num()?.min(31) as u8,
            "--retry" => o.retry = num()?.min(7) as u8,
            "--slack" => o.slack = num()? as u32,
            "--tc" => o.traffic_class = num()? as u8,
            "--hop-limit" => o.hop_limit = num()? as u8,
            "--start-at" => o.start_at = Some(secs()?),
            "--cut-at" => o.cut_at = Some(secs()?),
            "--at-half" => o.at_half = Some(value.clone()),
            "--fail-every" => o.fail_every = num()?,
            "--zero-chunk" => o.zero_chunk = Some(num()? as usize),
            "--tick-ms" => o.tick_ms = num()?.max(50),
            "--token" => {
                o.token = Some(Token::new(value.as_bytes()).map_err(|e| format!("--token: {e}"))?)
            }
            "--max-mib" => o.max_mib = num()?.max(1),
            "--max-clients" => o.max_clients = num()?.clamp(1, 64) as usize,
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    Ok((role, host, o))
}

/// The devices to use, one per plane: as given, or every device sorted by
/// name; the first `count` of them.
pub fn devices(given: &Option<Vec<String>>, count: usize) -> Result<Vec<String>, BoxError> {
    let mut names = match given {
        Some(list) => list.clone(),
        None => {
            let mut all: Vec<String> = verbs::devices()?.into_iter().map(|d| d.name).collect();
            all.sort();
            all
        }
    };
    if names.len() < count || count == 0 {
        return Err(format!("{count} planes asked for, devices {names:?}").into());
    }
    names.truncate(count);
    Ok(names)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (role, host, opts) = match parse(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("transfer: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let result = match role.as_str() {
        "server" => door::run(&opts),
        _ => client::run(&opts, &host.unwrap_or_default()),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("transfer {role}: {e}");
            ExitCode::FAILURE
        }
    }
}
