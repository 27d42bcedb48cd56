//! The bandwidth tests' loops: the sender (on a lane for one queue
//! pair's prepared request, else through the engine's posts for chains,
//! own-buffer requests and several queue pairs) and `send_bw`'s receiver.

use verbs::{site, ArenaBuf, Error, ErrorKind, Local, PreparedSend, Queue, SendOp, SendRequest};

use super::clock::ticks;
use super::loops::{
    no_buffer, no_stamp, operation, reap, reap_received, repost, stalled, Spin, MAX_CHAIN,
};
use super::params::Params;
use super::side::{Lane, Side};

/// The bandwidth sender (see the module docs).
pub(super) fn stream(side: &mut Side, p: &Params) -> Result<(), Error> {
    let depth = u64::from(side.depth.clamp(1, p.tx_depth.max(1)));
    let Side { lanes, stamps, .. } = side;
    let list = u64::from(p.post_list.clamp(1, MAX_CHAIN as u32)).min(depth);
    // At least one signaled request in any `depth` consecutive ones, or
    // the window fills with requests that never complete (when buffer
    // memory cut the depth below the moderation, say).
    let cq_mod = u64::from(p.cq_mod.max(1)).min(depth);
    let signaled = |k: u64| (k + 1) % cq_mod == 0 || k + 1 == p.iters;
    if let ([lane], 1) = (&mut lanes[..], list) {
        if let Some(source) = lane.ping {
            let (posted, completed) = (&mut stamps.posted, &mut stamps.completed);
            return stream_lane(lane, source, posted, completed, depth, p);
        }
    }
    let total = p.iters * lanes.len() as u64;
    let mut chain: [Option<SendRequest<ArenaBuf>>; MAX_CHAIN] = Default::default();
    let (mut posted, mut done) = (0u64, 0u64);
    let mut spin = Spin::new();
    while done < total {
        for lane in lanes.iter_mut() {
            let op = operation(lane, p)?;
            if list == 1 && lane.ping.is_none() {
                let stamps_now = stamps.posted.get_mut(posted as usize..);
                posted += post_own(lane, op, stamps_now.ok_or_else(no_stamp)?, depth, cq_mod, p)?;
                continue;
            }
            while lane.posted < p.iters {
                let n = list.min(p.iters - lane.posted);
                if lane.posted - lane.done + n > depth {
                    break;
                }
                let at = posted as usize;
                let stamps_now = stamps.posted.get_mut(at..at + n as usize);
                match stamps_now.ok_or_else(no_stamp)? {
                    // One request: one store, not a fill loop.
                    [one] => *one = ticks(),
                    many => many.fill(ticks()),
                }
                let k = lane.posted;
                if let Some(source) = lane.ping {
                    if n > 1 {
                        // One source buffer behind the whole list, as perftest's.
                        let list = [source; MAX_CHAIN];
                        lane.qp
                            .post_prepared_chain(&list[..n as usize], |j| signaled(k + j as u64))?;
                    } else if signaled(k) {
                        lane.qp.post_prepared(source)?;
                    } else {
                        lane.qp.post_prepared_unsignaled(source)?;
                    }
                } else {
                    for (j, slot) in chain.iter_mut().enumerate().take(n as usize) {
                        let buf = lane.sends.pop().ok_or_else(no_buffer)?;
                        let local = Local::range(buf, 0, p.size).map_err(|(e, _)| e)?;
                        let req = SendRequest::new(op, local);
                        *slot = Some(if signaled(k + j as u64) {
                            req
                        } else {
                            req.unsignaled()
                        });
                    }
                    let sent = lane.qp.post_send_chain(&mut chain[..n as usize])?;
                    if sent as u64 != n {
                        return Err(Error::new(
                            site!("post_send_chain", "fewer requests posted than chained"),
                            ErrorKind::QueueFull,
                        ));
                    }
                }
                lane.posted += n;
                posted += n;
            }
        }
        let mut got = 0;
        for lane in lanes.iter_mut() {
            got += reap::<false>(lane, &mut done, Some(&mut stamps.completed))?;
        }
        if got == 0 {
            spin.idle(p, stalled!("wait for send completions"))?;
        } else {
            spin = Spin::new();
        }
    }
    Ok(())
}

