//! Datagrams (primer 1.4, UD): a queue pair that sends to any peer, each
//! message addressed on its own by an address handle the engine owns
//! ([`AhId`]), the peer's QPN and its Q_Key. The states without a peer
//! (INIT with the Q_Key, RTR, RTS with a PSN), the send with its checks
//! (Send only, at most the MTU), and the address handles' lifetime.
//!
//! Receives are the connected queue pairs' (`post_recv`, the same rings);
//! each starts with [`GRH_LEN`](crate::grh::GRH_LEN) bytes of header (`crate::grh`).

use crate::endpoint::Mtu;
use crate::error::{site, Error, ErrorKind};
use crate::gid::Gid;
use crate::memory::NicBuf;
use crate::sys::{self, ibv_qp_attr_mask as M, Zeroed};
use crate::wr::{SendOp, SendRequest};

use super::ah_table::AhId;
use super::check::{cannot_send, completes_as, engine_full, post_hint};
use super::config::Transport;
use super::core::Engine;
use super::doorbell::{self, Provider, SendMeta, UdTarget, Verbs};
use super::post::PostError;
use super::qp_slot::{signal_decision, QpId, QpSlot, QpState};

/// Where a datagram goes: an address handle of the engine (the peer's
/// port), the peer's queue pair number and the Q_Key it accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UdDest {
    /// The route to the peer's port ([`Engine::create_ah`]).
    pub ah: AhId,
    /// The peer's queue pair (24 bits).
    pub qpn: u32,
    /// The Q_Key the peer's queue pair was created with.
    pub qkey: u32,
}

/// The hop limit of the address handles the engine creates (as
/// [`super::ConnectOptions::hop_limit`]; on RoCE the kernel uses the IP
/// route's).
const HOP_LIMIT: u8 = 64;

impl<B: NicBuf> Engine<B, Verbs> {
    /// Moves the UD queue pair `qp` from INIT to RTS (RTR, then RTS with its
    /// send PSN): no peer, no path; each send names its destination.
    pub fn ready_ud(&mut self, qp: QpId) -> Result<(), Error> {
        let slot = self.slot_mut(qp)?;
        if slot.transport != Transport::Ud {
            return Err(not_ud());
        }
        if slot.state != QpState::INIT {
            return Err(Error::new(
                site!(
                    "ready_ud",
                    "a UD queue pair is readied from INIT",
                    "reset() it (back to INIT) first"
                ),
                ErrorKind::BadState,
            ));
        }
        let mut attr = sys::ibv_qp_attr::zeroed();
        attr.qp_state = QpState::RTR;
        slot.qp
            .as_ref()
            .ok_or(Error::invalid(site!("queue pair")))?
            .modify(site!("ibv_modify_qp(UD INIT->RTR)"), &mut attr, M::STATE)?;
        slot.set_state(QpState::RTR);
        let mut attr = sys::ibv_qp_attr::zeroed();
        attr.qp_state = QpState::RTS;
        attr.sq_psn = slot.info.psn;
        slot.qp
            .as_ref()
            .ok_or(Error::invalid(site!("queue pair")))?
            .modify(
                site!("ibv_modify_qp(UD RTR->RTS)"),
                &mut attr,
                M::STATE | M::SQ_PSN,
            )?;
        slot.set_state(QpState::RTS);
        Ok(())
    }

    /// An address handle to the port with `gid` (RoCE, or InfiniBand with a
    /// GRH) or `lid` (InfiniBand, `gid` zero), from `qp`'s port and GID.
    /// The engine owns it: it lives until [`Engine::remove_ah`] or the
    /// engine's end, and only this engine's queue pairs can send with it
    /// (so only queue pairs of its protection domain and device).
    pub fn create_ah(&mut self, qp: QpId, gid: Gid, lid: u16) -> Result<AhId, Error> {
        let info = self.slot(qp)?.info;
        let mut attr = sys::ibv_ah_attr {
            dlid: lid,
            port_num: info.config.port,
            ..Default::default()
        };
        if !gid.is_zero() {
            let local = info.gid.ok_or(Error::new(
                site!(
                    "ibv_create_ah",
                    "a GID destination needs a local GID, and this port has none",
                    "RoCE needs an IP address on the network device"
                ),
                ErrorKind::NotFound,
            ))?;
            attr.is_global = 1;
            attr.grh.dgid.raw = gid.raw();
            attr.grh.sgid_index = u8::try_from(local.index)
                .map_err(|_| Error::invalid(site!("ibv_create_ah", "GID index above 255")))?;
            attr.grh.hop_limit = HOP_LIMIT;
        } else if lid == 0 {
            return Err(Error::invalid(site!(
                "ibv_create_ah",
                "neither a GID nor a LID to address",
                "RoCE addresses by GID (the peer's Endpoint::gid)"
            )));
        }
        let raw = crate::raw::RawAh::create(&self.prov.pd.raw, &attr)?;
        Ok(self.ahs.insert(self.id, raw))
    }

    /// Destroys the address handle `ah`. Refused while any UD queue pair of
    /// the engine has a send in flight (poll them first): a posted send may
    /// name it, and the device reads it until the send completes.
    pub fn remove_ah(&mut self, ah: AhId) -> Result<(), Error> {
        self.ahs.get(self.id, ah)?;
        let busy = self
            .qps
            .iter()
            .any(|s| s.is_live() && s.transport == Transport::Ud && s.send.len() > 0);
        if busy {
            return Err(Error::new(
                site!(
                    "remove_ah",
                    "a UD send is in flight on this engine and may name this address handle",
                    "poll until the UD queue pairs' sends have completed"
                ),
                ErrorKind::BadState,
            ));
        }
        drop(self.ahs.take(self.id, ah)?);
        Ok(())
    }

