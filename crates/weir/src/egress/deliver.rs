//! The delivery loop: batches from the scheduler, encoded and compressed
//! once, sent through the sink with a window of unconfirmed ones, each
//! retried until it is confirmed, every confirmation fed to the uplink
//! estimator and reported back.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use weir_core::admission::{
    next_offer, next_permit, LinkClock, Permit, PermitStep, Window, WindowPacer,
};
use weir_core::link_estimate::{
    Climb, FitKind, LinkEstimate, LinkEstimator, LinkTimer, QueueWatch,
};
use weir_core::scheduler::{Delivered, OutBatch};
use weir_core::{ClassSet, NodeId};

use super::batch::encode;
use super::batch::EncodedBatch;
use super::compress;
use super::sink::{Confirm, DeliveryObserver, Sink, SinkError};
use crate::handoff::LinkReady;
use crate::metrics::latency::Stage;
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
    /// Compression settings; a change (a config reload) applies from the
    /// next batch on, with the chooser's measurements started afresh.
    pub compression: watch::Receiver<crate::config::CompressionSection>,
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
    batch: OutBatch,
    encoded: EncodedBatch,
    /// Its size before compression.
    raw_bytes: usize,
    /// `(class, records, bytes)` runs, for the per-class metrics.
    runs: Vec<(weir_core::ClassId, usize, usize)>,
    /// Failed attempts so far.
    attempts: u32,
    /// When the egress received it from the scheduler.
    received: Instant,
    /// Built for the urgent lane: it may go while the window is full.
    beyond: bool,
}

/// A batch sent and awaiting its confirmation.
struct InFlight {
    prepared: Prepared,
    /// When sending started (the emulated link's time included).
    started: Instant,
    /// When the send returned.
    sent: Instant,
    /// The link's own time for it, where the sink knows it
    /// ([`Sink::carried_on_send`]): the send's duration.
    link_time: Option<Duration>,
    confirm: Confirm,
}

