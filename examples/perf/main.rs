//! `perf`: perftest's latency and bandwidth tests (ib_write_lat,
//! ib_read_bw, ...) on the crate's safe API, with perftest's options,
//! methodology and output, so the two can be compared figure for figure
//! (`tests/softroce/compare` does that).
//!
//! ```text
//! cargo run --release --example perf -- write_lat -s 64          # loopback, one device
//! cargo run --release --example perf -- write_bw -a              # size sweep
//! perf read_lat server            |  perf read_lat client HOST   # two hosts
//! ```
//! Modules: [`opts`] (command line), [`params`] (the tests and what one
//! size's run uses), [`side`] (a side's queue pairs and memory) and
//! [`loops`] (the measured loops; these four shared with
//! `tests/rdma_zero_alloc.rs`), [`clock`] (timestamps), [`report`]
//! (figures and output), [`remote`] (two hosts), [`rdma_cm`] (`-R`),
//! [`perftest_wire`], [`perftest_peer`] and [`perftest_msg`] (two hosts,
//! the other one running perftest's `ib_*` tools: `--perftest-wire`).

mod clock;
mod loops;
mod opts;
mod params;
mod perftest_msg;
mod perftest_peer;
mod perftest_wire;
mod rdma_cm;
mod remote;
mod report;
mod side;
mod stream;

use std::process::ExitCode;
use std::time::Duration;

use verbs::{Context, ProtectionDomain};

