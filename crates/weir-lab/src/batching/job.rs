//! One job through the emulated relay: the job, how batches are closed
//! (fixed sizes or weir's online plan) and the run itself.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use weir_core::batching::{BatchLimits, BatchPlan, LatencyLine, ReferencePolicy};
use weir_core::class::{ClassId, ClassSet, LatencyClass};
use weir_core::link_estimate::{LinkEstimate, LinkEstimator};
use weir_core::scheduler::planner::Planner;

use crate::link::Link;

/// The PBTT window the online planner re-plans on: weir's default
/// `scheduler.window`.
pub const PLAN_WINDOW: Duration = Duration::from_millis(100);

/// weir's configured uplink prior (`scheduler.uplink`, 18 Mbit/s) and
/// transaction-time prior (`scheduler.transaction_time`, 50 ms): what a
/// relay starts from before it has measured anything.
pub const WEIR_PRIOR: LinkEstimate = LinkEstimate {
    bytes_per_sec: 18e6 / 8.0,
    per_transaction: Duration::from_millis(50),
};

/// The job as resolved from [`Args`](super::Args).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Job {
    /// Records in the job.
    pub records: u32,
    /// Bytes per record.
    pub record_bytes: u64,
    /// Time between arrivals.
    pub interval: Duration,
    /// The uplink.
    pub link: Link,
}

/// How the relay closes batches.
#[derive(Debug, Clone)]
pub enum Closing {
    /// Fixed buffers: the k-th batch holds `sizes[k % len]` records (the
    /// last one what is left when the job ends). `[1]` is FIFS.
    Sizes(Vec<u32>),
    /// weir's rule: when the link is free and the plan in force says close.
    Online(Box<Online>),
}

/// weir's batch planning, online, for one class: weir-core's [`Planner`]
/// re-plans every [`PLAN_WINDOW`] from the window's arrivals and the
/// [`LinkEstimator`]'s fit, which every finished transaction refines.
#[derive(Debug, Clone)]
pub struct Online {
    classes: ClassSet,
    planner: Planner,
    estimator: LinkEstimator,
    /// End of the window being counted (set by the first arrival).
    window_end: Option<Instant>,
    /// Arrivals not yet counted in a window: (when, bytes).
    uncounted: VecDeque<(Instant, u64)>,
}

impl Online {
    /// A planner for one class with latency `bound` at class rank `rank`
    /// (its reference record by weir's default policy), on weir's priors.
    pub fn new(bound: Duration, rank: usize) -> anyhow::Result<Self> {
        let classes = ClassSet::new(vec![LatencyClass::new("job", bound)])
            .map_err(|e| anyhow::anyhow!("the job's class: {e:?}"))?;
        let reference = ReferencePolicy::default().reference(rank, bound, Duration::ZERO);
        Ok(Online {
            classes,
            planner: Planner::new(1, BatchLimits::default(), vec![reference]),
            estimator: LinkEstimator::new(WEIR_PRIOR)?,
            window_end: None,
            uncounted: VecDeque::new(),
        })
    }

    /// The plan in force.
    pub fn plan(&self) -> BatchPlan {
        self.planner.plans()[0]
    }

    /// The link estimate in force.
    pub fn link(&self) -> LinkEstimate {
        self.estimator.estimate()
    }

    /// The fitted `L_up(s)` for records of `record_bytes`.
    pub fn upload_line(&self, record_bytes: f64) -> LatencyLine {
        self.planner
            .sizer(ClassId(0))
            .expect("one class")
            .upload_line(record_bytes, &self.link())
    }

    fn arrived(&mut self, at: Instant, bytes: u64) {
        self.window_end.get_or_insert(at + PLAN_WINDOW);
        self.uncounted.push_back((at, bytes));
    }

    /// Re-plans for every window that ended by `now`, each from the
    /// arrivals within it (windows that ended while the link was busy are
    /// counted in arrears, from the arrival times).
    fn catch_up(&mut self, now: Instant) {
        let Some(mut end) = self.window_end else {
            return;
        };
        while end <= now {
            let (mut records, mut bytes) = (0u64, 0u64);
            while let Some(&(at, b)) = self.uncounted.front() {
                if at >= end {
                    break;
                }
                self.uncounted.pop_front();
                records += 1;
                bytes += b;
            }
            let link = self.link();
            self.planner
                .replan(&self.classes, &[(records, bytes)], PLAN_WINDOW, &link);
            end += PLAN_WINDOW;
        }
        self.window_end = Some(end);
    }