/// Delivers every batch from `batches` through `sink`, in order, retrying
/// each until it is confirmed.
///
/// Up to [`Sink::window`] sent batches await their confirmation at once;
/// confirmations are taken in sending order, so releases (spool, peers)
/// follow the order records were sent in. A failed send or confirmation
/// sends that batch and every later unconfirmed one again, in order, after
/// a backoff (go-back-N): a batch whose confirmation was lost arrives twice,
/// none is lost, and no batch overtakes an earlier one of its class.
///
/// Each batch is encoded and compressed once (a retry resends the same
/// body). Each confirmed transaction is fed to the uplink estimator, whose
/// estimate is published on `ctx.link` and in the metrics; with a window,
/// a transaction's time is from when the link finished the one before
/// (or from its own start, if later) to its confirmation. Returns when the
/// channel is closed and everything is confirmed (the scheduler has flushed
/// at shutdown), or when `abort` fires (the drain deadline passed), in
/// which case what was unconfirmed is reported in the log.
pub async fn run<S: Sink>(mut sink: S, mut batches: mpsc::Receiver<OutBatch>, ctx: EgressContext) {
    let EgressContext {
        node,
        classes,
        ready,
        delivered,
        observers,
        mut compression,
        link_prior,
        link,
        metrics,
        retry_max,
        abort,
        horizon,
        urgent_lane,
    } = ctx;
    let mut compressor = compress::BatchCompressor::new(&compression.borrow_and_update());
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
    let window = sink.window().max(1);
    let urgent_lane = urgent_lane && window > 1;
    let carried_on_send = sink.carried_on_send();
    // Batches to send, oldest first: retries ahead of new ones.
    let mut todo: VecDeque<Prepared> = VecDeque::new();
    let mut flight: VecDeque<InFlight> = VecDeque::with_capacity(window);
    // Permits handed to the scheduler and not yet turned into batches,
    // and when the last was.
    let mut permit = Permit::None;
    let mut offered_at = Instant::now();
    let mut open = true;
    let mut backoff = RETRY_INITIAL;
    let mut retry_at: Option<Instant> = None;
    // When the link will have carried what was sent, predicted.
    let epoch = Instant::now();
    // How the link served each confirmed transaction.
    let mut timer = LinkTimer::default();
    let mut clock = LinkClock::default();
    // The window's slots, offered at most one per round trip / window.
    let mut pacer = WindowPacer::default();
    // Whether the link holds a queue, and the estimate acted on.
    let mut queue = QueueWatch::default();
    let mut climb = Climb::new(link_prior, Duration::ZERO);
    // The deadline passed: what is unconfirmed, and what the scheduler
    // handed over and was never taken, is undelivered.
    let lost = |todo: &VecDeque<Prepared>,
                flight: &VecDeque<InFlight>,
                batches: &mut mpsc::Receiver<OutBatch>| {
        let mut records = 0u64;
        let mut count = |b: &OutBatch| {
            for r in &b.records {
                metrics.undelivered(r.class, 1);
                records += 1;
            }
        };
        todo.iter().for_each(|p| count(&p.batch));
        flight.iter().for_each(|f| count(&f.prepared.batch));
        let mut batches_left = todo.len() + flight.len();
        while let Ok(b) = batches.try_recv() {
            count(&b);
            batches_left += 1;
        }
        if batches_left > 0 {
            tracing::error!(
                batches = batches_left,
                records,
                "shutdown deadline passed with batches unconfirmed"
            );
        }
    };
    loop {
        // Offer the scheduler one permit at a time, while a slot of the
        // window is free, just in time: once what is committed ahead would
        // clear the link within the lead (weir_core::admission). The batch
        // is built from the queues as they are when the link can take it,
        // and an urgent record never finds more than the lead and one
        // batch committed ahead of it.
        let w = Window {
            size: window,
            in_flight: flight.len(),
            lane_in_flight: flight.iter().filter(|f| f.prepared.beyond).count(),
            built: todo.len(),
            lane_built: todo.iter().filter(|p| p.beyond).count(),
            urgent_lane,
            open,
            out: permit,
        };
        // Only with the urgent lane (an urgent record need not wait for the
        // pace, weir_core::admission::WindowPacer): without it the pace
        // would hold the urgent records back too.
        let paced = match urgent_lane {
            true => epoch + pacer.next(window, w.in_flight - w.lane_in_flight),
            false => epoch,
        };
        let due = offer_due(
            epoch,
            &clock,
            &todo,
            &link.borrow(),
            *horizon.borrow(),
            paced,
        );
        let mut offer_at = None;
        match next_permit(&w, Instant::now() - epoch, due - epoch) {
            PermitStep::Offer => {
                ready.offer();
                permit = Permit::Any;
                offered_at = Instant::now();
                pacer.offered(offered_at - epoch);
            }
            PermitStep::OfferUrgent { recheck } => {
                ready.offer_urgent();
                permit = Permit::Urgent;
                offered_at = Instant::now();
                offer_at = recheck.map(|at| epoch + at);
            }
            PermitStep::Widen => {
                ready.widen();
                permit = Permit::Any;
                pacer.offered(Instant::now() - epoch);
            }
            PermitStep::WaitUntil(at) => offer_at = Some(epoch + at),
            PermitStep::Idle => {}
        }
        let waiting = retry_at.is_some_and(|at| at > Instant::now());
        let sendable = todo.front().is_some_and(|p| w.may_send(p.beyond));
        if !waiting && sendable {
            retry_at = None;
            let prepared = todo.pop_front().expect("not empty");
            let started = Instant::now();
            let estimate = *link.borrow();
            clock.sent(
                started - epoch,
                prepared.encoded.body.len() as u64,
                &estimate,
            );
            // While the send is under way (the emulated link's transfer),
            // the next batch is asked for when it is due.
            let mut due = Window { out: permit, ..w }
                .may_offer()
                .then(|| offer_due(epoch, &clock, &todo, &estimate, *horizon.borrow(), paced));
            // Cancel safety: a send is never raced against anything but the
            // abort and the timer that offers a permit (which only wakes
            // this loop; the send future stays pinned here and is polled
            // again), so a publish is not left half done; on abort the
            // batch is only logged, since the destination never confirmed
            // it.
            let outcome = {
                let send = sink.send(&prepared.encoded);
                tokio::pin!(send);
                loop {
                    tokio::select! {
                        r = &mut send => break Some(r),
                        () = sleep_until_some(due), if due.is_some() => {
                            due = None;
                            ready.offer();
                            permit = Permit::Any;
                            offered_at = Instant::now();
                            pacer.offered(offered_at - epoch);
                        }
                        _ = abort.cancelled() => break None,
                    }
                }
            };
            let Some(sent) = outcome else {
                todo.push_front(prepared);
                lost(&todo, &flight, &mut batches);
                return;
            };
            if carried_on_send {
                clock.cleared(Instant::now() - epoch);
            }
            match sent {
                Ok(confirm) => {
                    let sent = Instant::now();
                    if prepared.attempts == 0 {
                        metrics
                            .latency
                            .stage(Stage::Prepare, started - prepared.received);
                    }
                    metrics.latency.stage(Stage::Send, sent - started);
                    let link_time = carried_on_send.then(|| sent - started);
                    flight.push_back(InFlight {
                        prepared,
                        started,
                        sent,
                        link_time,
                        confirm,
                    })
                }
                Err(e) => {
                    todo.push_front(prepared);
                    clock.cleared(Instant::now() - epoch);
                    // Nothing later was sent: the window before it stays.
                    failed(&mut todo, &mut flight, 1, &e, sink.name(), &metrics);
                    retry_at = Some(Instant::now() + backoff);
                    backoff = (backoff * 2).min(retry_max);
                }
            }
            continue;
        }
        if !open && todo.is_empty() && flight.is_empty() {
            break;
        }
        // What the window was at the top of this turn (a send goes round
        // again), with the permit as offered since.
        let can_receive = Window { out: permit, ..w }.may_receive();
        // Cancel safety: every branch either only waits (the abort, the
        // retry timer) or is cancel safe (`recv`, and polling the head
        // confirmation by reference, which keeps it in `flight`).
        tokio::select! {
            biased;
            _ = abort.cancelled() => {
                lost(&todo, &flight, &mut batches);
                return;
            }
            r = async { (&mut flight.front_mut().expect("guarded").confirm).await }, if !flight.is_empty() => {
                match r {
                    Ok(()) => {
                        let done = flight.pop_front().expect("guarded");
                        let now = Instant::now();
                        // The transaction's own time: the link's where the
                        // sink knows it (an emulated link), else as the
                        // link served it (`LinkTimer`). On the emulated
                        // link a broker's bunched confirms would only blur
                        // what the link itself does.
                        let elapsed = timer.confirmed(
                            done.started - epoch,
                            now - epoch,
                            link.borrow().per_transaction,
                            done.prepared.encoded.body.len() as u64,
                            done.link_time,
                        );
                        if flight.is_empty() {
                            // Everything sent is confirmed, so carried.
                            clock.cleared(now - epoch);
                        }
                        metrics.latency.stage(Stage::Confirm, now - done.sent);
                        if !done.prepared.beyond {
                            pacer.confirmed(now - done.sent);
                        }
                        backoff = RETRY_INITIAL;
                        queue.confirmed(
                            now - epoch,
                            now - done.sent,
                            done.prepared.encoded.body.len() as u64,
                            link_prior.bytes_per_sec,
                        );
                        metrics.set_link_queue(queue.queue());
                        if let Some(est) = estimator.as_mut() {
                            measured(
                                est,
                                Measured {
                                    now: now - epoch,
                                    bytes: done.prepared.encoded.body.len() as u64,
                                    elapsed,
                                    saturated: timer.saturated(),
                                    queued: queue.queued(),
                                    prior: link_prior,
                                },
                                &mut climb,
                                &link,
                                &metrics,
                            );
                        }
                        confirmed(
                            &done.prepared,
                            elapsed,
                            &metrics,
                            &observers,
                            delivered.as_ref(),
                        );
                    }
                    Err(e) => {
                        clock.cleared(Instant::now() - epoch);
                        failed(&mut todo, &mut flight, 0, &e, sink.name(), &metrics);
                        retry_at = Some(Instant::now() + backoff);
                        backoff = (backoff * 2).min(retry_max);
                    }
                }
            }
            () = sleep_until_some(retry_at), if retry_at.is_some() && !todo.is_empty() => {}
            () = sleep_until_some(offer_at), if offer_at.is_some() => {}
            b = batches.recv(), if can_receive => {
                let Some(batch) = b else {
                    open = false;
                    continue;
                };
                // Taken under the urgent lane's permit (not widened since):
                // it may go beyond the window.
                let beyond = std::mem::take(&mut permit) == Permit::Urgent;
                if beyond {
                    metrics.urgent_lane_batches.inc();
                }
                let received = Instant::now();
                metrics.latency.stage(Stage::Handoff, received - offered_at);
                if let Some(oldest) = batch.records.iter().map(|r| r.ingress_us).min() {
                    let age = crate::clock::unix_micros().saturating_sub(oldest);
                    metrics.latency.stage(Stage::Queued, Duration::from_micros(age));
                }
                let mut encoded = encode(node, &classes, &batch);
                let runs = batch.class_runs();
                let raw_bytes = encoded.body.len();
                if compression.has_changed().unwrap_or(false) {
                    compressor = compress::BatchCompressor::new(&compression.borrow_and_update());
                }
                if compressor.enabled() {
                    let kind = compressor.kind(&classes, &batch);
                    let estimate = *link.borrow();
                    // Cancel safety: on abort the compression future is
                    // dropped (the blocking task finishes on its own and its
                    // output is discarded); the batch was never sent.
                    encoded = tokio::select! {
                        e = compressor.compress(encoded, &kind, &estimate, &metrics) => e,
                        _ = abort.cancelled() => {
                            for r in &batch.records {
                                metrics.undelivered(r.class, 1);
                            }
                            tracing::error!(batch = batch.seq, records = batch.records.len(), "shutdown deadline passed with a batch unsent");
                            lost(&todo, &flight, &mut batches);
                            return;
                        }
                    };
                } else {
                    metrics.encoded(weir_core::compression::Codec::None);
                }
                todo.push_back(Prepared { batch, encoded, raw_bytes, runs, attempts: 0, received, beyond });
            }
        }
    }
}

