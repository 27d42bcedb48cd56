//! `examples/perf` itself on a real device: every test in loopback, two
//! processes as server and client, and (feature `rdmacm`) the same with
//! `-R`, where rdma_cm creates and connects the queue pairs. Short runs:
//! this checks that each mode works and reports perftest's figures, not
//! how fast (that is `tests/softroce/compare`).

mod support;

use std::process::{Command, Stdio};

/// Each test briefly, with the option that exercises its particular path.
const TESTS: &[&[&str]] = &[
    &["write_lat", "-n", "200"],
    &["write_lat", "-n", "200", "-I", "0"],
    &["read_lat", "-n", "200"],
    &["send_lat", "-n", "200"],
    &["atomic_lat", "-n", "200"],
    &["write_bw", "-n", "1000", "-s", "4096", "-l", "8"],
    &["read_bw", "-n", "500", "-s", "4096", "-q", "2"],
    &["send_bw", "-n", "1000", "-s", "64", "-q", "2"],
    &["write_bw", "-n", "1000", "-s", "4096", "--perform_warm_up"],
    &[
        "read_bw",
        "-n",
        "500",
        "-s",
        "65536",
        "-l",
        "4",
        "--perform_warm_up",
    ],
];

/// Runs perf with `args`; asserts success and returns its JSON output.
fn perf(args: &[&str]) -> String {
    let (ok, out) = support::run(Command::new(support::example("perf")).args(args));
    assert!(ok, "perf {args:?} failed");
    out
}

/// The figure perftest's `--out_json` names `key`, from a result line.
fn figure(json: &str, key: &str) -> f64 {
    let at = json
        .find(&format!("\"{key}\""))
        .unwrap_or_else(|| panic!("no {key} in {json}"));
    let rest = json[at..].split_once(':').expect("key: value").1;
    let num: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    num.parse()
        .unwrap_or_else(|_| panic!("{key} is not a number in {json}"))
}

/// A latency run reports a positive typical latency; a bandwidth run a
/// positive average bandwidth.
fn check_result(args: &[&str], json: &str) {
    let key = if args[0].ends_with("_lat") {
        "t_typical"
    } else {
        "BW_average"
    };
    assert!(figure(json, key) > 0.0, "{args:?}: {key} in {json}");
}

fn device_name(test: &str) -> String {
    support::test_context(test).name().to_string()
}

#[test]
fn every_test_runs_in_loopback() {
    let dev = device_name("perf loopback");
    for t in TESTS {
        let args: Vec<&str> = t.iter().copied().chain(["-d", &dev, "--json"]).collect();
        check_result(&args, &perf(&args));
    }
}

/// `-a` runs every power of two from 2 B to 8 MiB (perftest's sweep) to
/// the end, each with its figures.
#[test]
fn the_size_sweep_covers_every_size() {
    let dev = device_name("perf -a");
    let args = ["write_lat", "-a", "-n", "20", "-d", &dev, "--json"];
    let json = perf(&args);
    let results: Vec<&str> = json.split("\"MsgSize\"").skip(1).collect();
    let sizes: Vec<u64> = results
        .iter()
        .map(|r| figure(&format!("\"MsgSize\"{r}"), "MsgSize") as u64)
        .collect();
    let every: Vec<u64> = (1..=23).map(|e| 1u64 << e).collect();
    assert_eq!(sizes, every, "sizes of the sweep in {json}");
    for r in results {
        check_result(&args, r);
    }
}

/// The warm-up says so in the report (and runs: `TESTS` has both tests
/// that take it).
#[test]
fn the_warm_up_is_reported() {
    let dev = device_name("perf --perform_warm_up");
    let json = perf(&[
        "write_bw",
        "-n",
        "200",
        "--perform_warm_up",
        "-d",
        &dev,
        "--json",
    ]);
    assert!(json.contains("\"warm_up\""), "no warm_up line in {json}");
    let json = perf(&["write_bw", "-n", "200", "-d", &dev, "--json"]);
    assert!(
        !json.contains("\"warm_up\""),
        "a warm_up line without the option: {json}"
    );
}

/// Server and client as two processes on this host; both print the
/// ping-pong latencies (write_lat), the client the others.
fn server_and_client(extra: &[&str], port: u16, host: &str) {
    let port = port.to_string();
    for t in [TESTS[0], TESTS[2], TESTS[7]] {
        let args: Vec<&str> = t
            .iter()
            .copied()
            .chain(extra.iter().copied())
            .chain(["-p", &port, "--json"])
            .collect();
        let server = Command::new(support::example("perf"))
            .args(&args)
            .arg("server")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the perf server");
        let client = perf(&[&args[..], &["client", host]].concat());
        let server = server.wait_with_output().expect("the perf server");
        assert!(server.status.success(), "perf server {args:?} failed");
        check_result(&args, &client);
        if extra.contains(&"-R") {
            assert!(client.contains("chosen by rdma_cm"), "{client}");
        }
        if args[0] == "write_lat" {
            check_result(&args, &String::from_utf8_lossy(&server.stdout));
        }
    }
}

#[test]
fn server_and_client_over_the_endpoint_exchange() {
    let dev = device_name("perf server/client");
    server_and_client(&["-d", &dev], 18611, "127.0.0.1");
}

#[cfg(feature = "rdmacm")]
mod rdma_cm {
    use super::*;

    /// The device's IPv4 address: rdma_cm connects by address.
    fn device_addr(dev: &str) -> String {
        let ctx = verbs::Context::open(Some(dev)).unwrap();
        support::device_ipv4(&ctx).to_string()
    }

    #[test]
    fn every_test_runs_in_loopback_over_rdma_cm() {
        let dev = device_name("perf -R loopback");
        for (i, t) in TESTS.iter().enumerate() {
            let port = (18620 + i).to_string();
            let args: Vec<&str> = t
                .iter()
                .copied()
                .chain(["-R", "-d", &dev, "-p", &port, "--json"])
                .collect();
            let out = perf(&args);
            assert!(out.contains("chosen by rdma_cm"), "{out}");
            check_result(&args, &out);
        }
    }

    #[test]
    fn server_and_client_over_rdma_cm() {
        let dev = device_name("perf -R server/client");
        server_and_client(&["-R"], 18640, &device_addr(&dev));
    }

    #[test]
    fn a_gid_index_with_rdma_cm_is_refused() {
        let (ok, out) = support::run(Command::new(support::example("perf")).args([
            "write_lat",
            "-R",
            "-x",
            "1",
        ]));
        assert!(!ok && out.is_empty(), "refused before any output");
    }
}
