//! Prepared requests: built and checked once, then posted again and again,
//! as perftest posts one prebuilt work request. A post stamps an id and
//! rings the doorbell; the ring records it, so its completion is matched by
//! sequence number like any other (a stale or replayed one reaches
//! nothing). The buffers stay in the table entry until released; between
//! posts they are copied into and out of, or lent. All of that is refused
//! while the entry's latest post is in flight: queues complete in order, so
//! that one post in flight is exactly when the device may use them.

use crate::error::{site, Error, ErrorKind};
use crate::memory::{HostBuf, NicBuf};
use crate::sys::ibv_wc_opcode as WcOpcode;
use crate::wr::{RecvRequest, SendRequest};

use super::check::{check_prepare_ud, check_send, completes_as, engine_full};
use super::core::Engine;
use super::doorbell::{send_flags, PreparedWr, Provider};
use super::post::PostError;
use super::prepared_table::{
    gone, Entry, PreparedHandle, PreparedRecv, PreparedSend, LENT, NEVER, RELEASED,
};
use super::qp_slot::QpId;

/// How a prepared request is posted.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Post {
    /// Signaled as prepared.
    AsPrepared,
    /// Unsignaled, handed back when a later request completes.
    Unsignaled,
    /// Unsignaled, handed back only if it fails.
    Unreported,
}

#[cold]
fn busy(call: &'static crate::error::Site) -> Error {
    Error::new(call, ErrorKind::BadState)
}

#[cold]
fn no_buffer() -> Error {
    Error::invalid(site!("prepared request", "the request has no buffer"))
}

impl<B: NicBuf, P: Provider> Engine<B, P> {
    /// Keeps `req` for posting on `qp` with [`Engine::post_prepared`]: its
    /// operation, flags and tag are checked and fixed now, and its buffers
    /// stay with the engine until [`Engine::release_prepared`]. Setup time:
    /// may allocate a table entry.
    #[allow(clippy::result_large_err)] // the request comes back unboxed
    pub fn prepare_send(
        &mut self,
        qp: QpId,
        req: SendRequest<B>,
    ) -> Result<PreparedSend, PostError<SendRequest<B>>> {
        let room = self.prepared.check_room(false);
        let built = room.and_then(|()| self.slot(qp)).and_then(|slot| {
            check_prepare_ud(slot, true, 0)?;
            check_send(slot, &req.op, req.sgl.total_len() as u64, req.flags.inline)?;
            let f = req.flags;
            PreparedWr::send(
                &req.op,
                &req.sgl,
                slot.caps.max_send_sge,
                send_flags(false, f.fence, f.solicited, f.inline),
            )
        });
        let wr = match built {
            Ok(wr) => wr,
            Err(error) => {
                return Err(PostError {
                    error,
                    request: req,
                })
            }
        };
        let SendRequest {
            tag,
            op,
            sgl,
            flags,
        } = req;
        let entry = Entry {
            qp: qp.index,
            wr,
            sgl,
            tag,
            opcode: completes_as(&op),
            signaled: flags.signaled,
            last_post: NEVER,
            key: 0,
        };
        let (index, key) = self.prepared.insert(false, entry);
        Ok(PreparedSend { index, key })
    }

    /// Keeps `req` for posting on `qp`'s receive queue with
    /// [`Engine::post_prepared`] (not with a shared receive queue).
    #[allow(clippy::result_large_err)] // the request comes back unboxed
    pub fn prepare_recv(
        &mut self,
        qp: QpId,
        req: RecvRequest<B>,
    ) -> Result<PreparedRecv, PostError<RecvRequest<B>>> {
        let room = self.prepared.check_room(true);
        let built = room.and_then(|()| self.slot(qp)).and_then(|slot| {
            if slot.has_srq {
                return Err(super::check::cannot_recv(slot.state, true));
            }
            check_prepare_ud(slot, false, req.sgl.total_len())?;
            PreparedWr::recv(&req.sgl, slot.caps.max_recv_sge)
        });
        let wr = match built {
            Ok(wr) => wr,
            Err(error) => {
                return Err(PostError {
                    error,
                    request: req,
                })
            }
        };
        let RecvRequest { tag, sgl } = req;
        let entry = Entry {
            qp: qp.index,
            wr,
            sgl,
            tag,
            opcode: WcOpcode::RECV,
            signaled: true,
            last_post: NEVER,
            key: 0,
        };
        let (index, key) = self.prepared.insert(true, entry);
        Ok(PreparedRecv { index, key })
    }

