//! Lanes as callers use them: started on any prepared send (and
//! receive), refused when something else is in flight on their queue
//! pair; posted (sends signaled or not), polled and lent from while the device completes
//! requests of every queue pair (failures too); then dropped or
//! forgotten. The model checks them like every other post.

use alloc::vec::Vec;

use crate::engine::completion::CompletionRef;
use crate::engine::config::Queue;
use crate::engine::qp_slot::QpId;
use crate::sys::ibv_wc_status as WcStatus;

use super::alloc_count::{counted, uncounted};
use super::callback_posts::lane_refuses;
use super::device::{Sim, SimBuf};
use super::model::{self, Home};
use super::run::Run;

impl Run {
    pub(super) fn lane(&mut self) {
        if self.sends.is_empty() {
            return;
        }
        let (seed, step) = (self.seed, self.step);
        let send = self.sends[self.rng.below(self.sends.len() as u64) as usize].0;
        let recv = (!self.recvs.is_empty() && self.rng.chance(700))
            .then(|| self.recvs[self.rng.below(self.recvs.len() as u64) as usize].0);
        let steps = 1 + self.rng.below(24);
        let forget = self.rng.chance(200);
        let Run {
            engine, rng, qps, ..
        } = self;
        let mut failed: Vec<QpId> = Vec::new();
        let Ok(mut lane) = counted(|| engine.lane(send, recv)) else {
            return;
        };
        let own = lane.qp();
        for _ in 0..steps {
            match rng.below(7) {
                0 | 1 => {
                    // Streams leave most sends unsignaled.
                    if rng.chance(500) {
                        let _ = counted(|| lane.post_send_unsignaled());
                    } else {
                        let _ = counted(|| lane.post_send());
                    }
                }
                2 => {
                    let _ = counted(|| lane.post_recv());
                }
                3 | 4 => {
                    let queue = if rng.chance(900) {
                        Queue::Send
                    } else {
                        Queue::Recv
                    };
                    let take = rng.chance(500);
                    // Some callbacks panic: the lane must stay whole.
                    let panic = rng.chance(50);
                    // Some try to post on the lane's queue pair.
                    let probe = rng.chance(300);
                    let on_other = |c: CompletionRef<'_, SimBuf, Sim>| {
                        // Moved in: what the callback leaves is dropped
                        // here, in the caller's code, not the engine's.
                        uncounted(|| {
                            let mut c = c;
                            if c.status() != WcStatus::SUCCESS {
                                failed.extend(c.qp());
                            }
                            assert!(
                                !probe || lane_refuses(&mut c, own, seed, step),
                                "seed {seed} step {step}: a lane's callback posted on the lane's queue pair"
                            );
                            if take {
                                if let Some(b) = c.take_buf() {
                                    model::check_handed_back(b.id, seed, step);
                                }
                            }
                            if panic {
                                std::panic::resume_unwind(alloc::boxed::Box::new(
                                    "a callback that panics",
                                ));
                            }
                        })
                    };
                    let polled = std::panic::catch_unwind(core::panic::AssertUnwindSafe(|| {
                        counted(|| lane.poll(queue, on_other))
                    }));
                    if let Ok(Err(e)) = polled {
                        if e.wc_status().is_some() {
                            failed.push(own);
                        }
                    }
                }
                5 => {
                    // A loan of either buffer: only when the device is done.
                    if let Ok(b) = lane.idle_buf(rng.chance(500)) {
                        model::check_handed_back(b.id, seed, step);
                    }
                }
                _ => {
                    let dev = &mut lane.provider().dev;
                    // The lane's queue pair or another's.
                    let any = if qps.is_empty() || rng.chance(300) {
                        dev.rng.below(dev.qps.len() as u64) as usize
                    } else {
                        qps[rng.below(qps.len() as u64) as usize].1
                    };
                    if dev.hostile && rng.chance(100) {
                        // Polled at once, as `forge` requires.
                        dev.forge();
                        let _ = lane.poll(Queue::Send, |c| {
                            uncounted(|| {
                                let mut c = c;
                                if let Some(b) = c.take_buf() {
                                    model::check_handed_back(b.id, seed, step);
                                }
                            })
                        });
                    } else if !dev.qps[any].destroyed {
                        if rng.chance(30) {
                            dev.fail(any);
                        } else {
                            let recv = rng.chance(400);
                            dev.complete(any, recv, 1 + rng.below(3) as usize);
                        }
                    }
                }
            }
        }
        if forget {
            // The queue pair goes with the lane's slot: leaked, as after a
            // failed destroy, and so are its buffers.
            core::mem::forget(lane);
            self.qps.retain(|&(q, _)| q != own);
            self.removed.push(own);
            self.leaked.insert(Home::Qp(own.index));
            if self.engine.srq.is_some() {
                // It may still receive through the shared queue.
                self.leaked.insert(Home::Srq);
            }
            self.report.leaked += 1;
        } else {
            drop(lane);
        }
        self.report.lanes += 1;
        self.check_stopped(&failed);
    }
}
