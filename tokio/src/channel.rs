//! The completion channel as tokio sees it (a descriptor of our own on
//! it, registered with the reactor), and the one [`Channel`]
//! implementation over a real engine.

use std::os::fd::OwnedFd;
use std::task::{ready, Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use verbs::{site, Engine, Error, ErrorKind, NicBuf};

use crate::protocol::Channel;

/// An engine and its channel's registration with the reactor.
pub(crate) struct Core<B: NicBuf> {
    /// A duplicate of the channel's descriptor, owned here: it stays open
    /// for as long as the reactor has it, whatever the caller does with
    /// the engine. `None` only while re-registering (or after that failed).
    fd: Option<AsyncFd<OwnedFd>>,
    /// The engine's own descriptor number when `fd` was made from it: an
    /// engine swapped in through `&mut` has another (both were open at the
    /// swap), and gets a registration of its own.
    source: i32,
    pub(crate) engine: Engine<B>,
}

impl<B: NicBuf> Core<B> {
    /// Registers `engine`'s channel with the current runtime's reactor.
    /// Outside a runtime, or for an engine without a channel, an error
    /// (and the engine back).
    #[allow(clippy::result_large_err)] // the engine comes back unboxed
    pub(crate) fn new(engine: Engine<B>) -> Result<Core<B>, (Error, Engine<B>)> {
        match register(&engine) {
            Ok((fd, source)) => Ok(Core {
                fd: Some(fd),
                source,
                engine,
            }),
            Err(e) => Err((e, engine)),
        }
    }

    /// Registers the channel again with the current runtime (after the
    /// one it was registered with shut down). The old registration goes
    /// first; the engine and every request in flight stay. The CQ must
    /// be armed again after this (the old reactor may have had its event).
    pub(crate) fn reregister(&mut self) -> Result<(), Error> {
        self.fd = None;
        let (fd, source) = register(&self.engine)?;
        self.fd = Some(fd);
        self.source = source;
        Ok(())
    }

    /// The engine, its channel deregistered first.
    pub(crate) fn into_engine(self) -> Engine<B> {
        let Core { fd, engine, .. } = self;
        drop(fd);
        engine
    }
}

fn register<B: NicBuf>(engine: &Engine<B>) -> Result<(AsyncFd<OwnedFd>, i32), Error> {
    let (Some(source), Some(own)) = (engine.event_fd(), engine.dup_event_fd()?) else {
        return Err(Error::new(
            site!(
                "AsyncEngine::new",
                "the engine has no completion channel",
                "build it with EngineConfig { events: true, .. }"
            ),
            ErrorKind::InvalidArgument,
        ));
    };
    // tokio deprecates its safe constructors for descriptors that might be
    // closed while registered (tokio PR 8587); an OwnedFd owned by the
    // AsyncFd is closed only after it leaves the reactor, which is that
    // constructor's whole requirement.
    #[allow(deprecated)]
    let fd = AsyncFd::with_interest(own, Interest::READABLE).map_err(|e| reactor_error(&e))?;
    Ok((fd, source))
}

/// What the reactor's refusal means: a runtime shut down (or none) has no
/// errno, a failing epoll has one.
pub(crate) fn reactor_error(e: &std::io::Error) -> Error {
    match e.raw_os_error() {
        Some(errno) => Error::os(
            site!("tokio AsyncFd (epoll) on the completion channel"),
            errno,
        ),
        None => Error::new(
            site!(
                "tokio AsyncFd on the completion channel",
                "no runtime, or its reactor is shut down",
                "AsyncEngine::reregister inside a live runtime (with enable_io)"
            ),
            ErrorKind::BadState,
        ),
    }
}

impl<B: NicBuf> Channel for Core<B> {
    fn arm(&mut self) -> Result<(), Error> {
        self.engine.arm(false)
    }

    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Result<bool, Error>> {
        if self.engine.event_fd() != Some(self.source) {
            // Another engine behind the same `&mut`: its events, from now.
            self.reregister()?;
            return Poll::Ready(Ok(true));
        }
        let Some(fd) = &self.fd else {
            return Poll::Ready(Err(unregistered()));
        };
        let mut guard = match ready!(fd.poll_read_ready(cx)) {
            Ok(guard) => guard,
            Err(e) => return Poll::Ready(Err(reactor_error(&e))),
        };
        // Read until the channel is empty, then clear: tokio keeps a
        // readiness that came after the guard was taken.
        let taken = self.engine.take_events();
        guard.clear_ready();
        Poll::Ready(taken)
    }
}

#[cold]
fn unregistered() -> Error {
    Error::new(
        site!(
            "AsyncEngine",
            "the completion channel is registered with no reactor (a re-registration failed)",
            "AsyncEngine::reregister inside a live runtime"
        ),
        ErrorKind::BadState,
    )
}
