//! The delivery loop: one batch at a time from the scheduler, encoded and
//! compressed once, handed to the sink until it confirms, every
//! confirmation fed to the uplink estimator and reported back.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use weir_core::link_estimate::LinkEstimator;
use weir_core::scheduler::{Delivered, OutBatch};
use weir_core::{ClassSet, NodeId};

use super::batch::encode;
use super::compress;
use super::sink::{DeliveryObserver, Sink};
use crate::handoff::LinkReady;
use crate::metrics::Metrics;

/// First retry delay after a failed delivery.
const RETRY_INITIAL: Duration = Duration::from_millis(100);

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
    /// acknowledgements, the spool's releases).
    pub observers: Vec<Arc<dyn DeliveryObserver>>,
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
        observers,
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
                    for o in &observers {
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
