//! Shared-receive lanes (`Engine::srq_lane`) against callers and a device
//! that misuse them: a start with foreign, released, repeated or too few
//! replies, or with sends in flight; a reply while every reply's buffer
//! is held by the device; a request dropped, forgotten or dropped by a
//! panic instead of posted again, or completed twice (a forgotten one's
//! too); a reply that fails; another queue pair's requests and a
//! callback that panics among them; a lane dropped or forgotten with
//! replies in flight. No buffer is written, read or dropped while the
//! device holds it. (A request read or posted again after its next poll,
//! or posted again twice, does not compile: `SrqRequest`'s doc-tests.)

use alloc::vec::Vec;

use crate::engine::config::Queue;
use crate::engine::core::Engine;
use crate::engine::prepared_table::PreparedSend;
use crate::engine::qp_slot::{QpId, QpState};
use crate::engine::srq::SrqSlots;
use crate::engine::srq_lane::SrqLane;
use crate::engine::srq_request::SrqRequest;
use crate::error::ErrorKind;
use crate::sgl::Local;
use crate::sys::ibv_wc_status as WcStatus;
use crate::wr::{RecvRequest, SendOp, SendRequest};

use super::alloc_count::counted;
use super::device::{Sim, SimBuf, SimDevice};
use super::model::{self, busy};

type SimEngine = Engine<SimBuf, Sim>;

/// An engine with a shared receive queue of 4 holding buffers 1..=4 and
/// two queue pairs on it (the device's 0 and 1), each 4 deep, with 4
/// prepared replies on queue pair 0 (tags 10..14) and one on 1.
fn engine() -> (SimEngine, [QpId; 2], [PreparedSend; 4], PreparedSend) {
    model::reset();
    let mut dev = SimDevice::new(0x51);
    dev.srq_depth = 4;
    let srq = SrqSlots::new((), 4, 1);
    let mut engine = Engine::assemble(Sim { dev }, (), 64, None, Some(srq), false);
    let qps = [0, 1].map(|_| {
        let (handle, qp_num) = engine.prov.dev.add_qp([4, 4], 1);
        super::seam::place(&mut engine, handle, qp_num, 4, QpState::RTS).unwrap()
    });
    let replies = [10, 11, 12, 13].map(|tag| prepare(&mut engine, qps[0], tag));
    let other = prepare(&mut engine, qps[1], 20);
    for _ in 0..4 {
        let req = RecvRequest::new(super::run::buf());
        engine.post_srq_recv(req).map_err(|e| e.error).unwrap();
    }
    (engine, qps, replies, other)
}

/// A prepared send of a new buffer on `qp`, tagged `tag`.
fn prepare(engine: &mut SimEngine, qp: QpId, tag: u64) -> PreparedSend {
    let req = SendRequest::new(SendOp::Send, Local::whole(super::run::buf())).tag(tag);
    engine.prepare_send(qp, req).map_err(|e| e.error).unwrap()
}

/// A reply, without a request, whose buffer must not be held by the device.
fn reply(lane: &mut SrqLane<'_, SimBuf, Sim>) -> Result<(), ErrorKind> {
    let fill = |b: &mut SimBuf| assert!(!busy(b.id), "a reply written while the device holds it");
    counted(|| lane.reply_with(fill)).map_err(|e| e.kind())
}

/// Polls once, for a completion that is not a request.
fn poll_none(lane: &mut SrqLane<'_, SimBuf, Sim>) -> Result<(), crate::error::Error> {
    let got = lane.poll(Queue::Send, |_| panic!("not the lane's"))?;
    assert!(got.is_none(), "a request");
    Ok(())
}

/// The id of the buffer a request holds.
fn held(request: &SrqRequest<'_, SimBuf, Sim>) -> u64 {
    request.buf().unwrap().id
}

