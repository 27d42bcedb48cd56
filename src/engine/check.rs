//! What a send is checked for before the device sees it: what the queue
//! pair's state, transport and grants allow, and what the NIC would
//! otherwise refuse late (a Read longer than its remote slice, an atomic
//! on an unaligned word, inline data above the grant).

use crate::error::{site, Error, ErrorKind};
use crate::sys::ibv_wc_opcode as WcOpcode;
use crate::wr::{RemoteSlice, SendOp};

use super::config::Transport;
use super::doorbell::check_atomic_result;
use super::qp_slot::{QpSlot, QpState};

/// The opcode a successful completion of `op` reports.
#[inline(always)]
pub(crate) fn completes_as(op: &SendOp) -> WcOpcode {
    match op {
        SendOp::Write(_) | SendOp::WriteImm(..) => WcOpcode::RDMA_WRITE,
        SendOp::Read(_) => WcOpcode::RDMA_READ,
        SendOp::Send | SendOp::SendImm(_) => WcOpcode::SEND,
        SendOp::FetchAdd { .. } => WcOpcode::FETCH_ADD,
        SendOp::CompareSwap { .. } => WcOpcode::COMP_SWAP,
    }
}

/// Checks `op` on `local_len` bytes (inline or not) against the queue pair.
#[inline]
pub(crate) fn check_send<Q>(
    slot: &QpSlot<Q>,
    op: &SendOp,
    local_len: u64,
    inline: bool,
) -> Result<(), Error> {
    check_send_on(SendLimits::of(slot), op, local_len, inline)
}

/// What [`check_send_on`] checks a send against: copied out of the slot,
/// so a post can check once it knows the length (`Sgl::build`), while it
/// holds the slot's queue.
#[derive(Clone, Copy)]
pub(crate) struct SendLimits {
    transport: Transport,
    max_inline_data: u32,
}

impl SendLimits {
    #[inline(always)]
    pub(crate) fn of<Q>(slot: &QpSlot<Q>) -> SendLimits {
        SendLimits {
            transport: slot.transport,
            max_inline_data: slot.caps.max_inline_data,
        }
    }
}

/// [`check_send`] against `limits`.
#[inline]
pub(crate) fn check_send_on(
    limits: SendLimits,
    op: &SendOp,
    local_len: u64,
    inline: bool,
) -> Result<(), Error> {
    let remote = |r: &RemoteSlice| {
        if local_len > r.len {
            return Err(Error::invalid(site!(
                "post_send",
                "local data longer than the remote slice",
                "a Read or Write moves at most the remote slice's length"
            )));
        }
        Ok(())
    };
    match op {
        SendOp::Write(r) | SendOp::WriteImm(r, _) => remote(r)?,
        SendOp::Read(r) => {
            refuse_on_uc(limits.transport)?;
            remote(r)?
        }
        SendOp::Send | SendOp::SendImm(_) => {}
        SendOp::FetchAdd { remote, .. } | SendOp::CompareSwap { remote, .. } => {
            refuse_on_uc(limits.transport)?;
            // The result lands in the local buffer: exactly one word.
            check_atomic_result(op, local_len)?;
            if remote.addr % 8 != 0 || remote.len < 8 {
                return Err(Error::invalid(site!(
                    "post_send(atomic)",
                    "the remote target must be an 8-byte aligned word",
                    "atomics work on 8-byte aligned 64-bit words"
                )));
            }
        }
    }
    if inline {
        let too_long = local_len > u64::from(limits.max_inline_data);
        let no_data_out = matches!(
            op,
            SendOp::Read(_) | SendOp::FetchAdd { .. } | SendOp::CompareSwap { .. }
        );
        if too_long || no_data_out {
            return Err(inline_refused(too_long));
        }
    }
    Ok(())
}

#[inline]
fn refuse_on_uc(transport: Transport) -> Result<(), Error> {
    if transport == Transport::Uc {
        return Err(Error::new(
            site!(
                "post_send",
                "UC queue pairs carry Write and Send only: no RDMA Read, no atomics (primer 1.4)",
                "use an RC queue pair for Reads and atomics"
            ),
            ErrorKind::Unsupported,
        ));
    }
    Ok(())
}

