//! JANUS (Wen et al., IEEE TSC 2023) Sections IV-V and VII: per-node
//! bandwidth reallocation among latency classes and redirection of overflow
//! to neighbours with spare bandwidth.
//!
//! Every function here is pure arithmetic over rates and sizes. Units are
//! abstract "units per second" (weir uses bytes/s, the lab records/s);
//! durations are seconds as `f64` or [`std::time::Duration`]s passed in by
//! the caller, never read from a clock.
//!
//! The flow on one node, every counting window `t`:
//! 1. the scheduler measures each class's arrival rate and backlog
//!    ([`ClassLoad`]) and calls [`Pbtt::on_window`] (Algorithm 1);
//! 2. if a class's estimated delay (Eq. 1) breaks its bound, PBTT runs
//!    [`BwAllocator`] (Algorithm 2 with Eq. 22), which sets the per-class
//!    rates and yields a [`BandwidthTuple`]: shortages negative, spare
//!    positive;
//! 3. the tuples of all nodes go to a matcher ([`redirect()`], PMRFS of
//!    Algorithm 3 or a baseline), whose [`Grant`]s tell receivers how much
//!    of a class to redirect where, and providers ([`Pbtt::apply_grant`])
//!    how much spare to reserve for it (Fig. 4).
//!
//! # Layout
//! - [`allocator`]: Eq. 22 demand, BWAllocator (Algorithm 2) generalised to
//!   N classes with optional minimum shares, [`Allocation`] and
//!   [`BandwidthTuple`].
//! - [`pbtt`]: PBTT (Algorithm 1) with the delay and throughput estimates of
//!   Eq. 1-3.
//! - [`redirect`](mod@redirect): PMRFS (Algorithm 3) and the Random, FCFS, LRFS and Best
//!   Fit baselines of Section V-B3 / VII, plus tuple-to-request helpers.
//! - `error.rs`: [`JanusError`] and the `non_negative` guard.
//! - [`scheme`]: the node-level schemes compared in Section VII (Native,
//!   QM-only, JANUS with a matcher), parsable from config.

pub mod allocator;
mod error;
pub mod pbtt;
pub mod redirect;
pub mod scheme;

pub use allocator::{demand, Allocation, BandwidthTuple, BwAllocator, ClassLoad, Reallocation};
pub(crate) use error::non_negative;
pub use error::JanusError;
pub use pbtt::{Pbtt, PbttConfig, PbttDecision};
pub use redirect::{
    apply_grant, offer_from, redirect, requests_from, Grant, Offer, Request, Strategy,
};
pub use scheme::Scheme;
