//! `weir-load`: the load tool behind issue 3's figures.
//!
//! It runs the real `weir` binary as a child process (MQTT listen mode, AMQP
//! egress to the local RabbitMQ with publisher confirms), drives it over
//! MQTT, consumes its batches back from RabbitMQ, and reports what the
//! issue asks for: records per second, latency against publishing straight
//! to RabbitMQ, resident memory idle and under load, and where the CPU goes.
//!
//! # Layout
//! - `throughput`: C MQTT connections publish QoS 1 as fast as weir
//!   acknowledges (a window of in-flight publishes each), or at `--rate`; a
//!   lapin consumer decodes the batches and counts records; `/proc` and
//!   weir's admin `/metrics` are sampled over the steady part.
//! - `latency`: a paced stream of `ls` records with the send time in the
//!   payload, through weir, then the same stream published straight to
//!   RabbitMQ (confirms on, persistent, one message per record); both are
//!   consumed the same way and compared. `--rounds` alternates the two so
//!   that noise from other programs on a shared machine falls on both.
//! - The generated weir config sets only what the figures need (loopback
//!   listeners, AMQP egress, a 10 Gbit/s uplink so token buckets never
//!   limit, batch limits); `--set table.key=value` changes anything else.
//! - The publisher is lean on purpose (rumqttc's MQTT 3.1.1 codec over a
//!   `TcpStream`, many publishes per write), because weir, RabbitMQ and this
//!   tool share the machine's cores; the report shows this tool's CPU per
//!   thread so that one can check it is not the bottleneck.
//! - Publisher and consumer each run on their own thread and single-threaded
//!   runtime (`load-pub`, `load-con`), so `/proc/self/task` attributes CPU.
//!
//! Every payload starts with the send time (microseconds since the Unix
//! epoch, little endian) and a load-wide sequence number; the consumer
//! uses the first for latency and the second to check that every
//! acknowledged record arrived (and how many arrived twice). The rest is
//! random bytes by default, so that weir's compression gains nothing it
//! would not gain on real data.
//!
//! Results and how to read them: `docs/benchmarks.md`, "Relay figures".

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context};
use bytes::{BufMut, Bytes, BytesMut};
use clap::{Parser, Subcommand, ValueEnum};
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, ExchangeDeleteOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Confirmation, Connection, ConnectionProperties};
use rumqttc::mqttbytes::{self, v4, QoS};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The RabbitMQ the tests use (scripts/services.sh starts it).
const AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// Bytes at the head of every payload: send time and sequence number.
const STAMP: usize = 16;

/// Largest burst of publishes encoded into one write: enough to make the
/// per-syscall cost negligible, small enough to keep the window moving.
const MAX_BURST: usize = 256;

/// Consumer prefetch: far more messages than are ever unacknowledged, so
/// RabbitMQ never waits on the consumer.
const PREFETCH: u16 = 4096;

/// The consumer acknowledges (with `multiple`) every this many messages.
const ACK_EVERY: u32 = 64;

/// How often `/proc` is sampled for the memory timeline.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// How long the weir child may take to open its ports.
const START_PATIENCE: Duration = Duration::from_secs(30);

/// How long draining (in-flight PUBACKs, then the consumer catching up)
/// may take after the load stops before the run counts as failed.
const DRAIN_PATIENCE: Duration = Duration::from_secs(60);

/// After the consumer has caught up, how long it keeps listening so that a
/// re-published batch (a duplicate) can show up.
const LINGER: Duration = Duration::from_secs(1);

/// Records sent before measuring idle memory, so that weir has connected
/// to RabbitMQ (it connects on its first batch).
const PRIMING_RECORDS: u64 = 100;

/// The issue's goals, printed next to the figures.
const GOAL_RECORDS_PER_SEC: f64 = 50_000.0;
/// p99 latency weir may add over publishing straight to RabbitMQ, ms.
const GOAL_ADDED_P99_MS: f64 = 2.0;

#[derive(Parser)]
#[command(
    name = "weir-load",
    about = "Load tool for weir's relay figures (issue 3): throughput, latency, memory, CPU"
)]
struct Cli {
    /// The weir binary to run (default: `weir` next to this executable).
    #[arg(long, global = true)]
    weir: Option<PathBuf>,
    /// RabbitMQ to relay to and consume from.
    #[arg(long, global = true, default_value = AMQP_URL)]
    amqp: String,
    /// Also write the figures as JSON to this file.
    #[arg(long, global = true)]
    json: Option<PathBuf>,
    /// Keep the weir child's config and log directory after a good run.
    #[arg(long, global = true)]
    keep: bool,
    /// What fills each payload after its 16-byte stamp: random bytes
    /// (incompressible, the honest case once weir compresses batches) or a
    /// repeated byte (compresses about 50:1).
    #[arg(long, global = true, value_enum, default_value_t = PayloadKind::Random)]
    payload: PayloadKind,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Sustained MQTT QoS 1 through weir to RabbitMQ: records/s, memory, CPU.
    Throughput(ThroughputArgs),
    /// End-to-end latency of ls records through weir vs straight to RabbitMQ.
    Latency(LatencyArgs),
}

/// Knobs of the generated weir config.
#[derive(clap::Args, Clone, Debug, Serialize)]
struct WeirArgs {
    /// scheduler.max_batch_records.
    #[arg(long, default_value_t = 1024)]
    max_batch_records: u64,
    /// scheduler.max_batch_bytes (also scheduler.burst, so that the token
    /// bucket never cuts a batch shorter).
    #[arg(long, default_value = "1MiB")]
    max_batch_bytes: String,
    /// Any other setting, as `table.key=value` with a TOML value (a bare
    /// word is taken as a string), e.g. `--set compression.enabled=false`;
    /// repeatable, applied last.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
}

#[derive(clap::Args, Clone, Debug, Serialize)]
struct ThroughputArgs {
    /// Length of the measured, steady part.
    #[arg(long, default_value_t = 15)]
    seconds: u64,
    /// Load before measuring starts (queues fill, connections settle).
    #[arg(long, default_value_t = 3)]
    warmup: u64,
    /// MQTT connections publishing in parallel.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Payload bytes per record (at least 16).
    #[arg(long, default_value_t = 256)]
    size: usize,
    /// Unacknowledged QoS 1 publishes allowed per connection.
    #[arg(long, default_value_t = 1000)]
    window: usize,
    /// Total publish rate (records/s); unlimited (as fast as weir acks)
    /// unless given.
    #[arg(long)]
    rate: Option<f64>,
    /// Class the records are routed to.
    #[arg(long, value_enum, default_value_t = ClassArg::Ls)]
    class: ClassArg,
    #[command(flatten)]
    weir_config: WeirArgs,
}

