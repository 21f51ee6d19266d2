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
//! - with weir's plan, online: weir-core's per-class [`Planner`] (the one
//!   weir's scheduler runs) re-plans every PBTT window from that window's
//!   arrivals and the current fit of a [`LinkEstimator`]; every finished
//!   transaction refines both. It starts from weir's default priors
//!   (deliberately wrong for this link) and runs job after job with a quiet
//!   pause between, as a relay would: the first job is planned on the
//!   priors, the later ones on what the earlier transactions measured. The
//!   relay closes a batch when the link is free and the plan in force says
//!   so ([`BatchPlan::should_close`]: target reached, byte cap, or the
//!   oldest record waited `max_wait`), not knowing when the job ends; each
//!   close records the plan's target beside the records it sent.
//!
//! Runs are independent emulated links, so several run at once (`--jobs`):
//! they only sleep.

use std::time::Duration;

use serde_json::json;
use weir_core::batching::{BatchPlan, LatencyLine, PlanReason};
use weir_core::link_estimate::LinkEstimate;

use crate::link::{Link, LinkSummary};
use crate::relay;
use crate::report::{self, HLine, LineChart, Mark, Series, Table};

mod job;

use job::run_all;
pub use job::{run_job, Closing, Job, JobRun, Online, PLAN_WINDOW, WEIR_PRIOR};

/// The paper's serial upload line, Eq. 3: `L_bf-up(s) = 5.0393 s + 277.52`
/// ms, fitted on 49 serial buffered uploads (Table 4).
pub const PAPER_EQ3_INTERCEPT_MS: f64 = 277.52;
/// The slope of Eq. 3, ms per record.
pub const PAPER_EQ3_SLOPE_MS: f64 = 5.0393;

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
    /// Records in the job [default: 50, the paper's job; quick: 30].
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
    /// 10 ms"; quick: 5].
    #[arg(long)]
    pub interval_ms: Option<f64>,
    /// Fixed time per transaction `T_cc`, ms [default: 277.52, the
    /// intercept of the paper's Eq. 3, from its serial uploads; quick: 50].
    #[arg(long)]
    pub transaction_ms: Option<f64>,
    /// Milliseconds one record adds to a transaction (sets the bandwidth)
    /// [default: 5.0393, the slope of the paper's Eq. 3; quick: 1].
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

