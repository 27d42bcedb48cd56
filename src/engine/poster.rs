//! Posting from inside a poll's callback: a reply on the queue pair a
//! request came from, a receive's buffers posted again, or any post on the
//! engine being polled, without collecting requests to post after the poll.
//!
//! Sound because the router lends each finished request only once it is
//! retired (its table entry released, its buffers moved into the
//! [`CompletionRef`], or a shared receive's left in its slot, which is no
//! longer posted) and keeps no borrow of the engine across the callback:
//! a post from the callback is a post like any other, one more request in
//! flight after the ones the completion finishes. A shared receive posted
//! again in place is the device's again: nothing of it is left to the
//! callback to read, take or post twice. A [`Poster`] reaches the posts,
//! and the bytes of a prepared send none of whose posts is in flight (a
//! reply from a ring of prepared ones), and nothing else: it cannot poll
//! (the callback would run inside itself), remove or reset a queue pair,
//! start a lane, or release a prepared request. A queue pair a lane holds
//! refuses posts from the lane's own callback (`lane.rs`).

use crate::error::{site, Error};
use crate::memory::{HostBuf, NicBuf};
use crate::wr::{RecvRequest, SendOp, SendRequest};

use super::completion::{CompletionRef, Origin, IN_SLOT};
use super::config::Queue;
use super::core::{no_such_qp, Engine};
use super::doorbell::{self, Provider, Verbs};
use super::post::PostError;
use super::prepared_table::{PreparedHandle, PreparedSend};
use super::qp_slot::{QpId, QpState};
use super::ring::NONE;
use super::ud::UdDest;

/// The posts of the engine a poll's callback was lent from: see
/// [`CompletionRef::poster`]. Each call is the [`Engine`] call of the same
/// name.
pub struct Poster<'e, B, P: Provider = Verbs> {
    engine: &'e mut Engine<B, P>,
}

impl<'a, B: NicBuf, P: Provider> CompletionRef<'a, B, P> {
    /// Posts on the engine this completion came from, from inside the
    /// poll's callback: sends and receives on any of its queue pairs, the
    /// shared receive queue, prepared requests. Nothing else: no poll,
    /// removal, reset or lane.
    ///
    /// ```no_run
    /// # use verbs::{Engine, MemoryRegion, RecvRequest, SendOp, SendRequest};
    /// # fn serve(engine: &mut Engine<MemoryRegion>) -> Result<(), verbs::Error> {
    /// engine.poll(|mut c| {
    ///     let Some(buf) = c.take_buf() else { return };
    ///     if c.is_recv() {
    ///         // The request's buffer carries the reply (refused: it comes back in the error).
    ///         let _ = c.reply(SendRequest::new(SendOp::Send, buf));
    ///     } else {
    ///         // A reply went out: its buffer receives the next request.
    ///         let _ = c.poster().post_srq_recv(RecvRequest::new(buf));
    ///     }
    /// })?;
    /// # Ok(()) }
    /// ```
    ///
    /// The engine itself stays lent to `poll` for the call: the callback
    /// can neither remove a queue pair nor poll.
    ///
    /// ```compile_fail,E0500
    /// # use verbs::{Engine, MemoryRegion, QpId};
    /// # fn serve(engine: &mut Engine<MemoryRegion>, qp: QpId) {
    /// engine.poll(|_c| {
    ///     let _ = engine.remove_qp(qp);
    /// });
    /// # }
    /// ```
    ///
    /// ```compile_fail,E0599
    /// # use verbs::{Engine, MemoryRegion};
    /// # fn serve(engine: &mut Engine<MemoryRegion>) {
    /// engine.poll(|mut c| {
    ///     let _ = c.poster().poll(|_| {});
    /// });
    /// # }
    /// ```
    #[inline]
    pub fn poster(&mut self) -> Poster<'_, B, P> {
        Poster {
            engine: &mut *self.engine,
        }
    }

    /// Posts `req` on the queue pair this completion came from (for a
    /// shared receive, the one the message arrived on): a reply. Refused
    /// as [`Engine::post_send`] is (and `NotFound` when that queue pair was
    /// removed), with the request given back.
    #[inline]
    #[allow(clippy::result_large_err)] // the request comes back unboxed
    pub fn reply(&mut self, req: SendRequest<B>) -> Result<(), PostError<SendRequest<B>>> {
        match self.qp {
            Some(qp) => self.engine.post_send(qp, req),
            None => Err(PostError {
                error: no_such_qp(),
                request: req,
            }),
        }
    }

    /// Posts this receive's buffers again, with the same ranges and tag,
    /// where it was posted: the shared receive queue (in place: the slot
    /// it completed in, its entries as first built), or its queue pair's
    /// receive queue. Refused for a send, for a receive whose buffer was
    /// taken out or that was posted again already, and as
    /// [`Engine::post_recv`] is (a queue pair in ERR after a failed or
    /// flushed receive); the buffers then stay with this completion
    /// (`take_buf`, or dropped with it). Once posted, nothing of it is
    /// left here: `buf` and `take_buf` give `None`.
    #[inline]
    pub fn repost_recv(&mut self) -> Result<(), Error> {
        if self.origin == Origin::Srq {
            if self.kept.more != IN_SLOT {
                return Err(not_lent());
            }
            self.engine.repost_lent_srq()?;
            self.kept.more = NONE;
            return Ok(());
        }
        if !self.is_recv || self.origin == Origin::Raw {
            return Err(Error::invalid(site!(
                "repost_recv",
                "only a receive's buffers are posted again as a receive",
                "take_buf() and post it with poster().post_recv or post_srq_recv"
            )));
        }
        let mut sgl = self.take_sgl();
        if sgl.len() == 0 || !sgl.is_whole() {
            self.hold(&mut sgl);
            return Err(Error::invalid(site!(
                "repost_recv",
                "a buffer of this receive was taken out (or it is a prepared receive's: post_prepared)"
            )));
        }
        let req = RecvRequest {
            tag: self.tag(),
            sgl,
        };
        let refused = match self.qp {
            Some(qp) => self.engine.post_recv(qp, req).err(),
            None => Some(PostError {
                error: no_such_qp(),
                request: req,
            }),
        };
        match refused {
            None => Ok(()),
            Some(e) => {
                self.hold(&mut { e.request.sgl });
                Err(e.error)
            }
        }
    }
}

