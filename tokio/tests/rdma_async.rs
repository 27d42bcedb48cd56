//! AsyncEngine on a device: every way a waiting future can be misused
//! (dropped, forgotten, its task aborted or panicking, its runtime shut
//! down) leaves the request's buffer with the engine until its completion,
//! and the completion still comes back, through the engine.
//!
//! The completion is held back on purpose: A Sends to B, which has no
//! receive posted, so A's request waits (receiver-not-ready, retried
//! forever) until the test posts one. Everything the misuse could break
//! happens while the NIC still owns A's buffer.

mod support;

use std::sync::Arc;

use tokio::sync::Mutex;
use verbs::{
    Completion, Deadline, Engine, EngineConfig, HostBuf, Local, MemoryRegion, ProtectionDomain,
    QpConfig, QpId, RecvRequest, SendOp, SendRequest,
};
use verbs_tokio::AsyncEngine;

use support::{or_hang, pattern, poll_once};

const LEN: usize = 4096;
const TAG: u64 = 0x5eed;

struct Pair {
    pd: ProtectionDomain,
    a: AsyncEngine<MemoryRegion>,
    qa: QpId,
    b: Engine<MemoryRegion>,
    qb: QpId,
}

/// A (async, with a channel) connected to B (plain); call in a runtime.
fn pair(test: &str) -> Pair {
    let pd = support::test_pd(test);
    let events = EngineConfig {
        events: true,
        ..EngineConfig::default()
    };
    let mut a = Engine::new(&pd, &events).unwrap();
    let qa = a.add_qp(&QpConfig::default()).unwrap();
    let mut b = Engine::new(&pd, &EngineConfig::default()).unwrap();
    let qb = b.add_qp(&QpConfig::default()).unwrap();
    let (ea, eb) = (a.endpoint(qa).unwrap(), b.endpoint(qb).unwrap());
    a.connect(qa, &eb).unwrap();
    b.connect(qb, &ea).unwrap();
    let a = AsyncEngine::new(a).map_err(|(e, _)| e).unwrap();
    Pair { pd, a, qa, b, qb }
}

impl Pair {
    /// Posts a Send of LEN patterned bytes; B has no receive yet.
    fn post(&mut self) {
        let mut buf = MemoryRegion::new(&self.pd, LEN).unwrap();
        buf.write_at(0, &pattern(TAG, LEN)).unwrap();
        let req = SendRequest::new(SendOp::Send, Local::whole(buf)).tag(TAG);
        self.a
            .engine_mut()
            .post_send(self.qa, req)
            .map_err(|e| e.error)
            .unwrap();
        self.owned_by_the_engine();
    }

    fn owned_by_the_engine(&self) {
        assert_eq!(
            self.a.in_flight(self.qa).unwrap(),
            (1, 0),
            "the request and its buffer are the engine's"
        );
    }

    /// B posts a receive: the Send lands; B's side checked.
    fn let_it_land(&mut self) {
        let rbuf = MemoryRegion::new(&self.pd, LEN).unwrap();
        self.b
            .post_recv(self.qb, RecvRequest::new(rbuf))
            .map_err(|e| e.error)
            .unwrap();
        let mut got = None;
        self.b
            .wait(Deadline::after(std::time::Duration::from_secs(120)), |c| {
                got = Some(c.into_owned())
            })
            .unwrap();
        let mut got = got.unwrap();
        got.result().unwrap();
        let mut bytes = vec![0; LEN];
        got.take_buf().unwrap().read_at(0, &mut bytes).unwrap();
        assert_eq!(bytes, pattern(TAG, LEN), "B received the bytes");
    }
}

/// The completion came back whole: its tag, its status, its buffer.
fn returned(mut c: Completion<MemoryRegion>) {
    c.result().unwrap();
    assert_eq!(c.tag, TAG);
    let buf = c
        .take_buf()
        .expect("the buffer comes back with its completion");
    let mut bytes = vec![0; LEN];
    buf.read_at(0, &mut bytes).unwrap();
    assert_eq!(bytes, pattern(TAG, LEN), "the buffer, untouched");
}

#[tokio::test]
async fn a_dropped_waiter_leaves_the_buffer_and_the_completion_with_the_engine() {
    let mut p = pair("async_dropped_waiter");
    p.post();
    let qa = p.qa;
    {
        let mut waiting = Box::pin(p.a.completion(qa, TAG));
        assert!(poll_once(&mut waiting).is_pending(), "B has no receive yet");
    } // dropped mid-operation
    p.owned_by_the_engine();
    p.let_it_land();
    returned(
        or_hang("next after a dropped waiter", p.a.next_completion())
            .await
            .unwrap(),
    );
    assert_eq!(p.a.in_flight(qa).unwrap(), (0, 0));
}

#[tokio::test]
async fn a_forgotten_waiter_leaves_the_buffer_and_the_completion_with_the_engine() {
    let mut p = pair("async_forgotten_waiter");
    p.post();
    let qa = p.qa;
    let mut waiting = Box::pin(p.a.completion(qa, TAG));
    assert!(poll_once(&mut waiting).is_pending());
    std::mem::forget(waiting);
    p.owned_by_the_engine();
    p.let_it_land();
    // The one it waited for, by its tag, from a new waiter.
    returned(
        or_hang(
            "completion after a forgotten waiter",
            p.a.completion(qa, TAG),
        )
        .await
        .unwrap(),
    );
}

