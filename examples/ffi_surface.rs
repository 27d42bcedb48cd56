//! Prints every C function `verbs` can call, with its C prototype and where
//! the symbol comes from: `cargo run --example ffi_surface`.
//!
//! The list is `verbs::sys::FFI_SURFACE`, produced by the same macro that
//! declares the externs, so it cannot omit one; `tests/ffi_surface.rs`
//! checks it against `c_shim/verbs_shim.h`.

fn main() {
    let items = verbs::sys::FFI_SURFACE;
    for origin in ["shim", "libibverbs"] {
        let of_origin: Vec<_> = items.iter().filter(|i| i.origin == origin).collect();
        println!("# {origin} ({} functions)", of_origin.len());
        for item in of_origin {
            println!("{};", item.prototype);
        }
        println!();
    }
    println!("{} functions in all", items.len());
}