    /// Posts a prepared request (again). Its completion comes back from
    /// [`Engine::poll`] with the request's tag, its [`Prepared`](super::Prepared) handle and
    /// no buffers. A request may be posted again before an earlier post of
    /// it completed: one source buffer behind a whole window of Writes.
    #[inline(always)]
    pub fn post_prepared<H: PreparedHandle>(&mut self, p: H) -> Result<(), Error> {
        self.post_prepared_as(p, Post::AsPrepared)
    }

    /// [`Engine::post_prepared`] for a send, unsignaled this time (unless
    /// the queue needs a signal: see `SendRequest::unsignaled`).
    #[inline(always)]
    pub fn post_prepared_unsignaled(&mut self, p: PreparedSend) -> Result<(), Error> {
        self.post_prepared_as(p, Post::Unsignaled)
    }

    /// [`Engine::post_prepared_unsignaled`], and [`Engine::poll`] hands this
    /// post back only if it fails (as verbs reports an unsignaled request):
    /// a server's reply that nothing waits for. Its buffers stay with the
    /// prepared request either way, and `write_prepared` is refused until
    /// the device is done with this post (a later request of its queue pair
    /// completed).
    #[inline(always)]
    pub fn post_prepared_unreported(&mut self, p: PreparedSend) -> Result<(), Error> {
        self.post_prepared_as(p, Post::Unreported)
    }

    #[inline(always)]
    fn post_prepared_as<H: PreparedHandle>(&mut self, p: H, how: Post) -> Result<(), Error> {
        let (index, key) = p.parts();
        let table = if H::RECV {
            &mut self.prepared.recvs
        } else {
            &mut self.prepared.sends
        };
        let entry = match table.get_mut(index as usize) {
            // One test for engine, generation, liveness and no loan.
            Some(e) if e.key == key => e,
            other => rebuilt(other, key, &self.qps, H::RECV)?,
        };
        let slot = &mut self.qps[entry.qp as usize];
        let qp = slot.qp.as_ref().ok_or_else(gone)?;
        if H::RECV {
            if slot.recv.len() >= slot.recv_room {
                return Err(super::check::cannot_recv(slot.state, slot.has_srq));
            }
            let flights = &mut self.flights[self.recv_side];
            if flights.available() == 0 {
                return Err(engine_full());
            }
            let seq = slot.recv.next_seq();
            super::doorbell::recv_prepared(&mut self.prov, qp, entry.qp, seq, &mut entry.wr)?;
            entry.last_post = seq;
            flights.push_bare(
                &mut slot.recv,
                entry.tag,
                WcOpcode::RECV,
                index,
                key as u32,
                false,
            );
            return Ok(());
        }
        if slot.send.len() >= slot.send_room {
            return Err(super::check::cannot_send(slot.state));
        }
        let flights = &mut self.flights[0];
        if flights.available() == 0 {
            return Err(engine_full());
        }
        let asked = (how == Post::AsPrepared && entry.signaled) || flights.crowded(0);
        // A signaled post (the latency tests' every one) reads no run.
        let mut run = if asked { 0 } else { slot.unsignaled_run };
        let signaled =
            asked || super::qp_slot::signal_decision(&mut run, slot.send.half(), false, 0);
        let seq = slot.send.next_seq();
        super::doorbell::send_prepared(&mut self.prov, qp, entry.qp, seq, &mut entry.wr, signaled)
            .map_err(super::check::post_hint)?;
        entry.last_post = seq;
        slot.unsignaled_run = run;
        let unreported = how == Post::Unreported;
        slot.unreported_sends |= unreported;
        flights.push_bare(
            &mut slot.send,
            entry.tag,
            entry.opcode,
            index,
            key as u32,
            unreported,
        );
        Ok(())
    }