/// When to ask the scheduler for the next batch, with `todo` built and not
/// yet sent ([`weir_core::admission::next_offer`]), never before `paced`
/// (the window's pace, [`WindowPacer`]).
fn offer_due(
    epoch: Instant,
    clock: &LinkClock,
    todo: &VecDeque<Prepared>,
    link: &LinkEstimate,
    horizon: Duration,
    paced: Instant,
) -> Instant {
    let bytes: u64 = todo.iter().map(|p| p.encoded.body.len() as u64).sum();
    let now = Instant::now();
    (epoch + next_offer(now - epoch, clock, todo.len(), bytes, link, horizon)).max(paced)
}

/// Sleeps until `at`; `None` never comes.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A send or the head confirmation failed: every unconfirmed batch goes
/// back to the front of `todo`, in sending order, to be sent again. `unsent`
/// is how many batches at the front of `todo` failed to send (0 or 1).
fn failed(
    todo: &mut VecDeque<Prepared>,
    flight: &mut VecDeque<InFlight>,
    unsent: usize,
    error: &SinkError,
    sink: &str,
    metrics: &Metrics,
) {
    let again = flight.len() + unsent;
    for f in flight.drain(..).rev() {
        todo.push_front(f.prepared);
    }
    for p in todo.iter_mut().take(again) {
        if p.attempts == 0 {
            metrics.batches_republished.inc();
        }
        p.attempts += 1;
    }
    let head = todo.front().expect("the failed batch is back in todo");
    tracing::warn!(sink, batch = head.encoded.seq, attempt = head.attempts, error = %error, "delivery failed; retrying");
}