use clock::Clock;
use opts::{Opts, Role};
use params::{Params, Test};
use report::Json;
use side::Side;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match Opts::parse(&args) {
        Ok(o) => o,
        Err(msg) if msg.is_empty() => {
            println!("{}", opts::USAGE);
            return ExitCode::SUCCESS;
        }
        Err(msg) => {
            eprintln!("perf: {msg}\n{}", opts::USAGE);
            return ExitCode::from(2);
        }
    };
    let clock = Clock::calibrate(Duration::from_millis(100));
    let result = match &opts.role {
        Role::Loopback => loopback(&opts, &clock),
        Role::Server => remote::run(&opts, &clock, None),
        Role::Client(host) => remote::run(&opts, &clock, Some(host)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("perf: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Opens the device (`-d`) and allocates a protection domain on it.
pub fn open(opts: &Opts) -> Result<ProtectionDomain, BoxError> {
    Ok(ProtectionDomain::new(&Context::open(opts.dev.as_deref())?)?)
}

/// Both sides in this process: two sets of QPs on one device, connected
/// to each other; the passive side's loop (if it has one) on a thread.
fn loopback(opts: &Opts, clock: &Clock) -> Result<(), BoxError> {
    let setup = opts.setup()?;
    let (mut a, mut b, mode) = if opts.rdma_cm {
        let (a, b) = rdma_cm::loopback(opts, &setup)?;
        (
            a,
            b,
            "loopback over rdma_cm (both sides on one device, one process)",
        )
    } else {
        let (a, b) = Side::loopback_pair(&open(opts)?, &setup)?;
        (a, b, "loopback (both sides on one device, one process)")
    };
    let mut out = Output::new(opts, &a, clock, mode)?;
    for size in opts.sizes() {
        let pa = opts.params(&a, size, true, clock)?;
        let pb = opts.params(&b, size, false, clock)?;
        a.prepare(&pa)?;
        b.prepare(&pb)?;
        out.note_depth(&pa, a.depth());
        loops::warm_up(&mut a, &pa)?;
        if opts.test.peer_is_active() {
            std::thread::scope(|s| {
                let peer = s.spawn(|| loops::run(&mut b, &pb));
                let mine = loops::run(&mut a, &pa);
                let theirs = peer.join().map_err(|_| "the peer thread panicked")?;
                mine.and(theirs).map_err(BoxError::from)
            })?;
        } else {
            loops::run(&mut a, &pa)?;
        }
        out.result(&a, &pa);
    }
    out.finish();
    Ok(())
}

/// perftest's name of a test (`RDMA_Write_Latency_Test`).
fn perftest_name(test: Test) -> &'static str {
    match test {
        Test::WriteLat => "RDMA_Write_Latency_Test",
        Test::ReadLat => "RDMA_Read_Latency_Test",
        Test::SendLat => "Send_Latency_Test",
        Test::AtomicLat => "Atomic_FETCH_AND_ADD_Latency_Test",
        Test::WriteBw => "RDMA_Write_BW_Test",
        Test::ReadBw => "RDMA_Read_BW_Test",
        Test::SendBw => "Send_BW_Test",
    }
}

/// Prints the header, one line per size and (with `--json`) the document.
pub struct Output<'a> {
    opts: &'a Opts,
    clock: &'a Clock,
    info: Vec<(&'static str, Json)>,
    results: Vec<Json>,
    header_done: bool,
}

impl<'a> Output<'a> {
    pub fn new(
        opts: &'a Opts,
        side: &Side,
        clock: &'a Clock,
        mode: &str,
    ) -> Result<Output<'a>, BoxError> {
        let qp = &side.lanes[0].qp;
        let mtu = qp.query()?.path_mtu;
        let link = match qp.port()?.link_layer() {
            verbs::device::LinkLayer::ETHERNET => "Ethernet",
            _ => "IB",
        };
        let inline = opts.inline_request().min(qp.caps()?.max_inline_data);
        let gid = qp.gid()?.map(|g| g.index);
        let cq_mod = opts.cq_mod(opts.sizes()[0]);
        let wait = if opts.spin_hint {
            "spin with a CPU pause hint per empty poll"
        } else {
            "re-poll at once, as perftest"
        };
        let mut info: Vec<(&'static str, Json)> = vec![
            ("test", Json::Str(perftest_name(opts.test).into())),
            ("Device", Json::Str(qp.pd().context().name().into())),
            ("Number_of_qps", Json::Int(opts.qps as u64)),
            ("Connection_type", Json::Str("RC".into())),
            ("TX_depth", Json::Int(u64::from(opts.tx_depth()))),
        ];
        if !opts.test.is_latency() {
            info.push(("CQ_Moderation", Json::Int(u64::from(cq_mod))));
        }
        if opts.post_list > 1 {
            info.push(("Post_List", Json::Int(u64::from(opts.post_list))));
        }
        info.extend([
            ("Mtu", Json::Int(u64::from(mtu.bytes().unwrap_or(0)))),
            ("Link_type", Json::Str(link.into())),
            (
                "GID_index",
                match gid {
                    _ if opts.rdma_cm => Json::Str("chosen by rdma_cm".into()),
                    Some(g) => Json::Int(g.into()),
                    None => Json::Str("none".into()),
                },
            ),
            ("Max_inline_data", Json::Int(inline.into())),
            ("mode", Json::Str(mode.into())),
            ("wait", Json::Str(wait.into())),
            ("clock", Json::Str(clock.source())),
        ]);
        if opts.warm_up {
            let what = "one window per QP before each size (perftest's --perform_warm_up)";
            info.push(("warm_up", Json::Str(what.into())));
        }
        Ok(Output {
            opts,
            clock,
            info,
            results: Vec::new(),
            header_done: false,
        })
    }

    /// Says so when buffer memory kept fewer requests in flight than asked.
    pub fn note_depth(&self, p: &Params, depth: u32) {
        if !p.test.is_latency() && p.initiator && depth < p.tx_depth {
            eprintln!(
                "perf: {} B: {depth} requests in flight instead of {} (each owns a buffer; --buf-mem {} MiB)",
                p.size, p.tx_depth, self.opts.buf_mem_mib
            );
        }
    }

    fn header(&mut self) {
        if self.header_done || self.opts.json {
            return;
        }
        self.header_done = true;
        let rule = "-".repeat(87);
        println!("{rule}");
        let title = perftest_name(self.opts.test).replace('_', " ");
        println!("                    {title} (verbs perf)");
        for (k, v) in &self.info {
            if *k != "test" {
                println!(
                    " {:<16}: {}",
                    k.replace('_', " "),
                    v.render().trim_matches('"')
                );
            }
        }
        println!("{rule}");
        println!(
            "{}",
            if self.opts.test.is_latency() {
                report::LAT_HEADER
            } else {
                report::BW_HEADER
            }
        );
    }

    /// Reports the run `side` just made with `p`.
    pub fn result(&mut self, side: &Side, p: &Params) {
        let s = &side.stamps;
        if !p.test.is_latency() {
            let b = report::bandwidth(p.size, &s.posted, &s.completed, self.clock);
            return self.bandwidth(&b);
        }
        self.header();
        let halve = matches!(p.test, Test::WriteLat | Test::SendLat);
        let l = report::latency(p.size, &s.posted, halve, self.clock);
        if !self.opts.json {
            println!("{}", report::latency_line(&l));
        }
        self.results.push(report::latency_json(&l));
    }

    /// Reports bandwidth figures (measured here, or by the peer).
    pub fn bandwidth(&mut self, b: &report::Bandwidth) {
        self.header();
        if !self.opts.json {
            println!("{}", report::bandwidth_line(b));
        }
        self.results.push(report::bandwidth_json(b));
    }

    /// Closes the table or prints the JSON document.
    pub fn finish(self) {
        if !self.opts.json {
            println!("{}", "-".repeat(87));
            return;
        }
        let mut results = self.results;
        let results = if results.len() == 1 {
            results.remove(0)
        } else {
            Json::Arr(results)
        };
        let doc = Json::Obj(vec![
            ("test_info", Json::Obj(self.info)),
            ("results", results),
        ]);
        println!("{}", doc.render());
    }
}
