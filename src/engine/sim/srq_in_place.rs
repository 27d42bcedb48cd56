//! A shared receive lent in its slot and posted again in place, against a
//! caller and a device that misuse it: a duplicate of its completion in the
//! same poll and after the slot is reused, a second post from one
//! callback, a take after the post, a post after the take, a callback that
//! panics or forgets what it was lent. Each leaves every buffer either
//! posted once or handed back or dropped, never both.

use alloc::vec::Vec;

use crate::engine::core::Engine;
use crate::engine::qp_slot::QpState;
use crate::engine::srq::SrqSlots;
use crate::sgl::Local;
use crate::wr::RecvRequest;

use super::device::{Sim, SimBuf, SimDevice};
use super::model::{self, busy, BUSY};

type SimEngine = Engine<SimBuf, Sim>;

/// An engine with a shared receive queue of 4 and one queue pair on it
/// (the device's queue pair 0), and a fresh model.
fn srq_engine() -> SimEngine {
    model::reset();
    BUSY.with(|b| b.borrow_mut().clear());
    let mut dev = SimDevice::new(0x5A);
    dev.srq_depth = 4;
    dev.cq_depth = 64;
    let srq = SrqSlots::new((), 4, 4);
    let mut engine = Engine::assemble(Sim { dev }, (), 64, None, Some(srq), false);
    let (handle, qp_num) = engine.prov.dev.add_qp([4, 4], 1);
    super::seam::place(&mut engine, handle, qp_num, 4, QpState::RTS).unwrap();
    engine
}

/// A receive of buffer `id` (tag `id`) on the shared queue.
fn post(engine: &mut SimEngine, id: u64) {
    engine
        .post_srq_recv(RecvRequest::new(SimBuf { id }).tag(id))
        .map_err(|e| e.error)
        .unwrap();
}

/// The device completes the one shared receive it holds on queue pair 0;
/// returns that completion, to replay.
fn complete(engine: &mut SimEngine) -> crate::sys::ibv_wc {
    let dev = &mut engine.prov.dev;
    assert_eq!(dev.srq.len(), 1, "one receive held");
    dev.complete_srq(0);
    *dev.qps[0].history.last().unwrap()
}

/// Posts of buffer `id` the device holds.
fn held(id: u64) -> u32 {
    BUSY.with(|b| b.borrow().get(&id).copied().unwrap_or(0))
}

#[test]
fn a_duplicate_of_a_reposted_receive_reaches_nothing() {
    let mut engine = srq_engine();
    post(&mut engine, 1);
    let wc = complete(&mut engine);
    // The same entry again, right behind: polled in the same batch, after
    // the callback posted the slot again.
    engine.prov.dev.push_not_owed(wc, false);
    let mut seen = Vec::new();
    engine
        .poll(|mut c| {
            seen.push(c.tag());
            assert!(!busy(c.buf().unwrap().id), "read while posted");
            c.repost_recv().unwrap();
        })
        .unwrap();
    assert_eq!(seen, [1], "the duplicate reached the reposted slot");
    assert_eq!(held(1), 1, "posted once");
    assert_eq!(engine.srq_posted(), 1);
    // Its next completion carries the new id and the buffer.
    complete(&mut engine);
    let mut back = Vec::new();
    engine
        .poll(|mut c| back.extend(c.take_buf().map(|b| b.id)))
        .unwrap();
    assert_eq!(back, [1]);
    assert!(!busy(1));
}

#[test]
fn a_duplicate_after_the_slot_is_reused_reaches_nothing() {
    let mut engine = srq_engine();
    post(&mut engine, 1);
    let wc = complete(&mut engine);
    // Left to the engine: dropped, the slot free.
    engine.poll(|_| {}).unwrap();
    assert!(model::dropped(1));
    // The same slot (the free list's last) takes buffer 2; the old
    // completion comes again.
    post(&mut engine, 2);
    engine.prov.dev.push_not_owed(wc, true);
    let mut seen = 0;
    engine.poll(|_| seen += 1).unwrap();
    assert_eq!(seen, 0, "the old id reached the slot's new receive");
    assert_eq!(held(2), 1);
    assert!(!model::dropped(2));
}

#[test]
fn a_second_repost_in_one_callback_is_refused() {
    let mut engine = srq_engine();
    post(&mut engine, 1);
    complete(&mut engine);
    let posts = engine.prov.dev.posts;
    let mut results = Vec::new();
    engine
        .poll(|mut c| {
            results.push(c.repost_recv().is_ok());
            results.push(c.repost_recv().is_ok());
        })
        .unwrap();
    assert_eq!(results, [true, false]);
    assert_eq!(engine.prov.dev.posts, posts + 1, "posted twice");
    assert_eq!(held(1), 1);
    assert_eq!(engine.srq_posted(), 1);
}

