//! Shared-receive lanes as callers use them, in the random runs: started
//! on every prepared send of one queue pair (refused unless they are
//! enough and its send queue is idle); requests read, answered, then
//! posted again, dropped, forgotten or dropped by a panic; replies
//! written and posted without one; polled while the device completes,
//! fails and forges requests of every queue pair; then dropped or
//! forgotten. No reply is written and no request read while the device
//! holds its buffer, and the model checks every buffer handed back.

use alloc::vec::Vec;

use crate::engine::config::Queue;
use crate::engine::prepared_table::PreparedSend;
use crate::engine::qp_slot::QpId;
use crate::engine::srq_request::SrqRequest;

use super::alloc_count::counted;
use super::device::{Sim, SimBuf};
use super::lane_ops::{device_acts, take_back, OnOther};
use super::model;
use super::rng::Rng;
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
        // A power of two of them (at times all, refused unless that).
        let mut replies = replies;
        if !self.rng.chance(100) && !replies.is_empty() {
            let pow = 1usize << replies.len().ilog2();
            replies.truncate(pow);
        }
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
        let mut served = 0;
        for _ in 0..steps {
            match rng.below(8) {
                0 | 1 => {
                    let _ = counted(|| {
                        lane.reply_with(|b| {
                            assert!(
                                !model::busy(b.id),
                                "seed {seed} step {step}: a reply written while the device holds it"
                            )
                        })
                    });
                }
                2 | 3 => {
                    let on_other = OnOther::pick(rng).callback(&mut failed, own, seed, step);
                    let polled = std::panic::catch_unwind(core::panic::AssertUnwindSafe(|| {
                        counted(|| lane.poll(Queue::Send, on_other))
                    }));
                    match polled {
                        Ok(Ok(Some(request))) => {
                            served += 1;
                            serve(request, rng, seed, step)
                        }
                        Ok(Err(e)) if e.wc_status().is_some() => failed.push(own),
                        _ => {}
                    }
                }
                4 | 5 => {
                    // A request for the lane: a shared receive completed on
                    // its queue pair (polled by a later step).
                    if let Some(&(_, on)) = qps.iter().find(|(q, _)| *q == own) {
                        lane.provider().dev.complete_srq(on);
                    }
                }
                _ => {
                    if device_acts(&mut lane.provider().dev, rng, qps) {
                        // Polled at once, as `forge` requires.
                        if let Ok(Some(request)) = lane.poll(Queue::Send, take_back(seed, step)) {
                            served += 1;
                            serve(request, rng, seed, step);
                        }
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
        self.report.srq_requests += served;
        self.check_stopped(&failed);
    }
}

/// A request read, perhaps answered, then posted again, dropped,
/// forgotten (its slot leaked) or dropped by a panic.
fn serve(mut request: SrqRequest<'_, SimBuf, Sim>, rng: &mut Rng, seed: u64, step: u64) {
    let held = request.buf().map(|b| b.id);
    if let Ok(id) = held {
        assert!(
            !model::busy(id),
            "seed {seed} step {step}: a request read while the device holds it"
        );
    }
    if rng.chance(600) {
        let _ = counted(|| {
            request.reply_with(|b| {
                assert!(
                    !model::busy(b.id),
                    "seed {seed} step {step}: a reply written while the device holds it"
                )
            })
        });
    }
    match rng.below(10) {
        0 => drop(request),
        1 => core::mem::forget(request),
        2 => {
            let panicked = std::panic::catch_unwind(core::panic::AssertUnwindSafe(move || {
                let _held = request;
                std::panic::resume_unwind(alloc::boxed::Box::new("handler"))
            }));
            assert!(panicked.is_err());
        }
        _ => {
            let _ = counted(|| request.repost());
        }
    }
}