#[test]
fn a_server_loop_answers_every_request_and_never_writes_a_held_reply() {
    let (mut engine, _, replies, _) = engine();
    let mut lane = engine.srq_lane(&replies).unwrap();
    let mut answered = 0;
    for round in 0..40u32 {
        lane.provider().dev.complete_srq(0);
        // The data path allocates nothing.
        let got = counted(|| lane.poll(Queue::Send, |_| panic!("not the lane's")));
        let mut request = got.unwrap().expect("a request");
        assert_eq!(request.byte_len(), 8, "round {round}");
        assert!(!busy(held(&request)));
        let fill = |b: &mut SimBuf| assert!(!busy(b.id), "a reply written while held");
        counted(|| request.reply_with(fill)).unwrap();
        counted(|| request.repost()).unwrap();
        answered += 1;
        // The device finishes replies late, in bursts.
        if round % 3 == 2 {
            let held = lane.provider().dev.qps[0].queues[0].len();
            lane.provider().dev.complete(0, false, held);
            while !lane.provider().dev.cq.is_empty() {
                poll_none(&mut lane).unwrap();
            }
        }
    }
    assert_eq!(answered, 40);
    drop(lane);
    assert_eq!(engine.srq_posted(), 4);
}

#[test]
fn a_reply_waits_for_a_completion_that_covers_its_last_post() {
    let (mut engine, _, replies, _) = engine();
    let mut lane = engine.srq_lane(&replies).unwrap();
    for _ in 0..4 {
        reply(&mut lane).unwrap();
    }
    // The queue is full: the next reply is reply 0 again, held.
    assert_eq!(reply(&mut lane), Err(ErrorKind::QueueFull));
    // Finished by the device but not yet polled: still refused.
    lane.provider().dev.complete(0, false, 1);
    assert_eq!(reply(&mut lane), Err(ErrorKind::QueueFull));
    // The second post was signaled (half the depth): it covers the first.
    lane.provider().dev.complete(0, false, 1);
    poll_none(&mut lane).unwrap();
    reply(&mut lane).unwrap();
    reply(&mut lane).unwrap();
    assert_eq!(reply(&mut lane), Err(ErrorKind::QueueFull));
}

#[test]
fn a_start_with_the_wrong_replies_is_refused() {
    let (mut engine, qps, [a, b, c, d], other) = engine();
    let refused = |engine: &mut SimEngine, replies: &[PreparedSend]| {
        engine.srq_lane(replies).map(|_| ()).unwrap_err().kind()
    };
    assert_eq!(refused(&mut engine, &[a, b, c]), ErrorKind::InvalidArgument);
    assert_eq!(
        refused(&mut engine, &[a, b, c, c]),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        refused(&mut engine, &[a, b, c, other]),
        ErrorKind::InvalidArgument
    );
    assert_eq!(refused(&mut engine, &[]), ErrorKind::InvalidArgument);
    // Another engine's handle (the same index, another key).
    let mut stranger: SimEngine = Engine::assemble(
        Sim {
            dev: SimDevice::new(2),
        },
        (),
        64,
        None,
        None,
        false,
    );
    let (handle, qp_num) = stranger.prov.dev.add_qp([4, 4], 1);
    let their_qp = super::seam::place(&mut stranger, handle, qp_num, 4, QpState::RTS).unwrap();
    let theirs = prepare(&mut stranger, their_qp, 0);
    assert!(engine.srq_lane(&[theirs, b, c, d]).is_err());
    // A released one.
    engine.release_prepared(d).unwrap().for_each(drop);
    assert!(engine.srq_lane(&[a, b, c, d]).is_err());
    let d = prepare(&mut engine, qps[0], 13);
    // Sends in flight on the queue pair.
    engine.post_prepared(a).unwrap();
    assert_eq!(
        refused(&mut engine, &[a, b, c, d]),
        ErrorKind::InvalidArgument
    );
    engine.prov.dev.complete(0, false, 1);
    engine.poll(|_| {}).unwrap();
    // Eight is fine: more replies than the queue holds, a power of two;
    // five is not.
    let [e, f, g, h] = [14, 15, 16, 17].map(|tag| prepare(&mut engine, qps[0], tag));
    assert_eq!(
        refused(&mut engine, &[a, b, c, d, e]),
        ErrorKind::InvalidArgument
    );
    assert!(engine.srq_lane(&[a, b, c, d, e, f, g, h]).is_ok());
    // Without a shared receive queue.
    let mut plain: SimEngine = Engine::assemble(
        Sim {
            dev: SimDevice::new(1),
        },
        (),
        64,
        None,
        None,
        false,
    );
    assert_eq!(
        refused(&mut plain, &[a, b, c, d]),
        ErrorKind::InvalidArgument
    );
}

