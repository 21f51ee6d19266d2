//! Egress: where batches leave weir (`amqp` to RabbitMQ, `file` to a
//! directory), optionally through an emulated uplink (`link`).
//!
//! The scheduler hands [`OutBatch`]es to [`run`] over a bounded channel (so a
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

pub mod amqp;
pub mod compress;
pub mod file;
pub mod link;
pub mod probe;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use weir_core::link_estimate::LinkEstimator;
use weir_core::{ClassId, ClassSet, NodeId, Record};
use weir_proto::{pb, Encoding};

use crate::ingress::unix_micros;
use crate::metrics::Metrics;

/// A batch closed by the scheduler: records grouped by class, most urgent
/// first, each class oldest first (one class unless the scheduler mixes
/// classes, `scheduler.mix_classes`).
#[derive(Debug, Clone)]
pub struct OutBatch {
    /// Per-node batch sequence number.
    pub seq: u64,
    /// The most urgent class among the records.
    pub class: ClassId,
    /// The records.
    pub records: Vec<Record>,
}

impl OutBatch {
    /// Records per class, in the batch's order: `(class, records, bytes)`
    /// for each run of one class.
    pub fn class_runs(&self) -> Vec<(ClassId, usize, usize)> {
        let mut runs: Vec<(ClassId, usize, usize)> = Vec::new();
        for r in &self.records {
            match runs.last_mut() {
                Some((c, n, b)) if *c == r.class => {
                    *n += 1;
                    *b += r.size();
                }
                _ => runs.push((r.class, 1, r.size())),
            }
        }
        runs
    }
}

/// A batch encoded for the wire, as every sink sends it.
#[derive(Debug, Clone)]
pub struct EncodedBatch {
    /// Per-node batch sequence number.
    pub seq: u64,
    /// The most urgent class among the records.
    pub class: ClassId,
    /// Records in the batch.
    pub records: usize,
    /// The sending node.
    pub node: NodeId,
    /// The `weir.v1.Batch` body, encoded as `encoding` says.
    pub body: Bytes,
    /// Compression of `body`.
    pub encoding: Encoding,
}

/// Encodes records into a `weir.v1.Batch` body (identity encoding; [`run`]
/// then compresses it when the chooser says it pays).
pub fn encode(node: NodeId, classes: &ClassSet, batch: &OutBatch) -> EncodedBatch {
    let pb = pb::Batch {
        padding: Default::default(),
        node,
        batch_seq: batch.seq,
        created_us: unix_micros(),
        records: batch
            .records
            .iter()
            .map(|r| pb::Record {
                key: String::from_utf8_lossy(&r.key).into_owned(),
                class: classes.get(r.class).name.clone(),
                origin: r.origin,
                seq: r.seq,
                ingress_us: r.ingress_us,
                payload: r.payload.clone(),
            })
            .collect(),
    };
    EncodedBatch {
        seq: batch.seq,
        class: batch.class,
        records: batch.records.len(),
        node,
        body: weir_proto::encode_batch(&pb),
        encoding: Encoding::Identity,
    }
}

/// Why a delivery failed; the batch is retried either way.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The destination cannot be reached now (connection lost, broker
    /// restarting, disk full); retry after a backoff.
    #[error("egress unavailable: {0}")]
    Unavailable(String),
    /// The destination refused this batch (nack, unroutable return).
    #[error("batch refused by the destination: {0}")]
    Refused(String),
}

/// A destination for batches.
pub trait Sink: Send + 'static {
    /// Delivers one batch and returns once the destination has durably
    /// accepted it (publisher confirm, file renamed into place).
    fn deliver(
        &mut self,
        batch: &EncodedBatch,
    ) -> impl Future<Output = Result<(), SinkError>> + Send;

    /// A short name for logs.
    fn name(&self) -> &'static str;
}

/// One confirmed transaction, as the scheduler's batch sizer sees it.
#[derive(Debug, Clone, Copy)]
pub struct Delivered {
    /// The batch's class.
    pub class: ClassId,
    /// Body bytes sent (after compression).
    pub bytes: usize,
    /// Body bytes before compression: `raw_bytes / bytes` is how much more
    /// record data the link carried than its wire rate.
    pub raw_bytes: usize,
    /// Records in the batch.
    pub records: usize,
    /// Wall time from the start of the delivery to its confirmation.
    pub elapsed: Duration,
}

/// Told, right after each confirmed transaction, which records it carried:
/// peering acknowledges records that peers forwarded to this node only then
/// ([`crate::peer::Deliveries`]). Called on the egress task, so it must
/// return at once (no waiting, no I/O).
pub trait DeliveryObserver: std::fmt::Debug + Send + Sync {
    /// The destination has durably accepted these records.
    fn delivered(&self, records: &[Record]);
}

/// First retry delay after a failed delivery.
const RETRY_INITIAL: Duration = Duration::from_millis(100);

/// Signals from the egress to the scheduler that the link is free: the
/// egress adds one permit each time it is about to wait for a batch, and the
/// scheduler takes one before it builds a batch. Batches are therefore built
/// just in time, when the link can take them, so a record of an urgent class
/// never waits behind less urgent batches queued ahead of it in a channel.
pub type LinkReady = std::sync::Arc<tokio::sync::Semaphore>;

