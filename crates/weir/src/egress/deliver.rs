//! The delivery driver: runs `weir-core`'s [`Delivery`] machine (the
//! window of unconfirmed batches, permits, retries, the uplink estimate and
//! the pipe) with real time, a [`Sink`] and channels. It encodes and
//! compresses each batch once, sends what the machine says, awaits the
//! confirmations in sending order, and reports what the machine decides:
//! permits to the scheduler, confirmed records to the observers (spool,
//! peering), estimates and timings to the scheduler and the metrics. Every
//! decision is the core's; this file only owns time, I/O and channels.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use weir_core::delivery::probe::Verdict;
use weir_core::delivery::{Delivery, DeliveryParams, Event, Offer};
use weir_core::link_estimate::LinkEstimate;
use weir_core::scheduler::{Delivered, OutBatch};
use weir_core::{ClassSet, NodeId, Receipt};

use super::batch::encode;
use super::batch::EncodedBatch;
use super::compress;
use super::sink::{Confirm, DeliveryObserver, Sink, SinkError};
use crate::handoff::LinkReady;
use crate::metrics::latency::Stage;
use crate::metrics::Metrics;

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
    /// Compression settings; a change (a config reload) applies from the
    /// next batch on, with the chooser's measurements started afresh.
    pub compression: watch::Receiver<crate::config::CompressionSection>,
    /// Whether batch bodies may be compressed (not when the sink takes
    /// the records apart again).
    pub compress: bool,
    /// The uplink estimate weir starts from (configured uplink and
    /// transaction time).
    pub link_prior: LinkEstimate,
    /// Where the egress publishes its online link estimate (read by the
    /// scheduler for `C_out` and batch plans).
    pub link: watch::Sender<LinkEstimate>,
    /// Where the egress publishes the batch size its pipe asks for
    /// ([`weir_core::delivery::pipe`]; read by the scheduler).
    pub batch_bytes: watch::Sender<u64>,
    /// Most bytes unconfirmed at once (the memory plan's share).
    pub max_in_flight_bytes: u64,
    /// Largest batch the pipe asks for.
    pub max_batch_bytes: u64,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Longest pause between retries of a failed delivery.
    pub retry_max: Duration,
    /// Fires when the shutdown deadline has passed.
    pub abort: CancellationToken,
    /// What is unconfirmed must clear the link within this
    /// ([`weir_core::admission`]); set by the scheduler.
    pub horizon: watch::Receiver<Duration>,
    /// Whether a batch of the most urgent class may go beyond a full window
    /// of unconfirmed batches ([`crate::handoff::LinkSlots`]); only for a
    /// sink with a window of more than one.
    pub urgent_lane: bool,
}

/// A batch encoded and compressed, ready to send (again).
struct Prepared {
    /// What the confirmation needs of its records.
    receipts: Vec<Receipt>,
    encoded: EncodedBatch,
    /// Its size before compression.
    raw_bytes: usize,
    /// `(class, records, bytes)` runs, for the per-class metrics.
    runs: Vec<(weir_core::ClassId, usize, usize)>,
}

