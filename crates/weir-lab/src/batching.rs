//! `weir-lab batching`: the buffer-aided relaying job (Li et al., Fig. 10)
//! over the emulated link, and the batch size weir's own fitted model picks.
//!
//! A job is `records` small records arriving every `interval` at a relay
//! whose uplink costs a fixed `T_cc` per transaction plus the bytes over the
//! bandwidth, one transaction at a time. The wall-clock of the job runs from
//! the first record's arrival to the end of the transaction that carries the
//! last one. It is measured
//! - first-in-first-served (FIFS): one record per transaction;
//! - with a fixed buffer of `s` records (the paper's Fig. 10): a batch
//!   leaves when `s` records are buffered, the remainder when the job ends;
//! - with weir's plan: a warm-up of six transactions of 1..32 records plus
//!   the FIFS run feed a [`LinkEstimator`] and a [`BatchSizer`] (the online
//!   fits weir runs on its own transactions, starting from weir's default
//!   priors, which are deliberately wrong for this link); the arrival rate
//!   and record size are measured from the FIFS run; the reference record
//!   comes from [`ReferencePolicy`] for the class's rank; and
//!   [`BatchSizer::plan`] gives the closing rule. The relay then closes a
//!   batch when the link is free and [`BatchPlan::should_close`] says so
//!   (target reached, byte cap, or the oldest record waited `max_wait`),
//!   exactly as weir's scheduler does, not knowing when the job ends.
//!
//! Runs are independent emulated links, so several run at once (`--jobs`):
//! they only sleep.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde_json::json;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use weir_core::batching::{
    BatchLimits, BatchPlan, BatchSizer, ClassTraffic, LatencyLine, PlanReason, ReferencePolicy,
};
use weir_core::link_estimate::{two_transfer_probe, LinkEstimate, LinkEstimator};

use crate::link::{Link, LinkSummary};
use crate::relay;
use crate::report::{self, HLine, LineChart, Mark, Series, Table};

/// Batch sizes of the warm-up: six distinct sizes give the fits 15
/// distinct-size pairs (Theil–Sen needs 6) and span the sizes the plan will
/// consider.
pub const WARMUP_SIZES: [u32; 6] = [1, 2, 4, 8, 16, 32];

/// Records in the paper's job (Fig. 10).
pub const PAPER_JOB_RECORDS: u32 = 50;

/// Quiet time between jobs through the relay: a few PBTT windows, so each
/// job starts as a fresh burst would, on plans made from a quiet window.
pub const RELAY_PAUSE: Duration = Duration::from_millis(500);

/// The paper's measured job (Fig. 10): FIFS wall-clock, ms.
pub const PAPER_FIFS_MS: f64 = 7694.0;

/// The paper's measured job buffered 50 at a time, ms.
pub const PAPER_BATCHED_MS: f64 = 2025.0;

/// The paper's batch size for that job.
pub const PAPER_BATCH: u32 = 50;

/// The paper's speedup, 7694 / 2025, as it reports it.
pub const PAPER_SPEEDUP: f64 = 3.8;

/// weir's configured uplink prior (`scheduler.uplink`, 18 Mbit/s) and
/// transaction-time prior (`scheduler.transaction_time`, 50 ms): what a
/// relay starts from before it has measured anything.
pub const WEIR_PRIOR: LinkEstimate = LinkEstimate {
    bytes_per_sec: 18e6 / 8.0,
    per_transaction: Duration::from_millis(50),
};

/// Batch sizes to sweep: `2..50` (inclusive) or `2,5,10`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sizes(pub Vec<u32>);

impl std::str::FromStr for Sizes {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad =
            || format!("batch sizes `{s}`: use a range such as 2..50 or a list such as 2,5,10");
        let num = |t: &str| t.trim().parse::<u32>().ok().filter(|n| *n >= 1);
        let sizes: Vec<u32> = if let Some((a, b)) = s.split_once("..") {
            let (a, b) = (
                num(a).ok_or_else(bad)?,
                num(b.trim_start_matches('=')).ok_or_else(bad)?,
            );
            if a > b {
                return Err(bad());
            }
            (a..=b).collect()
        } else {
            s.split(',')
                .map(|t| num(t).ok_or_else(bad))
                .collect::<Result<_, _>>()?
        };
        if sizes.is_empty() {
            return Err(bad());
        }
        Ok(Sizes(sizes))
    }
}

