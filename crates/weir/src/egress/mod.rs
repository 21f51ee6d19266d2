//! Egress: where batches leave weir (`amqp` to RabbitMQ, `kafka` to a
//! Kafka-protocol service, `mqtt` to an MQTT broker, `file` to a directory), optionally through an emulated uplink (`link`).
//!
//! The scheduler hands batches ([`weir_core::scheduler::OutBatch`]) to [`run`] over a bounded channel (so a
//! slow or blocked destination back-pressures the scheduler, then the class
//! queues, then ingress). [`run`] encodes each batch once and hands it to the
//! [`Sink`] until the sink confirms it: a failed delivery is retried with
//! backoff, never dropped. Deliveries are serial: one transaction at a time,
//! the model of both the buffer-aided relaying and the piping papers (a fixed
//! per-transaction cost plus size over bandwidth).
//!
//! Between encoding and delivery each batch may be compressed (`compress`:
//! the piping-model choice per batch, run off the reactor), and every
//! confirmed transaction refines the online uplink estimate that both the
//! choice and the scheduler use.
//!
//! # Layout
//! - `batch.rs`: [`EncodedBatch`] and [`encode`].
//! - `sink.rs`: the [`Sink`] trait, [`SinkError`] and [`DeliveryObserver`].
//! - `deliver.rs`: the delivery loop [`run`] and its [`EgressContext`].
//! - `compress.rs`: the per-batch codec choice, off the reactor.
//! - `amqp/`, `kafka.rs`, `mqtt.rs`, `file.rs`: the sinks; `link.rs`: the emulated uplink;
//!   `probe.rs`: `weir probe-link`.

pub mod amqp;
mod batch;
pub mod compress;
mod deliver;
pub mod file;
pub mod kafka;
pub mod link;
pub mod mqtt;
pub mod probe;
#[cfg(test)]
mod sim_tests;
mod sink;

pub use batch::{encode, EncodedBatch};
pub use deliver::{run, EgressContext};
pub use sink::{confirmed, Confirm, DeliveryObserver, Sink, SinkError};
