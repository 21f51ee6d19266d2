//! Intake: the one way into the class queues. MQTT and gRPC ingress,
//! peering (records redirected here, records taken back from a peer) and
//! the scheduler (which drains the queues and wakes waiting writers) all
//! share one [`Intake`]: it classifies, stamps origin and sequence number,
//! and enqueues. When a queue is full it *waits* for the scheduler to make
//! room (back-pressure); each front end decides what that means on its
//! wire.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use weir_core::classify::Classifier;
use weir_core::queueing::queue::{MultiLevelQueue, PushError};
use weir_core::{ClassId, ClassSet, NodeId, Receipt, Record};

use crate::clock::unix_micros;
use crate::handoff::Arrivals;
use crate::metrics::Metrics;
use crate::spool::{AppendError, Appended, SequenceLease, Spool, Ticket};

/// What became of a record handed to [`Intake::accept`].
#[derive(Debug)]
pub enum Accepted {
    /// In its class queue (a `memory` class): acknowledge now.
    Queued,
    /// Being written to the spool (a `spool` class): acknowledge once the
    /// ticket is durable, never before.
    Spooling(Ticket),
    /// Dropped by its class's `on_full = "drop-newest"` (counted): nothing
    /// to wait for.
    Dropped,
}

impl Accepted {
    /// The ticket the record's acknowledgement must wait for, if any.
    pub fn ticket(self) -> Option<Ticket> {
        match self {
            Accepted::Spooling(t) => Some(t),
            Accepted::Queued | Accepted::Dropped => None,
        }
    }
}

/// Where sequence numbers come from.
#[derive(Debug)]
enum Sequence {
    /// A counter seeded from the clock (no state directory).
    Counter(AtomicU64),
    /// A lease on disk that survives restarts and clock steps.
    Lease(SequenceLease),
}

impl Sequence {
    fn next(&self) -> u64 {
        match self {
            Sequence::Counter(c) => c.fetch_add(1, Ordering::Relaxed),
            Sequence::Lease(l) => l.next(),
        }
    }
}

/// Why a record was not enqueued.
#[derive(Debug, thiserror::Error)]
pub enum EnqueueError {
    /// Larger than its class queue's byte capacity: it can never fit.
    #[error("record of {size} bytes exceeds the byte capacity of class `{class}` ({limit} bytes)")]
    Oversized {
        /// The record's size.
        size: usize,
        /// Its class name.
        class: String,
        /// The class queue's byte capacity.
        limit: usize,
    },
    /// The queue stayed full for the whole wait.
    #[error("class `{class}` queue is full")]
    Full {
        /// The record, handed back.
        record: Record,
        /// Its class name.
        class: String,
    },
    /// weir is shutting down and accepts nothing more.
    #[error("weir is shutting down")]
    ShuttingDown,
}

/// The shared entry point of every ingress, of peering and of the
/// scheduler into the class queues.
#[derive(Debug)]
pub struct Intake {
    node: NodeId,
    classes: ClassSet,
    /// Swapped whole by a config reload; read without a lock.
    classifier: ArcSwap<Classifier>,
    queues: Arc<MultiLevelQueue>,
    next_seq: Sequence,
    space: Notify,
    arrivals: Arc<Arrivals>,
    spool: Option<Arc<Spool>>,
    shutdown: CancellationToken,
    /// Set once `shutdown` is cancelled, by a task that waits for it: the
    /// check on every record reads this instead of the token, whose
    /// `is_cancelled` takes a mutex every connection shares (4.5 % of
    /// weir's CPU at 900k records/s). `None` outside a runtime.
    stopping: Option<Arc<AtomicBool>>,
    metrics: Arc<Metrics>,
    /// Bytes of peers' records enqueued here, ever.
    foreign_bytes: AtomicU64,
}

impl Intake {
    /// A handle enqueuing into `queues`; sequence numbers start at
    /// `first_seq` (a restart must not reuse numbers the cloud has seen, so
    /// the binary seeds it from the clock).
    pub fn new(
        node: NodeId,
        classes: ClassSet,
        classifier: Classifier,
        queues: Arc<MultiLevelQueue>,
        first_seq: u64,
        shutdown: CancellationToken,
        metrics: Arc<Metrics>,
    ) -> Self {
        Intake {
            node,
            classes,
            classifier: ArcSwap::from_pointee(classifier),
            queues,
            next_seq: Sequence::Counter(AtomicU64::new(first_seq)),
            space: Notify::new(),
            arrivals: Arc::default(),
            spool: None,
            stopping: watch_cancelled(&shutdown),
            shutdown,
            metrics,
            foreign_bytes: AtomicU64::new(0),
        }
    }

