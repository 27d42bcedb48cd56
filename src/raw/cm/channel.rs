//! A librdmacm event channel: a non-blocking descriptor, events copied
//! out and acknowledged before anyone sees them, and the table that says
//! which queue pair an event's id was placed as.

use alloc::collections::BTreeMap;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::ptr::NonNull;
use std::sync::Mutex;

use crate::error::{site, Error};
use crate::sys::rdmacm::{self as cm, rdma_cm_event_type as Ev};

use crate::raw::os::{set_nonblocking, wait_readable};
use crate::raw::ret::{check_ptr, errno};

/// Where a queue pair made on an id was placed: an engine's id, the
/// slot's index and generation (the engine's `QpId`, opaque here).
pub(crate) type PlacedAs = (u32, u32, u32);

/// An event channel with a non-blocking descriptor.
pub(crate) struct RawCmChannel {
    ptr: NonNull<cm::rdma_event_channel>,
    /// The ids on this channel whose queue pair was placed, by address:
    /// an id is entered once its queue pair is placed and removed before
    /// it is destroyed (an address is reused only after that), so an
    /// event, read while its id cannot be destroyed (until its ack),
    /// finds its own id's entry or none.
    placed: Mutex<BTreeMap<usize, PlacedAs>>,
}

// SAFETY: an event channel is a descriptor; librdmacm is thread-safe; the
// table is behind a mutex.
unsafe impl Send for RawCmChannel {}
// SAFETY: as above.
unsafe impl Sync for RawCmChannel {}

/// One event, copied out and acknowledged.
pub(crate) struct CmEvent {
    pub(crate) kind: Ev,
    pub(crate) status: i32,
    /// The private data of a connect request, an accept or a reject.
    pub(crate) private: Vec<u8>,
    /// The new id of a connect request (ours to accept or reject).
    pub(crate) request: Option<RawCmRequest>,
    /// The event's id, as an identity only (compare with `RawCmId::addr`).
    pub(crate) id: usize,
    /// Where the event's id's queue pair was placed, if it was.
    pub(crate) placed: Option<PlacedAs>,
}

impl RawCmChannel {
    /// `rdma_create_event_channel`, made non-blocking.
    pub(crate) fn create() -> Result<Arc<RawCmChannel>, Error> {
        // SAFETY: no preconditions.
        let ptr = check_ptr(site!("rdma_create_event_channel"), unsafe {
            cm::rdma_create_event_channel()
        })?;
        let ch = RawCmChannel {
            ptr,
            placed: Mutex::new(BTreeMap::new()),
        };
        set_nonblocking(site!("fcntl(O_NONBLOCK) on the rdma_cm channel"), ch.fd())?;
        Ok(Arc::new(ch))
    }

    pub(crate) fn as_ptr(&self) -> *mut cm::rdma_event_channel {
        self.ptr.as_ptr()
    }

    /// The channel's descriptor: non-blocking, readable while an event is
    /// pending.
    pub(crate) fn fd(&self) -> i32 {
        // SAFETY: live channel; `fd` never changes.
        unsafe { self.ptr.as_ref().fd }
    }

    /// Records that the queue pair made on the id at `id` was placed as
    /// `placed` (its events then say so).
    pub(crate) fn enter(&self, id: usize, placed: PlacedAs) {
        self.table().insert(id, placed);
    }

    /// Forgets the id at `id` (before it is destroyed or migrated away).
    pub(crate) fn forget(&self, id: usize) {
        self.table().remove(&id);
    }

    fn table(&self) -> std::sync::MutexGuard<'_, BTreeMap<usize, PlacedAs>> {
        // The table is consistent after any panic (single inserts/removes).
        self.placed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next event, or `Ok(None)` when none arrives within `timeout_ms`.
    pub(crate) fn next_event(self: &Arc<Self>, timeout_ms: i32) -> Result<Option<CmEvent>, Error> {
        if let Some(ev) = self.try_event()? {
            return Ok(Some(ev));
        }
        wait_readable(site!("poll(rdma_cm channel)"), self.fd(), timeout_ms)?;
        Ok(None)
    }