/// What the delivery loop needs besides its sink and its batches.
#[derive(Debug, Clone)]
pub struct EgressContext {
    /// This node's id, stamped on every batch.
    pub node: NodeId,
    /// Class names for the wire format.
    pub classes: ClassSet,
    /// Permits announcing that the link is free.
    pub ready: LinkReady,
    /// Where completed transactions are reported (the scheduler's per-class
    /// batch sizers).
    pub delivered: Option<mpsc::Sender<Delivered>>,
    /// Told the records of every confirmed batch (peering's delivery
    /// acknowledgements).
    pub observer: Option<Arc<dyn DeliveryObserver>>,
    /// Compression settings.
    pub compression: crate::config::CompressionSection,
    /// The uplink estimate weir starts from (configured uplink and
    /// transaction time).
    pub link_prior: weir_core::link_estimate::LinkEstimate,
    /// Where the egress publishes its online link estimate (read by the
    /// scheduler for `C_out` and batch plans).
    pub link: tokio::sync::watch::Sender<weir_core::link_estimate::LinkEstimate>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Longest pause between retries of a failed delivery.
    pub retry_max: Duration,
    /// Fires when the shutdown deadline has passed.
    pub abort: CancellationToken,
}

/// Delivers every batch from `batches` through `sink`, in order, retrying
/// each until it is confirmed. Each batch is encoded and compressed once
/// (a retry resends the same body). Each confirmed transaction is fed to the
/// uplink estimator, whose estimate is published on `ctx.link` and in the
/// metrics. Returns when the channel is closed and empty (the scheduler has
/// flushed at shutdown), or when `abort` fires (the drain deadline passed),
/// in which case the batch in hand is reported lost-in-flight in the log
/// with its sequence number.
pub async fn run<S: Sink>(mut sink: S, mut batches: mpsc::Receiver<OutBatch>, ctx: EgressContext) {
    let EgressContext {
        node,
        classes,
        ready,
        delivered,
        observer,
        compression,
        link_prior,
        link,
        metrics,
        retry_max,
        abort,
    } = ctx;
    let mut compressor = compress::BatchCompressor::new(&compression);
    let mut estimator = match LinkEstimator::new(link_prior) {
        Ok(e) => Some(e),
        Err(e) => {
            // The config validator requires a positive uplink; without a
            // prior the link is not estimated and the prior stands.
            tracing::error!(error = %e, "uplink estimator not started; the configured uplink stands");
            None
        }
    };
    metrics.set_link(&link_prior);
    loop {
        ready.add_permits(1);
        let Some(batch) = batches.recv().await else {
            break;
        };
        let mut encoded = encode(node, &classes, &batch);
        let runs = batch.class_runs();
        let raw_bytes = encoded.body.len();
        if compressor.enabled() {
            let kind = compressor.kind(&classes, &batch);
            let estimate = *link.borrow();
            // Cancel safety: on abort the compression future is dropped (the
            // blocking task finishes on its own and its output is discarded);
            // the batch was never sent, so it is only logged.
            encoded = tokio::select! {
                e = compressor.compress(encoded, &kind, &estimate, &metrics) => e,
                _ = abort.cancelled() => {
                    tracing::error!(batch = batch.seq, records = batch.records.len(), "shutdown deadline passed with a batch unconfirmed");
                    return;
                }
            };
        } else {
            metrics.encoded(weir_core::compression::Codec::None);
        }
        let mut backoff = RETRY_INITIAL;
        let mut attempt = 0u32;
        loop {
            let started = Instant::now();
            // Cancel safety: on abort the delivery future is dropped; the
            // batch is still owned here and is only logged, since the
            // destination never confirmed it.
            let result = tokio::select! {
                r = sink.deliver(&encoded) => r,
                _ = abort.cancelled() => {
                    tracing::error!(batch = encoded.seq, records = encoded.records, "shutdown deadline passed with a batch unconfirmed");
                    return;
                }
            };
            match result {
                Ok(()) => {
                    // The transaction alone (not compression or queueing):
                    // Eq. 1's `T_sc + US / Th_up` for the bytes on the wire.
                    let elapsed = started.elapsed();
                    if let Some(est) = estimator.as_mut() {
                        est.observe(encoded.body.len() as u64, elapsed);
                        let now = est.estimate();
                        metrics.set_link(&now);
                        // Only a window of varied sizes separates T_sc from
                        // bandwidth; small alike batches (an idle link) say
                        // little about the bandwidth, and acting on them
                        // would shrink C_out and the spare a node offers its
                        // peers. The scheduler keeps the last full fit (or
                        // the configured prior) until then.
                        if est.fit_kind() == weir_core::link_estimate::FitKind::Full {
                            link.send_replace(now);
                        }
                    }
                    if let Some(o) = &observer {
                        o.delivered(&batch.records);
                    }
                    metrics.batches_confirmed.inc();
                    metrics.egress_bytes.inc_by(encoded.body.len() as u64);
                    for &(class, records, _) in &runs {
                        metrics.forwarded(class, records as u64);
                    }
                    if let Some(tx) = &delivered {
                        // Best effort: the estimator may lag, never block egress.
                        let _ = tx.try_send(Delivered {
                            class: encoded.class,
                            bytes: encoded.body.len(),
                            raw_bytes,
                            records: encoded.records,
                            elapsed,
                        });
                    }
                    break;
                }
                Err(e) => {
                    attempt += 1;
                    if attempt == 1 {
                        metrics.batches_republished.inc();
                    }
                    tracing::warn!(sink = sink.name(), batch = encoded.seq, attempt, error = %e, "delivery failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = abort.cancelled() => {
                            tracing::error!(batch = encoded.seq, records = encoded.records, "shutdown deadline passed with a batch unconfirmed");
                            return;
                        }
                    }
                    backoff = (backoff * 2).min(retry_max);
                }
            }
        }
    }
}
