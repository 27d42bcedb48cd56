//! A simulated RDMA device behind the engine's `Provider` seam: it takes
//! posts up to each queue's depth (refusing some, mid-chain, on request),
//! completes them in every order the verbs specification allows (per
//! queue in order, unsignaled sends implied by a later signaled one, any
//! order on the shared receive queue, a flush of everything after an
//! error), and, when hostile, hands back ids it must not: duplicated,
//! stale, foreign, random, for queue pairs that do not exist.
//!
//! It records, per buffer, whether the device may still use it: the model
//! checks every buffer the engine hands back against that. Like real
//! devices, it reuses the number of a destroyed queue pair, and its
//! completions already queued outlive the queue pair.

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use crate::memory::NicBuf;
use crate::sys::{self, ibv_wc_opcode as Op, ibv_wc_status as St, Zeroed};

use super::model::{busy, BUSY};
use super::rng::Rng;

/// A buffer of the simulation: an identity and an address range of its own.
#[derive(Debug)]
pub(crate) struct SimBuf {
    pub(crate) id: u64,
}

/// Bytes per simulated buffer; addresses are `id * SPAN`.
const SPAN: u64 = 1 << 16;

impl SimBuf {
    /// The buffer a device address falls in.
    pub(crate) fn id_at(addr: u64) -> u64 {
        addr / SPAN
    }
}

impl Drop for SimBuf {
    /// The model's bookkeeping, not the engine's: its allocations are not
    /// the data path's (the engine drops a buffer a callback left).
    fn drop(&mut self) {
        super::alloc_count::uncounted(|| {
            if busy(self.id) {
                super::model::violation(alloc::format!(
                    "buffer {} freed while the device may still use it",
                    self.id
                ));
            }
            super::model::note_dropped(self.id);
        })
    }
}

// SAFETY: the simulation never dereferences these addresses: each buffer
// owns a range no other buffer has (ids are unique), "registered" under a
// key the simulated device accepts.
unsafe impl NicBuf for SimBuf {
    fn addr(&self) -> u64 {
        self.id * SPAN
    }
    fn len(&self) -> usize {
        4096
    }
    fn lkey(&self) -> u32 {
        7
    }
}

/// A window bound (or being bound) to a buffer of the simulation: it
/// holds the buffer, which its drop frees.
#[derive(Debug)]
pub(crate) struct SimWindow(pub(crate) SimBuf);

/// A request the device holds: its id, whether signaled, the buffers its
/// entries name.
#[derive(Clone, Debug)]
pub(crate) struct Held {
    pub(crate) wr_id: u64,
    pub(crate) signaled: bool,
    pub(crate) bufs: Vec<u64>,
}

/// One simulated queue pair.
pub(crate) struct SimQp {
    pub(crate) qp_num: u32,
    pub(crate) depth: [usize; 2],
    pub(crate) max_sge: usize,
    pub(crate) queues: [VecDeque<Held>; 2],
    pub(crate) error: bool,
    pub(crate) destroyed: bool,
    /// Completions it already produced, for replays and duplicates.
    pub(crate) history: Vec<sys::ibv_wc>,
    /// Unsignaled sends posted since the last signaled one.
    pub(crate) streak: u64,
}

/// `vendor_err` of a CQ entry no request of a live queue pair owns: forged
/// or replayed by a hostile device, or left by a destroyed queue pair.
pub(crate) const NOT_OWED: u32 = 0xF0F0_F0F0;

/// The simulated device: queue pairs, the shared receive queue, one CQ.
pub(crate) struct SimDevice {
    pub(crate) qps: Vec<SimQp>,
    pub(crate) srq: Vec<Held>,
    pub(crate) srq_depth: usize,
    pub(crate) cq: VecDeque<sys::ibv_wc>,
    /// What the CQ holds: an entry beyond it would overflow it (a real
    /// CQ overflowed is dead), which the engine's room must prevent.
    pub(crate) cq_depth: usize,
    /// Entries in the CQ that live requests owe (not `NOT_OWED`).
    pub(crate) owed: usize,
    pub(crate) rng: Rng,
    /// Refuse a post (per chain entry) with this probability in 1/1000.
    pub(crate) refuse_permille: u32,
    /// Fail a destroy with this probability in 1/1000.
    pub(crate) fail_destroy_permille: u32,
    /// Refuse every state change (a reset that fails), doing nothing.
    pub(crate) fail_state_changes: bool,
    /// Move to ERR without flushing yet (rxe flushes later, from a task a
    /// starved guest may not run for a while): a RESET first drops what
    /// the queue pair held with no completion at all.
    pub(crate) lazy_flush: bool,
    /// Requests taken.
    pub(crate) posts: u64,
    /// Forges completions, replays flushes after a reset, fails destroys.
    pub(crate) hostile: bool,
    /// Numbers of destroyed queue pairs, for reuse.
    free_qp_nums: Vec<u32>,
    next_qp_num: u32,
}