#[derive(clap::Args, Clone, Debug, Serialize)]
struct LatencyArgs {
    /// Records per second (5000 is 10% of the 50k/s goal).
    #[arg(long, default_value_t = 5000.0)]
    rate: f64,
    /// Length of the measured part of each run.
    #[arg(long, default_value_t = 15)]
    seconds: u64,
    /// Load before measuring starts.
    #[arg(long, default_value_t = 2)]
    warmup: u64,
    /// Payload bytes per record (at least 16).
    #[arg(long, default_value_t = 256)]
    size: usize,
    /// Run only one side.
    #[arg(long, value_enum)]
    only: Option<Side>,
    /// How sends are spread over time (both sides alike).
    #[arg(long, value_enum, default_value_t = Pacing::Even)]
    pacing: Pacing,
    /// Alternate weir and direct this many times (each `--seconds` long)
    /// and pool the samples, so that noise from other programs on the
    /// machine falls on both sides alike.
    #[arg(long, default_value_t = 1)]
    rounds: u32,
    #[command(flatten)]
    weir_config: WeirArgs,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum ClassArg {
    Ls,
    Nm,
    Lt,
}

impl ClassArg {
    fn name(self) -> &'static str {
        match self {
            ClassArg::Ls => "ls",
            ClassArg::Nm => "nm",
            ClassArg::Lt => "lt",
        }
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum PayloadKind {
    Random,
    Repetitive,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Pacing {
    /// Each record at its own time (thread sleeps between sends).
    Even,
    /// Whatever is due at each 1 ms tick of tokio's timer, in one burst.
    Tick,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Side {
    /// Through weir only.
    Weir,
    /// Straight to RabbitMQ only.
    Direct,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if cli.payload == PayloadKind::Random {
        init_random_filler();
    }
    let weir_bin = match &cli.weir {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .context("cannot find this executable's path; pass --weir")?
            .with_file_name("weir"),
    };
    let env = Env {
        weir_bin,
        amqp: cli.amqp.clone(),
        keep: cli.keep,
        clk_tck: clk_tck(),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the control runtime")?;
    let json = match &cli.command {
        Cmd::Throughput(a) => {
            let r = rt.block_on(throughput(&env, a))?;
            print_throughput(&r);
            serde_json::to_string_pretty(&r)?
        }
        Cmd::Latency(a) => {
            let r = rt.block_on(latency(&env, a))?;
            print_latency(&r);
            serde_json::to_string_pretty(&r)?
        }
    };
    if let Some(path) = &cli.json {
        std::fs::write(path, json + "\n")
            .with_context(|| format!("writing the JSON report to {}", path.display()))?;
    }
    Ok(())
}

/// What every run needs.
struct Env {
    weir_bin: PathBuf,
    amqp: String,
    keep: bool,
    clk_tck: f64,
}

// ---------------------------------------------------------------------------
// Reports

#[derive(Serialize)]
struct MachineInfo {
    nproc: usize,
    cpu_model: String,
}

fn machine_info() -> MachineInfo {
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    MachineInfo {
        nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_model,
    }
}

/// Latency percentiles, milliseconds.
#[derive(Serialize, Default, Clone)]
struct Percentiles {
    n: usize,
    p50: f64,
    p90: f64,
    p99: f64,
    p999: f64,
    max: f64,
    mean: f64,
}

impl Percentiles {
    fn of(mut us: Vec<u64>) -> Percentiles {
        if us.is_empty() {
            return Percentiles::default();
        }
        us.sort_unstable();
        // Nearest rank: the smallest value with at least q of the samples
        // at or below it.
        let at = |q: f64| {
            let rank = ((q * us.len() as f64).ceil() as usize).clamp(1, us.len());
            us[rank - 1] as f64 / 1000.0
        };
        Percentiles {
            n: us.len(),
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            p999: at(0.999),
            max: *us.last().expect("not empty") as f64 / 1000.0,
            mean: us.iter().sum::<u64>() as f64 / us.len() as f64 / 1000.0,
        }
    }
}

/// Did every acknowledged record arrive, and how many arrived twice.
#[derive(Serialize, Default)]
struct Integrity {
    /// Records the publisher had acknowledged (PUBACK or confirm).
    acked: u64,
    /// Records the consumer saw, duplicates included.
    consumed: u64,
    /// Distinct records the consumer saw.
    unique: u64,
    /// `consumed - unique`.
    duplicates: u64,
    /// Acknowledged records never consumed.
    lost: u64,
}

/// CPU use over the steady part.
#[derive(Serialize, Default)]
struct CpuReport {
    /// Cores weir used on average.
    weir_cores: f64,
    /// weir's CPU time per consumed record, microseconds.
    weir_us_per_record: f64,
    /// weir's cores by thread name (`weir` workers, `lapin-io-loop`).
    weir_threads: BTreeMap<String, f64>,
    /// Cores RabbitMQ (`beam.smp`) used on average.
    rabbitmq_cores: f64,
    /// RabbitMQ's CPU time per consumed record, microseconds.
    rabbitmq_us_per_record: f64,
    /// This tool's cores by thread name (`load-pub`, `load-con`,
    /// `lapin-io-loop`).
    tool_threads: BTreeMap<String, f64>,
    /// Fraction of all the machine's CPU time that was busy.
    machine_busy: f64,
    /// Cores busy with anything else (other builds and tests on a shared
    /// machine): the noise in these figures.
    other_cores: f64,
}

#[derive(Serialize)]
struct TimelinePoint {
    /// Seconds since the load started.
    t: f64,
    consumed_per_sec: f64,
    acked_per_sec: f64,
    weir_rss_kib: u64,
}

#[derive(Serialize)]
struct ThroughputReport {
    kind: &'static str,
    machine: MachineInfo,
    /// Payload filler: `random` or `repetitive`.
    payload: &'static str,
    params: ThroughputArgs,
    /// Records per second at the consumer over the steady part.
    consumed_per_sec: f64,
    /// PUBACKs per second at the publisher over the steady part.
    acked_per_sec: f64,
    /// Batches confirmed per second (weir's metrics).
    batches_per_sec: f64,
    /// Mean records per confirmed batch over the steady part.
    records_per_batch: f64,
    /// Mean batch body bytes.
    bytes_per_batch: f64,
    /// Pushes that found the class queue full (weir's metrics).
    backpressured: u64,
    /// weir's resident memory right after start, nothing sent yet.
    weir_rss_start_kib: u64,
    /// weir's resident memory idle, connected to RabbitMQ, before the load.
    weir_rss_idle_kib: u64,
    /// Mean resident memory over the steady part.
    weir_rss_load_mean_kib: u64,
    /// Peak resident memory over the steady part.
    weir_rss_load_peak_kib: u64,
    /// weir's own peak (VmHWM) at the end.
    weir_rss_hwm_kib: u64,
    cpu: CpuReport,
    /// End-to-end latency (send to consume) over the steady part, under
    /// this load.
    latency_under_load_ms: Percentiles,
    /// Time between consecutive batches leaving weir's egress (one publish
    /// plus its confirm while the egress is busy).
    egress_cycle_ms: Percentiles,
    integrity: Integrity,
    timeline: Vec<TimelinePoint>,
}

/// Latency of one side, percentiles of each leg.
#[derive(Serialize, Default)]
struct Breakdown {
    /// Send to consume.
    end_to_end_ms: Percentiles,
    /// Send to weir's ingress timestamp (MQTT hop); weir side only.
    #[serde(skip_serializing_if = "Option::is_none")]
    to_ingress_ms: Option<Percentiles>,
    /// weir's ingress timestamp to consume; weir side only.
    #[serde(skip_serializing_if = "Option::is_none")]
    ingress_to_consumer_ms: Option<Percentiles>,
    /// Ingress to the egress encoding the record's batch: the wait in the
    /// class queue, mostly for the previous batch's confirm; weir only.
    #[serde(skip_serializing_if = "Option::is_none")]
    queue_wait_ms: Option<Percentiles>,
    /// Batch encoded to consumed: publish, routing, delivery; weir only.
    #[serde(skip_serializing_if = "Option::is_none")]
    batch_to_consumer_ms: Option<Percentiles>,
    /// Time between consecutive batches leaving the egress: one publish and
    /// its confirm when the egress is busy; weir only.
    #[serde(skip_serializing_if = "Option::is_none")]
    egress_cycle_ms: Option<Percentiles>,
    /// Publish to publisher confirm of each message; direct only.
    #[serde(skip_serializing_if = "Option::is_none")]
    confirm_ms: Option<Percentiles>,
}

/// The raw measurements of one side within its measured window, kept so
/// that rounds can be pooled.
#[derive(Default)]
struct Raw {
    via_weir: bool,
    samples: Vec<Sample>,
    /// Gaps between consecutive weir batches, microseconds.
    cycles: Vec<u64>,
    /// Publish-to-confirm of direct messages, microseconds.
    confirms: Vec<u64>,
}

impl Raw {
    fn extend(&mut self, other: Raw) {
        self.via_weir |= other.via_weir;
        self.samples.extend(other.samples);
        self.cycles.extend(other.cycles);
        self.confirms.extend(other.confirms);
    }

    fn breakdown(&self) -> Breakdown {
        let pick = |f: fn(&Sample) -> u64| Percentiles::of(self.samples.iter().map(f).collect());
        let weir = self.via_weir;
        Breakdown {
            end_to_end_ms: pick(|s| s.consumed_us.saturating_sub(s.send_us)),
            to_ingress_ms: weir.then(|| pick(|s| s.ingress_us.saturating_sub(s.send_us))),
            ingress_to_consumer_ms: weir
                .then(|| pick(|s| s.consumed_us.saturating_sub(s.ingress_us))),
            queue_wait_ms: weir.then(|| pick(|s| s.created_us.saturating_sub(s.ingress_us))),
            batch_to_consumer_ms: weir
                .then(|| pick(|s| s.consumed_us.saturating_sub(s.created_us))),
            egress_cycle_ms: weir.then(|| Percentiles::of(self.cycles.clone())),
            confirm_ms: (!weir).then(|| Percentiles::of(self.confirms.clone())),
        }
    }
}

/// One side of one round.
#[derive(Serialize)]
struct LatencySide {
    #[serde(flatten)]
    latency: Breakdown,
    /// Achieved send rate over the measured part.
    sent_per_sec: f64,
    /// Mean records per AMQP message.
    records_per_message: f64,
    /// weir's resident memory during the run (weir side only).
    #[serde(skip_serializing_if = "Option::is_none")]
    weir_rss_mean_kib: Option<u64>,
    cpu: CpuReport,
    integrity: Integrity,
}

/// One round: weir, then direct.
#[derive(Serialize, Default)]
struct LatencyRound {
    #[serde(skip_serializing_if = "Option::is_none")]
    weir: Option<LatencySide>,
    #[serde(skip_serializing_if = "Option::is_none")]
    direct: Option<LatencySide>,
}

#[derive(Serialize)]
struct LatencyReport {
    kind: &'static str,
    machine: MachineInfo,
    /// Payload filler: `random` or `repetitive`.
    payload: &'static str,
    params: LatencyArgs,
    /// Through weir, all rounds pooled.
    #[serde(skip_serializing_if = "Option::is_none")]
    weir: Option<Breakdown>,
    /// Straight to RabbitMQ, all rounds pooled.
    #[serde(skip_serializing_if = "Option::is_none")]
    direct: Option<Breakdown>,
    /// weir's p99 minus direct p99 (pooled), ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    added_p99_ms: Option<f64>,
    /// weir's p50 minus direct p50 (pooled), ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    added_p50_ms: Option<f64>,
    rounds: Vec<LatencyRound>,
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn print_cpu(cpu: &CpuReport, per_record: bool) {
    let threads = |m: &BTreeMap<String, f64>| {
        m.iter()
            .map(|(k, v)| format!("{k} {v:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if per_record {
        println!(
            "  weir CPU                       {:.2} cores, {:.1} us/record  [{}]",
            cpu.weir_cores,
            cpu.weir_us_per_record,
            threads(&cpu.weir_threads)
        );
        println!(
            "  RabbitMQ CPU (beam.smp)        {:.2} cores, {:.1} us/record",
            cpu.rabbitmq_cores, cpu.rabbitmq_us_per_record
        );
    } else {
        println!(
            "  weir CPU                       {:.2} cores  [{}]",
            cpu.weir_cores,
            threads(&cpu.weir_threads)
        );
        println!(
            "  RabbitMQ CPU (beam.smp)        {:.2} cores",
            cpu.rabbitmq_cores
        );
    }
    println!(
        "  load tool CPU                  [{}]",
        threads(&cpu.tool_threads)
    );
    println!(
        "  machine CPU busy               {:.0}%  (other processes {:.2} cores)",
        cpu.machine_busy * 100.0,
        cpu.other_cores
    );
}

/// The `--set` options of a run, for its header line.
fn settings(set: &[String]) -> String {
    set.iter().map(|s| format!("; --set {s}")).collect()
}

fn print_integrity(i: &Integrity) {
    println!(
        "  integrity                      acked {}, consumed {} (unique {}, duplicates {}, lost {})",
        i.acked, i.consumed, i.unique, i.duplicates, i.lost
    );
}

fn print_throughput(r: &ThroughputReport) {
    let p = &r.params;
    println!(
        "throughput: {} MQTT connection(s) x window {}, {}-byte records, QoS 1, class {}, {}; {} s measured after {} s warm-up",
        p.connections,
        p.window,
        p.size,
        p.class.name(),
        p.rate
            .map_or("unpaced".to_string(), |r| format!("paced at {r:.0}/s")),
        p.seconds,
        p.warmup
    );
    println!(
        "  batch limits {} records / {}{}; {} payloads; machine: {} x {}",
        p.weir_config.max_batch_records,
        p.weir_config.max_batch_bytes,
        settings(&p.weir_config.set),
        r.payload,
        r.machine.nproc,
        r.machine.cpu_model
    );
    println!(
        "  records/s at consumer          {:>10.0}   (goal >= {:.0})",
        r.consumed_per_sec, GOAL_RECORDS_PER_SEC
    );
    println!("  PUBACKs/s at publisher         {:>10.0}", r.acked_per_sec);
    println!(
        "  batches/s                      {:>10.1}   mean {:.1} records, {:.0} bytes per batch",
        r.batches_per_sec, r.records_per_batch, r.bytes_per_batch
    );
    println!("  pushes back-pressured          {:>10}", r.backpressured);
    println!(
        "  weir RSS start / idle          {} / {}",
        mib(r.weir_rss_start_kib),
        mib(r.weir_rss_idle_kib)
    );
    println!(
        "  weir RSS under load mean/peak  {} / {}   (VmHWM {})",
        mib(r.weir_rss_load_mean_kib),
        mib(r.weir_rss_load_peak_kib),
        mib(r.weir_rss_hwm_kib)
    );
    print_cpu(&r.cpu, true);
    let l = &r.latency_under_load_ms;
    println!(
        "  latency under this load (ms)   p50 {:.2}  p99 {:.2}  max {:.2}",
        l.p50, l.p99, l.max
    );
    let c = &r.egress_cycle_ms;
    println!(
        "  egress cycle per batch (ms)    p50 {:.2}  p99 {:.2}  max {:.2}",
        c.p50, c.p99, c.max
    );
    print_integrity(&r.integrity);
}

fn print_latency(r: &LatencyReport) {
    let p = &r.params;
    println!(
        "latency: {}-byte ls records at {:.0}/s ({:?} pacing), QoS 1 vs AMQP confirms; {} round(s) of {} s measured after {} s warm-up per side",
        p.size, p.rate, p.pacing, p.rounds, p.seconds, p.warmup
    );
    println!(
        "  {} payloads{}; machine: {} x {}",
        r.payload,
        settings(&p.weir_config.set),
        r.machine.nproc,
        r.machine.cpu_model
    );
    println!(
        "  {:<28} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8}   (ms, all rounds)",
        "", "n", "p50", "p90", "p99", "p99.9", "max"
    );
    let row = |name: &str, q: &Percentiles| {
        println!(
            "  {:<28} {:>7} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
            name, q.n, q.p50, q.p90, q.p99, q.p999, q.max
        );
    };
    if let Some(w) = &r.weir {
        row("via weir (send -> consume)", &w.end_to_end_ms);
        let legs = [
            ("  send -> weir ingress", &w.to_ingress_ms),
            ("  weir ingress -> consume", &w.ingress_to_consumer_ms),
            ("    in class queue", &w.queue_wait_ms),
            ("    batch encoded -> consume", &w.batch_to_consumer_ms),
            ("  egress cycle (per batch)", &w.egress_cycle_ms),
        ];
        for (name, q) in legs {
            if let Some(q) = q {
                row(name, q);
            }
        }
    }
    if let Some(d) = &r.direct {
        row("direct to RabbitMQ", &d.end_to_end_ms);
        if let Some(q) = &d.confirm_ms {
            row("  publish -> confirm", q);
        }
    }
    if let Some(added) = r.added_p99_ms {
        println!(
            "  added by weir: p99 {:.2} ms (goal <= {:.1} ms), p50 {:.2} ms",
            added,
            GOAL_ADDED_P99_MS,
            r.added_p50_ms.unwrap_or(f64::NAN)
        );
    }
    for (i, round) in r.rounds.iter().enumerate() {
        for (name, side) in [("weir", &round.weir), ("direct", &round.direct)] {
            let Some(s) = side else { continue };
            let q = &s.latency.end_to_end_ms;
            println!(
                "  round {} {name:<6}: p50 {:.2} p99 {:.2} max {:.2} ms; {:.0}/s, {:.1} rec/msg; CPU weir {:.2}, RabbitMQ {:.2}, tool {:.2}, other {:.2} cores{}; {}",
                i + 1,
                q.p50,
                q.p99,
                q.max,
                s.sent_per_sec,
                s.records_per_message,
                s.cpu.weir_cores,
                s.cpu.rabbitmq_cores,
                s.cpu.tool_threads.values().sum::<f64>(),
                s.cpu.other_cores,
                s.weir_rss_mean_kib
                    .map_or(String::new(), |k| format!(", weir RSS {}", mib(k))),
                if s.integrity.lost == 0 && s.integrity.duplicates == 0 {
                    format!("all {} arrived once", s.integrity.acked)
                } else {
                    format!(
                        "LOST {} DUPLICATED {} of {}",
                        s.integrity.lost, s.integrity.duplicates, s.integrity.acked
                    )
                }
            );
        }
    }
}

// ---------------------------------------------------------------------------
// The runs

/// A name unique to this process.
fn unique(tag: &str) -> String {
    format!("weir-load-{}-{tag}", std::process::id())
}

/// Counters shared by the publisher, the consumer and the control loop.
#[derive(Default)]
struct Counters {
    /// Records handed to the wire; also the source of sequence numbers.
    sent: AtomicU64,
    /// Records acknowledged (PUBACK, or publisher confirm when direct).
    acked: AtomicU64,
    /// Records seen by the consumer.
    consumed: AtomicU64,
    /// AMQP messages seen by the consumer.
    messages: AtomicU64,
    /// Why the consumer stopped, if it failed (e.g. RabbitMQ restarted by
    /// another program), so that waits end at once with the reason.
    consumer_failed: std::sync::Mutex<Option<String>>,
}

impl Counters {
    /// Fails if the consumer has.
    fn check_consumer(&self) -> anyhow::Result<()> {
        let failed = self.consumer_failed.lock().expect("not poisoned");
        match failed.as_ref() {
            Some(why) => bail!("the RabbitMQ consumer failed: {why}"),
            None => Ok(()),
        }
    }

    fn get(&self) -> (u64, u64, u64) {
        (
            self.acked.load(Ordering::Relaxed),
            self.consumed.load(Ordering::Relaxed),
            self.messages.load(Ordering::Relaxed),
        )
    }
}

async fn throughput(env: &Env, a: &ThroughputArgs) -> anyhow::Result<ThroughputReport> {
    ensure!(a.size >= STAMP, "--size must be at least {STAMP} bytes");
    ensure!(
        (1..65_535).contains(&a.window),
        "--window must be between 1 and 65534 (MQTT packet ids)"
    );
    ensure!(a.connections > 0, "--connections must be at least 1");
    let name = unique("tput");
    let topic_base = format!("{name}/{}", a.class.name());
    let mut weir = Weir::start(env, &name, &a.weir_config).await?;
    let counters = Arc::new(Counters::default());
    let consumer = Consumer::start(
        env.amqp.clone(),
        weir.queue.clone(),
        Body::WeirBatch,
        Arc::clone(&counters),
    )
    .await?;
    let rss_start = rss_kib(weir.pid).unwrap_or(0);

    // Prime: weir connects to RabbitMQ on its first batch.
    let prime = MqttLoad {
        addr: weir.mqtt,
        client_id: format!("{name}-prime"),
        topic: format!("{topic_base}/prime"),
        size: a.size,
        window: 100,
        rate: None,
        pacing: Pacing::Tick,
        limit: Some(PRIMING_RECORDS),
    };
    run_publishers(vec![prime], Arc::clone(&counters), CancellationToken::new()).await?;
    wait_consumed(&counters, &mut weir).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_idle = rss_kib(weir.pid).unwrap_or(0);

    let loads = (0..a.connections)
        .map(|i| MqttLoad {
            addr: weir.mqtt,
            client_id: format!("{name}-{i}"),
            topic: format!("{topic_base}/c{i}"),
            size: a.size,
            window: a.window,
            rate: a.rate.map(|r| r / a.connections as f64),
            // Several connections share the publisher thread, so none may
            // block it with thread sleeps.
            pacing: Pacing::Tick,
            limit: None,
        })
        .collect();
    let stop = CancellationToken::new();
    let started = Instant::now();
    let publishers = tokio::spawn(run_publishers(loads, Arc::clone(&counters), stop.clone()));
    let warmup_end = started + Duration::from_secs(a.warmup);
    let end = warmup_end + Duration::from_secs(a.seconds);
    let mut samples = Vec::new();
    let mut first: Option<Snapshot> = None;
    let mut next = started;
    loop {
        next += SAMPLE_EVERY;
        tokio::time::sleep_until(next.min(end)).await;
        weir.check_alive()?;
        counters.check_consumer()?;
        if publishers.is_finished() {
            publishers.await??;
            bail!("the publishers stopped before the end of the run");
        }
        let now = Instant::now();
        let (acked, consumed, _) = counters.get();
        samples.push((now, acked, consumed, rss_kib(weir.pid).unwrap_or(0)));
        if first.is_none() && now >= warmup_end {
            first = Some(Snapshot::take(&weir, &counters).await?);
        }
        if now >= end {
            break;
        }
    }
    let last = Snapshot::take(&weir, &counters).await?;
    stop.cancel();
    publishers.await.context("publisher thread")??;
    wait_consumed(&counters, &mut weir).await?;
    tokio::time::sleep(LINGER).await;
    let consumed = consumer.stop().await?;
    let hwm = hwm_kib(weir.pid).unwrap_or(0);
    weir.stop(env.keep).await?;

    let first = first.context("the run ended before the warm-up did")?;
    let secs = last.at.duration_since(first.at).as_secs_f64();
    let d = |f: fn(&Snapshot) -> u64| (f(&last) - f(&first)) as f64;
    let records = d(|s| s.consumed);
    let batches = last.metrics.sum("weir_batches_confirmed_total")
        - first.metrics.sum("weir_batches_confirmed_total");
    let forwarded = last.metrics.sum("weir_records_forwarded_total")
        - first.metrics.sum("weir_records_forwarded_total");
    let egress_bytes =
        last.metrics.sum("weir_egress_bytes_total") - first.metrics.sum("weir_egress_bytes_total");
    let steady: Vec<u64> = samples
        .iter()
        .filter(|s| s.0 >= first.at && s.0 <= last.at)
        .map(|s| s.3)
        .collect();
    let from_us = unix_us_at(first.at);
    let to_us = unix_us_at(last.at);
    let latencies = consumed
        .samples
        .iter()
        .filter(|s| s.send_us >= from_us && s.send_us < to_us)
        .map(|s| s.consumed_us.saturating_sub(s.send_us))
        .collect();
    let timeline = samples
        .windows(2)
        .map(|w| {
            let dt = w[1].0.duration_since(w[0].0).as_secs_f64().max(1e-9);
            TimelinePoint {
                t: w[1].0.duration_since(started).as_secs_f64(),
                consumed_per_sec: (w[1].2 - w[0].2) as f64 / dt,
                acked_per_sec: (w[1].1 - w[0].1) as f64 / dt,
                weir_rss_kib: w[1].3,
            }
        })
        .collect();
    Ok(ThroughputReport {
        kind: "throughput",
        machine: machine_info(),
        payload: payload_kind(),
        params: a.clone(),
        consumed_per_sec: records / secs,
        acked_per_sec: d(|s| s.acked) / secs,
        batches_per_sec: batches / secs,
        records_per_batch: if batches > 0.0 {
            forwarded / batches
        } else {
            0.0
        },
        bytes_per_batch: if batches > 0.0 {
            egress_bytes / batches
        } else {
            0.0
        },
        backpressured: (last.metrics.sum("weir_records_backpressured_total")
            - first.metrics.sum("weir_records_backpressured_total")) as u64,
        weir_rss_start_kib: rss_start,
        weir_rss_idle_kib: rss_idle,
        weir_rss_load_mean_kib: if steady.is_empty() {
            0
        } else {
            steady.iter().sum::<u64>() / steady.len() as u64
        },
        weir_rss_load_peak_kib: steady.iter().copied().max().unwrap_or(0),
        weir_rss_hwm_kib: hwm,
        cpu: CpuReport::between(&first, &last, records, env.clk_tck),
        latency_under_load_ms: Percentiles::of(latencies),
        egress_cycle_ms: Percentiles::of(egress_cycles(&consumed.batches, from_us, to_us)),
        integrity: consumed.integrity(counters.acked.load(Ordering::Relaxed)),
        timeline,
    })
}

async fn latency(env: &Env, a: &LatencyArgs) -> anyhow::Result<LatencyReport> {
    ensure!(a.size >= STAMP, "--size must be at least {STAMP} bytes");
    ensure!(a.rate > 0.0, "--rate must be positive");
    ensure!(a.rounds > 0, "--rounds must be at least 1");
    let (mut weir_raw, mut direct_raw) = (Raw::default(), Raw::default());
    let mut rounds = Vec::new();
    for _ in 0..a.rounds {
        let mut round = LatencyRound::default();
        if a.only != Some(Side::Direct) {
            let (side, raw) = latency_via_weir(env, a).await?;
            weir_raw.extend(raw);
            round.weir = Some(side);
        }
        if a.only != Some(Side::Weir) {
            let (side, raw) = latency_direct(env, a).await?;
            direct_raw.extend(raw);
            round.direct = Some(side);
        }
        rounds.push(round);
    }
    let weir = (a.only != Some(Side::Direct)).then(|| weir_raw.breakdown());
    let direct = (a.only != Some(Side::Weir)).then(|| direct_raw.breakdown());
    let added = |f: fn(&Percentiles) -> f64| match (&weir, &direct) {
        (Some(w), Some(d)) => Some(f(&w.end_to_end_ms) - f(&d.end_to_end_ms)),
        _ => None,
    };
    Ok(LatencyReport {
        kind: "latency",
        machine: machine_info(),
        payload: payload_kind(),
        params: a.clone(),
        added_p99_ms: added(|p| p.p99),
        added_p50_ms: added(|p| p.p50),
        weir,
        direct,
        rounds,
    })
}

/// Runs the paced part shared by both latency sides: waits `warmup +
/// seconds` while `publish` runs, snapshotting at the window's edges.
async fn paced_window<F, T>(
    a: &LatencyArgs,
    weir: Option<&Weir>,
    counters: &Arc<Counters>,
    publish: F,
    stop: CancellationToken,
) -> anyhow::Result<(Snapshot, Snapshot, Vec<u64>, T)>
where
    F: Future<Output = anyhow::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    let task = tokio::spawn(publish);
    let started = Instant::now();
    let warmup_end = started + Duration::from_secs(a.warmup);
    let end = warmup_end + Duration::from_secs(a.seconds);
    let mut rss = Vec::new();
    let mut first = None;
    let mut next = started;
    loop {
        next += SAMPLE_EVERY;
        tokio::time::sleep_until(next.min(end)).await;
        counters.check_consumer()?;
        if task.is_finished() {
            task.await??;
            bail!("the publisher stopped before the end of the run");
        }
        if let Some(w) = weir {
            rss.push(rss_kib(w.pid).unwrap_or(0));
        }
        let now = Instant::now();
        if first.is_none() && now >= warmup_end {
            first = Some(Snapshot::take_opt(weir, counters).await?);
        }
        if now >= end {
            break;
        }
    }
    let last = Snapshot::take_opt(weir, counters).await?;
    stop.cancel();
    let out = task.await.context("publisher thread")??;
    Ok((first.context("no warm-up snapshot")?, last, rss, out))
}

async fn latency_via_weir(env: &Env, a: &LatencyArgs) -> anyhow::Result<(LatencySide, Raw)> {
    let name = unique("lat");
    let mut weir = Weir::start(env, &name, &a.weir_config).await?;
    let counters = Arc::new(Counters::default());
    let consumer = Consumer::start(
        env.amqp.clone(),
        weir.queue.clone(),
        Body::WeirBatch,
        Arc::clone(&counters),
    )
    .await?;
    let mqtt = weir.mqtt;
    let load = |client: &str, rate: Option<f64>, limit: Option<u64>| MqttLoad {
        addr: mqtt,
        client_id: format!("{name}-{client}"),
        topic: format!("{name}/ls/sensor"),
        size: a.size,
        window: 1000,
        rate,
        pacing: a.pacing,
        limit,
    };
    let prime = load("prime", None, Some(PRIMING_RECORDS));
    run_publishers(vec![prime], Arc::clone(&counters), CancellationToken::new()).await?;
    wait_consumed(&counters, &mut weir).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;

    let stop = CancellationToken::new();
    let paced = load("paced", Some(a.rate), None);
    let publish = run_publishers(vec![paced], Arc::clone(&counters), stop.clone());
    let (first, last, rss, ()) = paced_window(a, Some(&weir), &counters, publish, stop).await?;
    wait_consumed(&counters, &mut weir).await?;
    tokio::time::sleep(LINGER).await;
    let consumed = consumer.stop().await?;
    weir.stop(env.keep).await?;
    Ok(side_report(
        consumed,
        &counters,
        &first,
        &last,
        env,
        true,
        Some(if rss.is_empty() {
            0
        } else {
            rss.iter().sum::<u64>() / rss.len() as u64
        }),
        Vec::new(),
    ))
}

async fn latency_direct(env: &Env, a: &LatencyArgs) -> anyhow::Result<(LatencySide, Raw)> {
    let queue = unique("direct.q");
    let out = latency_direct_on(env, a, &queue).await;
    // Also after a failure, so that no queue is left filling up.
    delete_topology(&env.amqp, &queue, None).await;
    out
}

async fn latency_direct_on(
    env: &Env,
    a: &LatencyArgs,
    queue: &str,
) -> anyhow::Result<(LatencySide, Raw)> {
    let queue = queue.to_string();
    let counters = Arc::new(Counters::default());
    let consumer = Consumer::start(
        env.amqp.clone(),
        queue.clone(),
        Body::Raw,
        Arc::clone(&counters),
    )
    .await?;
    let stop = CancellationToken::new();
    let publish = on_thread("load-pub", {
        let (url, queue, counters, stop) = (
            env.amqp.clone(),
            queue.clone(),
            Arc::clone(&counters),
            stop.clone(),
        );
        let (rate, pacing, size) = (a.rate, a.pacing, a.size);
        move || direct_publisher(url, queue, rate, pacing, size, counters, stop)
    });
    let (first, last, _, confirms) = paced_window(a, None, &counters, publish, stop).await?;
    let deadline = Instant::now() + DRAIN_PATIENCE;
    while counters.consumed.load(Ordering::Relaxed) < counters.acked.load(Ordering::Relaxed) {
        counters.check_consumer()?;
        ensure!(
            Instant::now() < deadline,
            "the consumer did not catch up with the direct publisher"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(LINGER).await;
    let consumed = consumer.stop().await?;
    Ok(side_report(
        consumed, &counters, &first, &last, env, false, None, confirms,
    ))
}

/// One side's report and its raw samples, all within the measured window.
#[allow(clippy::too_many_arguments)]
fn side_report(
    consumed: Consumed,
    counters: &Counters,
    first: &Snapshot,
    last: &Snapshot,
    env: &Env,
    via_weir: bool,
    weir_rss_mean_kib: Option<u64>,
    confirms: Vec<(u64, u64)>,
) -> (LatencySide, Raw) {
    let (from_us, to_us) = (unix_us_at(first.at), unix_us_at(last.at));
    let inside = |sent_us: u64| sent_us >= from_us && sent_us < to_us;
    let integrity = consumed.integrity(counters.acked.load(Ordering::Relaxed));
    let raw = Raw {
        via_weir,
        cycles: egress_cycles(&consumed.batches, from_us, to_us),
        samples: consumed
            .samples
            .into_iter()
            .filter(|s| inside(s.send_us))
            .collect(),
        confirms: confirms
            .into_iter()
            .filter(|(sent, _)| inside(*sent))
            .map(|(_, took)| took)
            .collect(),
    };
    let records = (last.consumed - first.consumed) as f64;
    let messages = (last.messages - first.messages) as f64;
    let side = LatencySide {
        latency: raw.breakdown(),
        sent_per_sec: raw.samples.len() as f64 / last.at.duration_since(first.at).as_secs_f64(),
        records_per_message: if messages > 0.0 {
            records / messages
        } else {
            0.0
        },
        weir_rss_mean_kib,
        cpu: CpuReport::between(first, last, records, env.clk_tck),
        integrity,
    };
    (side, raw)
}

/// Gaps between consecutive weir batches created in `[from_us, to_us)`.
/// weir's egress is serial and the queue has one consumer, so consumption
/// order is creation order.
fn egress_cycles(batches: &[u64], from_us: u64, to_us: u64) -> Vec<u64> {
    batches
        .windows(2)
        .filter(|w| w[0] >= from_us && w[1] < to_us)
        .map(|w| w[1].saturating_sub(w[0]))
        .collect()
}

/// Waits until the consumer has seen every acknowledged record.
async fn wait_consumed(counters: &Counters, weir: &mut Weir) -> anyhow::Result<()> {
    let deadline = Instant::now() + DRAIN_PATIENCE;
    loop {
        let (acked, consumed, _) = counters.get();
        if consumed >= acked {
            return Ok(());
        }
        weir.check_alive()?;
        counters.check_consumer()?;
        ensure!(
            Instant::now() < deadline,
            "after {DRAIN_PATIENCE:?} the consumer has {consumed} of {acked} acknowledged records (weir log: {})",
            weir.log.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Microseconds since the Unix epoch now.
fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_micros() as u64
}

/// The Unix time of a monotonic instant (close enough for windowing).
fn unix_us_at(at: Instant) -> u64 {
    let now = Instant::now();
    let us = now_us();
    if at <= now {
        us - now.duration_since(at).as_micros() as u64
    } else {
        us + at.duration_since(now).as_micros() as u64
    }
}

/// Runs `make()`'s future on a new thread with its own single-threaded
/// runtime, named so that `/proc/self/task` can attribute its CPU.
fn on_thread<T, F, Fut>(name: &str, make: F) -> impl Future<Output = anyhow::Result<T>> + Send
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = anyhow::Result<T>>,
{
    let (tx, rx) = oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let result = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("cannot start a runtime")
                .and_then(|rt| rt.block_on(make()));
            let _ = tx.send(result);
        });
    let name = name.to_string();
    async move {
        spawned.with_context(|| format!("cannot start thread {name}"))?;
        rx.await
            .with_context(|| format!("thread {name} panicked"))?
    }
}

// ---------------------------------------------------------------------------
// The weir child process

/// A running `weir run` with a generated config.
struct Weir {
    child: Child,
    pid: u32,
    mqtt: SocketAddr,
    admin: SocketAddr,
    queue: String,
    exchange: String,
    amqp: String,
    dir: PathBuf,
    log: PathBuf,
    /// Whether the queue and exchange are deleted already.
    cleaned: bool,
}

/// `N` distinct loopback addresses free right now (all held until all are
/// picked, so that they differ). weir is then told to bind them; another
/// program could take one in between, which shows as a start failure.
fn free_ports<const N: usize>() -> anyhow::Result<[SocketAddr; N]> {
    let held = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .context("cannot bind a loopback port")?;
    let addrs = held
        .iter()
        .map(|l| l.local_addr())
        .collect::<Result<Vec<_>, _>>()?;
    Ok(addrs.try_into().expect("N listeners"))
}

impl Weir {
    async fn start(env: &Env, name: &str, batch: &WeirArgs) -> anyhow::Result<Weir> {
        ensure!(
            env.weir_bin.is_file(),
            "no weir binary at {} (build it with `cargo build --release -p weir --bins`, or pass --weir)",
            env.weir_bin.display()
        );
        let [mqtt, admin] = free_ports()?;
        let (exchange, queue) = (format!("{name}.x"), format!("{name}.q"));
        let config = format!(
            r#"# Generated by weir-load.
[node]
id = 1
name = "weir-load"

[classify]
default_class = "lt"
[[classify.route]]
mqtt = "{name}/ls/#"
class = "ls"
[[classify.route]]
mqtt = "{name}/nm/#"
class = "nm"

[scheduler]
# Far above what loopback carries, so the token buckets never limit.
uplink = "10Gbit/s"
burst = "{bytes}"
max_batch_records = {records}
max_batch_bytes = "{bytes}"

[ingress.mqtt]
mode = "listen"
listen = "{mqtt}"

[ingress.grpc]
enabled = false

[egress]
kind = "amqp"

[egress.amqp]
url = "{url}"
exchange = "{exchange}"
queue = "{queue}"
routing_key = "{name}"

[admin]
listen = "{admin}"

[log]
level = "warn"
"#,
            bytes = batch.max_batch_bytes,
            records = batch.max_batch_records,
            url = env.amqp,
        );
        let config = with_settings(&config, &batch.set)?;
        let dir = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let config_path = dir.join("weir.toml");
        std::fs::write(&config_path, config)?;
        let log = dir.join("weir.log");
        let log_file = std::fs::File::create(&log)?;
        let child = Command::new(&env.weir_bin)
            .arg("run")
            .arg("--config")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("cannot run {}", env.weir_bin.display()))?;
        let pid = child.id();
        let mut weir = Weir {
            child,
            pid,
            mqtt,
            admin,
            queue,
            exchange,
            amqp: env.amqp.clone(),
            dir,
            log,
            cleaned: false,
        };
        let deadline = Instant::now() + START_PATIENCE;
        for addr in [mqtt, admin] {
            while TcpStream::connect(addr).await.is_err() {
                weir.check_alive()?;
                ensure!(
                    Instant::now() < deadline,
                    "weir did not open {addr} within {START_PATIENCE:?} (log: {})",
                    weir.log.display()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Ok(weir)
    }

    /// Fails if the child has exited.
    fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "weir exited ({status}); its log is {}:\n{}",
                self.log.display(),
                tail(&self.log)
            );
        }
        Ok(())
    }

    /// SIGTERM (graceful drain), then waits; deletes the queue and exchange.
    async fn stop(mut self, keep: bool) -> anyhow::Result<ExitStatus> {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid.to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(45);
        let status = loop {
            if let Some(s) = self.child.try_wait()? {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                break self.child.wait()?;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        delete_topology(&self.amqp, &self.queue, Some(&self.exchange)).await;
        self.cleaned = true;
        if status.success() && !keep {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else if !status.success() {
            eprintln!(
                "weir-load: weir exited with {status}; log kept at {}",
                self.log.display()
            );
        }
        Ok(status)
    }
}

impl Drop for Weir {
    fn drop(&mut self) {
        // An error path left it running: leave neither an orphan process
        // nor a queue filling up behind.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if !self.cleaned {
            let (url, queue, exchange) =
                (self.amqp.clone(), self.queue.clone(), self.exchange.clone());
            // Drop may run inside the control runtime, which cannot block
            // on another future; a short-lived thread with its own can.
            let _ = std::thread::spawn(move || {
                if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    rt.block_on(delete_topology(&url, &queue, Some(&exchange)));
                }
            })
            .join();
            eprintln!(
                "weir-load: run failed; weir's config and log are in {}",
                self.dir.display()
            );
        }
    }
}

/// `config` with each `table.key=value` of `settings` applied.
fn with_settings(config: &str, settings: &[String]) -> anyhow::Result<String> {
    if settings.is_empty() {
        return Ok(config.to_string());
    }
    let mut table: toml::Table = config.parse().context("the generated config")?;
    for setting in settings {
        let (path, value) = setting
            .split_once('=')
            .with_context(|| format!("--set {setting}: expected table.key=value"))?;
        let value = match format!("v = {value}").parse::<toml::Table>() {
            Ok(mut t) => t.remove("v").expect("just parsed"),
            Err(_) => toml::Value::String(value.to_string()),
        };
        let mut keys: Vec<&str> = path.trim().split('.').collect();
        let last = keys.pop().filter(|k| !k.is_empty());
        let last = last.with_context(|| format!("--set {setting}: no key"))?;
        let mut at = &mut table;
        for k in keys {
            at = at
                .entry(k)
                .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                .as_table_mut()
                .with_context(|| format!("--set {setting}: `{k}` is not a table"))?;
        }
        at.insert(last.to_string(), value);
    }
    Ok(format!(
        "# Generated by weir-load.\n{}",
        toml::to_string(&table)?
    ))
}

/// The last lines of a log, for error messages.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

async fn delete_topology(url: &str, queue: &str, exchange: Option<&str>) {
    let Ok(conn) = Connection::connect(url, ConnectionProperties::default()).await else {
        return;
    };
    if let Ok(ch) = conn.create_channel().await {
        let _ = ch
            .queue_delete(queue.into(), QueueDeleteOptions::default())
            .await;
        if let Some(x) = exchange {
            let _ = ch
                .exchange_delete(x.into(), ExchangeDeleteOptions::default())
                .await;
        }
    }
    let _ = conn.close(200, "done".into()).await;
}

// ---------------------------------------------------------------------------
// Sampling: /proc and weir's admin /metrics

/// Clock ticks per second of `/proc/<pid>/stat` times.
fn clk_tck() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

fn status_kib(pid: u32, key: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Resident memory (VmRSS), KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmRSS:")
}

/// Peak resident memory (VmHWM), KiB.
fn hwm_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmHWM:")
}

/// utime + stime from a `stat` file, in clock ticks.
fn stat_ticks(path: &str) -> Option<u64> {
    let s = std::fs::read_to_string(path).ok()?;
    // Fields after the parenthesised command name, which may hold spaces:
    // state is field 3, utime 14 and stime 15.
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// CPU ticks of a process's threads, summed by thread name.
fn thread_ticks(pid: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let dir = t.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if let Some(ticks) = stat_ticks(&dir.join("stat").to_string_lossy()) {
            *out.entry(comm.trim().to_string()).or_insert(0) += ticks;
        }
    }
    out
}

/// The RabbitMQ node's pid (the `beam.smp` process), if it runs here.
fn beam_pid() -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        (comm.trim() == "beam.smp").then_some(pid)
    })
}

/// The unit of `/proc/stat`, fixed by the kernel ABI.
const USER_HZ: f64 = 100.0;

/// (busy, total) jiffies of the whole machine.
fn machine_ticks() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = s.lines().next() else {
        return (0, 0);
    };
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().sum();
    // idle and iowait
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// weir's Prometheus metrics, by series (name plus labels).
#[derive(Default)]
struct Scrape(HashMap<String, f64>);

impl Scrape {
    /// The sum of every series of metric `name` (all classes).
    fn sum(&self, name: &str) -> f64 {
        self.0
            .iter()
            .filter(|(k, _)| k.split('{').next() == Some(name))
            .map(|(_, v)| v)
            .sum()
    }
}

/// Reads `/metrics` from weir's admin listener (plain HTTP/1.1 GET).
async fn scrape(addr: SocketAddr) -> anyhow::Result<Scrape> {
    let mut s = TcpStream::connect(addr)
        .await
        .with_context(|| format!("weir's admin listener {addr}"))?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: weir\r\nConnection: close\r\n\r\n")
        .await?;
    let mut body = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut body))
        .await
        .context("weir's /metrics did not answer")??;
    let text = String::from_utf8_lossy(&body);
    let (_, body) = text
        .split_once("\r\n\r\n")
        .context("weir's /metrics answer has no body")?;
    let mut m = HashMap::new();
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        if let Some((k, v)) = line.rsplit_once(' ') {
            if let Ok(v) = v.parse::<f64>() {
                m.insert(k.to_string(), v);
            }
        }
    }
    Ok(Scrape(m))
}

/// Everything sampled at one instant.
struct Snapshot {
    at: Instant,
    acked: u64,
    consumed: u64,
    messages: u64,
    weir_threads: BTreeMap<String, u64>,
    beam: u64,
    tool_threads: BTreeMap<String, u64>,
    machine: (u64, u64),
    metrics: Scrape,
}

impl Snapshot {
    async fn take(weir: &Weir, counters: &Counters) -> anyhow::Result<Snapshot> {
        Snapshot::take_opt(Some(weir), counters).await
    }

