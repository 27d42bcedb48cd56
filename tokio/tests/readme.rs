//! The root README shows the async usage; the code is this package's
//! README's, compiled as its doc-test. They must not drift apart.

#[test]
fn the_root_readme_shows_the_compiled_example() {
    let here = env!("CARGO_MANIFEST_DIR");
    let ours = std::fs::read_to_string(format!("{here}/README.md")).unwrap();
    let root = std::fs::read_to_string(format!("{here}/../README.md")).unwrap();
    let start = ours.find("```rust,no_run\n").expect("a compiled example") + 15;
    let code = &ours[start..start + ours[start..].find("```").unwrap()];
    assert!(
        root.contains(&format!("```rust,ignore\n{code}```")),
        "README.md's async example is tokio/README.md's"
    );
}
