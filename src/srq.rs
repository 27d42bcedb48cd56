//! Shared receive queues: one pool of receive buffers for many queue pairs.
//!
//! The SRQ owns every posted buffer in a fixed slot table. A receive that
//! completes on a queue pair comes back from that QP's `poll` without its
//! buffer (the QP does not own it); [`SharedReceiveQueue::complete`] moves
//! the buffer into the completion. Receives on an SRQ may complete in any
//! order across QPs, hence slots with generations rather than a ring.
#![allow(unsafe_code)]

use alloc::vec::Vec;
use core::ptr::NonNull;

use crate::error::{Error, ErrorKind};
use crate::memory::LocalBuf;
use crate::pd::{destroy, ProtectionDomain};
use crate::qp::Completion;
use crate::ret::{check_ptr, check_rc};
use crate::sys;
use crate::wr::{Local, RecvRequest, MAX_SGE};

/// Work request ids of SRQ receives: this bit, a 29-bit generation, a 32-bit slot.
pub(crate) const SRQ_BIT: u64 = 1 << 61;

/// A posted receive: the caller's tag and the buffers.
type Posted<B> = (u64, [Option<B>; MAX_SGE]);

/// A shared receive queue (`struct ibv_srq`).
pub struct SharedReceiveQueue<B: LocalBuf> {
    srq: NonNull<sys::ibv_srq>,
    pd: ProtectionDomain,
    slots: Vec<Option<Posted<B>>>,
    generation: Vec<u32>,
    free: Vec<u32>,
}

// SAFETY: owns its posted buffers (B: Send) and a handle to thread-safe verbs.
unsafe impl<B: LocalBuf> Send for SharedReceiveQueue<B> {}

impl<B: LocalBuf> SharedReceiveQueue<B> {
    /// Creates an SRQ for up to `max_wr` receives of up to `max_sge` entries.
    pub fn new(pd: &ProtectionDomain, max_wr: u32, max_sge: u32) -> Result<Self, Error> {
        let mut init = sys::ibv_srq_init_attr {
            srq_context: core::ptr::null_mut(),
            attr: sys::ibv_srq_attr {
                max_wr,
                max_sge: max_sge.clamp(1, MAX_SGE as u32),
                srq_limit: 0,
            },
        };
        // SAFETY: live PD; `init` fully initialized.
        let srq = check_ptr("ibv_create_srq", unsafe {
            sys::ibv_create_srq(pd.as_raw(), &mut init)
        })?;
        // The table is sized once, here, to what the device granted.
        let cap = init.attr.max_wr.max(1);
        let mut slots = Vec::with_capacity(cap as usize);
        slots.resize_with(cap as usize, || None);
        Ok(SharedReceiveQueue {
            srq,
            pd: pd.clone(),
            slots,
            generation: alloc::vec![0; cap as usize],
            free: (0..cap).rev().collect(),
        })
    }

    /// Receives the SRQ can hold.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Receives posted and not yet completed.
    pub fn posted(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Posts a receive; its buffer belongs to the SRQ until
    /// [`SharedReceiveQueue::complete`] hands it back.
    #[allow(clippy::result_large_err)] // the request comes back unboxed
    pub fn post_recv(
        &mut self,
        req: RecvRequest<B>,
    ) -> Result<(), crate::qp::PostError<RecvRequest<B>>> {
        let Some(&slot) = self.free.last() else {
            let error = Error::new("post_srq_recv", ErrorKind::QueueFull)
                .with_detail("every SRQ slot is posted");
            return Err(crate::qp::PostError {
                error,
                request: req,
            });
        };
        let mut sges = [sys::ibv_sge::default(); MAX_SGE];
        let mut n = 0;
        for l in req.locals.iter().flatten() {
            sges[n] = sys::ibv_sge {
                addr: l.buf.addr() + l.offset as u64,
                length: l.len as u32,
                lkey: l.buf.lkey(),
            };
            n += 1;
        }
        let generation = self.generation[slot as usize];
        let mut wr = sys::ibv_recv_wr {
            wr_id: SRQ_BIT | (u64::from(generation) << 32) | u64::from(slot),
            next: core::ptr::null_mut(),
            sg_list: sges.as_mut_ptr(),
            num_sge: n as i32,
        };
        let mut bad = core::ptr::null_mut();
        // SAFETY: live SRQ; `wr`/`sges` valid for the call; the buffers move
        // into the slot table below until `complete` hands them back.
        let rc = unsafe { sys::verbs_shim_post_srq_recv(self.srq.as_ptr(), &mut wr, &mut bad) };
        if let Err(error) = check_rc("ibv_post_srq_recv", rc) {
            return Err(crate::qp::PostError {
                error,
                request: req,
            });
        }
        self.free.pop();
        self.slots[slot as usize] = Some((req.tag, req.locals.map(|l| l.map(Local::into_buf))));
        Ok(())
    }

    /// Moves the buffers of an SRQ receive completion (polled from any QP
    /// using this SRQ) into it, and restores its tag. Completions that are
    /// not this SRQ's are returned unchanged.
    pub fn complete(&mut self, mut c: Completion<B>) -> Completion<B> {
        let id = c.srq_wr_id;
        if id & SRQ_BIT == 0 {
            return c;
        }
        let slot = (id & 0xFFFF_FFFF) as usize;
        let generation = ((id >> 32) & 0x1FFF_FFFF) as u32;
        if slot < self.slots.len() && self.generation[slot] == generation {
            if let Some((tag, bufs)) = self.slots[slot].take() {
                c.tag = tag;
                c.bufs = crate::qp::Bufs::new(bufs);
                c.srq_wr_id = 0;
                self.generation[slot] = (generation + 1) & 0x1FFF_FFFF;
                self.free.push(slot as u32);
            }
        }
        c
    }

    /// Arms the limit event: when fewer than `limit` receives remain posted,
    /// the device raises `SRQ_LIMIT_REACHED` (read it with
    /// [`crate::Context::next_async_event`]) once; arm again after refilling.
    pub fn arm_limit(&mut self, limit: u32) -> Result<(), Error> {
        let mut attr = sys::ibv_srq_attr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: limit,
        };
        // SAFETY: live SRQ; only srq_limit is read (mask LIMIT).
        check_rc("ibv_modify_srq(LIMIT)", unsafe {
            sys::ibv_modify_srq(
                self.srq.as_ptr(),
                &mut attr,
                sys::ibv_srq_attr_mask::LIMIT.0 as i32,
            )
        })
    }

    /// The raw SRQ (also the identity in `AsyncEvent::element`).
    pub fn as_raw(&self) -> *mut sys::ibv_srq {
        self.srq.as_ptr()
    }

    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }
}

impl<B: LocalBuf> Drop for SharedReceiveQueue<B> {
    fn drop(&mut self) {
        // QPs using the SRQ must be gone first (the library refuses, EBUSY,
        // otherwise): `QueuePair::with_srq` borrows nothing, so the caller
        // orders the drops; on failure the buffers are leaked, never freed
        // under the device.
        // SAFETY: live SRQ, destroyed once.
        let rc = unsafe { sys::ibv_destroy_srq(self.srq.as_ptr()) };
        if rc != 0 {
            core::mem::forget(core::mem::take(&mut self.slots));
        }
        destroy("ibv_destroy_srq", rc);
    }
}
