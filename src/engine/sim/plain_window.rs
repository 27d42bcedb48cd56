//! plain_bw's window on a stub device, for counting instructions on the
//! host: one own-buffer request built and posted (`post_send`), its
//! completion routed and its buffer taken back (what
//! `tests/softroce/critpath plain_bw` counts on a device, minus the
//! provider and the loop), with a buffer the size of an `ArenaBuf`.
//!
//! `VERBS_WINDOW_ITERS=N valgrind --tool=callgrind
//! --toggle-collect='*plain_once*' target/release/deps/verbs-HASH
//! plain_window --ignored`; two runs' difference over their N difference
//! is one window.

use core::num::NonZeroU64;

use crate::engine::core::Engine;
use crate::engine::qp_slot::QpId;
use crate::memory::NicBuf;
use crate::sgl::Local;
use crate::sys::{self, Zeroed};
use crate::wr::{RemoteSlice, SendOp, SendRequest};

use super::stub::{one_qp, Stub};

/// An `ArenaBuf`'s shape (a pointer, an offset, a length, a slot), backed
/// by nothing: the stub reads no memory.
#[derive(Debug)]
struct Fat {
    base: NonZeroU64,
    offset: usize,
    len: usize,
    slot: u32,
}

// SAFETY: never dereferenced: the stub provider reads no memory.
unsafe impl NicBuf for Fat {
    fn addr(&self) -> u64 {
        self.base.get() + self.offset as u64
    }
    fn len(&self) -> usize {
        self.len
    }
    fn lkey(&self) -> u32 {
        self.slot
    }
}

struct Bench {
    engine: Engine<Fat, Stub>,
    qp: QpId,
    spare: Option<Fat>,
    dst: RemoteSlice,
}

/// One message's window, as perf's plain loop runs it (one request in
/// flight, signaled).
#[inline(never)]
fn plain_once(b: &mut Bench) {
    let buf = b.spare.take().expect("the buffer came back");
    let local = Local::range(buf, 0, 2).map_err(|(e, _)| e).unwrap();
    b.engine
        .post_send(b.qp, SendRequest::new(SendOp::Write(b.dst), local))
        .map_err(|e| e.error)
        .unwrap();
    let mut wc = sys::ibv_wc::zeroed();
    wc.wr_id = b.engine.prov.send_id;
    wc.qp_num = 0x111;
    let spare = &mut b.spare;
    b.engine.route(core::slice::from_ref(&wc), &mut |mut c| {
        *spare = c.take_buf()
    });
}

/// Messages per completion in `plain_stream`: perf's plain sender, 64 in
/// flight, a completion every 64th.
const WINDOW: usize = 64;

/// plain_bw's messages: a request posted (every 64th signaled), and for
/// every 64th the completion that hands the 64 back.
#[inline(never)]
fn plain_stream_once(b: &mut Bench, spares: &mut alloc::vec::Vec<Fat>, k: usize) {
    let buf = spares.pop().expect("a buffer back");
    let local = Local::range(buf, 0, 2).map_err(|(e, _)| e).unwrap();
    let req = SendRequest::new(SendOp::Write(b.dst), local);
    let req = if k % WINDOW == WINDOW - 1 {
        req
    } else {
        req.unsignaled()
    };
    b.engine.post_send(b.qp, req).map_err(|e| e.error).unwrap();
    if k % WINDOW == WINDOW - 1 {
        let mut wc = sys::ibv_wc::zeroed();
        wc.wr_id = b.engine.prov.send_id;
        wc.qp_num = 0x111;
        b.engine.route(core::slice::from_ref(&wc), &mut |mut c| {
            if let Some(buf) = c.take_buf() {
                spares.push(buf);
            }
        });
    }
}

#[test]
#[ignore = "an instruction count, run under valgrind (see the module docs)"]
fn plain_stream() {
    let iters: usize = std::env::var("VERBS_WINDOW_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let mut engine = Engine::assemble(Stub::new(0x111), (), 256, None, None, false);
    let qp = one_qp(&mut engine, 0x111, 128);
    let mut b = Bench {
        engine,
        qp,
        spare: None,
        dst: RemoteSlice::unchecked(1 << 40, 1 << 20, 9),
    };
    let mut spares: alloc::vec::Vec<Fat> = (0..WINDOW)
        .map(|i| Fat {
            base: NonZeroU64::MIN,
            offset: 4096 * i,
            len: 4096,
            slot: 3,
        })
        .collect();
    for k in 0..iters * WINDOW {
        plain_stream_once(&mut b, &mut spares, k);
    }
    assert_eq!(spares.len(), WINDOW);
}

#[test]
#[ignore = "an instruction count, run under valgrind (see the module docs)"]
fn plain_window() {
    let iters: u64 = std::env::var("VERBS_WINDOW_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let mut engine = Engine::assemble(Stub::new(0x111), (), 256, None, None, false);
    let qp = one_qp(&mut engine, 0x111, 64);
    let mut b = Bench {
        engine,
        qp,
        spare: Some(Fat {
            base: NonZeroU64::MIN,
            offset: 64,
            len: 4096,
            slot: 3,
        }),
        dst: RemoteSlice::unchecked(1 << 40, 1 << 20, 9),
    };
    for _ in 0..iters {
        plain_once(&mut b);
    }
    assert!(b.spare.is_some());
}

/// The checks `post_send` makes once the list is built (`send_one`'s
/// `check`): a Write longer than its remote slice and an atomic whose
/// result buffer is not one word are refused with the request given back,
/// nothing posted, no entry taken.
#[test]
fn post_send_refuses_what_its_built_list_does_not_fit() {
    let mut engine: Engine<Fat, Stub> =
        Engine::assemble(Stub::new(0x111), (), 256, None, None, false);
    let qp = one_qp(&mut engine, 0x111, 8);
    let buf = |len| Fat {
        base: NonZeroU64::MIN,
        offset: 0,
        len,
        slot: 3,
    };
    let room = engine.flights[0].available();
    let short = RemoteSlice::unchecked(1 << 40, 4, 9);
    let word = RemoteSlice::unchecked(1 << 40, 8, 9);
    let refused = [
        SendRequest::new(SendOp::Write(short), Local::whole(buf(8))),
        SendRequest::new(
            SendOp::FetchAdd {
                remote: word,
                add: 1,
            },
            Local::whole(buf(4)),
        ),
        SendRequest::new(
            SendOp::CompareSwap {
                remote: word,
                compare: 0,
                swap: 1,
            },
            Local::whole(buf(16)),
        ),
    ];
    for req in refused {
        let e = engine.post_send(qp, req).expect_err("refused");
        assert_eq!(e.error.kind(), crate::error::ErrorKind::InvalidArgument);
        assert_eq!(e.request.sgl.len(), 1, "the request comes back whole");
    }
    assert_eq!(engine.prov.posts, 0, "nothing posted");
    assert_eq!(engine.flights[0].available(), room, "no entry taken");
    assert_eq!(engine.in_flight(qp).unwrap(), (0, 0));
    // What fits is posted.
    let fits = SendRequest::new(
        SendOp::FetchAdd {
            remote: word,
            add: 1,
        },
        Local::whole(buf(8)),
    );
    engine.post_send(qp, fits).map_err(|e| e.error).unwrap();
    assert_eq!(engine.in_flight(qp).unwrap(), (1, 0));
}