/// Options of `weir-lab batching`. Unset values take the full-size
/// defaults, or the `--quick` ones.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Records in the job [default: 50, the paper's job; quick: 20].
    #[arg(long)]
    pub records: Option<u32>,
    /// Fixed batch sizes to measure, a range `2..50` or a list `2,5,10`
    /// [default: 2..50, Fig. 10; quick: 2,5,10,20].
    #[arg(long)]
    pub sizes: Option<Sizes>,
    /// Runs of each configuration; the table shows the mean.
    #[arg(long, default_value_t = 1)]
    pub repeat: u32,
    /// Bytes per record [default: 1400, the paper's prediagnosis report].
    #[arg(long)]
    pub record_bytes: Option<u64>,
    /// Milliseconds between arrivals [default: 10, the paper's "about every
    /// 10 ms"; quick: 2].
    #[arg(long)]
    pub interval_ms: Option<f64>,
    /// Fixed time per transaction `T_cc`, ms [default: 148, so FIFS of 50
    /// lands near the paper's 7694 ms; quick: 20].
    #[arg(long)]
    pub transaction_ms: Option<f64>,
    /// Milliseconds one record adds to a transaction (sets the bandwidth)
    /// [default: 5, the paper's Eq. 3 slope; quick: 1].
    #[arg(long)]
    pub per_record_ms: Option<f64>,
    /// Latency bound of the class, ms (a latency-tolerant class).
    #[arg(long, default_value_t = 10_000)]
    pub bound_ms: u64,
    /// Rank of the class (0 = most urgent); picks the reference record by
    /// weir's default policy (ls 2, nm 6, lt 11).
    #[arg(long, default_value_t = 2)]
    pub class_rank: usize,
    /// Emulated links run at once (they only sleep).
    #[arg(long, default_value_t = 8)]
    pub jobs: usize,
    /// Skip the runs through weir's own relay (App, scheduler, egress).
    #[arg(long)]
    pub no_relay: bool,
    /// Small and fast: for tests and a first look.
    #[arg(long)]
    pub quick: bool,
}

/// The job as resolved from [`Args`].
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

impl Args {
    fn job(&self) -> anyhow::Result<(Job, Vec<u32>)> {
        let q = self.quick;
        let records = self
            .records
            .unwrap_or(if q { 20 } else { PAPER_JOB_RECORDS });
        let record_bytes = self.record_bytes.unwrap_or(1400);
        let interval_ms = self.interval_ms.unwrap_or(if q { 2.0 } else { 10.0 });
        let tx_ms = self.transaction_ms.unwrap_or(if q { 20.0 } else { 148.0 });
        let per_record_ms = self.per_record_ms.unwrap_or(if q { 1.0 } else { 5.0 });
        let sizes = match &self.sizes {
            Some(s) => s.0.clone(),
            None if q => vec![2, 5, 10, 20],
            None => (2..=50).collect(),
        };
        anyhow::ensure!(records >= 1, "--records must be at least 1");
        anyhow::ensure!(record_bytes >= 1, "--record-bytes must be at least 1");
        anyhow::ensure!(
            interval_ms >= 0.0 && tx_ms >= 0.0 && per_record_ms > 0.0,
            "--interval-ms and --transaction-ms must be >= 0, --per-record-ms > 0"
        );
        anyhow::ensure!(self.repeat >= 1, "--repeat must be at least 1");
        let job = Job {
            records,
            record_bytes,
            interval: Duration::from_secs_f64(interval_ms / 1e3),
            link: Link {
                per_transaction: Duration::from_secs_f64(tx_ms / 1e3),
                bytes_per_sec: record_bytes as f64 / (per_record_ms / 1e3),
            },
        };
        Ok((job, sizes))
    }
}

