//! One error type for every fallible call: what failed, the errno or work
//! completion status by name, and for the primer's classic pitfalls what to
//! check.

use core::fmt;

use crate::sys::{ibv_wc_opcode, ibv_wc_status};

/// What went wrong, without the context of which call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A C call failed with this errno value.
    Os(i32),
    /// A work request completed with an error status.
    Completion(WcError),
    /// An argument was refused before reaching the library.
    InvalidArgument,
    /// The named device, port or GID does not exist.
    NotFound,
    /// The provider does not implement this (e.g. memory windows, dmabuf).
    Unsupported,
    /// The send or receive queue (as granted by the device) is full.
    QueueFull,
    /// A deadline passed before the operation finished.
    TimedOut,
    /// The queue pair is not in a state that allows this.
    BadState,
    /// The connection manager delivered this event (and status) instead of
    /// the one the step waits for.
    CmEvent {
        /// The event's name, e.g. `"REJECTED"` (`RDMA_CM_EVENT_REJECTED`).
        event: &'static str,
        /// The event's status (a negative errno, or a reject reason).
        status: i32,
    },
}

/// A failed call: which one, why, and what to check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Error {
    call: &'static str,
    kind: ErrorKind,
    detail: &'static str,
    hint: &'static str,
}

impl Error {
    /// An error from `call` of the given kind.
    #[cold]
    pub const fn new(call: &'static str, kind: ErrorKind) -> Error {
        Error {
            call,
            kind,
            detail: "",
            hint: "",
        }
    }

    /// An errno returned or set by `call`.
    #[cold]
    pub const fn os(call: &'static str, errno: i32) -> Error {
        Error::new(call, ErrorKind::Os(errno))
    }

    /// An argument refused by `call`, with what was wrong.
    #[cold]
    pub const fn invalid(call: &'static str, detail: &'static str) -> Error {
        Error {
            call,
            kind: ErrorKind::InvalidArgument,
            detail,
            hint: "",
        }
    }

    /// The same error with a sentence of detail.
    #[must_use]
    pub const fn with_detail(mut self, detail: &'static str) -> Error {
        self.detail = detail;
        self
    }

    /// The same error with advice on what to check.
    #[must_use]
    pub const fn with_hint(mut self, hint: &'static str) -> Error {
        self.hint = hint;
        self
    }

    /// The call (or step) that failed, e.g. `"ibv_modify_qp(INIT->RTR)"`.
    pub const fn call(&self) -> &'static str {
        self.call
    }

    /// What went wrong.
    pub const fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The errno, when the failure came from the C library.
    pub const fn errno(&self) -> Option<i32> {
        match self.kind {
            ErrorKind::Os(e) => Some(e),
            _ => None,
        }
    }

    /// The work completion error, when this error is one.
    pub const fn completion(&self) -> Option<WcError> {
        match self.kind {
            ErrorKind::Completion(wc) => Some(wc),
            _ => None,
        }
    }

    /// What to check, when there is known advice.
    pub const fn hint(&self) -> Option<&'static str> {
        if self.hint.is_empty() {
            None
        } else {
            Some(self.hint)
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: ", self.call)?;
        match self.kind {
            ErrorKind::Os(e) => write!(f, "{} ({})", errno_name(e), errno_text(e))?,
            ErrorKind::Completion(wc) => write!(f, "{wc}")?,
            ErrorKind::InvalidArgument => f.write_str("invalid argument")?,
            ErrorKind::NotFound => f.write_str("not found")?,
            ErrorKind::Unsupported => f.write_str("not supported by this device or provider")?,
            ErrorKind::QueueFull => f.write_str("queue full")?,
            ErrorKind::TimedOut => f.write_str("deadline passed")?,
            ErrorKind::BadState => f.write_str("queue pair in the wrong state")?,
            ErrorKind::CmEvent { event, status } => {
                write!(
                    f,
                    "connection manager event RDMA_CM_EVENT_{event} (status {status}"
                )?;
                if status < 0 {
                    write!(f, ", {}", errno_name(-status))?;
                }
                f.write_str(")")?
            }
        }
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        if !self.hint.is_empty() {
            write!(f, "; check: {}", self.hint)?;
        }
        Ok(())
    }
}

#[cfg(feature = "std")]
impl std::error::Error for Error {}

/// A work completion with an error status, and what it means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WcError {
    /// The status the device reported.
    pub status: ibv_wc_status,
    /// The opcode of the completion (for flushed receives, often meaningless).
    pub opcode: ibv_wc_opcode,
    /// The caller's tag of the work request.
    pub wr_id: u64,
    /// The provider's vendor error code.
    pub vendor_err: u32,
}

impl WcError {
    /// True for `WR_FLUSH_ERR`: not a failure of its own but the consequence
    /// of an earlier error that moved the queue pair to the error state.
    pub fn is_flush(&self) -> bool {
        self.status == ibv_wc_status::WR_FLUSH_ERR
    }

    /// The primer's meaning of the status and what to check.
    pub fn explanation(&self) -> &'static str {
        wc_status_explanation(self.status)
    }
}