#[test]
fn a_duplicate_of_a_request_posted_again_reaches_nothing() {
    let (mut engine, _, replies, _) = engine();
    let mut lane = engine.srq_lane(&replies).unwrap();
    lane.provider().dev.complete_srq(0);
    let wc = *lane.provider().dev.qps[0].history.last().unwrap();
    let request = lane.poll(Queue::Send, |_| panic!()).unwrap().unwrap();
    let id = held(&request);
    request.repost().unwrap();
    assert_eq!(
        super::model::BUSY.with(|b| b.borrow().get(&id).copied()),
        Some(1)
    );
    // The same completion again: its slot's generation moved on.
    lane.provider().dev.push_not_owed(wc, false);
    let mut other = 0;
    assert!(lane.poll(Queue::Send, |_| other += 1).unwrap().is_none());
    assert_eq!(other, 0);
    drop(lane);
    assert_eq!(engine.srq_posted(), 4);
}

#[test]
fn a_request_not_posted_again_frees_its_slot_and_a_forgotten_one_leaks_it() {
    let (mut engine, _, replies, _) = engine();
    let mut lane = engine.srq_lane(&replies).unwrap();
    // Dropped: its buffer dropped, its slot free; a duplicate of its
    // completion reaches nothing.
    lane.provider().dev.complete_srq(0);
    let wc = *lane.provider().dev.qps[0].history.last().unwrap();
    let request = lane.poll(Queue::Send, |_| panic!()).unwrap().unwrap();
    let first = held(&request);
    drop(request);
    assert!(model::dropped(first));
    lane.provider().dev.push_not_owed(wc, false);
    poll_none(&mut lane).unwrap();
    // Dropped by a panic in its handler: the same.
    lane.provider().dev.complete_srq(0);
    let r = std::panic::catch_unwind(core::panic::AssertUnwindSafe(|| {
        let request = lane.poll(Queue::Send, |_| panic!()).unwrap().unwrap();
        let id = held(&request);
        std::panic::panic_any(id)
    }));
    let second = *r.unwrap_err().downcast::<u64>().unwrap();
    assert!(model::dropped(second));
    // Refused by the device when posted again: the same.
    lane.provider().dev.complete_srq(0);
    lane.provider().dev.refuse_permille = 1000;
    let request = lane.poll(Queue::Send, |_| panic!()).unwrap().unwrap();
    let refused = held(&request);
    assert!(request.repost().is_err());
    lane.provider().dev.refuse_permille = 0;
    assert!(model::dropped(refused));
    // Forgotten: its slot keeps its receive's id and its buffer.
    lane.provider().dev.complete_srq(0);
    let request = lane.poll(Queue::Send, |_| panic!()).unwrap().unwrap();
    let third = held(&request);
    core::mem::forget(request);
    drop(lane);
    assert!(!model::dropped(third));
    // Three free slots (each listed once): three posts fit, a fourth does
    // not. (The leaked one is in no free list: counted as posted.)
    assert_eq!(engine.srq_posted(), 1);
    for _ in 0..3 {
        let req = RecvRequest::new(super::run::buf());
        engine.post_srq_recv(req).map_err(|e| e.error).unwrap();
    }
    let req = RecvRequest::new(super::run::buf());
    let refused = engine.post_srq_recv(req).map_err(|e| e.error.kind());
    assert_eq!(refused.err(), Some(ErrorKind::QueueFull));
    drop(engine);
    assert!(!model::dropped(third) || !busy(third));
}

