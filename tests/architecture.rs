//! The shape of the crate, checked: files that hold one idea (none over
//! 500 lines), no import loop between modules, no module importing one
//! above its layer, and `unsafe` allowed only in the modules listed here
//! (and in the README, which must say the same).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The top-level modules, bottom up: each imports only from those before it.
const LAYERS: &[&str] = &[
    "sys", "error", "raw", "time", "gid", "grh", "tlsf", "endpoint", "wire", "device", "pd",
    "memory", "sgl", "wr", "engine", "qp", "cm", "exchange", "transfer",
];

/// The modules allowed `unsafe` (each with a `# Safety` section in its docs).
const UNSAFE_MODULES: &[&str] = &["sys", "raw", "memory", "engine::doorbell", "engine::sim"];

/// Longest a source file may be.
const MAX_LINES: usize = 500;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src/a/b.rs` and `src/a/b/mod.rs` -> `a::b`; `src/lib.rs` -> ``.
fn module_of(path: &Path) -> String {
    let rel = path.strip_prefix(src()).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts.join("::")
}

/// The source without comments and without the contents of string and
/// character literals (what is left is only code).
fn code(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let rest = &text[i..];
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            i += rest.find("*/").map_or(rest.len(), |e| e + 2);
        } else if rest.starts_with("r#\"") || rest.starts_with("r\"") {
            let hashes = rest[1..].chars().take_while(|&c| c == '#').count();
            let close = format!("\"{}", "#".repeat(hashes));
            let body = 2 + hashes;
            i += body
                + rest[body..]
                    .find(&close)
                    .map_or(rest.len() - body, |e| e + close.len());
            out.push_str("\"\"");
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            i = j + 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' {
            // A char literal ('x', '\n', '\u{..}'), not a lifetime ('a).
            let lit = if b.get(i + 1) == Some(&b'\\') {
                rest[3..].find('\'').map(|e| e + 4)
            } else {
                rest.chars()
                    .nth(2)
                    .filter(|&c| c == '\'')
                    .map(|_| rest.chars().nth(1).unwrap().len_utf8() + 2)
            };
            match lit {
                Some(n) => {
                    i += n;
                    out.push_str("' '");
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            let ch = rest.chars().next().unwrap();
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    without_inline_modules(&out)
}

/// The code without inline `mod name { ... }` blocks (test modules, sealed
/// traits): their `super` is not the file's, and tests are not the library.
fn without_inline_modules(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(i) = rest.find("mod ") {
        let before = rest[..i].chars().last();
        let after = &rest[i + 4..];
        let name_len = after
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        let tail = after[name_len..].trim_start();
        if before.is_none_or(|c| !c.is_alphanumeric() && c != '_')
            && name_len > 0
            && tail.starts_with('{')
        {
            out.push_str(&rest[..i]);
            let open = i + 4 + name_len + (after[name_len..].len() - tail.len());
            let mut depth = 0;
            let mut end = rest.len();
            for (j, ch) in rest[open..].char_indices() {
                match ch {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = open + j + 1;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            rest = &rest[end..];
        } else {
            out.push_str(&rest[..i + 4]);
            rest = &rest[i + 4..];
        }
    }
    out.push_str(rest);
    out
}

/// Every path a `use` item names, braces expanded (`a::{b, c::d}` -> `a::b`, `a::c::d`).
fn expand(prefix: &str, tree: &str, out: &mut Vec<String>) {
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let head = tree[..open].trim().trim_end_matches("::");
        let inner = &tree[open + 1..tree.rfind('}').unwrap()];
        let base = join(prefix, head);
        let mut depth = 0;
        let mut start = 0;
        for (i, ch) in inner.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand(&base, &inner[start..i], out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        expand(&base, &inner[start..], out);
    } else if !tree.is_empty() {
        let path = tree.split(" as ").next().unwrap().trim();
        out.push(join(prefix, path));
    }
}

fn join(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_string(),
        (_, true) => a.to_string(),
        _ => format!("{a}::{b}"),
    }
}

/// The paths a file refers to: its `use` items and every `crate::`,
/// `super::` and `self::` path in its code.
fn paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("use ") {
        let before = rest[..i].chars().last();
        let start = i + 4;
        let Some(end) = rest[start..].find(';') else {
            break;
        };
        if before.is_none_or(|c| !c.is_alphanumeric() && c != '_') {
            expand("", &rest[start..start + end], &mut out);
        }
        rest = &rest[start + end..];
    }
    for anchor in ["crate::", "super::", "self::"] {
        let mut rest = code;
        while let Some(i) = rest.find(anchor) {
            let before = rest[..i].chars().last();
            let tail = &rest[i..];
            let len = tail
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(tail.len());
            if before.is_none_or(|c| !c.is_alphanumeric() && c != '_' && c != ':') {
                out.push(tail[..len].trim_end_matches(':').to_string());
            }
            rest = &rest[i + anchor.len()..];
        }
    }
    out
}

/// The module a path refers to, resolved from `module`: the longest prefix
/// that is a module of the crate. `None` for other crates (`core`, `libc`).
fn resolve(module: &str, path: &str, modules: &BTreeSet<String>) -> Option<String> {
    let mut parts: Vec<&str> = if module.is_empty() {
        Vec::new()
    } else {
        module.split("::").collect()
    };
    let mut segs = path.split("::").peekable();
    match segs.peek().copied() {
        Some("crate") => {
            parts.clear();
            segs.next();
        }
        Some("super") => {
            while segs.peek() == Some(&"super") {
                segs.next();
                parts.pop();
            }
        }
        Some("self") => {
            segs.next();
        }
        // A path from a module's own child (`use child::Item` in its parent).
        Some(first) if modules.contains(&join(module, first)) => {}
        _ => return None,
    }
    let mut best = parts.join("::");
    for seg in segs {
        parts.push(seg);
        let candidate = parts.join("::");
        if modules.contains(&candidate) {
            best = candidate;
        } else {
            break;
        }
    }
    Some(best)
}

struct Crate {
    /// module -> (its file, its code without comments)
    modules: BTreeMap<String, (PathBuf, String)>,
}

fn load() -> Crate {
    let mut all = Vec::new();
    files(&src(), &mut all);
    let modules = all
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (module_of(&p), (p, code(&text)))
        })
        .collect();
    Crate { modules }
}

/// `module`'s edges to other modules of the crate (not to itself, its
/// ancestors' own re-export of it aside).
fn edges(krate: &Crate) -> BTreeMap<String, BTreeSet<String>> {
    let names: BTreeSet<String> = krate.modules.keys().cloned().collect();
    let mut graph = BTreeMap::new();
    for (module, (_, code)) in &krate.modules {
        let mut targets = BTreeSet::new();
        for path in paths(code) {
            if let Some(target) = resolve(module, &path, &names) {
                if &target != module {
                    targets.insert(target);
                }
            }
        }
        graph.insert(module.clone(), targets);
    }
    graph
}

fn top(module: &str) -> &str {
    module.split("::").next().unwrap()
}

#[test]
fn no_source_file_is_over_500_lines() {
    let krate = load();
    let long: Vec<String> = krate
        .modules
        .values()
        .filter_map(|(p, _)| {
            let n = std::fs::read_to_string(p).unwrap().lines().count();
            (n > MAX_LINES).then(|| format!("{} ({n} lines)", p.display()))
        })
        .collect();
    assert!(long.is_empty(), "split these: {long:?}");
}

#[test]
fn no_import_loop() {
    let graph = edges(&load());
    // Depth-first search for a cycle, ignoring the crate root (which only
    // declares modules and re-exports them).
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) {
        if done.contains(node) {
            return;
        }
        if let Some(at) = path.iter().position(|p| p == node) {
            panic!("import loop: {} -> {node}", path[at..].join(" -> "));
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if !next.is_empty() {
                visit(next, graph, path, done);
            }
        }
        path.pop();
        done.insert(node.to_string());
    }
    let mut done = BTreeSet::new();
    for node in graph.keys().filter(|m| !m.is_empty()) {
        visit(node, &graph, &mut Vec::new(), &mut done);
    }
}

#[test]
fn no_module_imports_one_above_its_layer() {
    let graph = edges(&load());
    let layer = |m: &str| LAYERS.iter().position(|l| *l == top(m));
    let mut wrong = Vec::new();
    for (from, targets) in &graph {
        if from.is_empty() {
            continue;
        }
        let Some(lf) = layer(from) else {
            wrong.push(format!("{from}: a top-level module not in LAYERS"));
            continue;
        };
        for to in targets {
            if to.is_empty() {
                wrong.push(format!(
                    "{from} imports through the crate root's re-exports"
                ));
                continue;
            }
            if layer(to).is_some_and(|lt| lt > lf) {
                wrong.push(format!("{from} imports {to}, a layer above it"));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn unsafe_is_allowed_only_in_the_listed_modules() {
    let krate = load();
    let mut allowed = BTreeSet::new();
    for (module, (path, _)) in &krate.modules {
        let text = std::fs::read_to_string(path).unwrap();
        if text.contains("#![allow(unsafe_code)]") {
            allowed.insert(module.clone());
        }
        // The crate root allows it on one declaration: `sys`.
        if module.is_empty() {
            assert!(
                text.contains("#![deny(unsafe_code)]"),
                "the crate denies unsafe code by default"
            );
            for line in text.lines().filter(|l| l.contains("allow(unsafe_code)")) {
                assert_eq!(
                    line.trim(),
                    "#[allow(unsafe_code)]",
                    "only an outer allow on `pub mod sys;`"
                );
            }
            if text.contains("#[allow(unsafe_code)]\npub mod sys;") {
                allowed.insert("sys".to_string());
            }
        }
    }
    let expected: BTreeSet<String> = UNSAFE_MODULES.iter().map(|s| s.to_string()).collect();
    assert_eq!(allowed, expected, "modules allowed unsafe code");
    for module in UNSAFE_MODULES {
        let (_, code) = &krate.modules[*module];
        let _ = code;
        let text = std::fs::read_to_string(&krate.modules[*module].0).unwrap();
        assert!(
            text.contains("# Safety"),
            "{module} says in its docs why its unsafe code is sound"
        );
    }
}

#[test]
fn the_readme_lists_the_modules_with_unsafe_code() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let line = readme
        .lines()
        .find(|l| l.starts_with("Unsafe code is allowed only in"))
        .expect("the README says where unsafe code lives");
    // The list ends at the sentence's first semicolon.
    let list = line.split(';').next().unwrap_or(line);
    let listed: BTreeSet<&str> = list.split('`').skip(1).step_by(2).collect();
    let expected: BTreeSet<&str> = UNSAFE_MODULES.iter().copied().collect();
    assert_eq!(
        listed, expected,
        "the README's list of modules with unsafe code: {line}"
    );
}