    async fn take_opt(weir: Option<&Weir>, counters: &Counters) -> anyhow::Result<Snapshot> {
        let metrics = match weir {
            Some(w) => scrape(w.admin).await?,
            None => Scrape::default(),
        };
        let (acked, consumed, messages) = counters.get();
        Ok(Snapshot {
            at: Instant::now(),
            acked,
            consumed,
            messages,
            weir_threads: weir.map_or_else(BTreeMap::new, |w| thread_ticks(&w.pid.to_string())),
            beam: beam_pid()
                .and_then(|p| stat_ticks(&format!("/proc/{p}/stat")))
                .unwrap_or(0),
            tool_threads: thread_ticks("self"),
            machine: machine_ticks(),
            metrics,
        })
    }
}

impl CpuReport {
    fn between(first: &Snapshot, last: &Snapshot, records: f64, clk_tck: f64) -> CpuReport {
        let secs = last.at.duration_since(first.at).as_secs_f64().max(1e-9);
        let cores = |ticks: u64| ticks as f64 / clk_tck / secs;
        let per_record = |ticks: u64| {
            if records > 0.0 {
                ticks as f64 / clk_tck / records * 1e6
            } else {
                0.0
            }
        };
        let delta = |a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>| {
            b.iter()
                .map(|(k, v)| (k.clone(), cores(v.saturating_sub(*a.get(k).unwrap_or(&0)))))
                .filter(|(_, c)| *c > 0.0)
                .collect::<BTreeMap<_, _>>()
        };
        // Threads that exited in between make the sum shrink; never negative.
        let weir_ticks = last
            .weir_threads
            .values()
            .sum::<u64>()
            .saturating_sub(first.weir_threads.values().sum());
        let beam = last.beam.saturating_sub(first.beam);
        let (busy, total) = (
            last.machine.0.saturating_sub(first.machine.0),
            last.machine.1.saturating_sub(first.machine.1),
        );
        let busy_cores = cores(busy) * clk_tck / USER_HZ;
        let tool = delta(&first.tool_threads, &last.tool_threads);
        let ours = cores(weir_ticks) + cores(beam) + tool.values().sum::<f64>();
        CpuReport {
            other_cores: (busy_cores - ours).max(0.0),
            weir_cores: cores(weir_ticks),
            weir_us_per_record: per_record(weir_ticks),
            weir_threads: delta(&first.weir_threads, &last.weir_threads),
            rabbitmq_cores: cores(beam),
            rabbitmq_us_per_record: per_record(beam),
            tool_threads: tool,
            machine_busy: if total > 0 {
                busy as f64 / total as f64
            } else {
                0.0
            },
        }
    }
}

// ---------------------------------------------------------------------------
// The MQTT publisher

/// One publishing connection.
struct MqttLoad {
    addr: SocketAddr,
    client_id: String,
    topic: String,
    size: usize,
    /// Unacknowledged publishes allowed.
    window: usize,
    /// Records per second, or as fast as the window allows.
    rate: Option<f64>,
    /// How sends are spread when paced.
    pacing: Pacing,
    /// Stop after this many records.
    limit: Option<u64>,
}

/// Runs every connection on the `load-pub` thread until `stop` fires (or
/// each has sent its `limit`), then waits for their in-flight PUBACKs.
fn run_publishers(
    loads: Vec<MqttLoad>,
    counters: Arc<Counters>,
    stop: CancellationToken,
) -> impl Future<Output = anyhow::Result<()>> + Send {
    on_thread("load-pub", move || async move {
        let tasks: Vec<_> = loads
            .into_iter()
            .map(|l| mqtt_publisher(l, Arc::clone(&counters), stop.clone()))
            .collect();
        for r in futures::future::join_all(tasks).await {
            r?;
        }
        Ok(())
    })
}

/// Sends are due at `rate` per second from `start`.
struct Pacer {
    start: Instant,
    rate: f64,
    sent: u64,
    pacing: Pacing,
}

/// Below this a wait for the next send is a thread sleep under `even`
/// pacing; longer waits use tokio's timer.
const EVEN_SLEEP_MAX: Duration = Duration::from_millis(2);

impl Pacer {
    fn new(rate: f64, pacing: Pacing) -> Pacer {
        Pacer {
            start: Instant::now(),
            rate,
            sent: 0,
            pacing,
        }
    }

