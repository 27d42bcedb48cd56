//! Posting one datagram: a Send or Send-with-immediate whose work request
//! also names an address handle, the peer's QPN and its Q_Key (`wr.ud`).
//! Kept apart from the connected sends, whose path stays as it is.

use core::mem::MaybeUninit;

use crate::error::Error;
use crate::memory::NicBuf;
use crate::sgl::{Sgl, MAX_SGE};
use crate::sys;
use crate::wr::SendOp;

use super::build::{send_flags, send_wr, SendMeta};
use super::provider::Provider;
use crate::engine::flights::Flights;
use crate::engine::ring::Ring;

/// Where a datagram goes, as the work request carries it.
pub(crate) struct UdTarget {
    /// A live address handle of the queue pair's protection domain that
    /// stays alive while the request is in `ring` (`ah_table.rs`).
    pub(crate) ah: *mut sys::ibv_ah,
    pub(crate) qpn: u32,
    pub(crate) qkey: u32,
}

/// Posts the datagram `op` of `sgl` to `to` on `qp` and records it at the
/// tail of `ring`, its buffers moved into `flights`. The caller checked the queue pair's transport and state,
/// the ring's room, the opcode (Send or Send-with-immediate), the length
/// against the MTU and, with `inline`, against the grant.
#[allow(clippy::too_many_arguments)] // one per part of the request; one caller
pub(crate) fn send_ud<B: NicBuf, P: Provider>(
    prov: &mut P,
    qp: &P::Qp,
    qp_index: u32,
    flights: &mut Flights<B>,
    ring: &mut Ring,
    max_sge: u32,
    op: &SendOp,
    sgl: &mut Sgl<B>,
    meta: SendMeta,
    solicited: bool,
    inline: bool,
    to: &UdTarget,
) -> Result<(), Error> {
    let mut sges = [const { MaybeUninit::<sys::ibv_sge>::uninit() }; MAX_SGE];
    let (num, _) = sgl.build(max_sge, &mut sges)?;
    let flags = send_flags(meta.signaled, false, solicited, inline);
    let mut wr = send_wr(
        op,
        crate::engine::id::ring(false, qp_index, ring.next_seq()),
        flags,
    );
    wr.num_sge = num;
    wr.sg_list = sges.as_mut_ptr().cast();
    wr.wr.ud = sys::ibv_send_wr_ud {
        ah: to.ah,
        remote_qpn: to.qpn,
        remote_qkey: to.qkey,
    };
    // SAFETY: the first `num` entries (all the provider reads) were built
    // just now from `sgl` (registered
    // buffers, ranges inside them) and `sgl` moves into its table entry
    // below, emptied only by a completion of it or a later request (module
    // docs).
    // The address handle is live and stays so while the request is in
    // flight: the engine's table destroys a handle only when no UD queue pair
    // has a send in flight, and never once a queue pair was leaked
    // (`ah_table.rs`, checked by `Engine::remove_ah`). The request and its
    // entries live on this frame for the call.
    unsafe { prov.post_send(qp, core::slice::from_mut(&mut wr)) }.map_err(|f| f.error)?;
    flights.push(ring, meta.tag, meta.opcode, sgl);
    Ok(())
}
