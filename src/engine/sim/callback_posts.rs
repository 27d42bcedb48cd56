//! Posting from inside a poll's callback, as a server's loop does: a reply
//! on the queue pair the request came from, a receive's buffers posted
//! again (a shared receive's in its slot), a buffer taken back and posted as a receive anywhere, a new
//! request on any queue pair (removed ones included), a prepared post, an
//! inline one; each counted for allocations like any post, and each
//! buffer's new home told to the model. Then, sometimes, the callback
//! panics: what it posted stays in flight and comes back later.
// Refused posts come back with their requests, by value, as the API does.
#![allow(clippy::result_large_err)]

use alloc::vec::Vec;

use crate::engine::completion::CompletionRef;
use crate::engine::prepared_table::{PreparedRecv, PreparedSend};
use crate::engine::qp_slot::QpId;
use crate::sgl::Local;
use crate::wr::{RecvRequest, SendOp};

use super::alloc_count::counted;
use super::device::{Sim, SimBuf};
use super::model::{self, Home};
use super::rng::Rng;
use super::run::{any_request, buf};

/// What a callback may post to: the run's queue pairs and prepared
/// requests, and the handles of removed queue pairs.
pub(super) struct Targets<'r> {
    pub(super) qps: &'r [(QpId, usize)],
    pub(super) removed: &'r [QpId],
    pub(super) sends: &'r [(PreparedSend, Home)],
    pub(super) recvs: &'r [(PreparedRecv, Home)],
    pub(super) seed: u64,
    pub(super) step: u64,
}

impl Targets<'_> {
    /// Any queue pair handle: mostly live ones, sometimes a removed one.
    fn any_qp(&self, rng: &mut Rng) -> Option<QpId> {
        if !self.removed.is_empty() && rng.chance(100) {
            return Some(self.removed[rng.below(self.removed.len() as u64) as usize]);
        }
        (!self.qps.is_empty()).then(|| self.qps[rng.below(self.qps.len() as u64) as usize].0)
    }

    fn refused(&self, bufs: impl Iterator<Item = SimBuf>) {
        for b in bufs {
            model::check_handed_back(b.id, self.seed, self.step);
        }
    }

    fn posted(ids: &[u64], home: Home) {
        for &id in ids {
            model::note_posted(id, home);
        }
    }

    /// One post from the callback lent `c`.
    pub(super) fn post_from(&self, c: &mut CompletionRef<'_, SimBuf, Sim>, rng: &mut Rng) {
        let (seed, step) = (self.seed, self.step);
        match rng.below(6) {
            0 => {
                // A reply on the queue pair the request came from.
                let unsignaled = rng.chance(300);
                let (req, ids) = any_request(rng, step, unsignaled);
                let home = c.qp().map(|q| Home::Qp(q.index));
                match counted(|| c.reply(req)) {
                    Ok(()) => Self::posted(&ids, home.expect("posted on its queue pair")),
                    Err(e) => self.refused(e.request.into_bufs()),
                }
            }
            1 => {
                // The receive read where it landed (a shared receive in its
                // slot), then its own buffers again where they were: their
                // home does not change, and nothing of it is left here.
                if let Some(b) = c.buf() {
                    model::check_handed_back(b.id, seed, step);
                }
                if counted(|| c.repost_recv()).is_ok() {
                    assert!(
                        c.buf().is_none() && c.take_buf().is_none(),
                        "seed {seed} step {step}: a receive posted again is still readable"
                    );
                    assert!(
                        c.repost_recv().is_err(),
                        "seed {seed} step {step}: a receive posted again twice"
                    );
                }
            }
            2 => {
                // A buffer taken back, posted as a receive elsewhere.
                let Some(b) = c.take_buf() else { return };
                model::check_handed_back(b.id, seed, step);
                let id = b.id;
                let to = self.any_qp(rng).filter(|_| rng.chance(700));
                let req = RecvRequest::new(Local::whole(b)).tag(step);
                let result = counted(|| match to {
                    Some(qp) => c.poster().post_recv(qp, req),
                    None => c.poster().post_srq_recv(req),
                });
                match (result, to) {
                    (Ok(()), Some(qp)) => model::note_posted(id, Home::Qp(qp.index)),
                    (Ok(()), None) => model::note_posted(id, Home::Srq),
                    (Err(e), _) => self.refused(e.request.into_bufs()),
                }
            }
            3 => {
                // A new request on any queue pair.
                let Some(qp) = self.any_qp(rng) else { return };
                let unsignaled = rng.chance(500);
                let (req, ids) = any_request(rng, step, unsignaled);
                match counted(|| c.poster().post_send(qp, req)) {
                    Ok(()) => Self::posted(&ids, Home::Qp(qp.index)),
                    Err(e) => self.refused(e.request.into_bufs()),
                }
            }
            4 => {
                // A prepared request posted again (its buffers stay home).
                if rng.chance(500) && !self.sends.is_empty() {
                    let (p, _) = self.sends[rng.below(self.sends.len() as u64) as usize];
                    let _ = counted(|| c.poster().post_prepared(p));
                } else if !self.recvs.is_empty() {
                    let (p, _) = self.recvs[rng.below(self.recvs.len() as u64) as usize];
                    let _ = counted(|| c.poster().post_prepared(p));
                }
            }
            _ => {
                let Some(qp) = self.any_qp(rng) else { return };
                let signaled = rng.chance(500);
                let _ = counted(|| {
                    c.poster()
                        .post_inline(qp, SendOp::Send, b"reply", step, signaled)
                });
            }
        }
    }
}

/// A lane's callback posts on the lane's own queue pair: always refused
/// (its queues keep no entries while the lane lives), the buffers given
/// back. Returns false if a post was taken.
pub(super) fn lane_refuses(
    c: &mut CompletionRef<'_, SimBuf, Sim>,
    own: QpId,
    seed: u64,
    step: u64,
) -> bool {
    let b = buf();
    let id = b.id;
    let mut ids: Vec<u64> = alloc::vec![id];
    let send = counted(|| {
        c.poster().post_send(
            own,
            crate::wr::SendRequest::new(SendOp::Send, Local::whole(b)),
        )
    });
    let recv_buf = buf();
    ids.push(recv_buf.id);
    let recv = counted(|| {
        c.poster()
            .post_recv(own, RecvRequest::new(Local::whole(recv_buf)))
    });
    let taken = send.is_ok() || recv.is_ok();
    for b in send
        .err()
        .map(|e| e.request.into_bufs())
        .into_iter()
        .flatten()
        .chain(
            recv.err()
                .map(|e| e.request.into_bufs())
                .into_iter()
                .flatten(),
        )
    {
        assert!(ids.contains(&b.id));
        model::check_handed_back(b.id, seed, step);
    }
    !taken
}