    /// Whether shutdown has begun (new records are refused).
    #[inline]
    fn stopping(&self) -> bool {
        match &self.stopping {
            Some(flag) => flag.load(Ordering::Acquire),
            None => self.shutdown.is_cancelled(),
        }
    }

    /// Spooled classes go through `spool`; sequence numbers come from
    /// `lease` (see [`SequenceLease`]).
    pub fn with_spool(mut self, spool: Option<Arc<Spool>>, lease: Option<SequenceLease>) -> Self {
        self.spool = spool;
        if let Some(lease) = lease {
            self.next_seq = Sequence::Lease(lease);
        }
        self
    }

    /// The notification the scheduler waits on for arrivals (the spool
    /// rings it for records it hands to the queues).
    pub fn arrivals_handle(&self) -> Arc<Arrivals> {
        Arc::clone(&self.arrivals)
    }

    /// The spool, if any class uses it.
    pub fn spool(&self) -> Option<&Arc<Spool>> {
        self.spool.as_ref()
    }

    /// These records were delivered (egress confirmed, or a peer delivered
    /// them): their spool space may be reclaimed.
    pub fn release(&self, records: &[Receipt]) {
        if let Some(spool) = &self.spool {
            spool.release(records);
        }
    }

    /// Bytes of records enqueued for peers ([`Self::try_enqueue_foreign`])
    /// since start: the queues' arrivals less these are the node's own.
    pub fn foreign_bytes(&self) -> u64 {
        self.foreign_bytes.load(Ordering::Relaxed)
    }

    /// This node's id.
    pub fn node(&self) -> NodeId {
        self.node
    }

    /// The latency classes.
    pub fn classes(&self) -> &ClassSet {
        &self.classes
    }

