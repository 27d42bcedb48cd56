//! The peers a datagram server answers: one address handle per source
//! GID, made when a datagram from it arrives (never for a handshake's
//! claim, which is unverified and would make the server resolve any
//! address a TCP client names), at most `cap` of them, the one heard
//! from longest ago given up to make room, and any silent for [`IDLE`]
//! given up at the next chance. The table is generic over the handle so
//! that its rules are tested on the host.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use verbs::Gid;

/// A peer silent this long is given up (made again on its next datagram).
pub const IDLE: Duration = Duration::from_secs(10);

/// Where a table's handles come from and go.
pub trait Handles<H> {
    /// A handle to `gid`, or `None`.
    fn make(&mut self, gid: Gid) -> Option<H>;
    /// Ends `h`; false (keeping it) while that is not safe, e.g. a send
    /// naming it may be in flight.
    fn give_up(&mut self, h: H) -> bool;
}

pub struct Peers<H> {
    /// Each peer's handle and when it was last heard from.
    by_gid: HashMap<Gid, (H, Instant)>,
    cap: usize,
}

impl<H: Copy> Peers<H> {
    /// A table of at most `cap` (at least 1) peers.
    pub fn new(cap: usize) -> Peers<H> {
        Peers {
            by_gid: HashMap::with_capacity(cap.max(1)),
            cap: cap.max(1),
        }
    }

    /// Peers held now.
    pub fn len(&self) -> usize {
        self.by_gid.len()
    }

    /// The handle held for `gid`, heard from at `now`; `None` (nothing
    /// made) if there is none yet.
    pub fn known(&mut self, gid: Gid, now: Instant) -> Option<H> {
        let (h, heard) = self.by_gid.get_mut(&gid)?;
        *heard = now;
        Some(*h)
    }

    /// The handle to `gid`, heard from at `now`: the one held, or a new
    /// one (`None`: none could be made, and nothing is held for it).
    /// When the table is full the peer heard from longest ago is given up
    /// first; if that is refused, `gid` gets none this time.
    pub fn route(&mut self, gid: Gid, now: Instant, handles: &mut impl Handles<H>) -> Option<H> {
        if let Some((h, heard)) = self.by_gid.get_mut(&gid) {
            *heard = now;
            return Some(*h);
        }
        if self.by_gid.len() >= self.cap {
            let (&oldest, &(h, _)) = self.by_gid.iter().min_by_key(|(_, (_, heard))| *heard)?;
            if !handles.give_up(h) {
                return None;
            }
            self.by_gid.remove(&oldest);
        }
        let h = handles.make(gid)?;
        self.by_gid.insert(gid, (h, now));
        Some(h)
    }

    /// Gives up every peer silent for [`IDLE`] at `now` (those whose end
    /// is refused stay); returns how many went.
    pub fn prune(&mut self, now: Instant, handles: &mut impl Handles<H>) -> usize {
        let before = self.by_gid.len();
        self.by_gid
            .retain(|_, (h, heard)| now.duration_since(*heard) < IDLE || !handles.give_up(*h));
        before - self.by_gid.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Handles numbered as made; `refuse` keeps every one alive.
    #[derive(Default)]
    struct Fake {
        made: u32,
        gone: Vec<u32>,
        refuse: bool,
    }

    impl Handles<u32> for Fake {
        fn make(&mut self, _: Gid) -> Option<u32> {
            self.made += 1;
            Some(self.made)
        }
        fn give_up(&mut self, h: u32) -> bool {
            if !self.refuse {
                self.gone.push(h);
            }
            !self.refuse
        }
    }

    #[test]
    fn bounded_the_longest_silent_given_up_and_the_silent_pruned() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let gid = |i: u32| Gid::from_ipv4([198, 18, (i >> 8) as u8, i as u8]);
        let mut peers: Peers<u32> = Peers::new(2);
        let mut h = Fake::default();
        assert_eq!(peers.route(gid(1), at(0), &mut h), Some(1));
        assert_eq!(peers.route(gid(2), at(1), &mut h), Some(2));
        // Heard again: the same handle, and now the most recent.
        assert_eq!(peers.known(gid(1), at(2)), Some(1));
        assert_eq!(peers.known(gid(9), at(2)), None);
        // Full: a new peer takes the place of the one heard longest ago.
        assert_eq!(peers.route(gid(3), at(3), &mut h), Some(3));
        assert_eq!((h.gone.as_slice(), peers.len()), (&[2][..], 2));
        // Refused (a send in flight): no handle, and all stays as it was.
        h.refuse = true;
        assert_eq!(peers.route(gid(4), at(4), &mut h), None);
        assert_eq!((h.made, peers.len()), (3, 2));
        h.refuse = false;
        // A thousand made-up peers never hold more than the cap.
        for i in 0..1000 {
            peers.route(gid(10 + i), at(10 + u64::from(i)), &mut h);
            assert!(peers.len() <= 2);
        }
        // Silent past IDLE: given up, unless refused.
        let later = at(1010) + IDLE;
        h.refuse = true;
        assert_eq!(peers.prune(later, &mut h), 0);
        h.refuse = false;
        assert_eq!(peers.prune(later, &mut h), 2);
        assert_eq!(peers.len(), 0);
    }
}