#[test]
fn nothing_is_taken_after_a_repost() {
    let mut engine = srq_engine();
    post(&mut engine, 1);
    complete(&mut engine);
    let mut after = None;
    engine
        .poll(|mut c| {
            c.repost_recv().unwrap();
            after = Some((c.buf().map(|b| b.id), c.take_buf().map(|b| b.id)));
            // Nor by converting it.
            assert_eq!(c.into_owned().into_bufs().count(), 0);
        })
        .unwrap();
    assert_eq!(after, Some((None, None)), "the device's buffer handed out");
    assert_eq!(held(1), 1);
    assert!(!model::dropped(1));
}

#[test]
fn a_repost_after_a_take_is_refused() {
    let mut engine = srq_engine();
    // Two buffers: one taken, one left in the completion.
    let req = RecvRequest::new(SimBuf { id: 1 })
        .sge(Local::whole(SimBuf { id: 2 }))
        .map_err(|_| ())
        .unwrap();
    engine.post_srq_recv(req).map_err(|e| e.error).unwrap();
    complete(&mut engine);
    let posts = engine.prov.dev.posts;
    let mut taken = Vec::new();
    engine
        .poll(|mut c| {
            let b = c.take_buf().unwrap();
            assert!(!busy(b.id));
            assert!(c.repost_recv().is_err(), "posted again without its buffer");
            taken.push(b);
        })
        .unwrap();
    assert_eq!(engine.prov.dev.posts, posts, "the device saw a post");
    assert_eq!(taken[0].id, 1);
    assert!(model::dropped(2), "the buffer left behind is dropped");
    assert_eq!(engine.srq_posted(), 0);
    // Every slot is free again.
    for id in 10..14 {
        post(&mut engine, id);
    }
}

#[test]
fn a_callback_that_panics_leaves_the_slot_free_and_its_buffer_dropped() {
    let mut engine = srq_engine();
    post(&mut engine, 1);
    complete(&mut engine);
    let r = std::panic::catch_unwind(core::panic::AssertUnwindSafe(|| {
        engine.poll(|c| {
            assert!(c.buf().is_some());
            std::panic::resume_unwind(alloc::boxed::Box::new("a callback that panics"));
        })
    }));
    assert!(r.is_err());
    assert!(model::dropped(1), "the lent buffer was kept");
    assert_eq!(held(1), 0, "posted again");
    assert_eq!(engine.srq_posted(), 0);
    for id in 10..14 {
        post(&mut engine, id);
    }

    // Panicking after the repost leaves it posted.
    let mut engine = srq_engine();
    post(&mut engine, 1);
    complete(&mut engine);
    let r = std::panic::catch_unwind(core::panic::AssertUnwindSafe(|| {
        engine.poll(|mut c| {
            c.repost_recv().unwrap();
            std::panic::resume_unwind(alloc::boxed::Box::new("a callback that panics"));
        })
    }));
    assert!(r.is_err());
    assert_eq!((held(1), model::dropped(1)), (1, false));
    assert_eq!(engine.srq_posted(), 1);
}

#[test]
fn forgetting_what_a_callback_is_lent_leaves_no_slot_posted_or_lent() {
    let mut engine = srq_engine();
    post(&mut engine, 1);
    complete(&mut engine);
    engine.poll(|c| core::mem::forget(c)).unwrap();
    assert!(
        model::dropped(1),
        "the slot kept a forgotten completion's buffer"
    );
    assert_eq!(held(1), 0);
    assert_eq!(engine.srq_posted(), 0);

    // A converted completion forgotten: its buffers leak (never freed
    // while posted), the slot is free. (A `Poster` holds nothing to
    // forget: it is a borrow of the engine.)
    post(&mut engine, 2);
    complete(&mut engine);
    engine.poll(|c| core::mem::forget(c.into_owned())).unwrap();
    assert_eq!((held(2), model::dropped(2)), (0, false));
    assert_eq!(engine.srq_posted(), 0);
    for id in 10..14 {
        post(&mut engine, id);
    }
}

#[test]
fn a_receive_of_its_queue_pair_is_read_in_place_too() {
    let mut engine = super::seam::engine::<SimBuf>(0x5B, 64);
    let qp = super::seam::add_qp(&mut engine, 4).unwrap();
    engine.mark_state(qp, QpState::RTS).unwrap();
    engine
        .post_recv(qp, RecvRequest::new(SimBuf { id: 1 }))
        .map_err(|e| e.error)
        .unwrap();
    engine.prov.dev.complete(0, true, 1);
    let mut read = Vec::new();
    engine
        .poll(|mut c| {
            read.extend(c.buf().map(|b| b.id));
            c.repost_recv().unwrap();
            read.extend(c.buf().map(|b| b.id));
        })
        .unwrap();
    assert_eq!(read, [1]);
    assert_eq!(held(1), 1);
}
