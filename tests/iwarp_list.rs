//! The iWARP run (`tests/softroce/iwarp`) takes its binaries and the tests
//! that do not apply from `tests/softroce/README.md`: every binary named
//! there is a device test binary, every skipped test one of its tests, and
//! every skip says why (a renamed test would otherwise run, or a typo skip
//! nothing, unnoticed).

use std::path::Path;

const README: &str = include_str!("softroce/README.md");

/// The source of test binary `bin` (`tests/BIN.rs` or `tests/BIN/main.rs`).
fn source(bin: &str) -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let file = dir.join(format!("{bin}.rs"));
    let file = if file.is_file() {
        file
    } else {
        dir.join(bin).join("main.rs")
    };
    std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

fn binaries() -> Vec<String> {
    let line = README
        .lines()
        .find_map(|l| l.strip_prefix("Binaries run on siw0: "))
        .expect("a 'Binaries run on siw0:' line");
    line.split_whitespace()
        .map(|b| b.trim_matches(|c| c == '`' || c == '.' || c == ','))
        .map(String::from)
        .collect()
}

/// (binary, test, why) of the skip table.
fn skips() -> Vec<(String, String, String)> {
    let start = README.find("<!-- iwarp skips -->").expect("the skip table");
    let end = README.find("<!-- end iwarp skips -->").expect("its end");
    README[start..end]
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(|c| c.trim().trim_matches('`')).collect();
            (cells.len() == 5 && cells[1].starts_with("rdma_"))
                .then(|| (cells[1].into(), cells[2].into(), cells[3].into()))
        })
        .collect()
}

#[test]
fn every_binary_run_on_siw_is_a_device_test_binary() {
    let bins = binaries();
    assert!(bins.len() > 10, "{bins:?}");
    for bin in &bins {
        assert!(bin.starts_with("rdma_"), "{bin}: device tests are rdma_*");
        assert!(source(bin).contains("#[test]"), "{bin} has tests");
    }
}

#[test]
fn every_skip_names_a_test_of_a_binary_run_and_says_why() {
    let bins = binaries();
    let skips = skips();
    assert!(!skips.is_empty());
    for (bin, test, why) in &skips {
        assert!(
            bins.contains(bin),
            "{bin} is not run on siw0: skip nothing in it"
        );
        assert!(
            source(bin).contains(&format!("fn {test}(")),
            "{bin} has no test {test}"
        );
        assert!(why.len() > 10, "{bin}::{test}: say why it does not apply");
        // One test per name across the binaries run: --skip is by name.
        for other in bins.iter().filter(|b| *b != bin) {
            assert!(
                !source(other).contains(&format!("fn {test}(")),
                "{test} is also a test of {other}: a skip would drop both"
            );
        }
    }
}

/// Every device test binary is either run on siw0 or in the table of those
/// that are not, with why (a new binary is not left out unnoticed).
#[test]
fn every_device_test_binary_is_run_on_siw_or_says_why_not() {
    let start = README
        .find("The device test binaries not run on siw0:")
        .expect("the table of binaries not run");
    let table = &README[start..];
    let table = &table[..table.find("\n## ").unwrap_or(table.len())];
    let mut not_run = Vec::new();
    for row in table.lines().filter(|l| l.starts_with("| `rdma_")) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        assert!(cells.len() == 4 && cells[2].len() > 10, "{row}: say why");
        not_run.extend(cells[1].split(',').map(|b| b.trim().trim_matches('`')));
    }
    let run = binaries();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let bin = name.strip_suffix(".rs").unwrap_or(&name);
        if !bin.starts_with("rdma_") {
            continue;
        }
        seen += 1;
        let listed = run.iter().any(|b| b == bin) as u8 + not_run.contains(&bin) as u8;
        assert_eq!(listed, 1, "{bin}: run on siw0, or not with why; once");
    }
    assert_eq!(
        seen,
        run.len() + not_run.len(),
        "a listed binary that is not a test"
    );
}
