//! Fault-injection drills on a two-machine RC connection (made for the
//! Soft-RoCE `pair` bed, see tests/softroce/faults and FAULTS.md).
//!
//! ```text
//! fault_drill server [--port N] [--region-mib M] [--generation G]
//! fault_drill client HOST [--scenario NAME] [--ops N] [--seed S] [--depth D]
//!                         [--timeout T] [--retry R] [--slack X] [--large-permille P]
//!                         [--iface IF] [--port N] [--region-mib M]
//!   scenarios: clean | loss | delay   no fault of its own (pair adds netem loss/delay);
//!                                     every operation must complete and verify
//!              cut                    netem loss 100% on IF mid-stream, then removed
//!              linkdown               `ip link set IF down` mid-stream, then up
//!              kill                   the server aborts mid-stream; a new server
//!                                     process (started by the caller) takes over
//!              badkey                 one write with a wrong rkey mid-stream
//!   every fault must surface as one error completion within its bound, the
//!   requests behind it as flushes; then both sides reconnect and resume.
//!   defaults: --ops 10000 --seed 1 --depth 8 (lanes in flight) --region-mib 8
//!   --timeout 14 --retry 3 for faults, 7 otherwise --slack 3 --large-permille 10
//!   --iface eth0 --port 18520
//! ```
//! The client prints one machine-readable `RESULT ...` line and exits 0
//! only if the scenario's guarantees held; `EVENT ...` lines are the
//! device's asynchronous events as they arrive.

mod chan;
mod client;
mod events;
mod fault;
mod load;
mod server;

use std::process::ExitCode;

use verbs::{ArenaBuf, QueuePair};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type Qp = QueuePair<ArenaBuf>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    Clean,
    Loss,
    Delay,
    Cut,
    LinkDown,
    Kill,
    BadKey,
}

const SCENARIOS: [(&str, Scenario); 7] = [
    ("clean", Scenario::Clean),
    ("loss", Scenario::Loss),
    ("delay", Scenario::Delay),
    ("cut", Scenario::Cut),
    ("linkdown", Scenario::LinkDown),
    ("kill", Scenario::Kill),
    ("badkey", Scenario::BadKey),
];

impl Scenario {
    pub fn name(self) -> &'static str {
        SCENARIOS.iter().find(|(_, s)| *s == self).unwrap().0
    }

    /// Injects a fault mid-stream and must recover from it.
    pub fn faulty(self) -> bool {
        !matches!(self, Scenario::Clean | Scenario::Loss | Scenario::Delay)
    }
}

#[derive(Debug)]
pub struct Opts {
    pub dev: Option<String>,
    pub port: u16,
    pub scenario: Scenario,
    pub ops: u64,
    pub seed: u64,
    pub depth: usize,
    pub region: usize,
    timeout: Option<u8>,
    retry: Option<u8>,
    pub slack: f64,
    pub large_permille: u64,
    pub iface: String,
    pub generation: u64,
}

impl Opts {
    /// Local ACK timeout: the crate's default, 14 (67 ms). Smaller values
    /// fail healthy connections on this bed: rxe acknowledges a long
    /// message only every 128 packets, 128 KiB take ~17 ms on the emulated
    /// wire, so with timeout 12 (16.8 ms) four timer expiries in a row
    /// happened without a fault (RETRY_EXC_ERR mid-stream, seen here).
    pub fn timeout(&self) -> u8 {
        self.timeout
            .unwrap_or(verbs::ConnectOptions::default().timeout)
    }

    /// Retry count: the crate's default 7 (which rxe treats as "forever")
    /// for the runs that must simply complete; 3 where a bound is asserted.
    pub fn retry(&self) -> u8 {
        self.retry.unwrap_or(if self.scenario.faulty() {
            3
        } else {
            verbs::ConnectOptions::default().retry_cnt
        })
    }
}

const USAGE: &str = "usage: fault_drill server [OPTS] | fault_drill client HOST [--scenario clean|loss|delay|cut|linkdown|kill|badkey] [OPTS] (see the source's header)";

