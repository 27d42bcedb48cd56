//! send_lat's critical window on a stub device, for counting instructions
//! on the host: a receive's completion polled, the receive posted again,
//! the reply posted (what `tests/softroce/critpath` counts on a device,
//! minus the provider), on the stub provider.
//!
//! `VERBS_WINDOW_ITERS=N valgrind --tool=callgrind
//! --toggle-collect='*window_once*' target/release/deps/verbs-HASH window
//! --ignored` counts N windows (each part is a function of its own, so
//! `callgrind_annotate --inclusive=yes` splits the poll and the two posts);
//! two runs' difference over their N difference is one window.

use crate::engine::config::Queue;
use crate::engine::core::Engine;
use crate::engine::prepared_table::{PreparedRecv, PreparedSend};
use crate::engine::qp_slot::QpId;
use crate::error::Error;
use crate::sgl::Local;
use crate::sys::{self, Zeroed};
use crate::wr::{RecvRequest, SendOp, SendRequest};

use super::device::SimBuf;
use super::stub::{one_qp, Stub};

struct Bench {
    engine: Engine<SimBuf, Stub>,
    recv: PreparedRecv,
    send: PreparedSend,
    received: u64,
}

/// One message's window, as perf's `send_lat` loop runs it.
#[inline(never)]
fn window_once(b: &mut Bench) -> Result<(), Error> {
    window_poll(b)?;
    window_recv(b)?;
    window_send(b)
}

#[inline(never)]
fn window_poll(b: &mut Bench) -> Result<usize, Error> {
    let received = &mut b.received;
    b.engine.poll_queue(Queue::Recv, |c| {
        if c.status() == sys::ibv_wc_status::SUCCESS {
            *received += 1;
        }
    })
}

#[inline(never)]
fn window_recv(b: &mut Bench) -> Result<(), Error> {
    b.engine.post_prepared(b.recv)
}

#[inline(never)]
fn window_send(b: &mut Bench) -> Result<(), Error> {
    b.engine.post_prepared(b.send)
}

fn bench() -> (Bench, QpId) {
    let mut engine = Engine::assemble(Stub::new(0x111), (), 64, Some(((), 64)), None, false);
    let qp = one_qp(&mut engine, 0x111, 16);
    let buf = |id| Local::whole(SimBuf { id });
    let recv = engine
        .prepare_recv(qp, RecvRequest::new(buf(1 << 40)))
        .map_err(|e| e.error)
        .unwrap();
    let send = engine
        .prepare_send(qp, SendRequest::new(SendOp::Send, buf(2 << 40)))
        .map_err(|e| e.error)
        .unwrap();
    let bench = Bench {
        engine,
        recv,
        send,
        received: 0,
    };
    (bench, qp)
}

#[test]
#[ignore = "an instruction count, run under valgrind (see the module docs)"]
fn window() {
    let iters: u64 = std::env::var("VERBS_WINDOW_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let (mut b, _qp) = bench();
    b.engine.post_prepared(b.recv).unwrap();
    for _ in 0..iters {
        window_once(&mut b).unwrap();
        // The reply's completion, outside the window.
        let id = core::mem::take(&mut b.engine.prov.send_id);
        let mut wc = sys::ibv_wc::zeroed();
        wc.wr_id = id;
        wc.qp_num = 0x111;
        b.engine.route(core::slice::from_ref(&wc), &mut |_| {});
    }
    assert_eq!(b.received, iters);
}
