//! What a caller does with prepared requests: prepare, post again, borrow
//! or swap the buffer, release; each checked against the model.

use crate::engine::qp_slot::QpId;
use crate::wr::RecvRequest;

use super::alloc_count::counted;
use super::model::{self, Home};
use super::run::{buf, Run};

impl Run {
    pub(super) fn prepare(&mut self, qp: QpId, home: Home) {
        if self.rng.chance(500) {
            let (req, ids) = self.request();
            match self.engine.prepare_send(qp, req) {
                Ok(p) => {
                    Self::posted(&ids, home);
                    self.sends.push((p, home));
                }
                Err(e) => self.refused(e.request.into_bufs()),
            }
        } else {
            let b = buf();
            let id = b.id;
            match self.engine.prepare_recv(qp, RecvRequest::new(b)) {
                Ok(p) => {
                    Self::posted(&[id], home);
                    self.recvs.push((p, home));
                }
                Err(e) => self.refused(e.request.into_bufs()),
            }
        }
    }

    pub(super) fn post_prepared(&mut self) {
        if !self.sends.is_empty() && self.rng.chance(150) {
            // A chain: any handles, repeated or of other queue pairs (then
            // refused whole), each signaled or not.
            let pick = |run: &mut Self| run.sends[run.rng.below(run.sends.len() as u64) as usize].0;
            let mut chain = [pick(self); 5];
            let n = 1 + self.rng.below(5) as usize;
            for h in chain.iter_mut().take(n).skip(1) {
                if self.rng.chance(300) {
                    *h = pick(self);
                }
            }
            let quiet = self.rng.below(1 << n) as usize;
            let _ = counted(|| {
                self.engine
                    .post_prepared_chain(&chain[..n], |i| quiet & (1 << i) == 0)
            });
        } else if !self.sends.is_empty() && self.rng.chance(500) {
            let (p, _) = self.sends[self.rng.below(self.sends.len() as u64) as usize];
            let unsignaled = self.rng.chance(300);
            let unreported = unsignaled && self.rng.chance(500);
            let _ = counted(|| {
                if unreported {
                    self.engine.post_prepared_unreported(p)
                } else if unsignaled {
                    self.engine.post_prepared_unsignaled(p)
                } else {
                    self.engine.post_prepared(p)
                }
            });
        } else if !self.recvs.is_empty() {
            let (p, _) = self.recvs[self.rng.below(self.recvs.len() as u64) as usize];
            let _ = counted(|| self.engine.post_prepared(p));
        }
    }

    /// A loan (sometimes swapping the buffer) or a release: allowed only
    /// when the device is done with every post of the request.
    pub(super) fn touch_prepared(&mut self) {
        let (seed, step) = (self.seed, self.step);
        let release = self.rng.chance(300);
        let swap = self.rng.chance(300);
        macro_rules! touch {
            ($list:expr) => {{
                if $list.is_empty() {
                    return;
                }
                let i = self.rng.below($list.len() as u64) as usize;
                let (p, home) = $list[i];
                if release {
                    if let Ok(bufs) = self.engine.release_prepared(p) {
                        $list.swap_remove(i);
                        for b in bufs {
                            model::check_handed_back(b.id, seed, step);
                        }
                    }
                } else if let Ok(b) = self.engine.prepared_buf(p) {
                    model::check_handed_back(b.id, seed, step);
                    if swap {
                        let fresh = buf();
                        model::note_posted(fresh.id, home);
                        drop(core::mem::replace(b, fresh));
                    }
                }
            }};
        }
        if self.rng.chance(500) {
            touch!(self.sends)
        } else {
            touch!(self.recvs)
        }
    }
}
