//! Work requests of the safe posting API: what to do, on which local
//! buffers (moved in, returned with the completion), against which remote
//! memory (bounds-checked against the peer's descriptor).

use crate::endpoint::RemoteRegion;
use crate::error::{site, Error};
use crate::memory::{HostBuf, NicBuf};
use crate::sgl::{Local, Sgl};

/// A checked range of a peer's region: where an RDMA Write, Read or atomic goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteSlice {
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) rkey: u32,
}

impl RemoteSlice {
    /// `len` bytes at `offset` into `region`, refused if they do not fit.
    pub fn new(region: &RemoteRegion, offset: u64, len: u64) -> Result<RemoteSlice, Error> {
        let addr = region
            .addr
            .checked_add(offset)
            .ok_or(Error::invalid(site!("RemoteSlice", "offset overflows")))?;
        if !region.contains(addr, len) {
            return Err(Error::invalid(site!(
                "RemoteSlice",
                "range past the end of the peer's region",
                "offset + length must fit in the region the peer shared"
            )));
        }
        Ok(RemoteSlice {
            addr,
            len,
            rkey: region.rkey,
        })
    }

    /// The whole region.
    pub fn whole(region: &RemoteRegion) -> RemoteSlice {
        RemoteSlice {
            addr: region.addr,
            len: region.len,
            rkey: region.rkey,
        }
    }

    /// A range that is NOT checked against any descriptor: for tests of the
    /// NIC's own checks and for peers whose descriptors come some other way.
    /// Safe, because the remote NIC enforces the rkey; a wrong range is a
    /// `REM_ACCESS_ERR` completion, never local memory unsafety.
    pub fn unchecked(addr: u64, len: u64, rkey: u32) -> RemoteSlice {
        RemoteSlice { addr, len, rkey }
    }

    /// Remote address.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Length.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }
}

/// The operation of a send-queue request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// RDMA Write of the local data to the remote slice.
    Write(RemoteSlice),
    /// RDMA Write that also consumes a receive at the peer and delivers
    /// `imm` (host order) in its completion.
    WriteImm(RemoteSlice, u32),
    /// RDMA Read of the remote slice into the local buffers.
    Read(RemoteSlice),
    /// Send, consumed by a receive the peer posted.
    Send,
    /// Send with immediate data (host order).
    SendImm(u32),
    /// Atomic fetch-and-add on the 8-byte aligned remote word; the old
    /// value lands in the 8-byte local buffer.
    FetchAdd {
        /// The remote word.
        remote: RemoteSlice,
        /// What to add.
        add: u64,
    },
    /// Atomic compare-and-swap on the 8-byte aligned remote word; the old
    /// value lands in the 8-byte local buffer.
    CompareSwap {
        /// The remote word.
        remote: RemoteSlice,
        /// Swap only if the word equals this.
        compare: u64,
        /// The new value.
        swap: u64,
    },
}

/// Flags of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendFlags {
    pub(crate) signaled: bool,
    pub(crate) fence: bool,
    pub(crate) solicited: bool,
    pub(crate) inline: bool,
}

impl Default for SendFlags {
    fn default() -> Self {
        SendFlags {
            signaled: true,
            fence: false,
            solicited: false,
            inline: false,
        }
    }
}

/// A send-queue work request with the local buffers it uses.
#[derive(Debug)]
pub struct SendRequest<B> {
    pub(crate) tag: u64,
    pub(crate) op: SendOp,
    pub(crate) sgl: Sgl<B>,
    pub(crate) flags: SendFlags,
}

impl<B: NicBuf> SendRequest<B> {
    /// A request of `op` on one local buffer (or part of one).
    pub fn new(op: SendOp, local: impl Into<Local<B>>) -> SendRequest<B> {
        SendRequest {
            tag: 0,
            op,
            sgl: Sgl::one(local.into()),
            flags: SendFlags::default(),
        }
    }

    /// A request with no local data (a zero-length Write or Send).
    pub fn empty(op: SendOp) -> SendRequest<B> {
        SendRequest {
            tag: 0,
            op,
            sgl: Sgl::empty(),
            flags: SendFlags::default(),
        }
    }