#[tokio::test]
async fn a_waiter_whose_completion_was_polled_for_another_finds_it_unclaimed() {
    let mut p = pair("async_unclaimed");
    p.post();
    let qa = p.qa;
    p.let_it_land();
    // Waiting for a tag that never completes polls ours into the ready
    // queue; that waiter is then dropped.
    loop {
        let mut other = Box::pin(p.a.completion(qa, TAG + 1));
        assert!(
            poll_once(&mut other).is_pending(),
            "tag + 1 never completes"
        );
        drop(other);
        if p.a.unclaimed() == 1 {
            break; // kept, not lost
        }
        std::thread::sleep(std::time::Duration::from_millis(1)); // the ack is on its way
    }
    returned(p.a.next_completion().await.unwrap());
}

#[tokio::test]
async fn an_aborted_task_leaves_the_buffer_and_the_completion_with_the_engine() {
    let mut p = pair("async_aborted_task");
    p.post();
    let qa = p.qa;
    let a = Arc::new(Mutex::new(std::mem::replace(&mut p.a, placeholder(&p.pd))));
    let (started, mut wait_started) = tokio::sync::mpsc::channel(1);
    let task = tokio::spawn({
        let a = a.clone();
        async move {
            let mut a = a.lock().await;
            started.send(()).await.unwrap();
            a.completion(qa, TAG).await
        }
    });
    wait_started.recv().await.unwrap();
    tokio::task::yield_now().await; // let it reach its wait
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    let mut a = a.lock().await;
    assert_eq!(a.in_flight(qa).unwrap(), (1, 0), "still the engine's");
    p.let_it_land();
    returned(
        or_hang("next after an aborted task", a.next_completion())
            .await
            .unwrap(),
    );
}

#[tokio::test]
async fn a_panicking_task_leaves_the_buffer_and_the_completion_with_the_engine() {
    let mut p = pair("async_panicking_task");
    p.post();
    let qa = p.qa;
    let a = Arc::new(Mutex::new(std::mem::replace(&mut p.a, placeholder(&p.pd))));
    let task = tokio::spawn({
        let a = a.clone();
        async move {
            let mut a = a.lock().await;
            let mut waiting = Box::pin(a.completion(qa, TAG));
            assert!(poll_once(&mut waiting).is_pending());
            panic!("a handler panics mid-operation");
        }
    });
    assert!(task.await.unwrap_err().is_panic());
    let mut a = a.lock().await; // tokio's mutex is not poisoned
    assert_eq!(a.in_flight(qa).unwrap(), (1, 0));
    p.let_it_land();
    returned(
        or_hang("next after a panicking task", a.next_completion())
            .await
            .unwrap(),
    );
}

#[test]
fn a_runtime_shut_down_under_a_waiter_is_an_error_then_the_completion_comes_back() {
    let first = support::runtime();
    let mut p = first.block_on(async { pair("async_runtime_shut_down") });
    p.post();
    let qa = p.qa;
    let a = Arc::new(Mutex::new(first.block_on(async { placeholder(&p.pd) })));
    std::mem::swap(&mut *a.blocking_lock(), &mut p.a);
    let waiter = first.spawn({
        let a = a.clone();
        async move { a.lock().await.completion(qa, TAG).await }
    });
    first.block_on(async {
        for _ in 0..10 {
            tokio::task::yield_now().await; // the waiter is asleep on the descriptor
        }
    });
    assert!(!waiter.is_finished());
    drop(first); // shuts down: the waiting task is dropped mid-wait
    let second = support::runtime();
    second.block_on(async {
        let mut a = a.lock().await;
        assert_eq!(a.in_flight(qa).unwrap(), (1, 0), "still the engine's");
        let e = or_hang("a wait on a dead reactor", a.next_completion())
            .await
            .expect_err("the reactor it was registered with is gone: an error, not a hang");
        assert_eq!(e.kind(), verbs::ErrorKind::BadState, "{e}");
        a.reregister().unwrap();
        p.let_it_land();
        returned(
            or_hang("next after reregister", a.next_completion())
                .await
                .unwrap(),
        );
    });
}

#[tokio::test]
async fn an_engine_swapped_behind_the_mutable_borrow_gets_its_own_registration() {
    let mut p = pair("async_swapped_engine");
    let qa = p.qa;
    let events = EngineConfig {
        events: true,
        ..EngineConfig::default()
    };
    let other = Engine::new(&p.pd, &events).unwrap();
    let mut old = std::mem::replace(p.a.engine_mut(), other);
    // The old engine, out from under the AsyncEngine, still works on its own.
    assert_eq!(old.in_flight(qa).unwrap(), (0, 0));
    // The new one waits on its own channel: an idle wait pends, no error.
    let mut waiting = Box::pin(p.a.next_completion());
    assert!(poll_once(&mut waiting).is_pending());
    drop(waiting);
    std::mem::swap(p.a.engine_mut(), &mut old);
    p.post();
    p.let_it_land();
    returned(
        or_hang("next on the engine swapped back", p.a.next_completion())
            .await
            .unwrap(),
    );
}

#[tokio::test]
async fn an_engine_without_a_channel_is_refused_and_given_back() {
    let pd = support::test_pd("async_refused_without_channel");
    let engine: Engine<MemoryRegion> = Engine::new(&pd, &EngineConfig::default()).unwrap();
    let (e, _engine) = AsyncEngine::new(engine).map(drop).unwrap_err();
    assert_eq!(e.kind(), verbs::ErrorKind::InvalidArgument, "{e}");
}

/// An engine to leave behind where one was moved out.
fn placeholder(pd: &ProtectionDomain) -> AsyncEngine<MemoryRegion> {
    let events = EngineConfig {
        events: true,
        ..EngineConfig::default()
    };
    AsyncEngine::new(Engine::new(pd, &events).unwrap())
        .map_err(|(e, _)| e)
        .unwrap()
}
