//! Connection churn: 2,000 cycles of two RC queue pairs added to one
//! engine, connected to each other, carrying a Send every 50th cycle, and
//! removed; after the first 400, the process's heap, descriptors and
//! `verbs::leaked_objects()` do not grow. The full drill (100,000 cycles,
//! FAULTS.md) runs `examples/qp_setup_churn` with the same cycles. Alone
//! in its test binary: the heap is the process's.

mod support;

#[path = "../examples/qp_setup_churn/churn.rs"]
mod churn;

use verbs::{Engine, EngineConfig, MemoryRegion, ProtectionDomain};

#[test]
fn connection_churn_keeps_the_heap_descriptors_and_leaks_flat() {
    const CYCLES: u64 = 2000;
    const WARM: u64 = 400;
    let ctx = support::test_context("connection_churn");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let mut engine: Engine<MemoryRegion> = Engine::new(
        &pd,
        &EngineConfig {
            cq_depth: Some(64),
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let mut samples = Vec::with_capacity(64);
    churn::churn(&mut engine, &pd, CYCLES, 50, 100, |cycle| {
        samples.push((cycle, churn::held()))
    })
    .unwrap();
    let base = samples.iter().find(|(c, _)| *c >= WARM).unwrap().1;
    let last = samples.last().unwrap().1;
    println!("churn: {CYCLES} cycles; after {WARM}: {base:?}, at the end: {last:?}");
    assert_eq!(engine.qps().count(), 0, "every queue pair removed");
    assert_eq!(last.fds, base.fds, "descriptors: {samples:?}");
    assert_eq!(last.leaked, base.leaked, "leaked objects: {samples:?}");
    assert_eq!(last.leaked, 0, "no destroy failed");
    assert!(
        last.anon_kib <= base.anon_kib + 64,
        "the heap grew with the cycles: {samples:?}"
    );
}
