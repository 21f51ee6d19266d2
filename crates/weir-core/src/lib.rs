//! weir-core: every decision the weir edge relay makes, as plain data and
//! functions.
//!
//! Nothing here does I/O, spawns tasks or reads a clock: callers pass `now`
//! (a [`std::time::Duration`] since an epoch of their choosing) and act on the
//! values returned. That keeps every algorithm deterministic, testable on a
//! virtual clock and benchmarkable without a runtime (the shape of
//! `quinn-proto` under `quinn`).
//!
//! # Layout
//! The vocabulary:
//! - [`class`]: latency classes (JANUS Table I) and the ordered set of them.
//! - [`record`]: the unit weir relays, with origin and sequence number.
//! - [`classify`]: MQTT topic filters and gRPC stream names mapped to classes.
//!
//! The papers' models, as functions of what was measured:
//! - [`janus`]: PBTT (Algorithm 1), BWAllocator (Algorithm 2), PMRFS
//!   (Algorithm 3) and the baseline matchers, and the node-level schemes.
//! - [`link_estimate`]: uplink bandwidth `Th_up` and per-transaction time
//!   `T_sc` fitted online (piping paper Eq. 1, 3, 5-6).
//! - [`batching`]: batch size and closing rule from the buffer-aided
//!   relaying inequalities (Li et al., Eq. 5-6, Lemma 1, Theorems 1-2).
//! - [`compression`]: the per-batch codec choice by the piping model
//!   (Dzhagaryan and Milenkovic, Eq. 3, 19-20) over observed codec tables.
//! - [`admission`]: what may be committed to the link ahead of an urgent
//!   record (the horizon, the batch cap).
//!
//! The queues: [`queueing`] (the per-class queues, token buckets, the
//! drain into batches, and the queues sized to a memory limit).
//!
//! The state machines the relay drives (`handle_*`, `poll_*`):
//! - [`scheduler`]: the window step: PBTT and the uplink estimate set the
//!   rates, the planner the batch plans, the drain the batches.
//! - [`delivery`]: the egress's delivery machine: the window of
//!   unconfirmed batches, the pipe (bytes in flight from the delivery rate
//!   and round trip), the urgent lane, retries with [`backoff`].
//! - [`peer`]: JANUS redirection without its orchestrator: each node's view
//!   of its peers, the per-node round decision, provider reservations with
//!   their token buckets, receiver leases, records in flight and the
//!   provider's custody of forwarded records until they are delivered.
//! - [`spool`]: the spool's file format, segment scan and recovery, and
//!   each class's log of what is on disk and released.
//!
//! Beside them: [`security`] (Mosquitto password and ACL files, and who
//! may connect as whom), [`dedupe`] (which `(origin, seq)` were already
//! handed on, for consumers), [`sim`] (the scheduler and the delivery
//! machine joined over a model link, on a simulated clock).

pub mod admission;
pub mod backoff;
pub mod batching;
pub mod class;
pub mod classify;
pub mod compression;
pub mod dedupe;
pub mod delivery;
pub mod janus;
pub mod link_estimate;
pub mod peer;
pub mod queueing;
pub mod record;
pub mod scheduler;
pub mod security;
pub mod sim;
pub mod spool;

pub use class::{ClassId, ClassSet, ClassSetError, LatencyClass};
pub use record::{NodeId, Receipt, Record};