#[test]
fn the_parser_sees_what_it_must() {
    let mut out = Vec::new();
    expand(
        "",
        "crate::engine::{core::Engine, id::{self, WrId}}",
        &mut out,
    );
    assert_eq!(
        out,
        [
            "crate::engine::core::Engine",
            "crate::engine::id::self",
            "crate::engine::id::WrId"
        ]
    );
    let names: BTreeSet<String> = ["engine", "engine::id", "engine::doorbell"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(
        resolve("engine::doorbell", "super::id::ring", &names).as_deref(),
        Some("engine::id")
    );
    assert_eq!(
        resolve("engine::doorbell", "crate::sys::ibv_wc", &names).as_deref(),
        Some("")
    );
    assert_eq!(resolve("engine", "core::mem", &names), None);
    assert_eq!(code("a // b\nc /* d */ e"), "a \nc  e");
    assert_eq!(code("x mod tests { use super::*; fn f() {} } y"), "x  y");
    assert_eq!(
        code("x(\"use a; \\\" b\") y('\\'') z<'a>"),
        "x(\"\") y(' ') z<'a>"
    );
}

/// The workspace's companion packages (beside the core, depending on it by
/// path): no `unsafe` at all, and the same file length.
#[test]
fn the_companions_forbid_unsafe_and_keep_files_short() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for companion in ["tokio"] {
        let src = root.join(companion).join("src");
        let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
        assert!(
            lib.contains("#![forbid(unsafe_code)]"),
            "{companion}/src/lib.rs forbids unsafe code"
        );
        let mut all = Vec::new();
        files(&src, &mut all);
        for path in all {
            let text = std::fs::read_to_string(&path).unwrap();
            let n = text.lines().count();
            assert!(n <= MAX_LINES, "{} has {n} lines", path.display());
            assert!(
                !code(&text)
                    .replace("forbid(unsafe_code)", "")
                    .contains("unsafe"),
                "{} uses unsafe",
                path.display()
            );
        }
    }
}
