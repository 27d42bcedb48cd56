//! Completion queues and the work completions polled from them.
#![allow(unsafe_code)]

use alloc::sync::Arc;
use core::ptr::NonNull;

use crate::device::Context;
use crate::error::{Error, ErrorKind, WcError};
use crate::pd::destroy;
use crate::ret::{check_count, check_ptr, check_rc};
use core::sync::atomic::{AtomicU32, Ordering};

/// Completion events are acknowledged (a mutex-taking call) once per this many.
pub const ACK_BATCH: u32 = 64;
use crate::sys::{self, Zeroed};

pub use crate::sys::{ibv_wc_opcode as WcOpcode, ibv_wc_status as WcStatus};

pub(crate) struct CqInner {
    pub(crate) ptr: NonNull<sys::ibv_cq>,
    depth: u32,
    /// Events read from the channel and not yet acknowledged (acked in
    /// batches, and all before the CQ is destroyed).
    unacked: AtomicU32,
    channel: Option<CompletionChannel>,
    _ctx: Context,
}

// SAFETY: ibv_poll_cq and the other CQ verbs are thread-safe in rdma-core
// providers (they lock internally); the pointer is only passed to verbs.
unsafe impl Send for CqInner {}
// SAFETY: as above.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        let unacked = *self.unacked.get_mut();
        if unacked > 0 {
            // SAFETY: live CQ; exactly the events read and not yet acked.
            unsafe { sys::ibv_ack_cq_events(self.ptr.as_ptr(), unacked) };
        }
        // SAFETY: every QP using this CQ holds an Arc to it, so none is alive;
        // the channel (a field) is destroyed after the CQ.
        destroy("ibv_destroy_cq", unsafe {
            sys::ibv_destroy_cq(self.ptr.as_ptr())
        });
    }
}

/// A completion queue (`struct ibv_cq`). Queue pairs keep it alive.
#[derive(Clone)]
pub struct CompletionQueue {
    pub(crate) inner: Arc<CqInner>,
}

impl CompletionQueue {
    /// A completion queue with room for at least `depth` completions.
    pub fn new(ctx: &Context, depth: u32) -> Result<CompletionQueue, Error> {
        Self::create(ctx, depth, None)
    }

    /// A completion queue that can wake a sleeping thread: its completion
    /// events arrive on `channel` (see [`CompletionQueue::wait_readable`]).
    pub fn with_channel(
        ctx: &Context,
        depth: u32,
        channel: &CompletionChannel,
    ) -> Result<CompletionQueue, Error> {
        Self::create(ctx, depth, Some(channel.clone()))
    }

    fn create(
        ctx: &Context,
        depth: u32,
        channel: Option<CompletionChannel>,
    ) -> Result<CompletionQueue, Error> {
        let cqe = i32::try_from(depth.max(1))
            .map_err(|_| Error::invalid("ibv_create_cq", "depth too large"))?;
        let ch = channel
            .as_ref()
            .map_or(core::ptr::null_mut(), |c| c.inner.ptr.as_ptr());
        // SAFETY: live context; `ch` is NULL or a live channel of the same
        // context that the CQ keeps alive (field `channel`).
        let ptr = check_ptr("ibv_create_cq", unsafe {
            sys::ibv_create_cq(ctx.as_raw(), cqe, core::ptr::null_mut(), ch, 0)
        })?;
        // SAFETY: `ptr` is a live CQ; `cqe` is what the provider granted.
        let granted = unsafe { ptr.as_ref().cqe }.max(0) as u32;
        let inner = CqInner {
            ptr,
            depth: granted,
            unacked: AtomicU32::new(0),
            channel,
            _ctx: ctx.clone(),
        };
        Ok(CompletionQueue {
            inner: Arc::new(inner),
        })
    }

    /// Arms the queue: the next completion (with `solicited_only`, the next
    /// solicited or error completion) sends one event to the channel.
    pub fn req_notify(&self, solicited_only: bool) -> Result<(), Error> {
        // SAFETY: live CQ.
        check_rc("ibv_req_notify_cq", unsafe {
            sys::verbs_shim_req_notify_cq(self.inner.ptr.as_ptr(), i32::from(solicited_only))
        })
    }

    /// The channel's file descriptor (non-blocking), to register with
    /// `poll`/`epoll` in an event loop; `None` without a channel.
    pub fn event_fd(&self) -> Option<i32> {
        self.inner.channel.as_ref().map(|c| c.fd())
    }

