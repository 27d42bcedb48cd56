//! Builds `c_shim/` into a static archive and links it and libibverbs.
//!
//! No `cc` crate: the compiler, archiver and flags are found the way the
//! Rust ecosystem's users expect, from the first set of
//! `<VAR>_<target>`, `<VAR>_<target_with_underscores>`, `TARGET_<VAR>`,
//! `<VAR>`, for VAR in CC, AR, CFLAGS, then `cc` / `ar`.
//!
//! Locations, for a non-standard rdma-core install:
//! - `VERBS_INCLUDE_DIR`: directory holding `infiniband/verbs.h`
//! - `VERBS_LIB_DIR`: directory holding `libibverbs.so`

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{exit, Command};

const SHIM_SOURCES: &[&str] = &["c_shim/verbs_shim.c"];
const SHIM_HEADERS: &[&str] = &["c_shim/verbs_shim.h"];
/// With the `rdmacm` feature: the librdmacm part of the shim.
const RDMACM_SOURCES: &[&str] = &["c_shim/verbs_rdmacm.c"];
const RDMACM_HEADERS: &[&str] = &["c_shim/verbs_rdmacm.h"];

fn main() {
    let target = env::var("TARGET").expect("cargo sets TARGET");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));

    let cc = tool_var("CC", &target).unwrap_or_else(|| "cc".into());
    let ar = tool_var("AR", &target).unwrap_or_else(|| "ar".into());
    let mut cflags: Vec<String> = tool_var("CFLAGS", &target)
        .map(|f| f.split_whitespace().map(String::from).collect())
        .unwrap_or_default();
    let include_dir = path_var("VERBS_INCLUDE_DIR");
    let lib_dir = path_var("VERBS_LIB_DIR");
    if let Some(dir) = &include_dir {
        cflags.push(format!("-I{}", dir.display()));
    }

    let rdmacm = env::var_os("CARGO_FEATURE_RDMACM").is_some();
    for f in SHIM_SOURCES
        .iter()
        .chain(SHIM_HEADERS)
        .chain(RDMACM_SOURCES)
        .chain(RDMACM_HEADERS)
    {
        println!("cargo:rerun-if-changed={f}");
    }
    println!("cargo:rerun-if-changed=build.rs");

    require_header(
        &cc,
        &cflags,
        &out,
        "infiniband/verbs.h",
        "libibverbs-dev",
        "rdma-core-devel",
    );
    let mut sources = SHIM_SOURCES.to_vec();
    if rdmacm {
        require_header(
            &cc,
            &cflags,
            &out,
            "rdma/rdma_cma.h",
            "librdmacm-dev",
            "rdma-core-devel",
        );
        sources.extend_from_slice(RDMACM_SOURCES);
    }

    let mut objects = Vec::new();
    for src in &sources {
        let obj = out.join(Path::new(src).with_extension("o").file_name().unwrap());
        let mut cmd = Command::new(&cc);
        cmd.args(&cflags)
            .args(["-O2", "-fPIC", "-Wall", "-Wextra", "-std=gnu11"])
            // A prototype that drifts from libibverbs must stop the build.
            .args([
                "-Werror=incompatible-pointer-types",
                "-Werror=implicit-function-declaration",
            ])
            .arg("-c")
            .arg(src)
            .arg("-o")
            .arg(&obj);
        run(&mut cmd, "compile the C shim");
        objects.push(obj);
    }

    let archive = out.join("libverbs_shim.a");
    let _ = fs::remove_file(&archive);
    // `D`: deterministic (zero timestamps, uids); `s`: write an index.
    run(
        Command::new(&ar).arg("crsD").arg(&archive).args(&objects),
        "archive the C shim",
    );

    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rustc-link-lib=static=verbs_shim");
    if let Some(dir) = &lib_dir {
        println!("cargo:rustc-link-search=native={}", dir.display());
    }
    println!("cargo:rustc-link-lib=dylib=ibverbs");
    if rdmacm {
        println!("cargo:rustc-link-lib=dylib=rdmacm");
    }

    // For the layout probe in tests/: the same compiler and flags.
    println!("cargo:rustc-env=VERBS_BUILD_CC={cc}");
    println!("cargo:rustc-env=VERBS_BUILD_CFLAGS={}", cflags.join(" "));
    if let Some(dir) = &include_dir {
        println!("cargo:include={}", dir.display());
    }
}

/// The first of `<var>_<target>`, `<var>_<target_with_underscores>`,
/// `TARGET_<var>`, `<var>` that is set.
fn tool_var(var: &str, target: &str) -> Option<String> {
    let names = [
        format!("{var}_{target}"),
        format!("{var}_{}", target.replace('-', "_")),
        format!("TARGET_{var}"),
        var.to_string(),
    ];
    let mut found = None;
    for name in &names {
        println!("cargo:rerun-if-env-changed={name}");
        if found.is_none() {
            found = env::var(name).ok().filter(|v| !v.is_empty());
        }
    }
    found
}

fn path_var(name: &str) -> Option<PathBuf> {
    println!("cargo:rerun-if-env-changed={name}");
    env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// Fails with one sentence, not a page of compiler errors, when a
/// development header is missing.
fn require_header(
    cc: &str,
    cflags: &[String],
    out: &Path,
    header: &str,
    debian: &str,
    fedora: &str,
) {
    let probe = out.join("header_probe.c");
    fs::write(&probe, format!("#include <{header}>\n")).expect("write to OUT_DIR");
    let found = Command::new(cc)
        .args(cflags)
        .arg("-E")
        .arg(&probe)
        .output()
        .map(|o| o.status.success());
    match found {
        Ok(true) => {}
        Ok(false) => {
            eprintln!(
                "error: {header} not found: install {debian} (Debian/Ubuntu) or {fedora} \
                 (Fedora/RHEL), or set VERBS_INCLUDE_DIR to its directory."
            );
            exit(1);
        }
        Err(e) => {
            eprintln!(
                "error: cannot run the C compiler `{cc}` ({e}): install gcc or clang, or set CC."
            );
            exit(1);
        }
    }
}

fn run(cmd: &mut Command, what: &str) {
    let status = cmd.status().unwrap_or_else(|e| {
        eprintln!(
            "error: failed to {what}: cannot run {:?}: {e}",
            cmd.get_program()
        );
        exit(1);
    });
    if !status.success() {
        eprintln!("error: failed to {what}: {cmd:?} exited with {status}");
        exit(1);
    }
}
