//! Command line: perftest's option letters and defaults.
//! `Opts::setup` and `Opts::params` turn it into what a side is built with
//! and what one size's run uses (shared with `tests/rdma_zero_alloc.rs`).

use std::time::Duration;

use verbs::Mtu;

use super::clock::Clock;
use super::loops::MAX_CHAIN;
use super::params::{Params, Test};
use super::side::{Setup, Side};

/// A wait with no progress for this long means the peer is gone.
const STALL: Duration = Duration::from_secs(30);

pub const USAGE: &str = "\
usage: perf TEST [OPTIONS] [server | client HOST]
  TEST: write_lat read_lat send_lat atomic_lat write_bw read_bw send_bw
  Without server/client: both sides in this process, two QPs on one device
  connected to each other (loopback).
  -d, --ib-dev DEV        device (default: the first)
  -i, --ib-port N         port (default 1)
  -x, --gid-index N       GID index (default: chosen, RoCE v2 IPv4-mapped first)
  -m, --mtu BYTES         largest path MTU (default: the port's)
  -p, --port N            TCP port of the endpoint exchange, and the rdma_cm
                          port with -R (default 18515)
      --perftest-wire     speak perftest's own out-of-band exchange, to run
                          against ib_write_bw, ib_read_lat, ... on the other
                          host (not send_bw, not with -R); a server takes a
                          perftest client without it (by its first byte)
  -R, --rdma_cm           connect the queue pairs with rdma_cm (build with
                          --features rdmacm): it finds GID, MTU and port by
                          address; HOST must be the server's RDMA address
  -s, --size BYTES        message size (default 2 lat, 65536 bw, 8 atomic)
  -a, --all               sweep sizes 2 B .. 8 MiB, powers of two
  -n, --iters N           iterations (default 1000; 5000 for write_bw)
  -t, --tx-depth N        requests in flight per QP (bw; default 128)
  -r, --rx-depth N        receives kept posted (send tests; default 512)
  -I, --inline_size N     largest inline message (default 220 write_lat,
                          236 send_lat, 0 otherwise; capped at what the
                          device grants)
  -Q, --cq-mod N          signal every N-th request (bw; default 100, 1 above
                          8 KiB unless -a, the post list length with -l)
  -l, --post_list N       requests per post call, one doorbell (bw; default 1,
                          at most 32); alias --chain
  -q, --qp N              queue pairs (bw; default 1)
      --spin-hint         one CPU spin-wait hint (x86 PAUSE) per empty poll,
                          as QueuePair::wait does; default: re-poll at once,
                          perftest's loop
      --plain             bw sender: every request owns an arena buffer and is
                          posted with post_send and handed back by the poll
                          (default: one prepared request posted again and
                          again, perftest's one buffer; chains with -l are
                          always plain)
      --buf-mem MIB       local buffer memory per side (default 64): each
                          request in flight owns a buffer, so large sizes
                          keep fewer in flight
      --perform_warm_up   before measuring each size, post and complete one
                          window per QP (tx_depth requests, the post list
                          with -l): perftest's option, for write_bw and
                          read_bw; off by default, and the latency tests
                          never warm up, as in perftest
      --setup-timeout SECS
                          how long to wait for the peer and for connection
                          set-up (default 120; a side under valgrind needs
                          more)
      --json              print one JSON object (perftest's --out_json keys)";

/// Which side of a two-host run, or both in one process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Both sides here.
    Loopback,
    /// Wait for a client.
    Server,
    /// Connect to the server at this host.
    Client(String),
}

/// The parsed command line (before device capabilities are known).
#[derive(Clone, Debug)]
pub struct Opts {
    pub test: Test,
    pub role: Role,
    pub dev: Option<String>,
    pub ib_port: u8,
    pub gid_index: Option<u32>,
    pub mtu: Option<u32>,
    pub tcp_port: u16,
    pub size: Option<usize>,
    pub all: bool,
    pub warm_up: bool,
    pub iters: Option<u64>,
    pub tx_depth: Option<u32>,
    pub rx_depth: u32,
    pub inline: Option<u32>,
    pub cq_mod: Option<u32>,
    pub post_list: u32,
    pub qps: usize,
    pub spin_hint: bool,
    pub plain: bool,
    pub buf_mem_mib: usize,
    /// How long to wait for the peer and for connection set-up.
    pub setup_timeout: Duration,
    pub json: bool,
    pub rdma_cm: bool,
    /// Speak perftest's out-of-band exchange (`perftest_wire`).
    pub perftest_wire: bool,
}

/// Largest size of the `-a` sweep (perftest's 8 MiB).
pub const MAX_SWEEP: usize = 8 << 20;

/// Above this perftest turns completion moderation off (unless asked).
const CQ_MOD_SIZE_LIMIT: usize = 8192;

impl Opts {
    /// Parses `args` (without the program name).
    pub fn parse(args: &[String]) -> Result<Opts, String> {
        let mut it = args.iter();
        let first = it.next().ok_or("no test given")?;
        if first == "-h" || first == "--help" {
            return Err(String::new());
        }
        let test = Test::from_name(first).ok_or(format!("unknown test {first:?}"))?;
        let mut o = Opts {
            test,
            role: Role::Loopback,
            dev: None,
            ib_port: 1,
            gid_index: None,
            mtu: None,
            tcp_port: 18515,
            size: None,
            all: false,
            warm_up: false,
            iters: None,
            tx_depth: None,
            rx_depth: 512,
            inline: None,
            cq_mod: None,
            post_list: 1,
            qps: 1,
            spin_hint: false,
            plain: false,
            buf_mem_mib: 64,
            setup_timeout: Duration::from_secs(120),
            json: false,
            rdma_cm: false,
            perftest_wire: false,
        };
        while let Some(arg) = it.next() {
            // `--name=value` or `--name value` / `-x value`.
            let (name, inline_value) = match arg.split_once('=') {
                Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
                _ => (arg.as_str(), None),
            };
            let mut value = || {
                inline_value
                    .clone()
                    .or_else(|| it.next().cloned())
                    .ok_or(format!("{name} needs a value"))
            };
            match name {
                "server" if o.role == Role::Loopback => o.role = Role::Server,
                "client" if o.role == Role::Loopback => o.role = Role::Client(value()?),
                "-d" | "--ib-dev" => o.dev = Some(value()?),
                "-i" | "--ib-port" => o.ib_port = num(name, &value()?)?,
                "-x" | "--gid-index" => o.gid_index = Some(num(name, &value()?)?),
                "-m" | "--mtu" => o.mtu = Some(num(name, &value()?)?),
                "-p" | "--port" => o.tcp_port = num(name, &value()?)?,
                "-s" | "--size" => o.size = Some(num(name, &value()?)?),
                "-a" | "--all" => o.all = true,
                "--perform_warm_up" => o.warm_up = true,
                "-n" | "--iters" => o.iters = Some(num(name, &value()?)?),
                "-t" | "--tx-depth" => o.tx_depth = Some(num(name, &value()?)?),
                "-r" | "--rx-depth" => o.rx_depth = num(name, &value()?)?,
                "-I" | "--inline_size" => o.inline = Some(num(name, &value()?)?),
                "-Q" | "--cq-mod" => o.cq_mod = Some(num(name, &value()?)?),
                "-l" | "--post_list" | "--chain" => o.post_list = num(name, &value()?)?,
                "-q" | "--qp" => o.qps = num(name, &value()?)?,
                "--spin-hint" => o.spin_hint = true,
                "--plain" => o.plain = true,
                "--buf-mem" => o.buf_mem_mib = num(name, &value()?)?,
                "--setup-timeout" => {
                    o.setup_timeout = Duration::from_secs(num(name, &value()?)?);
                }
                "--json" => o.json = true,
                "-R" | "--rdma_cm" => o.rdma_cm = true,
                "--perftest-wire" => o.perftest_wire = true,
                "-h" | "--help" => return Err(String::new()),
                other => return Err(format!("unexpected argument {other:?}")),
            }
        }
        o.check()?;
        Ok(o)
    }

    fn check(&self) -> Result<(), String> {
        let lat = self.test.is_latency();
        if lat && (self.tx_depth.is_some() || self.cq_mod.is_some() || self.post_list != 1) {
            return Err("-t, -Q and -l apply to bandwidth tests".into());
        }
        if lat && self.qps != 1 {
            return Err("latency tests use one queue pair".into());
        }
        if self.qps == 0 || self.iters == Some(0) || self.size == Some(0) {
            return Err("-q, -n and -s must be at least 1".into());
        }
        if self.test == Test::AtomicLat && self.size.is_some_and(|s| s != 8) {
            return Err("atomics are 8 bytes".into());
        }
        if self.size.is_some_and(|s| s > MAX_SWEEP) {
            return Err(format!("-s above {MAX_SWEEP}"));
        }
        if !(1..=MAX_CHAIN as u32).contains(&self.post_list) {
            return Err(format!("-l takes 1 to {MAX_CHAIN}"));
        }
        if self.tx_depth == Some(0) || self.cq_mod == Some(0) || self.rx_depth == 0 {
            return Err("-t, -Q and -r must be at least 1".into());
        }
        if self.rdma_cm && (self.gid_index.is_some() || self.ib_port != 1) {
            return Err(
                "-R: rdma_cm chooses the GID and port from the address (drop -x, -i)".into(),
            );
        }
        if self.perftest_wire && (self.rdma_cm || self.test == Test::SendBw) {
            return Err(
                "--perftest-wire: send_bw and -R (perftest's rdma_cm exchange) are not supported"
                    .into(),
            );
        }
        if self.perftest_wire && self.role == Role::Loopback {
            return Err("--perftest-wire is for server or client HOST".into());
        }
        if self.post_list > self.tx_depth() {
            return Err("-l above the tx depth: a chain could never be posted".into());
        }
        if self.cq_mod.is_some_and(|q| self.post_list % q != 0) && self.post_list > 1 {
            return Err("-l must be a multiple of -Q (as perftest)".into());
        }
        Ok(())
    }

    /// The message sizes to run.
    pub fn sizes(&self) -> Vec<usize> {
        if self.test == Test::AtomicLat {
            return vec![8];
        }
        if self.all {
            return (1..=MAX_SWEEP.trailing_zeros())
                .map(|e| 1usize << e)
                .collect();
        }
        vec![self
            .size
            .unwrap_or(if self.test.is_latency() { 2 } else { 65536 })]
    }

    /// Iterations per QP (perftest: 5000 for write_bw, 1000 otherwise).
    pub fn iters(&self) -> u64 {
        self.iters.unwrap_or(if self.test == Test::WriteBw {
            5000
        } else {
            1000
        })
    }

    /// Requests in flight per QP: 1 for latency, 128 for bandwidth, at most
    /// the iterations (as perftest).
    pub fn tx_depth(&self) -> u32 {
        let d = if self.test.is_latency() {
            1
        } else {
            self.tx_depth.unwrap_or(128)
        };
        (u64::from(d).min(self.iters())) as u32
    }

    /// The inline size to ask the device for (perftest's defaults: 220 for
    /// write_lat, 236 for send_lat, else 0; never for reads and atomics).
    pub fn inline_request(&self) -> u32 {
        if !self.test.can_inline() {
            return 0;
        }
        self.inline.unwrap_or(match self.test {
            Test::WriteLat => 220,
            Test::SendLat => 236,
            _ => 0,
        })
    }

    /// Completion moderation for `size`: every request for latency tests;
    /// else as asked, or the post list length, or 100 (1 above 8 KiB
    /// unless sweeping, as perftest); never above the tx depth.
    pub fn cq_mod(&self, size: usize) -> u32 {
        if self.test.is_latency() {
            return 1;
        }
        let q = match self.cq_mod {
            Some(q) => q,
            None if self.post_list > 1 => self.post_list,
            None if size > CQ_MOD_SIZE_LIMIT && !self.all => 1,
            None => 100,
        };
        q.min(self.tx_depth()).max(1)
    }

    /// How one side's resources are built.
    pub fn setup(&self) -> Result<Setup, String> {
        let max_size = self.sizes().into_iter().max().unwrap_or(2);
        Ok(Setup {
            test: self.test,
            qps: self.qps,
            max_size,
            inbox_len: max_size,
            tx_depth: self.tx_depth(),
            post_list: self.post_list,
            rx_depth: self.rx_depth,
            inline: self.inline_request(),
            port: self.ib_port,
            gid_index: self.gid_index,
            mtu: match self.mtu {
                Some(b) => Mtu::from_bytes(b).ok_or("-m takes 256, 512, 1024, 2048 or 4096")?,
                None => Mtu::MTU_4096,
            },
            buf_mem: self.buf_mem_mib.max(1) << 20,
        })
    }

    /// The knobs of one size's run on `side`.
    pub fn params(
        &self,
        side: &Side,
        size: usize,
        initiator: bool,
        clock: &Clock,
    ) -> Result<Params, verbs::Error> {
        let granted = side.lanes[0].qp.caps()?.max_inline_data as usize;
        Ok(Params {
            test: self.test,
            size,
            iters: self.iters(),
            tx_depth: self.tx_depth(),
            cq_mod: self.cq_mod(size),
            post_list: self.post_list,
            inline: (self.inline_request() as usize).min(granted),
            rx_depth: self.rx_depth,
            initiator,
            spin_hint: self.spin_hint,
            plain: self.plain,
            warm_up: self.warm_up && matches!(self.test, Test::WriteBw | Test::ReadBw),
            stall: clock.ticks_in(STALL),
        })
    }

    /// What both sides of a two-host run must agree on.
    pub fn fingerprint(&self) -> String {
        format!(
            "perf/1 {} sizes={:?} iters={} tx={} rx={} inline={} cq={:?} list={} qps={} cm={} warm={} plain={}",
            self.test.name(),
            self.sizes(),
            self.iters(),
            self.tx_depth(),
            self.rx_depth,
            self.inline_request(),
            self.cq_mod,
            self.post_list,
            self.qps,
            self.rdma_cm,
            self.warm_up,
            self.plain
        )
    }
}

fn num<T: std::str::FromStr>(name: &str, v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| format!("{name} takes a number, not {v:?}"))
}
