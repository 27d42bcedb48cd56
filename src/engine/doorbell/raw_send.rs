//! Work requests the caller builds itself, posted through an unsafe
//! constructor's contract.

use crate::error::Error;
use crate::sys;

use super::provider::Provider;

/// Work requests the safe layer does not build (another opcode, a flag it
/// does not offer), checked by nobody: [`crate::engine::Engine::post_send_raw`]
/// posts them as they are. Their completions come back from `poll` with
/// their own `wr_id` as the tag and no buffers.
pub struct RawSend<'a> {
    wrs: &'a mut [sys::ibv_send_wr],
}

impl<'a> RawSend<'a> {
    /// Wraps `wrs` (posted as one chain; their `next` pointers are set at
    /// the post).
    ///
    /// # Safety
    ///
    /// - Every scatter/gather entry names memory registered in the queue
    ///   pair's protection domain that stays valid, and that nothing but the
    ///   device reads or writes, until the request's completion (or that of
    ///   a later signaled request on its queue) has been polled; every
    ///   pointer a request carries (a window, an address handle) stays valid
    ///   as long.
    /// - Each `wr_id` is below [`crate::engine::RAW_ID_LIMIT`].
    /// - The requests fit the queue beside the engine's own: at most the
    ///   send ring's room (`max_send_wr` minus the requests in flight), or
    ///   the completion queue can overflow.
    pub unsafe fn new(wrs: &'a mut [sys::ibv_send_wr]) -> RawSend<'a> {
        RawSend { wrs }
    }
}

/// Posts a raw chain, marking each id as a raw post's.
pub(crate) fn send_raw<P: Provider>(
    prov: &mut P,
    qp: &P::Qp,
    raw: RawSend<'_>,
) -> Result<(), Error> {
    for wr in raw.wrs.iter_mut() {
        wr.wr_id = crate::engine::id::raw(wr.wr_id);
    }
    // SAFETY: `RawSend::new`'s contract is the post's.
    unsafe { prov.post_send(qp, raw.wrs) }.map_err(|f| f.error)
}
