//! [`AsyncEngine`]: an engine whose waits are futures.

use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::task::{Context, Poll};

use verbs::{Completion, CompletionRef, Engine, Error, NicBuf, QpId};

use crate::channel::Core;
use crate::protocol::{poll_completions, poll_matching};

/// Completions the ready queue holds before it has to grow.
pub const DEFAULT_READY_CAPACITY: usize = 256;

/// An [`Engine`] whose completion channel is registered with the tokio
/// runtime it was made in: waits are futures that sleep on the
/// descriptor (no CPU while idle, no thread), posts stay synchronous.
///
/// ```no_run
/// use verbs::{Context, Engine, EngineConfig, Local, MemoryRegion, ProtectionDomain, QpConfig,
///             SendOp, SendRequest};
/// use verbs_tokio::AsyncEngine;
/// # async fn run(peer: verbs::Endpoint) -> Result<(), verbs::Error> {
/// let pd = ProtectionDomain::new(&Context::open(None)?)?;
/// let config = EngineConfig { events: true, ..EngineConfig::default() };
/// let mut engine = AsyncEngine::new(Engine::<MemoryRegion>::new(&pd, &config)?)
///     .map_err(|(e, _engine)| e)?;
/// let qp = engine.engine_mut().add_qp(&QpConfig::default())?;
/// engine.engine_mut().connect(qp, &peer)?;
/// let msg = Local::range(MemoryRegion::new(&pd, 4096)?, 0, 64).map_err(|(e, _)| e)?;
/// let req = SendRequest::new(SendOp::Send, msg).tag(7);
/// engine.engine_mut().post_send(qp, req).map_err(|e| e.error)?; // never blocks
/// let mut done = engine.completion(qp, 7).await?; // asleep on the descriptor meanwhile
/// done.result()?;
/// let _buf = done.take_buf(); // the buffer is back only now
/// # Ok(()) }
/// ```
///
/// One owner, no lock: the futures borrow it mutably, so it is `Send` and
/// moves with its task. To share one engine between tasks, put it behind
/// a lock of your choice (`tokio::sync::Mutex`).
///
/// # What a waiting future owns
///
/// Nothing but the borrow. Every completion taken off the queue is
/// either the one the future returns, within the same poll, or kept in
/// the engine's ready queue (pre-sized; it grows only if more
/// completions are left unclaimed than it holds), where
/// [`AsyncEngine::next_completion`] returns it. A future dropped, forgotten, or
/// abandoned with its aborted or panicking task leaves every request's
/// buffers with the engine until their completion is claimed.
pub struct AsyncEngine<B: NicBuf> {
    core: Core<B>,
    /// Whether the CQ is armed and its event not yet taken (arming again
    /// would only cost a call: a system call on Soft-RoCE). Kept here, not
    /// in a future, and always true to the CQ, whatever unwinds.
    armed: bool,
    /// Completions polled while waiting for another one, oldest first.
    ready: VecDeque<Completion<B>>,
}

impl<B: NicBuf> AsyncEngine<B> {
    /// Registers `engine`'s completion channel with the current runtime
    /// (call inside one whose I/O driver is enabled). Refused, with the
    /// engine given back, without `EngineConfig::events` or a runtime.
    #[allow(clippy::result_large_err)] // the engine comes back unboxed
    pub fn new(engine: Engine<B>) -> Result<AsyncEngine<B>, (Error, Engine<B>)> {
        AsyncEngine::with_ready_capacity(engine, DEFAULT_READY_CAPACITY)
    }

    /// As [`AsyncEngine::new`], with room for `capacity` unclaimed
    /// completions before the ready queue grows.
    #[allow(clippy::result_large_err)]
    pub fn with_ready_capacity(
        engine: Engine<B>,
        capacity: usize,
    ) -> Result<AsyncEngine<B>, (Error, Engine<B>)> {
        Ok(AsyncEngine {
            core: Core::new(engine)?,
            armed: false,
            ready: VecDeque::with_capacity(capacity),
        })
    }

