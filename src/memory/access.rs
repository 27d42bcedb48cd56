//! What a registration, a window or a queue pair lets the NIC do with
//! memory: the access flags, documented once, and the sets the crate
//! reasons with.

/// Access flags (`enum ibv_access_flags`): what the NIC may do with a
/// registration's memory, on whose behalf. A transparent newtype over the
/// C value (an unknown bit is carried, never undefined behaviour);
/// combine flags with `|`.
///
/// # What each flag grants
///
/// | flag | lets | needs |
/// | --- | --- | --- |
/// | (none) | the local NIC *read* the memory: the source of a Send or an RDMA Write, an inline copy's origin | |
/// | `LOCAL_WRITE` | the local NIC *write* it: a receive's buffer, an RDMA Read's or an atomic's result | |
/// | `REMOTE_READ` | a peer's RDMA Read of it (through the region's `rkey`) | |
/// | `REMOTE_WRITE` | a peer's RDMA Write (and Write-with-immediate) into it; on iWARP hardware also the sink of this side's own RDMA Read (the response lands like a peer's Write; Soft-iWARP asks only `LOCAL_WRITE`) | `LOCAL_WRITE` |
/// | `REMOTE_ATOMIC` | a peer's compare-and-swap and fetch-and-add on 8-byte words of it | `LOCAL_WRITE` |
/// | `MW_BIND` | binding memory windows to it ([`crate::Engine::expose`], [`super::ArenaConfig::windows`]); a window can grant a peer remote access on its own | |
/// | `ZERO_BASED` | addressing from 0 instead of by virtual address (windows); the crate's descriptors ([`crate::RemoteRegion`]) are address-based, so it is not for registrations | |
/// | `ON_DEMAND` | on-demand paging: pages faulted in when the NIC touches them instead of pinned at registration (where the device supports it) | |
/// | `HUGETLB` | with `ON_DEMAND`: the memory is huge pages | `ON_DEMAND` |
/// | `RELAXED_ORDERING` | the PCIe device may reorder its writes: a peer's RDMA Write may land out of order, so never poll the last byte of a write for its arrival | |
///
/// The device refuses `REMOTE_WRITE` or `REMOTE_ATOMIC` without
/// `LOCAL_WRITE` (`EINVAL` from `ibv_reg_mr`): the crate always adds
/// `LOCAL_WRITE` to a region's access ([`super::MemoryRegion::with_access`],
/// [`super::Arena::new`]).
///
/// # Two checks: the queue pair and the memory
///
/// A peer's RDMA Read, Write or atomic succeeds only if *both* the target
/// queue pair ([`crate::QpConfig::remote_access`], set at RESET → INIT)
/// and the target memory's registration (or window) grant it; either one
/// refusing fails the request with `REM_ACCESS_ERR` at the initiator
/// (primer 7.4's table). Local access needs no grant on the queue pair.
///
/// # Least privilege by default
///
/// Everything starts local: [`super::MemoryRegion::new`] registers with
/// `LOCAL_WRITE` only, an [`super::Arena`] with `LOCAL_WRITE` (plus
/// [`super::ArenaConfig::whole_region_access`], empty by default), and a
/// queue pair's `remote_access` is [`Access::EMPTY`]. Remote access is
/// asked for flag by flag, and one buffer at a time where the device
/// enforces windows ([`crate::Engine::expose`]). The primer's programs
/// grant `LOCAL_WRITE | REMOTE_READ | REMOTE_WRITE` on the queue pair and
/// the region alike (its sections 3.3 and 5.1): correct, and more than a
/// side that is only written to needs.
///
/// Memory any peer may write ([`Access::PEER_WRITES`]) is never lent as
/// a slice: [`super::HostBuf::read_at`] and [`super::HostBuf::write_at`]
/// copy it instead, since the NIC may change it at any moment.
///
/// # Primer
///
/// - 5.1: `ibv_reg_mr` pins the pages and issues the `rkey`, a
///   capability: whoever holds it (with the address and length) may do
///   what the access flags allow, without this side's CPU noticing (see
///   the README's security model).
/// - 5.2: the `lkey` names memory in this side's requests, the `rkey` in
///   the peer's; confusing them fails with `REM_ACCESS_ERR` (a bad `rkey`)
///   or `LOC_PROT_ERR` (a bad `lkey`, or access missing, such as a receive
///   into memory without `LOCAL_WRITE`).
/// - 7.4: `REM_ACCESS_ERR` after a Write to memory without `REMOTE_WRITE`:
///   [`crate::Error::hint`] names the flag to check.
#[doc(inline)]
pub use crate::sys::ibv_access_flags as Access;

impl Access {
    /// Every access that lets a peer touch the memory on its own.
    pub const REMOTE: Access =
        Access(Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0 | Access::REMOTE_ATOMIC.0);

    /// Every access through which a peer may change the memory (including
    /// windows bound to it, which can grant remote write).
    pub const PEER_WRITES: Access =
        Access(Access::REMOTE_WRITE.0 | Access::REMOTE_ATOMIC.0 | Access::MW_BIND.0);

    /// True when a peer may read or write through this access.
    pub const fn grants_remote(self) -> bool {
        self.0 & Access::REMOTE.0 != 0
    }

    /// True when a peer may change memory registered with this access.
    pub const fn lets_peer_write(self) -> bool {
        self.0 & Access::PEER_WRITES.0 != 0
    }
}
