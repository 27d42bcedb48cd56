//! Names and meanings: errno values, work completion statuses (with the
//! primer's advice, section 7.4) and connection-manager events.

use crate::sys::ibv_wc_status;

/// The meaning of a work completion status, with what to check for the
/// statuses the primer (section 7.4) names.
pub fn wc_status_explanation(status: ibv_wc_status) -> &'static str {
    match status {
        ibv_wc_status::SUCCESS => "success",
        ibv_wc_status::LOC_LEN_ERR => {
            "local length error: a received message is longer than the posted receive buffer \
             (post receives as large as the largest message the peer sends), or a \
             scatter/gather entry is longer than its memory region"
        }
        ibv_wc_status::LOC_QP_OP_ERR => {
            "local QP operation error: the request is inconsistent with the QP (e.g. inline data \
             above max_inline_data, or too many SGEs); on Soft-RoCE also a received message \
             longer than the posted receive buffer (post receives as large as the largest \
             message the peer sends), or a packet that could not be sent: port or netdev down"
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
            "remote invalid request: the responder refused the operation: a Send longer than \
             the receive the peer posted (post larger receives there, or send less), QP access \
             flags missing REMOTE_WRITE/READ/ATOMIC, or an unaligned atomic"
        }
        ibv_wc_status::REM_ACCESS_ERR => {
            "remote access error: wrong rkey (an lkey used as rkey?), an address range outside the \
             peer's region, or the region/window lacks REMOTE_WRITE/READ/ATOMIC"
        }
        ibv_wc_status::REM_OP_ERR => {
            "remote operation error: the responder could not complete the operation; on \
             Soft-RoCE also a Send longer than the receive the peer posted (post larger \
             receives there, or send less)"
        }
        ibv_wc_status::RETRY_EXC_ERR => {
            "transport retry counter exceeded: no ACK from the peer; check the peer is alive and \
             connected, the GID index, is_global for the link layer, LID (InfiniBand), the MTU \
             and the network (cable, switch, PFC)"
        }
        ibv_wc_status::RNR_RETRY_EXC_ERR => {
            "receiver-not-ready retry exceeded: the peer had no receive posted for a send; post \
             receives before the peer sends, or raise rnr_retry (7, the default, waits for a \
             receive forever; the port's RNR counters show the waiting: `rdma statistic show`)"
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

pub(crate) fn errno_text(errno: i32) -> &'static str {
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

/// `RDMA_CM_EVENT_<name>` of a connection-manager event's C value.
pub(crate) fn cm_event_name(event: u16) -> &'static str {
    const NAMES: [&str; 16] = [
        "ADDR_RESOLVED",
        "ADDR_ERROR",
        "ROUTE_RESOLVED",
        "ROUTE_ERROR",
        "CONNECT_REQUEST",
        "CONNECT_RESPONSE",
        "CONNECT_ERROR",
        "UNREACHABLE",
        "REJECTED",
        "ESTABLISHED",
        "DISCONNECTED",
        "DEVICE_REMOVAL",
        "MULTICAST_JOIN",
        "MULTICAST_ERROR",
        "ADDR_CHANGE",
        "TIMEWAIT_EXIT",
    ];
    NAMES.get(usize::from(event)).copied().unwrap_or("UNKNOWN")
}
