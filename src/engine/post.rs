//! Posting: each request is checked against its queue pair and the room
//! its queue and the engine's completion queue have left, then handed to
//! the doorbell, which posts it and moves its buffers into the engine's
//! table of requests in flight. No heap allocation, no lock: work requests
//! are built on the stack, the table was reserved at setup.

use crate::error::{site, Error, ErrorKind};
use crate::memory::NicBuf;
use crate::wr::{RecvRequest, SendOp, SendRequest};

use super::check::{
    cannot_recv, cannot_send_on, check_send, check_send_on, completes_as, engine_full, post_hint,
    ud_recv_too_short, SendLimits, MIN_UD_RECV,
};
use super::config::Transport;
use super::core::Engine;
use super::doorbell::{self, send_flags, OwnSend, Provider, SendMeta};
use super::qp_slot::{signal_decision, QpId, SignalPlan};

/// A refused post: the error and the request, with its buffers, given back.
#[derive(Debug)]
pub struct PostError<R> {
    /// Why it was refused.
    pub error: Error,
    /// The request, untouched.
    pub request: R,
}

impl<R> core::fmt::Display for PostError<R> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        self.error.fmt(f)
    }
}

#[cfg(feature = "std")]
impl<R: core::fmt::Debug> std::error::Error for PostError<R> {}

impl<B: NicBuf, P: Provider> Engine<B, P> {
    /// Posts one send-queue request on `qp`. Its buffers belong to the
    /// engine until [`Engine::poll`] hands them back with the completion.
    /// Refused (`QueueFull`) when the queue pair's send queue, or the
    /// engine's completion queue, holds as many requests in flight as it can.
    #[inline]
    #[allow(clippy::result_large_err)] // the request comes back unboxed: no allocation
    pub fn post_send(
        &mut self,
        qp: QpId,
        mut req: SendRequest<B>,
    ) -> Result<(), PostError<SendRequest<B>>> {
        let (prov, slot, flights) = match self.parts(qp) {
            Ok(s) => s,
            Err(error) => {
                return Err(PostError {
                    error,
                    request: req,
                })
            }
        };
        if slot.send.len() >= slot.send_room {
            return Err(PostError {
                error: cannot_send_on(slot),
                request: req,
            });
        }
        let flights = &mut flights[0];
        if flights.available() == 0 {
            return Err(PostError {
                error: engine_full(),
                request: req,
            });
        }
        let limits = SendLimits::of(slot);
        let mut run = slot.unsignaled_run;
        let asked = req.flags.signaled || flights.crowded(0);
        let signaled = signal_decision(&mut run, slot.send.half(), asked, 0);
        let f = req.flags;
        let flags = send_flags(signaled, f.fence, f.solicited, f.inline);
        let Some(handle) = slot.qp.as_ref() else {
            unreachable_vacant()
        };
        let max_sge = slot.caps.max_send_sge;
        // Checked once the list is built, with the length it adds up to.
        let check = |op: &SendOp, total: u64| {
            check_send_on(limits, op, total, f.inline).map(|()| completes_as(op))
        };
        let result = doorbell::send_one(
            prov,
            handle,
            qp.index,
            flights,
            &mut slot.send,
            max_sge,
            &req.op,
            &mut req.sgl,
            req.tag,
            flags,
            check,
        );
        match result {
            Ok(()) => {
                slot.unsignaled_run = run;
                Ok(())
            }
            Err(error) => Err(PostError {
                error: post_hint(error),
                request: req,
            }),
        }
    }