fn parse(args: &[String]) -> Result<(String, Option<String>, Opts), String> {
    let mut opts = Opts {
        dev: None,
        port: 18520,
        scenario: Scenario::Clean,
        ops: 10_000,
        seed: 1,
        depth: 8,
        region: 8 << 20,
        timeout: None,
        retry: None,
        slack: 3.0,
        large_permille: 10,
        iface: "eth0".into(),
        generation: 1,
    };
    let mut it = args.iter();
    let role = it.next().cloned().ok_or("a role: server or client")?;
    let host = match role.as_str() {
        "client" => Some(it.next().cloned().ok_or("client needs HOST")?),
        "server" => None,
        other => return Err(format!("unknown role {other:?}")),
    };
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let num = || {
            value
                .parse::<u64>()
                .map_err(|_| format!("{flag} takes a number"))
        };
        match flag.as_str() {
            "--dev" => opts.dev = Some(value.clone()),
            "--port" => opts.port = num()? as u16,
            "--scenario" => {
                opts.scenario = SCENARIOS
                    .iter()
                    .find(|(n, _)| n == value)
                    .ok_or(format!("unknown scenario {value:?}"))?
                    .1
            }
            "--ops" => opts.ops = num()?.max(2),
            "--seed" => opts.seed = num()?,
            "--depth" => opts.depth = (num()? as usize).clamp(1, 32),
            "--region-mib" => opts.region = (num()? as usize).max(1) << 20,
            "--timeout" => opts.timeout = Some(num()?.min(31) as u8),
            "--retry" => opts.retry = Some(num()?.min(7) as u8),
            "--slack" => opts.slack = value.parse().map_err(|_| "--slack takes a number")?,
            "--large-permille" => opts.large_permille = num()?.min(750),
            "--iface" => opts.iface = value.clone(),
            "--generation" => opts.generation = num()?,
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    Ok((role, host, opts))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (role, host, opts) = match parse(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("fault_drill: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if role == "server" {
        return match server::run(&opts) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("fault_drill server: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let report = client::run(&opts, &host.unwrap_or_default());
    let verdict = judge(&opts, &report);
    print_result(&opts, &report, verdict.is_ok());
    match verdict {
        Ok(()) => ExitCode::SUCCESS,
        Err(why) => {
            println!("FAIL scenario={}: {why}", opts.scenario.name());
            ExitCode::FAILURE
        }
    }
}

/// The scenario's guarantees (the fault's own checks ran in the client).
fn judge(opts: &Opts, r: &client::Report) -> Result<(), String> {
    if let Some(f) = &r.failure {
        return Err(f.clone());
    }
    if r.hangs > 0 || r.mismatches > 0 {
        return Err(format!("{} hangs, {} mismatches", r.hangs, r.mismatches));
    }
    if r.hash_ok != Some(true) {
        return Err("the server's region was not verified".into());
    }
    if !opts.scenario.faulty() {
        if !r.errors.is_empty() || r.flushed > 0 {
            return Err(format!("error completions without a fault: {:?}", r.errors));
        }
        if r.attempted < opts.ops || r.verified != r.attempted {
            return Err(format!("{} of {} verified", r.verified, r.attempted));
        }
    } else {
        match r.resumed {
            Some((a, v)) if a > 0 && a == v => {}
            other => return Err(format!("transfers did not resume and verify: {other:?}")),
        }
    }
    if opts.scenario == Scenario::LinkDown {
        for ev in ["PORT_ERR", "PORT_ACTIVE"] {
            if !r.events.iter().any(|e| e == ev) {
                return Err(format!("the {ev} event was not observed"));
            }
        }
    }
    Ok(())
}

fn print_result(opts: &Opts, r: &client::Report, ok: bool) {
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.0}"));
    let failed = r.errors.len() as u64 + r.flushed;
    println!(
        "RESULT scenario={} ops={} verified={} failed={failed} flushed={} first_error={} hangs={} mismatches={} \
         detect_ms={} bound_ms={} nominal_ms={} recover_ms={} resumed={} elapsed_ms={:.0} mb={:.1} \
         timeout={} retry_cnt={} retries={} stalled={} fresh_qp={} hash={} events={} ok={}",
        opts.scenario.name(),
        r.attempted,
        r.verified,
        r.flushed,
        r.first_error
            .map_or("none".to_string(), |(s, _)| s.to_string()),
        r.hangs,
        r.mismatches,
        opt(r.detect_ms),
        opt(r.bound_ms),
        opt(r.nominal_ms),
        opt(r.recover_ms),
        r.resumed
            .map_or("-".to_string(), |(a, v)| format!("{v}/{a}")),
        r.elapsed_ms,
        r.bytes as f64 / 1e6,
        opts.timeout(),
        opts.retry(),
        r.retries.map_or("-".to_string(), |n| n.to_string()),
        u8::from(r.stalled),
        u8::from(r.fresh_qp),
        match r.hash_ok {
            Some(true) => "ok",
            Some(false) => "MISMATCH",
            None => "-",
        },
        if r.events.is_empty() {
            "none".to_string()
        } else {
            r.events.join(",")
        },
        u8::from(ok)
    );
}
