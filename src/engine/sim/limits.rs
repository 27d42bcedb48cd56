//! Every path that posts builds its scatter/gather entries with the one
//! builder (`Sgl::build`), so every path refuses, before the device sees
//! anything, an entry longer than an `ibv_sge` length can say (4 GiB) and
//! more entries than the queue was granted. Once, the shared receive
//! queue truncated lengths with `as u32` and posted a 5 GiB receive as a
//! 1 GiB one; these tests hold every path to the same rule.

use alloc::format;

use crate::engine::core::Engine;
use crate::engine::qp_slot::QpId;
use crate::engine::srq::SrqSlots;
use crate::error::{Error, ErrorKind};
use crate::memory::NicBuf;
use crate::sgl::Local;
use crate::wr::{RecvRequest, RemoteSlice, SendOp, SendRequest};

use super::stub::{one_qp, Stub};

/// A registered buffer of any length, backed by nothing: nothing here
/// reaches its bytes (the posts under test must be refused first).
#[derive(Debug)]
struct Span {
    addr: u64,
    len: usize,
}

// SAFETY: never dereferenced: the posts under test are refused before the
// stub provider sees them, and the stub dereferences nothing.
unsafe impl NicBuf for Span {
    fn addr(&self) -> u64 {
        self.addr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn lkey(&self) -> u32 {
        1
    }
}

const GIB: usize = 1 << 30;

fn span(len: usize) -> Span {
    Span { addr: 1 << 40, len }
}

/// An engine with one queue pair (receiving through a shared receive
/// queue, if asked) granted one scatter/gather entry per request.
fn new_engine(shared: bool) -> (Engine<Span, Stub>, QpId) {
    let srq = shared.then(|| SrqSlots::new((), 8, 1));
    let mut engine = Engine::assemble(Stub::new(0x22), (), 64, None, srq, false);
    let qp = one_qp(&mut engine, 0x22, 8);
    (engine, qp)
}

/// An entry of 5 GiB (4 GiB + 1 GiB: what `as u32` made 1 GiB).
fn too_long() -> Local<Span> {
    Local::range(span(8 * GIB), 0, 5 * GIB).unwrap()
}

fn send(local: Local<Span>) -> SendRequest<Span> {
    let remote = RemoteSlice::unchecked(1 << 41, 1 << 34, 9);
    SendRequest::new(SendOp::Write(remote), local)
}

fn refused(e: &Error, what: &str) {
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{what}: {e}");
    assert_eq!(e.call(), "post", "{what}: {e}");
}

fn every_path_refuses(name: &str, make: impl Fn() -> Local<Span>, second: bool) {
    let (mut engine, qp) = new_engine(false);
    let with = |local: Local<Span>| {
        let r = send(local);
        if second {
            r.sge(Local::whole(span(64))).map_err(|_| ()).unwrap()
        } else {
            r
        }
    };
    let recv = |local: Local<Span>| {
        let r = RecvRequest::new(local);
        if second {
            r.sge(Local::whole(span(64))).map_err(|_| ()).unwrap()
        } else {
            r
        }
    };

    let e = engine.post_send(qp, with(make())).unwrap_err();
    refused(&e.error, &format!("{name}: post_send"));
    assert_eq!(e.request.into_bufs().count(), 1 + usize::from(second));

    // A refusal while building refuses the whole chain: nothing posted,
    // both requests stay with the caller.
    let mut chain = [Some(with(Local::whole(span(64)))), Some(with(make()))];
    let e = engine.post_send_chain(qp, &mut chain).unwrap_err();
    refused(&e, &format!("{name}: post_send_chain"));
    assert!(chain.iter().all(Option::is_some), "{name}: the chain stays");

    let e = engine.post_recv(qp, recv(make())).unwrap_err();
    refused(&e.error, &format!("{name}: post_recv"));
    let e = engine.prepare_send(qp, with(make())).unwrap_err();
    refused(&e.error, &format!("{name}: prepare_send"));
    let e = engine.prepare_recv(qp, recv(make())).unwrap_err();
    refused(&e.error, &format!("{name}: prepare_recv"));

    assert_eq!(engine.prov.posts, 0, "{name}: the device saw a post");

    let (mut shared, _) = new_engine(true);
    let e = shared.post_srq_recv(recv(make())).unwrap_err();
    refused(&e.error, &format!("{name}: post_srq_recv"));
    assert_eq!(
        shared.prov.posts, 0,
        "{name}: the shared receive queue saw a post"
    );
}

#[test]
fn every_path_refuses_an_entry_over_4_gib() {
    every_path_refuses("5 GiB entry", too_long, false);
}

#[test]
fn every_path_refuses_more_entries_than_granted() {
    every_path_refuses("2 entries, 1 granted", || Local::whole(span(64)), true);
}

#[test]
fn a_prepared_request_refuses_a_shorter_buffer_swapped_in() {
    let (mut engine, qp) = new_engine(false);
    let local = Local::range(span(4096), 1024, 2048).unwrap();
    let p = engine
        .prepare_recv(qp, RecvRequest::new(local))
        .map_err(|e| e.error)
        .unwrap();
    *engine.prepared_buf(p).unwrap() = span(64);
    let e = engine.post_prepared(p).unwrap_err();
    refused(&e, "post_prepared after a shorter buffer was swapped in");
    assert_eq!(engine.prov.posts, 0);
    // A long enough buffer again: posted.
    *engine.prepared_buf(p).unwrap() = span(4096);
    engine.post_prepared(p).unwrap();
    assert_eq!(engine.prov.posts, 1);
}