    /// Address handles the engine holds.
    pub fn ah_count(&self) -> usize {
        self.ahs.len()
    }
}

impl<B: NicBuf, P: Provider> Engine<B, P> {
    /// The largest datagram `qp` sends or receives: its port's active MTU
    /// (read when it was created), at most [`super::QpConfig::max_mtu`].
    /// A receive buffer needs [`GRH_LEN`](crate::grh::GRH_LEN) bytes more.
    pub fn ud_max_payload(&self, qp: QpId) -> Result<u32, Error> {
        let slot = self.slot(qp)?;
        if slot.transport != Transport::Ud {
            return Err(not_ud());
        }
        Ok(max_payload(slot))
    }

    /// Posts the datagram `req` (Send or Send-with-immediate) on the UD
    /// queue pair `qp` to `dest`. Its buffers belong to the engine until
    /// [`Engine::poll`] hands them back with the completion, as any send's;
    /// the address handle stays alive at least as long. Refused before
    /// anything is posted: an RDMA operation, a message above
    /// [`Engine::ud_max_payload`], an address handle of another engine or
    /// a removed one.
    #[allow(clippy::result_large_err)] // the request comes back unboxed: no allocation
    pub fn post_ud_send(
        &mut self,
        qp: QpId,
        dest: &UdDest,
        mut req: SendRequest<B>,
    ) -> Result<(), PostError<SendRequest<B>>> {
        let refuse = |error, request| Err(PostError { error, request });
        // Copied out before the slot is borrowed: the table is not touched
        // again in this call, and keeps the handle while the send is in flight.
        let ah = match self.ahs.get(self.id, dest.ah) {
            Ok(ah) => ah.as_ptr(),
            Err(e) => return refuse(e, req),
        };
        let (prov, slot, flights) = match self.parts(qp) {
            Ok(s) => s,
            Err(e) => return refuse(e, req),
        };
        if let Err(e) = check_ud_send(slot, dest, &req) {
            return refuse(e, req);
        }
        let flights = &mut flights[0];
        if flights.available() == 0 {
            return refuse(engine_full(), req);
        }
        let mut run = slot.unsignaled_run;
        let asked = req.flags.signaled || flights.crowded(0);
        let signaled = signal_decision(&mut run, slot.send.half(), asked, 0);
        let meta = SendMeta {
            tag: req.tag,
            opcode: completes_as(&req.op),
            signaled,
        };
        let Some(handle) = slot.qp.as_ref() else {
            return refuse(Error::invalid(site!("queue pair")), req);
        };
        let to = UdTarget {
            ah,
            qpn: dest.qpn,
            qkey: dest.qkey,
        };
        let (op, f) = (req.op, req.flags);
        match doorbell::send_ud(
            prov,
            handle,
            qp.index,
            flights,
            &mut slot.send,
            slot.caps.max_send_sge,
            &op,
            &mut req.sgl,
            meta,
            f.solicited,
            f.inline,
            &to,
        ) {
            Ok(()) => {
                slot.unsignaled_run = run;
                Ok(())
            }
            Err(e) => refuse(post_hint(e), req),
        }
    }
}

/// The MTU's bytes for `slot` (UD): its port's active MTU, at most the
/// configured bound.
fn max_payload<Q>(slot: &QpSlot<Q>) -> u32 {
    let code = slot
        .info
        .port
        .active_mtu()
        .0
        .min(slot.info.config.max_mtu.0);
    Mtu(code).bytes().unwrap_or(256)
}

/// Everything a datagram is checked for before the device sees it.
fn check_ud_send<B: NicBuf, Q>(
    slot: &QpSlot<Q>,
    dest: &UdDest,
    req: &SendRequest<B>,
) -> Result<(), Error> {
    if slot.transport != Transport::Ud {
        return Err(not_ud());
    }
    if slot.state != QpState::RTS || slot.send.len() >= slot.send.capacity() {
        return Err(cannot_send(slot.state));
    }
    if !matches!(req.op, SendOp::Send | SendOp::SendImm(_)) {
        return Err(Error::new(
            site!(
                "post_ud_send",
                "UD carries Send and Send-with-immediate only: no RDMA Write, Read or atomics (primer 1.4)",
                "use an RC queue pair for one-sided operations"
            ),
            ErrorKind::Unsupported,
        ));
    }
    let len = req.sgl.total_len() as u64;
    if len > u64::from(max_payload(slot)) {
        return Err(Error::invalid(site!(
            "post_ud_send",
            "a datagram is larger than the MTU (the port's active MTU, at most QpConfig::max_mtu): refused before posting",
            "Engine::ud_max_payload is the limit; split the message, or use RC"
        )));
    }
    if req.flags.inline && len > u64::from(slot.caps.max_inline_data) {
        return Err(Error::invalid(site!(
            "post_send(inline)",
            "inline data larger than the max_inline_data the device granted"
        )));
    }
    if dest.qpn > crate::endpoint::MAX_PSN {
        return Err(Error::invalid(site!(
            "post_ud_send",
            "a queue pair number has 24 bits"
        )));
    }
    Ok(())
}

#[cold]
fn not_ud() -> Error {
    Error::new(
        site!(
            "UD call",
            "not a UD queue pair",
            "QpConfig::transport = Transport::Ud"
        ),
        ErrorKind::BadState,
    )
}