    /// The engine, to post, connect, add queue pairs. Whatever is done
    /// with it may take the channel's events (its own `wait`), so the
    /// next wait here arms the CQ again.
    pub fn engine_mut(&mut self) -> &mut Engine<B> {
        self.armed = false;
        &mut self.core.engine
    }

    /// Requests in flight on `qp`'s send and receive queues.
    pub fn in_flight(&self, qp: QpId) -> Result<(u64, u64), Error> {
        self.core.engine.in_flight(qp)
    }

    /// Completions polled and not yet claimed (left by waiters that went
    /// away, or polled while waiting for another).
    pub fn unclaimed(&self) -> usize {
        self.ready.len()
    }

    /// Registers the channel with the current runtime again, for an
    /// engine that outlived the runtime it was made in (its waits then
    /// fail with `BadState` instead of hanging). Nothing in flight is lost.
    pub fn reregister(&mut self) -> Result<(), Error> {
        self.armed = false;
        self.core.reregister()
    }

    /// The engine back, and the completions nobody claimed, in order.
    pub fn into_parts(self) -> (Engine<B>, VecDeque<Completion<B>>) {
        let AsyncEngine { core, ready, .. } = self;
        (core.into_engine(), ready)
    }

    /// Waits for the completion of the request posted on `qp` with `tag`
    /// and returns it with its buffers. Completions of other requests
    /// polled meanwhile stay for [`AsyncEngine::next_completion`].
    pub fn completion(
        &mut self,
        qp: QpId,
        tag: u64,
    ) -> impl Future<Output = Result<Completion<B>, Error>> + '_ {
        poll_fn(move |cx| self.poll_matching(cx, |c| c.qp == Some(qp) && c.tag == tag))
    }

    /// The next completion, whichever request it finishes (the unclaimed
    /// ones first): the engine's completions as a stream.
    pub fn next_completion(&mut self) -> impl Future<Output = Result<Completion<B>, Error>> + '_ {
        poll_fn(move |cx| self.poll_next_completion(cx))
    }

    /// [`AsyncEngine::next_completion`] as a poll function.
    pub fn poll_next_completion(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Completion<B>, Error>> {
        self.poll_matching(cx, |_| true)
    }

    /// Waits until at least one request is handed back and lends each to
    /// `on_done`, as [`Engine::wait`] does, without a thread; the
    /// unclaimed ones first (owned). Returns the number handed back.
    pub async fn wait(&mut self, mut on_done: impl FnMut(Handed<'_, B>)) -> Result<usize, Error> {
        poll_fn(|cx| self.poll_with(cx, &mut on_done)).await
    }

    /// [`AsyncEngine::wait`] as a poll function: Ready once something
    /// was handed to `on_done`, else Pending with `cx` woken by the next
    /// completion.
    pub fn poll_with(
        &mut self,
        cx: &mut Context<'_>,
        on_done: &mut impl FnMut(Handed<'_, B>),
    ) -> Poll<Result<usize, Error>> {
        if !self.ready.is_empty() {
            let n = self.ready.len();
            for c in self.ready.drain(..) {
                on_done(Handed::Owned(c));
            }
            return Poll::Ready(Ok(n));
        }
        poll_completions(&mut self.core, &mut self.armed, cx, |core| {
            core.engine.poll(|c| on_done(Handed::Lent(c)))
        })
    }

    fn poll_matching(
        &mut self,
        cx: &mut Context<'_>,
        mine: impl FnMut(&Completion<B>) -> bool,
    ) -> Poll<Result<Completion<B>, Error>> {
        poll_matching(
            &mut self.core,
            &mut self.armed,
            &mut self.ready,
            cx,
            mine,
            |core, sink| core.engine.poll(|c| sink(c.into_owned())),
        )
    }
}

/// A completion handed to [`AsyncEngine::wait`]'s callback: lent straight
/// off the queue, or owned (one a dropped waiter left unclaimed).
#[derive(Debug)]
pub enum Handed<'a, B> {
    /// Polled now: take what you keep (`take_buf`, `into_owned`).
    Lent(CompletionRef<'a, B>),
    /// Polled earlier, while something else was awaited.
    Owned(Completion<B>),
}
