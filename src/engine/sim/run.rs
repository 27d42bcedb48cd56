//! One seeded run: an engine on the simulated device, driven by a random
//! mix of every operation a caller and a device can perform, checked
//! against the model after every step, then drained and torn down.
// Refused posts come back with their requests, by value, as the API does.
#![allow(clippy::result_large_err)]

use alloc::collections::BTreeSet;
use alloc::vec::Vec;

use crate::engine::core::Engine;
use crate::engine::prepared_table::{PreparedRecv, PreparedSend};
use crate::engine::qp_slot::{QpId, QpInfo, QpState};
use crate::sgl::Local;
use crate::sys;
use crate::wr::{RecvRequest, RemoteSlice, SendOp, SendRequest};

use super::alloc_count::counted;
use super::device::{Sim, SimBuf, SimQpRef};
use super::model::{self, Home};
use super::rng::Rng;

/// What a run does.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    pub(crate) seed: u64,
    pub(crate) ops: u64,
    /// Forged, duplicated and replayed completions, failing destroys.
    pub(crate) hostile: bool,
}

/// What a run saw.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Report {
    pub(crate) ops: u64,
    pub(crate) posts: u64,
    pub(crate) handed_back: u64,
    pub(crate) leaked: u64,
    /// Lanes started (not refused).
    pub(crate) lanes: u64,
    pub(crate) srq_lanes: u64,
    /// Requests those lanes' polls found.
    pub(crate) srq_requests: u64,
}

type SimEngine = Engine<SimBuf, Sim>;

pub(super) struct Run {
    pub(super) seed: u64,
    pub(super) step: u64,
    pub(super) rng: Rng,
    pub(super) engine: SimEngine,
    /// Live queue pairs: the engine's handle and the device's index.
    pub(super) qps: Vec<(QpId, usize)>,
    pub(super) sends: Vec<(PreparedSend, Home)>,
    pub(super) recvs: Vec<(PreparedRecv, Home)>,
    pub(super) leaked: BTreeSet<Home>,
    /// Handles of queue pairs removed (their slots maybe reused since).
    pub(super) removed: Vec<QpId>,
    /// How often a request asks to be unsignaled, in 1/1000.
    pub(super) unsignaled_permille: u64,
    /// A caller that polls rarely: stale completions wait in the CQ
    /// while new queue pairs post.
    pub(super) lazy_poll: bool,
    /// How often a poll's callback posts (again), in 1/1000.
    pub(super) posts_in_callbacks: u64,
    pub(super) report: Report,
}

/// Any of the data operations.
fn any_op(rng: &mut Rng) -> SendOp {
    let remote = RemoteSlice::unchecked(0, 1 << 20, 1);
    match rng.below(4) {
        0 => SendOp::Send,
        1 => SendOp::Read(remote),
        2 => SendOp::WriteImm(remote, 5),
        _ => SendOp::Write(remote),
    }
}

/// A request of 1 to 5 buffers (more than a queue pair's grant, at
/// times) tagged `tag`, and its buffers' ids.
pub(super) fn any_request(
    rng: &mut Rng,
    tag: u64,
    unsignaled: bool,
) -> (SendRequest<SimBuf>, Vec<u64>) {
    let op = any_op(rng);
    let first = buf();
    let mut ids = alloc::vec![first.id];
    let mut req = SendRequest::new(op, Local::whole(first)).tag(tag);
    for _ in 0..rng.below(5) {
        let b = buf();
        ids.push(b.id);
        req = match req.sge(Local::whole(b)) {
            Ok(r) => r,
            Err((r, _)) => r,
        };
    }
    if unsignaled {
        req = req.unsignaled();
    }
    (req, ids)
}

/// A new buffer of the simulation.
pub(super) fn buf() -> SimBuf {
    SimBuf {
        id: model::new_id(),
    }
}

impl Run {
    pub(super) fn add_qp(&mut self) {
        let send = 1 + self.rng.below(16) as u32;
        let recv = 1 + self.rng.below(16) as u32;
        let sge = 1 + self.rng.below(4) as u32;
        let (handle, qp_num) = self
            .engine
            .prov
            .dev
            .add_qp([send as usize, recv as usize], sge as usize);
        let index = handle.0;
        let caps = sys::ibv_qp_cap {
            max_send_wr: send,
            max_recv_wr: recv,
            max_send_sge: sge,
            max_recv_sge: sge,
            max_inline_data: 64,
        };
        match self
            .engine
            .place(handle, qp_num, send, recv, caps, QpInfo::default())
        {
            Ok(id) => {
                self.engine.mark_state(id, QpState::RTS).unwrap();
                self.qps.push((id, index));
            }
            Err((_, SimQpRef(i))) => self.engine.prov.dev.qps[i].destroyed = true, // the CQ is full
        }
    }