/// The provider the engine sees: the device, owned by the engine.
pub(crate) struct Sim {
    pub(crate) dev: SimDevice,
}

/// A simulated queue pair's handle: its index.
pub(crate) struct SimQpRef(pub(crate) usize);

impl SimDevice {
    pub(crate) fn new(seed: u64) -> SimDevice {
        SimDevice {
            qps: Vec::new(),
            srq: Vec::new(),
            srq_depth: 0,
            cq: VecDeque::new(),
            cq_depth: usize::MAX,
            owed: 0,
            rng: Rng::new(seed),
            refuse_permille: 0,
            fail_destroy_permille: 0,
            fail_state_changes: false,
            lazy_flush: false,
            posts: 0,
            hostile: false,
            free_qp_nums: Vec::new(),
            next_qp_num: 0x100,
        }
    }

    /// A new queue pair of `depth` send and receive requests.
    pub(crate) fn add_qp(&mut self, depth: [usize; 2], max_sge: usize) -> (SimQpRef, u32) {
        let qp_num = match self.free_qp_nums.pop() {
            Some(n) if self.rng.chance(500) => n,
            other => {
                self.free_qp_nums.extend(other);
                self.next_qp_num += 3;
                self.next_qp_num
            }
        };
        self.qps.push(SimQp {
            qp_num,
            depth,
            max_sge,
            queues: [VecDeque::new(), VecDeque::new()],
            error: false,
            destroyed: false,
            history: Vec::new(),
            streak: 0,
        });
        (SimQpRef(self.qps.len() - 1), qp_num)
    }

    pub(crate) fn push_wc(&mut self, qp: usize, wr_id: u64, status: St, opcode: Op) {
        let mut wc = sys::ibv_wc::zeroed();
        wc.wr_id = wr_id;
        wc.status = status;
        wc.opcode = opcode;
        wc.qp_num = self.qps[qp].qp_num;
        wc.byte_len = 8;
        self.qps[qp].history.push(wc);
        self.cq.push_back(wc);
        self.owed += 1;
        if self.owed > self.cq_depth {
            super::model::violation(alloc::format!(
                "the completion queue of {} entries overflowed: the engine let more requests in flight than it holds",
                self.cq_depth
            ));
        }
    }

    /// The next CQ entry, if any.
    pub(crate) fn pop_wc(&mut self) -> Option<sys::ibv_wc> {
        let wc = self.cq.pop_front()?;
        if wc.vendor_err != NOT_OWED {
            self.owed -= 1;
        }
        Some(wc)
    }

    /// Queues an entry no live request owes (forged, replayed).
    pub(crate) fn push_not_owed(&mut self, mut wc: sys::ibv_wc, front: bool) {
        wc.vendor_err = NOT_OWED;
        if front {
            self.cq.push_front(wc);
        } else {
            self.cq.push_back(wc);
        }
    }

    /// `qp`'s entries still queued are owed by nothing once it is gone
    /// (the engine counts its room back), or once a device cleans them.
    fn disown(&mut self, qp: usize, drop_them: bool) {
        let qp_num = self.qps[qp].qp_num;
        let mut disowned = 0;
        for wc in self.cq.iter_mut() {
            if wc.qp_num == qp_num && wc.vendor_err != NOT_OWED {
                wc.vendor_err = NOT_OWED;
                disowned += 1;
            }
        }
        self.owed -= disowned;
        if drop_them {
            self.cq.retain(|wc| wc.qp_num != qp_num);
        }
    }

    /// Finishes the oldest `n` requests of queue `q` of queue pair `qp`
    /// in order: the device is done with their buffers; completions for the
    /// signaled ones (and for every one, on a receive queue).
    pub(crate) fn complete(&mut self, qp: usize, recv: bool, n: usize) {
        for _ in 0..n {
            let Some(held) = self.qps[qp].queues[usize::from(recv)].pop_front() else {
                return;
            };
            self.release(&held.bufs);
            if recv || held.signaled {
                let op = if recv { Op::RECV } else { Op::RDMA_WRITE };
                self.push_wc(qp, held.wr_id, St::SUCCESS, op);
            }
        }
    }

    /// The head request of `qp`'s send queue fails (if the queue pair was
    /// not in error yet), and everything on both queues flushes.
    pub(crate) fn fail(&mut self, qp: usize) {
        let was = core::mem::replace(&mut self.qps[qp].error, true);
        for recv in [false, true] {
            let mut first = !was;
            while let Some(held) = self.qps[qp].queues[usize::from(recv)].pop_front() {
                self.release(&held.bufs);
                let status = if first && !recv {
                    St::REM_ACCESS_ERR
                } else {
                    St::WR_FLUSH_ERR
                };
                first = false;
                // A request that fails or flushes always gets a completion,
                // signaled or not (an error is always reported).
                self.push_wc(qp, held.wr_id, status, Op::SEND);
            }
        }
    }