#[test]
fn a_duplicate_completion_of_a_forgotten_request_lends_its_slot_once_more() {
    let (mut engine, _, replies, _) = engine();
    let mut lane = engine.srq_lane(&replies).unwrap();
    lane.provider().dev.complete_srq(0);
    let wc = *lane.provider().dev.qps[0].history.last().unwrap();
    let request = lane.poll(Queue::Send, |_| panic!()).unwrap().unwrap();
    let forgotten = held(&request);
    core::mem::forget(request);
    // The device completed that receive: a duplicate lends the same slot
    // and buffer again, not held by the device, and its drop frees the
    // slot once and drops the buffer once (the model fails a second).
    lane.provider().dev.push_not_owed(wc, false);
    let again = lane.poll(Queue::Send, |_| panic!()).unwrap().unwrap();
    assert_eq!(held(&again), forgotten);
    assert!(!busy(forgotten));
    drop(again);
    assert!(model::dropped(forgotten));
    // A third copy reaches nothing: the release moved the slot's id on.
    lane.provider().dev.push_not_owed(wc, false);
    poll_none(&mut lane).unwrap();
    drop(lane);
    assert_eq!(engine.srq_posted(), 3);
    let req = RecvRequest::new(super::run::buf());
    engine.post_srq_recv(req).map_err(|e| e.error).unwrap();
    let req = RecvRequest::new(super::run::buf());
    let full = engine.post_srq_recv(req).map_err(|e| e.error.kind());
    assert_eq!(full.err(), Some(ErrorKind::QueueFull));
}

#[test]
fn a_failed_reply_comes_back_as_the_error_and_stops_the_replies() {
    let (mut engine, qps, replies, _) = engine();
    let mut lane = engine.srq_lane(&replies).unwrap();
    reply(&mut lane).unwrap();
    reply(&mut lane).unwrap();
    lane.provider().dev.fail(0);
    let e = lane.poll(Queue::Send, |_| panic!()).unwrap_err();
    assert_eq!(e.wc_status(), Some(WcStatus::REM_ACCESS_ERR));
    assert_eq!(reply(&mut lane), Err(ErrorKind::BadState), "posted in ERR");
    // The flushed one behind it.
    let flushed = lane.poll(Queue::Send, |_| panic!()).unwrap_err();
    assert_eq!(flushed.wc_status(), Some(WcStatus::WR_FLUSH_ERR));
    drop(lane);
    assert_eq!(engine.in_flight(qps[0]).unwrap(), (0, 0));
    for r in replies {
        engine.prepared_buf(r).unwrap();
    }
}

#[test]
fn other_queue_pairs_requests_reach_the_callback_which_cannot_post_on_the_lane() {
    let (mut engine, qps, replies, other) = engine();
    let mut lane = engine.srq_lane(&replies).unwrap();
    lane.provider().dev.complete_srq(1);
    let mut seen = Vec::new();
    let got = lane
        .poll(Queue::Send, |mut c| {
            seen.push(c.qp());
            let mut post = c.poster();
            assert!(
                post.post_prepared(replies[0]).is_err(),
                "posted on the lane's queue pair"
            );
            post.post_prepared(other).unwrap();
            c.repost_recv().unwrap();
        })
        .unwrap()
        .is_some();
    assert_eq!((got, seen), (false, alloc::vec![Some(qps[1])]));
    // A callback that panics leaves the lane whole.
    lane.provider().dev.complete_srq(1);
    let r = std::panic::catch_unwind(core::panic::AssertUnwindSafe(|| {
        lane.poll(Queue::Send, |_| {
            std::panic::resume_unwind(alloc::boxed::Box::new("cb"))
        })
        .map(|r| r.is_some())
    }));
    assert!(r.is_err());
    reply(&mut lane).unwrap();
    lane.provider().dev.complete_srq(0);
    let request = lane.poll(Queue::Send, |_| {}).unwrap().unwrap();
    assert_eq!(request.byte_len(), 8);
}

