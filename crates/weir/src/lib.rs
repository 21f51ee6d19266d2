//! weir: the I/O wiring around `weir-core`. Everything weir *decides* is in
//! `weir-core`; this crate moves bytes: MQTT and gRPC in, AMQP or files
//! out, timers, signals and metrics.
//!
//! # Layout
//! - [`config`]: the TOML config, parsed then validated with every problem
//!   reported at once.
//! - [`app`]: builds and runs everything from a config; ordered shutdown.
//! - [`clock`]: the wall clock, read in one place.
//! - [`memory`]: the memory limit weir plans for (given, or its cgroup's)
//!   and the class queues sized to fit it.
//! - [`intake`]: [`intake::Intake`], the one way into the class queues, for
//!   ingress, peering and the scheduler.
//! - [`ingress`]: the MQTT (`ingress::mqtt`) and gRPC (`ingress::grpc`)
//!   front ends.
//! - [`handoff`]: what the scheduler, the egress and peering hand each
//!   other (link-free permits, the PBTT state and grants).
//! - [`scheduler`]: the task that drives `weir-core`'s window step with
//!   real time and channels.
//! - [`egress`]: batch encoding, the retrying delivery loop, the AMQP and
//!   file sinks and the emulated uplink.
//! - [`peer`]: peering with other weir nodes: heartbeats, decentralised
//!   JANUS redirection, and forwarding of overflow (docs/peering.md).
//! - [`security`]: TLS certificates, password and ACL files, read at start
//!   and again when they change.
//! - [`metrics`]: Prometheus metrics; [`admin`] serves them over HTTP.
//! - [`reload`]: hot reload of the config file (SIGHUP, `POST /reload`).
//! - [`spool`]: the on-disk log of classes with `durability = "spool"`:
//!   the group-committing writer, the reader that refills the queues
//!   (most urgent class first), recovery at start-up, the sequence lease.
//! - [`consume`]: `weir consume`, batches read from RabbitMQ and each
//!   record handed on once.
//! - [`top`]: `weir top`, a terminal view of a running weir's metrics.
//! - [`priority`]: the CPU priority of weir's threads (`node.nice`,
//!   `node.realtime_priority`).
//! - [`telemetry`] sets up logging; [`systemd`] readiness and the
//!   watchdog; [`fuzzing`] the entry points of the fuzz targets.

// Hot-path refusals hand the record back by value (STYLE: never boxed); a
// `Record` with its spool index is over clippy's 128-byte threshold.
#![allow(clippy::result_large_err)]

pub mod admin;
pub mod app;
pub mod clock;
pub mod config;
pub mod consume;
pub mod egress;
#[doc(hidden)]
pub mod fuzzing;
pub mod handoff;
pub mod ingress;
pub mod intake;
pub mod memory;
pub mod metrics;
pub mod peer;
pub mod priority;
pub mod reload;
pub mod scheduler;
pub mod security;
pub mod spool;
pub mod systemd;
pub mod telemetry;
pub mod top;
