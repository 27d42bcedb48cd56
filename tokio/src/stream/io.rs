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

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if let Some(e) = this.flow.failure() {
                return Poll::Ready(Err(e));
            }
            if this.flow.in_flight == 0 {
                return Poll::Ready(Ok(()));
            }
            std::task::ready!(this.drive(cx, WRITE))?;
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            let this = &mut *self;
            if let Some(e) = this.flow.failure() {
                return Poll::Ready(Err(e));
            }
            if this
                .flow
                .send_fin(&mut this.core.engine)
                .map_err(verbs_io)?
            {
                return self.poll_flush(cx);
            }
            std::task::ready!(this.drive(cx, WRITE))?;
        }
    }
}
