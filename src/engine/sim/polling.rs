//! Polling as callers do it: taking the buffers, converting to owned
//! completions, leaving them to the engine, or panicking mid-callback; and
//! the promise that an error the engine reported stops the queue pair.

use alloc::vec::Vec;

use crate::engine::completion::CompletionRef;
use crate::engine::config::Queue;
use crate::engine::qp_slot::{QpId, QpState};
use crate::sys::ibv_wc_status as WcStatus;

use super::alloc_count::{counted, uncounted};
use super::callback_posts::Targets;
use super::device::{Sim, SimBuf};
use super::model;
use super::run::Run;

/// More than any poll can hand back: 16 entries, each finishing at most a
/// whole queue (the simulation's queues hold at most 16).
const MOST_PER_POLL: u64 = 16 * 16;

impl Run {
    pub(super) fn poll(&mut self) -> usize {
        let (seed, step) = (self.seed, self.step);
        let queue = self.rng.chance(200).then_some(Queue::Send);
        let panic_at = self.rng.chance(20).then(|| self.rng.below(3));
        let mode = self.rng.below(3);
        let posts = self.posts_in_callbacks;
        let mut seen = 0u64;
        let mut handed = 0u64;
        let mut failed: Vec<QpId> = Vec::new();
        let Run {
            engine,
            rng,
            qps,
            removed,
            sends,
            recvs,
            ..
        } = self;
        let targets = Targets {
            qps,
            removed,
            sends,
            recvs,
            seed,
            step,
        };
        let mut callback = |mut c: CompletionRef<'_, SimBuf, Sim>| {
            uncounted(|| {
                if c.status() != WcStatus::SUCCESS {
                    failed.extend(c.qp());
                }
                // A server replies, and posts its receives again, from here.
                while rng.chance(posts) {
                    targets.post_from(&mut c, rng);
                }
                if panic_at == Some(seen) {
                    // Unwinds without the panic hook's message.
                    std::panic::resume_unwind(alloc::boxed::Box::new("a callback that panics"));
                }
                seen += 1;
                assert!(
                    seen <= MOST_PER_POLL,
                    "seed {seed} step {step}: one poll handed back more requests than every queue holds"
                );
                match mode {
                    0 => {
                        if let Some(b) = c.take_buf() {
                            model::check_handed_back(b.id, seed, step);
                            handed += 1;
                        }
                    }
                    1 => {
                        for b in c.into_owned().into_bufs() {
                            model::check_handed_back(b.id, seed, step);
                            handed += 1;
                        }
                    }
                    _ => {} // left to the engine, which drops them
                }
            })
        };
        let result = std::panic::catch_unwind(core::panic::AssertUnwindSafe(|| {
            counted(|| match queue {
                Some(q) => engine.poll_queue(q, &mut callback),
                None => engine.poll(&mut callback),
            })
        }));
        self.report.handed_back += handed;
        self.check_stopped(&failed);
        match result {
            Ok(r) => r.unwrap_or(0),
            Err(_) => 0,
        }
    }

    /// Every queue pair a failed completion was handed back for is in ERR:
    /// the engine refuses its posts until a reset.
    pub(super) fn check_stopped(&self, failed: &[QpId]) {
        for &qp in failed {
            if let Ok(state) = self.engine.state(qp) {
                assert_eq!(
                    state,
                    QpState::ERR,
                    "seed {} step {}: {qp:?} handed back a failed completion but is not in ERR",
                    self.seed,
                    self.step
                );
            }
        }
    }

    pub(super) fn poll_quietly(&mut self) {
        let (seed, step) = (self.seed, self.step);
        let mut failed: Vec<QpId> = Vec::new();
        let mut seen = 0;
        let _ = self.engine.poll(|mut c| {
            seen += 1;
            assert!(
                seen <= MOST_PER_POLL,
                "seed {seed} step {step}: a poll without end"
            );
            if c.status() != WcStatus::SUCCESS {
                failed.extend(c.qp());
            }
            if let Some(b) = c.take_buf() {
                model::check_handed_back(b.id, seed, step);
            }
        });
        self.check_stopped(&failed);
    }
}
