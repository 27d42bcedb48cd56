//! Completion queues and completion channels.

use alloc::sync::Arc;
use core::mem::{ManuallyDrop, MaybeUninit};
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU32, Ordering};

use crate::error::{site, Error};
use crate::sys;

use super::device::RawContext;
use super::os::{set_nonblocking, wait_readable};
use super::ret::{check_count, check_ptr, check_rc, errno};

/// Completion events are acknowledged (a mutex-taking call) once per this many.
const ACK_BATCH: u32 = 64;

/// A completion channel whose descriptor is non-blocking.
pub(crate) struct RawChannel {
    ptr: NonNull<sys::ibv_comp_channel>,
    /// Dropped only after a successful destroy; leaked otherwise.
    ctx: ManuallyDrop<Arc<RawContext>>,
}

// SAFETY: a completion channel is a descriptor plus library state guarded
// by the library; the pointer is only passed to verbs.
unsafe impl Send for RawChannel {}
// SAFETY: as above.
unsafe impl Sync for RawChannel {}

impl RawChannel {
    /// `ibv_create_comp_channel`, made non-blocking.
    pub(crate) fn create(ctx: &Arc<RawContext>) -> Result<RawChannel, Error> {
        // SAFETY: live context.
        let ptr = check_ptr(site!("ibv_create_comp_channel"), unsafe {
            sys::ibv_create_comp_channel(ctx.as_ptr())
        })?;
        let channel = RawChannel {
            ptr,
            ctx: ManuallyDrop::new(ctx.clone()),
        };
        set_nonblocking(
            site!("fcntl(O_NONBLOCK) on the completion channel"),
            channel.fd(),
        )?;
        Ok(channel)
    }

    /// The descriptor, for `poll`/`epoll`.
    pub(crate) fn fd(&self) -> i32 {
        // SAFETY: live channel; `fd` is set at creation and never changes.
        unsafe { self.ptr.as_ref().fd }
    }
}

impl Drop for RawChannel {
    fn drop(&mut self) {
        // SAFETY: every CQ using it holds an Arc to it, so none is alive.
        if unsafe { sys::ibv_destroy_comp_channel(self.ptr.as_ptr()) } != 0 {
            super::leak::count_leak();
            return;
        }
        // SAFETY: dropped once, after the channel is gone.
        unsafe { ManuallyDrop::drop(&mut self.ctx) };
    }
}

/// A completion queue, with its channel if it has one.
pub struct RawCq {
    ptr: NonNull<sys::ibv_cq>,
    /// Entries the provider granted.
    cqe: u32,
    /// Events read from the channel and not yet acknowledged.
    unacked: AtomicU32,
    /// The channel and context; dropped only after a successful destroy.
    keep: ManuallyDrop<(Option<Arc<RawChannel>>, Arc<RawContext>)>,
}

// SAFETY: ibv_poll_cq and the other CQ verbs are thread-safe in rdma-core
// providers (they lock internally); the pointer is only passed to verbs.
unsafe impl Send for RawCq {}
// SAFETY: as above.
unsafe impl Sync for RawCq {}

