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
use weir_core::delivery::{Delivery, DeliveryParams, Event, Offer};
use weir_core::link_estimate::LinkEstimate;
use weir_core::scheduler::{Delivered, OutBatch};
use weir_core::{ClassSet, NodeId};

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
    batch: OutBatch,
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
            Event::Fit(fit) => m.set_link(&fit),
            Event::Link(acted) => {
                self.ctx.link.send_replace(acted);
            }
            Event::BatchBytes(b) => {
                self.ctx.batch_bytes.send_replace(b);
            }
            Event::Measures(measures) => m.set_delivery(&measures),
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
        if self.compressor.enabled() {
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
            batch,
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
        let mut count = |b: &OutBatch| {
            for r in &b.records {
                m.undelivered(r.class, 1);
                records += 1;
            }
        };
        let mut batches_left = 0;
        for p in core.unconfirmed() {
            count(&p.batch);
            batches_left += 1;
        }
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
    }

    /// Everything else a confirmed transaction updates.
    fn confirmed(&self, done: &Prepared, elapsed: Duration) {
        let m = &self.ctx.metrics;
        let encoded = &done.encoded;
        for o in &self.ctx.observers {
            o.delivered(&done.batch.records);
        }
        m.latency
            .delivered(&done.batch.records, crate::clock::unix_micros());
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
            batch_bytes: watch::channel(0).0,
            max_in_flight_bytes: 64 << 20,
            max_batch_bytes: 4 << 20,
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

    /// A scripted sink whose send of one batch fails, once.
    struct FailsOnce {
        inner: Scripted,
        fail: Option<u64>,
    }

    impl Sink for FailsOnce {
        async fn send(&mut self, batch: &EncodedBatch) -> Result<Confirm, SinkError> {
            if self.fail == Some(batch.seq) {
                self.fail = None;
                return Err(SinkError::Unavailable("connection lost".into()));
            }
            self.inner.send(batch).await
        }

        fn window(&self) -> usize {
            self.inner.window
        }

        fn name(&self) -> &'static str {
            "fails-once"
        }
    }

    #[tokio::test]
    async fn a_failed_send_resends_every_unconfirmed_batch_and_forgets_their_first_confirms() {
        let prior = weir_core::link_estimate::LinkEstimate {
            bytes_per_sec: 1e6,
            per_transaction: Duration::from_millis(1),
        };
        let (ctx, releases, _ready, _) = context(prior);
        let (sends_tx, mut sends) = mpsc::unbounded_channel();
        let (tx, rx) = mpsc::channel(16);
        let sink = FailsOnce {
            inner: Scripted {
                window: 4,
                sends: sends_tx,
            },
            fail: Some(3),
        };
        let handle = tokio::spawn(run(sink, rx, ctx));
        for seq in 1..=3 {
            tx.send(batch(seq)).await.unwrap();
        }
        // 1 and 2 are sent and unconfirmed when 3's send fails.
        let first = vec![next(&mut sends).await, next(&mut sends).await];
        let mut again = Vec::new();
        for _ in 0..3 {
            again.push(next(&mut sends).await);
        }
        assert_eq!(
            again.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
            vec![1, 2, 3],
            "go-back-N, in sending order"
        );
        // The first sends' confirmations fail late (their connection is
        // gone): they must not count for the second sends.
        drop(first);
        for (_, c) in again {
            c.send(Ok(())).unwrap();
        }
        drop(tx);
        tokio::time::timeout(Duration::from_secs(5), handle)
            .await
            .expect("the loop finishes once the resent batches are confirmed")
            .unwrap();
        assert_eq!(*releases.0.lock().unwrap(), vec![1, 2, 3]);
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