    /// Waits until the next send is due, or `stop`.
    async fn wait(&self, stop: &CancellationToken) {
        let at = self.next_at();
        let left = at.saturating_duration_since(Instant::now());
        if self.pacing == Pacing::Even && left < EVEN_SLEEP_MAX {
            // tokio's timer has a 1 ms resolution, which would send in
            // bursts; a thread sleep (an hrtimer) spaces sends evenly. It
            // blocks this thread's runtime, which the publisher has to
            // itself; the yield lets the PUBACK reader run in between.
            std::thread::sleep(left);
            tokio::task::yield_now().await;
            return;
        }
        // Cancel safety: both branches only wait.
        tokio::select! {
            _ = tokio::time::sleep_until(at) => {}
            _ = stop.cancelled() => {}
        }
    }

    /// How many sends are due now.
    fn due(&self) -> u64 {
        let should = (self.start.elapsed().as_secs_f64() * self.rate) as u64;
        should.saturating_sub(self.sent)
    }

    /// When the next send is due.
    fn next_at(&self) -> Instant {
        self.start + Duration::from_secs_f64((self.sent + 1) as f64 / self.rate)
    }
}

/// A payload of `size` bytes: send time, sequence number, filler.
fn stamped(size: usize, seq: u64) -> Bytes {
    let mut p = BytesMut::with_capacity(size);
    p.put_u64_le(now_us());
    p.put_u64_le(seq);
    let fill = size.saturating_sub(STAMP);
    match FILLER.get() {
        Some(pool) if pool.len() > fill => {
            // A different window of the pool per record, so that batches
            // do not repeat themselves either.
            let at = (seq as usize).wrapping_mul(251) % (pool.len() - fill);
            p.extend_from_slice(&pool[at..at + fill]);
        }
        _ => p.resize(size, b'.'),
    }
    p.freeze()
}

/// Random bytes that payloads are cut from (`--payload random`); unset
/// means repetitive filler.
static FILLER: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();

/// Size of the random pool: far larger than any batch's payload.
const FILLER_POOL: usize = 1 << 20;

/// The payload filler in use, for reports.
fn payload_kind() -> &'static str {
    if FILLER.get().is_some() {
        "random"
    } else {
        "repetitive"
    }
}

/// Fills [`FILLER`] from a fixed-seed xorshift, so runs are comparable.
fn init_random_filler() {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let pool = (0..FILLER_POOL / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect();
    let _ = FILLER.set(pool);
}

fn read_stamp(payload: &[u8]) -> Option<(u64, u64)> {
    let send = u64::from_le_bytes(payload.get(..8)?.try_into().ok()?);
    let seq = u64::from_le_bytes(payload.get(8..16)?.try_into().ok()?);
    Some((send, seq))
}

async fn mqtt_publisher(
    load: MqttLoad,
    counters: Arc<Counters>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let mut stream = TcpStream::connect(load.addr)
        .await
        .with_context(|| format!("connecting to weir's MQTT listener {}", load.addr))?;
    stream.set_nodelay(true)?;
    let mut out = BytesMut::with_capacity(64 * 1024);
    let mut connect = v4::Connect::new(load.client_id.clone());
    // No keep alive: the drain at the end may be silent for a while.
    connect.keep_alive = 0;
    v4::Packet::Connect(connect).write(&mut out, usize::MAX)?;
    stream.write_all(&out).await?;
    out.clear();
    let mut inbuf = BytesMut::with_capacity(64 * 1024);
    loop {
        match v4::Packet::read(&mut inbuf, usize::MAX) {
            Ok(v4::Packet::ConnAck(ack)) => {
                ensure!(
                    ack.code == v4::ConnectReturnCode::Success,
                    "weir refused the MQTT connection: {:?}",
                    ack.code
                );
                break;
            }
            Ok(other) => bail!("expected CONNACK, got {other:?}"),
            Err(mqttbytes::Error::InsufficientBytes(_)) => {
                ensure!(
                    stream.read_buf(&mut inbuf).await? > 0,
                    "weir closed the connection before CONNACK"
                );
            }
            Err(e) => bail!("bad CONNACK: {e}"),
        }
    }
    let (mut rd, mut wr) = stream.into_split();
    let window = Arc::new(Semaphore::new(load.window));
    let done = CancellationToken::new();

    let reader = {
        let (window, counters, done) = (Arc::clone(&window), Arc::clone(&counters), done.clone());
        async move {
            loop {
                let mut acks = 0;
                loop {
                    match v4::Packet::read(&mut inbuf, usize::MAX) {
                        Ok(v4::Packet::PubAck(_)) => acks += 1,
                        Ok(other) => bail!("unexpected packet from weir: {other:?}"),
                        Err(mqttbytes::Error::InsufficientBytes(_)) => break,
                        Err(e) => bail!("bad packet from weir: {e}"),
                    }
                }
                if acks > 0 {
                    counters.acked.fetch_add(acks as u64, Ordering::Relaxed);
                    window.add_permits(acks);
                }
                // Cancel safety: `read_buf` is cancel safe (nothing is
                // read unless it returns); `done` only waits.
                tokio::select! {
                    n = rd.read_buf(&mut inbuf) => {
                        if n? == 0 {
                            // After our DISCONNECT weir closes: expected.
                            if done.is_cancelled() {
                                return Ok(());
                            }
                            bail!("weir closed the MQTT connection");
                        }
                    }
                    _ = done.cancelled() => return Ok(()),
                }
            }
        }
    };

    let writer = async {
        let mut pacer = load.rate.map(|rate| Pacer::new(rate, load.pacing));
        let mut pkid: u16 = 0;
        let mut sent_here = 0u64;
        loop {
            if stop.is_cancelled() || load.limit.is_some_and(|l| sent_here >= l) {
                break;
            }
            let mut budget = MAX_BURST as u64;
            if let Some(p) = &pacer {
                let due = p.due();
                if due == 0 {
                    p.wait(&stop).await;
                    continue;
                }
                budget = budget.min(due);
            }
            if let Some(l) = load.limit {
                budget = budget.min(l - sent_here);
            }
            // Cancel safety: `acquire` is cancel safe; a permit is only
            // used (forgotten) once held.
            tokio::select! {
                p = window.acquire() => p?.forget(),
                _ = stop.cancelled() => break,
            }
            let mut n = 1;
            while n < budget {
                match window.try_acquire() {
                    Ok(p) => {
                        p.forget();
                        n += 1;
                    }
                    Err(_) => break,
                }
            }
            for _ in 0..n {
                pkid = if pkid == u16::MAX { 1 } else { pkid + 1 };
                let seq = counters.sent.fetch_add(1, Ordering::Relaxed);
                let publish = v4::Publish {
                    dup: false,
                    qos: QoS::AtLeastOnce,
                    retain: false,
                    topic: load.topic.clone(),
                    pkid,
                    payload: stamped(load.size, seq),
                };
                publish.write(&mut out)?;
            }
            wr.write_all(&out).await?;
            out.clear();
            sent_here += n;
            if let Some(p) = &mut pacer {
                p.sent += n;
            }
        }
        // Every permit back means every publish acknowledged.
        tokio::time::timeout(DRAIN_PATIENCE, window.acquire_many(load.window as u32))
            .await
            .context("weir did not acknowledge every publish in time")??
            .forget();
        // Before DISCONNECT, so that the reader takes the close it causes
        // as the end, not as an error.
        done.cancel();
        v4::Packet::Disconnect.write(&mut out, usize::MAX)?;
        wr.write_all(&out).await?;
        wr.shutdown().await?;
        anyhow::Ok(())
    };
    let (r, w) = tokio::join!(reader, writer);
    // The writer's failure is the cause; the reader's is usually its echo.
    w.and(r)
}

// ---------------------------------------------------------------------------
// AMQP: the consumer and the direct publisher

/// What the consumed messages hold.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Body {
    /// A `weir.v1.Batch` of records.
    WeirBatch,
    /// One record's payload (the direct baseline).
    Raw,
}

/// One consumed record.
#[derive(Clone, Copy)]
struct Sample {
    send_us: u64,
    /// weir's ingress timestamp (0 when direct).
    ingress_us: u64,
    /// When weir's egress encoded the record's batch (0 when direct).
    created_us: u64,
    consumed_us: u64,
}

/// What the consumer saw.
#[derive(Default)]
struct Consumed {
    samples: Vec<Sample>,
    /// `created_us` of every weir batch, in consumption order.
    batches: Vec<u64>,
    /// Bit per load sequence number.
    seen: Vec<u64>,
    unique: u64,
    total: u64,
}

impl Consumed {
    fn mark(&mut self, seq: u64) {
        let (word, bit) = ((seq / 64) as usize, seq % 64);
        if word >= self.seen.len() {
            self.seen.resize(word + 1 + word / 2, 0);
        }
        if self.seen[word] & (1 << bit) == 0 {
            self.seen[word] |= 1 << bit;
            self.unique += 1;
        }
        self.total += 1;
    }

