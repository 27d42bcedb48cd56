//! A simulated RDMA device behind the engine's `Provider` seam: it takes
//! posts up to each queue's depth (refusing some, mid-chain, on request),
//! completes them in every order the verbs specification allows (per
//! queue in order, unsignaled sends implied by a later signaled one, any
//! order on the shared receive queue, a flush of everything after an
//! error), and, when hostile, hands back ids it must not: duplicated,
//! stale, foreign, random, for queue pairs that do not exist.
//!
//! It records, per buffer, whether the device may still use it: the model
//! checks every buffer the engine hands back against that.

use alloc::collections::VecDeque;
use alloc::vec::Vec;
use core::mem::MaybeUninit;

use crate::error::Error;
use crate::memory::NicBuf;
use crate::raw::PostFailed;
use crate::site;
use crate::sys::{self, ibv_wc_opcode as Op, ibv_wc_status as St, Zeroed};

use super::super::doorbell::Provider;
use super::alloc_count::uncounted;
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
    fn drop(&mut self) {
        assert!(
            !busy(self.id),
            "buffer {} freed while the device may still use it",
            self.id
        );
        super::model::note_dropped(self.id);
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
}

/// The simulated device: queue pairs, the shared receive queue, one CQ.
pub(crate) struct SimDevice {
    pub(crate) qps: Vec<SimQp>,
    pub(crate) srq: Vec<Held>,
    pub(crate) srq_depth: usize,
    pub(crate) cq: VecDeque<sys::ibv_wc>,
    pub(crate) rng: Rng,
    /// Refuse a post (per chain entry) with this probability in 1/1000.
    pub(crate) refuse_permille: u32,
    /// Fail a destroy with this probability in 1/1000.
    pub(crate) fail_destroy_permille: u32,
    /// Requests taken.
    pub(crate) posts: u64,
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
            rng: Rng::new(seed),
            refuse_permille: 0,
            fail_destroy_permille: 0,
            posts: 0,
        }
    }

    /// A new queue pair of `depth` send and receive requests.
    pub(crate) fn add_qp(&mut self, depth: [usize; 2], max_sge: usize) -> (SimQpRef, u32) {
        let qp_num = 0x100 + self.qps.len() as u32 * 3;
        self.qps.push(SimQp {
            qp_num,
            depth,
            max_sge,
            queues: [VecDeque::new(), VecDeque::new()],
            error: false,
            destroyed: false,
            history: Vec::new(),
        });
        (SimQpRef(self.qps.len() - 1), qp_num)
    }

    fn push_wc(&mut self, qp: usize, wr_id: u64, status: St, opcode: Op) {
        let mut wc = sys::ibv_wc::zeroed();
        wc.wr_id = wr_id;
        wc.status = status;
        wc.opcode = opcode;
        wc.qp_num = self.qps[qp].qp_num;
        wc.byte_len = 8;
        self.qps[qp].history.push(wc);
        self.cq.push_back(wc);
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

    /// A receive of the shared queue, any of them, completes on `qp`.
    pub(crate) fn complete_srq(&mut self, qp: usize) {
        if self.srq.is_empty() {
            return;
        }
        let i = self.rng.below(self.srq.len() as u64) as usize;
        let held = self.srq.swap_remove(i);
        self.release(&held.bufs);
        self.push_wc(qp, held.wr_id, St::SUCCESS, Op::RECV);
    }

    fn release(&mut self, bufs: &[u64]) {
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

    /// A completion the device must not produce: a duplicate or a replay
    /// of an earlier one, a random id, an id of a queue pair that does not
    /// exist, or a real-looking id with a number no queue pair has. Never
    /// one that names a request the device still holds (that would be a
    /// real completion, which the model then could not tell apart).
    pub(crate) fn forge(&mut self) {
        let pick = self.rng.below(4);
        let mut wc = sys::ibv_wc::zeroed();
        let qps = self.qps.len();
        match pick {
            0 if qps > 0 => {
                let qp = self.rng.below(qps as u64) as usize;
                let Some(old) = self.qps[qp]
                    .history
                    .get(self.rng.below(self.qps[qp].history.len().max(1) as u64) as usize)
                else {
                    return;
                };
                wc = *old;
            }
            1 => {
                wc.wr_id = self.rng.next();
                wc.qp_num = self.rng.next() as u32 & 0xFF_FFFF;
            }
            2 if qps > 0 => {
                let qp = self.rng.below(qps as u64) as usize;
                wc.wr_id = self.rng.next();
                wc.qp_num = self.qps[qp].qp_num;
            }
            _ => {
                wc.wr_id = self.rng.below(64) | (self.rng.below(4) << 62);
                wc.qp_num = 0xFF_FFF0;
            }
        }
        wc.status = if self.rng.below(2) == 0 {
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
            self.cq.push_back(wc);
        }
    }

    /// The requests a chain of `n` would post, reading each work request's
    /// entries; refuses (returning how many were taken) on a full queue, too
    /// many entries, or a random refusal.
    fn take(
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

    fn hold(&mut self, held: &[Held]) {
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

/// The ids of a request's entries' buffers (inline entries name none).
///
/// # Safety
///
/// `sges` points at `n` valid entries (the post's contract).
unsafe fn bufs_of(sges: *const sys::ibv_sge, n: i32, inline: bool) -> Vec<u64> {
    if inline || n <= 0 {
        return Vec::new();
    }
    // SAFETY: the caller's contract.
    let sges = unsafe { core::slice::from_raw_parts(sges, n as usize) };
    sges.iter().map(|s| SimBuf::id_at(s.addr)).collect()
}

fn refused(errno: i32, posted: usize) -> PostFailed {
    PostFailed {
        error: Error::os(site!("sim post"), errno),
        posted,
    }
}

impl Provider for Sim {
    type Qp = SimQpRef;
    type Cq = ();
    type Srq = ();

    unsafe fn post_send(
        &mut self,
        qp: &SimQpRef,
        wrs: &mut [sys::ibv_send_wr],
    ) -> Result<(), PostFailed> {
        uncounted(|| {
            let d = &mut self.dev;
            let q = &d.qps[qp.0];
            let room = q.depth[0] - q.queues[0].len();
            let max_sge = q.max_sge;
            let (held, refusal) = d.take(wrs.len(), room, max_sge, |i| {
                let w = &wrs[i];
                let inline = w.send_flags.contains(sys::ibv_send_flags::INLINE);
                // SAFETY: the post's contract: `sg_list` holds `num_sge` entries.
                let bufs = unsafe { bufs_of(w.sg_list, w.num_sge, inline) };
                (
                    w.wr_id,
                    w.send_flags.contains(sys::ibv_send_flags::SIGNALED),
                    bufs,
                )
            });
            let n = held.len();
            d.hold(&held);
            d.qps[qp.0].queues[0].extend(held);
            if d.qps[qp.0].error {
                d.fail(qp.0); // posted in error: flushed at once
            }
            match refusal {
                None => Ok(()),
                Some(e) => Err(refused(e, n)),
            }
        })
    }

    unsafe fn post_recv(
        &mut self,
        qp: &SimQpRef,
        wrs: &mut [sys::ibv_recv_wr],
    ) -> Result<(), PostFailed> {
        uncounted(|| {
            let d = &mut self.dev;
            let q = &d.qps[qp.0];
            let room = q.depth[1] - q.queues[1].len();
            let max_sge = q.max_sge;
            let (held, refusal) = d.take(wrs.len(), room, max_sge, |i| {
                let w = &wrs[i];
                // SAFETY: the post's contract.
                (w.wr_id, true, unsafe {
                    bufs_of(w.sg_list, w.num_sge, false)
                })
            });
            let n = held.len();
            d.hold(&held);
            d.qps[qp.0].queues[1].extend(held);
            if d.qps[qp.0].error {
                d.fail(qp.0);
            }
            match refusal {
                None => Ok(()),
                Some(e) => Err(refused(e, n)),
            }
        })
    }

    unsafe fn post_srq_recv(
        &mut self,
        _srq: &(),
        wrs: &mut [sys::ibv_recv_wr],
    ) -> Result<(), PostFailed> {
        uncounted(|| {
            let d = &mut self.dev;
            let room = d.srq_depth - d.srq.len();
            let (held, refusal) = d.take(wrs.len(), room, 4, |i| {
                let w = &wrs[i];
                // SAFETY: the post's contract.
                (w.wr_id, true, unsafe {
                    bufs_of(w.sg_list, w.num_sge, false)
                })
            });
            let n = held.len();
            d.hold(&held);
            d.srq.extend(held);
            match refusal {
                None => Ok(()),
                Some(e) => Err(refused(e, n)),
            }
        })
    }

    fn poll<'a>(
        &mut self,
        _cq: &(),
        out: &'a mut [MaybeUninit<sys::ibv_wc>],
    ) -> Result<&'a [sys::ibv_wc], Error> {
        let mut n = 0;
        while n < out.len() {
            let Some(wc) = self.dev.cq.pop_front() else {
                break;
            };
            out[n].write(wc);
            n += 1;
        }
        // SAFETY: the first `n` entries were written above.
        Ok(unsafe { core::slice::from_raw_parts(out.as_ptr().cast(), n) })
    }

    fn destroy_qp(&mut self, qp: SimQpRef) -> Result<(), Error> {
        if self.dev.rng.below(1000) < u64::from(self.dev.fail_destroy_permille) {
            return Err(Error::os(site!("sim destroy"), libc::EBUSY));
        }
        // Destroyed: the device lets go of everything it held for it; its
        // completions already queued stay in the CQ (stale from now on).
        let held: Vec<Held> = self.dev.qps[qp.0]
            .queues
            .iter_mut()
            .flat_map(|q| q.drain(..))
            .collect();
        for h in &held {
            self.dev.release(&h.bufs);
        }
        self.dev.qps[qp.0].destroyed = true;
        Ok(())
    }

    fn destroy_srq(&mut self, _srq: ()) -> Result<(), Error> {
        let held = core::mem::take(&mut self.dev.srq);
        for h in &held {
            self.dev.release(&h.bufs);
        }
        Ok(())
    }
}