    /// The head request of `qp`'s send queue fails with `status` (retries
    /// exceeded, say) and the queue pair is in error, the rest not flushed
    /// yet (see `lazy_flush`).
    pub(crate) fn fail_head(&mut self, qp: usize, status: St) {
        self.qps[qp].error = true;
        if let Some(held) = self.qps[qp].queues[0].pop_front() {
            self.release(&held.bufs);
            self.push_wc(qp, held.wr_id, status, Op::RDMA_WRITE);
        }
    }

    /// A receive of the shared queue, any of them, completes on `qp`. A
    /// hostile device sometimes queues the entry twice: the duplicate is
    /// polled with it or later, once its slot may be lent, posted again in
    /// place or reused.
    pub(crate) fn complete_srq(&mut self, qp: usize) {
        if self.srq.is_empty() {
            return;
        }
        let i = self.rng.below(self.srq.len() as u64) as usize;
        let held = self.srq.swap_remove(i);
        self.release(&held.bufs);
        self.push_wc(qp, held.wr_id, St::SUCCESS, Op::RECV);
        if self.hostile && self.rng.chance(300) {
            let wc = *self.qps[qp].history.last().expect("just pushed");
            self.push_not_owed(wc, false);
        }
    }

    /// `qp` moves to ERR (everything it holds flushes) or RESET: it holds
    /// nothing and leaves the error state; some devices also clean its
    /// entries off the CQ, and a hostile one replays old flushes.
    pub(crate) fn set_state(&mut self, qp: usize, state: sys::ibv_qp_state) {
        if state == sys::ibv_qp_state::ERR && self.lazy_flush {
            self.qps[qp].error = true;
            return;
        }
        if state == sys::ibv_qp_state::ERR {
            self.fail(qp);
            return;
        }
        self.discard(qp);
        self.qps[qp].error = false;
        self.qps[qp].streak = 0;
        // The engine hands back what the queue pair held as flushed and
        // counts its room back: its flushes still queued are owed by
        // nothing now (some devices clean them off the CQ).
        let clean = self.rng.chance(300);
        self.disown(qp, clean);
        if self.hostile {
            let replay: Vec<_> = self.qps[qp].history.iter().rev().take(4).copied().collect();
            for wc in replay {
                self.push_not_owed(wc, false);
            }
        }
    }

    /// The device lets go of everything `qp` holds, with no completion.
    pub(crate) fn discard(&mut self, qp: usize) {
        let held: Vec<Held> = self.qps[qp]
            .queues
            .iter_mut()
            .flat_map(|q| q.drain(..))
            .collect();
        for h in &held {
            self.release(&h.bufs);
        }
    }

    /// `qp` is gone; its number may be given to a new one, and its
    /// completions already queued stay in the CQ (stale from now on).
    pub(crate) fn destroy(&mut self, qp: usize) {
        self.discard(qp);
        self.disown(qp, false);
        self.qps[qp].destroyed = true;
        self.free_qp_nums.push(self.qps[qp].qp_num);
    }

    pub(crate) fn release(&mut self, bufs: &[u64]) {
        BUSY.with(|busy| {
            let mut busy = busy.borrow_mut();
            for b in bufs {
                match busy.get_mut(b) {
                    Some(n) if *n > 1 => *n -= 1,
                    _ => {
                        busy.remove(b);
                    }
                }
            }
        });
    }

    /// The requests a chain of `n` would post, reading each work request's
    /// entries; refuses (returning how many were taken) on a full queue, too
    /// many entries, or a random refusal.
    pub(crate) fn take(
        &mut self,
        n: usize,
        room: usize,
        max_sge: usize,
        read: impl Fn(usize) -> (u64, bool, Vec<u64>),
    ) -> (Vec<Held>, Option<i32>) {
        let mut taken = Vec::new();
        for i in 0..n {
            let (wr_id, signaled, bufs) = read(i);
            let refused = if taken.len() >= room {
                Some(libc::ENOMEM)
            } else if bufs.len() > max_sge || self.rng.below(1000) < u64::from(self.refuse_permille)
            {
                Some(libc::EINVAL)
            } else {
                None
            };
            if refused.is_some() {
                return (taken, refused);
            }
            taken.push(Held {
                wr_id,
                signaled,
                bufs,
            });
        }
        (taken, None)
    }

    pub(crate) fn hold(&mut self, held: &[Held]) {
        BUSY.with(|busy| {
            let mut busy = busy.borrow_mut();
            for h in held {
                for b in &h.bufs {
                    // A prepared request posted again holds its buffer again.
                    *busy.entry(*b).or_insert(0) += 1;
                }
            }
        });
        self.posts += held.len() as u64;
    }
}