#[test]
fn a_lane_dropped_with_replies_in_flight_hands_them_back_later() {
    let (mut engine, qps, replies, _) = engine();
    let mut lane = engine.srq_lane(&replies).unwrap();
    for _ in 0..3 {
        reply(&mut lane).unwrap();
    }
    drop(lane);
    assert_eq!(engine.in_flight(qps[0]).unwrap(), (3, 0));
    for r in &replies[..3] {
        let e = engine.prepared_buf(*r).map(|_| ()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::BadState, "lent while in flight");
    }
    engine.prepared_buf(replies[3]).unwrap();
    // The device finishes all three; only the second asked for a
    // completion, which covers the first: both are handed back as posts
    // of their prepared replies. The third waits for a later signal.
    engine.prov.dev.complete(0, false, 3);
    let mut tags = Vec::new();
    engine.poll(|c| tags.push(c.tag())).unwrap();
    assert_eq!(tags, [10, 11]);
    assert_eq!(engine.in_flight(qps[0]).unwrap(), (1, 0));
    engine.prepared_buf(replies[0]).unwrap();
    assert!(engine.prepared_buf(replies[2]).is_err());
    // A new lane refuses while it is in flight.
    assert!(engine.srq_lane(&replies).is_err());
}

#[test]
fn a_forgotten_lane_leaks_its_queue_pair_and_every_buffer_it_held() {
    let (mut engine, _, replies, _) = engine();
    let ids = replies.map(|r| engine.prepared_buf(r).unwrap().id);
    let mut lane = engine.srq_lane(&replies).unwrap();
    reply(&mut lane).unwrap();
    lane.provider().dev.complete_srq(0);
    let request = lane.poll(Queue::Send, |_| {}).unwrap().unwrap();
    let lent = held(&request);
    core::mem::forget(request);
    core::mem::forget(lane);
    for r in replies {
        assert!(
            engine.prepared_buf(r).is_err(),
            "a forgotten lane's reply lent"
        );
    }
    // The engine goes on with its other queue pair; the forgotten lane's
    // request stays lent to it: leaked.
    engine.prov.dev.complete_srq(1);
    let mut other = 0;
    engine
        .poll(|mut c| {
            other += 1;
            c.repost_recv().unwrap();
        })
        .unwrap();
    assert_eq!(other, 1);
    assert!(!model::dropped(lent));
    drop(engine);
    for id in ids {
        assert!(
            !model::dropped(id),
            "a reply's buffer freed while the device may hold it"
        );
    }
}

#[test]
fn a_lane_dropped_after_its_ring_turned_names_each_post_by_its_reply() {
    let (mut engine, qps, [a, b, c, d], _) = engine();
    let more = [14, 15, 16, 17].map(|tag| prepare(&mut engine, qps[0], tag));
    let ring = [a, b, c, d, more[0], more[1], more[2], more[3]];
    let mut lane = engine.srq_lane(&ring).unwrap();
    for _ in 0..2 {
        for _ in 0..4 {
            reply(&mut lane).unwrap();
        }
        lane.provider().dev.complete(0, false, 4);
        while !lane.provider().dev.cq.is_empty() {
            poll_none(&mut lane).unwrap();
        }
    }
    // Posts 8, 9 and 10 use replies 0 (tag 10), 1 (11, signaled: every
    // second) and 2 (12).
    for _ in 0..3 {
        reply(&mut lane).unwrap();
    }
    drop(lane);
    engine.prov.dev.complete(0, false, 2);
    let mut tags = Vec::new();
    engine.poll(|c| tags.push(c.tag())).unwrap();
    assert_eq!(tags, [10, 11]);
    assert!(
        engine.prepared_buf(c).is_err(),
        "reply 2's post is in flight"
    );
    for r in [a, b, d] {
        engine.prepared_buf(r).unwrap();
    }
    for r in more {
        engine.prepared_buf(r).unwrap();
    }
}
