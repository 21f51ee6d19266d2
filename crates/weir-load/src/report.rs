//! The reports: what each run measures, serialised as the `--json` file
//! (field docs say what each figure is).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::cli::{LatencyArgs, ThroughputArgs};

#[derive(Serialize)]
pub struct MachineInfo {
    pub nproc: usize,
    pub cpu_model: String,
}

pub fn machine_info() -> MachineInfo {
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
pub struct Percentiles {
    pub n: usize,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub mean: f64,
}

impl Percentiles {
    pub fn of(mut us: Vec<u64>) -> Percentiles {
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
pub struct Integrity {
    /// Records the publisher had acknowledged (PUBACK or confirm).
    pub acked: u64,
    /// Records the consumer saw, duplicates included.
    pub consumed: u64,
    /// Distinct records the consumer saw.
    pub unique: u64,
    /// `consumed - unique`.
    pub duplicates: u64,
    /// Acknowledged records never consumed.
    pub lost: u64,
}

/// CPU use over the steady part.
#[derive(Serialize, Default)]
pub struct CpuReport {
    /// Cores weir used on average.
    pub weir_cores: f64,
    /// weir's CPU time per consumed record, microseconds.
    pub weir_us_per_record: f64,
    /// weir's cores by thread name (`weir` workers, `lapin-io-loop`).
    pub weir_threads: BTreeMap<String, f64>,
    /// Cores RabbitMQ (`beam.smp`) used on average.
    pub rabbitmq_cores: f64,
    /// RabbitMQ's CPU time per consumed record, microseconds.
    pub rabbitmq_us_per_record: f64,
    /// This tool's cores by thread name (`load-pub`, `load-con`,
    /// `lapin-io-loop`).
    pub tool_threads: BTreeMap<String, f64>,
    /// Fraction of all the machine's CPU time that was busy.
    pub machine_busy: f64,
    /// Cores busy with anything else (other builds and tests on a shared
    /// machine): the noise in these figures.
    pub other_cores: f64,
}

#[derive(Serialize)]
pub struct TimelinePoint {
    /// Seconds since the load started.
    pub t: f64,
    pub consumed_per_sec: f64,
    pub acked_per_sec: f64,
    pub weir_rss_kib: u64,
}

#[derive(Serialize)]
pub struct ThroughputReport {
    pub kind: &'static str,
    pub machine: MachineInfo,
    /// Payload filler: `random` or `repetitive`.
    pub payload: &'static str,
    pub params: ThroughputArgs,
    /// Records per second at the consumer over the steady part.
    pub consumed_per_sec: f64,
    /// PUBACKs per second at the publisher over the steady part.
    pub acked_per_sec: f64,
    /// Batches confirmed per second (weir's metrics).
    pub batches_per_sec: f64,
    /// Mean records per confirmed batch over the steady part.
    pub records_per_batch: f64,
    /// Mean batch body bytes.
    pub bytes_per_batch: f64,
    /// Pushes that found the class queue full (weir's metrics).
    pub backpressured: u64,
    /// Bytes weir wrote to storage over the steady part per payload byte
    /// acknowledged (the spool's write amplification; about 0 in memory
    /// mode).
    pub disk_bytes_per_payload_byte: f64,
    /// Bytes written to spool segments per payload byte (the format's
    /// cost, each byte counted once).
    pub segment_bytes_per_payload_byte: f64,
    /// fdatasync calls on segments per second.
    pub spool_syncs_per_sec: f64,
    /// weir's resident memory right after start, nothing sent yet.
    pub weir_rss_start_kib: u64,
    /// weir's resident memory idle, connected to RabbitMQ, before the load.
    pub weir_rss_idle_kib: u64,
    /// Mean resident memory over the steady part.
    pub weir_rss_load_mean_kib: u64,
    /// Peak resident memory over the steady part.
    pub weir_rss_load_peak_kib: u64,
    /// weir's own peak (VmHWM) at the end.
    pub weir_rss_hwm_kib: u64,
    pub cpu: CpuReport,
    /// End-to-end latency (send to consume) over the steady part, under
    /// this load.
    pub latency_under_load_ms: Percentiles,
    /// PUBLISH to PUBACK over the steady part, at the publisher.
    pub ack_latency_ms: Percentiles,
    /// Time between consecutive batches leaving weir's egress (one publish
    /// plus its confirm while the egress is busy).
    pub egress_cycle_ms: Percentiles,
    pub integrity: Integrity,
    pub timeline: Vec<TimelinePoint>,
}

/// Latency of one side, percentiles of each leg.
#[derive(Serialize, Default)]
pub struct Breakdown {
    /// Send to consume.
    pub end_to_end_ms: Percentiles,
    /// Send to weir's ingress timestamp (MQTT hop); weir side only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to_ingress_ms: Option<Percentiles>,
    /// weir's ingress timestamp to consume; weir side only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ingress_to_consumer_ms: Option<Percentiles>,
    /// Ingress to the egress encoding the record's batch: the wait in the
    /// class queue, mostly for the previous batch's confirm; weir only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_wait_ms: Option<Percentiles>,
    /// Batch encoded to consumed: publish, routing, delivery; weir only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_to_consumer_ms: Option<Percentiles>,
    /// Time between consecutive batches leaving the egress: one publish and
    /// its confirm when the egress is busy; weir only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress_cycle_ms: Option<Percentiles>,
    /// Publish to publisher confirm of each message; direct only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confirm_ms: Option<Percentiles>,
}

/// One side of one round.
#[derive(Serialize)]
pub struct LatencySide {
    #[serde(flatten)]
    pub latency: Breakdown,
    /// Achieved send rate over the measured part.
    pub sent_per_sec: f64,
    /// Mean records per AMQP message.
    pub records_per_message: f64,
    /// weir's resident memory during the run (weir side only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weir_rss_mean_kib: Option<u64>,
    pub cpu: CpuReport,
    pub integrity: Integrity,
}

/// One round: weir, then direct.
#[derive(Serialize, Default)]
pub struct LatencyRound {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weir: Option<LatencySide>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direct: Option<LatencySide>,
}

#[derive(Serialize)]
pub struct LatencyReport {
    pub kind: &'static str,
    pub machine: MachineInfo,
    /// Payload filler: `random` or `repetitive`.
    pub payload: &'static str,
    pub params: LatencyArgs,
    /// Through weir, all rounds pooled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weir: Option<Breakdown>,
    /// Straight to RabbitMQ, all rounds pooled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direct: Option<Breakdown>,
    /// weir's p99 minus direct p99 (pooled), ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub added_p99_ms: Option<f64>,
    /// weir's p50 minus direct p50 (pooled), ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub added_p50_ms: Option<f64>,
    pub rounds: Vec<LatencyRound>,
}
