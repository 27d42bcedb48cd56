//! One seeded run: an engine on the simulated device, driven by a random
//! mix of every operation a caller and a device can perform, checked
//! against the model after every step, then drained and torn down.
// Refused posts come back with their requests, by value, as the API does.
#![allow(clippy::result_large_err)]

use alloc::collections::BTreeSet;
use alloc::vec::Vec;

use crate::engine::config::Queue;
use crate::engine::core::Engine;
use crate::engine::prepared_table::{PreparedRecv, PreparedSend};
use crate::engine::qp_slot::{QpId, QpInfo, QpState};
use crate::sgl::Local;
use crate::sys;
use crate::wr::{RecvRequest, RemoteSlice, SendOp, SendRequest};

use super::alloc_count::{counted, uncounted};
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
    pub(super) report: Report,
}

fn buf() -> SimBuf {
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
        let remote = RemoteSlice::unchecked(0, 1 << 20, 1);
        match self.rng.below(4) {
            0 => SendOp::Send,
            1 => SendOp::Read(remote),
            2 => SendOp::WriteImm(remote, 5),
            _ => SendOp::Write(remote),
        }
    }

    /// A request of 1 to 5 buffers (more than a queue pair's grant, at times).
    fn request(&mut self) -> (SendRequest<SimBuf>, Vec<u64>) {
        let op = self.op();
        let first = buf();
        let mut ids = alloc::vec![first.id];
        let mut req = SendRequest::new(op, Local::whole(first)).tag(self.step);
        for _ in 0..self.rng.below(5) {
            let b = buf();
            ids.push(b.id);
            req = match req.sge(Local::whole(b)) {
                Ok(r) => r,
                Err((r, _)) => r,
            };
        }
        if self.rng.chance(300) {
            req = req.unsignaled();
        }
        (req, ids)
    }

    fn posted(ids: &[u64], home: Home) {
        for &id in ids {
            model::note_posted(id, home);
        }
    }

    /// Takes back what a refused post returns: the device holds none of it.
    fn refused(&self, bufs: impl Iterator<Item = SimBuf>) {
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
        match self.rng.below(22) {
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
                for _ in 0..n {
                    let (r, i) = self.request();
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
            12..=14 => {
                let n = 1 + self.rng.below(4) as usize;
                let recv = self.rng.chance(500);
                self.engine.prov.dev.complete(dev_qp, recv, n);
            }
            15 => self.engine.prov.dev.complete_srq(dev_qp),
            16 if self.rng.chance(200) => self.engine.prov.dev.fail(dev_qp),
            17 if self.hostile() => self.engine.prov.dev.forge(),
            18 if self.rng.chance(100) => self.reset(qp, dev_qp),
            19 if self.rng.chance(50) => self.remove(qp, dev_qp),
            20 if self.qps.len() < 6 => self.add_qp(),
            _ => {
                self.poll();
            }
        }
    }

    fn hostile(&self) -> bool {
        self.engine.prov.dev.fail_destroy_permille > 0
    }

    fn prepare(&mut self, qp: QpId, home: Home) {
        if self.rng.chance(500) {
            let (req, ids) = self.request();
            match self.engine.prepare_send(qp, req) {
                Ok(p) => {
                    Self::posted(&ids, home);
                    self.sends.push((p, home));
                }
                Err(e) => self.refused(e.request.into_bufs()),
            }
        } else {
            let b = buf();
            let id = b.id;
            match self.engine.prepare_recv(qp, RecvRequest::new(b)) {
                Ok(p) => {
                    Self::posted(&[id], home);
                    self.recvs.push((p, home));
                }
                Err(e) => self.refused(e.request.into_bufs()),
            }
        }
    }

    fn post_prepared(&mut self) {
        if !self.sends.is_empty() && self.rng.chance(500) {
            let (p, _) = self.sends[self.rng.below(self.sends.len() as u64) as usize];
            let unsignaled = self.rng.chance(300);
            let _ = counted(|| {
                if unsignaled {
                    self.engine.post_prepared_unsignaled(p)
                } else {
                    self.engine.post_prepared(p)
                }
            });
        } else if !self.recvs.is_empty() {
            let (p, _) = self.recvs[self.rng.below(self.recvs.len() as u64) as usize];
            let _ = counted(|| self.engine.post_prepared(p));
        }
    }

    /// A loan (sometimes swapping the buffer) or a release: allowed only
    /// when the device is done with every post of the request.
    fn touch_prepared(&mut self) {
        let (seed, step) = (self.seed, self.step);
        let release = self.rng.chance(300);
        let swap = self.rng.chance(300);
        macro_rules! touch {
            ($list:expr) => {{
                if $list.is_empty() {
                    return;
                }
                let i = self.rng.below($list.len() as u64) as usize;
                let (p, home) = $list[i];
                if release {
                    if let Ok(bufs) = self.engine.release_prepared(p) {
                        $list.swap_remove(i);
                        for b in bufs {
                            model::check_handed_back(b.id, seed, step);
                        }
                    }
                } else if let Ok(b) = self.engine.prepared_buf(p) {
                    model::check_handed_back(b.id, seed, step);
                    if swap {
                        let fresh = buf();
                        model::note_posted(fresh.id, home);
                        drop(core::mem::replace(b, fresh));
                    }
                }
            }};
        }
        if self.rng.chance(500) {
            touch!(self.sends)
        } else {
            touch!(self.recvs)
        }
    }

    fn poll(&mut self) -> usize {
        let (seed, step) = (self.seed, self.step);
        let queue = if self.rng.chance(200) {
            Some(Queue::Send)
        } else {
            None
        };
        let panic_at = self.rng.chance(20).then(|| self.rng.below(3));
        let mode = self.rng.below(3);
        let mut seen = 0u64;
        let mut handed = 0u64;
        let mut callback = |mut c: crate::engine::completion::CompletionRef<'_, SimBuf>| {
            uncounted(|| {
                if panic_at == Some(seen) {
                    // Unwinds without the panic hook's message.
                    std::panic::resume_unwind(alloc::boxed::Box::new("a callback that panics"));
                }
                seen += 1;
                match mode {
                    0 => {
                        if let Some(b) = c.take_buf() {
                            model::check_handed_back(b.id, seed, step);
                            handed += 1;
                        }
                    }
                    1 => {
                        for b in c.into_owned().into_bufs() {
                            model::check_handed_back(b.id, seed, step);
                            handed += 1;
                        }
                    }
                    _ => {} // left to the engine, which drops them
                }
            })
        };
        let engine = &mut self.engine;
        let result = std::panic::catch_unwind(core::panic::AssertUnwindSafe(|| {
            counted(|| match queue {
                Some(q) => engine.poll_queue(q, &mut callback),
                None => engine.poll(&mut callback),
            })
        }));
        self.report.handed_back += handed;
        match result {
            Ok(r) => r.unwrap_or(0),
            Err(_) => 0,
        }
    }

    /// The device flushes everything of `qp`, the engine takes what
    /// arrives for a while, then both go through RESET (where the device
    /// holds no request, so the engine hands back the rest) to RTS.
    /// Soft-RoCE has been seen to replay flushes after a reset: hostile
    /// runs replay some.
    pub(super) fn reset(&mut self, qp: QpId, dev_qp: usize) {
        self.engine.prov.dev.fail(dev_qp);
        for _ in 0..self.rng.below(3) {
            self.poll_quietly();
        }
        let (seed, step) = (self.seed, self.step);
        let hostile = self.hostile();
        let q = &mut self.engine.prov.dev.qps[dev_qp];
        assert!(
            q.queues.iter().all(|d| d.is_empty()),
            "a failed queue pair holds nothing"
        );
        q.error = false;
        let replay: Vec<sys::ibv_wc> = if hostile {
            q.history.iter().rev().take(4).copied().collect()
        } else {
            Vec::new()
        };
        let _ = self.engine.mark_state(qp, QpState::RESET);
        let _ = self.engine.retire_all(
            qp,
            &mut |mut c: crate::engine::completion::CompletionRef<'_, SimBuf>| {
                if let Some(b) = c.take_buf() {
                    model::check_handed_back(b.id, seed, step);
                }
            },
        );
        assert_eq!(
            self.engine.in_flight(qp).unwrap(),
            (0, 0),
            "seed {seed} step {step}: nothing is left in RESET"
        );
        self.engine.prov.dev.cq.extend(replay);
        let _ = self.engine.mark_state(qp, QpState::RTS);
    }

    pub(super) fn poll_quietly(&mut self) {
        let (seed, step) = (self.seed, self.step);
        let _ = self.engine.poll(|mut c| {
            if let Some(b) = c.take_buf() {
                model::check_handed_back(b.id, seed, step);
            }
        });
    }

    fn remove(&mut self, qp: QpId, dev_qp: usize) {
        self.qps.retain(|&(q, _)| q != qp);
        if self.engine.remove_qp(qp).is_err() {
            // Leaked on purpose; the device keeps it (and may complete it).
            self.leaked.insert(Home::Qp(qp.index));
            self.report.leaked += 1;
        } else {
            let _ = dev_qp;
        }
    }
}
