//! The connection manager's events of an engine's queue pairs: read
//! without blocking, on a descriptor of their own, or together with the
//! engine's completions; each recorded on the queue pair it concerns
//! before the caller sees it.

use alloc::vec::Vec;

use crate::engine::{CompletionRef, Engine, QpId, QpState};
use crate::error::{site, Error, ErrorKind, Site};
use crate::memory::NicBuf;
use crate::raw::cm::RawCmId;
use crate::raw::os::wait_readable_any;
use crate::sys::rdmacm::rdma_cm_event_type as Ev;
use crate::time::Deadline;

/// One connection-manager event, acknowledged to librdmacm before it is
/// handed out (an owned value: keeping it holds nothing of librdmacm's).
#[derive(Debug)]
pub struct CmEvent {
    kind: Ev,
    status: i32,
    qp: Option<QpId>,
    private_data: Vec<u8>,
}

impl CmEvent {
    /// What happened (ESTABLISHED, DISCONNECTED, REJECTED, ...).
    pub fn kind(&self) -> Ev {
        self.kind
    }

    /// The event's status (0, or a negative errno or the peer's reject
    /// reason).
    pub fn status(&self) -> i32 {
        self.status
    }

    /// The queue pair it concerns: `None` once that queue pair was
    /// removed from the engine (its id's late events), or for an id
    /// that has none.
    pub fn qp(&self) -> Option<QpId> {
        self.qp
    }

    /// The peer's private data (ESTABLISHED on the connecting side: the
    /// accept's; REJECTED: the reject's).
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// The error this event stands for when it ends a connection or its
    /// attempt (DISCONNECTED, REJECTED, UNREACHABLE, CONNECT_ERROR,
    /// DEVICE_REMOVAL, ...), naming it and what to check; `None` for
    /// ESTABLISHED and the events that end nothing.
    pub fn error(&self) -> Option<Error> {
        ends_connection(self.kind)
            .then(|| super::steps::event_error(self.kind, self.status, site!("rdma_cm")))
    }

    pub(super) fn into_private_data(self) -> Vec<u8> {
        self.private_data
    }
}

/// True for the events after which a connection (or its attempt) is over.
fn ends_connection(kind: Ev) -> bool {
    matches!(
        kind,
        Ev::DISCONNECTED
            | Ev::REJECTED
            | Ev::UNREACHABLE
            | Ev::CONNECT_ERROR
            | Ev::DEVICE_REMOVAL
            | Ev::ADDR_ERROR
            | Ev::ROUTE_ERROR
    )
}

/// What ended [`Engine::wait_with_cm`].
#[derive(Debug)]
pub enum Wake {
    /// This many requests were handed back (to the wait's callback).
    Completions(usize),
    /// The connection manager's event, recorded on its queue pair.
    Event(CmEvent),
}

#[cfg_attr(docsrs, doc(cfg(feature = "rdmacm")))]
impl<B: NicBuf> Engine<B> {
    /// The next connection-manager event of this engine's rdma_cm queue
    /// pairs, or `None` at once when none is pending (it never blocks).
    ///
    /// Before it is returned, the event is recorded on the queue pair it
    /// concerns: ESTABLISHED lets the queue pair send; DISCONNECTED (the
    /// peer's `rdma_disconnect`, or its end) and the events that fail a
    /// connection being made (REJECTED, UNREACHABLE, CONNECT_ERROR,
    /// DEVICE_REMOVAL) disconnect this side too (`rdma_disconnect`, so
    /// posted requests flush back through the poll) and move the queue
    /// pair to the error state (posts refused). Remove its queue pair
    /// when done with a connection.
    pub fn cm_event(&mut self) -> Result<Option<CmEvent>, Error> {
        let Some(channel) = self.cm_channel.clone() else {
            return Ok(None);
        };
        let Some(raw) = channel.try_event()? else {
            return Ok(None);
        };
        let placed = self.cm_placed(&raw);
        if let Some((qp, id)) = &placed {
            self.record(*qp, id, raw.kind)?;
        }
        Ok(Some(CmEvent {
            kind: raw.kind,
            status: raw.status,
            qp: placed.map(|(qp, _)| qp),
            private_data: raw.private,
        }))
    }

