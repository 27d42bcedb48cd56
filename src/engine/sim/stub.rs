//! The least a provider can do, for host tests of one engine path: it
//! counts the posts that reach it, keeps the last posted ids, and hands
//! back the last receive's completion, one per poll.

use core::mem::MaybeUninit;

use crate::engine::core::Engine;
use crate::engine::doorbell::Provider;
use crate::engine::qp_slot::{QpId, QpState};
use crate::error::Error;
use crate::memory::NicBuf;
use crate::raw::PostFailed;
use crate::sys::{self, Zeroed};

pub(crate) struct Stub {
    pub(super) recv_id: u64,
    pub(super) send_id: u64,
    /// Calls of the three posts.
    pub(super) posts: u32,
    qp_num: u32,
}

impl Stub {
    pub(crate) fn new(qp_num: u32) -> Stub {
        Stub {
            recv_id: 0,
            send_id: 0,
            posts: 0,
            qp_num,
        }
    }
}

/// Places a queue pair numbered `qp_num` (as the stub's completions say)
/// in `engine`, `depth` deep both ways with one scatter/gather entry per
/// request, and moves it to RTS.
pub(crate) fn one_qp<B: NicBuf>(engine: &mut Engine<B, Stub>, qp_num: u32, depth: u32) -> QpId {
    super::seam::place(engine, (), qp_num, depth, QpState::RTS).unwrap()
}

impl Provider for Stub {
    type Qp = ();
    type Cq = ();
    type Srq = ();
    type Window = ();

    unsafe fn post_send(&mut self, _: &(), wrs: &mut [sys::ibv_send_wr]) -> Result<(), PostFailed> {
        self.posts += 1;
        self.send_id = wrs[0].wr_id;
        Ok(())
    }

    unsafe fn post_recv(&mut self, _: &(), wrs: &mut [sys::ibv_recv_wr]) -> Result<(), PostFailed> {
        self.posts += 1;
        self.recv_id = wrs[0].wr_id;
        Ok(())
    }

    unsafe fn post_srq_recv(
        &mut self,
        _: &(),
        _: &mut [sys::ibv_recv_wr],
    ) -> Result<(), PostFailed> {
        self.posts += 1;
        Ok(())
    }

    #[inline(never)]
    fn poll<'a>(
        &mut self,
        _: &(),
        out: &'a mut [MaybeUninit<sys::ibv_wc>],
    ) -> Result<&'a [sys::ibv_wc], Error> {
        let wc = out[0].write(sys::ibv_wc::zeroed());
        wc.wr_id = core::mem::take(&mut self.recv_id);
        wc.opcode = sys::ibv_wc_opcode::RECV;
        wc.qp_num = self.qp_num;
        wc.byte_len = 64;
        let n = usize::from(wc.wr_id != 0);
        // SAFETY: the first entry was written above.
        Ok(unsafe { core::slice::from_raw_parts(out.as_ptr().cast(), n) })
    }

    fn set_state(&mut self, _: &(), _: sys::ibv_qp_state) -> Result<(), Error> {
        Ok(())
    }

    fn destroy_qp(&mut self, _: ()) -> Result<(), Error> {
        Ok(())
    }

    fn destroy_srq(&mut self, _: ()) -> Result<(), Error> {
        Ok(())
    }
}
