//! The counters against the engine's own bookkeeping: what the engine and
//! its queue pairs counted never goes back (removed queue pairs and reused
//! slots included), every request posted is either in flight or handed
//! back, and the errors by status cover every queue pair's errors.

use crate::engine::counters::EngineCounters;

use super::run::Run;

impl Run {
    /// Checks the counters now against `before` (read at the last step);
    /// returns them for the next.
    pub(super) fn check_counters(&self, before: &EngineCounters) -> EngineCounters {
        let now = self.engine.counters();
        let (a, b) = (&before.qps, &now.qps);
        let (seed, step) = (self.seed, self.step);
        let grew = b.sends_posted >= a.sends_posted
            && b.sends_completed >= a.sends_completed
            && b.recvs_posted >= a.recvs_posted
            && b.recvs_completed >= a.recvs_completed
            && b.srq_recvs >= a.srq_recvs
            && b.errors >= a.errors
            && b.bytes_received >= a.bytes_received
            && now
                .errors_by_status
                .iter()
                .zip(&before.errors_by_status)
                .all(|(n, o)| n >= o);
        assert!(
            grew,
            "seed {seed} step {step}: a counter went back: {before:?} -> {now:?}"
        );
        let (mut sends, mut recvs) = (0, 0);
        for &(qp, _) in &self.qps {
            let Ok((s, r)) = self.engine.in_flight(qp) else {
                continue; // a lane holds it: its counts come back with the slot
            };
            let c = self.engine.qp_counters(qp).expect("a live queue pair");
            assert_eq!(
                c.sends_posted - c.sends_completed,
                s,
                "seed {seed} step {step}"
            );
            assert_eq!(
                c.recvs_posted - c.recvs_completed,
                r,
                "seed {seed} step {step}"
            );
            sends += s;
            recvs += r;
        }
        assert!(
            b.sends_posted - b.sends_completed >= sends
                && b.recvs_posted - b.recvs_completed >= recvs,
            "seed {seed} step {step}: more in flight than posted and not handed back: {now:?}"
        );
        let by_status: u64 = now.errors_by_status.iter().sum();
        assert!(by_status >= b.errors, "seed {seed} step {step}: {now:?}");
        assert_eq!(
            now.errors_by_status[0], 0,
            "seed {seed} step {step}: a success counted as an error"
        );
        now
    }
}