impl<B: NicBuf, P: Provider> Engine<B, P> {
    /// Posts the shared receive lent to the running callback again, in
    /// its slot. Refused when none is lent (posted again already, or taken
    /// out); on a refusal by the device it stays lent.
    #[inline(always)]
    pub(super) fn repost_lent_srq(&mut self) -> Result<(), Error> {
        if let Some(srq) = self.srq.as_mut() {
            if let Some((handle, slot)) = srq.lent_for_repost() {
                let wr_id = slot.next_id();
                slot.reposted(wr_id);
                let posted = doorbell::srq_repost(&mut self.prov, handle, &mut slot.wr);
                match posted {
                    Ok(()) => srq.unlend(),
                    Err(_) => slot.refused(wr_id),
                }
                return posted;
            }
        }
        Err(not_lent())
    }
}

#[cold]
fn not_lent() -> Error {
    Error::invalid(site!(
        "repost_recv",
        "this shared receive was posted again already, or its buffers taken out"
    ))
}

impl<B: NicBuf, P: Provider> Poster<'_, B, P> {
    /// [`Engine::post_send`].
    #[inline]
    #[allow(clippy::result_large_err)] // the request comes back unboxed
    pub fn post_send(
        &mut self,
        qp: QpId,
        req: SendRequest<B>,
    ) -> Result<(), PostError<SendRequest<B>>> {
        self.engine.post_send(qp, req)
    }

    /// [`Engine::post_send_chain`].
    pub fn post_send_chain(
        &mut self,
        qp: QpId,
        reqs: &mut [Option<SendRequest<B>>],
    ) -> Result<usize, Error> {
        self.engine.post_send_chain(qp, reqs)
    }

    /// [`Engine::post_inline`].
    #[inline]
    pub fn post_inline(
        &mut self,
        qp: QpId,
        op: SendOp,
        data: &[u8],
        tag: u64,
        signaled: bool,
    ) -> Result<(), Error> {
        self.engine.post_inline(qp, op, data, tag, signaled)
    }

    /// [`Engine::post_ud_send`].
    #[allow(clippy::result_large_err)] // the request comes back unboxed
    pub fn post_ud_send(
        &mut self,
        qp: QpId,
        dest: &UdDest,
        req: SendRequest<B>,
    ) -> Result<(), PostError<SendRequest<B>>> {
        self.engine.post_ud_send(qp, dest, req)
    }

    /// [`Engine::post_recv`].
    #[inline]
    #[allow(clippy::result_large_err)] // the request comes back unboxed
    pub fn post_recv(
        &mut self,
        qp: QpId,
        req: RecvRequest<B>,
    ) -> Result<(), PostError<RecvRequest<B>>> {
        self.engine.post_recv(qp, req)
    }

    /// [`Engine::post_srq_recv`].
    #[inline]
    #[allow(clippy::result_large_err)] // the request comes back unboxed
    pub fn post_srq_recv(&mut self, req: RecvRequest<B>) -> Result<(), PostError<RecvRequest<B>>> {
        self.engine.post_srq_recv(req)
    }

    /// [`Engine::post_prepared`].
    #[inline]
    pub fn post_prepared<H: PreparedHandle>(&mut self, p: H) -> Result<(), Error> {
        self.engine.post_prepared(p)
    }

    /// [`Engine::post_prepared_unsignaled`].
    #[inline]
    pub fn post_prepared_unsignaled(&mut self, p: PreparedSend) -> Result<(), Error> {
        self.engine.post_prepared_unsignaled(p)
    }

    /// [`Engine::post_prepared_unreported`].
    #[inline]
    pub fn post_prepared_unreported(&mut self, p: PreparedSend) -> Result<(), Error> {
        self.engine.post_prepared_unreported(p)
    }

    /// [`Engine::in_flight`].
    pub fn in_flight(&self, qp: QpId) -> Result<(u64, u64), Error> {
        self.engine.in_flight(qp)
    }

    /// [`Engine::state`].
    pub fn state(&self, qp: QpId) -> Result<QpState, Error> {
        self.engine.state(qp)
    }

    /// [`Engine::srq_posted`].
    pub fn srq_posted(&self) -> usize {
        self.engine.srq_posted()
    }

    /// [`Engine::room`].
    pub fn room(&self, queue: Queue) -> u32 {
        self.engine.room(queue)
    }
}

impl<B: HostBuf, P: Provider> Poster<'_, B, P> {
    /// [`Engine::write_prepared`]: a reply's bytes into a prepared send
    /// whose last post has completed, for a server that answers from a
    /// ring of prepared replies rather than building a request each time.
    #[inline(always)]
    pub fn write_prepared<H: PreparedHandle>(
        &mut self,
        p: H,
        offset: usize,
        src: &[u8],
    ) -> Result<(), Error> {
        self.engine.write_prepared(p, offset, src)
    }
}
