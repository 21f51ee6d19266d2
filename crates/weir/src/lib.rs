//! weir: the I/O wiring around `weir-core`. Everything weir *decides* is in
//! `weir-core`; this crate moves bytes: MQTT and gRPC in, AMQP or files
//! out, timers, signals and metrics.
//!
//! # Layout
//! - [`config`]: the TOML config, parsed then validated with every problem
//!   reported at once.
//! - [`app`]: builds and runs everything from a config; ordered shutdown.
//! - [`ingress`]: the shared [`ingress::IngressHandle`] and the MQTT
//!   (`ingress::mqtt`) and gRPC (`ingress::grpc`) front ends.
//! - [`scheduler`]: the PBTT window loop and the drain into batches.
//! - [`egress`]: batch encoding, the retrying delivery loop, the AMQP and
//!   file sinks and the emulated uplink.
//! - [`peer`]: peering with other weir nodes: heartbeats, decentralised
//!   JANUS redirection, and forwarding of overflow (docs/peering.md).
//! - [`metrics`]: Prometheus metrics; [`admin`] serves them over HTTP.
//! - [`telemetry`] sets up logging.

pub mod admin;
pub mod app;
pub mod config;
pub mod egress;
pub mod ingress;
pub mod metrics;
pub mod peer;
pub mod scheduler;
pub mod telemetry;
