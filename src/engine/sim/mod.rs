//! A deterministic simulation of the engine against a reference model
//! (tests only): a simulated device behind the same `Provider` seam the
//! device sits behind, completing requests in every order the verbs
//! specification allows and, when hostile, in orders it forbids; after
//! every step, the model checks that no buffer is handed back or freed
//! while the device may use it, that none is lost, that no queue wedges,
//! and that the data path allocates nothing.
//!
//! `cargo test --lib sim` runs the CI budget (printing its operation
//! count); `VERBS_SIM_OPS=N VERBS_SIM_SEEDS=K` runs more, and
//! `VERBS_SIM_SEED=S` replays one seed exactly.
//!
//! # Safety
//!
//! Test code, allowed `unsafe` to read the work requests the engine posts
//! (the seam's contract) and to count allocations.
#![allow(unsafe_code)]

mod alloc_count;
#[cfg(test)]
mod binds;
mod callback_posts;
mod counted;
pub(crate) mod device;
mod drain;
mod forge;
mod lane_ops;
#[cfg(test)]
mod lane_recv;
mod lifecycle;
#[cfg(test)]
mod limits;
pub(crate) mod model;
mod plain_window;
mod plan;
mod polling;
mod prepared_ops;
mod provider;
#[cfg(test)]
mod reset_flush;
pub(crate) mod rng;
mod run;
pub(crate) mod seam;
#[cfg(test)]
mod srq_in_place;
mod srq_lane;
mod srq_lane_ops;
pub(crate) mod stub;
mod window;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod unreported;