impl fmt::Display for WcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "work completion IBV_WC_{} (opcode {:?}, wr_id {}, vendor_err {:#x}): {}",
            self.status,
            self.opcode,
            self.wr_id,
            self.vendor_err,
            self.explanation()
        )
    }
}

/// The meaning of a work completion status, with what to check for the
/// statuses the primer (section 7.4) names.
pub fn wc_status_explanation(status: ibv_wc_status) -> &'static str {
    match status {
        ibv_wc_status::SUCCESS => "success",
        ibv_wc_status::LOC_LEN_ERR => {
            "local length error: a scatter/gather entry is longer than its memory region, \
             or a received message is longer than the posted receive buffer"
        }
        ibv_wc_status::LOC_QP_OP_ERR => {
            "local QP operation error: the request is inconsistent with the QP (e.g. inline data \
             above max_inline_data, or too many SGEs), or (Soft-RoCE) the packet could not be sent: port or netdev down"
        }
        ibv_wc_status::LOC_PROT_ERR => {
            "local protection error: wrong lkey (an rkey used as lkey?), an SGE outside its region, \
             or the region lacks LOCAL_WRITE for a read/receive/atomic result"
        }
        ibv_wc_status::WR_FLUSH_ERR => {
            "flushed: the QP had already entered the error state because of an earlier error; \
             look at the first non-flush error completion"
        }
        ibv_wc_status::MW_BIND_ERR => "memory window bind error: check the region has MW_BIND access and the range",
        ibv_wc_status::BAD_RESP_ERR => "bad response from the responder",
        ibv_wc_status::LOC_ACCESS_ERR => "local access error: check the local region's access flags",
        ibv_wc_status::REM_INV_REQ_ERR => {
            "remote invalid request: the responder refused the operation (QP access flags missing \
             REMOTE_WRITE/READ/ATOMIC, message too long, or an unaligned atomic)"
        }
        ibv_wc_status::REM_ACCESS_ERR => {
            "remote access error: wrong rkey (an lkey used as rkey?), an address range outside the \
             peer's region, or the region/window lacks REMOTE_WRITE/READ/ATOMIC"
        }
        ibv_wc_status::REM_OP_ERR => "remote operation error: the responder could not complete the operation",
        ibv_wc_status::RETRY_EXC_ERR => {
            "transport retry counter exceeded: no ACK from the peer; check the peer is alive and \
             connected, the GID index, is_global for the link layer, LID (InfiniBand), the MTU \
             and the network (cable, switch, PFC)"
        }
        ibv_wc_status::RNR_RETRY_EXC_ERR => {
            "receiver-not-ready retry exceeded: the peer had no receive posted for a send; post \
             receives before the peer sends, or raise rnr_retry"
        }
        ibv_wc_status::REM_ABORT_ERR => "remote aborted the operation",
        ibv_wc_status::FATAL_ERR => "fatal device error",
        ibv_wc_status::RESP_TIMEOUT_ERR => "response timeout",
        ibv_wc_status::GENERAL_ERR => "general error",
        _ => "see ibv_wc_status_str",
    }
}

/// The symbolic name of an errno value (`EINVAL`), or `"errno"` if unknown.
pub fn errno_name(errno: i32) -> &'static str {
    use libc::*;
    match errno {
        EPERM => "EPERM",
        ENOENT => "ENOENT",
        EINTR => "EINTR",
        EIO => "EIO",
        ENXIO => "ENXIO",
        E2BIG => "E2BIG",
        EBADF => "EBADF",
        EAGAIN => "EAGAIN",
        ENOMEM => "ENOMEM",
        EACCES => "EACCES",
        EFAULT => "EFAULT",
        EBUSY => "EBUSY",
        EEXIST => "EEXIST",
        ENODEV => "ENODEV",
        EINVAL => "EINVAL",
        ENFILE => "ENFILE",
        EMFILE => "EMFILE",
        ENOSPC => "ENOSPC",
        ERANGE => "ERANGE",
        ENOSYS => "ENOSYS",
        EPROTONOSUPPORT => "EPROTONOSUPPORT",
        EOPNOTSUPP => "EOPNOTSUPP",
        EADDRNOTAVAIL => "EADDRNOTAVAIL",
        ENETUNREACH => "ENETUNREACH",
        ECONNRESET => "ECONNRESET",
        ETIMEDOUT => "ETIMEDOUT",
        ECONNREFUSED => "ECONNREFUSED",
        EHOSTUNREACH => "EHOSTUNREACH",
        _ => "errno",
    }
}

fn errno_text(errno: i32) -> &'static str {
    use libc::*;
    match errno {
        EPERM => "operation not permitted",
        ENOENT => "no such entry",
        EINVAL => "invalid argument",
        ENOMEM => "out of memory or memlock limit reached (check `ulimit -l`)",
        EACCES => "permission denied",
        EFAULT => "bad address",
        EBUSY => "resource busy (still in use by a child object?)",
        ENODEV => "no such device",
        EAGAIN => "try again",
        ENOSPC => "no space left",
        EOPNOTSUPP => "operation not supported",
        ETIMEDOUT => "timed out",
        ENOSYS => "not implemented",
        _ => "see errno",
    }
}
