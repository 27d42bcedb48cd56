//! The end of a run: no more faults, every request finishes, and room must
//! come back everywhere.

use crate::engine::qp_slot::QpState;
use crate::wr::SendOp;

use super::run::Run;

/// No more faults: the device finishes every request (and the shared
/// receive queue's), the engine polls until nothing is in flight. Room
/// must come back everywhere: a queue that keeps requests is wedged.
pub(super) fn drain(run: &mut Run) {
    let dev = &mut run.engine.prov.dev;
    dev.refuse_permille = 0;
    for i in 0..dev.qps.len() {
        if !dev.qps[i].destroyed {
            let n = dev.qps[i].queues[0].len();
            dev.complete(i, false, n);
            let n = dev.qps[i].queues[1].len();
            dev.complete(i, true, n);
        }
    }
    if let Some(live) = run.engine.prov.dev.qps.iter().position(|q| !q.destroyed) {
        while !run.engine.prov.dev.srq.is_empty() {
            run.engine.prov.dev.complete_srq(live);
        }
    }
    for _ in 0..100_000 {
        if run.engine.prov.dev.cq.is_empty() {
            break;
        }
        run.poll_quietly();
    }
    // A flushed or completed unsignaled tail whose signaled successor never
    // came: post one signaled request per queue pair to finish it, as a
    // caller would (the engine signals by itself before the queue fills).
    for &(qp, dev_qp) in &run.qps.clone() {
        if run.engine.state(qp).ok() == Some(QpState::ERR) || run.engine.prov.dev.qps[dev_qp].error
        {
            run.reset(qp, dev_qp);
        }
        for _ in 0..64 {
            if run.engine.in_flight(qp).map_or(true, |f| f.0 == 0) {
                break;
            }
            let dev = &mut run.engine.prov.dev;
            if dev.qps[dev_qp].queues[0].is_empty() && !dev.qps[dev_qp].error {
                let _ = run.engine.post_inline(qp, SendOp::Send, b"", 0, true);
            }
            let n = run.engine.prov.dev.qps[dev_qp].queues[0].len();
            run.engine.prov.dev.complete(dev_qp, false, n);
            if run.engine.prov.dev.qps[dev_qp].error {
                run.engine.prov.dev.fail(dev_qp);
            }
            run.poll_quietly();
        }
        let f = run.engine.in_flight(qp).unwrap_or((0, 0));
        let d = &run.engine.prov.dev.qps[dev_qp];
        assert_eq!(
            f,
            (0, 0),
            "seed {}: queue pair {qp:?} still holds requests after every completion came: wedged (engine state {:?}; device error {}, queues {}/{})",
            run.seed,
            run.engine.state(qp),
            d.error,
            d.queues[0].len(),
            d.queues[1].len()
        );
    }
}
