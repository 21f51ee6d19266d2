//! Prometheus metrics (`weir_<thing>_<unit>` / `_total`, `class` label where
//! per class), served on the admin listener at `/metrics`.
//!
//! The metrics know nothing of the components they count: every component
//! (intake, scheduler, egress, peering) holds the [`Metrics`] and calls the
//! recorder for what happened. [`peer`] holds peering's own family
//! (`weir_peer_*`); [`labels`] the label sets both use.

pub mod amqp;
pub mod labels;
pub mod latency;
pub mod peer;
pub mod security;
pub mod spool;

use std::sync::atomic::{AtomicI64, AtomicU64};
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use weir_core::compression::Codec;
use weir_core::link_estimate::LinkEstimate;
use weir_core::{ClassId, ClassSet};

pub use labels::{ClassLabel, CodecLabel};
pub use latency::LatencyMetrics;
pub use peer::{PeerMetrics, RefusalLabel};
pub use security::SecurityMetrics;
pub use spool::{DropReason, SpoolMetrics};

/// Every metric weir exports.
pub struct Metrics {
    registry: Registry,
    names: Vec<ClassLabel>,
    accepted: Family<ClassLabel, Counter>,
    /// `accepted`'s counter of each class, by index: counted per record,
    /// without the family's lookup (a hash and a lock every connection
    /// shares).
    accepted_by_class: Vec<Counter>,
    refused: Family<ClassLabel, Counter>,
    backpressured: Family<ClassLabel, Counter>,
    dropped: Family<ClassLabel, Counter>,
    forwarded: Family<ClassLabel, Counter>,
    undelivered: Family<ClassLabel, Counter>,
    allocated: Family<ClassLabel, Gauge<f64, AtomicU64>>,
    queued: Family<ClassLabel, Gauge<i64, AtomicI64>>,
    /// Batches confirmed by the egress.
    pub batches_confirmed: Counter,
    /// Batches re-published after a failure (reconnect, nack, return).
    pub batches_republished: Counter,
    /// Batches of the most urgent class taken beyond a full window of
    /// unconfirmed batches (`egress.amqp.urgent_lane`).
    pub urgent_lane_batches: Counter,
    /// Bytes of batch bodies confirmed by the egress.
    pub egress_bytes: Counter,
    /// The same batches' bytes before compression.
    pub egress_raw_bytes: Counter,
    /// Malformed or refused ingress connections/requests.
    pub protocol_errors: Counter,
    encoded: Family<CodecLabel, Counter>,
    compression_samples: Counter,
    compression_predicted: Gauge<f64, AtomicU64>,
    link_bandwidth: Gauge<f64, AtomicU64>,
    link_transaction: Gauge<f64, AtomicU64>,
    link_queue: Gauge<f64, AtomicU64>,
    link_acted: Gauge<f64, AtomicU64>,
    link_saturated: Gauge,
    pipe_bytes: Gauge,
    pipe_batch_bytes: Gauge,
    delivery_rate: Gauge<f64, AtomicU64>,
    round_trip: Gauge<f64, AtomicU64>,
    link_proven: Gauge<f64, AtomicU64>,
    link_quiet: Gauge,
    link_probe_phase: Gauge,
    /// Bandwidth probes the uplink kept up with.
    pub link_probes_kept_up: Counter,
    /// Bandwidth probes the uplink did not keep up with.
    pub link_probes_full: Counter,
    /// Bandwidth probes that sent too little to be judged.
    pub link_probes_inconclusive: Counter,
    /// Peering (`weir_peer_*`).
    pub peer: PeerMetrics,
    /// The spool (`weir_spool_*`).
    pub spool: SpoolMetrics,
    /// Authentication, ACLs and TLS.
    pub security: SecurityMetrics,
    /// Latency against each class's bound, and config reloads.
    pub latency: LatencyMetrics,
    /// The AMQP egress (`weir_egress_amqp_*`).
    pub amqp: std::sync::Arc<amqp::AmqpMetrics>,
    /// Run before each rendering, to bring gauges up to date.
    refresh: std::sync::Mutex<Vec<Refresh>>,
}

/// What [`Metrics::uplink`] reads.
#[derive(Debug, Clone, PartialEq)]
pub struct UplinkView {
    /// The egress's latest estimate of the uplink (wire bytes).
    pub estimate: LinkEstimate,
    /// The allocated rate of each class, most urgent first (record
    /// bytes/s); `C_out` in force is their sum.
    pub rates: Vec<f64>,
}

impl UplinkView {
    /// `C_out` in force: the sum of the allocated class rates.
    pub fn c_out(&self) -> f64 {
        self.rates.iter().sum()
    }
}