    /// Adds another scatter/gather entry; gives it back if the list is full.
    #[allow(clippy::result_large_err)] // both halves come back by value, unboxed
    pub fn sge(
        mut self,
        local: impl Into<Local<B>>,
    ) -> Result<SendRequest<B>, (SendRequest<B>, Local<B>)> {
        match self.sgl.push(local.into()) {
            Ok(()) => Ok(self),
            Err(local) => Err((self, local)),
        }
    }

    /// The caller's tag, returned in the completion.
    #[must_use]
    pub fn tag(mut self, tag: u64) -> Self {
        self.tag = tag;
        self
    }

    /// Ask for no completion of its own (selective signaling). Its buffers
    /// come back when a later signaled request completes; the queue pair
    /// signals a request by itself before unsignaled ones could fill the
    /// send queue (which would deadlock).
    #[must_use]
    pub fn unsignaled(mut self) -> Self {
        self.flags.signaled = false;
        self
    }

    /// `IBV_SEND_FENCE`: start only once every earlier RDMA Read and atomic
    /// on this queue pair has completed, so that a request that uses what
    /// they fetched (a Write or Send from the buffer a Read filled) sends
    /// the fetched bytes, not the buffer's earlier content. Without it the
    /// device may read the buffer while the Read's response is still on its
    /// way.
    ///
    /// The cost: the send queue stalls at this request for the Reads' and
    /// atomics' round trip to the peer, and everything posted after it
    /// waits too (Soft-RoCE waits for every earlier request of the queue).
    /// Fence only the request that depends on them.
    #[must_use]
    pub fn fence(mut self) -> Self {
        self.flags.fence = true;
        self
    }

    /// `IBV_SEND_SOLICITED`: wake a peer waiting for solicited events.
    #[must_use]
    pub fn solicited(mut self) -> Self {
        self.flags.solicited = true;
        self
    }

    /// The operation.
    pub fn op(&self) -> SendOp {
        self.op
    }

    /// Total local bytes.
    pub fn local_len(&self) -> usize {
        self.sgl.total_len()
    }

    /// The local buffers back, e.g. after a refused post.
    pub fn into_bufs(self) -> impl Iterator<Item = B> {
        self.sgl.into_bufs()
    }
}

impl<B: HostBuf> SendRequest<B> {
    /// `IBV_SEND_INLINE`: the provider copies the data into the work
    /// request at post time, so the NIC never reads the buffer (its lkey
    /// is unused). Write, Write-with-immediate and Send only, of at most
    /// the queue pair's granted `max_inline_data` bytes. The buffers stay
    /// with the queue pair until completion all the same. Host memory only:
    /// the provider reads the bytes with the CPU.
    #[must_use]
    pub fn inline(mut self) -> Self {
        self.flags.inline = true;
        self
    }
}

/// A receive work request with the buffers the incoming message lands in.
#[derive(Debug)]
pub struct RecvRequest<B> {
    pub(crate) tag: u64,
    pub(crate) sgl: Sgl<B>,
}

impl<B: NicBuf> RecvRequest<B> {
    /// A receive into one buffer (or part of one).
    pub fn new(local: impl Into<Local<B>>) -> RecvRequest<B> {
        RecvRequest {
            tag: 0,
            sgl: Sgl::one(local.into()),
        }
    }

    /// Adds another scatter/gather entry; gives it back if the list is full.
    #[allow(clippy::result_large_err)] // both halves come back by value, unboxed
    pub fn sge(
        mut self,
        local: impl Into<Local<B>>,
    ) -> Result<RecvRequest<B>, (RecvRequest<B>, Local<B>)> {
        match self.sgl.push(local.into()) {
            Ok(()) => Ok(self),
            Err(local) => Err((self, local)),
        }
    }

    /// The caller's tag, returned in the completion.
    #[must_use]
    pub fn tag(mut self, tag: u64) -> Self {
        self.tag = tag;
        self
    }

    /// The local buffers back.
    pub fn into_bufs(self) -> impl Iterator<Item = B> {
        self.sgl.into_bufs()
    }
}
