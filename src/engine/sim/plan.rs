//! A run's plan and report, and the run itself: set up, step, drain,
//! tear down, check nothing was lost.

use alloc::collections::BTreeSet;
use alloc::vec::Vec;

use crate::engine::core::Engine;
use crate::engine::srq::SrqSlots;

use super::device::{Sim, SimDevice};
use super::drain::drain;
use super::model::{self, BUSY};
use super::rng::Rng;
use super::run::{Plan, Report, Run};

/// Runs `plan`; panics (naming the seed and step) on the first broken promise.
pub(crate) fn run(plan: Plan) -> Report {
    model::reset();
    BUSY.with(|b| b.borrow_mut().clear());
    let mut rng = Rng::new(plan.seed ^ 0x5EED);
    let mut dev = SimDevice::new(plan.seed);
    dev.hostile = plan.hostile;
    // Some runs refuse often, for many partial chains.
    dev.refuse_permille = if rng.chance(200) {
        100 + rng.below(300)
    } else {
        rng.below(40)
    } as u32;
    dev.fail_destroy_permille = if plan.hostile {
        1 + rng.below(300) as u32
    } else {
        0
    };
    let srq = rng.chance(500).then(|| {
        dev.srq_depth = 1 + rng.below(16) as usize;
        SrqSlots::new((), dev.srq_depth as u32, 4)
    });
    // Most completion queues hold everything the queue pairs can have in
    // flight; some hold far less, and the engine's room decides.
    dev.cq_depth = if rng.chance(300) {
        dev.srq_depth + 2 + rng.below(40) as usize
    } else {
        256
    };
    // Some callers leave almost everything unsignaled, some poll rarely,
    // some post from their poll's callback.
    let unsignaled_permille = if rng.chance(250) { 900 } else { 300 };
    let lazy_poll = rng.chance(300);
    let posts_in_callbacks = if rng.chance(400) {
        200 + rng.below(600)
    } else {
        0
    };
    let cq_depth = dev.cq_depth as u32;
    let engine = Engine::assemble(Sim { dev }, (), cq_depth, None, srq, false);
    let mut run = Run {
        seed: plan.seed,
        step: 0,
        rng,
        engine,
        qps: Vec::new(),
        sends: Vec::new(),
        recvs: Vec::new(),
        leaked: BTreeSet::new(),
        removed: Vec::new(),
        unsignaled_permille,
        lazy_poll,
        posts_in_callbacks,
        report: Report::default(),
    };
    for _ in 0..1 + run.rng.below(4) {
        run.add_qp();
    }
    let mut counted = run.engine.counters();
    for _ in 0..plan.ops {
        run.step();
        model::check_violations(run.seed, run.step);
        run.check_not_wedged();
        counted = run.check_counters(&counted);
    }
    run.report.ops = plan.ops;
    drain(&mut run);
    // Drained (what is still in flight is a leaked queue pair's: a failed
    // destroy, a forgotten lane).
    run.check_counters(&counted);
    let mut report = run.report;
    report.posts = run.engine.prov.dev.posts;
    // Teardown destroys succeed: the leaks to account for are the ones
    // `remove_qp` reported.
    run.engine.prov.dev.fail_destroy_permille = 0;
    let Run {
        mut engine,
        sends,
        recvs,
        leaked,
        seed,
        ..
    } = run;
    for (p, _) in sends {
        let _ = engine.release_prepared(p).map(|b| b.count());
    }
    for (p, _) in recvs {
        let _ = engine.release_prepared(p).map(|b| b.count());
    }
    drop(engine);
    model::check_violations(seed, plan.ops);
    report.leaked = model::check_nothing_lost(&leaked, seed);
    report
}
