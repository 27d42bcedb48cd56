//! The reference model: plain maps of which buffers exist, which were
//! freed, and on which queue pair each was last posted. With the device's
//! record of what it still holds, it says after every step whether the
//! engine kept its promise: no buffer handed back or freed while posted,
//! every buffer back or freed once, none lost unless its queue pair leaked.

use alloc::collections::{BTreeMap, BTreeSet};

std::thread_local! {
    /// Buffers the device may still touch (posted, not yet finished): a
    /// buffer dropped or handed back while here is the bug the simulation
    /// hunts.
    pub(crate) static BUSY: core::cell::RefCell<BTreeMap<u64, u32>> = const { core::cell::RefCell::new(BTreeMap::new()) };
}

std::thread_local! {
    /// The step the current run is at, for the failure report (a panic
    /// anywhere in the engine still says where it happened).
    static STEP: core::cell::Cell<u64> = const { core::cell::Cell::new(0) };
}

/// Records the step the current run is at.
pub(crate) fn set_step(step: u64) {
    STEP.with(|s| s.set(step));
}

/// The step the current run was at last.
pub(crate) fn last_step() -> u64 {
    STEP.with(|s| s.get())
}

/// True while the device may still touch buffer `id` (some post of it is
/// not finished: a prepared request's buffer may be posted many times).
pub(crate) fn busy(id: u64) -> bool {
    BUSY.with(|b| b.borrow().contains_key(&id))
}

/// Where a buffer was last posted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Home {
    /// Queue pair slot `index` (its rings or its prepared requests).
    Qp(u32),
    /// The shared receive queue.
    Srq,
}

#[derive(Default)]
struct State {
    created: u64,
    dropped: BTreeSet<u64>,
    home: BTreeMap<u64, Home>,
}

std::thread_local! {
    static MODEL: core::cell::RefCell<State> = core::cell::RefCell::new(State::default());
}

/// Starts a fresh model (one per run).
pub(crate) fn reset() {
    MODEL.with(|m| *m.borrow_mut() = State::default());
    VIOLATION.with(|v| v.borrow_mut().take());
    set_step(0);
}

/// A new buffer's id.
pub(crate) fn new_id() -> u64 {
    MODEL.with(|m| {
        let mut m = m.borrow_mut();
        m.created += 1;
        m.created
    })
}

/// True once buffer `id` was dropped.
#[cfg(test)]
pub(crate) fn dropped(id: u64) -> bool {
    MODEL.with(|m| m.borrow().dropped.contains(&id))
}

/// `id` was dropped: never twice.
pub(crate) fn note_dropped(id: u64) {
    let fresh = MODEL.with(|m| m.borrow_mut().dropped.insert(id));
    if !fresh {
        violation(alloc::format!("buffer {id} dropped twice"));
    }
}

std::thread_local! {
    /// A broken promise seen in a destructor, reported at the end of the
    /// step: a destructor may run while a test callback unwinds on purpose,
    /// when panicking again would abort.
    static VIOLATION: core::cell::RefCell<Option<alloc::string::String>> =
        const { core::cell::RefCell::new(None) };
}

/// Records a broken promise found where panicking is not safe.
pub(crate) fn violation(what: alloc::string::String) {
    if std::thread::panicking() {
        VIOLATION.with(|v| {
            v.borrow_mut().get_or_insert(what);
        });
    } else {
        panic!("{what}");
    }
}

/// Panics with the first broken promise a destructor recorded, if any.
pub(crate) fn check_violations(seed: u64, step: u64) {
    if let Some(what) = VIOLATION.with(|v| v.borrow_mut().take()) {
        panic!("seed {seed} step {step}: {what}");
    }
}

/// `id` is being posted to `home`.
pub(crate) fn note_posted(id: u64, home: Home) {
    MODEL.with(|m| {
        m.borrow_mut().home.insert(id, home);
    });
}

/// The engine handed `id` back: the device must be done with it.
pub(crate) fn check_handed_back(id: u64, seed: u64, step: u64) {
    assert!(
        !busy(id),
        "seed {seed} step {step}: buffer {id} handed back while the device may still use it"
    );
}

/// At the end: every buffer not dropped belongs to a queue (pair) whose
/// destroy failed (`leaked`), and so was leaked on purpose.
pub(crate) fn check_nothing_lost(leaked: &BTreeSet<Home>, seed: u64) -> u64 {
    MODEL.with(|m| {
        let m = m.borrow();
        let mut kept = 0;
        for id in 1..=m.created {
            if m.dropped.contains(&id) {
                continue;
            }
            let home = m.home.get(&id).copied();
            assert!(
                home.is_some_and(|h| leaked.contains(&h)),
                "seed {seed}: buffer {id} (last posted to {home:?}) was lost: neither returned, freed, nor leaked with a failed destroy"
            );
            kept += 1;
        }
        kept
    })
}