    fn integrity(&self, acked: u64) -> Integrity {
        Integrity {
            acked,
            consumed: self.total,
            unique: self.unique,
            duplicates: self.total - self.unique,
            lost: acked.saturating_sub(self.unique),
        }
    }
}

/// A consumer on its own thread.
struct Consumer {
    stop: CancellationToken,
    done: std::pin::Pin<Box<dyn Future<Output = anyhow::Result<Consumed>> + Send>>,
}

impl Consumer {
    /// Starts consuming `queue` (declaring it durable, as weir does) and
    /// returns once the consumer is registered.
    async fn start(
        url: String,
        queue: String,
        body: Body,
        counters: Arc<Counters>,
    ) -> anyhow::Result<Consumer> {
        let stop = CancellationToken::new();
        let (ready_tx, ready_rx) = oneshot::channel();
        let done = Box::pin(on_thread("load-con", {
            let stop = stop.clone();
            move || async move {
                let out = consume(url, queue, body, Arc::clone(&counters), stop, ready_tx).await;
                if let Err(e) = &out {
                    *counters.consumer_failed.lock().expect("not poisoned") =
                        Some(format!("{e:#}"));
                }
                out
            }
        }));
        let mut consumer = Consumer { stop, done };
        // Cancel safety: both branches only wait; the consumer future is
        // polled by reference and kept.
        tokio::select! {
            r = ready_rx => r.context("the consumer could not start")?,
            r = &mut consumer.done => {
                r?;
                bail!("the consumer stopped at once");
            }
        }
        Ok(consumer)
    }

