//! One waker for the reactor, two tasks behind it: a stream's reads and
//! writes may be polled from two tasks (`tokio::io::split`), but the
//! descriptor's registration and the keepalive timer hold one waker each.
//! They get this one, which wakes both sides' latest.

use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Wake, Waker};

pub(crate) const READ: usize = 0;
pub(crate) const WRITE: usize = 1;

#[derive(Default)]
struct Sides {
    wakers: Mutex<[Option<Waker>; 2]>,
}

impl Wake for Sides {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let taken = {
            let mut w = self.wakers.lock().unwrap_or_else(PoisonError::into_inner);
            [w[READ].take(), w[WRITE].take()]
        };
        for w in taken.into_iter().flatten() {
            w.wake();
        }
    }
}

/// The shared waker and the two sides' slots (made once per stream).
pub(crate) struct Wakers {
    sides: Arc<Sides>,
    both: Waker,
}

impl Wakers {
    pub(crate) fn new() -> Wakers {
        let sides = Arc::new(Sides::default());
        Wakers {
            both: Waker::from(sides.clone()),
            sides,
        }
    }

    /// Records `waker` as `side`'s and returns the waker to register.
    pub(crate) fn register(&self, side: usize, waker: &Waker) -> &Waker {
        let mut w = self
            .sides
            .wakers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match &mut w[side] {
            Some(old) if old.will_wake(waker) => {}
            slot => *slot = Some(waker.clone()),
        }
        &self.both
    }
}