/// What a confirmed transaction says of the link.
struct Measured {
    /// When it was confirmed (from the egress's epoch).
    now: Duration,
    bytes: u64,
    /// Its time on the link (`LinkTimer`).
    elapsed: Duration,
    /// Of the last 64, how many were sent behind others (`LinkTimer`).
    saturated: u32,
    /// Whether the link holds a queue (`QueueWatch`).
    queued: bool,
    /// The configured uplink, in what TCP carries of it.
    prior: LinkEstimate,
}

/// A confirmed transaction teaches the estimator; what to act on
/// (`Climb::observe`: a full fit, or any with a queue on the link, through
/// `to_act_on`, and with no queue a climb back towards the prior) is
/// published when it changes.
fn measured(
    est: &mut LinkEstimator,
    m: Measured,
    climb: &mut Climb,
    link: &tokio::sync::watch::Sender<LinkEstimate>,
    metrics: &Metrics,
) {
    // The transaction alone (not compression or queueing): Eq. 1's
    // `T_sc + US / Th_up` for the bytes on the wire.
    est.observe(m.bytes, m.elapsed);
    let fit = est.estimate();
    metrics.set_link(&fit);
    let full = est.fit_kind() == FitKind::Full;
    if let Some(acted) = climb.observe(m.now, fit, full, m.prior, m.saturated, m.queued) {
        link.send_replace(acted);
    }
}

