//! One 16-byte error for every fallible call: where it happened (a
//! `&'static` [`Site`]: the call, a sentence of detail, and for the primer's
//! pitfalls what to check), what kind of failure, and the errno, work
//! completion status or connection-manager status by name.
//!
//! Sixteen bytes keep `Result<(), Error>` in two registers on the data path;
//! everything that varies per call site lives in the static site.

use core::fmt;

use crate::sys::{ibv_wc_opcode, ibv_wc_status};

mod names;

pub use names::{errno_name, wc_status_explanation};

/// Where an error happened: the call or step, and what to tell the user.
/// Built as a constant with [`site!`](crate::error::site), so it costs nothing at
/// run time.
#[derive(Debug, PartialEq, Eq)]
pub struct Site {
    /// The call or step that failed, e.g. `"ibv_modify_qp(INIT->RTR)"`.
    pub call: &'static str,
    /// A sentence on what was wrong (may be empty).
    pub detail: &'static str,
    /// What to check (may be empty).
    pub hint: &'static str,
}

/// A `&'static Site` from string literals: `site!(call)`,
/// `site!(call, detail)` or `site!(call, detail, hint)`.
#[macro_export]
macro_rules! site {
    ($call:expr) => {
        &$crate::error::Site {
            call: $call,
            detail: "",
            hint: "",
        }
    };
    ($call:expr, $detail:expr) => {
        &$crate::error::Site {
            call: $call,
            detail: $detail,
            hint: "",
        }
    };
    ($call:expr, $detail:expr, $hint:expr) => {
        &$crate::error::Site {
            call: $call,
            detail: $detail,
            hint: $hint,
        }
    };
}
/// The crate's own modules name the macro through the module that defines
/// it (`crate::error::site`), not through the crate root where
/// `#[macro_export]` also puts it for users.
pub use site;

/// What went wrong, without the context of which call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A C call failed with an errno value ([`Error::errno`]).
    Os,
    /// A work request completed with an error status ([`Error::wc_status`]).
    Completion,
    /// An argument was refused before reaching the library.
    InvalidArgument,
    /// The named device, port, GID or object does not exist.
    NotFound,
    /// The provider does not implement this (e.g. memory windows, dmabuf).
    Unsupported,
    /// The send or receive queue (as granted by the device) is full.
    QueueFull,
    /// A deadline passed before the operation finished.
    TimedOut,
    /// The queue pair (or object) is not in a state that allows this.
    BadState,
    /// The connection manager delivered another event than the one the
    /// step waits for ([`Error::cm_event`]).
    CmEvent,
    /// A destroy or deregistration failed, so the object and the memory the
    /// device may still reach were leaked rather than freed.
    Leaked,
}

/// A failed call: which one, why, and what to check. 16 bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Error {
    site: &'static Site,
    /// errno, work completion status, or connection-manager status.
    code: i32,
    /// A completion's opcode, or a connection-manager event type.
    aux: u16,
    kind: ErrorKind,
}

const _: () = assert!(core::mem::size_of::<Error>() == 16);
const _: () = assert!(core::mem::size_of::<Result<(), Error>>() == 16);

impl Error {
    /// An error of `kind` at `site`.
    #[cold]
    pub const fn new(site: &'static Site, kind: ErrorKind) -> Error {
        Error {
            site,
            code: 0,
            aux: 0,
            kind,
        }
    }

    /// An argument refused at `site`.
    #[cold]
    pub const fn invalid(site: &'static Site) -> Error {
        Error::new(site, ErrorKind::InvalidArgument)
    }

    /// An errno returned or set by the call at `site`.
    #[cold]
    pub const fn os(site: &'static Site, errno: i32) -> Error {
        Error {
            site,
            code: errno,
            aux: 0,
            kind: ErrorKind::Os,
        }
    }

    /// A work completion with an error status.
    #[cold]
    pub const fn completion(
        site: &'static Site,
        status: ibv_wc_status,
        opcode: ibv_wc_opcode,
    ) -> Error {
        Error {
            site,
            code: status.0 as i32,
            aux: if opcode.0 > u16::MAX as u32 {
                u16::MAX
            } else {
                opcode.0 as u16
            },
            kind: ErrorKind::Completion,
        }
    }

    /// A connection-manager event (`event`, its C value) with `status`
    /// arrived instead of the one the step waits for.
    #[cold]
    pub const fn cm(site: &'static Site, event: u32, status: i32) -> Error {
        Error {
            site,
            code: status,
            aux: if event > u16::MAX as u32 {
                u16::MAX
            } else {
                event as u16
            },
            kind: ErrorKind::CmEvent,
        }
    }

    /// The same error kind and code at another site (e.g. one whose hint
    /// fits the errno).
    #[cold]
    #[must_use]
    pub const fn at(mut self, site: &'static Site) -> Error {
        self.site = site;
        self
    }

    /// The same failure, marked as having leaked what the device may still
    /// reach (a failed destroy); the errno is kept.
    #[cold]
    #[must_use]
    pub const fn leaked(mut self, site: &'static Site) -> Error {
        self.site = site;
        self.kind = ErrorKind::Leaked;
        self
    }

