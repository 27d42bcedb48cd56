//! Least-privilege remote access to one arena buffer: a type-2 memory
//! window bound to exactly its range (bound by the engine, on devices whose
//! windows enforce their bounds), or its own registration. Revoking, or
//! dropping, invalidates the descriptor before the buffer can be reused; a
//! failed invalidation leaks the buffer. A window's `ExposedBuf` exists
//! only once its bind is no longer in flight (the engine holds it until
//! then: `Engine::exposed`), so deallocating it never races the bind.

use crate::endpoint::RemoteRegion;
use crate::error::{site, Error, ErrorKind};
use crate::raw::{RawMr, RawMw};

use super::access::Access;
use super::arena::ArenaBuf;
use super::contract::{check_range, volatile_copy_in, volatile_copy_out, HostBuf, NicBuf};

/// How an [`ExposedBuf`] grants access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exposed {
    /// A type-2 memory window bound to the buffer's range.
    Window,
    /// A registration of the buffer's range alone.
    Registration,
}

enum Grant {
    Window(RawMw<ArenaBuf>),
    Registration(RawMr<ArenaBuf>),
}

/// An arena buffer a peer may access through [`ExposedBuf::remote`], and
/// nothing else of the arena. Its memory is read and written by copies
/// only (the peer may write it at any time). [`ExposedBuf::revoke`] (or
/// dropping it) invalidates the descriptor before the buffer is freed.
pub struct ExposedBuf {
    grant: Grant,
    remote: RemoteRegion,
}

impl ExposedBuf {
    /// Exposes `buf` through a registration of its range alone (works on
    /// every device; costs an `ibv_reg_mr`). `access`: `REMOTE_WRITE`,
    /// `REMOTE_READ` and/or `REMOTE_ATOMIC`.
    pub fn register(buf: ArenaBuf, access: Access) -> Result<ExposedBuf, (Error, ArenaBuf)> {
        if let Err(e) = check_access(access) {
            return Err((e, buf));
        }
        let pd = buf.shared().pd.raw.clone();
        let (addr, len) = (buf.as_ptr(), buf.len());
        // SAFETY: the registration keeps `buf`, which owns the range, until
        // it is deregistered; while it lives the buffer is reached only
        // through this value's volatile copies.
        match unsafe { RawMr::register_range(&pd, addr, len, access | Access::LOCAL_WRITE, buf) } {
            Ok(mr) => {
                let remote = RemoteRegion {
                    addr: addr as u64,
                    len: len as u64,
                    rkey: mr.rkey(),
                };
                Ok(ExposedBuf {
                    grant: Grant::Registration(mr),
                    remote,
                })
            }
            Err(fail) => Err(fail),
        }
    }

    /// A window whose bind to its buffer with `rkey` the engine posted: it
    /// stays with the engine until that bind is no longer in flight.
    pub(crate) fn window(mw: RawMw<ArenaBuf>, rkey: u32) -> ExposedBuf {
        let (addr, len) = mw.kept().map_or((0, 0), |b| (b.addr(), b.len() as u64));
        let remote = RemoteRegion { addr, len, rkey };
        ExposedBuf {
            grant: Grant::Window(mw),
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

    fn buf(&self) -> Result<&ArenaBuf, Error> {
        match &self.grant {
            Grant::Window(mw) => mw.kept().ok_or(Error::invalid(site!(
                "exposed buffer",
                "the window holds no buffer"
            ))),
            Grant::Registration(mr) => Ok(mr.kept()),
        }
    }

    /// Copies `src` into the buffer at `offset`.
    pub fn write_at(&mut self, offset: usize, src: &[u8]) -> Result<(), Error> {
        let buf = self.buf()?;
        check_range(offset, src.len(), buf.len())?;
        // SAFETY: the range lies in the buffer, owned (through the grant) by
        // `self`; volatile because the peer may access it.
        unsafe { volatile_copy_in(buf.as_ptr().add(offset), src) };
        Ok(())
    }

    /// Copies from the buffer at `offset` into `dst`.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<(), Error> {
        let buf = self.buf()?;
        check_range(offset, dst.len(), buf.len())?;
        // SAFETY: as in `write_at`; reads only.
        unsafe { volatile_copy_out(buf.as_ptr().add(offset), dst) };
        Ok(())
    }

    /// Invalidates the descriptor (deallocates the window or deregisters)
    /// and gives the buffer back. On failure the buffer is leaked, never
    /// freed: the peer may still reach it.
    ///
    /// Hostile use: revoking (or dropping) a window whose bind is still
    /// queued would free the buffer under the bind; it cannot happen, as
    /// no `ExposedBuf` exists before the bind's completion
    /// (`tests/rdma_soundness.rs`, `engine::sim::binds`).
    pub fn revoke(self) -> Result<ArenaBuf, Error> {
        let result = match self.grant {
            Grant::Window(mw) => mw.dealloc().and_then(|b| {
                b.ok_or(Error::invalid(site!(
                    "exposed buffer",
                    "the window holds no buffer"
                )))
            }),
            Grant::Registration(mr) => mr.deregister(),
        };
        result.map_err(|e| {
            e.leaked(site!(
                "revoke exposed buffer",
                "the window or registration could not be invalidated, so the buffer was leaked"
            ))
        })
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

/// Refuses anything but remote access flags.
pub(crate) fn check_access(access: Access) -> Result<(), Error> {
    if access.is_empty() || access.without(Access::REMOTE) != Access::EMPTY {
        return Err(Error::new(
            site!(
                "expose",
                "access must be REMOTE_WRITE, REMOTE_READ and/or REMOTE_ATOMIC"
            ),
            ErrorKind::InvalidArgument,
        ));
    }
    Ok(())
}
