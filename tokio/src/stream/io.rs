//! `AsyncRead` and `AsyncWrite`: each call does what the flow allows now,
//! else drives the completion queue (the one wait protocol) and returns
//! Pending with a keepalive timer running.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::parts::verbs_io;
use super::wakers::{READ, WRITE};
use super::RdmaStream;
use crate::protocol::poll_completions;

impl RdmaStream {
    /// Polls the completion queue once through the flow; Ready when
    /// something completed, Pending with `side`'s waker registered (the
    /// descriptor and the keepalive timer).
    fn drive(&mut self, cx: &mut Context<'_>, side: usize) -> Poll<io::Result<()>> {
        let waker = self.wakers.register(side, cx.waker()).clone();
        let mut both = Context::from_waker(&waker);
        let flow = &mut self.flow;
        let polled = poll_completions(&mut self.core, &mut self.armed, &mut both, |core| {
            core.engine.poll(|c| flow.on_completion(c))
        });
        self.flow.settle(&mut self.core.engine).map_err(verbs_io)?;
        match polled {
            Poll::Ready(Ok(_)) => Poll::Ready(Ok(())),
            Poll::Ready(Err(e)) => Poll::Ready(Err(verbs_io(e))),
            Poll::Pending => {
                self.keepalive(&mut both)?;
                Poll::Pending
            }
        }
    }

    /// Ticks the keepalive timer while a call waits: a probe when nothing
    /// was heard for a whole period.
    fn keepalive(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let Some(every) = self.keepalive_every else {
            return Ok(());
        };
        let Some(timer) = &mut self.keepalive else {
            return Ok(());
        };
        while timer.as_mut().poll(cx).is_ready() {
            self.flow.tick(&mut self.core.engine).map_err(verbs_io)?;
            timer.as_mut().reset(tokio::time::Instant::now() + every);
        }
        Ok(())
    }
}

impl AsyncRead for RdmaStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if out.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if this.flow.read(out).map_err(verbs_io)? {
                // Freed slots go back now: the peer may be waiting for them.
                this.flow.settle(&mut this.core.engine).map_err(verbs_io)?;
                return Poll::Ready(Ok(()));
            }
            if this.flow.at_eof() {
                return Poll::Ready(Ok(()));
            }
            if let Some(e) = this.flow.failure() {
                return Poll::Ready(Err(e));
            }
            std::task::ready!(this.drive(cx, READ))?;
        }
    }
}

impl AsyncWrite for RdmaStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if data.is_empty() {
            return Poll::Ready(Ok(0));
        }
        loop {
            if let Some(e) = this.flow.failure() {
                return Poll::Ready(Err(e));
            }
            let n = this
                .flow
                .write(&mut this.core.engine, data)
                .map_err(verbs_io)?;
            if n > 0 {
                return Poll::Ready(Ok(n));
            }
            std::task::ready!(this.drive(cx, WRITE))?;
        }
    }

    /// Every write is posted when `poll_write` returns (the device sends
    /// it on its own), so there is nothing to push: this only reports a
    /// failure already seen. As with TCP, a flushed byte is not yet a
    /// delivered one; `poll_shutdown` waits for the acknowledgements.
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.flow.failure() {
            Some(e) => Poll::Ready(Err(e)),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            // Once the peer ended its stream too, it may be gone: what we
            // still send goes unacknowledged without it being an error (as
            // a TCP FIN after the peer's, which nobody waits for).
            let peer_done = this.flow.peer_done();
            let lenient = |e: io::Error| if peer_done { Ok(()) } else { Err(e) };
            if let Some(e) = this.flow.failure() {
                return Poll::Ready(lenient(e));
            }
            if this
                .flow
                .send_fin(&mut this.core.engine)
                .map_err(verbs_io)?
                && this.flow.in_flight == 0
            {
                return Poll::Ready(Ok(()));
            }
            if let Err(e) = std::task::ready!(this.drive(cx, WRITE)) {
                return Poll::Ready(lenient(e));
            }
        }
    }
}