/// How the relay closes batches.
#[derive(Debug, Clone, PartialEq)]
pub enum Closing {
    /// Fixed buffers: the k-th batch holds `sizes[k % len]` records (the
    /// last one what is left when the job ends). `[1]` is FIFS.
    Sizes(Vec<u32>),
    /// weir's rule: when the link is free and the plan says close.
    Plan(BatchPlan),
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

/// Runs `job` once over its emulated link, closing batches by `closing`.
pub async fn run_job(job: Job, closing: Closing) -> JobRun {
    let n = job.records as usize;
    let (tx, mut rx) = mpsc::channel::<Arrival>(n.max(1));
    let epoch = Instant::now();
    // The sensor side: records at a fixed interval, whatever the relay does
    // (the channel holds the whole job, so it never blocks).
    let producer = tokio::spawn(async move {
        for k in 0..n {
            tokio::time::sleep_until(epoch + job.interval * k as u32).await;
            let a = Arrival {
                bytes: job.record_bytes,
                at: Instant::now(),
            };
            if tx.send(a).await.is_err() {
                return;
            }
        }
    });

    let mut pending: VecDeque<Arrival> = VecDeque::with_capacity(n);
    let mut arrivals = Vec::with_capacity(n);
    let mut transactions = Vec::new();
    let mut open = true;
    let mut last_done = epoch;
    loop {
        // Everything that arrived while the link was busy joins the queue.
        loop {
            match rx.try_recv() {
                Ok(a) => {
                    arrivals.push(a.at - epoch);
                    pending.push_back(a);
                }
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        if pending.is_empty() {
            if !open {
                break;
            }
            match rx.recv().await {
                Some(a) => {
                    arrivals.push(a.at - epoch);
                    pending.push_back(a);
                }
                None => open = false,
            }
            continue;
        }
        let now = Instant::now();
        let (take, deadline) = match &closing {
            Closing::Sizes(sizes) => {
                let s = sizes[transactions.len() % sizes.len()].max(1) as usize;
                let ready = pending.len() >= s || !open;
                (ready.then(|| s.min(pending.len())), None)
            }
            Closing::Plan(plan) => {
                let target = plan.target_records.max(1) as usize;
                let mut k = 0;
                let mut bytes = 0u64;
                for a in pending.iter().take(target) {
                    if k > 0 && bytes + a.bytes > plan.max_bytes {
                        break;
                    }
                    k += 1;
                    bytes += a.bytes;
                }
                let full = k < pending.len().min(target);
                let age = now - pending[0].at;
                let close = full || plan.should_close(age, k as u32, bytes);
                (close.then_some(k), Some(pending[0].at + plan.max_wait))
            }
        };
        match take {
            Some(k) => {
                let bytes: u64 = pending.drain(..k).map(|a| a.bytes).sum();
                let start = Instant::now();
                job.link.transact(bytes).await;
                last_done = Instant::now();
                transactions.push(Transaction {
                    records: k as u32,
                    bytes,
                    elapsed: last_done - start,
                });
            }
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
                    a = rx.recv(), if open => match a {
                        Some(a) => {
                            arrivals.push(a.at - epoch);
                            pending.push_back(a);
                        }
                        None => open = false,
                    },
                    _ = wake => {}
                }
            }
        }
    }
    // The producer has sent everything once the channel is closed.
    let _ = producer.await;
    JobRun {
        wall: last_done - epoch,
        transactions,
        arrivals,
    }
}

/// What weir's model made of the warm-up and the FIFS run.
#[derive(Debug, Clone)]
pub struct Model {
    /// The link estimator's fit.
    pub link: LinkEstimate,
    /// The paper's two-transfer probe on the warm-up's 1- and 32-record
    /// transactions, for comparison.
    pub probe: Option<LinkEstimate>,
    /// The batch sizer's `L_up(s)`.
    pub upload: LatencyLine,
    /// The class's traffic as measured.
    pub traffic: ClassTraffic,
    /// The plan.
    pub plan: BatchPlan,
}

/// Feeds weir's online fits with the transactions of `warmup` and `fifs`
/// (starting from [`WEIR_PRIOR`]) and plans the class of rank `rank` with
/// latency `bound`.
pub fn fit_model(
    warmup: &JobRun,
    fifs: &JobRun,
    bound: Duration,
    rank: usize,
) -> anyhow::Result<Model> {
    let mut estimator = LinkEstimator::new(WEIR_PRIOR)?;
    let mut sizer = BatchSizer::new(BatchLimits::default());
    for t in warmup.transactions.iter().chain(&fifs.transactions) {
        estimator.observe(t.bytes, t.elapsed);
        sizer.observe(t.records, t.elapsed);
    }
    let link = estimator.estimate();
    let smallest = warmup.transactions.iter().min_by_key(|t| t.bytes);
    let largest = warmup.transactions.iter().max_by_key(|t| t.bytes);
    let probe = match (smallest, largest) {
        (Some(s), Some(l)) => two_transfer_probe(s.bytes, s.elapsed, l.bytes, l.elapsed).ok(),
        _ => None,
    };

    let arr = &fifs.arrivals;
    anyhow::ensure!(
        arr.len() >= 2,
        "the FIFS run needs at least two records to measure a rate"
    );
    let span = (arr[arr.len() - 1] - arr[0]).as_secs_f64();
    let arrival_rate = if span > 0.0 {
        (arr.len() - 1) as f64 / span
    } else {
        f64::INFINITY
    };
    let (records, bytes) = fifs.transactions.iter().fold((0u64, 0u64), |(r, b), t| {
        (r + t.records as u64, b + t.bytes)
    });
    let mean_record_bytes = bytes as f64 / records.max(1) as f64;

    let upload = sizer.upload_line(mean_record_bytes, &link);
    let single = Duration::from_secs_f64(upload.at(1.0).max(0.0));
    let reference = ReferencePolicy::default().reference(rank, bound, single);
    let traffic = ClassTraffic {
        arrival_rate,
        mean_record_bytes,
        latency_bound: bound,
        reference,
    };
    let plan = sizer.plan(&traffic, &link);
    Ok(Model {
        link,
        probe,
        upload,
        traffic,
        plan,
    })
}

/// Runs `(label, job, closing)` triples, up to `jobs` at once.
async fn run_all(
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
            (i, label, run_job(job, closing).await)
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

fn reason_text(r: PlanReason) -> String {
    match r {
        PlanReason::Batching(limit) => format!("batching, size set by {limit:?}"),
        other => format!("{other:?}"),
    }
}

fn walls(runs: &[(String, JobRun)], label: &str) -> Vec<f64> {
    runs.iter()
        .filter(|(l, _)| l == label)
        .map(|(_, r)| report::ms(r.wall))
        .collect()
}

/// Runs the experiment: returns the table for stdout, the JSON and the SVG.
pub async fn run(args: &Args) -> anyhow::Result<(String, serde_json::Value, String)> {
    let (job, sizes) = args.job()?;
    let bound = Duration::from_millis(args.bound_ms);
    let repeat = args.repeat as usize;
    let relay_runs = if args.no_relay { 0 } else { 1 + repeat };
    let total = 2 + repeat * (1 + sizes.len()) + repeat - 1 + relay_runs;
    let bar = report::progress(total as u64, "batching");

    // Phase 1: the warm-up and the first FIFS run, which the model learns
    // from.
    let warmup_job = Job {
        records: WARMUP_SIZES.iter().sum(),
        ..job
    };
    let first = run_all(
        vec![
            (
                "warm-up".into(),
                warmup_job,
                Closing::Sizes(WARMUP_SIZES.to_vec()),
            ),
            ("fifs".into(), job, Closing::Sizes(vec![1])),
        ],
        args.jobs,
        &bar,
    )
    .await?;
    let (warmup, fifs0) = (&first[0].1, &first[1].1);
    let model = fit_model(warmup, fifs0, bound, args.class_rank)?;

    // Phase 2: the other FIFS runs, the sweep and weir's plan.
    let mut runs = Vec::new();
    for _ in 1..repeat {
        runs.push(("fifs".to_string(), job, Closing::Sizes(vec![1])));
    }
    for _ in 0..repeat {
        for &s in &sizes {
            runs.push((format!("size {s}"), job, Closing::Sizes(vec![s])));
        }
        runs.push(("weir".to_string(), job, Closing::Plan(model.plan)));
    }
    let mut results = run_all(runs, args.jobs, &bar).await?;

    // Phase 3: the same job through weir's relay: a first job on its
    // priors, then `repeat` more once it has learned from its own traffic.
    let relay = if args.no_relay {
        None
    } else {
        bar.set_message("weir's relay");
        let r = relay::Relay::start(&std::env::temp_dir(), &job.link, bound).await?;
        let first = r
            .run_job(job.records, job.record_bytes, job.interval)
            .await?;
        bar.inc(1);
        let mut later = Vec::new();
        for _ in 0..repeat {
            tokio::time::sleep(RELAY_PAUSE).await;
            later.push(
                r.run_job(job.records, job.record_bytes, job.interval)
                    .await?,
            );
            bar.inc(1);
        }
        r.stop().await?;
        Some((first, later))
    };
    bar.finish_and_clear();
    results.push(("fifs".into(), fifs0.clone()));

    let fifs_runs = walls(&results, "fifs");
    let fifs_ms = report::mean(&fifs_runs);
    let chosen_runs = walls(&results, "weir");
    let chosen_ms = report::mean(&chosen_runs);
    let chosen_batches: Vec<Vec<u32>> = results
        .iter()
        .filter(|(l, _)| l == "weir")
        .map(|(_, r)| r.batch_sizes())
        .collect();
    let series: Vec<(u32, Vec<f64>, f64)> = sizes
        .iter()
        .map(|&s| {
            let runs = walls(&results, &format!("size {s}"));
            let m = report::mean(&runs);
            (s, runs, m)
        })
        .collect();
    let (best_batch, best_ms) = series
        .iter()
        .map(|(s, _, m)| (*s, *m))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap_or((1, fifs_ms));
    let plan = model.plan;
    let chosen_batch = plan.target_records;
    let speedup = fifs_ms / chosen_ms;

    // The table.
    let mut t = Table::new(["run", "batch", "transactions", "wall ms", "vs FIFS"]);
    let fifs_tx = fifs0.transactions.len().to_string();
    t.row([
        "FIFS (one record per transaction)".to_string(),
        "1".into(),
        fifs_tx,
        format!("{fifs_ms:.0}"),
        "1.00x".into(),
    ]);
    for (s, _, m) in &series {
        t.row([
            format!(
                "fixed buffer{}",
                if *s == best_batch { " (best)" } else { "" }
            ),
            s.to_string(),
            job.records.div_ceil(*s).to_string(),
            format!("{m:.0}"),
            format!("{:.2}x", fifs_ms / m),
        ]);
    }
    t.row([
        format!(
            "weir's plan (close at {} or {:.0} ms)",
            plan.target_records,
            plan.max_wait.as_secs_f64() * 1e3
        ),
        chosen_batch.to_string(),
        chosen_batches.first().map_or(0, Vec::len).to_string(),
        format!("{chosen_ms:.0}"),
        format!("{speedup:.2}x"),
    ]);
    let relay_ms = relay.as_ref().map(|(first, later)| {
        let runs: Vec<f64> = later.iter().map(|r| report::ms(r.wall)).collect();
        (report::ms(first.wall), report::mean(&runs), runs)
    });
    if let (Some((first, later)), Some((first_ms, ms, _))) = (&relay, &relay_ms) {
        t.row([
            "relay, first job (weir's priors)".to_string(),
            "-".into(),
            first.batches.len().to_string(),
            format!("{first_ms:.0}"),
            format!("{:.2}x", fifs_ms / first_ms),
        ]);
        t.row([
            "relay (weir's scheduler)".to_string(),
            "-".into(),
            later.first().map_or(0, |r| r.batches.len()).to_string(),
            format!("{ms:.0}"),
            format!("{:.2}x", fifs_ms / ms),
        ]);
    }
    t.row([
        "paper: FIFS".to_string(),
        "1".into(),
        "50".into(),
        format!("{PAPER_FIFS_MS:.0}"),
        "1.00x".into(),
    ]);
    t.row([
        "paper: buffered".to_string(),
        PAPER_BATCH.to_string(),
        "1".into(),
        format!("{PAPER_BATCHED_MS:.0}"),
        format!("{PAPER_SPEEDUP:.2}x"),
    ]);
    let mut text = format!(
        "batching: {} records of {} B every {:.1} ms; link T_cc {:.0} ms, {:.0} B/s ({:.1} ms per record); {} run(s) each\n\n",
        job.records,
        job.record_bytes,
        job.interval.as_secs_f64() * 1e3,
        job.link.per_transaction.as_secs_f64() * 1e3,
        job.link.bytes_per_sec,
        job.record_bytes as f64 / job.link.bytes_per_sec * 1e3,
        repeat,
    );
    text.push_str(&t.render());
    text.push_str(&format!(
        "\nweir's model: link fit {:.0} B/s, T_sc {:.1} ms (prior {:.0} B/s, {:.0} ms); L_up(s) = {:.2} ms * s + {:.1} ms; \
         lambda {:.1}/s, d {:.0} B, reference i = {}, bound {} ms\n\
         plan: {}, target {} records, max_wait {:.1} ms, byte cap {} B; batches sent {:?}\n\
         speedup {:.2}x (goal >= {PAPER_SPEEDUP}x: {}); best fixed size {} at {:.0} ms; weir's plan within {:.1}% of it\n",
        model.link.bytes_per_sec,
        model.link.per_transaction.as_secs_f64() * 1e3,
        WEIR_PRIOR.bytes_per_sec,
        WEIR_PRIOR.per_transaction.as_secs_f64() * 1e3,
        model.upload.per_unit * 1e3,
        model.upload.fixed * 1e3,
        model.traffic.arrival_rate,
        model.traffic.mean_record_bytes,
        model.traffic.reference,
        args.bound_ms,
        reason_text(plan.reason),
        plan.target_records,
        plan.max_wait.as_secs_f64() * 1e3,
        plan.max_bytes,
        chosen_batches.first().cloned().unwrap_or_default(),
        speedup,
        if speedup >= PAPER_SPEEDUP { "met" } else { "NOT met" },
        best_batch,
        best_ms,
        (chosen_ms / best_ms - 1.0) * 100.0,
    ));

    if let (Some((first, later)), Some((first_ms, ms, _))) = (&relay, &relay_ms) {
        text.push_str(&format!(
            "relay (weir's App, file egress behind the same link): first job {first_ms:.0} ms in batches {:?}; \
             later jobs {ms:.0} ms ({:.2}x FIFS) in batches {:?}\n",
            first.batches,
            fifs_ms / ms,
            later.first().map(|r| r.batches.clone()).unwrap_or_default(),
        ));
    }
    let relay_json = match (&relay, &relay_ms) {
        (Some((first, later)), Some((first_ms, ms, runs))) => json!({
            "first_ms": first_ms,
            "first_batches": first.batches,
            "ms": report::round(*ms, 1),
            "runs_ms": runs,
            "batches": later.iter().map(|r| r.batches.clone()).collect::<Vec<_>>(),
            "speedup": report::round(fifs_ms / ms, 3),
            "pause_between_jobs_ms": report::ms(RELAY_PAUSE),
        }),
        _ => serde_json::Value::Null,
    };
    let json = json!({
        "experiment": "batching",
        "params": {
            "records": job.records,
            "record_bytes": job.record_bytes,
            "interval_ms": report::ms(job.interval),
            "link": job.link.summary(),
            "per_record_ms": report::round(job.record_bytes as f64 / job.link.bytes_per_sec * 1e3, 3),
            "latency_bound_ms": args.bound_ms,
            "class_rank": args.class_rank,
            "repeat": repeat,
            "sizes": sizes,
            "warmup_sizes": WARMUP_SIZES,
            "prior": LinkSummary::from(WEIR_PRIOR),
        },
        "fifs_ms": report::round(fifs_ms, 1),
        "fifs_runs_ms": fifs_runs,
        "series": series.iter().map(|(s, runs, m)| json!({
            "batch": s,
            "ms": report::round(*m, 1),
            "runs_ms": runs,
            "speedup": report::round(fifs_ms / m, 3),
        })).collect::<Vec<_>>(),
        "model": {
            "link_estimate": LinkSummary::from(model.link),
            "probe": model.probe.map(LinkSummary::from),
            "upload_line": {
                "per_record_ms": report::round(model.upload.per_unit * 1e3, 3),
                "fixed_ms": report::round(model.upload.fixed * 1e3, 1),
            },
            "arrival_rate": report::round(model.traffic.arrival_rate, 2),
            "mean_record_bytes": report::round(model.traffic.mean_record_bytes, 1),
            "reference": model.traffic.reference,
            "plan": {
                "target_records": plan.target_records,
                "max_bytes": plan.max_bytes,
                "max_wait_ms": report::ms(plan.max_wait),
                "expected_records": plan.expected_records,
                "reason": reason_text(plan.reason),
            },
        },
        "chosen_batch": chosen_batch,
        "chosen_batches": chosen_batches,
        "chosen_ms": report::round(chosen_ms, 1),
        "chosen_runs_ms": chosen_runs,
        "best_batch": best_batch,
        "best_ms": report::round(best_ms, 1),
        "speedup": report::round(speedup, 3),
        "best_speedup": report::round(fifs_ms / best_ms, 3),
        "relay": relay_json,
        "paper": {
            "fifs_ms": PAPER_FIFS_MS,
            "batched_ms": PAPER_BATCHED_MS,
            "batch": PAPER_BATCH,
            "speedup": PAPER_SPEEDUP,
        },
        "goal": { "speedup_at_least": PAPER_SPEEDUP, "met": speedup >= PAPER_SPEEDUP },
    });

    let mut chart = LineChart {
        title: format!(
            "{}-record job: wall-clock vs batch size (T_cc {:.0} ms, record every {:.0} ms)",
            job.records,
            job.link.per_transaction.as_secs_f64() * 1e3,
            job.interval.as_secs_f64() * 1e3
        ),
        x_label: "records per transaction".into(),
        y_label: "wall-clock of the job, ms".into(),
        series: vec![Series {
            name: "fixed buffer (Fig. 10)".into(),
            points: series.iter().map(|(s, _, m)| (*s as f64, *m)).collect(),
        }],
        hlines: vec![HLine {
            name: format!("FIFS {fifs_ms:.0} ms"),
            y: fifs_ms,
            paper: false,
        }],
        marks: vec![Mark {
            label: format!("weir's plan: {chosen_ms:.0} ms ({speedup:.1}x)"),
            x: chosen_batch as f64,
            y: chosen_ms,
            paper: false,
        }],
    };
    if let Some((_, ms, _)) = &relay_ms {
        chart.hlines.push(HLine {
            name: format!("weir's relay {ms:.0} ms ({:.1}x)", fifs_ms / ms),
            y: *ms,
            paper: false,
        });
    }
    // The paper's numbers belong on the plot of the paper's job only.
    if job.records == PAPER_JOB_RECORDS {
        chart.hlines.push(HLine {
            name: format!("paper FIFS {PAPER_FIFS_MS:.0} ms"),
            y: PAPER_FIFS_MS,
            paper: true,
        });
        chart.marks.push(Mark {
            label: format!("paper: {PAPER_BATCHED_MS:.0} ms ({PAPER_SPEEDUP}x)"),
            x: PAPER_BATCH as f64,
            y: PAPER_BATCHED_MS,
            paper: true,
        });
    }
    let svg = report::line_chart_svg(&chart)?;
    Ok((text, json, svg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_ranges_and_lists() {
        assert_eq!("2..5".parse::<Sizes>().unwrap().0, vec![2, 3, 4, 5]);
        assert_eq!("2..=3".parse::<Sizes>().unwrap().0, vec![2, 3]);
        assert_eq!("2, 5,10".parse::<Sizes>().unwrap().0, vec![2, 5, 10]);
        assert!("5..2".parse::<Sizes>().is_err());
        assert!("0,2".parse::<Sizes>().is_err());
        assert!("x".parse::<Sizes>().is_err());
    }

    fn tiny_job() -> Job {
        Job {
            records: 10,
            record_bytes: 100,
            interval: Duration::from_millis(1),
            link: Link {
                per_transaction: Duration::from_millis(50),
                bytes_per_sec: 100_000.0,
            },
        }
    }

    #[tokio::test(start_paused = true)]
    async fn fixed_buffers_flush_the_remainder_at_the_end_of_the_job() {
        let run = run_job(tiny_job(), Closing::Sizes(vec![4])).await;
        assert_eq!(run.batch_sizes(), vec![4, 4, 2]);
        assert_eq!(run.arrivals.len(), 10);
        // Virtual time: the first batch leaves at 3 ms and takes 54 ms;
        // the others were buffered by then.
        assert_eq!(run.wall, Duration::from_millis(3 + 54 + 54 + 52));
    }

    #[tokio::test(start_paused = true)]
    async fn fifs_sends_one_record_per_transaction() {
        let run = run_job(tiny_job(), Closing::Sizes(vec![1])).await;
        assert_eq!(run.batch_sizes(), vec![1; 10]);
        assert_eq!(run.wall, Duration::from_millis(10 * 51));
    }

    #[tokio::test(start_paused = true)]
    async fn plans_close_at_the_wait_when_the_link_is_idle() {
        let plan = BatchPlan {
            target_records: 6,
            max_bytes: 10_000,
            max_wait: Duration::from_micros(2500),
            expected_records: 3,
            reason: PlanReason::Batching(weir_core::batching::SizeLimit::Lemma2),
        };
        let run = run_job(tiny_job(), Closing::Plan(plan)).await;
        // Three records by the 2.5 ms wait; six queued while the link was
        // busy (the target); the last one after its wait.
        assert_eq!(run.batch_sizes(), vec![3, 6, 1]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_model_batches_on_the_papers_kind_of_link() {
        let job = Job {
            records: 50,
            record_bytes: 1400,
            interval: Duration::from_millis(10),
            link: Link {
                per_transaction: Duration::from_millis(148),
                bytes_per_sec: 1400.0 / 0.005,
            },
        };
        let warmup = run_job(
            Job {
                records: WARMUP_SIZES.iter().sum(),
                ..job
            },
            Closing::Sizes(WARMUP_SIZES.to_vec()),
        )
        .await;
        let fifs = run_job(job, Closing::Sizes(vec![1])).await;
        let m = fit_model(&warmup, &fifs, Duration::from_secs(10), 2).unwrap();
        // The fits recover the link from a wrong prior.
        assert!((m.upload.fixed - 0.148).abs() < 0.002, "{:?}", m.upload);
        assert!((m.upload.per_unit - 0.005).abs() < 0.0002, "{:?}", m.upload);
        assert!((m.traffic.arrival_rate - 100.0).abs() < 1.0);
        assert_eq!(m.traffic.reference, 11);
        // Lemma 2 sets the size: B * T_cc / d = 29.6 records.
        assert!(m.plan.batches(), "{:?}", m.plan);
        assert_eq!(m.plan.target_records, 29);
        let chosen = run_job(job, Closing::Plan(m.plan)).await;
        assert!(
            chosen.wall * 4 < fifs.wall,
            "{:?} vs {:?}",
            chosen.wall,
            fifs.wall
        );
    }
}