    /// The class queues.
    pub fn queues(&self) -> &Arc<MultiLevelQueue> {
        &self.queues
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Cancelled when weir shuts down.
    pub fn shutdown(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// Classifies every record from now on with `classifier` (a config
    /// reload); records already queued keep their class.
    pub fn set_classifier(&self, classifier: Classifier) {
        self.classifier.store(Arc::new(classifier));
    }

    /// A new record from MQTT `topic`, classified by topic filter.
    pub fn mqtt_record(&self, topic: Bytes, payload: Bytes) -> Record {
        self.mqtt_record_at(topic, payload, unix_micros())
    }

    /// [`mqtt_record`](Self::mqtt_record) that arrived at `ingress_us`
    /// (microseconds since the Unix epoch): the listener reads the clock
    /// once per read, not once per record.
    pub fn mqtt_record_at(&self, topic: Bytes, payload: Bytes, ingress_us: u64) -> Record {
        let classifier = self.classifier.load();
        let class = std::str::from_utf8(&topic)
            .map(|t| classifier.classify_mqtt(t))
            .unwrap_or(classifier.default_class());
        self.stamp(class, topic, payload, ingress_us)
    }

    /// A new record from gRPC stream `stream`, classified by stream name.
    pub fn grpc_record(&self, stream: &str, payload: Bytes) -> Record {
        let class = self.classifier.load().classify_grpc(stream);
        self.stamp(
            class,
            Bytes::copy_from_slice(stream.as_bytes()),
            payload,
            unix_micros(),
        )
    }

    fn stamp(&self, class: ClassId, key: Bytes, payload: Bytes, ingress_us: u64) -> Record {
        Record {
            key,
            class,
            origin: self.node,
            seq: self.next_seq.next(),
            ingress_us,
            payload,
            spool: None,
        }
    }

    /// The name of a class.
    pub fn class_name(&self, class: ClassId) -> &str {
        &self.classes.get(class).name
    }

    /// The spool, if `record`'s class is spooled.
    fn spool_for(&self, record: &Record) -> Option<&Arc<Spool>> {
        self.spool.as_ref().filter(|s| s.spools(record.class))
    }

    /// A record larger than its class's memory queue can never be handed
    /// to it, spooled or not.
    fn oversized(&self, record: &Record) -> Option<EnqueueError> {
        let limit = self.queues.class(record.class).capacity().bytes;
        (record.size() > limit).then(|| {
            self.metrics.refused(record.class);
            EnqueueError::Oversized {
                size: record.size(),
                class: self.class_name(record.class).to_string(),
                limit,
            }
        })
    }

    /// Accepts a record from a device: a `memory` class's record is
    /// queued (as [`Self::enqueue`]), a `spool` class's record is appended
    /// to the spool. Waits up to `max_wait` (`None`: until shutdown) while
    /// the queue or the spool's quota is full.
    pub async fn accept(
        &self,
        record: Record,
        max_wait: Option<Duration>,
    ) -> Result<Accepted, EnqueueError> {
        let Some(spool) = self.spool_for(&record) else {
            return self
                .enqueue(record, max_wait)
                .await
                .map(|()| Accepted::Queued);
        };
        if self.stopping() {
            return Err(EnqueueError::ShuttingDown);
        }
        if let Some(e) = self.oversized(&record) {
            return Err(e);
        }
        let class = record.class;
        let outcome = match spool.try_append(record) {
            Err(AppendError::Full(back)) => {
                self.metrics.backpressured(class);
                // Cancel safety: dropping `append` drops a record that was
                // never appended nor acknowledged.
                tokio::select! {
                    outcome = spool.append(back, max_wait) => outcome,
                    _ = self.shutdown.cancelled() => return Err(EnqueueError::ShuttingDown),
                }
            }
            other => other,
        };
        self.spooled(outcome, class)
    }

    /// [`Self::accept`] without waiting: a full queue or quota hands the
    /// record back.
    pub fn try_accept(&self, record: Record) -> Result<Accepted, EnqueueError> {
        let Some(spool) = self.spool_for(&record) else {
            return self.try_enqueue(record).map(|()| Accepted::Queued);
        };
        if self.stopping() {
            return Err(EnqueueError::ShuttingDown);
        }
        if let Some(e) = self.oversized(&record) {
            return Err(e);
        }
        let class = record.class;
        self.spooled(spool.try_append(record), class)
    }

    fn spooled(
        &self,
        outcome: Result<Appended, AppendError>,
        class: ClassId,
    ) -> Result<Accepted, EnqueueError> {
        match outcome {
            Ok(Appended::Pending(t)) => Ok(Accepted::Spooling(t)),
            Ok(Appended::Dropped) => Ok(Accepted::Dropped),
            Err(AppendError::Full(record)) => Err(EnqueueError::Full {
                record,
                class: self.class_name(class).to_string(),
            }),
            Err(AppendError::Closed) => Err(EnqueueError::ShuttingDown),
        }
    }

    /// Enqueues without waiting; a full queue hands the record back.
    pub fn try_enqueue(&self, record: Record) -> Result<(), EnqueueError> {
        if self.stopping() {
            return Err(EnqueueError::ShuttingDown);
        }
        let class = record.class;
        match self.queues.push(record) {
            Ok(()) => {
                self.metrics.accepted(class);
                self.arrivals.ring(class);
                Ok(())
            }
            Err(PushError::Full(record)) => Err(EnqueueError::Full {
                record,
                class: self.class_name(class).to_string(),
            }),
            Err(PushError::Oversized(record)) => {
                self.metrics.refused(class);
                Err(EnqueueError::Oversized {
                    size: record.size(),
                    class: self.class_name(class).to_string(),
                    limit: self.queues.class(class).capacity().bytes,
                })
            }
        }
    }

    /// Enqueues, waiting up to `max_wait` for room while the queue is full
    /// (`None`: as long as it takes, until shutdown).
    pub async fn enqueue(
        &self,
        mut record: Record,
        max_wait: Option<Duration>,
    ) -> Result<(), EnqueueError> {
        let deadline = max_wait.map(|d| tokio::time::Instant::now() + d);
        loop {
            // Register interest before trying, so a notify between the failed
            // push and the wait is not missed.
            let notified = self.space.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.try_enqueue(record) {
                Err(EnqueueError::Full {
                    record: back,
                    class,
                }) => {
                    self.metrics.backpressured(back.class);
                    let sleep = async {
                        match deadline {
                            Some(d) => tokio::time::sleep_until(d).await,
                            None => std::future::pending().await,
                        }
                    };
                    // Cancel safety: every branch only waits; the record is
                    // held in this frame and either retried or handed back.
                    tokio::select! {
                        _ = &mut notified => record = back,
                        _ = self.shutdown.cancelled() => return Err(EnqueueError::ShuttingDown),
                        _ = sleep => return Err(EnqueueError::Full { record: back, class }),
                    }
                }
                other => return other,
            }
        }
    }

    /// Enqueues a record that entered weir at another node (a peer
    /// redirected it), keeping its origin, sequence number and ingress
    /// time, as a kept record: this node sends it itself, never passes it
    /// on ([`weir_core::queueing::queue`]). Never waits: the peer protocol refuses
    /// instead, and the sender keeps the record. Not counted in
    /// `records_accepted`, which counts what entered weir here.
    pub fn try_enqueue_foreign(&self, record: Record) -> Result<(), EnqueueError> {
        if self.stopping() {
            return Err(EnqueueError::ShuttingDown);
        }
        let class = record.class;
        let size = record.size() as u64;
        match self.queues.push_kept(record) {
            Ok(()) => {
                self.foreign_bytes.fetch_add(size, Ordering::Relaxed);
                self.arrivals.ring(class);
                Ok(())
            }
            Err(PushError::Full(record)) => Err(EnqueueError::Full {
                record,
                class: self.class_name(class).to_string(),
            }),
            Err(PushError::Oversized(record)) => Err(EnqueueError::Oversized {
                size: record.size(),
                class: self.class_name(class).to_string(),
                limit: self.queues.class(class).capacity().bytes,
            }),
        }
    }

    /// Puts back a record this node took out of its queue for a peer that
    /// did not acknowledge it (refused, or the stream broke). It was
    /// acknowledged at ingress, so it goes back even while weir shuts down
    /// (the scheduler still drains), waiting for room as long as it takes;
    /// only `abort` gives up, handing the record back.
    pub async fn requeue(
        &self,
        mut record: Record,
        abort: &CancellationToken,
    ) -> Result<(), Record> {
        loop {
            // Register before pushing, as in `enqueue`.
            let notified = self.space.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let class = record.class;
            match self.queues.push(record) {
                Ok(()) => {
                    self.arrivals.ring(class);
                    return Ok(());
                }
                Err(PushError::Full(back)) => {
                    // Cancel safety: both branches only wait; the record is
                    // held in this frame.
                    tokio::select! {
                        _ = &mut notified => record = back,
                        _ = abort.cancelled() => return Err(back),
                    }
                }
                // It came out of this very queue, so it fits an empty one;
                // only a queue smaller than the record (never built) refuses.
                Err(PushError::Oversized(back)) => return Err(back),
            }
        }
    }

    /// Resolves after a record has been enqueued since the last call (one
    /// stored permit, so an arrival between two waits is not missed).
    pub async fn arrived(&self) {
        self.arrivals.any().await
    }

    /// The same for records of the most urgent class only (what the urgent
    /// lane can carry, [`crate::handoff::LinkSlots`]).
    pub async fn urgent_arrived(&self) {
        self.arrivals.urgent().await
    }

    /// Bytes of each class spooled on disk and not yet read back into its
    /// queue, by class index (empty without a spool).
    pub fn spooled_behind(&self) -> Vec<u64> {
        self.spool
            .as_ref()
            .map_or_else(Vec::new, |s| s.behind_bytes())
    }

    /// Wakes ingress waiting for room; the scheduler calls it after draining.
    pub fn notify_space(&self) {
        self.space.notify_waiters();
        if let Some(spool) = &self.spool {
            spool.notify_space();
        }
    }
}
/// A flag set once `token` is cancelled, by a task on the current runtime
/// (`None` outside one). Records enqueued between the cancel and the flag
/// are drained like any other: shutdown waits for the listeners before it
/// drains the queues.
fn watch_cancelled(token: &CancellationToken) -> Option<Arc<AtomicBool>> {
    let handle = tokio::runtime::Handle::try_current().ok()?;
    let flag = Arc::new(AtomicBool::new(token.is_cancelled()));
    let (set, token) = (Arc::clone(&flag), token.clone());
    handle.spawn(async move {
        token.cancelled().await;
        set.store(true, Ordering::Release);
    });
    Some(flag)
}