/// A gauge update run at scrape time.
type Refresh = Box<dyn Fn(&Metrics) + Send + Sync>;

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// Registers every metric for these classes.
    pub fn new(classes: &ClassSet) -> Self {
        let mut m = Metrics {
            names: classes
                .iter()
                .map(|(_, c)| ClassLabel {
                    class: c.name.clone(),
                })
                .collect(),
            accepted: Family::default(),
            accepted_by_class: Vec::new(),
            refused: Family::default(),
            backpressured: Family::default(),
            dropped: Family::default(),
            forwarded: Family::default(),
            undelivered: Family::default(),
            allocated: Family::default(),
            queued: Family::default(),
            batches_confirmed: Counter::default(),
            batches_republished: Counter::default(),
            urgent_lane_batches: Counter::default(),
            egress_bytes: Counter::default(),
            egress_raw_bytes: Counter::default(),
            protocol_errors: Counter::default(),
            encoded: Family::default(),
            compression_samples: Counter::default(),
            compression_predicted: Gauge::default(),
            link_bandwidth: Gauge::default(),
            link_transaction: Gauge::default(),
            link_queue: Gauge::default(),
            link_acted: Gauge::default(),
            link_saturated: Gauge::default(),
            pipe_bytes: Gauge::default(),
            pipe_batch_bytes: Gauge::default(),
            delivery_rate: Gauge::default(),
            link_proven: Gauge::default(),
            link_quiet: Gauge::default(),
            link_probe_phase: Gauge::default(),
            link_probes_kept_up: Counter::default(),
            link_probes_full: Counter::default(),
            link_probes_inconclusive: Counter::default(),
            round_trip: Gauge::default(),
            peer: PeerMetrics::new(classes),
            spool: SpoolMetrics::new(classes),
            security: SecurityMetrics::default(),
            latency: LatencyMetrics::new(classes),
            amqp: std::sync::Arc::default(),
            refresh: std::sync::Mutex::new(Vec::new()),
            registry: Registry::with_prefix("weir"),
        };
        m.accepted_by_class = m
            .names
            .iter()
            .map(|l| m.accepted.get_or_create(l).clone())
            .collect();
        m.register_records();
        m.register_egress();
        m.register_link();
        m.peer.register(&mut m.registry);
        m.spool.register(&mut m.registry);
        m.security.register(&mut m.registry);
        m.latency.register(&mut m.registry);
        m.amqp.register(&mut m.registry);
        m.on_render(|m| m.amqp.refresh());
        m
    }

    /// Registers the per-class record counters and gauges (`weir_records_*`, `weir_class_*`).
    fn register_records(&mut self) {
        self.registry.register(
            "records_accepted",
            "Records enqueued at ingress",
            self.accepted.clone(),
        );
        self.registry.register(
            "records_refused",
            "Records refused at ingress (oversized)",
            self.refused.clone(),
        );
        self.registry.register(
            "records_backpressured",
            "Pushes that found their class queue full and waited",
            self.backpressured.clone(),
        );
        self.registry.register(
            "records_dropped",
            "QoS 0 records dropped because their queue was full (qos0_when_full = drop)",
            self.dropped.clone(),
        );
        self.registry.register(
            "records_forwarded",
            "Records confirmed by the egress",
            self.forwarded.clone(),
        );
        self.registry.register(
            "shutdown_undelivered_records",
            "Records still in memory (queued, batched or unconfirmed) when the shutdown deadline (egress.drain_timeout) passed; those of spool classes stay on disk",
            self.undelivered.clone(),
        );
        self.registry.register(
            "class_allocated_bytes_per_second",
            "Outbound rate BWAllocator gives each class",
            self.allocated.clone(),
        );
        self.registry.register(
            "class_queued_records",
            "Records waiting in each class queue",
            self.queued.clone(),
        );
    }

    /// Registers the egress's batch and byte counters and its codec choice.
    fn register_egress(&mut self) {
        self.registry.register(
            "batches_confirmed",
            "Batches confirmed by the egress",
            self.batches_confirmed.clone(),
        );
        self.registry.register(
            "batches_republished",
            "Batches published again after a failure",
            self.batches_republished.clone(),
        );
        self.registry.register(
            "urgent_lane_batches",
            "Batches of the most urgent class sent beyond a full window of unconfirmed batches (egress.amqp.urgent_lane)",
            self.urgent_lane_batches.clone(),
        );
        self.registry.register(
            "egress_bytes",
            "Bytes of batch bodies confirmed by the egress",
            self.egress_bytes.clone(),
        );
        self.registry.register(
            "egress_raw_bytes",
            "Bytes of the batches confirmed by the egress, before compression (with weir_egress_bytes_total: the compression ratio)",
            self.egress_raw_bytes.clone(),
        );
        self.registry.register(
            "protocol_errors",
            "Ingress connections or requests refused as malformed",
            self.protocol_errors.clone(),
        );
        self.registry.register(
            "batches_encoded",
            "Batches encoded for the egress, by the codec of the body sent (none when compression did not shrink it)",
            self.encoded.clone(),
        );
        self.registry.register(
            "compression_samples",
            "Batches whose first 64 KiB were compressed with a codec not in use, to refresh its ratio and speed",
            self.compression_samples.clone(),
        );
        self.registry.register(
            "compression_predicted_bytes_per_second",
            "Piping-model effective throughput (uncompressed bytes/s) predicted for the codec chosen for the last batch",
            self.compression_predicted.clone(),
        );
    }

    /// Registers the link estimate and the pipe (`weir_link_*`, `weir_egress_pipe_*`, delivery rate and round trip).
    fn register_link(&mut self) {
        self.registry.register(
            "link_bandwidth_bytes_per_second",
            "Online estimate of the uplink bandwidth Th_up from completed transactions",
            self.link_bandwidth.clone(),
        );
        self.registry.register(
            "link_transaction_seconds",
            "Online estimate of the uplink's fixed per-transaction time T_sc",
            self.link_transaction.clone(),
        );
        self.registry.register(
            "link_queue_seconds",
            "Median round trip of the last 16 confirmed transactions above the lowest of the last 10 s: the uplink's queue",
            self.link_queue.clone(),
        );
        self.registry.register(
            "link_acted_bytes_per_second",
            "The uplink bandwidth acted on (C_out follows it with track_uplink)",
            self.link_acted.clone(),
        );
        self.registry.register(
            "link_saturated",
            "Of the last 64 confirmed transactions, how many were sent while the link was still busy with earlier ones",
            self.link_saturated.clone(),
        );
        self.registry.register(
            "egress_pipe_bytes",
            "Bytes the egress allows unconfirmed: twice the delivery rate times the round trip, within its floor and cap",
            self.pipe_bytes.clone(),
        );
        self.registry.register(
            "egress_pipe_batch_bytes",
            "The batch size the egress's pipe asks the scheduler for",
            self.pipe_batch_bytes.clone(),
        );
        self.registry.register(
            "egress_delivery_rate_bytes_per_second",
            "Highest delivery rate (bytes confirmed per second) of the last 2 s",
            self.delivery_rate.clone(),
        );
        self.registry.register(
            "egress_round_trip_seconds",
            "Lowest send-to-confirm round trip of the last 10 s",
            self.round_trip.clone(),
        );
        self.registry.register(
            "link_proven_bytes_per_second",
            "Highest rate a bandwidth probe proved the uplink carries within the last 60 s (a floor of the bandwidth acted on)",
            self.link_proven.clone(),
        );
        self.registry.register(
            "link_quiet",
            "1 while round trips sit within 8 ms of the lowest of batches of about the same size (no queue on the uplink; a bandwidth probe may start)",
            self.link_quiet.clone(),
        );
        self.registry.register(
            "link_probe_phase",
            "Where the bandwidth probe is: 0 waiting, 1 a pulse, 2 awaiting its verdict, 3 a drain",
            self.link_probe_phase.clone(),
        );
        self.registry.register(
            "link_probes_kept_up",
            "Bandwidth probes (a pulse above the estimate) the uplink carried",
            self.link_probes_kept_up.clone(),
        );
        self.registry.register(
            "link_probes_full",
            "Bandwidth probes the uplink did not carry (a drain followed)",
            self.link_probes_full.clone(),
        );
        self.registry.register(
            "link_probes_inconclusive",
            "Bandwidth probes that sent too few batches to be judged",
            self.link_probes_inconclusive.clone(),
        );
    }

    fn label(&self, class: ClassId) -> &ClassLabel {
        &self.names[class.index()]
    }

    /// One record enqueued.
    pub fn accepted(&self, class: ClassId) {
        self.accepted_by_class[class.index()].inc();
    }

    /// `n` records accepted.
    pub fn accepted_n(&self, class: ClassId, n: u64) {
        self.accepted_by_class[class.index()].inc_by(n);
    }

    /// One record refused.
    pub fn refused(&self, class: ClassId) {
        self.refused.get_or_create(self.label(class)).inc();
    }

    /// One push that found the queue full.
    pub fn backpressured(&self, class: ClassId) {
        self.backpressured.get_or_create(self.label(class)).inc();
    }

    /// One QoS 0 record dropped by policy.
    pub fn dropped(&self, class: ClassId) {
        self.dropped.get_or_create(self.label(class)).inc();
    }

    /// Dropped records of a class so far.
    pub fn dropped_total(&self, class: ClassId) -> u64 {
        self.dropped.get_or_create(self.label(class)).get()
    }

    /// `n` records of a class confirmed by the egress.
    pub fn forwarded(&self, class: ClassId, n: u64) {
        self.forwarded.get_or_create(self.label(class)).inc_by(n);
    }

    /// Records of `class` left in memory when the shutdown deadline passed.
    pub fn undelivered(&self, class: ClassId, n: u64) {
        self.undelivered.get_or_create(self.label(class)).inc_by(n);
    }

    /// Records of each class left in memory at shutdown, by class index.
    pub fn undelivered_by_class(&self) -> Vec<u64> {
        self.names
            .iter()
            .map(|l| self.undelivered.get_or_create(l).get())
            .collect()
    }

    /// The allocation now in force.
    pub fn set_allocation(&self, rates: &[f64]) {
        for (i, r) in rates.iter().enumerate() {
            self.allocated.get_or_create(&self.names[i]).set(*r);
        }
    }

    /// Runs `refresh` before every rendering: for gauges of state that
    /// changes too often to publish on each change (queue lengths), so
    /// that a scrape always reads them as they are.
    pub fn on_render(&self, refresh: impl Fn(&Metrics) + Send + Sync + 'static) {
        self.refresh
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Box::new(refresh));
    }

    /// Queue lengths now.
    pub fn set_queued(&self, class: ClassId, records: usize) {
        self.queued
            .get_or_create(self.label(class))
            .set(records as i64);
    }

    /// One batch encoded, its body sent as `codec` produced it.
    pub fn encoded(&self, codec: Codec) {
        self.encoded
            .get_or_create(&CodecLabel {
                codec: codec.to_string(),
            })
            .inc();
    }

    /// Batches encoded with `codec` so far.
    pub fn encoded_total(&self, codec: Codec) -> u64 {
        self.encoded
            .get_or_create(&CodecLabel {
                codec: codec.to_string(),
            })
            .get()
    }

    /// One batch compressed as a sample of a codec not in use.
    pub fn compression_sampled(&self) {
        self.compression_samples.inc();
    }

    /// The predicted effective throughput of the codec just chosen.
    pub fn set_compression_predicted(&self, bytes_per_sec: f64) {
        self.compression_predicted.set(bytes_per_sec);
    }

    /// The uplink as last measured by the egress and `C_out` in force (the
    /// sum of the classes' allocated rates, record bytes/s).
    pub fn uplink(&self) -> UplinkView {
        UplinkView {
            estimate: LinkEstimate {
                bytes_per_sec: self.link_bandwidth.get(),
                per_transaction: Duration::from_secs_f64(self.link_transaction.get().clamp(
                    0.0,
                    weir_core::link_estimate::MAX_PER_TRANSACTION.as_secs_f64(),
                )),
            },
            rates: self
                .names
                .iter()
                .map(|n| self.allocated.get_or_create(n).get())
                .collect(),
        }
    }

    /// The uplink estimate now in force.
    pub fn set_link(&self, estimate: &LinkEstimate) {
        self.link_bandwidth.set(estimate.bytes_per_sec);
        self.link_transaction
            .set(estimate.per_transaction.as_secs_f64());
    }

    /// What the delivery machine measures after a confirmation: the
    /// estimate acted on, the link's saturation, the pipe.
    pub fn set_delivery(&self, d: &weir_core::delivery::Measures) {
        self.link_acted.set(d.acted.bytes_per_sec);
        self.link_saturated.set(i64::from(d.saturated));
        self.pipe_bytes
            .set(i64::try_from(d.pipe_bytes).unwrap_or(i64::MAX));
        self.pipe_batch_bytes
            .set(i64::try_from(d.batch_bytes).unwrap_or(i64::MAX));
        self.delivery_rate.set(d.delivery_rate);
        self.round_trip.set(d.round_trip.as_secs_f64());
        self.link_proven.set(d.proven);
        self.link_quiet.set(i64::from(d.quiet));
        self.link_probe_phase.set(i64::from(d.probe_phase));
        self.set_link_queue(d.queue);
    }

    /// The uplink's queue: the recent round trips above the floor
    /// (`weir_core::link_estimate::QueueWatch`).
    pub fn set_link_queue(&self, queue: Duration) {
        self.link_queue.set(queue.as_secs_f64());
    }

    /// The uplink bandwidth last fitted (before `to_act_on`).
    #[cfg(test)]
    pub(crate) fn link_bandwidth(&self) -> f64 {
        self.link_bandwidth.get()
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        for refresh in self
            .refresh
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            refresh(self);
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}