/// Everything else a confirmed transaction updates.
fn confirmed(
    done: &Prepared,
    elapsed: Duration,
    metrics: &Metrics,
    observers: &[Arc<dyn DeliveryObserver>],
    delivered: Option<&mpsc::Sender<Delivered>>,
) {
    let encoded = &done.encoded;
    for o in observers {
        o.delivered(&done.batch.records);
    }
    metrics
        .latency
        .delivered(&done.batch.records, crate::clock::unix_micros());
    metrics.batches_confirmed.inc();
    metrics.egress_bytes.inc_by(encoded.body.len() as u64);
    metrics.egress_raw_bytes.inc_by(done.raw_bytes as u64);
    for &(class, records, _) in &done.runs {
        metrics.forwarded(class, records as u64);
    }
    if let Some(tx) = delivered {
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use bytes::Bytes;
    use tokio::sync::{oneshot, watch};
    use weir_core::{ClassId, Record};

    use super::*;

    /// A sink that reports each send to the test, which settles its
    /// confirmation.
    struct Scripted {
        window: usize,
        sends: mpsc::UnboundedSender<(u64, oneshot::Sender<Result<(), SinkError>>)>,
    }

    impl Sink for Scripted {
        async fn send(&mut self, batch: &EncodedBatch) -> Result<Confirm, SinkError> {
            let (tx, rx) = oneshot::channel();
            self.sends.send((batch.seq, tx)).expect("test listening");
            Ok(Box::pin(async move {
                rx.await
                    .unwrap_or_else(|_| Err(SinkError::Unavailable("dropped".into())))
            }))
        }

        fn window(&self) -> usize {
            self.window
        }

        fn name(&self) -> &'static str {
            "scripted"
        }
    }

    /// Remembers the batch (its first record's seq) of every release.
    #[derive(Debug, Default)]
    struct Releases(Mutex<Vec<u64>>);

    impl DeliveryObserver for Releases {
        fn delivered(&self, records: &[Record]) {
            self.0.lock().unwrap().push(records[0].seq);
        }
    }

    fn batch(seq: u64) -> OutBatch {
        OutBatch {
            seq,
            class: ClassId(0),
            records: vec![Record {
                key: Bytes::from_static(b"k"),
                class: ClassId(0),
                origin: 1,
                seq,
                ingress_us: 0,
                payload: Bytes::from_static(b"p"),
                spool: None,
            }],
        }
    }

    type Sends = mpsc::UnboundedReceiver<(u64, oneshot::Sender<Result<(), SinkError>>)>;

    /// A delivery loop's context with `prior` as the link estimate; the
    /// receiver of what it publishes.
    fn context(
        prior: weir_core::link_estimate::LinkEstimate,
    ) -> (
        EgressContext,
        Arc<Releases>,
        LinkReady,
        watch::Receiver<weir_core::link_estimate::LinkEstimate>,
    ) {
        let cfg = crate::config::parse(crate::config::DEFAULT_CONFIG, "default").unwrap();
        let releases = Arc::new(Releases::default());
        let ready: LinkReady = Arc::default();
        let (link, published) = watch::channel(prior);
        let ctx = EgressContext {
            node: 1,
            classes: cfg.classes.clone(),
            ready: Arc::clone(&ready),
            delivered: None,
            observers: vec![releases.clone() as Arc<dyn DeliveryObserver>],
            compression: watch::channel(crate::config::CompressionSection {
                enabled: false,
                ..cfg.compression.clone()
            })
            .1,
            link_prior: prior,
            link,
            metrics: Arc::new(Metrics::new(&cfg.classes)),
            retry_max: Duration::from_millis(20),
            abort: CancellationToken::new(),
            horizon: watch::channel(Duration::MAX).1,
            urgent_lane: false,
        };
        (ctx, releases, ready, published)
    }

    /// A running delivery loop: where to hand it batches, its sends, its
    /// releases, its permits and its task.
    type Started = (
        mpsc::Sender<OutBatch>,
        Sends,
        Arc<Releases>,
        LinkReady,
        tokio::task::JoinHandle<()>,
    );

    fn start(window: usize) -> Started {
        start_with(window, false)
    }

    fn start_with(window: usize, urgent_lane: bool) -> Started {
        let prior = weir_core::link_estimate::LinkEstimate {
            bytes_per_sec: 1e6,
            per_transaction: Duration::from_millis(1),
        };
        let (mut ctx, releases, ready, _) = context(prior);
        ctx.urgent_lane = urgent_lane;
        let (sends_tx, sends) = mpsc::unbounded_channel();
        let (tx, rx) = mpsc::channel(16);
        let sink = Scripted {
            window,
            sends: sends_tx,
        };
        (tx, sends, releases, ready, tokio::spawn(run(sink, rx, ctx)))
    }

    /// A FIFO link: a batch leaves `size / rate` after the one before it
    /// has left (or after it was sent, if later) and is confirmed `rtt`
    /// after it has left, as a shaped uplink and a broker behind a
    /// propagation delay do.
    struct ModelLink {
        rate: f64,
        rtt: Duration,
        free_at: tokio::time::Instant,
        /// Confirms go out together every this long (a broker's fsyncs),
        /// or each at once.
        bunch: Option<Duration>,
        epoch: tokio::time::Instant,
        window: usize,
        /// What the broker's confirm costs per byte (writing it down).
        confirm_per_byte: Duration,
    }

    impl Sink for ModelLink {
        async fn send(&mut self, batch: &EncodedBatch) -> Result<Confirm, SinkError> {
            let start = self.free_at.max(tokio::time::Instant::now());
            self.free_at = start + Duration::from_secs_f64(batch.body.len() as f64 / self.rate);
            let mut at = self.free_at + self.rtt + self.confirm_per_byte * batch.body.len() as u32;
            if let Some(every) = self.bunch {
                let since = (at - self.epoch).as_secs_f64();
                let n = (since / every.as_secs_f64()).ceil();
                at = self.epoch + every.mul_f64(n);
            }
            Ok(Box::pin(async move {
                tokio::time::sleep_until(at).await;
                Ok(())
            }))
        }

        fn window(&self) -> usize {
            self.window
        }

        fn name(&self) -> &'static str {
            "model"
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_paced_pipelined_link_is_measured_at_its_rate() {
        // 2 MB/s behind 50 ms; batches of 8-64 KiB sent at 70 % of the
        // rate, so several are in flight and the link idles between them.
        // Timing from the previous confirmation counted those idle gaps as
        // transfer (about 1.4 MB/s here); timing from when the link was
        // free of the one before measures the link.
        let rate = 2e6;
        let prior = weir_core::link_estimate::LinkEstimate {
            bytes_per_sec: 1e6,
            per_transaction: Duration::from_millis(50),
        };
        let (ctx, releases, _ready, _published) = context(prior);
        let metrics = Arc::clone(&ctx.metrics);
        let (tx, rx) = mpsc::channel(16);
        let sink = ModelLink {
            rate,
            rtt: Duration::from_millis(50),
            free_at: tokio::time::Instant::now(),
            bunch: None,
            epoch: tokio::time::Instant::now(),
            window: 8,
            confirm_per_byte: Duration::ZERO,
        };
        let handle = tokio::spawn(run(sink, rx, ctx));
        for seq in 1..=300u64 {
            let size = 8192 + (seq as usize * 7919) % (56 << 10);
            let mut b = batch(seq);
            b.records[0].payload = Bytes::from(vec![7u8; size]);
            tx.send(b).await.unwrap();
            tokio::time::sleep(Duration::from_secs_f64(size as f64 / (0.7 * rate))).await;
        }
        drop(tx);
        handle.await.unwrap();
        assert_eq!(releases.0.lock().unwrap().len(), 300);
        // The fit (what is acted on above the prior needs a link seen
        // busy most of the time: weir_core::link_estimate::to_act_on).
        let fitted = metrics.link_bandwidth();
        assert!(
            (fitted / rate - 1.0).abs() < 0.1,
            "measured {fitted:.0} B/s on a {rate} B/s link"
        );
    }

    async fn next(sends: &mut Sends) -> (u64, oneshot::Sender<Result<(), SinkError>>) {
        tokio::time::timeout(Duration::from_secs(5), sends.recv())
            .await
            .expect("a send within 5 s")
            .expect("loop running")
    }

    #[tokio::test]
    async fn a_window_of_batches_is_sent_before_the_first_confirm() {
        let (tx, mut sends, releases, ready, handle) = start(3);
        tokio::task::yield_now().await;
        assert_eq!(
            ready.available_permits(),
            1,
            "one permit at a time (weir_core::admission), the window still 3"
        );
        for seq in 1..=5 {
            tx.send(batch(seq)).await.unwrap();
        }
        let mut open = Vec::new();
        for want in 1..=3 {
            let (seq, confirm) = next(&mut sends).await;
            assert_eq!(seq, want);
            open.push(confirm);
        }
        // The window is full: nothing more goes out until a confirm.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            sends.try_recv().is_err(),
            "a fourth batch beyond the window"
        );
        open.remove(0).send(Ok(())).unwrap();
        let (seq, confirm) = next(&mut sends).await;
        assert_eq!(seq, 4);
        open.push(confirm);
        for c in open {
            c.send(Ok(())).unwrap();
        }
        let (seq, c) = next(&mut sends).await;
        assert_eq!(seq, 5);
        c.send(Ok(())).unwrap();
        drop(tx);
        handle.await.unwrap();
        assert_eq!(*releases.0.lock().unwrap(), vec![1, 2, 3, 4, 5]);
    }

    #[tokio::test]
    async fn the_urgent_lane_has_a_window_of_its_own_beside_a_full_one() {
        let (tx, mut sends, releases, ready, handle) = start_with(3, true);
        for seq in 1..=3 {
            tx.send(batch(seq)).await.unwrap();
        }
        let mut open = Vec::new();
        for _ in 1..=3 {
            open.push(next(&mut sends).await.1);
        }
        // The window is full: the permit out is the urgent lane's.
        let urgent_only = |want: bool| {
            let ready = Arc::clone(&ready);
            async move {
                tokio::time::timeout(Duration::from_secs(5), async {
                    while ready.urgent_only() != want {
                        tokio::task::yield_now().await;
                    }
                })
                .await
                .expect("the permit's kind changes")
            }
        };
        urgent_only(true).await;
        // The scheduler's urgent batches go before any confirmation, up to
        // a window of them...
        for seq in 4..=6 {
            tx.send(batch(seq)).await.unwrap();
            let (sent, c) = next(&mut sends).await;
            assert_eq!(sent, seq);
            open.push(c);
        }
        // ...and no more: the next waits for a confirmation.
        tx.send(batch(7)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(sends.try_recv().is_err(), "more than both windows");
        // A slot of the first window frees: any batch may take it.
        open.remove(0).send(Ok(())).unwrap();
        let (seq, c) = next(&mut sends).await;
        assert_eq!(seq, 7);
        open.push(c);
        for c in open {
            c.send(Ok(())).unwrap();
        }
        urgent_only(false).await;
        drop(tx);
        handle.await.unwrap();
        assert_eq!(*releases.0.lock().unwrap(), (1..=7).collect::<Vec<_>>());
    }

    #[tokio::test(start_paused = true)]
    async fn with_the_urgent_lane_bunched_confirmations_do_not_bunch_the_batches() {
        // Confirmations come back together every 80 ms (a round trip of
        // 80-160 ms). Without the pace a freed window of 8 is taken at one
        // instant, so the batches come in bunches and each carries what
        // the tokens earned since the one before (nothing, for most).
        let prior = weir_core::link_estimate::LinkEstimate {
            bytes_per_sec: 1e6,
            per_transaction: Duration::from_millis(50),
        };
        let (mut ctx, releases, ready, _) = context(prior);
        ctx.urgent_lane = true;
        let (tx, rx) = mpsc::channel(16);
        let sink = ModelLink {
            rate: 1e9,
            rtt: Duration::from_millis(80),
            free_at: tokio::time::Instant::now(),
            bunch: Some(Duration::from_millis(80)),
            epoch: tokio::time::Instant::now(),
            window: 8,
            confirm_per_byte: Duration::ZERO,
        };
        let handle = tokio::spawn(run(sink, rx, ctx));
        let mut taken = Vec::new();
        for seq in 1..=200u64 {
            ready.acquire().await.unwrap().forget();
            // A scheduler with no urgent record waits for the permit to
            // widen to any batch.
            while ready.urgent_only() {
                ready.widened().await;
            }
            taken.push(tokio::time::Instant::now());
            tx.send(batch(seq)).await.unwrap();
        }
        drop(tx);
        handle.await.unwrap();
        assert_eq!(releases.0.lock().unwrap().len(), 200);
        // Once round trips are measured: one batch per round trip / 8.
        let least = taken
            .windows(2)
            .skip(40)
            .map(|w| w[1] - w[0])
            .min()
            .expect("batches");
        assert!(
            least >= Duration::from_millis(9),
            "two batches {least:?} apart with an 80-160 ms round trip and a window of 8"
        );
    }

    #[tokio::test]
    async fn a_failed_confirm_resends_it_and_every_later_batch_in_order() {
        let (tx, mut sends, releases, _ready, handle) = start(4);
        for seq in 1..=4 {
            tx.send(batch(seq)).await.unwrap();
        }
        let mut open = Vec::new();
        for _ in 1..=4 {
            open.push(next(&mut sends).await);
        }
        // Batch 1 confirmed, batch 2 lost with the connection, 3 confirmed
        // (a confirm that arrived but is behind the failure), 4 pending.
        let mut open = open.into_iter();
        open.next().unwrap().1.send(Ok(())).unwrap();
        open.next()
            .unwrap()
            .1
            .send(Err(SinkError::Unavailable("connection lost".into())))
            .unwrap();
        let rest: Vec<_> = open.collect();
        let mut again = Vec::new();
        for _ in 0..3 {
            again.push(next(&mut sends).await);
        }
        assert_eq!(
            again.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
            vec![2, 3, 4],
            "go-back-N, in sending order"
        );
        drop(rest);
        for (_, c) in again {
            c.send(Ok(())).unwrap();
        }
        drop(tx);
        handle.await.unwrap();
        assert_eq!(
            *releases.0.lock().unwrap(),
            vec![1, 2, 3, 4],
            "each batch released once, in order"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_link_with_bunched_confirms_is_measured_at_its_rate() {
        // 2 MB/s behind 50 ms, always busy (8 batches in flight), and the
        // broker confirms every 20 ms, in bunches: per transaction, the
        // gap before a confirm is nothing or an fsync's worth.
        let rate = 2e6;
        let prior = weir_core::link_estimate::LinkEstimate {
            bytes_per_sec: 1e6,
            per_transaction: Duration::from_millis(50),
        };
        let (ctx, releases, _ready, published) = context(prior);
        let (tx, rx) = mpsc::channel(64);
        let now = tokio::time::Instant::now();
        let sink = ModelLink {
            rate,
            rtt: Duration::from_millis(50),
            free_at: now,
            bunch: Some(Duration::from_millis(20)),
            epoch: now,
            window: 8,
            confirm_per_byte: Duration::ZERO,
        };
        let handle = tokio::spawn(run(sink, rx, ctx));
        for seq in 1..=400u64 {
            let size = 8192 + (seq as usize * 7919) % (56 << 10);
            let mut b = batch(seq);
            b.records[0].payload = Bytes::from(vec![7u8; size]);
            tx.send(b).await.unwrap();
        }
        drop(tx);
        handle.await.unwrap();
        assert_eq!(releases.0.lock().unwrap().len(), 400);
        let est = *published.borrow();
        assert!(
            (est.bytes_per_sec / rate - 1.0).abs() < 0.1,
            "measured {:.0} B/s on a {rate} B/s link",
            est.bytes_per_sec
        );
    }

    /// What a delivery loop publishes after `batches` batches of 8-64 KiB
    /// over a modelled 2 MB/s link behind 50 ms with `confirm_per_byte`,
    /// sent `every` apart (zero: as fast as the window allows), from
    /// `prior`.
    async fn published_after(
        prior_bytes_per_sec: f64,
        batches: u64,
        every: Duration,
        confirm_per_byte: Duration,
    ) -> weir_core::link_estimate::LinkEstimate {
        let prior = weir_core::link_estimate::LinkEstimate {
            bytes_per_sec: prior_bytes_per_sec,
            per_transaction: Duration::from_millis(50),
        };
        published_from(prior, batches, every, confirm_per_byte, varied).await
    }

    /// 8-64 KiB, varied.
    fn varied(seq: u64) -> usize {
        8192 + (seq as usize * 7919) % (56 << 10)
    }

    /// [`published_after`] from any `prior`, with batches of `size(seq)`
    /// bytes.
    async fn published_from(
        prior: weir_core::link_estimate::LinkEstimate,
        batches: u64,
        every: Duration,
        confirm_per_byte: Duration,
        size: fn(u64) -> usize,
    ) -> weir_core::link_estimate::LinkEstimate {
        let (ctx, releases, _ready, published) = context(prior);
        let (tx, rx) = mpsc::channel(64);
        let now = tokio::time::Instant::now();
        let sink = ModelLink {
            rate: 2e6,
            rtt: Duration::from_millis(50),
            free_at: now,
            bunch: None,
            epoch: now,
            window: 8,
            confirm_per_byte,
        };
        let handle = tokio::spawn(run(sink, rx, ctx));
        for seq in 1..=batches {
            let size = size(seq);
            let mut b = batch(seq);
            b.records[0].payload = Bytes::from(vec![7u8; size]);
            tx.send(b).await.unwrap();
            tokio::time::sleep(every).await;
        }
        drop(tx);
        handle.await.unwrap();
        assert_eq!(releases.0.lock().unwrap().len() as u64, batches);
        let est = *published.borrow();
        est
    }

    #[tokio::test(start_paused = true)]
    async fn lone_transactions_do_not_take_the_bandwidth_below_the_prior() {
        // Each batch alone on the link, and the broker spends 1 us per
        // byte before confirming: a lone transaction's line has a slope of
        // 1.5 us per byte (0.67 MB/s), which is not what the link carries
        // when kept busy. Without evidence of saturation the prior stands.
        let idle = published_after(
            2e6,
            80,
            Duration::from_millis(300),
            Duration::from_micros(1),
        )
        .await;
        assert!(idle.bytes_per_sec >= 2e6, "{idle:?}");
        // The same link kept busy (and the prior too high): measured.
        let busy = published_after(4e6, 300, Duration::ZERO, Duration::ZERO).await;
        assert!(
            (busy.bytes_per_sec / 2e6 - 1.0).abs() < 0.1,
            "measured {:.0} B/s on a 2 MB/s link",
            busy.bytes_per_sec
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_sender_paced_under_its_link_climbs_back_to_the_prior() {
        // A prior T_sc of 20 ms on a 50 ms link: a batch sent up to 30 ms
        // after the one before left the link counts as sent behind it, and
        // its time is that of a busy period paced by the sender (about
        // 1 MB/s here, a batch of 8-64 KiB every 36 ms), not by the 2 MB/s
        // link. Such fits stand once 8 of 64 are "behind"; the round trips
        // show no queue, so the estimate acted on climbs back to the prior.
        let prior = weir_core::link_estimate::LinkEstimate {
            bytes_per_sec: 2e6,
            per_transaction: Duration::from_millis(20),
        };
        let est = published_from(
            prior,
            300,
            Duration::from_millis(36),
            Duration::ZERO,
            varied,
        )
        .await;
        assert!(
            est.bytes_per_sec >= 0.95 * 2e6,
            "acted on {:.0} B/s of a 2 MB/s link",
            est.bytes_per_sec
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_queue_on_the_link_acts_on_a_fit_of_alike_batches() {
        // Batches all of 48 KiB, kept busy on a 2 MB/s link with the prior
        // at 4 MB/s: alike sizes give no full fit (T_sc held), but the
        // link holds a queue, so the bandwidth the busy period shows is
        // the link's and is acted on. Without the queue's evidence the
        // prior would stand and the queue grow.
        let prior = weir_core::link_estimate::LinkEstimate {
            bytes_per_sec: 4e6,
            per_transaction: Duration::from_millis(50),
        };
        let est = published_from(prior, 300, Duration::ZERO, Duration::ZERO, |_| 48 << 10).await;
        assert!(
            (est.bytes_per_sec / 2e6 - 1.0).abs() < 0.1,
            "acted on {:.0} B/s of a 2 MB/s link",
            est.bytes_per_sec
        );
    }
}
