//! Detect fast, route around, bring back: the watchdog and the port
//! events that fail a path, the reset that hands its chunks back to the
//! queue, and the reconnect and probe that re-admit it. Also the step
//! that ties posting, polling and these together.

use std::time::{Duration, Instant};

use crate::engine::{Engine, Provider};
use crate::error::{site, Error, ErrorKind};
use crate::memory::NicBuf;
use crate::sys::ibv_event_type as Event;
use crate::time::Deadline;
use crate::wr::{RemoteSlice, SendOp, SendRequest};

use super::chunks::ChunkState;
use super::config::PeerControl;
use super::device::PlaneDevice;
use super::path::{FailCause, PathState};
use super::settle::probe_tag;
use super::spray::{Step, Transfer};
use super::trace::TraceKind;

/// How often the planes' asynchronous events are read (a system call each).
const EVENT_CHECK: Duration = Duration::from_millis(10);

/// Longest a reset waits for the device's flushes before taking back
/// what is left itself.
const RESET_SETTLE: Duration = Duration::from_millis(500);

/// The most one gap between steps adds to a path's silence: a longer gap
/// means this process did not run (a starved host), and a device that
/// got no time to complete anything is not dead.
const STEP_GAP_MAX: Duration = Duration::from_millis(50);

impl<B: NicBuf, P: Provider> Transfer<B, P>
where
    Engine<B, P>: PlaneDevice<B, P>,
{
    /// One round: posts waiting chunks on the paths that are up, polls
    /// every plane once, then fails stalled paths (and those on a plane
    /// that reported `PORT_ERR`), resets failed paths (their chunks wait
    /// again) and probes those due. `control` asks the peer to reconnect
    /// its end of a path being re-admitted.
    ///
    /// The watchdog counts only time this loop ran: a gap between steps
    /// adds at most 50 ms to a path's silence, so call `step` at least that
    /// often (`run` does).
    pub fn step(&mut self, control: &mut impl PeerControl) -> Result<Step, Error> {
        let now = Instant::now();
        let ran = now
            .saturating_duration_since(self.last_step)
            .min(STEP_GAP_MAX);
        self.last_step = now;
        self.all_silent += ran;
        for path in self.paths.iter_mut().filter(|p| p.busy()) {
            path.silent += ran;
        }
        let heard = self.heard();
        let mut events = self.post();
        events += self.poll()?;
        if self.heard() != heard {
            self.all_silent = Duration::ZERO;
        }
        if self.config.port_events && now.duration_since(self.last_event_check) >= EVENT_CHECK {
            self.last_event_check = now;
            self.read_port_events(now)?;
        }
        let (watchdog, all_silent) = (self.bound.watchdog, self.all_silent);
        for path in &mut self.paths {
            if path.stalled(watchdog, all_silent) {
                path.fail(FailCause::Stalled);
            }
            path.update_rate(now);
        }
        self.reset_failed(now)?;
        if self.config.readmit {
            self.probe_due(now, control)?;
        }
        let done = self.chunks.all_done();
        if done && self.finished.is_none() {
            self.finished = Some(now);
        }
        Ok(Step { events, done })
    }

    /// Steps until every chunk is done, calling `on_tick` about every
    /// `tick`, sleeping `idle` after a step that did nothing (zero: spin),
    /// and failing when `deadline` passes first.
    pub fn run(
        &mut self,
        control: &mut impl PeerControl,
        deadline: Deadline,
        idle: Duration,
        tick: Duration,
        mut on_tick: impl FnMut(&Transfer<B, P>),
    ) -> Result<(), Error> {
        let mut last_tick = Instant::now();
        loop {
            let step = self.step(control)?;
            if last_tick.elapsed() >= tick || step.done {
                last_tick = Instant::now();
                on_tick(self);
            }
            if step.done {
                return Ok(());
            }
            if deadline.passed() {
                return Err(Error::new(
                    site!(
                        "Transfer::run",
                        "the deadline passed before every chunk was done",
                        "are any paths up? Transfer::paths shows each one's state and last cause"
                    ),
                    ErrorKind::TimedOut,
                ));
            }
            if step.events == 0 && !idle.is_zero() {
                std::thread::sleep(idle);
            }
        }
    }

    /// Takes path `index` out as if it had failed, at the next step: its
    /// chunks in flight go out again on the other paths, and it comes
    /// back like any failed path (to drain a path, or to test that a
    /// path failed while its requests are still landing costs no bytes).
    pub fn fail_path(&mut self, index: usize) {
        if let Some(path) = self.paths.get_mut(index) {
            path.fail(FailCause::Requested);
        }
    }

    /// Completions of chunks and probes so far, to tell whether a step
    /// heard anything.
    fn heard(&self) -> u64 {
        let per = |p: &super::path::Path| p.stats.chunks + u64::from(p.stats.readmissions);
        self.paths.iter().map(per).sum()
    }

    /// Reads every plane's pending asynchronous events: `PORT_ERR` fails
    /// the plane's paths at once (no need to wait for the retry timer);
    /// `PORT_ACTIVE` makes its failed paths due for a probe.
    fn read_port_events(&mut self, now: Instant) -> Result<(), Error> {
        for p in 0..self.planes.len() {
            while let Some(event) = self.planes[p].engine.0.next_port_event()? {
                let plane = p as u16;
                if event == Event::PORT_ERR {
                    self.port_err_at[p] = Some(now);
                    for path in self.paths.iter_mut().filter(|x| x.stats.plane == plane) {
                        path.fail(FailCause::PortError);
                    }
                } else if event == Event::PORT_ACTIVE {
                    self.port_active_at[p] = Some(now);
                    for path in self.paths.iter_mut().filter(|x| x.stats.plane == plane) {
                        path.next_probe = now;
                    }
                }
            }
        }
        Ok(())
    }

    /// Resets every path marked failing: ERR flushes what it held (each
    /// chunk waits again, its buffer back in its slot), RESET and INIT make
    /// it inert (packets still arriving for it are dropped). It is then
    /// down until its next probe replaces it. A queue pair that cannot be
    /// reset is destroyed instead, which hands its requests back the same
    /// way; one that cannot be destroyed either is leaked with them (see
    /// `strand`).
    fn reset_failed(&mut self, now: Instant) -> Result<(), Error> {
        for index in 0..self.paths.len() {
            if !self.paths[index].failing {
                continue;
            }
            let (plane, qp, held) = {
                let path = &self.paths[index];
                let s = &path.stats;
                if let Some(cause) = s.last_cause {
                    let kind = TraceKind::Failed { cause };
                    self.trace
                        .record(index as u16, path.generation, path.qpn, kind);
                }
                (s.plane, s.qp, s.in_flight)
            };
            let (engine, mut to) = self.settle_on(usize::from(plane));
            // Other paths of this engine complete meanwhile: same rules.
            let reset = engine.reset_qp(qp, Deadline::after(RESET_SETTLE), |c| to.settle(c, plane));
            // A queue pair that could not be reset may still hold requests:
            // destroyed, it hands them back as flushed, and they wait again
            // like any failed path's (the next probe makes a fresh one).
            let kept = match reset {
                Ok(()) => Ok(()),
                Err(_) => engine.remove_qp_with(qp, |c| to.settle(c, plane)),
            };
            let path = &mut self.paths[index];
            let ok = reset.is_ok();
            let kind = TraceKind::Reset { ok, held };
            self.trace
                .record(index as u16, path.generation, path.qpn, kind);
            if !ok {
                path.next_probe = now + self.config.probe_backoff_max;
            }
            if let Err(leaked) = kept {
                self.strand(index as u16, leaked)?;
            }
            let path = &mut self.paths[index];
            if path.stats.state == PathState::Probing {
                path.stats.failed_probes += 1;
            } else {
                path.stats.failures += 1;
                path.failed_at = Some(now);
                self.first_failure.get_or_insert(now);
            }
            path.failing = false;
            path.stats.state = PathState::Down;
            path.stats.in_flight = 0;
            path.stats.rate = 0.0;
            path.backoff = if path.backoff.is_zero() {
                self.config.probe_backoff
            } else {
                (path.backoff * 2).min(self.config.probe_backoff_max)
            };
            path.next_probe = path.next_probe.max(now + path.backoff);
        }
        Ok(())
    }

    /// Path `path`'s queue pair was leaked (its reset and its destroy
    /// failed) with the buffers of the chunks in flight on it: those
    /// chunks wait again for a plane that still holds a buffer of them
    /// (`post_one` passes over the others). A chunk no plane holds a
    /// buffer of can never be sent: the transfer fails now, with the
    /// destroy's error, rather than at its deadline.
    fn strand(&mut self, path: u16, leaked: Error) -> Result<(), Error> {
        let mut carried = true;
        for c in 0..self.chunks.len() {
            if self.chunks.state(c) == ChunkState::InFlight(path) {
                self.chunks.lost(c, path);
                carried &= self.planes.iter().any(|p| p.bufs[c].is_some());
            }
        }
        if carried {
            return Ok(());
        }
        Err(leaked.leaked(site!(
            "Transfer::step",
            "a path's queue pair could be neither reset nor destroyed, and was leaked with the only buffers of chunks in flight on it: they can never be sent",
            "the errno is the destroy's; Transfer::paths shows the path (and why it failed)"
        )))
    }

    /// Probes every down path whose time has come and whose port is
    /// active: its queue pair is replaced by a fresh one, the peer replaces
    /// and connects its end, this end connects to the peer's new endpoint, and a zero-length RDMA Write (no
    /// buffer, no bytes touched) crosses the path. Its success re-admits
    /// the path (in `settle`); its failure or silence fails it again.
    fn probe_due(&mut self, now: Instant, control: &mut impl PeerControl) -> Result<(), Error> {
        for index in 0..self.paths.len() {
            let path = &self.paths[index];
            if path.stats.state != PathState::Down || now < path.next_probe {
                continue;
            }
            let (plane, qp) = (usize::from(path.stats.plane), path.stats.qp);
            let port = self.planes[plane].port;
            let active = self.planes[plane].engine.0.port_active(port);
            let peer = if active {
                // A fresh queue pair: see `PeerControl` for why not the old one.
                let engine = &mut self.planes[plane].engine.0;
                // The old one holds nothing (reset; or removed by an earlier
                // try); a failed destroy leaks it. Removed first, so the
                // new one takes its slot.
                let _ = engine.remove_qp(qp);
                let (fresh, ours) = engine.fresh_qp(&self.config.qp)?;
                self.paths[index].stats.qp = fresh;
                control.reconnect(index, &ours).map(|peer| (ours, peer))
            } else {
                None
            };
            let qp = self.paths[index].stats.qp;
            let path = &mut self.paths[index];
            let Some((ours, peer)) = peer else {
                // The port is down or the peer could not answer: later.
                path.stats.failed_probes += u32::from(active);
                path.backoff = (path.backoff * 2).min(self.config.probe_backoff_max);
                path.next_probe = now + path.backoff;
                continue;
            };
            let options = self.config.paths.connect_options(index);
            let plane = &mut self.planes[plane];
            let trace = &mut self.trace;
            let probe = RemoteSlice::new(&plane.remote, 0, 0).and_then(|target| {
                path.mtu = plane.engine.0.connect_qp(qp, &peer, &options)?;
                path.generation += 1;
                path.qpn = ours.qpn;
                let kind = TraceKind::Connected {
                    psn: ours.psn,
                    peer_qpn: peer.qpn,
                    peer_psn: peer.psn,
                    mtu: path.mtu,
                };
                trace.record(index as u16, path.generation, path.qpn, kind);
                let req = SendRequest::empty(SendOp::Write(target)).tag(probe_tag(index));
                plane.engine.0.post_send(qp, req).map_err(|e| e.error)?;
                let psn = ours.psn;
                path.next_psn = (psn + 1) & crate::endpoint::MAX_PSN;
                trace.record(
                    index as u16,
                    path.generation,
                    path.qpn,
                    TraceKind::Probe { psn },
                );
                Ok(())
            });
            path.stats.state = PathState::Probing;
            path.silent = Duration::ZERO;
            if probe.is_err() {
                path.fail(FailCause::Reconnect);
            }
        }
        Ok(())
    }
}
