//! A thread that reads the device's asynchronous events (port error, QP
//! fatal, ...) as they happen, prints each one and lets the drill wait for
//! a given event instead of sleeping.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use verbs::sys::ibv_event_type as Ev;
use verbs::{Context, Deadline};

/// How long one `next_async_event` call may block: bounds how late the
/// thread notices `stop`.
const POLL_MS: i32 = 100;

#[derive(Default)]
struct Seen {
    names: Mutex<Vec<String>>,
    changed: Condvar,
}

/// Watches one device context for the life of the drill.
pub struct Watcher {
    stop: Arc<AtomicBool>,
    seen: Arc<Seen>,
    own_qp: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl Watcher {
    /// Starts the thread; events print as `EVENT side=<side> t_ms=... type=...`
    /// with `t_ms` counted from `t0`. `own_qp` marks events about our QP
    /// (its `Engine::raw_id`).
    pub fn start(ctx: &Context, side: &'static str, t0: Instant, own_qp: usize) -> Watcher {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Seen::default());
        let own_qp = Arc::new(AtomicUsize::new(own_qp));
        let (ctx, stop2, seen2, own2) = (ctx.clone(), stop.clone(), seen.clone(), own_qp.clone());
        let thread = std::thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                match ctx.next_async_event(POLL_MS) {
                    Ok(Some(ev)) => {
                        let name = ev.event_type.to_string();
                        // The crate gives port and device events no element.
                        let whose = match ev.event_type {
                            Ev::DEVICE_FATAL => "device",
                            _ if ev.element == 0 => "port",
                            _ if ev.element == own2.load(Ordering::Relaxed) => "our QP",
                            _ => "another object",
                        };
                        println!(
                            "EVENT side={side} t_ms={} type={name} port={} element={whose}",
                            t0.elapsed().as_millis(),
                            ev.port
                        );
                        let mut names = seen2.names.lock().unwrap_or_else(|p| p.into_inner());
                        names.push(name);
                        seen2.changed.notify_all();
                    }
                    Ok(None) => {}
                    Err(e) => {
                        eprintln!("fault_drill: async event watcher stopped: {e}");
                        return;
                    }
                }
            }
        });
        Watcher {
            stop,
            seen,
            own_qp,
            thread: Some(thread),
        }
    }

    /// Events about `qp` (a `raw_id`) are ours from now on (the drill
    /// replaced its QP).
    pub fn set_own_qp(&self, qp: usize) {
        self.own_qp.store(qp, Ordering::Relaxed);
    }

    /// Every event seen so far, in order.
    pub fn seen(&self) -> Vec<String> {
        self.seen
            .names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Waits until an event called `name` has been seen more than `after`
    /// times in total (pass the count taken before causing it), or `deadline`.
    pub fn wait_for(&self, name: &str, after: usize, deadline: Deadline) -> bool {
        let count = |v: &Vec<String>| v.iter().filter(|n| *n == name).count();
        let mut names = self.seen.names.lock().unwrap_or_else(|p| p.into_inner());
        while count(&names) <= after {
            let left = deadline.remaining();
            if left.is_zero() {
                return false;
            }
            names = match self.seen.changed.wait_timeout(names, left) {
                Ok((guard, _)) => guard,
                Err(p) => p.into_inner().0,
            };
        }
        true
    }

    /// How many events called `name` have been seen.
    pub fn count(&self, name: &str) -> usize {
        self.seen().iter().filter(|n| *n == name).count()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The device's nonzero hardware counters (rxe keeps retransmission and
/// error counts there), read from sysfs; empty where there are none.
pub fn counters(dev: &str) -> Vec<(String, u64)> {
    let dir = format!("/sys/class/infiniband/{dev}/ports/1/hw_counters");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<(String, u64)> = entries
        .flatten()
        .filter_map(|e| {
            let value = std::fs::read_to_string(e.path())
                .ok()?
                .trim()
                .parse()
                .ok()?;
            Some((e.file_name().to_string_lossy().into_owned(), value))
        })
        .filter(|(_, v)| *v > 0)
        .collect();
    out.sort();
    out
}
