//! What a reset hands back of the requests the device reported nothing
//! of: each as flushed. Once, every one but the newest came back as
//! `SUCCESS` (each took the reset's one made-up entry as a later
//! request's), so a caller would have counted writes that may never have
//! run as landed.

use alloc::vec::Vec;

use crate::endpoint::RemoteRegion;
use crate::engine::core::Engine;
use crate::sgl::Local;
use crate::sys::ibv_wc_status as WcStatus;
use crate::wr::{RemoteSlice, SendOp, SendRequest};

use super::device::SimBuf;
use super::stub::{one_qp, Stub};

#[test]
fn a_reset_hands_back_every_request_left_as_flushed() {
    let mut engine = Engine::assemble(Stub::new(0x222), (), 64, None, None, false);
    let qp = one_qp(&mut engine, 0x222, 16);
    let remote = RemoteRegion {
        addr: 1 << 40,
        len: 1 << 20,
        rkey: 1,
    };
    let dst = RemoteSlice::new(&remote, 0, 1 << 16).unwrap();
    for k in 0..3u64 {
        let req = SendRequest::new(SendOp::Write(dst), Local::whole(SimBuf { id: k + 1 })).tag(k);
        let req = if k < 2 { req.unsignaled() } else { req };
        engine.post_send(qp, req).map_err(|e| e.error).unwrap();
    }
    let mut got = Vec::new();
    // The stub reports nothing: all three are left for RESET.
    engine
        .flush_to_reset(qp, || false, &mut |mut c| {
            got.push((
                c.tag(),
                c.status(),
                c.signaled(),
                c.take_buf().map(|b| b.id),
            ));
        })
        .unwrap();
    let flushed = WcStatus::WR_FLUSH_ERR;
    assert_eq!(
        got,
        [
            (0, flushed, true, Some(1)),
            (1, flushed, true, Some(2)),
            (2, flushed, true, Some(3)),
        ]
    );
}

/// A queue pair destroyed with requests in it (one its caller could not
/// reset) hands each back as flushed, with its buffer, once the destroy
/// succeeded.
#[test]
fn a_removed_queue_pair_hands_back_what_it_held() {
    let mut engine = Engine::assemble(Stub::new(0x223), (), 64, None, None, false);
    let qp = one_qp(&mut engine, 0x223, 16);
    let remote = RemoteRegion {
        addr: 1 << 40,
        len: 1 << 20,
        rkey: 1,
    };
    let dst = RemoteSlice::new(&remote, 0, 1 << 16).unwrap();
    for k in 0..2u64 {
        let req = SendRequest::new(SendOp::Write(dst), Local::whole(SimBuf { id: k + 1 })).tag(k);
        engine.post_send(qp, req).map_err(|e| e.error).unwrap();
    }
    let mut got = Vec::new();
    engine
        .remove_qp_with(qp, |mut c| {
            got.push((c.tag(), c.status(), c.take_buf().map(|b| b.id)));
        })
        .unwrap();
    let flushed = WcStatus::WR_FLUSH_ERR;
    assert_eq!(got, [(0, flushed, Some(1)), (1, flushed, Some(2))]);
    assert!(engine.state(qp).is_err(), "removed");
}