/// Delivers every batch from `batches` through `sink`, as the [`Delivery`]
/// machine says: in order, each retried until it is confirmed, with up to
/// [`Sink::window`] awaiting their confirmation. Returns when the channel
/// is closed and everything is confirmed (the scheduler has flushed at
/// shutdown), or when `abort` fires (the drain deadline passed), in which
/// case what was unconfirmed is reported in the log.
pub async fn run<S: Sink>(mut sink: S, mut batches: mpsc::Receiver<OutBatch>, ctx: EgressContext) {
    let epoch = Instant::now();
    let now = || epoch.elapsed();
    let at = |t: Option<Duration>| t.map(|t| epoch + t);
    let mut core = Delivery::new(ctx.params(&sink), now());
    let mut io = Io::new(ctx);
    let mut confirms: VecDeque<Confirm> = VecDeque::new();
    loop {
        io.turn(&mut core, now());
        if let Some(p) = core.poll_send(now()) {
            let encoded = p.encoded.clone();
            match send(&mut sink, &encoded, &mut core, &mut io, epoch).await {
                None => return io.lost(&core, &mut batches),
                Some(Ok(confirm)) => {
                    confirms.push_back(confirm);
                    core.handle_sent(now());
                }
                Some(Err(e)) => {
                    // Go-back-N: every unconfirmed batch goes again, so the
                    // confirmations of their first sends no longer count.
                    confirms.clear();
                    io.failed(&e, sink.name());
                    core.handle_failure(now());
                }
            }
            continue;
        }
        if core.is_done() {
            return;
        }
        // Cancel safety: every branch either only waits (the abort, the
        // timer) or is cancel safe (`recv`, and polling the oldest
        // confirmation by reference, which keeps it in `confirms`).
        tokio::select! {
            biased;
            _ = io.ctx.abort.cancelled() => return io.lost(&core, &mut batches),
            r = async { (&mut confirms.front_mut().expect("guarded")).await }, if !confirms.is_empty() => {
                confirms.pop_front();
                match r {
                    Ok(()) => core.handle_confirm(now()),
                    Err(e) => {
                        confirms.clear();
                        io.failed(&e, sink.name());
                        core.handle_failure(now());
                    }
                }
            }
            () = sleep_until_some(at(core.poll_timeout())) => {}
            b = batches.recv(), if core.may_receive() => match b {
                None => core.handle_closed(),
                Some(b) => match io.prepare(b, core.link()).await {
                    Ok(p) => {
                        let bytes = p.encoded.body.len() as u64;
                        let waited = core.handle_batch(now(), p, bytes);
                        io.handed(waited, core.last_was_urgent());
                    }
                    Err(b) => {
                        io.unsent(&b);
                        return io.lost(&core, &mut batches);
                    }
                },
            },
        }
    }
}

/// Sends `encoded`, giving the scheduler its permits meanwhile; `None` if
/// the deadline passed first.
///
/// Cancel safety: the send is raced only against the abort and the timer
/// that gives a permit (which only turns the machine; the send stays pinned
/// here and is polled again), so a publish is never left half done; on
/// abort the batch is only logged, since the destination never confirmed
/// it.
async fn send<S: Sink>(
    sink: &mut S,
    encoded: &EncodedBatch,
    core: &mut Delivery<Prepared>,
    io: &mut Io,
    epoch: Instant,
) -> Option<Result<Confirm, SinkError>> {
    let send = sink.send(encoded);
    tokio::pin!(send);
    loop {
        let wake = core.poll_timeout().map(|t| epoch + t);
        tokio::select! {
            r = &mut send => return Some(r),
            () = sleep_until_some(wake) => io.turn(core, epoch.elapsed()),
            _ = io.ctx.abort.cancelled() => return None,
        }
    }
}

impl EgressContext {
    /// The machine's parameters for `sink`.
    fn params<S: Sink>(&self, sink: &S) -> DeliveryParams {
        DeliveryParams {
            window: sink.window().max(1),
            urgent_lane: self.urgent_lane,
            carried_on_send: sink.carried_on_send(),
            link_prior: self.link_prior,
            retry_max: self.retry_max,
            max_in_flight_bytes: self.max_in_flight_bytes,
            max_batch_bytes: self.max_batch_bytes,
        }
    }
}

/// What the driver does around the machine: encoding, compression,
/// reporting.
struct Io {
    ctx: EgressContext,
    compressor: compress::BatchCompressor,
    /// The last failure, for the log line of the retry it causes.
    error: Option<String>,
}

impl Io {
    fn new(mut ctx: EgressContext) -> Self {
        let compressor = compress::BatchCompressor::new(&ctx.compression.borrow_and_update());
        ctx.metrics.set_link(&ctx.link_prior);
        Self {
            ctx,
            compressor,
            error: None,
        }
    }