    fn observe(&mut self, records: u32, bytes: u64, elapsed: Duration) {
        self.estimator.observe(bytes, elapsed);
        self.planner.observe(ClassId(0), records as usize, elapsed);
    }
}

/// One close of a planned run: the plan in force, and what was sent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlannedBatch {
    /// When the batch left, since the job's first arrival.
    pub at: Duration,
    /// The plan in force.
    pub plan: BatchPlan,
    /// Records sent.
    pub sent: u32,
}

/// One completed transaction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Transaction {
    /// Records carried.
    pub records: u32,
    /// Bytes carried.
    pub bytes: u64,
    /// From hand-off to the link to its completion.
    pub elapsed: Duration,
}

/// What one run of a job measured.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRun {
    /// First arrival to the completion of the last transaction.
    pub wall: Duration,
    /// Every transaction, in order.
    pub transactions: Vec<Transaction>,
    /// Arrival times since the first arrival.
    pub arrivals: Vec<Duration>,
    /// For a planned run, each close: planned against sent.
    pub plans: Vec<PlannedBatch>,
}

impl JobRun {
    /// Records per transaction, in order.
    pub fn batch_sizes(&self) -> Vec<u32> {
        self.transactions.iter().map(|t| t.records).collect()
    }
}

struct Arrival {
    bytes: u64,
    at: Instant,
}

/// Runs `job` once over its emulated link, closing batches by `closing`
/// (an online planner keeps what it learned for the next job).
pub async fn run_job(job: Job, closing: &mut Closing) -> JobRun {
    let n = job.records as usize;
    let (tx, mut rx) = mpsc::channel::<Arrival>(n.max(1));
    let epoch = Instant::now();
    let producer = tokio::spawn(produce(job, tx, epoch));
    let mut relay = Relaying {
        closing,
        epoch,
        pending: VecDeque::with_capacity(n),
        arrivals: Vec::with_capacity(n),
        transactions: Vec::new(),
        plans: Vec::new(),
        open: true,
        last_done: epoch,
    };
    loop {
        // Everything that arrived while the link was busy joins the queue.
        relay.take_arrived(&mut rx);
        if relay.pending.is_empty() {
            if !relay.open {
                break;
            }
            let a = rx.recv().await;
            relay.received(a);
            continue;
        }
        let (take, deadline) = relay.decide(Instant::now());
        match take {
            Some(k) => relay.send(k, &job.link).await,
            None => {
                // Wait for the next record or for the oldest one's deadline.
                let wake = async {
                    match deadline {
                        Some(d) => tokio::time::sleep_until(d).await,
                        None => std::future::pending().await,
                    }
                };
                // Cancel safety: `recv` is cancel safe; the sleep only waits.
                tokio::select! {
                    a = rx.recv(), if relay.open => relay.received(a),
                    _ = wake => {}
                }
            }
        }
    }
    // The producer has sent everything once the channel is closed.
    let _ = producer.await;
    JobRun {
        wall: relay.last_done - epoch,
        transactions: relay.transactions,
        arrivals: relay.arrivals,
        plans: relay.plans,
    }
}

/// The sensor side: `job`'s records at a fixed interval from `epoch`,
/// whatever the relay does (the channel holds the whole job, so it never
/// blocks).
async fn produce(job: Job, tx: mpsc::Sender<Arrival>, epoch: Instant) {
    for k in 0..job.records as usize {
        tokio::time::sleep_until(epoch + job.interval * k as u32).await;
        let a = Arrival {
            bytes: job.record_bytes,
            at: Instant::now(),
        };
        if tx.send(a).await.is_err() {
            return;
        }
    }
}

/// The relay side of a job as it runs: the records queued, whether more
/// may come, and what was measured so far.
struct Relaying<'c> {
    closing: &'c mut Closing,
    /// The job's start.
    epoch: Instant,
    pending: VecDeque<Arrival>,
    arrivals: Vec<Duration>,
    transactions: Vec<Transaction>,
    plans: Vec<PlannedBatch>,
    /// The producer may still send.
    open: bool,
    /// When the last transaction completed.
    last_done: Instant,
}