/// `stream`'s posts on a lane without a prepared request, one request
/// per post (`--plain`): each built on a buffer of its own and posted as
/// a new user would, as many as the lane's window has room for, every
/// `cq_mod`-th and the last signaled; `stamps` from the first one's on.
/// Returns how many it posted. A function of its own, so that the post
/// inlined into it keeps its values in registers.
#[inline(never)]
fn post_own(
    lane: &mut Lane,
    op: SendOp,
    stamps: &mut [u64],
    depth: u64,
    cq_mod: u64,
    p: &Params,
) -> Result<u64, Error> {
    let first = lane.posted;
    // Nothing completes while it posts: the window's end is known now,
    // and the stamps it takes, one per request, bound the loop.
    let end = p.iters.min(lane.done + depth);
    let n = end.saturating_sub(first);
    let stamps = stamps.get_mut(..n as usize).ok_or_else(no_stamp)?;
    // The next request signaled (counted from 1): the next multiple of
    // `cq_mod`, or the last one. One comparison per request.
    let mut next_signaled = (first / cq_mod + 1) * cq_mod;
    let mut signal_at = next_signaled.min(p.iters);
    for stamp in stamps {
        *stamp = ticks();
        let k = lane.posted + 1;
        let buf = lane.sends.pop().ok_or_else(no_buffer)?;
        let local = Local::range(buf, 0, p.size).map_err(|(e, _)| e)?;
        let mut req = SendRequest::new(op, local);
        if k == signal_at {
            signal_at = signal_after(&mut next_signaled, cq_mod, p.iters);
        } else {
            req = req.unsignaled();
        }
        lane.qp.post_send(req).map_err(|e| e.error)?;
        lane.posted = k;
    }
    Ok(lane.posted - first)
}

/// The next request to signal once request `next_signaled` was: the next
/// multiple of `cq_mod` (`next_signaled` becomes it), or the last, the
/// earlier. Out of line: one request in `cq_mod` gets here, and the
/// others pay one comparison.
#[cold]
#[inline(never)]
fn signal_after(next_signaled: &mut u64, cq_mod: u64, iters: u64) -> u64 {
    *next_signaled += cq_mod;
    (*next_signaled).min(iters)
}

/// The bandwidth sender of one queue pair's prepared request, one per
/// post: on a lane, whose unsignaled posts complete with the next
/// signaled one (every `cq_mod`-th and the last, as in `stream`).
#[inline(never)]
fn stream_lane(
    lane: &mut Lane,
    source: PreparedSend,
    posted_at: &mut [u64],
    completed: &mut Vec<(u64, u64)>,
    depth: u64,
    p: &Params,
) -> Result<(), Error> {
    let cq_mod = u64::from(p.cq_mod.max(1)).min(depth);
    let mut fast = lane.qp.lane(source, None)?;
    let mut stamps = posted_at.iter_mut();
    let (mut posted, mut done) = (0u64, 0u64);
    let mut spin = Spin::new();
    while done < p.iters {
        while posted < p.iters && posted - done < depth {
            *stamps.next().ok_or_else(no_stamp)? = ticks();
            posted += 1;
            if posted % cq_mod == 0 || posted == p.iters {
                fast.post_send()?;
            } else {
                fast.post_send_unsignaled()?;
            }
        }
        // Nothing but the lane's request is in flight on its engine.
        let got = fast.poll(Queue::Send, |_| {})?;
        if got.sent == 0 {
            spin.idle(p, stalled!("wait for send completions"))?;
        } else {
            done += got.sent;
            // Within the capacity reserved in `Side::prepare`.
            completed.push((done - 1, ticks()));
            spin = Spin::new();
        }
    }
    drop(fast);
    lane.posted += posted;
    lane.done += done;
    Ok(())
}

/// The receiver of `send_bw`: completes every receive and posts it again.
pub(super) fn drain_receives(side: &mut Side, p: &Params) -> Result<(), Error> {
    let mut spin = Spin::new();
    let mut unused = 0;
    loop {
        let mut got = 0;
        let mut pending = false;
        for lane in side.lanes.iter_mut() {
            got += reap_received(lane, &mut unused)?;
            repost(lane, p)?;
            pending |= lane.received < p.iters;
        }
        if !pending {
            return Ok(());
        }
        if got == 0 {
            spin.idle(p, stalled!("wait for the peer's sends"))?;
        } else {
            spin = Spin::new();
        }
    }
}