    /// Gives the scheduler the permit due, and reports what the machine
    /// decided.
    fn turn(&mut self, core: &mut Delivery<Prepared>, now: Duration) {
        core.set_horizon(*self.ctx.horizon.borrow());
        match core.poll_permit(now) {
            Some(Offer::Any) => self.ctx.ready.offer(),
            Some(Offer::Urgent) => self.ctx.ready.offer_urgent(),
            Some(Offer::Widen) => self.ctx.ready.widen(),
            None => {}
        }
        while let Some(e) = core.poll_event() {
            self.event(e);
        }
    }

    fn event(&mut self, e: Event<Prepared>) {
        let m = &self.ctx.metrics;
        match e {
            Event::Sent { prepare, send } => {
                if let Some(p) = prepare {
                    m.latency.stage(Stage::Prepare, p);
                }
                m.latency.stage(Stage::Send, send);
            }
            Event::Confirmed(c) => {
                tracing::trace!(
                    bytes = c.bytes,
                    link_ms = c.link_time.as_secs_f64() * 1e3,
                    confirm_ms = c.confirm.as_secs_f64() * 1e3,
                    "batch confirmed"
                );
                m.latency.stage(Stage::Confirm, c.confirm);
                self.confirmed(&c.batch, c.link_time);
            }
            Event::Retrying {
                batches,
                new,
                attempt,
            } => {
                m.batches_republished.inc_by(new as u64);
                let error = self.error.take().unwrap_or_default();
                tracing::warn!(batches, attempt, error, "delivery failed; retrying");
            }
            Event::Fit(fit) => {
                tracing::trace!(
                    bytes_per_sec = fit.bytes_per_sec,
                    t_sc_ms = fit.per_transaction.as_secs_f64() * 1e3,
                    "uplink fit"
                );
                m.set_link(&fit)
            }
            Event::Link(acted) => {
                tracing::debug!(
                    bytes_per_sec = acted.bytes_per_sec,
                    t_sc_ms = acted.per_transaction.as_secs_f64() * 1e3,
                    "uplink estimate acted on"
                );
                self.ctx.link.send_replace(acted);
            }
            Event::BatchBytes(b) => {
                self.ctx.batch_bytes.send_replace(b);
            }
            Event::Measures(measures) => {
                tracing::trace!(
                    acted = measures.acted.bytes_per_sec,
                    shown = measures.shown,
                    proven = measures.proven,
                    mean_rate = measures.mean_rate,
                    delivery_rate = measures.delivery_rate,
                    queue_ms = measures.queue.as_secs_f64() * 1e3,
                    saturated = measures.saturated,
                    pipe_bytes = measures.pipe_bytes,
                    batch_bytes = measures.batch_bytes,
                    probe = measures.probe_phase,
                    "link measures"
                );
                m.set_delivery(&measures)
            }
            Event::Probe(Verdict::KeptUp { .. }) => {
                m.link_probes_kept_up.inc();
            }
            Event::Probe(Verdict::Full { .. }) => {
                m.link_probes_full.inc();
            }
            Event::Probe(Verdict::NoVerdict) => {
                m.link_probes_inconclusive.inc();
            }
            Event::NoEstimator(e) => {
                // The config validator requires a positive uplink; without
                // a prior the link is not estimated and the prior stands.
                tracing::error!(error = %e, "uplink estimator not started; the configured uplink stands");
            }
        }
    }

    fn failed(&mut self, e: &SinkError, sink: &str) {
        self.error = Some(format!("{sink}: {e}"));
    }

    /// A batch was handed over `waited` after its permit.
    fn handed(&self, waited: Duration, urgent: bool) {
        if urgent {
            self.ctx.metrics.urgent_lane_batches.inc();
        }
        self.ctx.metrics.latency.stage(Stage::Handoff, waited);
    }

