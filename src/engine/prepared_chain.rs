//! Prepared chains: several prepared sends posted with one call and one
//! doorbell, as perftest's `-l` posts its prebuilt list. Each request is
//! recorded in its queue's ring and as its entry's latest post exactly as a
//! single `post_prepared` records it, so completions, loans and release
//! treat a chained post like any other.

use crate::error::{site, Error};
use crate::memory::NicBuf;

use super::check::{cannot_send, engine_full, post_hint};
use super::config::MAX_CHAIN;
use super::core::Engine;
use super::doorbell::{send_prepared_chain, Provider};
use super::prepared::rebuilt;
use super::prepared_table::{gone, PreparedSend};
use super::qp_slot::SignalPlan;

#[cold]
fn too_long() -> Error {
    Error::invalid(site!(
        "post_prepared_chain",
        "more requests than MAX_CHAIN in one chain"
    ))
}

#[cold]
fn mixed() -> Error {
    Error::invalid(site!(
        "post_prepared_chain",
        "a chain's prepared sends must all belong to one queue pair"
    ))
}

#[cold]
fn partial(e: Error) -> Error {
    post_hint(e).at(site!(
        "ibv_post_send",
        "partial post: the requests before the refused one were posted and complete as usual"
    ))
}

impl<B: NicBuf, P: Provider> Engine<B, P> {
    /// Posts `chain`, up to [`MAX_CHAIN`] prepared sends of one queue pair,
    /// with one call (one doorbell), in order. A handle may appear more
    /// than once: one source buffer behind a whole list of Writes. Request
    /// `i` asks for a completion entry when `signal(i)` says so (and any
    /// the queue needs signaled is: see `SendRequest::unsignaled`); each
    /// completes, and comes back from
    /// [`Engine::poll`], as a post of its own. Nothing is posted when a
    /// handle is stale, the handles name two queue pairs or the queue lacks
    /// room for all of them; on a partial post by the provider, the
    /// requests before the refused one were posted (the error says so).
    pub fn post_prepared_chain(
        &mut self,
        chain: &[PreparedSend],
        signal: impl Fn(usize) -> bool,
    ) -> Result<(), Error> {
        let n = chain.len();
        if chain.is_empty() {
            return Ok(());
        }
        if n > MAX_CHAIN {
            return Err(too_long());
        }
        let mut qp_index = u32::MAX;
        for (i, h) in chain.iter().enumerate() {
            let entry = match self.prepared.sends.get_mut(h.index as usize) {
                Some(e) if e.key == h.key => e,
                other => rebuilt(other, h.key, &self.qps, false)?,
            };
            if i == 0 {
                qp_index = entry.qp;
            } else if entry.qp != qp_index {
                return Err(mixed());
            }
        }
        let slot = &mut self.qps[qp_index as usize];
        let qp = slot.qp.as_ref().ok_or_else(gone)?;
        if slot.send.len() + n as u64 > slot.send_room {
            return Err(cannot_send(slot.state));
        }
        let flights = &mut self.flights[0];
        if (flights.available() as usize) < n {
            return Err(engine_full());
        }
        let asked = |i: usize| signal(i) || flights.crowded(i as u32);
        let plan = SignalPlan::new(slot.unsignaled_run, slot.send.half(), n, asked);
        let signaled = plan.signaled;
        let first = slot.send.next_seq();
        let sends = &self.prepared.sends;
        let wrs = chain
            .iter()
            .zip(signaled)
            .map(|(h, s)| (&sends[h.index as usize].wr, s));
        let (posted, result) = send_prepared_chain(&mut self.prov, qp, qp_index, first, wrs);
        for (i, h) in chain.iter().enumerate().take(posted) {
            let entry = &mut self.prepared.sends[h.index as usize];
            entry.last_post = first + i as u64;
            flights.push_bare(
                &mut slot.send,
                entry.tag,
                entry.opcode,
                h.index,
                h.key as u32,
                false,
            );
        }
        slot.unsignaled_run = plan.run_after(posted, slot.unsignaled_run);
        match result {
            Ok(()) => Ok(()),
            Err(e) if posted > 0 => Err(partial(e)),
            Err(e) => Err(post_hint(e)),
        }
    }
}
