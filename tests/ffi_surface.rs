//! The FFI surface is auditable in one place, and the places agree:
//! `verbs::sys::FFI_SURFACE` (generated with the Rust externs by one macro)
//! must list exactly the prototypes of `c_shim/verbs_shim.h`, whose
//! libibverbs prototypes the C compiler checks when the shim is built.

use std::collections::BTreeMap;
use std::path::Path;

const VERBS_H: &str = include_str!("../c_shim/verbs_shim.h");
const VERBS_C: &str = include_str!("../c_shim/verbs_shim.c");
const RDMACM_H: &str = include_str!("../c_shim/verbs_rdmacm.h");
const RDMACM_C: &str = include_str!("../c_shim/verbs_rdmacm.c");

/// The shim headers and sources the built crate uses (librdmacm's only
/// with the `rdmacm` feature).
fn shim_files() -> (String, String) {
    if cfg!(feature = "rdmacm") {
        (
            format!("{VERBS_H}\n{RDMACM_H}"),
            format!("{VERBS_C}\n{RDMACM_C}"),
        )
    } else {
        (VERBS_H.to_string(), VERBS_C.to_string())
    }
}

fn surface() -> Vec<&'static verbs::sys::FfiItem> {
    verbs::sys::ffi_surface().collect()
}

/// One spelling for a C prototype: single spaces, none around `*(),`.
fn normalize(proto: &str) -> String {
    let collapsed = proto.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = String::new();
    let chars: Vec<char> = collapsed.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        if c == ' ' {
            let prev = chars[i - 1];
            let next = chars.get(i + 1).copied().unwrap_or(' ');
            if "*(),".contains(prev) || "*(),".contains(next) {
                continue;
            }
        }
        out.push(c);
    }
    out
}

/// name -> normalized prototype, from both parts of the shim header.
fn header_prototypes() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in shim_files().0.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("VERBS_DIRECT(") {
            if line.starts_with("VERBS_DIRECT(ret") {
                continue; // the macro's own definition
            }
            let rest = rest
                .strip_suffix(");")
                .expect("VERBS_DIRECT(...); on one line");
            let (ret, rest) = rest.split_once(',').unwrap();
            let (name, args) = rest.split_once(',').unwrap();
            let proto = format!("{} {}{}", ret.trim(), name.trim(), args.trim());
            out.insert(name.trim().to_string(), normalize(&proto));
        } else if line.contains("verbs_shim_")
            && line.ends_with(");")
            && !line.starts_with('#')
            && !line.starts_with("VERBS_")
        {
            let proto = line.trim_end_matches(';');
            let name = proto
                .split('(')
                .next()
                .unwrap()
                .rsplit([' ', '*'])
                .next()
                .unwrap();
            out.insert(name.to_string(), normalize(proto));
        }
    }
    out
}

#[test]
fn rust_declarations_and_shim_header_list_the_same_prototypes() {
    let header = header_prototypes();
    let mut errors = Vec::new();
    for item in surface() {
        match header.get(item.name) {
            None => errors.push(format!(
                "{}: declared in Rust but not listed in verbs_shim.h",
                item.name
            )),
            Some(h) if *h != normalize(item.prototype) => errors.push(format!(
                "{}: Rust says `{}`, verbs_shim.h says `{h}`",
                item.name, item.prototype
            )),
            Some(_) => {}
        }
    }
    for name in header.keys() {
        if !surface().iter().any(|i| i.name == name) {
            errors.push(format!(
                "{name}: listed in verbs_shim.h but not declared in Rust"
            ));
        }
    }
    assert!(
        errors.is_empty(),
        "FFI surface drift:\n  {}",
        errors.join("\n  ")
    );
    assert!(
        header.len() >= 40,
        "suspiciously few prototypes parsed: {}",
        header.len()
    );
}

#[test]
fn every_shim_symbol_is_defined_and_every_export_is_compiler_checked() {
    let shim_c = shim_files().1;
    for item in surface() {
        let defined = match item.origin {
            "shim" => shim_c.contains(&format!("{}(", item.name)),
            "libibverbs" | "librdmacm" => shim_c.contains(&format!("VERBS_CHECK({});", item.name)),
            other => panic!("{}: unknown origin {other}", item.name),
        };
        assert!(
            defined,
            "{} ({}) has no definition/check in verbs_shim.c",
            item.name, item.origin
        );
    }
}

#[test]
fn no_extern_block_outside_the_sys_functions_module() {
    fn walk(dir: &Path, found: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|e| e == "rs")
                && !path.ends_with("sys/funcs.rs")
                && !path.ends_with("sys/rdmacm.rs")
                && std::fs::read_to_string(&path)
                    .unwrap()
                    .contains(concat!("extern ", "\"C\""))
            {
                found.push(path.display().to_string());
            }
        }
    }
    let mut found = Vec::new();
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut found,
    );
    assert!(
        found.is_empty(),
        "extern \"C\" outside src/sys/funcs.rs: {found:?}"
    );
}