    /// Encodes and compresses `batch` (the codec chosen for the link
    /// `estimate`); the batch back if the deadline passed meanwhile.
    async fn prepare(
        &mut self,
        batch: OutBatch,
        estimate: LinkEstimate,
    ) -> Result<Prepared, OutBatch> {
        let m = &self.ctx.metrics;
        if let Some(oldest) = batch.records.iter().map(|r| r.ingress_us).min() {
            let age = crate::clock::unix_micros().saturating_sub(oldest);
            m.latency.stage(Stage::Queued, Duration::from_micros(age));
        }
        let mut encoded = encode(self.ctx.node, &self.ctx.classes, &batch);
        let runs = batch.class_runs();
        let raw_bytes = encoded.body.len();
        if self.ctx.compression.has_changed().unwrap_or(false) {
            self.compressor =
                compress::BatchCompressor::new(&self.ctx.compression.borrow_and_update());
        }
        if self.ctx.compress && self.compressor.enabled() {
            let kind = self.compressor.kind(&self.ctx.classes, &batch);
            // Cancel safety: on abort the compression future is dropped
            // (the blocking task finishes on its own and its output is
            // discarded); the batch was never sent.
            encoded = tokio::select! {
                e = self.compressor.compress(encoded, &kind, &estimate, m) => e,
                _ = self.ctx.abort.cancelled() => return Err(batch),
            };
        } else {
            m.encoded(weir_core::compression::Codec::None);
        }
        Ok(Prepared {
            receipts: batch.receipts(),
            encoded,
            raw_bytes,
            runs,
        })
    }

    /// A batch taken from the scheduler was never sent (the deadline passed
    /// while it was compressed).
    fn unsent(&self, batch: &OutBatch) {
        for r in &batch.records {
            self.ctx.metrics.undelivered(r.class, 1);
        }
        tracing::error!(
            batch = batch.seq,
            records = batch.records.len(),
            "shutdown deadline passed with a batch unsent"
        );
    }

    /// The deadline passed: what is unconfirmed, and what the scheduler
    /// handed over and was never taken, is undelivered.
    fn lost(&self, core: &Delivery<Prepared>, batches: &mut mpsc::Receiver<OutBatch>) {
        let m = &self.ctx.metrics;
        let mut records = 0u64;
        let mut count = |classes: &mut dyn Iterator<Item = weir_core::ClassId>| {
            for class in classes {
                m.undelivered(class, 1);
                records += 1;
            }
        };
        let mut batches_left = 0;
        for p in core.unconfirmed() {
            count(&mut p.receipts.iter().map(|r| r.class));
            batches_left += 1;
        }
        while let Ok(b) = batches.try_recv() {
            count(&mut b.records.iter().map(|r| r.class));
            batches_left += 1;
        }
        if batches_left > 0 {
            tracing::error!(
                batches = batches_left,
                records,
                "shutdown deadline passed with batches unconfirmed"
            );
        }
    }

    /// Everything else a confirmed transaction updates.
    fn confirmed(&self, done: &Prepared, elapsed: Duration) {
        let m = &self.ctx.metrics;
        let encoded = &done.encoded;
        for o in &self.ctx.observers {
            o.delivered(&done.receipts);
        }
        m.latency
            .delivered(&done.receipts, crate::clock::unix_micros());
        m.batches_confirmed.inc();
        m.egress_bytes.inc_by(encoded.body.len() as u64);
        m.egress_raw_bytes.inc_by(done.raw_bytes as u64);
        for &(class, records, _) in &done.runs {
            m.forwarded(class, records as u64);
        }
        if let Some(tx) = &self.ctx.delivered {
            // Best effort: the estimator may lag, never block egress.
            let _ = tx.try_send(Delivered {
                class: encoded.class,
                bytes: encoded.body.len(),
                raw_bytes: done.raw_bytes,
                records: encoded.records,
                elapsed,
            });
        }
    }
}

/// Sleeps until `at`; `None` never comes.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