impl Args {
    fn job(&self) -> anyhow::Result<(Job, Vec<u32>)> {
        let q = self.quick;
        let records = self
            .records
            .unwrap_or(if q { 30 } else { PAPER_JOB_RECORDS });
        let record_bytes = self.record_bytes.unwrap_or(1400);
        let interval_ms = self.interval_ms.unwrap_or(if q { 5.0 } else { 10.0 });
        let tx_ms = self
            .transaction_ms
            .unwrap_or(if q { 50.0 } else { PAPER_EQ3_INTERCEPT_MS });
        let per_record_ms = self
            .per_record_ms
            .unwrap_or(if q { 1.0 } else { PAPER_EQ3_SLOPE_MS });
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

/// Planned against sent, one pair per close.
fn planned_vs_sent(run: &JobRun) -> Vec<(u32, u32)> {
    run.plans
        .iter()
        .map(|p| (p.plan.target_records, p.sent))
        .collect()
}

fn plan_json(plan: &BatchPlan) -> serde_json::Value {
    json!({
        "target_records": plan.target_records,
        "max_bytes": plan.max_bytes,
        "max_wait_ms": report::round(report::ms(plan.max_wait), 1),
        "expected_records": plan.expected_records,
        "reason": reason_text(plan.reason),
    })
}

fn closes_json(run: &JobRun) -> serde_json::Value {
    run.plans
        .iter()
        .map(|p| {
            json!({
                "at_ms": report::round(report::ms(p.at), 1),
                "planned": p.plan.target_records,
                "sent": p.sent,
                "max_wait_ms": report::round(report::ms(p.plan.max_wait), 1),
                "reason": reason_text(p.plan.reason),
            })
        })
        .collect()
}

/// Runs the experiment: returns the table for stdout, the JSON and the SVG.
pub async fn run(args: &Args) -> anyhow::Result<(String, serde_json::Value, String)> {
    let (job, sizes) = args.job()?;
    let bound = Duration::from_millis(args.bound_ms);
    let repeat = args.repeat as usize;
    let relay_runs = if args.no_relay { 0 } else { 1 + repeat };
    let total = repeat * (1 + sizes.len()) + 1 + repeat + relay_runs;
    let bar = report::progress(total as u64, "batching");

    // Phase 1: FIFS and the fixed buffers, each on its own emulated link.
    let mut runs = Vec::new();
    for _ in 0..repeat {
        runs.push(("fifs".to_string(), job, Closing::Sizes(vec![1])));
        for &s in &sizes {
            runs.push((format!("size {s}"), job, Closing::Sizes(vec![s])));
        }
    }
    let results = run_all(runs, args.jobs, &bar).await?;
    let (planned_first, planned, learned) = run_planned(args, job, bound, &bar).await?;
    let relay = if args.no_relay {
        None
    } else {
        Some(run_relay(job, bound, repeat, &bar).await?)
    };
    bar.finish_and_clear();

    let measured = Measured {
        results,
        planned_first,
        planned,
        learned,
        relay,
    };
    let r = Report::new(args, job, &sizes, &measured);
    let text = r.text();
    let json = r.json();
    let svg = report::line_chart_svg(&r.chart())?;
    Ok((text, json, svg))
}

/// Phase 2: weir's plan, online: one planner, job after job with a quiet
/// pause between; the first on weir's priors. The first job's run, the
/// later ones' and the planner as it ended.
async fn run_planned(
    args: &Args,
    job: Job,
    bound: Duration,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<(JobRun, Vec<JobRun>, Box<Online>)> {
    let mut closing = Closing::Online(Box::new(Online::new(bound, args.class_rank)?));
    bar.set_message("weir's plan");
    let planned_first = run_job(job, &mut closing).await;
    bar.inc(1);
    let mut planned = Vec::new();
    for _ in 0..args.repeat as usize {
        tokio::time::sleep(RELAY_PAUSE).await;
        planned.push(run_job(job, &mut closing).await);
        bar.inc(1);
    }
    let Closing::Online(learned) = closing else {
        unreachable!("built as Online above")
    };
    Ok((planned_first, planned, learned))
}

/// Phase 3: the same job through weir's relay: a first job on its priors,
/// then `repeat` more once it has learned from its own traffic.
async fn run_relay(
    job: Job,
    bound: Duration,
    repeat: usize,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<(relay::RelayRun, Vec<relay::RelayRun>)> {
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
    Ok((first, later))
}

/// What the three phases measured.
struct Measured {
    /// Phase 1: FIFS and the fixed buffers, labelled.
    results: Vec<(String, JobRun)>,
    /// Phase 2: weir's plan, the first job and the later ones, and the
    /// planner as it ended.
    planned_first: JobRun,
    planned: Vec<JobRun>,
    learned: Box<Online>,
    /// Phase 3: the relay's first job and the later ones, unless
    /// `--no-relay`.
    relay: Option<(relay::RelayRun, Vec<relay::RelayRun>)>,
}

/// The report's figures, from what was measured.
struct Report<'a> {
    args: &'a Args,
    job: Job,
    sizes: &'a [u32],
    m: &'a Measured,
    repeat: usize,
    fifs_runs: Vec<f64>,
    fifs_ms: f64,
    fifs_tx: usize,
    chosen_runs: Vec<f64>,
    chosen_ms: f64,
    first_ms: f64,
    chosen_batches: Vec<Vec<u32>>,
    /// Per fixed size: the size, its runs' wall-clocks and their mean, ms.
    series: Vec<(u32, Vec<f64>, f64)>,
    best_batch: u32,
    best_ms: f64,
    speedup: f64,
    /// Whether the job is the paper's (its numbers are shown only then).
    paper_job: bool,
    /// The plan behind the last job's largest batch.
    settled: BatchPlan,
    chosen_batch: u32,
    link: LinkEstimate,
    upload: LatencyLine,
    /// The relay's first job, the later jobs' mean and their runs, ms.
    relay_ms: Option<(f64, f64, Vec<f64>)>,
}

impl<'a> Report<'a> {
    /// The figures of what was measured of `job` (fixed `sizes`).
    fn new(args: &'a Args, job: Job, sizes: &'a [u32], m: &'a Measured) -> Report<'a> {
        let results = &m.results;
        let fifs_runs = walls(results, "fifs");
        let fifs_ms = report::mean(&fifs_runs);
        let fifs_tx = results
            .iter()
            .find(|(l, _)| l == "fifs")
            .map_or(0, |(_, r)| r.transactions.len());
        let chosen_runs: Vec<f64> = m.planned.iter().map(|r| report::ms(r.wall)).collect();
        let chosen_ms = report::mean(&chosen_runs);
        let first_ms = report::ms(m.planned_first.wall);
        let chosen_batches: Vec<Vec<u32>> = m.planned.iter().map(JobRun::batch_sizes).collect();
        let series: Vec<(u32, Vec<f64>, f64)> = sizes
            .iter()
            .map(|&s| {
                let runs = walls(results, &format!("size {s}"));
                let m = report::mean(&runs);
                (s, runs, m)
            })
            .collect();
        let (best_batch, best_ms) = series
            .iter()
            .map(|(s, _, m)| (*s, *m))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap_or((1, fifs_ms));
        let speedup = fifs_ms / chosen_ms;
        // The plan behind the last job's largest batch: what the model settled on.
        let last = m.planned.last().unwrap_or(&m.planned_first);
        let settled = last
            .plans
            .iter()
            .max_by_key(|p| p.sent)
            .map_or_else(|| m.learned.plan(), |p| p.plan);
        let mean_record_bytes = job.record_bytes as f64;
        let relay_ms = m.relay.as_ref().map(|(first, later)| {
            let runs: Vec<f64> = later.iter().map(|r| report::ms(r.wall)).collect();
            (report::ms(first.wall), report::mean(&runs), runs)
        });
        Report {
            args,
            job,
            sizes,
            m,
            repeat: args.repeat as usize,
            fifs_runs,
            fifs_ms,
            fifs_tx,
            chosen_runs,
            chosen_ms,
            first_ms,
            chosen_batches,
            series,
            best_batch,
            best_ms,
            speedup,
            paper_job: job.records == PAPER_JOB_RECORDS,
            settled,
            chosen_batch: settled.target_records,
            link: m.learned.link(),
            upload: m.learned.upload_line(mean_record_bytes),
            relay_ms,
        }
    }

    /// A wall-clock against the paper's FIFS, on the paper's job only.
    fn vs_paper(&self, ms: f64) -> String {
        if self.paper_job {
            format!("{:.2}x", PAPER_FIFS_MS / ms)
        } else {
            "-".into()
        }
    }

    /// The table of runs.
    fn table(&self) -> Table {
        let (job, m, fifs_ms) = (self.job, self.m, self.fifs_ms);
        let mut t = Table::new([
            "run",
            "batch",
            "transactions",
            "wall ms",
            "vs FIFS",
            "vs paper's FIFS",
        ]);
        t.row([
            "FIFS (one record per transaction, serial)".to_string(),
            "1".into(),
            self.fifs_tx.to_string(),
            format!("{fifs_ms:.0}"),
            "1.00x".into(),
            self.vs_paper(fifs_ms),
        ]);
        for (s, _, m) in &self.series {
            t.row([
                format!(
                    "fixed buffer{}",
                    if *s == self.best_batch { " (best)" } else { "" }
                ),
                s.to_string(),
                job.records.div_ceil(*s).to_string(),
                format!("{m:.0}"),
                format!("{:.2}x", fifs_ms / m),
                self.vs_paper(*m),
            ]);
        }
        let first_ms = self.first_ms;
        t.row([
            "weir's plan, online, first job (priors)".to_string(),
            "-".into(),
            m.planned_first.transactions.len().to_string(),
            format!("{first_ms:.0}"),
            format!("{:.2}x", fifs_ms / first_ms),
            self.vs_paper(first_ms),
        ]);
        t.row([
            "weir's plan, online (later jobs)".to_string(),
            format!("{} planned", self.chosen_batch),
            m.planned
                .first()
                .map_or(0, |r| r.transactions.len())
                .to_string(),
            format!("{:.0}", self.chosen_ms),
            format!("{:.2}x", self.speedup),
            self.vs_paper(self.chosen_ms),
        ]);
        if let (Some((first, later)), Some((relay_first_ms, ms, _))) = (&m.relay, &self.relay_ms) {
            t.row([
                "relay, first job (weir's priors)".to_string(),
                "-".into(),
                first.batches.len().to_string(),
                format!("{relay_first_ms:.0}"),
                format!("{:.2}x", fifs_ms / relay_first_ms),
                self.vs_paper(*relay_first_ms),
            ]);
            t.row([
                "relay (weir's scheduler)".to_string(),
                "-".into(),
                later.first().map_or(0, |r| r.batches.len()).to_string(),
                format!("{ms:.0}"),
                format!("{:.2}x", fifs_ms / ms),
                self.vs_paper(*ms),
            ]);
        }
        if self.paper_job {
            t.row([
                "paper: FIFS (asynchronous uploads, measured)".to_string(),
                "1".into(),
                "50".into(),
                format!("{PAPER_FIFS_MS:.0}"),
                "-".into(),
                "1.00x".into(),
            ]);
            t.row([
                "paper: buffered (serial, measured)".to_string(),
                PAPER_BATCH.to_string(),
                "1".into(),
                format!("{PAPER_BATCHED_MS:.0}"),
                "-".into(),
                format!("{PAPER_SPEEDUP:.2}x"),
            ]);
        }
        t
    }

    /// The text for stdout: the job, the table, the plan and the relay.
    fn text(&self) -> String {
        let (job, m, settled, upload) = (self.job, self.m, self.settled, self.upload);
        let mut text = format!(
            "batching: {} records of {} B every {:.1} ms; link T_cc {:.2} ms, {:.0} B/s ({:.4} ms per record); {} run(s) each\n\n",
            job.records,
            job.record_bytes,
            job.interval.as_secs_f64() * 1e3,
            job.link.per_transaction.as_secs_f64() * 1e3,
            job.link.bytes_per_sec,
            job.record_bytes as f64 / job.link.bytes_per_sec * 1e3,
            self.repeat,
        );
        text.push_str(&self.table().render());
        text.push_str(&format!(
            "\nweir's plan, online (re-planned every {:.0} ms from the window's arrivals): link fit {:.0} B/s, T_sc {:.1} ms \
             (prior {:.0} B/s, {:.0} ms); L_up(s) = {:.2} ms * s + {:.1} ms; bound {} ms\n\
             settled plan: {}, target {} records, max_wait {:.1} ms\n\
             planned / sent, first job: {:?}\n\
             planned / sent, later jobs: {:?}\n\
             speedup {:.2}x over the serial FIFS (goal >= {PAPER_SPEEDUP}x: {}); best fixed size {} at {:.0} ms; weir's plan within {:.1}% of it\n",
            report::ms(PLAN_WINDOW),
            self.link.bytes_per_sec,
            self.link.per_transaction.as_secs_f64() * 1e3,
            WEIR_PRIOR.bytes_per_sec,
            WEIR_PRIOR.per_transaction.as_secs_f64() * 1e3,
            upload.per_unit * 1e3,
            upload.fixed * 1e3,
            self.args.bound_ms,
            reason_text(settled.reason),
            settled.target_records,
            settled.max_wait.as_secs_f64() * 1e3,
            planned_vs_sent(&m.planned_first),
            m.planned.iter().map(planned_vs_sent).collect::<Vec<_>>(),
            self.speedup,
            if self.speedup >= PAPER_SPEEDUP { "met" } else { "NOT met" },
            self.best_batch,
            self.best_ms,
            (self.chosen_ms / self.best_ms - 1.0) * 100.0,
        ));
        if let (Some((first, later)), Some((relay_first_ms, ms, _))) = (&m.relay, &self.relay_ms) {
            text.push_str(&format!(
                "relay (weir's App, file egress behind the same link): first job {relay_first_ms:.0} ms in batches {:?}; \
                 later jobs {ms:.0} ms ({:.2}x FIFS) in batches {:?}\n",
                first.batches,
                self.fifs_ms / ms,
                later.first().map(|r| r.batches.clone()).unwrap_or_default(),
            ));
        }
        text
    }

    /// The relay's part of the JSON (null without the relay).
    fn relay_json(&self) -> serde_json::Value {
        match (&self.m.relay, &self.relay_ms) {
            (Some((first, later)), Some((relay_first_ms, ms, runs))) => json!({
                "first_ms": relay_first_ms,
                "first_batches": first.batches,
                "ms": report::round(*ms, 1),
                "runs_ms": runs,
                "batches": later.iter().map(|r| r.batches.clone()).collect::<Vec<_>>(),
                "speedup": report::round(self.fifs_ms / ms, 3),
                "pause_between_jobs_ms": report::ms(RELAY_PAUSE),
            }),
            _ => serde_json::Value::Null,
        }
    }

    /// The JSON.
    fn json(&self) -> serde_json::Value {
        let (args, job, m, fifs_ms) = (self.args, self.job, self.m, self.fifs_ms);
        let (upload, speedup, chosen_ms) = (self.upload, self.speedup, self.chosen_ms);
        json!({
            "experiment": "batching",
            "params": {
                "records": job.records,
                "record_bytes": job.record_bytes,
                "interval_ms": report::ms(job.interval),
                "link": job.link.summary(),
                "per_record_ms": report::round(job.record_bytes as f64 / job.link.bytes_per_sec * 1e3, 4),
                "latency_bound_ms": args.bound_ms,
                "class_rank": args.class_rank,
                "repeat": self.repeat,
                "sizes": self.sizes,
                "plan_window_ms": report::ms(PLAN_WINDOW),
                "pause_between_jobs_ms": report::ms(RELAY_PAUSE),
                "prior": LinkSummary::from(WEIR_PRIOR),
            },
            "fifs_ms": report::round(fifs_ms, 1),
            "fifs_runs_ms": self.fifs_runs,
            "series": self.series.iter().map(|(s, runs, m)| json!({
                "batch": s,
                "ms": report::round(*m, 1),
                "runs_ms": runs,
                "speedup": report::round(fifs_ms / m, 3),
            })).collect::<Vec<_>>(),
            "model": {
                "link_estimate": LinkSummary::from(self.link),
                "upload_line": {
                    "per_record_ms": report::round(upload.per_unit * 1e3, 3),
                    "fixed_ms": report::round(upload.fixed * 1e3, 1),
                },
                "plan": plan_json(&self.settled),
            },
            "planned_vs_sent": {
                "first_job": closes_json(&m.planned_first),
                "later_jobs": m.planned.iter().map(closes_json).collect::<Vec<_>>(),
            },
            "chosen_batch": self.chosen_batch,
            "chosen_batches": self.chosen_batches,
            "chosen_first_ms": report::round(self.first_ms, 1),
            "chosen_ms": report::round(chosen_ms, 1),
            "chosen_runs_ms": self.chosen_runs,
            "best_batch": self.best_batch,
            "best_ms": report::round(self.best_ms, 1),
            "speedup": report::round(speedup, 3),
            "speedup_vs_paper_fifs": self.paper_job.then(|| report::round(PAPER_FIFS_MS / chosen_ms, 3)),
            "best_speedup": report::round(fifs_ms / self.best_ms, 3),
            "relay": self.relay_json(),
            "paper": {
                "fifs_ms": PAPER_FIFS_MS,
                "batched_ms": PAPER_BATCHED_MS,
                "batch": PAPER_BATCH,
                "speedup": PAPER_SPEEDUP,
                "eq3_intercept_ms": PAPER_EQ3_INTERCEPT_MS,
                "eq3_slope_ms": PAPER_EQ3_SLOPE_MS,
            },
            "goal": { "speedup_at_least": PAPER_SPEEDUP, "met": speedup >= PAPER_SPEEDUP },
        })
    }

    /// The plot: wall-clock against batch size.
    fn chart(&self) -> LineChart {
        let (job, fifs_ms, chosen_ms, speedup) =
            (self.job, self.fifs_ms, self.chosen_ms, self.speedup);
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
                points: self
                    .series
                    .iter()
                    .map(|(s, _, m)| (*s as f64, *m))
                    .collect(),
            }],
            hlines: vec![HLine {
                name: format!("FIFS, serial {fifs_ms:.0} ms"),
                y: fifs_ms,
                paper: false,
            }],
            marks: vec![Mark {
                label: format!("weir's plan, online: {chosen_ms:.0} ms ({speedup:.1}x)"),
                x: self.chosen_batch as f64,
                y: chosen_ms,
                paper: false,
            }],
        };
        if let Some((_, ms, _)) = &self.relay_ms {
            chart.hlines.push(HLine {
                name: format!("weir's relay {ms:.0} ms ({:.1}x)", fifs_ms / ms),
                y: *ms,
                paper: false,
            });
        }
        // The paper's numbers belong on the plot of the paper's job only.
        if self.paper_job {
            chart.hlines.push(HLine {
                name: format!("paper FIFS (asynchronous) {PAPER_FIFS_MS:.0} ms"),
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
        chart
    }
}

#[cfg(test)]
mod tests;
