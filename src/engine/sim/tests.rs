//! The simulation's CI budget: a million operations over many seeds,
//! friendly and hostile, in well under a minute on the host (fewer under
//! Miri).

use super::plan::run;
use super::run::Plan;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// (seeds, operations per seed): about a million operations in all.
fn budget() -> (u64, u64) {
    if cfg!(miri) {
        (env("VERBS_SIM_SEEDS", 2), env("VERBS_SIM_OPS", 300))
    } else {
        (env("VERBS_SIM_SEEDS", 200), env("VERBS_SIM_OPS", 5_000))
    }
}

fn sweep(hostile: bool) {
    let (seeds, ops) = budget();
    let only = std::env::var("VERBS_SIM_SEED")
        .ok()
        .and_then(|v| v.parse::<u64>().ok());
    let base = if hostile { 1 << 32 } else { 0 };
    let (mut total, mut posts, mut back, mut leaked, mut lanes) = (0, 0, 0, 0, 0);
    let (mut srq_lanes, mut srq_requests) = (0, 0);
    for seed in (base..base + seeds).filter(|s| only.is_none_or(|o| o == *s)) {
        let r = std::panic::catch_unwind(|| run(Plan { seed, ops, hostile }));
        let r = r.unwrap_or_else(|e| {
            let step = super::model::last_step();
            std::eprintln!(
                "simulation failed at seed {seed} step {step}, after {} operations of this sweep: replay with VERBS_SIM_SEED={seed} cargo test --lib sim",
                total + step
            );
            std::panic::resume_unwind(e)
        });
        total += r.ops;
        posts += r.posts;
        back += r.handed_back;
        leaked += r.leaked;
        lanes += r.lanes;
        srq_lanes += r.srq_lanes;
        srq_requests += r.srq_requests;
    }
    std::println!(
        "simulation ({}): {total} operations over {seeds} seeds, {posts} requests posted, {back} buffers handed back, {leaked} buffers leaked with their queue pairs (failed destroys, forgotten lanes), {lanes} lanes, {srq_lanes} shared-receive lanes serving {srq_requests} requests",
        if hostile { "hostile device" } else { "device within the specification" }
    );
}

#[test]
fn sim_a_device_within_the_specification() {
    sweep(false);
}

#[test]
fn sim_a_hostile_device() {
    sweep(true);
}