    /// Posts up to [`super::config::MAX_CHAIN`] requests on `qp` with one call (one
    /// doorbell), taking each posted request out of `reqs` (a prefix of the
    /// `Some` entries). On a partial post the requests from the refused one
    /// on stay in `reqs`, untouched and not posted, and the error says so;
    /// `Ok(n)` is the number posted.
    pub fn post_send_chain(
        &mut self,
        qp: QpId,
        reqs: &mut [Option<SendRequest<B>>],
    ) -> Result<usize, Error> {
        let count = reqs
            .iter()
            .take_while(|r| r.is_some())
            .count()
            .min(super::config::MAX_CHAIN);
        if count == 0 {
            return Ok(0);
        }
        let (prov, slot, flights) = self.parts(qp)?;
        if slot.send.len() + count as u64 > slot.send_room {
            return Err(cannot_send_on(slot));
        }
        let flights = &mut flights[0];
        if (flights.available() as usize) < count {
            return Err(engine_full());
        }
        let asked = |i: usize| {
            reqs[i].as_ref().is_some_and(|r| r.flags.signaled) || flights.crowded(i as u32)
        };
        let plan = SignalPlan::new(slot.unsignaled_run, slot.send.half(), count, asked);
        let mut sends: [Option<OwnSend<'_, B>>; super::config::MAX_CHAIN] =
            [const { None }; super::config::MAX_CHAIN];
        for (i, req) in reqs.iter_mut().take(count).enumerate() {
            let Some(req) = req.as_mut() else { break };
            check_send(slot, &req.op, req.sgl.total_len() as u64, req.flags.inline)?;
            let f = req.flags;
            sends[i] = Some(OwnSend {
                meta: SendMeta {
                    tag: req.tag,
                    opcode: completes_as(&req.op),
                    signaled: plan.signaled[i],
                },
                op: &req.op,
                sgl: &mut req.sgl,
                fence: f.fence,
                solicited: f.solicited,
                inline: f.inline,
            });
        }
        let Some(handle) = slot.qp.as_ref() else {
            unreachable_vacant()
        };
        let (posted, result) = doorbell::send(
            prov,
            handle,
            qp.index,
            flights,
            &mut slot.send,
            slot.caps.max_send_sge,
            &mut sends[..count],
        );
        slot.unsignaled_run = plan.run_after(posted, slot.unsignaled_run);
        for req in reqs.iter_mut().take(posted) {
            // Its buffers moved into the ring: what is left is empty.
            drop(req.take());
        }
        match result {
            Ok(()) => Ok(posted),
            Err(e) if posted > 0 => Err(post_hint(e).at(site!(
                "ibv_post_send",
                "partial post: the requests from the refused one on were not posted and stay with the caller"
            ))),
            Err(e) => Err(post_hint(e)),
        }
    }

    /// Posts a Write, Write-with-immediate or Send on `qp` whose `data` is
    /// copied into the work request itself (`IBV_SEND_INLINE`): no local
    /// buffer, no lkey, `data` is free again on return. Refused above the
    /// device's granted `max_inline_data`.
    #[inline]
    pub fn post_inline(
        &mut self,
        qp: QpId,
        op: SendOp,
        data: &[u8],
        tag: u64,
        signaled: bool,
    ) -> Result<(), Error> {
        let (prov, slot, flights) = self.parts(qp)?;
        if slot.send.len() >= slot.send_room {
            return Err(cannot_send_on(slot));
        }
        let flights = &mut flights[0];
        if flights.available() == 0 {
            return Err(engine_full());
        }
        check_send(slot, &op, data.len() as u64, true)?;
        let mut run = slot.unsignaled_run;
        let asked = signaled || flights.crowded(0);
        let signaled = signal_decision(&mut run, slot.send.half(), asked, 0);
        let meta = SendMeta {
            tag,
            opcode: completes_as(&op),
            signaled,
        };
        let Some(handle) = slot.qp.as_ref() else {
            unreachable_vacant()
        };
        doorbell::send_inline(
            prov,
            handle,
            qp.index,
            flights,
            &mut slot.send,
            &op,
            data,
            meta,
        )
        .map_err(post_hint)?;
        slot.unsignaled_run = run;
        Ok(())
    }

    /// Posts a receive on `qp`. Its buffers belong to the engine until the
    /// receive completes. Refused as [`Engine::post_send`] is, when full.
    #[inline]
    #[allow(clippy::result_large_err)] // the request comes back unboxed
    pub fn post_recv(
        &mut self,
        qp: QpId,
        mut req: RecvRequest<B>,
    ) -> Result<(), PostError<RecvRequest<B>>> {
        let side = self.recv_side;
        let (prov, slot, flights) = match self.parts(qp) {
            Ok(s) => s,
            Err(error) => {
                return Err(PostError {
                    error,
                    request: req,
                })
            }
        };
        if slot.recv.len() >= slot.recv_room {
            return Err(PostError {
                error: cannot_recv(slot.state, slot.has_srq),
                request: req,
            });
        }
        let flights = &mut flights[side];
        if flights.available() == 0 {
            return Err(PostError {
                error: engine_full(),
                request: req,
            });
        }
        if slot.transport == Transport::Ud && req.sgl.total_len() < MIN_UD_RECV {
            return Err(PostError {
                error: ud_recv_too_short(),
                request: req,
            });
        }
        let Some(handle) = slot.qp.as_ref() else {
            unreachable_vacant()
        };
        match doorbell::recv(
            prov,
            handle,
            qp.index,
            flights,
            &mut slot.recv,
            slot.caps.max_recv_sge,
            &mut req.sgl,
            req.tag,
        ) {
            Ok(()) => Ok(()),
            Err(error) => Err(PostError {
                error,
                request: req,
            }),
        }
    }

    /// Posts a receive on the engine's shared receive queue: the next
    /// message to any of its queue pairs may land in it. Its completion
    /// comes back from [`Engine::poll`] with its buffers and the queue pair
    /// it arrived on.
    #[allow(clippy::result_large_err)] // the request comes back unboxed
    pub fn post_srq_recv(
        &mut self,
        mut req: RecvRequest<B>,
    ) -> Result<(), PostError<RecvRequest<B>>> {
        let Some(srq) = self.srq.as_mut() else {
            return Err(PostError {
                error: Error::new(
                    site!(
                        "post_srq_recv",
                        "this engine has no shared receive queue",
                        "EngineConfig::srq"
                    ),
                    ErrorKind::BadState,
                ),
                request: req,
            });
        };
        let (slot, wr_id) = match srq.reserve() {
            Ok(r) => r,
            Err(error) => {
                return Err(PostError {
                    error,
                    request: req,
                })
            }
        };
        let max_sge = srq.max_sge;
        let (handle, target) = srq.handle_and_slot(slot);
        let posted = doorbell::srq_recv(
            &mut self.prov,
            handle,
            max_sge,
            &mut req.sgl,
            wr_id,
            &mut target.wr,
            &mut target.sgl,
        );
        match posted {
            Ok(()) => {
                srq.commit(slot, req.tag);
                Ok(())
            }
            Err(error) => Err(PostError {
                error,
                request: req,
            }),
        }
    }
}

impl<B: NicBuf, P: Provider> Engine<B, P> {
    /// Posts work requests the safe layer does not build (see [`super::RawSend`]).
    pub fn post_send_raw(
        &mut self,
        qp: QpId,
        raw: super::doorbell::RawSend<'_>,
    ) -> Result<(), Error> {
        let (prov, slot) = self.split(qp)?;
        let Some(handle) = slot.qp.as_ref() else {
            unreachable_vacant()
        };
        doorbell::send_raw(prov, handle, raw).map_err(post_hint)
    }
}

#[cold]
fn unreachable_vacant() -> ! {
    unreachable!("a live slot (checked by slot_mut) holds its queue pair")
}