    fn pick(&mut self) -> Option<(QpId, usize)> {
        (!self.qps.is_empty()).then(|| self.qps[self.rng.below(self.qps.len() as u64) as usize])
    }

    fn op(&mut self) -> SendOp {
        any_op(&mut self.rng)
    }

    /// A request of 1 to 5 buffers (more than a queue pair's grant, at times).
    pub(super) fn request(&mut self) -> (SendRequest<SimBuf>, Vec<u64>) {
        let unsignaled = self.rng.chance(self.unsignaled_permille);
        self.request_as(unsignaled)
    }

    fn request_as(&mut self, unsignaled: bool) -> (SendRequest<SimBuf>, Vec<u64>) {
        any_request(&mut self.rng, self.step, unsignaled)
    }

    pub(super) fn posted(ids: &[u64], home: Home) {
        for &id in ids {
            model::note_posted(id, home);
        }
    }

    /// Takes back what a refused post returns: the device holds none of it.
    pub(super) fn refused(&self, bufs: impl Iterator<Item = SimBuf>) {
        for b in bufs {
            model::check_handed_back(b.id, self.seed, self.step);
        }
    }

    pub(super) fn step(&mut self) {
        self.step += 1;
        model::set_step(self.step);
        let Some((qp, dev_qp)) = self.pick() else {
            self.add_qp();
            return;
        };
        let home = Home::Qp(qp.index);
        match self.rng.below(24) {
            0..=2 => {
                let (req, ids) = self.request();
                match counted(|| self.engine.post_send(qp, req)) {
                    Ok(()) => Self::posted(&ids, home),
                    Err(e) => self.refused(e.request.into_bufs()),
                }
            }
            3 => {
                let n = 1 + self.rng.below(5) as usize;
                let mut chain: Vec<Option<SendRequest<SimBuf>>> = Vec::new();
                let mut ids = Vec::new();
                // Batch callers signal only a chain's last request.
                let batch = self.rng.chance(500);
                for k in 0..n {
                    let (r, i) = if batch {
                        self.request_as(k + 1 < n)
                    } else {
                        self.request()
                    };
                    chain.push(Some(r));
                    ids.push(i);
                }
                let _ = counted(|| self.engine.post_send_chain(qp, &mut chain));
                for (slot, ids) in chain.into_iter().zip(&ids) {
                    match slot {
                        None => Self::posted(ids, home),
                        Some(r) => self.refused(r.into_bufs()),
                    }
                }
            }
            4 => {
                let op = self.op();
                let _ = counted(|| {
                    self.engine
                        .post_inline(qp, op, b"inline", self.step, self.rng.chance(500))
                });
            }
            5 | 6 => {
                let b = buf();
                let id = b.id;
                match counted(|| {
                    self.engine
                        .post_recv(qp, RecvRequest::new(b).tag(self.step))
                }) {
                    Ok(()) => Self::posted(&[id], home),
                    Err(e) => self.refused(e.request.into_bufs()),
                }
            }
            7 => {
                let b = buf();
                let id = b.id;
                match counted(|| {
                    self.engine
                        .post_srq_recv(RecvRequest::new(b).tag(self.step))
                }) {
                    Ok(()) => Self::posted(&[id], Home::Srq),
                    Err(e) => self.refused(e.request.into_bufs()),
                }
            }
            8 => self.prepare(qp, home),
            9 | 10 => self.post_prepared(),
            11 => self.touch_prepared(),
            23 if self.rng.chance(300) => {
                if self.rng.chance(500) {
                    self.srq_lane();
                } else {
                    self.lane();
                }
            }
            12..=14 => {
                let n = 1 + self.rng.below(4) as usize;
                let recv = self.rng.chance(500);
                self.engine.prov.dev.complete(dev_qp, recv, n);
            }
            15 => self.engine.prov.dev.complete_srq(dev_qp),
            16 if self.rng.chance(200) => self.engine.prov.dev.fail(dev_qp),
            17 if self.engine.prov.dev.hostile => {
                self.engine.prov.dev.forge();
                self.poll_quietly();
            }
            18 if self.rng.chance(100) => self.reset(qp, dev_qp),
            19 if self.rng.chance(50) => self.remove(qp),
            20 if self.qps.len() < 6 => self.add_qp(),
            21 if self.rng.chance(100) => self.use_stale_handle(),
            22 => {
                // Any queue pair the device still has, leaked ones included:
                // a failed destroy leaves it live.
                let dev = &mut self.engine.prov.dev;
                let any = dev.rng.below(dev.qps.len() as u64) as usize;
                let recv = dev.rng.chance(500);
                if !dev.qps[any].destroyed {
                    dev.complete(any, recv, 1);
                }
            }
            _ if !self.lazy_poll || self.rng.chance(100) => {
                self.poll();
            }
            _ => {}
        }
    }
}