    /// The call (or step) that failed.
    pub const fn call(&self) -> &'static str {
        self.site.call
    }

    /// What was wrong, when there is more to say than the kind.
    pub const fn detail(&self) -> Option<&'static str> {
        if self.site.detail.is_empty() {
            None
        } else {
            Some(self.site.detail)
        }
    }

    /// What to check, when there is known advice: the call's own, else for
    /// a failed completion what its status means and what to check.
    pub fn hint(&self) -> Option<&'static str> {
        if !self.site.hint.is_empty() {
            return Some(self.site.hint);
        }
        match self.kind {
            ErrorKind::Completion => Some(wc_status_explanation(ibv_wc_status(self.code as u32))),
            _ => None,
        }
    }

    /// What went wrong.
    pub const fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The errno, when the failure came from the C library (also for a
    /// failed destroy that leaked).
    pub const fn errno(&self) -> Option<i32> {
        match self.kind {
            ErrorKind::Os | ErrorKind::Leaked if self.code != 0 => Some(self.code),
            _ => None,
        }
    }

    /// The work completion status, when this error is a failed completion.
    pub const fn wc_status(&self) -> Option<ibv_wc_status> {
        match self.kind {
            ErrorKind::Completion => Some(ibv_wc_status(self.code as u32)),
            _ => None,
        }
    }

    /// The opcode of the failed completion (meaningful only as far as the
    /// crate recorded what was posted: a device leaves it undefined on errors).
    pub const fn wc_opcode(&self) -> Option<ibv_wc_opcode> {
        match self.kind {
            ErrorKind::Completion => Some(ibv_wc_opcode(self.aux as u32)),
            _ => None,
        }
    }

    /// True for `WR_FLUSH_ERR`: not a failure of its own but the consequence
    /// of an earlier error that moved the queue pair to the error state.
    pub const fn is_flush(&self) -> bool {
        matches!(self.kind, ErrorKind::Completion)
            && self.code == ibv_wc_status::WR_FLUSH_ERR.0 as i32
    }

    /// The connection-manager event (its C value) and status, for
    /// [`ErrorKind::CmEvent`].
    pub const fn cm_event(&self) -> Option<(u32, i32)> {
        match self.kind {
            ErrorKind::CmEvent => Some((self.aux as u32, self.code)),
            _ => None,
        }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The readable form says everything the fields do.
        write!(f, "Error({self})")
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: ", self.site.call)?;
        let code = self.code;
        match self.kind {
            ErrorKind::Os => write!(f, "{} ({})", errno_name(code), names::errno_text(code))?,
            ErrorKind::Completion => {
                let status = ibv_wc_status(code as u32);
                write!(
                    f,
                    "work completion IBV_WC_{status} (opcode {:?}): {}",
                    ibv_wc_opcode(u32::from(self.aux)),
                    wc_status_explanation(status)
                )?
            }
            ErrorKind::InvalidArgument => f.write_str("invalid argument")?,
            ErrorKind::NotFound => f.write_str("not found")?,
            ErrorKind::Unsupported => f.write_str("not supported by this device or provider")?,
            ErrorKind::QueueFull => f.write_str("queue full")?,
            ErrorKind::TimedOut => f.write_str("deadline passed")?,
            ErrorKind::BadState => f.write_str("wrong state")?,
            ErrorKind::CmEvent => {
                write!(
                    f,
                    "connection manager event {} (status {code}",
                    names::cm_event_name(self.aux)
                )?;
                if code < 0 {
                    write!(f, ", {}", errno_name(-code))?;
                }
                f.write_str(")")?
            }
            ErrorKind::Leaked => {
                f.write_str("leaked: the device may still reach it, so it was never freed")?;
                if code != 0 {
                    write!(f, " ({})", errno_name(code))?;
                }
            }
        }
        if !self.site.detail.is_empty() {
            write!(f, ": {}", self.site.detail)?;
        }
        if !self.site.hint.is_empty() {
            write!(f, "; check: {}", self.site.hint)?;
        }
        Ok(())
    }
}

#[cfg(feature = "std")]
impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    #[test]
    fn small_and_says_what_failed() {
        assert_eq!(core::mem::size_of::<Error>(), 16);
        let e = Error::os(site!("ibv_reg_mr", "", "ulimit -l"), libc::ENOMEM);
        assert_eq!(e.errno(), Some(libc::ENOMEM));
        let text = e.to_string();
        assert!(text.starts_with("ibv_reg_mr failed: ENOMEM"), "{text}");
        assert!(text.ends_with("check: ulimit -l"), "{text}");
        let wc = Error::completion(
            site!("send completion"),
            ibv_wc_status::WR_FLUSH_ERR,
            ibv_wc_opcode::SEND,
        );
        assert!(wc.is_flush());
        assert!(wc.to_string().contains("IBV_WC_WR_FLUSH_ERR"));
        let leak = e.leaked(site!(
            "ibv_destroy_qp",
            "its 3 buffers in flight were leaked"
        ));
        assert_eq!(leak.kind(), ErrorKind::Leaked);
        assert_eq!(leak.errno(), Some(libc::ENOMEM));
    }
}
