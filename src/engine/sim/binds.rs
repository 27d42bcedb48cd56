//! Audit finding 2 on the simulated device, which, unlike Soft-RoCE, binds
//! windows: a window stays with the engine, holding its buffer, from the
//! post of its bind until the engine has seen the bind's completion, so a
//! hostile caller can neither free nor revoke it while the device may
//! still bind it.

use alloc::vec::Vec;

use crate::engine::bind_table::BindTicket;
use crate::engine::core::Engine;
use crate::engine::qp_slot::{QpId, QpInfo, QpState};
use crate::error::ErrorKind;
use crate::memory::NicBuf;
use crate::sys::{self, ibv_wc_opcode as WcOpcode, Zeroed};

use super::device::{Sim, SimBuf, SimDevice, SimWindow};
use super::model::{self, BUSY};

type SimEngine = Engine<SimBuf, Sim>;

/// An engine on a fresh simulated device with one RC queue pair in RTS.
fn engine_with_qp() -> (SimEngine, QpId) {
    model::reset();
    BUSY.with(|b| b.borrow_mut().clear());
    let mut dev = SimDevice::new(7);
    let (handle, qp_num) = dev.add_qp([4, 4], 1);
    let mut engine = Engine::assemble(Sim { dev }, (), 64, None, None, false);
    let caps = sys::ibv_qp_cap {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = engine
        .place(handle, qp_num, 4, 4, caps, QpInfo::default())
        .map_err(|(e, _)| e)
        .unwrap();
    engine.mark_state(qp, QpState::RTS).unwrap();
    (engine, qp)
}

/// Binds a window to buffer `id` through `qp`, as `Engine::expose` does.
fn bind(engine: &mut SimEngine, qp: QpId, id: u64, tag: u64) -> BindTicket {
    let buf = SimBuf { id };
    let (prov, raw, wr_id) = engine.bind_slot(qp).unwrap();
    let mut wr = sys::ibv_send_wr::zeroed();
    wr.wr_id = wr_id;
    wr.opcode = sys::ibv_wr_opcode::BIND_MW;
    wr.send_flags = sys::ibv_send_flags::SIGNALED;
    // SAFETY: the simulated device reads the bind's address and nothing
    // else; the window holds the buffer from here on.
    unsafe {
        wr.bind_mw_or_tso.bind_mw.bind_info.addr = buf.addr();
        crate::engine::doorbell::Provider::post_send(prov, raw, core::slice::from_mut(&mut wr))
    }
    .map_err(|f| f.error)
    .unwrap();
    engine.bind_posted(qp, tag, SimWindow(buf))
}

/// The device completes every send it holds on `qp`; the engine polls.
/// Returns the tags handed back.
fn complete_and_poll(engine: &mut SimEngine, qp: QpId) -> Vec<u64> {
    engine.prov.dev.complete(qp.index as usize, false, 4);
    let mut seen = Vec::new();
    engine.poll(|c| seen.push(c.tag())).unwrap();
    seen
}

/// What `expose` returns, dropped at once by a hostile caller while the
/// bind is queued: the buffer must not be freed before the completion.
/// (When `expose` handed the window out at once, this freed buffer 1
/// while the device still held its bind.)
#[test]
fn what_expose_returns_dropped_at_once_frees_nothing_the_bind_holds() {
    let (mut engine, qp) = engine_with_qp();
    let _ = bind(&mut engine, qp, 1, 70); // dropped at once
    model::check_violations(7, 1);
    assert_eq!(complete_and_poll(&mut engine, qp), [70]);
    drop(engine);
    model::check_violations(7, 2);
    assert!(model::dropped(1), "freed with the engine, after the bind");
}

/// Claiming (to revoke, drop, or hand out the descriptor) before the
/// engine has seen the bind's completion is refused, the ticket back;
/// after it, the window comes out, and its drop frees the buffer.
#[test]
fn a_window_comes_out_only_after_its_binds_completion() {
    let (mut engine, qp) = engine_with_qp();
    let ticket = bind(&mut engine, qp, 1, 70);
    let (e, ticket) = engine.claim_bind(ticket).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::BadState, "{e}");
    // The device is done, but the engine has not seen it yet.
    engine.prov.dev.complete(qp.index as usize, false, 4);
    let (e, ticket) = engine.claim_bind(ticket).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::BadState, "{e}");
    let mut seen = Vec::new();
    engine.poll(|c| seen.push(c.tag())).unwrap();
    assert_eq!(seen, [70]);
    let window = engine.claim_bind(ticket).unwrap();
    assert_eq!(window.0.id, 1);
    drop(window);
    model::check_violations(7, 1);
}

/// Another engine's ticket reaches nothing there, and comes back.
#[test]
fn another_engines_ticket_is_not_found() {
    let (mut one, qp) = engine_with_qp();
    let (mut other, _) = engine_with_qp();
    let ticket = bind(&mut one, qp, 1, 70);
    let (e, ticket) = other.claim_bind(ticket).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    complete_and_poll(&mut one, qp);
    assert_eq!(one.claim_bind(ticket).unwrap().0.id, 1);
}

/// A reset flushes the bind, a successful removal ends it: either way the
/// device is done and the window comes out (bound or not).
#[test]
fn a_reset_or_a_removal_ends_the_bind() {
    let (mut engine, qp) = engine_with_qp();
    let ticket = bind(&mut engine, qp, 1, 70);
    let mut flushed = Vec::new();
    engine
        .flush_to_reset(qp, || false, &mut |c| flushed.push(c.opcode()))
        .unwrap();
    assert_eq!(flushed, [WcOpcode::BIND_MW]);
    drop(engine.claim_bind(ticket).unwrap());
    engine.mark_state(qp, QpState::RTS).unwrap();
    let ticket = bind(&mut engine, qp, 2, 71);
    engine.remove_qp(qp).unwrap();
    drop(engine.claim_bind(ticket).unwrap());
    model::check_violations(7, 1);
}

/// A queue pair whose destroy fails may still bind: its window is never
/// handed out, and the engine's drop leaks it rather than free the buffer.
#[test]
fn a_failed_destroy_keeps_the_window_for_good() {
    let (mut engine, qp) = engine_with_qp();
    let ticket = bind(&mut engine, qp, 1, 70);
    engine.prov.dev.fail_destroy_permille = 1000;
    assert!(engine.remove_qp(qp).is_err());
    let (e, _ticket) = engine.claim_bind(ticket).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::BadState, "{e}");
    drop(engine);
    model::check_violations(7, 1);
    assert!(!model::dropped(1), "leaked, never freed");
}
