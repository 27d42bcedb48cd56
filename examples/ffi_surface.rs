//! Prints every C function `verbs` can call, with its C prototype and where
//! the symbol comes from: `cargo run --example ffi_surface` (add
//! `--features rdmacm` for the librdmacm part).
//!
//! The list is `verbs::sys::FFI_SURFACE`, produced by the same macro that
//! declares the externs, so it cannot omit one; `tests/ffi_surface.rs`
//! checks it against `c_shim/verbs_shim.h`.

fn main() {
    let items: Vec<_> = verbs::sys::ffi_surface().collect();
    for origin in ["shim", "libibverbs", "librdmacm"] {
        let of_origin: Vec<_> = items.iter().filter(|i| i.origin == origin).collect();
        if of_origin.is_empty() {
            continue;
        }
        println!("# {origin} ({} functions)", of_origin.len());
        for item in of_origin {
            println!("{};", item.prototype);
        }
        println!();
    }
    println!("{} functions in all", items.len());
}
