//! Shared-receive lanes as callers use them, in the random runs: started
//! on every prepared send of one queue pair (refused unless they are
//! enough and its send queue is idle); requests read, posted again or
//! left; replies written and posted; polled while the device completes,
//! fails and forges requests of every queue pair; then dropped or
//! forgotten. No reply is written and no request read while the device
//! holds its buffer, and the model checks every buffer handed back.

use alloc::vec::Vec;

use crate::engine::config::Queue;
use crate::engine::prepared_table::PreparedSend;
use crate::engine::qp_slot::QpId;

use super::alloc_count::counted;
use super::lane_ops::{device_acts, take_back, OnOther};
use super::model;
use super::run::Run;

impl Run {
    pub(super) fn srq_lane(&mut self) {
        if self.engine.srq.is_none() || self.sends.is_empty() {
            return;
        }
        let (seed, step) = (self.seed, self.step);
        let home = self.sends[self.rng.below(self.sends.len() as u64) as usize].1;
        let replies: Vec<PreparedSend> = self
            .sends
            .iter()
            .filter(|(_, h)| *h == home)
            .map(|(p, _)| *p)
            .collect();
        let steps = 1 + self.rng.below(24);
        let forget = self.rng.chance(200);
        let Run {
            engine, rng, qps, ..
        } = self;
        let mut failed: Vec<QpId> = Vec::new();
        let Ok(mut lane) = engine.srq_lane(&replies) else {
            return;
        };
        let own = lane.qp();
        for _ in 0..steps {
            match rng.below(6) {
                0 | 1 => {
                    if let Ok(b) = counted(|| lane.next_reply()) {
                        assert!(
                            !model::busy(b.id),
                            "seed {seed} step {step}: a reply written while the device holds it"
                        );
                        let _ = counted(|| lane.post_reply());
                    }
                }
                2 => {
                    if let Ok(b) = lane.request_buf() {
                        assert!(
                            !model::busy(b.id),
                            "seed {seed} step {step}: a request read while the device holds it"
                        );
                    }
                    if rng.chance(700) {
                        let _ = counted(|| lane.repost_request());
                    }
                }
                3 => {
                    let on_other = OnOther::pick(rng).callback(&mut failed, own, seed, step);
                    let polled = std::panic::catch_unwind(core::panic::AssertUnwindSafe(|| {
                        counted(|| lane.poll(Queue::Send, on_other))
                    }));
                    if let Ok(Err(e)) = polled {
                        if e.wc_status().is_some() {
                            failed.push(own);
                        }
                    }
                }
                _ => {
                    if device_acts(&mut lane.provider().dev, rng, qps) {
                        // Polled at once, as `forge` requires.
                        let _ = lane.poll(Queue::Send, take_back(seed, step));
                    }
                }
            }
        }
        if forget {
            core::mem::forget(lane);
            self.forgot_lane(own);
        } else {
            drop(lane);
        }
        self.report.srq_lanes += 1;
        self.check_stopped(&failed);
    }
}
