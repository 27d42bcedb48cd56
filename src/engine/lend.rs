//! Lending what one completion finishes to the poll's callback: each
//! request of the chain it finishes, retired first (its entry released,
//! what it kept moved into the `CompletionRef`), oldest first; a request
//! of several buffers with its overflow entry held until the callback
//! returns; posts made unreported that succeeded released without a call.

use crate::memory::NicBuf;
use crate::sys::{self, ibv_wc_status as WcStatus};

use super::completion::{CompletionRef, Origin};
use super::core::Engine;
use super::doorbell::Provider;
use super::flights::Retired;
use super::qp_slot::QpId;
use super::ring::NONE;

/// A request of several buffers lent to a callback: its origin, what was
/// kept of it, its table's side, whether the entry is its own, a receive,
/// its queue pair.
type Lent<B> = (Origin, Retired<B>, bool, bool, bool, Option<QpId>);

/// The requests one completion finishes, detached from their queue (see
/// `Engine::lend_chain`).
pub(super) struct Chain {
    pub(super) first: u32,
    pub(super) count: u64,
    pub(super) side: bool,
    pub(super) recv: bool,
    pub(super) each_own: bool,
    pub(super) qp: QpId,
}

impl<B: NicBuf, P: Provider> Engine<B, P> {
    /// Lends each request of `chain`, detached from its queue, to
    /// `on_done`, oldest first; with `UNREPORTED`, releases those posted
    /// unreported that succeeded without lending them. Returns how many
    /// it lent.
    #[inline(always)]
    pub(super) fn lend_chain<const UNREPORTED: bool>(
        &mut self,
        wc: &sys::ibv_wc,
        chain: Chain,
        on_done: &mut impl FnMut(CompletionRef<'_, B, P>),
    ) -> usize {
        let Chain {
            first: mut at,
            mut count,
            side,
            recv,
            each_own,
            qp,
        } = chain;
        let mut delivered = count as usize;
        loop {
            if UNREPORTED {
                // The run of posts made unreported that succeeded (each
                // before the entry's own, or the own one with SUCCESS: a
                // failure has an entry of its own): released, nothing
                // handed back, their buffers stay with their prepared
                // requests.
                let flights = &mut self.flights[usize::from(side)];
                loop {
                    let own_entry = each_own || count == 1;
                    if own_entry && wc.status != WcStatus::SUCCESS {
                        break;
                    }
                    let Some(next) = flights.release_unreported(at) else {
                        break;
                    };
                    at = next;
                    delivered -= 1;
                    count -= 1;
                    if count == 0 {
                        flights.detached = at;
                        return delivered;
                    }
                }
            }
            count -= 1;
            let own_entry = each_own || count == 0;
            let flights = &mut self.flights[usize::from(side)];
            let (kept, next) = flights.retire(at);
            at = next;
            // What is left to lend: released by `Unrouted` if the
            // callback panics.
            flights.detached = at;
            if kept.more == NONE {
                on_done(CompletionRef {
                    wc,
                    origin: Origin::Ring,
                    kept,
                    side,
                    own_entry,
                    is_recv: recv,
                    qp: Some(qp),
                    engine: self,
                });
            } else {
                let c = (Origin::Ring, kept, side, own_entry, recv, Some(qp));
                self.lend_several(wc, c, on_done);
            }
            if count == 0 {
                return delivered;
            }
        }
    }

    /// Lends a request of several buffers (`origin`, what was kept of it,
    /// its table's side, whether the entry is its own, a receive, its
    /// queue pair) to `on_done`: its buffers after the first stay in their
    /// overflow entry, released when the callback returns (or by `Unrouted`
    /// if it panics). By exception: a request of one buffer is lent inline.
    #[cold]
    #[inline(never)]
    fn lend_several(
        &mut self,
        wc: &sys::ibv_wc,
        c: Lent<B>,
        on_done: &mut impl FnMut(CompletionRef<'_, B, P>),
    ) {
        let (origin, kept, side, own_entry, is_recv, qp) = c;
        self.lent = kept.more | u32::from(side) << 31;
        on_done(CompletionRef {
            wc,
            origin,
            kept,
            side,
            own_entry,
            is_recv,
            qp,
            engine: self,
        });
        self.release_lent();
    }

    /// Releases the overflow entry of the request lent to a callback (when
    /// it returned, or panicked), with the buffers it still keeps.
    #[cold]
    #[inline(never)]
    pub(super) fn release_lent(&mut self) {
        let lent = core::mem::replace(&mut self.lent, NONE);
        if lent != NONE {
            self.flights[(lent >> 31) as usize].release_overflow(lent & !(1 << 31));
        }
    }
}
