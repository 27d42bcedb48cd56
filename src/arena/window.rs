//! Least-privilege remote access to one arena buffer: a type-2 memory
//! window bound to exactly its range, or (where the device has no windows)
//! its own registration. Revoking, or dropping, invalidates the descriptor.
#![allow(unsafe_code)]

use core::ptr::NonNull;

use super::ArenaBuf;
use crate::endpoint::RemoteRegion;
use crate::error::{Error, ErrorKind};
use crate::memory::{check_range, volatile_copy_in, volatile_copy_out, LocalBuf};
use crate::mr::{register, Access};
use crate::qp::QueuePair;
use crate::ret::check_ptr;
use crate::sys::{self, Zeroed};

/// How an [`ExposedBuf`] grants access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exposed {
    /// A type-2 memory window bound to the buffer's range.
    Window,
    /// A registration of the buffer's range alone.
    Registration,
}

enum Grant {
    Window(NonNull<sys::ibv_mw>),
    Registration(NonNull<sys::ibv_mr>),
}

/// An arena buffer a peer may access through [`ExposedBuf::remote`], and
/// nothing else of the arena. Its memory is read and written by copies
/// only (the peer may write it at any time). [`ExposedBuf::revoke`] (or
/// dropping it) invalidates the descriptor before the buffer is freed.
pub struct ExposedBuf {
    buf: Option<ArenaBuf>,
    grant: Grant,
    remote: RemoteRegion,
}

// SAFETY: owns the buffer (Send) and a window/registration handle that is
// only passed to thread-safe verbs.
unsafe impl Send for ExposedBuf {}

impl ExposedBuf {
    fn new(buf: ArenaBuf, grant: Grant, rkey: u32) -> ExposedBuf {
        let remote = RemoteRegion {
            addr: buf.addr(),
            len: buf.len() as u64,
            rkey,
        };
        ExposedBuf {
            buf: Some(buf),
            grant,
            remote,
        }
    }

    /// The descriptor to give the peer: exactly this buffer.
    pub fn remote(&self) -> RemoteRegion {
        self.remote
    }

    /// Window or registration.
    pub fn kind(&self) -> Exposed {
        match self.grant {
            Grant::Window(_) => Exposed::Window,
            Grant::Registration(_) => Exposed::Registration,
        }
    }

    fn buf(&self) -> &ArenaBuf {
        self.buf.as_ref().expect("present until revoked")
    }

    /// Copies `src` into the buffer at `offset`.
    pub fn write_at(&mut self, offset: usize, src: &[u8]) -> Result<(), Error> {
        let buf = self.buf();
        check_range("ExposedBuf::write_at", offset, src.len(), buf.len())?;
        // SAFETY: range checked; volatile because the peer may access it.
        unsafe { volatile_copy_in((buf.addr() as *mut u8).add(offset), src) };
        Ok(())
    }

    /// Copies from the buffer at `offset` into `dst`.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<(), Error> {
        let buf = self.buf();
        check_range("ExposedBuf::read_at", offset, dst.len(), buf.len())?;
        // SAFETY: range checked; volatile because the peer may write it.
        unsafe { volatile_copy_out((buf.addr() as *const u8).add(offset), dst) };
        Ok(())
    }

    /// Invalidates the descriptor (deallocates the window or deregisters)
    /// and gives the buffer back for local use or freeing.
    pub fn revoke(mut self) -> Result<ArenaBuf, Error> {
        self.invalidate()?;
        Ok(self.buf.take().expect("present until revoked"))
    }

    fn invalidate(&mut self) -> Result<(), Error> {
        let rc = match self.grant {
            // SAFETY: allocated by `QueuePair::expose`, deallocated once
            // (revoke consumes self; Drop skips once buf is taken).
            Grant::Window(mw) => unsafe { sys::verbs_shim_dealloc_mw(mw.as_ptr()) },
            // SAFETY: registered by `register_buffer`, deregistered once.
            Grant::Registration(mr) => unsafe { sys::ibv_dereg_mr(mr.as_ptr()) },
        };
        crate::ret::check_rc("revoke exposed buffer", rc)
    }
}

impl Drop for ExposedBuf {
    fn drop(&mut self) {
        if self.buf.is_some() {
            // Invalidate before the buffer (dropped after this body) is freed.
            let r = self.invalidate();
            debug_assert!(r.is_ok(), "{r:?}");
        }
    }
}

impl core::fmt::Debug for ExposedBuf {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ExposedBuf")
            .field("kind", &self.kind())
            .field("remote", &self.remote)
            .finish()
    }
}

const REMOTE: Access =
    Access(Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0 | Access::REMOTE_ATOMIC.0);

