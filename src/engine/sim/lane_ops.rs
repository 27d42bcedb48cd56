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
use super::device::{Sim, SimBuf, SimDevice};
use super::model::{self, Home};
use super::rng::Rng;
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
                    let on_other = OnOther::pick(rng).callback(&mut failed, own, seed, step);
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
        self.report.lanes += 1;
        self.check_stopped(&failed);
    }

    /// A lane of `own` was forgotten: its queue pair goes with the lane's
    /// slot (leaked, as after a failed destroy), and so do its buffers.
    pub(super) fn forgot_lane(&mut self, own: QpId) {
        self.qps.retain(|&(q, _)| q != own);
        self.removed.push(own);
        self.leaked.insert(Home::Qp(own.index));
        if self.engine.srq.is_some() {
            // It may still receive through the shared queue.
            self.leaked.insert(Home::Srq);
        }
        self.report.leaked += 1;
    }
}

/// What a lane's callback does with another completion.
pub(super) struct OnOther {
    take: bool,
    /// Some callbacks panic: the lane must stay whole.
    panic: bool,
    /// Some try to post on the lane's queue pair.
    probe: bool,
}

impl OnOther {
    pub(super) fn pick(rng: &mut Rng) -> OnOther {
        OnOther {
            take: rng.chance(500),
            panic: rng.chance(50),
            probe: rng.chance(300),
        }
    }

    /// The callback of a lane of `own`, which notes failed queue pairs in
    /// `failed`.
    pub(super) fn callback<'a>(
        self,
        failed: &'a mut Vec<QpId>,
        own: QpId,
        seed: u64,
        step: u64,
    ) -> impl FnMut(CompletionRef<'_, SimBuf, Sim>) + 'a {
        move |c| {
            // Moved in: what the callback leaves is dropped here, in the
            // caller's code, not the engine's.
            uncounted(|| {
                let mut c = c;
                if c.status() != WcStatus::SUCCESS {
                    failed.extend(c.qp());
                }
                assert!(
                    !self.probe || lane_refuses(&mut c, own, seed, step),
                    "seed {seed} step {step}: a lane's callback posted on the lane's queue pair"
                );
                if self.take {
                    if let Some(b) = c.take_buf() {
                        model::check_handed_back(b.id, seed, step);
                    }
                }
                if self.panic {
                    std::panic::resume_unwind(alloc::boxed::Box::new("a callback that panics"));
                }
            })
        }
    }
}

/// A callback that takes each buffer back and checks it is the caller's.
pub(super) fn take_back(seed: u64, step: u64) -> impl FnMut(CompletionRef<'_, SimBuf, Sim>) {
    move |c| {
        uncounted(|| {
            let mut c = c;
            if let Some(b) = c.take_buf() {
                model::check_handed_back(b.id, seed, step);
            }
        })
    }
}

/// The device acts while a lane holds the engine: completes or fails
/// requests of the lane's queue pair or another's (`qps`), or, if
/// hostile, forges a completion; true when it forged one, which must be
/// polled at once.
pub(super) fn device_acts(dev: &mut SimDevice, rng: &mut Rng, qps: &[(QpId, usize)]) -> bool {
    let any = if qps.is_empty() || rng.chance(300) {
        dev.rng.below(dev.qps.len() as u64) as usize
    } else {
        qps[rng.below(qps.len() as u64) as usize].1
    };
    if dev.hostile && rng.chance(100) {
        dev.forge();
        return true;
    }
    if !dev.qps[any].destroyed {
        if rng.chance(30) {
            dev.fail(any);
        } else if rng.chance(300) {
            dev.complete_srq(any);
        } else {
            let recv = rng.chance(400);
            dev.complete(any, recv, 1 + rng.below(3) as usize);
        }
    }
    false
}
