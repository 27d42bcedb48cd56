//! The completions a hostile device hands back that it must not: replays
//! and duplicates, random ids, ids of queue pairs that do not exist, a
//! queue pair's real id reported on another queue pair, ids just ahead of
//! what was posted, and shared-receive ids of the wrong generation. Never
//! one that names a request the device still holds on that queue pair:
//! that would be a real completion, which the model could not tell apart.
//! A forged completion goes to the front of the CQ and is polled in the
//! same step: an id just ahead of the posts, left queued, would name a
//! request posted later, which no engine can tell from a real completion.

use crate::engine::id::{self, WrId};
use crate::sys::{self, ibv_wc_status as St, Zeroed};

use super::device::SimDevice;

impl SimDevice {
    /// Queues one forged completion (or none, when the pick names a held
    /// request or finds nothing to forge from).
    pub(crate) fn forge(&mut self) {
        let Some(mut wc) = self.forged() else {
            return;
        };
        wc.status = if self.rng.chance(500) {
            St::SUCCESS
        } else {
            St::WR_FLUSH_ERR
        };
        let names_held = self.qps.iter().any(|q| {
            q.qp_num == wc.qp_num
                && q.queues
                    .iter()
                    .any(|d| d.iter().any(|h| h.wr_id == wc.wr_id))
        }) || self.srq.iter().any(|h| h.wr_id == wc.wr_id);
        if !names_held {
            self.push_not_owed(wc, true);
        }
    }

    fn forged(&mut self) -> Option<sys::ibv_wc> {
        let mut wc = sys::ibv_wc::zeroed();
        let qps = self.qps.len() as u64;
        let (a, b) = (
            self.rng.below(qps.max(1)) as usize,
            self.rng.below(qps.max(1)) as usize,
        );
        match self.rng.below(7) {
            // A replay or duplicate of an earlier completion.
            0 if qps > 0 => {
                let q = &self.qps[a];
                let at = self.rng.below(q.history.len().max(1) as u64) as usize;
                wc = *q.history.get(at)?;
            }
            // Random bits.
            1 => {
                wc.wr_id = self.rng.next();
                wc.qp_num = self.rng.next() as u32 & 0xFF_FFFF;
            }
            // A random id on a real queue pair.
            2 if qps > 0 => {
                wc.wr_id = self.rng.next();
                wc.qp_num = self.qps[a].qp_num;
            }
            // A request another queue pair holds, reported on this one.
            3 if qps > 1 => {
                let held = self.qps[a].queues.iter().flatten().next()?;
                wc.wr_id = held.wr_id;
                wc.qp_num = self.qps[b].qp_num;
            }
            // Just ahead of the newest request a queue pair was given.
            4 if qps > 0 => {
                let recv = self.rng.chance(500);
                let q = &self.qps[a];
                let held = q.queues.iter().flatten().map(|h| h.wr_id);
                let ids = held.chain(q.history.iter().map(|w| w.wr_id));
                let (qp, newest) = ids
                    .filter_map(|i| match id::decode(i) {
                        WrId::Ring { recv: r, qp, seq } if r == recv => Some((qp, seq)),
                        _ => None,
                    })
                    .max_by_key(|&(_, seq)| seq)?;
                wc.wr_id = id::ring(recv, qp, newest + 1 + self.rng.below(3));
                wc.qp_num = q.qp_num;
            }
            // A held shared receive's slot at another generation.
            5 if !self.srq.is_empty() => {
                let held = &self.srq[self.rng.below(self.srq.len() as u64) as usize];
                let WrId::Srq { slot, generation } = id::decode(held.wr_id) else {
                    return None;
                };
                let generation = if self.rng.chance(500) {
                    generation.wrapping_add(1)
                } else {
                    generation.wrapping_sub(1)
                };
                wc.wr_id = id::srq(slot, generation);
                wc.qp_num = self.qps.first()?.qp_num;
            }
            // Ids of queue pairs no engine has.
            _ => {
                wc.wr_id = self.rng.below(64) | (self.rng.below(4) << 62);
                wc.qp_num = 0xFF_FFF0;
            }
        }
        Some(wc)
    }
}
