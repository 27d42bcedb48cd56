//! Device tests' support: the device a test was promised (a missing one
//! FAILS the test: run them with `tests/softroce/cargo test`), a
//! runtime, and a guard that turns a hang into a failure.
#![allow(dead_code)]

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use verbs::ProtectionDomain;

/// The protection domain on the device under test (`VERBS_TEST_DEVICE`,
/// else the first).
pub fn test_pd(test: &str) -> ProtectionDomain {
    let name = std::env::var("VERBS_TEST_DEVICE")
        .ok()
        .filter(|s| !s.is_empty());
    let ctx = verbs::Context::open(name.as_deref()).unwrap_or_else(|e| {
        panic!("{test}: no RDMA device {name:?} ({e}); run device tests with tests/softroce/cargo test")
    });
    ProtectionDomain::new(&ctx).expect("alloc PD")
}

/// A runtime of one thread with I/O and time.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// `fut`, or a failure naming `what` if it never finishes: a hang is a
/// failure, not a stuck CI (generous: TCG guests are slow; not a timing
/// assertion).
pub async fn or_hang<T>(what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(120), fut).await {
        Ok(t) => t,
        Err(_) => panic!("{what}: hung"),
    }
}

/// Polls `fut` once with a waker that does nothing.
pub fn poll_once<F: Future + Unpin>(fut: &mut F) -> Poll<F::Output> {
    Pin::new(fut).poll(&mut Context::from_waker(Waker::noop()))
}

/// Bytes that say where they are: a wrong or reordered byte shows.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i.wrapping_mul(31).wrapping_add(seed.wrapping_mul(7)) % 251) as u8)
        .collect()
}