    /// The next pending event, acknowledged, or `Ok(None)` at once when
    /// none is pending (the descriptor is non-blocking).
    ///
    /// librdmacm may act on the event's id's queue pair inside this call
    /// (a connect response moves it to RTR and RTS, a reject to ERR): a
    /// channel that carries ids with queue pairs is read only by whoever
    /// holds those queue pairs (an engine's channel, through `&mut` of
    /// the engine), so none is being destroyed meanwhile.
    pub(crate) fn try_event(self: &Arc<Self>) -> Result<Option<CmEvent>, Error> {
        let mut raw = core::ptr::null_mut();
        // SAFETY: live, non-blocking channel; valid out-pointer.
        if unsafe { cm::rdma_get_cm_event(self.ptr.as_ptr(), &mut raw) } != 0 {
            let e = errno();
            if e != libc::EAGAIN && e != libc::EWOULDBLOCK {
                return Err(Error::os(site!("rdma_get_cm_event"), e));
            }
            return Ok(None);
        }
        // SAFETY: the library returned a live event, valid until acked below.
        let ev = unsafe { &*raw };
        let mut private = Vec::new();
        if matches!(
            ev.event,
            Ev::CONNECT_REQUEST | Ev::ESTABLISHED | Ev::REJECTED
        ) {
            // SAFETY: for these events `param.conn` is the active member.
            let conn = unsafe { ev.param.conn };
            if !conn.private_data.is_null() {
                // SAFETY: the private data is valid for its length until the ack.
                private.extend_from_slice(unsafe {
                    core::slice::from_raw_parts(
                        conn.private_data.cast::<u8>(),
                        usize::from(conn.private_data_len),
                    )
                });
            }
        }
        let request = if ev.event == Ev::CONNECT_REQUEST {
            NonNull::new(ev.id).map(|ptr| RawCmRequest::new(ptr, self.clone()))
        } else {
            None
        };
        let id = ev.id as usize;
        // Looked up before the ack: until then the id cannot be destroyed.
        let placed = self.table().get(&id).copied();
        let event = CmEvent {
            kind: ev.event,
            status: ev.status,
            private,
            request,
            id,
            placed,
        };
        // SAFETY: acked exactly once, after the copy.
        unsafe { cm::rdma_ack_cm_event(raw) };
        Ok(Some(event))
    }
}

impl Drop for RawCmChannel {
    fn drop(&mut self) {
        // SAFETY: every id on the channel holds an Arc to it (one whose
        // destroy failed keeps its Arc forever), so none is alive.
        unsafe { cm::rdma_destroy_event_channel(self.ptr.as_ptr()) };
    }
}

/// The new id of a connect request, on the listener's channel until it
/// moves to one of its own: rejected and destroyed on drop.
pub(crate) struct RawCmRequest {
    ptr: NonNull<cm::rdma_cm_id>,
    /// The channel it arrived on (it outlives the id).
    channel: Arc<RawCmChannel>,
}

// SAFETY: librdmacm ids may be used from any thread.
unsafe impl Send for RawCmRequest {}

impl RawCmRequest {
    /// The id a connect request arrived with on `channel`.
    pub(crate) fn new(ptr: NonNull<cm::rdma_cm_id>, channel: Arc<RawCmChannel>) -> Self {
        RawCmRequest { ptr, channel }
    }

    pub(crate) fn as_ptr(&self) -> *mut cm::rdma_cm_id {
        self.ptr.as_ptr()
    }

    /// The id, now the caller's to own (no reject, no destroy here), and
    /// the channel it is on.
    pub(crate) fn into_parts(self) -> (NonNull<cm::rdma_cm_id>, Arc<RawCmChannel>) {
        let this = core::mem::ManuallyDrop::new(self);
        // SAFETY: read once out of a value whose drop never runs.
        (this.ptr, unsafe { core::ptr::read(&this.channel) })
    }
}

impl Drop for RawCmRequest {
    fn drop(&mut self) {
        // SAFETY: a request's id, ours to refuse and destroy once.
        let destroyed = unsafe {
            cm::rdma_reject(self.ptr.as_ptr(), core::ptr::null(), 0);
            cm::rdma_destroy_id(self.ptr.as_ptr())
        };
        if destroyed != 0 {
            // The id is leaked, alive, on its channel: the channel stays too.
            core::mem::forget(self.channel.clone());
            crate::raw::leak::count_leak();
        }
    }
}
