//! The simulated device for tests of the layers above the engine (the
//! transfer's): an engine on it, queue pairs placed in it, and which of
//! the device's queue pairs a handle names.

use crate::engine::core::Engine;
use crate::engine::doorbell::Provider;
use crate::engine::qp_slot::{QpId, QpInfo, QpState};
use crate::error::Error;
use crate::memory::NicBuf;
use crate::sys;

use super::device::{Sim, SimDevice};

/// An engine on a fresh simulated device whose CQ holds `cqe` entries.
pub(crate) fn engine<B: NicBuf>(seed: u64, cqe: u32) -> Engine<B, Sim> {
    Engine::assemble(
        Sim {
            dev: SimDevice::new(seed),
        },
        (),
        cqe,
        None,
        None,
        false,
    )
}

/// A queue pair `depth` requests deep both ways, one entry per request,
/// placed in `engine` and in INIT.
pub(crate) fn add_qp<B: NicBuf>(engine: &mut Engine<B, Sim>, depth: u32) -> Result<QpId, Error> {
    let (handle, qp_num) = engine.prov.dev.add_qp([depth as usize; 2], 1);
    place(engine, handle, qp_num, depth, QpState::INIT)
}

/// Places the provider's queue pair `handle`, numbered `qp_num`, in
/// `engine`: `depth` requests deep both ways, one entry per request, in
/// `state`.
pub(crate) fn place<B: NicBuf, P: Provider>(
    engine: &mut Engine<B, P>,
    handle: P::Qp,
    qp_num: u32,
    depth: u32,
    state: QpState,
) -> Result<QpId, Error> {
    let caps = sys::ibv_qp_cap {
        max_send_wr: depth,
        max_recv_wr: depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = engine
        .place(handle, qp_num, depth, depth, caps, QpInfo::default())
        .map_err(|(e, _)| e)?;
    engine.mark_state(qp, state)?;
    Ok(qp)
}

/// The device's index of the queue pair `qp` names, while it is live.
pub(crate) fn device_qp<B: NicBuf>(engine: &Engine<B, Sim>, qp: QpId) -> Option<usize> {
    engine.slot(qp).ok()?.qp.as_ref().map(|h| h.0)
}
