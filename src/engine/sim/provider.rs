//! The simulated device behind the engine's `Provider` seam: posts read
//! the work requests the engine built (their ids, flags and entries),
//! polls hand back the CQ in order, state changes and destroys go to the
//! device.

use alloc::vec::Vec;
use core::mem::MaybeUninit;

use crate::error::{site, Error};
use crate::raw::PostFailed;
use crate::sys;

use super::super::doorbell::Provider;
use super::alloc_count::uncounted;
use super::device::{Sim, SimBuf, SimQpRef, SimWindow};

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
    type Window = SimWindow;

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
                let bufs = if w.opcode == sys::ibv_wr_opcode::BIND_MW {
                    // SAFETY: a bind's member of the union is `bind_mw`.
                    let at = unsafe { w.bind_mw_or_tso.bind_mw.bind_info.addr };
                    // The device holds the buffer the window is bound to.
                    alloc::vec![SimBuf::id_at(at)]
                } else {
                    // SAFETY: the post's contract: `sg_list` holds `num_sge` entries.
                    unsafe { bufs_of(w.sg_list, w.num_sge, inline) }
                };
                (
                    w.wr_id,
                    w.send_flags.contains(sys::ibv_send_flags::SIGNALED),
                    bufs,
                )
            });
            let n = held.len();
            d.hold(&held);
            let q = &mut d.qps[qp.0];
            for h in &held {
                q.streak = if h.signaled { 0 } else { q.streak + 1 };
            }
            q.queues[0].extend(held);
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
            let Some(wc) = self.dev.pop_wc() else {
                break;
            };
            out[n].write(wc);
            n += 1;
        }
        // SAFETY: the first `n` entries were written above.
        Ok(unsafe { core::slice::from_raw_parts(out.as_ptr().cast(), n) })
    }

    fn set_state(&mut self, qp: &SimQpRef, state: sys::ibv_qp_state) -> Result<(), Error> {
        if self.dev.fail_state_changes {
            return Err(Error::os(site!("sim modify_qp"), libc::EIO));
        }
        self.dev.set_state(qp.0, state);
        Ok(())
    }

    fn destroy_qp(&mut self, qp: SimQpRef) -> Result<(), Error> {
        if self.dev.rng.below(1000) < u64::from(self.dev.fail_destroy_permille) {
            return Err(Error::os(site!("sim destroy"), libc::EBUSY));
        }
        self.dev.destroy(qp.0);
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