fn check_access(call: &'static str, access: Access) -> Result<(), Error> {
    if access.is_empty() || access.without(REMOTE) != Access::EMPTY {
        return Err(Error::invalid(
            call,
            "access must be REMOTE_WRITE, REMOTE_READ and/or REMOTE_ATOMIC",
        ));
    }
    Ok(())
}

/// See [`super::Arena::register_buffer`].
pub(super) fn register_buffer(
    buf: ArenaBuf,
    access: Access,
) -> Result<ExposedBuf, (Error, ArenaBuf)> {
    if let Err(e) = check_access("Arena::register_buffer", access) {
        return Err((e, buf));
    }
    let pd = buf.shared().pd.clone();
    match register(
        &pd,
        buf.addr() as *mut u8,
        buf.len(),
        access | Access::LOCAL_WRITE,
    ) {
        Ok(mr) => {
            // SAFETY: `mr` is a live registration just created.
            let rkey = unsafe { mr.as_ref().rkey };
            Ok(ExposedBuf::new(buf, Grant::Registration(mr), rkey))
        }
        Err(e) => Err((e, buf)),
    }
}

/// `ibv_inc_rkey`: a new tag in the low byte for each bind of a window.
fn inc_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

impl<B: LocalBuf> QueuePair<B> {
    /// Gives a peer access to exactly `buf` and nothing else of the arena:
    /// through a type-2 memory window ([`QueuePair::expose_window`]) where
    /// the device enforces window bounds, else (Soft-RoCE, see
    /// [`QueuePair::windows_enforce_bounds`]) through a registration of the
    /// buffer alone, which is ready at once (no completion to wait for:
    /// check [`ExposedBuf::kind`]).
    pub fn expose(
        &mut self,
        buf: ArenaBuf,
        access: Access,
        tag: u64,
    ) -> Result<ExposedBuf, (Error, ArenaBuf)> {
        if self.windows_enforce_bounds() {
            self.expose_window(buf, access, tag)
        } else {
            register_buffer(buf, access)
        }
    }

    /// Binds a type-2 memory window to exactly `buf`'s range with `access`
    /// (`REMOTE_WRITE`/`READ`/`ATOMIC`), through this queue pair: the peer
    /// connected to it can then reach that buffer and nothing else of the
    /// arena. The bind is a send-queue request: give the peer
    /// [`ExposedBuf::remote`] only after its completion (opcode `BIND_MW`,
    /// tag `tag`) came back from [`QueuePair::poll`]. The arena must have
    /// been created with `windows: true` in this QP's protection domain.
    pub fn expose_window(
        &mut self,
        buf: ArenaBuf,
        access: Access,
        tag: u64,
    ) -> Result<ExposedBuf, (Error, ArenaBuf)> {
        if let Err(e) = check_access("expose", access) {
            return Err((e, buf));
        }
        if buf.shared().pd.as_raw() != self.pd().as_raw() {
            return Err((
                Error::invalid(
                    "expose",
                    "the arena and the queue pair are in different protection domains",
                ),
                buf,
            ));
        }
        // SAFETY: live PD.
        let mw = unsafe { sys::verbs_shim_alloc_mw(self.pd().as_raw(), sys::ibv_mw_type::TYPE_2) };
        let mw = match check_ptr("ibv_alloc_mw(type 2)", mw) {
            Ok(mw) => mw,
            Err(e) => {
                let e = if e.errno() == Some(libc::EOPNOTSUPP) {
                    Error::new("ibv_alloc_mw(type 2)", ErrorKind::Unsupported)
                        .with_hint("no memory windows here: use Arena::register_buffer")
                } else {
                    e
                };
                return Err((e, buf));
            }
        };
        // SAFETY: `mw` is live; its rkey is read once to derive the bound key.
        let rkey = inc_rkey(unsafe { mw.as_ref().rkey });
        let mut wr = sys::ibv_send_wr::zeroed();
        wr.opcode = sys::ibv_wr_opcode::BIND_MW;
        wr.bind_mw_or_tso.bind_mw = sys::ibv_send_wr_bind_mw {
            mw: mw.as_ptr(),
            rkey,
            bind_info: sys::ibv_mw_bind_info {
                mr: buf.shared().mr.as_ptr(),
                addr: buf.addr(),
                length: buf.len() as u64,
                mw_access_flags: access,
            },
        };
        if let Err(e) = self.post_bind(&mut wr, tag) {
            // SAFETY: never bound; deallocated once.
            unsafe { sys::verbs_shim_dealloc_mw(mw.as_ptr()) };
            return Err((e, buf));
        }
        Ok(ExposedBuf::new(buf, Grant::Window(mw), rkey))
    }
}