    /// Sleeps until the channel has an event or `timeout_ms` passes, then
    /// consumes every pending event (acknowledged in batches). Returns
    /// whether an event arrived. Re-arm with [`CompletionQueue::req_notify`]
    /// and poll again before sleeping again, or a completion can be missed.
    pub fn wait_readable(&self, timeout_ms: i32) -> Result<bool, Error> {
        let fd = self
            .event_fd()
            .ok_or_else(|| Error::invalid("wait for CQ event", "the CQ has no channel"))?;
        Ok(
            crate::ret::wait_readable("poll(CQ channel)", fd, timeout_ms)?
                && self.take_events()? > 0,
        )
    }

    /// Reads every pending event off the channel (non-blocking) and
    /// acknowledges them in batches of [`ACK_BATCH`].
    pub fn take_events(&self) -> Result<u32, Error> {
        let Some(channel) = &self.inner.channel else {
            return Ok(0);
        };
        let mut n = 0;
        loop {
            let mut cq = core::ptr::null_mut();
            let mut user = core::ptr::null_mut();
            // SAFETY: live channel (non-blocking fd); valid out-pointers.
            let rc =
                unsafe { sys::ibv_get_cq_event(channel.inner.ptr.as_ptr(), &mut cq, &mut user) };
            if rc != 0 {
                let e = crate::ret::errno();
                if e == libc::EAGAIN || e == libc::EWOULDBLOCK {
                    break;
                }
                return Err(Error::os("ibv_get_cq_event", e));
            }
            if cq != self.inner.ptr.as_ptr() {
                // A channel shared with another CQ: that CQ's event, acked at once.
                // SAFETY: the library just returned this live CQ's event.
                unsafe { sys::ibv_ack_cq_events(cq, 1) };
                continue;
            }
            n += 1;
        }
        let pending = self.inner.unacked.fetch_add(n, Ordering::Relaxed) + n;
        if pending >= ACK_BATCH {
            let taken = self.inner.unacked.swap(0, Ordering::Relaxed);
            // SAFETY: live CQ; `taken` events were read and not yet acked.
            unsafe { sys::ibv_ack_cq_events(self.inner.ptr.as_ptr(), taken) };
        }
        Ok(n)
    }

    /// The number of completions the queue can hold (as granted).
    pub fn depth(&self) -> u32 {
        self.inner.depth
    }

    /// Polls up to `out.len()` completions into the caller's array and
    /// returns how many were written. Never allocates, never blocks.
    #[inline]
    pub fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, Error> {
        let n = out.len().min(i32::MAX as usize) as i32;
        // SAFETY: live CQ; `out` is valid for `n` writes of `ibv_wc`
        // (WorkCompletion is a transparent wrapper).
        let got =
            unsafe { sys::verbs_shim_poll_cq(self.inner.ptr.as_ptr(), n, out.as_mut_ptr().cast()) };
        check_count("ibv_poll_cq", got as isize)
    }

    /// The raw CQ, for calls the safe layer does not wrap.
    pub fn as_raw(&self) -> *mut sys::ibv_cq {
        self.inner.ptr.as_ptr()
    }
}

impl core::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("depth", &self.depth())
            .finish()
    }
}

/// One work completion (`struct ibv_wc`), as polled.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default)]
pub struct WorkCompletion(pub sys::ibv_wc);

impl WorkCompletion {
    /// An empty completion, to fill a polling array.
    pub fn zeroed() -> WorkCompletion {
        WorkCompletion(sys::ibv_wc::zeroed())
    }
    /// The work request's id.
    pub fn wr_id(&self) -> u64 {
        self.0.wr_id
    }
    /// The status.
    pub fn status(&self) -> WcStatus {
        self.0.status
    }
    /// The opcode (not meaningful for error completions).
    pub fn opcode(&self) -> WcOpcode {
        self.0.opcode
    }
    /// Bytes transferred (receives, reads, atomics).
    pub fn byte_len(&self) -> u32 {
        self.0.byte_len
    }
    /// The immediate data, in host order, when the completion carries one.
    pub fn imm(&self) -> Option<u32> {
        self.0
            .wc_flags
            .contains(sys::ibv_wc_flags::WITH_IMM)
            .then(|| u32::from_be(self.0.imm_data))
    }
    /// The local QP number the completion belongs to.
    pub fn qp_num(&self) -> u32 {
        self.0.qp_num
    }
    /// `Ok` for success, otherwise the typed error with its meaning.
    pub fn result(&self) -> Result<(), Error> {
        if self.0.status == WcStatus::SUCCESS {
            return Ok(());
        }
        Err(Error::new(
            "work completion",
            ErrorKind::Completion(WcError {
                status: self.0.status,
                opcode: self.0.opcode,
                wr_id: self.0.wr_id,
                vendor_err: self.0.vendor_err,
            }),
        ))
    }
}