    /// The descriptor of this engine's connection-manager events (made
    /// with the first call if no queue pair made it yet): non-blocking,
    /// readable while [`Engine::cm_event`] has one. Poll it beside
    /// [`Engine::event_fd`]; it stays valid while the engine lives.
    pub fn cm_event_fd(&mut self) -> Result<i32, Error> {
        Ok(self.cm_channel()?.fd())
    }

    /// [`Engine::wait`] that also wakes for the connection manager: returns
    /// once requests were handed back to `on_done`
    /// ([`Wake::Completions`]) or an event of this engine's rdma_cm queue
    /// pairs arrived ([`Wake::Event`], recorded as [`Engine::cm_event`]
    /// does), whichever comes first; `TimedOut` at `deadline`. So a peer's
    /// disconnect ends a wait for completions that will never come. With
    /// [`crate::EngineConfig::events`] it sleeps on both descriptors (no
    /// CPU); otherwise it spins.
    pub fn wait_with_cm(
        &mut self,
        deadline: Deadline,
        mut on_done: impl FnMut(CompletionRef<'_, B>),
    ) -> Result<Wake, Error> {
        let cm_fd = self.cm_event_fd()?;
        loop {
            let n = self.poll(&mut on_done)?;
            if n > 0 {
                return Ok(Wake::Completions(n));
            }
            if let Some(ev) = self.cm_event()? {
                return Ok(Wake::Event(ev));
            }
            if deadline.passed() {
                return Err(Error::new(WAIT, ErrorKind::TimedOut));
            }
            let Some(cq_fd) = self.event_fd() else {
                core::hint::spin_loop();
                continue;
            };
            // Arm, then look again: a completion before arming makes no event.
            self.arm(false)?;
            let n = self.poll(&mut on_done)?;
            if n > 0 {
                return Ok(Wake::Completions(n));
            }
            let ms = deadline.remaining_ms().max(1);
            wait_readable_any(site!("poll(CQ and rdma_cm channels)"), &[cq_fd, cm_fd], ms)?;
            self.take_events()?;
        }
    }

    /// Reads this engine's events until `qp`'s `want` arrives (recording
    /// every one); an event that ends `qp`'s connection instead is its
    /// error, and `TimedOut` comes at `deadline`.
    pub(crate) fn cm_wait_for(
        &mut self,
        qp: QpId,
        want: Ev,
        step: &'static Site,
        deadline: Deadline,
    ) -> Result<CmEvent, Error> {
        let fd = self.cm_event_fd()?;
        loop {
            while let Some(ev) = self.cm_event()? {
                if ev.qp != Some(qp) {
                    continue;
                }
                if ev.kind == want && ev.status == 0 {
                    return Ok(ev);
                }
                if ends_connection(ev.kind) {
                    return Err(super::steps::event_error(ev.kind, ev.status, step));
                }
            }
            if deadline.passed() {
                return Err(Error::new(step, ErrorKind::TimedOut));
            }
            let ms = deadline.remaining_ms().clamp(1, 1000);
            wait_readable_any(site!("poll(rdma_cm channel)"), &[fd], ms)?;
        }
    }

    /// What `kind` did to `qp`, made on `id`, recorded on the engine.
    fn record(&mut self, qp: QpId, id: &RawCmId, kind: Ev) -> Result<(), Error> {
        match kind {
            Ev::ESTABLISHED if self.state(qp)? == QpState::INIT => {
                id.set_connected();
                self.mark_state(qp, QpState::RTS)
            }
            Ev::DISCONNECTED
            | Ev::REJECTED
            | Ev::UNREACHABLE
            | Ev::CONNECT_ERROR
            | Ev::DEVICE_REMOVAL => {
                if kind == Ev::DISCONNECTED {
                    id.set_peer_disconnected();
                }
                // This side disconnects too (once), so the device flushes
                // what is posted; an attempt that failed has its queue
                // pair moved to the error state the same way (the
                // disconnect request itself then fails, which is fine).
                if id.take_connected() || kind != Ev::DISCONNECTED {
                    let _ = id.disconnect();
                }
                self.mark_state(qp, QpState::ERR)
            }
            _ => Ok(()),
        }
    }
}

/// Where [`Engine::wait_with_cm`] gave up.
const WAIT: &Site = site!(
    "wait_with_cm",
    "neither a completion nor a connection-manager event before the deadline"
);