impl RawCq {
    /// `ibv_create_cq` with room for at least `depth` completions.
    pub(crate) fn create(
        ctx: &Arc<RawContext>,
        depth: u32,
        channel: Option<Arc<RawChannel>>,
    ) -> Result<RawCq, Error> {
        let cqe = i32::try_from(depth.max(1))
            .map_err(|_| Error::invalid(site!("ibv_create_cq", "depth too large")))?;
        let ch = channel
            .as_ref()
            .map_or(core::ptr::null_mut(), |c| c.ptr.as_ptr());
        // SAFETY: live context; `ch` is NULL or a live channel of the same
        // context that the CQ keeps alive (field `channel`).
        let ptr = check_ptr(
            site!("ibv_create_cq", "", "`ibv_devinfo -v` shows max_cqe"),
            unsafe { sys::ibv_create_cq(ctx.as_ptr(), cqe, core::ptr::null_mut(), ch, 0) },
        )?;
        // SAFETY: `ptr` is a live CQ; `cqe` is what the provider granted.
        let granted = unsafe { ptr.as_ref().cqe }.max(0) as u32;
        Ok(RawCq {
            ptr,
            cqe: granted,
            unacked: AtomicU32::new(0),
            keep: ManuallyDrop::new((channel, ctx.clone())),
        })
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_cq {
        self.ptr.as_ptr()
    }

    /// Completions the queue can hold, as granted.
    pub(crate) fn cqe(&self) -> u32 {
        self.cqe
    }

    /// Polls up to `out.len()` completions into uninitialized storage and
    /// returns those written.
    #[inline(always)]
    pub(crate) fn poll<'a>(
        &self,
        out: &'a mut [MaybeUninit<sys::ibv_wc>],
    ) -> Result<&'a [sys::ibv_wc], Error> {
        let asked = out.len().min(i32::MAX as usize);
        // SAFETY: live CQ; `out` is valid for `asked` writes of `ibv_wc`
        // (MaybeUninit is a transparent wrapper).
        let got = unsafe {
            sys::verbs_shim_poll_cq(self.ptr.as_ptr(), asked as i32, out.as_mut_ptr().cast())
        };
        // One comparison for the common case: a negative count (an error) is
        // huge as unsigned, as is more than was asked for.
        let got = match got as u32 as usize {
            n if n <= asked => n,
            _ => poll_refused(got, asked)?,
        };
        // SAFETY: the library initialized the first `got` entries.
        Ok(unsafe { core::slice::from_raw_parts(out.as_ptr().cast::<sys::ibv_wc>(), got) })
    }

    /// Polls at most one completion into `out`: a lane's poll, which
    /// needs no slice of what came back.
    #[inline(always)]
    pub(crate) fn poll_one<'a>(
        &self,
        out: &'a mut MaybeUninit<sys::ibv_wc>,
    ) -> Result<Option<&'a sys::ibv_wc>, Error> {
        // SAFETY: live CQ; `out` is valid for one write of `ibv_wc`
        // (MaybeUninit is a transparent wrapper).
        let got = unsafe { sys::verbs_shim_poll_cq(self.ptr.as_ptr(), 1, out.as_mut_ptr()) };
        // One first: the poll a loop acts on.
        if got != 1 {
            if got == 0 {
                return Ok(None);
            }
            // An error, or a provider that claims more than one: one.
            poll_refused(got, 1)?;
        }
        // SAFETY: the library initialized the entry.
        Ok(Some(unsafe { out.assume_init_ref() }))
    }

    /// Arms the queue: the next completion (with `solicited_only`, the next
    /// solicited or error completion) sends one event to the channel.
    pub(crate) fn req_notify(&self, solicited_only: bool) -> Result<(), Error> {
        // SAFETY: live CQ.
        check_rc(site!("ibv_req_notify_cq"), unsafe {
            sys::verbs_shim_req_notify_cq(self.ptr.as_ptr(), i32::from(solicited_only))
        })
    }

    /// The channel's descriptor, if the queue has a channel.
    pub(crate) fn event_fd(&self) -> Option<i32> {
        self.keep.0.as_ref().map(|c| c.fd())
    }

    /// A descriptor of its own on the channel's open file (`F_DUPFD_CLOEXEC`):
    /// readable when the channel is, open for as long as the caller keeps
    /// it, whatever happens to this queue. For an event loop that requires
    /// a descriptor it owns (tokio's `AsyncFd`).
    #[cfg(feature = "std")]
    pub(crate) fn dup_event_fd(&self) -> Result<Option<std::os::fd::OwnedFd>, Error> {
        use std::os::fd::FromRawFd;
        let Some(channel) = &self.keep.0 else {
            return Ok(None);
        };
        // SAFETY: F_DUPFD_CLOEXEC on the live channel's descriptor makes a
        // new descriptor or fails; it reads or writes no memory of ours.
        let fd = unsafe { libc::fcntl(channel.fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if fd < 0 {
            return Err(Error::os(
                site!("fcntl(F_DUPFD_CLOEXEC) on the completion channel"),
                errno(),
            ));
        }
        // SAFETY: `fd` was just made by fcntl, is open, and nothing else
        // owns it: the OwnedFd is its only owner and closes it once.
        Ok(Some(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }))
    }

    /// Sleeps until the channel has an event or `timeout_ms` passes, then
    /// reads every pending event (acknowledged in batches). Returns whether
    /// an event of this queue arrived.
    pub(crate) fn wait_event(&self, timeout_ms: i32) -> Result<bool, Error> {
        let Some(channel) = &self.keep.0 else {
            return Err(Error::invalid(site!(
                "wait for a completion event",
                "the completion queue has no channel"
            )));
        };
        if !wait_readable(site!("poll(completion channel)"), channel.fd(), timeout_ms)? {
            return Ok(false);
        }
        self.take_events()
    }

    /// Reads every event the channel holds without waiting (the channel
    /// is non-blocking), acknowledging this queue's in batches and another
    /// queue's at once. Returns whether an event of this queue was read.
    pub(crate) fn take_events(&self) -> Result<bool, Error> {
        let Some(channel) = &self.keep.0 else {
            return Err(Error::invalid(site!(
                "take completion events",
                "the completion queue has no channel"
            )));
        };
        let mut mine = 0;
        loop {
            let mut cq = core::ptr::null_mut();
            let mut user = core::ptr::null_mut();
            // SAFETY: live, non-blocking channel; valid out-pointers.
            if unsafe { sys::ibv_get_cq_event(channel.ptr.as_ptr(), &mut cq, &mut user) } != 0 {
                let e = errno();
                if e == libc::EAGAIN || e == libc::EWOULDBLOCK {
                    break;
                }
                return Err(Error::os(site!("ibv_get_cq_event"), e));
            }
            if cq == self.ptr.as_ptr() {
                mine += 1;
            } else {
                // A channel shared with another CQ: that CQ's event, acked now.
                // SAFETY: the library just returned this live CQ's event.
                unsafe { sys::ibv_ack_cq_events(cq, 1) };
            }
        }
        let pending = self.unacked.fetch_add(mine, Ordering::Relaxed) + mine;
        if pending >= ACK_BATCH {
            let taken = self.unacked.swap(0, Ordering::Relaxed);
            // SAFETY: live CQ; `taken` events were read and not yet acked.
            unsafe { sys::ibv_ack_cq_events(self.ptr.as_ptr(), taken) };
        }
        Ok(mine > 0)
    }
}

/// `poll`'s cold path: the error of a negative count, and no more entries
/// than asked for from a provider that claims more.
#[cold]
fn poll_refused(got: core::ffi::c_int, asked: usize) -> Result<usize, Error> {
    Ok(check_count(site!("ibv_poll_cq"), got as isize)?.min(asked))
}

impl Drop for RawCq {
    fn drop(&mut self) {
        let unacked = *self.unacked.get_mut();
        if unacked > 0 {
            // SAFETY: live CQ; exactly the events read and not yet acked.
            unsafe { sys::ibv_ack_cq_events(self.ptr.as_ptr(), unacked) };
        }
        // SAFETY: every QP using this CQ holds an Arc to it, so none is alive
        // (a leaked one keeps its Arc); the channel is destroyed after.
        if unsafe { sys::ibv_destroy_cq(self.ptr.as_ptr()) } != 0 {
            super::leak::count_leak();
            return;
        }
        // SAFETY: dropped once, after the CQ is gone.
        unsafe { ManuallyDrop::drop(&mut self.keep) };
    }
}