    async fn stop(self) -> anyhow::Result<Consumed> {
        self.stop.cancel();
        self.done.await
    }
}

async fn consume(
    url: String,
    queue: String,
    body: Body,
    counters: Arc<Counters>,
    stop: CancellationToken,
    ready: oneshot::Sender<()>,
) -> anyhow::Result<Consumed> {
    let conn = Connection::connect(&url, ConnectionProperties::default())
        .await
        .with_context(|| format!("RabbitMQ at {url} (run scripts/services.sh)"))?;
    let ch = conn.create_channel().await?;
    ch.basic_qos(PREFETCH, BasicQosOptions::default()).await?;
    ch.queue_declare(
        queue.as_str().into(),
        QueueDeclareOptions::durable(),
        FieldTable::default(),
    )
    .await
    .with_context(|| format!("declaring queue {queue}"))?;
    let mut consumer = ch
        .basic_consume(
            queue.as_str().into(),
            "weir-load".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let _ = ready.send(());
    let mut seen = Consumed::default();
    let mut unacked = None;
    let mut pending = 0u32;
    loop {
        // Cancel safety: `next` on lapin's consumer is cancel safe (a
        // delivery not returned stays queued in it); `cancelled` only waits.
        let next = tokio::select! {
            d = consumer.next() => d,
            _ = stop.cancelled() => break,
        };
        let delivery = next.context("the consumer was cancelled by RabbitMQ")??;
        let consumed_us = now_us();
        let before = seen.total;
        match body {
            Body::WeirBatch => {
                let encoding = delivery
                    .properties
                    .content_encoding()
                    .as_ref()
                    .map_or("identity", |s| s.as_str())
                    .to_string();
                let batch = weir_proto::decode_batch(&delivery.data, &encoding, 64 << 20)
                    .context("a message that is not a weir batch")?;
                seen.batches.push(batch.created_us);
                for r in &batch.records {
                    let (send_us, seq) =
                        read_stamp(&r.payload).context("a record without a weir-load stamp")?;
                    seen.mark(seq);
                    seen.samples.push(Sample {
                        send_us,
                        ingress_us: r.ingress_us,
                        created_us: batch.created_us,
                        consumed_us,
                    });
                }
            }
            Body::Raw => {
                let (send_us, seq) =
                    read_stamp(&delivery.data).context("a message without a weir-load stamp")?;
                seen.mark(seq);
                seen.samples.push(Sample {
                    send_us,
                    ingress_us: 0,
                    created_us: 0,
                    consumed_us,
                });
            }
        }
        counters
            .consumed
            .fetch_add(seen.total - before, Ordering::Relaxed);
        counters.messages.fetch_add(1, Ordering::Relaxed);
        pending += 1;
        if pending >= ACK_EVERY {
            delivery.ack(BasicAckOptions { multiple: true }).await?;
            pending = 0;
            unacked = None;
        } else {
            unacked = Some(delivery);
        }
    }
    if let Some(d) = unacked {
        d.ack(BasicAckOptions { multiple: true }).await?;
    }
    let _ = conn.close(200, "done".into()).await;
    Ok(seen)
}

/// The baseline: one persistent message per record straight to `queue`
/// (default exchange) with publisher confirms, paced at `rate`. Confirms
/// are awaited in order alongside the publishing, never one at a time.
/// Returns each message's (send time, publish-to-confirm) in microseconds.
async fn direct_publisher(
    url: String,
    queue: String,
    rate: f64,
    pacing: Pacing,
    size: usize,
    counters: Arc<Counters>,
    stop: CancellationToken,
) -> anyhow::Result<Vec<(u64, u64)>> {
    let conn = Connection::connect(&url, ConnectionProperties::default())
        .await
        .with_context(|| format!("RabbitMQ at {url}"))?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(u64, lapin::PublisherConfirm)>(1 << 16);
    let confirmer = async {
        let mut took = Vec::new();
        while let Some((sent_us, c)) = rx.recv().await {
            match c.await? {
                Confirmation::Ack(None) => {
                    took.push((sent_us, now_us().saturating_sub(sent_us)));
                    counters.acked.fetch_add(1, Ordering::Relaxed);
                }
                other => bail!("RabbitMQ did not confirm a direct publish: {other:?}"),
            }
        }
        anyhow::Ok(took)
    };
    let publisher = async {
        let mut pacer = Pacer::new(rate, pacing);
        let props = BasicProperties::default().with_delivery_mode(2);
        while !stop.is_cancelled() {
            let due = pacer.due();
            if due == 0 {
                pacer.wait(&stop).await;
                continue;
            }
            for _ in 0..due.min(MAX_BURST as u64) {
                let seq = counters.sent.fetch_add(1, Ordering::Relaxed);
                let payload = stamped(size, seq);
                let sent_us = read_stamp(&payload).map_or(0, |(t, _)| t);
                let confirm = ch
                    .basic_publish(
                        "".into(),
                        queue.as_str().into(),
                        BasicPublishOptions::default(),
                        &payload,
                        props.clone(),
                    )
                    .await?;
                tx.send((sent_us, confirm)).await?;
                pacer.sent += 1;
            }
        }
        drop(tx);
        anyhow::Ok(())
    };
    let (p, c) = tokio::join!(publisher, confirmer);
    p?;
    let took = c?;
    let _ = conn.close(200, "done".into()).await;
    Ok(took)
}
