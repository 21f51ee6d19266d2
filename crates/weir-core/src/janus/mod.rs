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
//! - [`scheme`]: the node-level schemes compared in Section VII (Native,
//!   QM-only, JANUS with a matcher), parsable from config.

pub mod allocator;
pub mod pbtt;
pub mod redirect;
pub mod scheme;

pub use allocator::{demand, Allocation, BandwidthTuple, BwAllocator, ClassLoad, Reallocation};
pub use pbtt::{Pbtt, PbttConfig, PbttDecision};
pub use redirect::{
    apply_grant, offer_from, redirect, requests_from, Grant, Offer, Request, Strategy,
};
pub use scheme::Scheme;

/// Why a JANUS computation could not run: bad parameters, never load.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum JanusError {
    /// No latency class given.
    #[error("at least one latency class is required")]
    NoClasses,
    /// Per-class inputs whose length differs from the number of classes.
    #[error("expected one value per latency class ({expected}), got {got}: pass a value for every class, most urgent first")]
    ClassCount {
        /// Number of classes configured.
        expected: usize,
        /// Number of values passed.
        got: usize,
    },
    /// A latency bound that is zero, negative or not finite.
    #[error("latency bound of class #{class} is {bound} s: it must be a finite, positive number of seconds")]
    BadBound {
        /// Index of the class.
        class: usize,
        /// The bound given, in seconds.
        bound: f64,
    },
    /// A minimum share outside 0..=1.
    #[error("min_share of class #{class} is {share}: it must be within 0.0..=1.0")]
    BadShare {
        /// Index of the class.
        class: usize,
        /// The share given.
        share: f64,
    },
    /// Minimum shares that add up to more than the whole link.
    #[error("the min_share of all classes add up to {0}, more than 1.0: lower some of them")]
    SharesExceedOne(f64),
    /// An outbound capacity that is negative or not finite.
    #[error("outbound capacity {0} is not a finite, non-negative rate")]
    BadCapacity(f64),
    /// A counting window that is zero, negative or not finite.
    #[error("counting window {0} s is not a finite, positive number of seconds")]
    BadWindow(f64),
    /// A scheme or strategy name that is not one of the known names.
    #[error("unknown scheme `{0}`: use one of native, qm-only, none, pmrfs, random, random:<seed>, fcfs, lrfs, best-fit")]
    UnknownScheme(String),
}

/// `x` if it is a finite positive number, else 0: rates, backlogs and
/// amounts from counters must never turn an allocation negative or NaN.
#[inline]
pub(crate) fn non_negative(x: f64) -> f64 {
    if x.is_finite() && x > 0.0 {
        x
    } else {
        0.0
    }
}
