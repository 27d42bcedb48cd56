//! The transfer on the engine's simulated device (tests only): a plane's
//! control path on the simulation ([`PlaneDevice`] for its engine), a bed
//! of planes and paths, and a device the tests drive by hand (complete,
//! fail, refuse a reset or a destroy).

use alloc::vec::Vec;
use std::time::Duration;

use crate::endpoint::{Endpoint, Mtu, RemoteRegion};
use crate::engine::sim::device::{Sim, SimBuf};
use crate::engine::sim::{model, seam};
use crate::engine::{CompletionRef, ConnectOptions, Engine, QpConfig, QpId, QpState};
use crate::error::Error;
use crate::sys::ibv_event_type as Event;
use crate::time::Deadline;

use super::config::{PeerControl, Plane, TransferConfig, TransferOp};
use super::device::{PlaneDevice, PlaneEngine};
use super::spray::Transfer;

/// Bytes per chunk: one simulated buffer.
pub(crate) const CHUNK: u64 = 4096;

impl PlaneDevice<SimBuf, Sim> for Engine<SimBuf, Sim> {
    fn describe(&self, qp: QpId) -> Result<(u32, u32, u32), Error> {
        Ok((self.qp_num(qp)?, 0, 1024))
    }

    fn fresh_qp(&mut self, config: &QpConfig) -> Result<(QpId, Endpoint), Error> {
        let qp = seam::add_qp(self, config.max_send_wr.max(1))?;
        Ok((qp, endpoint(self.qp_num(qp)?)))
    }

    fn connect_qp(&mut self, qp: QpId, _: &Endpoint, _: &ConnectOptions) -> Result<u32, Error> {
        self.mark_state(qp, QpState::RTS)?;
        Ok(1024)
    }

    fn reset_qp(
        &mut self,
        qp: QpId,
        _: Deadline,
        mut on_done: impl FnMut(CompletionRef<'_, SimBuf, Sim>),
    ) -> Result<(), Error> {
        // The simulated device flushes at once: a few polls take it all.
        let mut polls = 0;
        self.flush_to_reset(
            qp,
            || {
                polls += 1;
                polls < 4
            },
            &mut on_done,
        )?;
        self.mark_state(qp, QpState::INIT)
    }

    fn port_active(&self, _: u8) -> bool {
        true
    }

    fn next_port_event(&self) -> Result<Option<Event>, Error> {
        Ok(None)
    }
}

fn endpoint(qpn: u32) -> Endpoint {
    Endpoint {
        qpn,
        psn: 0,
        lid: 0,
        gid: Default::default(),
        mtu: Mtu::MTU_1024,
        regions: Vec::new(),
    }
}

/// The far end: answers every reconnection.
pub(crate) struct Peer {
    pub reconnects: usize,
}

impl PeerControl for Peer {
    fn reconnect(&mut self, path: usize, _: &Endpoint) -> Option<Endpoint> {
        self.reconnects += 1;
        Some(endpoint(0x800 + path as u32))
    }
}

/// A transfer of `chunks` chunks on `planes` simulated planes of `qps`
/// paths each, `depth` in flight per path; failed paths are probed at
/// the next step.
pub(crate) fn bed(planes: usize, qps: usize, chunks: usize, depth: u32) -> Transfer<SimBuf, Sim> {
    bed_with(planes, qps, chunks, depth, 4096, |_, _, _| {}).unwrap()
}

/// [`bed`] on engines whose completion queues hold `cqe` completions,
/// with `prepare` called on every path's engine and queue pair,
/// connected, before the transfer is made (which may refuse them).
pub(crate) fn bed_with(
    planes: usize,
    qps: usize,
    chunks: usize,
    depth: u32,
    cqe: u32,
    mut prepare: impl FnMut(usize, &mut Engine<SimBuf, Sim>, QpId),
) -> Result<Transfer<SimBuf, Sim>, Error> {
    model::reset();
    let config = TransferConfig {
        op: TransferOp::Write,
        len: chunks as u64 * CHUNK,
        chunk_len: CHUNK,
        depth,
        probe_backoff: Duration::ZERO,
        probe_backoff_max: Duration::ZERO,
        qp: QpConfig {
            max_send_wr: depth * 2 + 4,
            ..QpConfig::default()
        },
        port_events: false,
        trace: 1 << 12,
        ..TransferConfig::default()
    };
    let mut built = Vec::new();
    let mut paths = Vec::new();
    for p in 0..planes {
        let mut engine = seam::engine(0x5eed + p as u64, cqe);
        for _ in 0..qps {
            let qp = seam::add_qp(&mut engine, config.qp.max_send_wr).unwrap();
            engine.mark_state(qp, QpState::RTS).unwrap();
            prepare(paths.len(), &mut engine, qp);
            paths.push((p as u16, qp));
        }
        let bufs = (0..chunks)
            .map(|_| {
                Some(SimBuf {
                    id: model::new_id(),
                })
            })
            .collect();
        built.push(Plane {
            engine: PlaneEngine(engine),
            port: 1,
            bufs,
            remote: RemoteRegion {
                addr: 1 << 40,
                len: config.len,
                rkey: 1,
            },
        });
    }
    Transfer::new(built, &paths, config)
}

/// The simulated device's queue pair behind path `index`, while live.
pub(crate) fn device_qp(t: &Transfer<SimBuf, Sim>, index: usize) -> Option<usize> {
    let path = &t.paths[index].stats;
    let engine = &t.planes[usize::from(path.plane)].engine.0;
    seam::device_qp(engine, path.qp)
}
/// The device finishes, in order, every request it holds on every queue
/// pair of every plane; returns the buffers it finished with success.
pub(crate) fn complete_all(t: &mut Transfer<SimBuf, Sim>) -> Vec<u64> {
    let mut landed = Vec::new();
    for plane in &mut t.planes {
        let dev = &mut plane.engine.0.prov.dev;
        for q in 0..dev.qps.len() {
            if !dev.qps[q].destroyed && !dev.qps[q].error {
                let held = dev.qps[q].queues[0].iter();
                landed.extend(held.flat_map(|h| h.bufs.iter().copied()));
                dev.complete(q, false, usize::MAX);
            }
        }
    }
    landed
}
