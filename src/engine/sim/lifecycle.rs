//! Queue pairs coming and going: the engine's own reset (through the
//! provider, as on a device), removal (whose destroy may fail; or that
//! hands back what the queue pair held, its callback posting), handles
//! used after their queue pair is gone, and the promise that no send queue
//! wedges.

use alloc::vec::Vec;

use crate::engine::completion::CompletionRef;
use crate::engine::qp_slot::{QpId, QpState};
use crate::error::Error;
use crate::sgl::Local;
use crate::sys::ibv_wc_status as WcStatus;
use crate::wr::{SendOp, SendRequest};

use super::callback_posts::Targets;
use super::device::{Sim, SimBuf};
use super::model::{self, Home};
use super::run::{buf, Run};

impl Run {
    /// `Engine`'s reset: ERR (the device flushes), the flushes taken for a
    /// few polls, RESET (the device holds nothing; it may clean the CQ or,
    /// hostile, replay old flushes), the rest handed back; then the
    /// simulation reconnects it to RTS.
    pub(super) fn reset(&mut self, qp: QpId, dev_qp: usize) {
        let (seed, step) = (self.seed, self.step);
        let mut polls = self.rng.below(3);
        let mut failed: Vec<QpId> = Vec::new();
        let settling = || {
            let more = polls > 0;
            polls = polls.saturating_sub(1);
            more
        };
        let mut on_done = |mut c: CompletionRef<'_, SimBuf, Sim>| {
            if c.status() != WcStatus::SUCCESS {
                failed.extend(c.qp());
            }
            if let Some(b) = c.take_buf() {
                model::check_handed_back(b.id, seed, step);
            }
        };
        let reset = self.engine.flush_to_reset(qp, settling, &mut on_done);
        assert!(
            reset.is_ok(),
            "seed {seed} step {step}: reset failed: {reset:?}"
        );
        assert_eq!(
            self.engine.in_flight(qp).unwrap(),
            (0, 0),
            "seed {seed} step {step}: {qp:?} still holds requests after its reset"
        );
        let q = &self.engine.prov.dev.qps[dev_qp];
        assert!(
            q.queues.iter().all(|d| d.is_empty()),
            "in RESET the device holds nothing"
        );
        failed.retain(|&f| f != qp);
        let _ = self.engine.mark_state(qp, QpState::RTS);
        self.check_failed_stopped(&failed);
    }

    fn check_failed_stopped(&self, failed: &[QpId]) {
        for &f in failed {
            if let Ok(state) = self.engine.state(f) {
                assert_eq!(
                    state,
                    QpState::ERR,
                    "seed {} step {}: {f:?}",
                    self.seed,
                    self.step
                );
            }
        }
    }

    pub(super) fn remove(&mut self, qp: QpId) {
        self.qps.retain(|&(q, _)| q != qp);
        self.removed.push(qp);
        let removed = if self.rng.chance(500) {
            self.remove_handing_back(qp)
        } else {
            self.engine.remove_qp(qp)
        };
        if removed.is_err() {
            // Leaked on purpose; the device keeps it (and may complete it).
            self.leaked.insert(Home::Qp(qp.index));
            self.report.leaked += 1;
        }
    }

    /// `remove_qp_with`, as the transfer removes a queue pair it could not
    /// reset: once the destroy succeeded, every request it held comes back
    /// flushed with its buffers. The callback posts as a server's would (a
    /// reply on the queue pair being removed must be refused) and may
    /// panic; either way the queue pair is gone after.
    fn remove_handing_back(&mut self, qp: QpId) -> Result<(), Error> {
        let (seed, step) = (self.seed, self.step);
        let panic_at = self.rng.chance(200).then(|| self.rng.below(4));
        let posts = self.posts_in_callbacks;
        let mut seen = 0u64;
        let mut wrong = Vec::new();
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
        let result = std::panic::catch_unwind(core::panic::AssertUnwindSafe(|| {
            engine.remove_qp_with(qp, |mut c| {
                if (c.qp(), c.status(), c.signaled()) != (Some(qp), WcStatus::WR_FLUSH_ERR, true) {
                    wrong.push((c.tag(), c.qp(), c.status()));
                }
                while rng.chance(posts) {
                    targets.post_from(&mut c, rng);
                }
                if panic_at == Some(seen) {
                    std::panic::resume_unwind(alloc::boxed::Box::new("a callback that panics"));
                }
                seen += 1;
                if let Some(b) = c.take_buf() {
                    model::check_handed_back(b.id, seed, step);
                }
            })
        }));
        assert!(
            wrong.is_empty(),
            "seed {seed} step {step}: {qp:?}'s removal handed back, not as its own flushes: {wrong:?}"
        );
        assert!(
            self.engine.state(qp).is_err(),
            "seed {seed} step {step}: {qp:?} still reachable after its removal"
        );
        result.unwrap_or(Ok(()))
    }

    /// A handle whose queue pair is gone (its slot maybe reused by a new
    /// one) reaches nothing: every call is refused and a post's buffers
    /// come back untouched.
    pub(super) fn use_stale_handle(&mut self) {
        if self.removed.is_empty() {
            return;
        }
        let stale = self.removed[self.rng.below(self.removed.len() as u64) as usize];
        let b = buf();
        let id = b.id;
        let req = SendRequest::new(SendOp::Send, Local::whole(b));
        match self.engine.post_send(stale, req) {
            Ok(()) => panic!(
                "seed {} step {}: a post through the stale handle {stale:?} was taken",
                self.seed, self.step
            ),
            Err(e) => {
                for b in e.request.into_bufs() {
                    assert_eq!(b.id, id);
                    model::check_handed_back(b.id, self.seed, self.step);
                }
            }
        }
        assert!(
            self.engine.state(stale).is_err(),
            "a stale handle has no state"
        );
        assert!(
            self.engine.in_flight(stale).is_err(),
            "nor requests in flight"
        );
    }

    /// A full send queue is never wedged: some request in it is signaled
    /// and still owed a completion (held by the device, or its completion
    /// queued), so room comes back. Earlier than that: the engine's count
    /// of unsignaled sends since the last signaled one, by which it decides
    /// when to signal, is what it actually posted.
    pub(super) fn check_not_wedged(&self) {
        for &(qp, dev_qp) in &self.qps {
            let Ok(slot) = self.engine.slot(qp) else {
                continue;
            };
            let streak = self.engine.prov.dev.qps[dev_qp].streak;
            assert!(
                slot.state != QpState::RTS || slot.unsignaled_run == streak,
                "seed {} step {}: {qp:?} counts {} unsignaled sends since the last signaled one; it posted {streak}",
                self.seed,
                self.step,
                slot.unsignaled_run
            );
            if slot.state != QpState::RTS || slot.send.len() < slot.send.capacity() {
                continue;
            }
            let d = &self.engine.prov.dev;
            let q = &d.qps[dev_qp];
            let owed = !q.queues[0].is_empty() || d.cq.iter().any(|wc| wc.qp_num == q.qp_num);
            assert!(
                owed || q.error,
                "seed {} step {}: {qp:?}'s send queue is full of requests the device finished without a completion: wedged",
                self.seed,
                self.step
            );
        }
    }
}