#[cold]
fn inline_refused(too_long: bool) -> Error {
    if too_long {
        return Error::invalid(site!(
            "post_send(inline)",
            "inline data larger than the max_inline_data the device granted",
            "use a registered buffer, or ask for more max_inline_data in QpConfig"
        ));
    }
    Error::invalid(site!(
        "post_send(inline)",
        "only Write, Write-with-immediate and Send can be inline"
    ))
}

/// Why a send cannot be posted now on `slot`: a UD queue pair (its sends
/// go through `post_ud_send`), the state, or a full queue.
#[cold]
pub(crate) fn cannot_send_on<Q>(slot: &QpSlot<Q>) -> Error {
    if slot.transport == Transport::Ud {
        return Error::new(
            site!(
                "post_send",
                "a UD queue pair's sends name their destination",
                "post_ud_send (Send and Send-with-immediate only)"
            ),
            ErrorKind::Unsupported,
        );
    }
    cannot_send(slot.state)
}

/// Why a send cannot be posted now: the state, or a full queue.
#[cold]
pub(crate) fn cannot_send(state: QpState) -> Error {
    if state != QpState::RTS {
        return Error::new(
            site!(
                "post_send",
                "sends need the queue pair in RTS",
                "connect() first; after an error completion the QP is in ERR: reset() it"
            ),
            ErrorKind::BadState,
        );
    }
    Error::new(
        site!(
            "post_send",
            "the send queue holds max_send_wr requests in flight",
            "poll completions to return buffers, or create the QP with a deeper send queue"
        ),
        ErrorKind::QueueFull,
    )
}

/// The engine's completion queue has room for no more requests in flight.
#[cold]
pub(crate) fn engine_full() -> Error {
    Error::new(
        site!(
            "post",
            "the engine has as many requests in flight as its completion queue holds completions",
            "poll completions to retire requests, or a larger EngineConfig::cq_depth"
        ),
        ErrorKind::QueueFull,
    )
}

/// Why a receive cannot be posted now.
#[cold]
pub(crate) fn cannot_recv(state: QpState, has_srq: bool) -> Error {
    if has_srq {
        Error::new(
            site!(
                "post_recv",
                "this engine's queue pairs receive through its shared receive queue",
                "post_srq_recv"
            ),
            ErrorKind::BadState,
        )
    } else if state == QpState::RESET || state == QpState::ERR {
        Error::new(
            site!("post_recv", "receives need INIT, RTR or RTS"),
            ErrorKind::BadState,
        )
    } else {
        Error::new(
            site!(
                "post_recv",
                "max_recv_wr receives already posted",
                "poll receives first"
            ),
            ErrorKind::QueueFull,
        )
    }
}

/// A refused post's hint, by errno.
#[cold]
pub(crate) fn post_hint(e: Error) -> Error {
    match e.errno() {
        Some(libc::ENOMEM) => e.at(site!(
            "ibv_post_send",
            "",
            "the queue is full on the device side: poll completions"
        )),
        Some(libc::EINVAL) => e.at(site!(
            "ibv_post_send",
            "",
            "too many SGEs, inline data above max_inline_data, or a bad opcode for the transport"
        )),
        _ => e,
    }
}

/// A UD receive's refusal: room for the GRH and at least one byte.
#[cold]
pub(crate) fn ud_recv_too_short() -> Error {
    Error::invalid(site!(
        "post_recv(UD)",
        "a UD receive needs GRH_LEN (40) bytes for the routing header plus room for the payload",
        "post buffers of at least GRH_LEN + Engine::ud_max_payload bytes"
    ))
}

/// The shortest UD receive accepted.
pub(crate) const MIN_UD_RECV: usize = crate::grh::GRH_LEN + 1;

/// What preparing a request on a UD queue pair refuses (setup time): a
/// send (it would name no destination), a receive without room for the GRH.
pub(crate) fn check_prepare_ud<Q>(slot: &QpSlot<Q>, send: bool, len: usize) -> Result<(), Error> {
    if slot.transport != Transport::Ud {
        return Ok(());
    }
    if send {
        return Err(cannot_send_on(slot));
    }
    if len < MIN_UD_RECV {
        return Err(ud_recv_too_short());
    }
    Ok(())
}