/// As [`CompletionQueue::poll`], into uninitialized storage (no need to
/// zero the array first), on a raw CQ that the caller holds alive through
/// another borrow (the queue pair's data path); returns the completions
/// written.
///
/// # Safety
///
/// `cq` must be a live CQ for the duration of the call.
#[inline]
pub(crate) unsafe fn poll_uninit_raw(
    cq: *mut sys::ibv_cq,
    out: &mut [core::mem::MaybeUninit<WorkCompletion>],
) -> Result<&[WorkCompletion], Error> {
    let n = out.len().min(i32::MAX as usize) as i32;
    // SAFETY: live CQ (caller); `out` is valid for `n` writes of `ibv_wc`
    // (WorkCompletion and MaybeUninit are transparent wrappers).
    let got = unsafe { sys::verbs_shim_poll_cq(cq, n, out.as_mut_ptr().cast()) };
    // One comparison for the common case: a negative count (an error) is
    // huge as unsigned, as is more than was asked for.
    let got = match got as u32 as usize {
        n if n <= out.len() => n,
        _ => poll_refused(got, out.len())?,
    };
    // SAFETY: the library initialized the first `got` entries.
    Ok(unsafe { core::slice::from_raw_parts(out.as_ptr().cast::<WorkCompletion>(), got) })
}

/// `poll_uninit_raw`'s cold path: the error of a negative count, and no
/// more entries than asked for from a provider that claims more.
#[cold]
fn poll_refused(got: core::ffi::c_int, asked: usize) -> Result<usize, Error> {
    Ok(check_count("ibv_poll_cq", got as isize)?.min(asked))
}

pub(crate) struct ChannelInner {
    ptr: NonNull<sys::ibv_comp_channel>,
    _ctx: Context,
}

// SAFETY: a completion channel is a file descriptor plus library state
// guarded by the library; the pointer is only passed to verbs.
unsafe impl Send for ChannelInner {}
// SAFETY: as above.
unsafe impl Sync for ChannelInner {}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        // SAFETY: every CQ using it holds an Arc to it, so none is alive.
        destroy("ibv_destroy_comp_channel", unsafe {
            sys::ibv_destroy_comp_channel(self.ptr.as_ptr())
        });
    }
}

/// A completion event channel (`struct ibv_comp_channel`): a file
/// descriptor that becomes readable when an armed CQ gets a completion.
#[derive(Clone)]
pub struct CompletionChannel {
    inner: Arc<ChannelInner>,
}

impl CompletionChannel {
    /// Creates a channel whose descriptor is non-blocking (so reading
    /// events until `EAGAIN` never sleeps).
    pub fn new(ctx: &Context) -> Result<CompletionChannel, Error> {
        // SAFETY: live context.
        let ptr = check_ptr("ibv_create_comp_channel", unsafe {
            sys::ibv_create_comp_channel(ctx.as_raw())
        })?;
        let this = CompletionChannel {
            inner: Arc::new(ChannelInner {
                ptr,
                _ctx: ctx.clone(),
            }),
        };
        let fd = this.fd();
        // SAFETY: `fd` is the channel's open descriptor; F_GETFL/F_SETFL
        // only change its flags.
        let ok = unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
        };
        if !ok {
            return Err(Error::os(
                "fcntl(O_NONBLOCK) on the completion channel",
                crate::ret::errno(),
            ));
        }
        Ok(this)
    }

    /// The descriptor, for `poll`/`epoll`.
    pub fn fd(&self) -> i32 {
        // SAFETY: live channel; `fd` is set at creation and never changes.
        unsafe { self.inner.ptr.as_ref().fd }
    }
}

impl core::fmt::Debug for CompletionChannel {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CompletionChannel")
            .field("fd", &self.fd())
            .finish()
    }
}
