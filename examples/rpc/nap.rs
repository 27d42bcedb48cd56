//! Spin, then sleep (`--sleep-after N`): after N empty polls in a row the
//! completion channel is armed, the queue polled once more (a completion
//! that came before arming raises no event), and only then slept on.

use std::time::Duration;

use verbs::{ArenaBuf, Deadline, Engine, Error};

pub struct Nap {
    after: u32,
    longest: Duration,
    idle: u32,
    armed: bool,
}

impl Nap {
    /// `after` 0: always spin. A sleep lasts at most `longest`.
    pub fn new(after: u32, longest: Duration) -> Nap {
        Nap {
            after,
            longest,
            idle: 0,
            armed: false,
        }
    }

    /// Call after each poll, with what it handed back; true when it slept.
    pub fn after_poll(&mut self, engine: &Engine<ArenaBuf>, got: usize) -> Result<bool, Error> {
        self.idle = if got == 0 { self.idle + 1 } else { 0 };
        if self.after == 0 || self.idle <= self.after {
            return Ok(false);
        }
        if !self.armed {
            engine.arm(false)?;
            self.armed = true;
            return Ok(false);
        }
        engine.sleep_until_event(Deadline::after(self.longest))?;
        (self.idle, self.armed) = (0, false);
        Ok(true)
    }
}