    /// The live entry `p` names, refused while its latest post is in flight.
    #[inline]
    fn idle_entry<H: PreparedHandle>(
        &mut self,
        p: H,
        call: &'static crate::error::Site,
    ) -> Result<&mut Entry<B>, Error> {
        let (index, key) = p.parts();
        let entry = self.prepared.entry(H::RECV, index, key)?;
        let slot = &self.qps[entry.qp as usize];
        let ring = if H::RECV { &slot.recv } else { &slot.send };
        // A lane holds the queue pair's slot: only while the lane is
        // forgotten can anyone get here, and then the queue pair is leaked.
        let in_flight = slot.lane_out
            || match entry.last_post {
                NEVER => false,
                seq => ring.contains(seq),
            };
        if in_flight {
            return Err(busy(call));
        }
        Ok(entry)
    }

    /// The first buffer of a prepared request, to read what a receive or a
    /// Read brought or to write what the next post sends. Refused while a
    /// post of the request is in flight. The next post rebuilds the
    /// request's entries from the buffer held then (one swapped in is used).
    pub fn prepared_buf<H: PreparedHandle>(&mut self, p: H) -> Result<&mut B, Error> {
        let entry = self.idle_entry(
            p,
            site!(
                "prepared_buf",
                "a post of this prepared request is still in flight",
                "poll until its completion comes back"
            ),
        )?;
        entry.key |= LENT;
        entry.sgl.buf_mut(0).ok_or_else(no_buffer)
    }

    /// Ends a prepared request and hands its buffers back (in
    /// scatter/gather order). Refused while a post of it is in flight.
    pub fn release_prepared<H: PreparedHandle>(
        &mut self,
        p: H,
    ) -> Result<impl Iterator<Item = B>, Error> {
        let entry = self.idle_entry(
            p,
            site!(
                "release_prepared",
                "a post of this prepared request is still in flight",
                "poll until its completion comes back"
            ),
        )?;
        entry.key = (entry.key & !LENT) | RELEASED;
        Ok(core::mem::take(&mut entry.sgl).into_bufs())
    }
}

impl<B: HostBuf, P: Provider> Engine<B, P> {
    /// Copies `src` into the first buffer of a prepared request at `offset`
    /// (from the buffer's start), for the next post to send. Refused while
    /// a post of the request is in flight. Cheaper than a loan, which makes
    /// the next post rebuild the request's entries.
    #[inline(always)]
    pub fn write_prepared<H: PreparedHandle>(
        &mut self,
        p: H,
        offset: usize,
        src: &[u8],
    ) -> Result<(), Error> {
        let entry = self.idle_entry(
            p,
            site!(
                "write_prepared",
                "a post of this prepared request is still in flight",
                "poll until its completion comes back"
            ),
        )?;
        entry
            .sgl
            .buf_mut(0)
            .ok_or_else(no_buffer)?
            .write_at(offset, src)
    }

    /// Copies from the first buffer of a prepared request at `offset` into
    /// `dst` (what a receive or a Read brought). Refused while a post of the
    /// request is in flight.
    #[inline]
    pub fn read_prepared<H: PreparedHandle>(
        &mut self,
        p: H,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<(), Error> {
        let entry = self.idle_entry(
            p,
            site!(
                "read_prepared",
                "a post of this prepared request is still in flight",
                "poll until its completion comes back"
            ),
        )?;
        entry
            .sgl
            .buf_mut(0)
            .ok_or_else(no_buffer)?
            .read_at(offset, dst)
    }
}

/// `post_prepared`'s cold path: the entry after a loan, its entries rebuilt
/// from the buffers it holds now.
#[cold]
pub(super) fn rebuilt<'a, B: NicBuf, Q>(
    entry: Option<&'a mut Entry<B>>,
    key: u64,
    qps: &[super::qp_slot::QpSlot<Q>],
    recv: bool,
) -> Result<&'a mut Entry<B>, Error> {
    match entry {
        Some(e) if e.key == key | LENT => {
            let caps = qps[e.qp as usize].caps;
            let max_sge = if recv {
                caps.max_recv_sge
            } else {
                caps.max_send_sge
            };
            e.wr.rebuild(&e.sgl, max_sge)?;
            e.key &= !LENT;
            Ok(e)
        }
        _ => Err(gone()),
    }
}
