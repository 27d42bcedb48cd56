//! Prepared sends posted unreported (`post_prepared_unreported`), as a
//! server posts the replies nothing waits for: the poll hands back nothing
//! of one that succeeded, and every one that failed or flushed, with its
//! status; its buffer stays with its prepared request and is refused to
//! the caller while a post of it is in flight, whether or not that post
//! will be reported; a callback that panics in a chain of them strands no
//! entry; a lane started on the prepared send takes them over as its own;
//! a reset hands each back as flushed.

use alloc::vec::Vec;

use crate::engine::config::Queue;
use crate::engine::core::Engine;
use crate::engine::prepared_table::PreparedSend;
use crate::engine::qp_slot::{QpId, QpState};
use crate::error::ErrorKind;
use crate::sgl::Local;
use crate::sys::ibv_wc_status as WcStatus;
use crate::wr::{SendOp, SendRequest};

use super::device::{Sim, SimBuf, SimDevice};
use super::model;

type SimEngine = Engine<SimBuf, Sim>;

/// An engine with one queue pair 4 deep (a completion asked every 2
/// sends) and prepared sends tagged 7, 8 and 9.
fn engine() -> (SimEngine, QpId, [PreparedSend; 3]) {
    model::reset();
    let mut engine = Engine::assemble(
        Sim {
            dev: SimDevice::new(0x77),
        },
        (),
        64,
        None,
        None,
        false,
    );
    let (handle, qp_num) = engine.prov.dev.add_qp([4, 4], 1);
    let qp = super::seam::place(&mut engine, handle, qp_num, 4, QpState::RTS).unwrap();
    let sends = [7, 8, 9].map(|tag| {
        let req = SendRequest::new(SendOp::Send, Local::whole(super::run::buf())).tag(tag);
        engine.prepare_send(qp, req).map_err(|e| e.error).unwrap()
    });
    (engine, qp, sends)
}

/// Posts `reply` unreported twice: the second asks for the completion.
fn post_twice(engine: &mut SimEngine, reply: PreparedSend) {
    for _ in 0..2 {
        engine.post_prepared_unreported(reply).unwrap();
    }
}

/// What one poll hands back: each request's tag and status.
fn poll(engine: &mut SimEngine) -> Vec<(u64, WcStatus)> {
    let mut got = Vec::new();
    engine.poll(|c| got.push((c.tag(), c.status()))).unwrap();
    got
}

#[test]
fn an_unreported_post_that_succeeds_is_not_handed_back() {
    let (mut engine, qp, [reply, other, last]) = engine();
    post_twice(&mut engine, reply);
    let busy = engine.prepared_buf(reply).map(|_| ()).unwrap_err();
    assert_eq!(busy.kind(), ErrorKind::BadState, "lent while in flight");
    engine.prov.dev.complete(0, false, 2);
    assert!(
        poll(&mut engine).is_empty(),
        "an unreported post was handed back"
    );
    assert_eq!(engine.in_flight(qp).unwrap(), (0, 0));
    engine.prepared_buf(reply).unwrap();

    // Reported posts around unreported ones are handed back, each once.
    engine.post_prepared_unsignaled(other).unwrap();
    engine.post_prepared_unreported(reply).unwrap();
    engine.post_prepared(last).unwrap();
    engine.prov.dev.complete(0, false, 3);
    let ok = WcStatus::SUCCESS;
    assert_eq!(poll(&mut engine), [(8, ok), (9, ok)]);
    assert_eq!(engine.in_flight(qp).unwrap(), (0, 0));

    // The entry's own request unreported, after a reported one.
    engine.post_prepared_unsignaled(other).unwrap();
    engine.post_prepared_unreported(reply).unwrap();
    engine.prov.dev.complete(0, false, 2);
    assert_eq!(poll(&mut engine), [(8, ok)]);
    assert_eq!(engine.in_flight(qp).unwrap(), (0, 0));
    assert_eq!(engine.room(Queue::Send), 64, "every entry released once");
}

#[test]
fn an_unreported_post_that_fails_or_flushes_is_handed_back() {
    let (mut engine, qp, [reply, _, last]) = engine();
    post_twice(&mut engine, reply);
    engine.post_prepared(last).unwrap();
    // The first fails, the two behind it flush.
    engine.prov.dev.fail(0);
    let got = poll(&mut engine);
    let flushed = WcStatus::WR_FLUSH_ERR;
    assert_eq!(
        got,
        [(7, WcStatus::REM_ACCESS_ERR), (7, flushed), (9, flushed)]
    );
    assert_eq!(engine.state(qp).unwrap(), QpState::ERR);
    assert_eq!(engine.in_flight(qp).unwrap(), (0, 0));
    engine.prepared_buf(reply).unwrap();
}

#[test]
fn a_callback_that_panics_among_unreported_posts_strands_nothing() {
    let (mut engine, qp, [reply, other, last]) = engine();
    engine.post_prepared_unsignaled(other).unwrap();
    engine.post_prepared_unreported(reply).unwrap();
    engine.post_prepared(last).unwrap();
    engine.prov.dev.complete(0, false, 3);
    let unwound = std::panic::catch_unwind(core::panic::AssertUnwindSafe(|| {
        engine.poll(|_| std::panic::resume_unwind(alloc::boxed::Box::new("a callback that panics")))
    }));
    assert!(unwound.is_err());
    assert_eq!(engine.in_flight(qp).unwrap(), (0, 0));
    // The tables are whole: the queue takes its depth again, every entry
    // comes back once.
    for _ in 0..2 {
        engine.post_prepared_unreported(reply).unwrap();
        engine.post_prepared(last).unwrap();
        engine.prov.dev.complete(0, false, 2);
        assert_eq!(poll(&mut engine), [(9, WcStatus::SUCCESS)]);
    }
    engine.prepared_buf(reply).unwrap();
}

#[test]
fn a_lane_takes_over_the_unreported_posts_of_its_send() {
    let (mut engine, qp, [reply, ..]) = engine();
    post_twice(&mut engine, reply);
    let lane = engine.lane(reply, None).map(drop);
    assert!(lane.is_ok(), "refused: {:?}", lane.err());
    engine.prov.dev.complete(0, false, 2);
    poll(&mut engine);
    assert_eq!(engine.in_flight(qp).unwrap(), (0, 0));
    engine.prepared_buf(reply).unwrap();
}

#[test]
fn a_reset_hands_back_unreported_posts_as_flushed() {
    let (mut engine, qp, [reply, ..]) = engine();
    post_twice(&mut engine, reply);
    // The device reports nothing before RESET: both are left to it.
    let mut got = Vec::new();
    engine
        .flush_to_reset(qp, || false, &mut |c| got.push((c.tag(), c.status())))
        .unwrap();
    let flushed = WcStatus::WR_FLUSH_ERR;
    assert_eq!(got, [(7, flushed), (7, flushed)]);
    assert_eq!(engine.in_flight(qp).unwrap(), (0, 0));
    engine.prepared_buf(reply).unwrap();
}
