//! A lane started without a receive on a queue pair whose receive (the
//! engine's, with its buffer) is still posted: that receive's completion
//! is not the lane's, and goes to the callback with its buffer. A lane
//! without a receive matches receive ids against its send ids, which
//! finds none; matching them against the receive ring would count the
//! engine's receive as the lane's and lose its buffer.

use alloc::vec::Vec;

use crate::endpoint::RemoteRegion;
use crate::engine::config::Queue;
use crate::engine::core::Engine;
use crate::sgl::Local;
use crate::wr::{RecvRequest, RemoteSlice, SendOp, SendRequest};

use super::device::SimBuf;
use super::stub::{one_qp, Stub};

#[test]
fn a_lane_without_a_receive_hands_the_engines_receive_back() {
    let mut engine = Engine::assemble(Stub::new(0x333), (), 64, None, None, false);
    let qp = one_qp(&mut engine, 0x333, 16);
    engine
        .post_recv(qp, RecvRequest::new(SimBuf { id: 7 }).tag(70))
        .map_err(|e| e.error)
        .unwrap();
    let remote = RemoteRegion {
        addr: 1 << 40,
        len: 1 << 20,
        rkey: 1,
    };
    let dst = RemoteSlice::new(&remote, 0, 1 << 16).unwrap();
    let write = SendRequest::new(SendOp::Write(dst), Local::whole(SimBuf { id: 1 }));
    let send = engine.prepare_send(qp, write).map_err(|e| e.error).unwrap();
    let mut lane = engine.lane(send, None).unwrap();
    let mut other = Vec::new();
    // The stub completes the receive the engine posted.
    let got = lane
        .poll(Queue::Send, |mut c| {
            other.push((c.tag(), c.is_recv(), c.take_buf().map(|b| b.id)))
        })
        .unwrap();
    assert_eq!((got.sent, got.received), (0, 0), "not the lane's");
    assert_eq!(other, [(70, true, Some(7))]);
}