impl Relaying<'_> {
    /// Queues a record (an online planner counts it).
    fn arrived(&mut self, a: Arrival) {
        if let Closing::Online(o) = self.closing {
            o.arrived(a.at, a.bytes);
        }
        self.arrivals.push(a.at - self.epoch);
        self.pending.push_back(a);
    }

    /// Queues what a receive returned; `None` (the channel closed) closes
    /// the job.
    fn received(&mut self, a: Option<Arrival>) {
        match a {
            Some(a) => self.arrived(a),
            None => self.open = false,
        }
    }

    /// Queues every record already in the channel, noting if it closed.
    fn take_arrived(&mut self, rx: &mut mpsc::Receiver<Arrival>) {
        loop {
            match rx.try_recv() {
                Ok(a) => self.arrived(a),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    self.open = false;
                    break;
                }
            }
        }
    }

    /// Whether to close a batch at `now` (of how many records), and else
    /// when to look again (`None`: at the next record).
    fn decide(&mut self, now: Instant) -> (Option<usize>, Option<Instant>) {
        let pending = &self.pending;
        match &mut *self.closing {
            Closing::Sizes(sizes) => {
                let s = sizes[self.transactions.len() % sizes.len()].max(1) as usize;
                let ready = pending.len() >= s || !self.open;
                (ready.then(|| s.min(pending.len())), None)
            }
            Closing::Online(o) => {
                o.catch_up(now);
                let plan = o.plan();
                // As weir's drain does: the plan decides when a batch
                // closes, from everything queued; the batch then takes what
                // is queued, up to the byte cap.
                let queued: u64 = pending.iter().map(|a| a.bytes).sum();
                let age = now - pending[0].at;
                let close = plan.should_close(age, pending.len() as u32, queued);
                let mut k = 0;
                let mut bytes = 0u64;
                for a in pending {
                    if k > 0 && bytes + a.bytes > plan.max_bytes {
                        break;
                    }
                    k += 1;
                    bytes += a.bytes;
                }
                if close {
                    self.plans.push(PlannedBatch {
                        at: now - self.epoch,
                        plan,
                        sent: k as u32,
                    });
                }
                // Wake at the oldest record's wait or the next re-plan.
                let wake =
                    (pending[0].at + plan.max_wait).min(o.window_end.unwrap_or(now + PLAN_WINDOW));
                (close.then_some(k), Some(wake))
            }
        }
    }

    /// Sends the `k` oldest records over `link` as one transaction.
    async fn send(&mut self, k: usize, link: &Link) {
        let bytes: u64 = self.pending.drain(..k).map(|a| a.bytes).sum();
        let start = Instant::now();
        link.transact(bytes).await;
        self.last_done = Instant::now();
        let elapsed = self.last_done - start;
        if let Closing::Online(o) = self.closing {
            // The windows that ended on the way are re-planned at
            // the next decision, once their arrivals are read, with
            // this transaction already in the fits (weir re-plans
            // them on time, before it: a transaction earlier).
            o.observe(k as u32, bytes, elapsed);
        }
        self.transactions.push(Transaction {
            records: k as u32,
            bytes,
            elapsed,
        });
    }
}

/// Runs `(label, job, closing)` triples, up to `jobs` at once.
pub(super) async fn run_all(
    runs: Vec<(String, Job, Closing)>,
    jobs: usize,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<Vec<(String, JobRun)>> {
    let permits = Arc::new(Semaphore::new(jobs.max(1)));
    let mut set = JoinSet::new();
    for (i, (label, job, closing)) in runs.into_iter().enumerate() {
        let permits = Arc::clone(&permits);
        set.spawn(async move {
            let _permit = permits.acquire_owned().await.expect("never closed");
            let mut closing = closing;
            (i, label, run_job(job, &mut closing).await)
        });
    }
    let mut out = Vec::new();
    while let Some(r) = set.join_next().await {
        let (i, label, run) = r.context("an emulated run panicked")?;
        bar.set_message(label.clone());
        bar.inc(1);
        out.push((i, label, run));
    }
    out.sort_by_key(|(i, _, _)| *i);
    Ok(out.into_iter().map(|(_, l, r)| (l, r)).collect())
}
