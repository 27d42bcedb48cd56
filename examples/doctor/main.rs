//! Runs the primer's first-suspect checklist (sections 4.2, 6, 7.4) on one
//! device and port, then a loopback self-test of every one-sided and
//! two-sided operation. One line per check: `[ok]`, `[warn]` or `[FAIL]`,
//! with what is wrong and how to fix it.
//!
//! ```text
//! cargo run --example doctor [-- --dev NAME] [--port N] [--gid-index N] [--max-mtu BYTES]
//!                               [--hop-limit N] [--traffic-class N]
//! ```
//! `--max-mtu`, `--hop-limit` and `--traffic-class` are what the self-test
//! connects with (`QpConfig::max_mtu`, `ConnectOptions`); the defaults are
//! the crate's. Exit status 1 when any check fails (warnings do not count),
//! 2 on bad usage.
//!
//! This file: the command line, the [`Report`] and the order of the checks
//! ([`diagnose`]). Modules: [`checks`] (the port, GID, addressing, MTU,
//! memlock, access and RNR checks) and [`self_test`] (the loopback test of
//! every verb).

mod checks;
mod self_test;

use std::fmt::Display;
use std::process::ExitCode;

use verbs::device::LinkLayer;
use verbs::sys::ibv_atomic_cap;
use verbs::{Access, ConnectOptions, Context, Mtu, ProtectionDomain, QpConfig};

pub(crate) use checks::check_gids;
use checks::{
    check_access, check_addressing, check_memlock, check_mtu, check_port_state, report_rnr,
};
use self_test::self_test;

const USAGE: &str = "usage: doctor [--dev NAME] [--port N] [--gid-index N] [--max-mtu BYTES] \
                     [--hop-limit N] [--traffic-class N]";
/// Remote write, read and atomic.
const REMOTE: Access = Access::REMOTE;

struct Options {
    dev: Option<String>,
    port: u8,
    gid_index: Option<u32>,
    /// The self-test's `QpConfig::max_mtu`.
    max_mtu: Mtu,
    /// The self-test's GRH settings.
    connect: ConnectOptions,
}

/// Prints the check lines, keeps them, and counts them by outcome.
/// (`tests/rdma_diagnostics.rs` includes this file to run checks on tables
/// no device in CI has.)
#[derive(Default)]
pub(crate) struct Report {
    failed: usize,
    warned: usize,
    passed: usize,
    pub(crate) lines: Vec<String>,
}

impl Report {
    fn ok(&mut self, check: &str, msg: impl Display) {
        self.passed += 1;
        self.print(format!("[ok]   {check}: {msg}"));
    }
    fn warn(&mut self, check: &str, msg: impl Display) {
        self.warned += 1;
        self.print(format!("[warn] {check}: {msg}"));
    }
    fn fail(&mut self, check: &str, msg: impl Display) {
        self.failed += 1;
        self.print(format!("[FAIL] {check}: {msg}"));
    }
    fn print(&mut self, line: String) {
        println!("{line}");
        self.lines.push(line);
    }
    /// The process exit status: 1 when a check failed (warnings do not count).
    pub(crate) fn exit_status(&self) -> u8 {
        u8::from(self.failed > 0)
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match parse(&args) {
        Ok(opts) => opts,
        Err(msg) => {
            eprintln!("doctor: {msg}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let mut report = Report::default();
    diagnose(&opts, &mut report);
    println!(
        "doctor: {} ok, {} warnings, {} failed",
        report.passed, report.warned, report.failed
    );
    ExitCode::from(report.exit_status())
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut opts = Options {
        dev: None,
        port: 1,
        gid_index: None,
        max_mtu: QpConfig::default().max_mtu,
        connect: ConnectOptions::default(),
    };
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let value = rest.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--dev" => opts.dev = Some(value?.clone()),
            "--port" => opts.port = value?.parse().map_err(|_| "--port takes a number 1..255")?,
            "--gid-index" => {
                opts.gid_index = Some(value?.parse().map_err(|_| "--gid-index takes a number")?)
            }
            "--max-mtu" => {
                opts.max_mtu = value?
                    .parse()
                    .ok()
                    .and_then(Mtu::from_bytes)
                    .ok_or("--max-mtu takes 256, 512, 1024, 2048 or 4096")?
            }
            "--hop-limit" => {
                opts.connect.hop_limit = value?
                    .parse()
                    .map_err(|_| "--hop-limit takes a number 0..255")?
            }
            "--traffic-class" => {
                opts.connect.traffic_class = value?
                    .parse()
                    .map_err(|_| "--traffic-class takes a number 0..255")?
            }
            other => return Err(format!("unexpected argument {other:?}")),
        }
    }
    Ok(opts)
}

/// The checks in the order a connection needs them; a check whose
/// prerequisite failed is not run (its failure would only repeat the cause).
fn diagnose(opts: &Options, r: &mut Report) {
    let ctx = match Context::open(opts.dev.as_deref()) {
        Ok(ctx) => {
            r.ok("device", format!("{} opens", ctx.name()));
            ctx
        }
        Err(e) => {
            let names: Vec<String> = verbs::devices()
                .unwrap_or_default()
                .into_iter()
                .map(|d| d.name)
                .collect();
            if names.is_empty() {
                r.fail("device", e);
            } else {
                r.fail("device", format!("{e} (present: {})", names.join(", ")));
            }
            return;
        }
    };
    let port = match ctx.query_port(opts.port) {
        Ok(port) => port,
        Err(e) => return r.fail("port", e),
    };
    let table = match ctx.gid_table(opts.port) {
        Ok(table) => table,
        Err(e) => return r.fail("GID table", e),
    };
    // The fixes below name the port's network device (RoCE) when there is one.
    let netdev = table.iter().find_map(|e| e.netdev());
    let active = check_port_state(opts.port, &port, netdev.as_deref(), r);
    let gid = check_gids(opts.gid_index, &port, &table, r);
    // RoCE addresses by GID only: without one the GID line said it all.
    let needs_gid = port.link_layer() != LinkLayer::INFINIBAND;
    let addressed = !(needs_gid && gid.is_none()) && check_addressing(&port, gid, r);
    check_mtu(&port, netdev.as_deref(), opts.max_mtu, r);

    let pd = match ProtectionDomain::new(&ctx) {
        Ok(pd) => pd,
        Err(e) => return r.fail("protection domain", e),
    };
    check_memlock(&pd, r);
    check_access(&pd, r);
    report_rnr(ctx.name(), opts.port, r);

    if !(active && addressed) {
        return r.fail(
            "loopback self-test",
            "not run: fix the port/GID/addressing failures above first",
        );
    }
    let atomics = ctx
        .query_device()
        .is_ok_and(|d| d.atomic_cap() != ibv_atomic_cap::NONE);
    self_test(&pd, opts, atomics, r);
}
