//! The wait protocol, once: poll the completion queue; if it is empty,
//! arm it and poll again (a completion that landed before the arm raises
//! no event); if still empty, await the descriptor's readiness; then take
//! the channel's events and start over. Generic over the channel so the
//! host tests drive it with a simulated device (under Miri too).

use std::collections::VecDeque;
use std::task::{ready, Context, Poll};

use verbs::Error;

/// A completion queue's notification side.
pub(crate) trait Channel {
    /// Arms the CQ: the next completion raises one event.
    fn arm(&mut self) -> Result<(), Error>;

    /// Pending (with `cx` registered) until the descriptor is readable;
    /// then takes every pending event, clears the readiness, and says
    /// whether one of them was this CQ's (which disarms it).
    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Result<bool, Error>>;
}

/// Ready with the number of completions `poll_cq` handed out (at least
/// one), or Pending with `cx` woken by the next completion. `armed` is
/// the CQ's arming, kept by the caller across calls (and across futures
/// that are dropped): a CQ is armed at most once per event.
pub(crate) fn poll_completions<C: Channel>(
    ch: &mut C,
    armed: &mut bool,
    cx: &mut Context<'_>,
    mut poll_cq: impl FnMut(&mut C) -> Result<usize, Error>,
) -> Poll<Result<usize, Error>> {
    loop {
        let n = poll_cq(ch)?;
        if n > 0 {
            return Poll::Ready(Ok(n));
        }
        if !*armed {
            ch.arm()?;
            *armed = true;
            // What completed before the arm raised no event: look again.
            let n = poll_cq(ch)?;
            if n > 0 {
                return Poll::Ready(Ok(n));
            }
        }
        if ready!(ch.poll_event(cx))? {
            *armed = false;
        }
    }
}

/// Ready with the first completion `mine` accepts: from `ready` (left by
/// a waiter that went away), else polled. Every other completion polled
/// meanwhile joins `ready`, so none is lost whichever waiter polls.
pub(crate) fn poll_matching<C: Channel, T>(
    ch: &mut C,
    armed: &mut bool,
    ready: &mut VecDeque<T>,
    cx: &mut Context<'_>,
    mut mine: impl FnMut(&T) -> bool,
    mut poll_cq: impl FnMut(&mut C, &mut dyn FnMut(T)) -> Result<usize, Error>,
) -> Poll<Result<T, Error>> {
    if let Some(at) = ready.iter().position(&mut mine) {
        if let Some(t) = ready.remove(at) {
            return Poll::Ready(Ok(t));
        }
    }
    loop {
        let mut found = None;
        let polled = poll_completions(ch, armed, cx, |ch| {
            poll_cq(ch, &mut |t| {
                if found.is_none() && mine(&t) {
                    found = Some(t);
                } else {
                    ready.push_back(t);
                }
            })
        });
        if let Some(t) = found {
            return Poll::Ready(Ok(t));
        }
        ready!(polled)?;
    }
}
