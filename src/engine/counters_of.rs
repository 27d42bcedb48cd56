//! Reading the counters (`counters.rs`) of an engine and of one of its
//! queue pairs: a walk over the slots, never on the data path.

use crate::error::Error;
use crate::memory::NicBuf;

use super::core::Engine;
use super::counters::{of_slot, EngineCounters, QpCounters};
use super::doorbell::Provider;
use super::qp_slot::QpId;

impl<B: NicBuf, P: Provider> Engine<B, P> {
    /// `qp`'s counters (see [`QpCounters`]). `NotFound` for a queue pair
    /// removed or of another engine, or while a lane holds it.
    pub fn qp_counters(&self, qp: QpId) -> Result<QpCounters, Error> {
        Ok(of_slot(self.slot(qp)?))
    }

    /// The engine's counters (see [`EngineCounters`]): a walk over its
    /// queue pairs' slots.
    pub fn counters(&self) -> EngineCounters {
        let mut qps = self.counted.gone;
        let mut live = 0;
        // A lane's placeholder stands for its queue pair.
        for slot in self.qps.iter().filter(|s| s.qp.is_some() || s.lane_out) {
            qps.add(&of_slot(slot));
            live += 1;
        }
        EngineCounters {
            qps,
            errors_by_status: self.counted.by_status,
            live_qps: live,
            srq_posted: self.srq.as_ref().map_or(0, |s| s.posted() as u64),
        }
    }
}
