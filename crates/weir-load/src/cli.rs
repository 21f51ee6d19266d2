//! The command line: the two runs (`throughput`, `latency`), their knobs
//! and the knobs of the generated weir config.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use serde::Serialize;

/// The RabbitMQ the tests use (scripts/services.sh starts it).
pub const AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

#[derive(Parser)]
#[command(
    name = "weir-load",
    about = "Load tool for weir's relay figures: throughput, latency, memory, CPU"
)]
pub struct Cli {
    /// The weir binary to run (default: `weir` next to this executable).
    #[arg(long, global = true)]
    pub weir: Option<PathBuf>,
    /// RabbitMQ to relay to and consume from.
    #[arg(long, global = true, default_value = AMQP_URL)]
    pub amqp: String,
    /// weir publishes to these RabbitMQ nodes instead (egress.amqp.urls,
    /// comma-separated), e.g. scripts/rabbitmq-cluster.sh's
    /// 127.0.0.1:5701-5703; the consumer still reads from --amqp.
    #[arg(long, global = true, value_delimiter = ',')]
    pub amqp_urls: Vec<String>,
    /// The type of the queue weir declares and the consumer reads
    /// (egress.amqp.queue_type).
    #[arg(long, global = true, value_enum, default_value_t = QueueTypeArg::Classic)]
    pub queue_type: QueueTypeArg,
    /// weir delivers to this Kafka broker (egress.kind = "kafka", a topic
    /// made for the run) instead of RabbitMQ, and the consumer reads the
    /// topic, e.g. scripts/kafka.sh's 127.0.0.1:9092.
    #[arg(long, global = true)]
    pub kafka: Option<String>,
    /// weir publishes each record to this MQTT broker (egress.kind =
    /// "mqtt", records mode, under a prefix of the run's own) instead of
    /// RabbitMQ, and the consumer subscribes there, e.g. Mosquitto's
    /// 127.0.0.1:1883.
    #[arg(long, global = true)]
    pub mqtt_egress: Option<std::net::SocketAddr>,
    /// Also write the figures as JSON to this file.
    #[arg(long, global = true)]
    pub json: Option<PathBuf>,
    /// Keep the weir child's config and log directory after a good run.
    #[arg(long, global = true)]
    pub keep: bool,
    /// What fills each payload after its 16-byte stamp: random bytes
    /// (incompressible, the honest case once weir compresses batches) or a
    /// repeated byte (compresses about 50:1).
    #[arg(long, global = true, value_enum, default_value_t = PayloadKind::Random)]
    pub payload: PayloadKind,
    #[command(subcommand)]
    pub command: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Sustained MQTT QoS 1 through weir to RabbitMQ: records/s, memory, CPU.
    Throughput(ThroughputArgs),
    /// End-to-end latency of ls records through weir vs straight to RabbitMQ.
    Latency(LatencyArgs),
    /// The same MQTT QoS 1 load at another broker (e.g. Mosquitto), with
    /// one QoS 1 subscriber: the figure weir is compared with.
    Broker(BrokerArgs),
    /// weir's gRPC ingress (PublishStream, raw bytes) under the same load
    /// shape, against a weir you started (`--pid` its pid).
    Grpc(GrpcArgs),
    /// MQTT QoS 1 over TLS against plain TCP through the same weir,
    /// alternated, and new TLS connections per second.
    Tls(TlsArgs),
    /// The spool under a long outage: fill it through weir while the
    /// broker is unreachable, then kill weir (SIGKILL) and time its
    /// restart; resident memory while spooled and after recovery.
    Recovery(RecoveryArgs),
    /// Do the class bounds hold on a busy box? Three classes over an
    /// emulated uplink, offered more than it carries, with 0, 1, 2 ...
    /// busy processes beside weir; per class p50/p99/max and
    /// the late fraction.
    Contention(ContentionArgs),
    /// Devices for a lab: QoS 1 publishes to a weir you started, at a fixed
    /// rate per class for a fixed time, from an agreed start (several
    /// generators, one per node, start together); what was offered, sent
    /// and acknowledged per class. No consumer: the lab consumes.
    Offer(OfferArgs),
}

/// `weir-load offer`.
#[derive(clap::Args, Clone, Debug, Serialize)]
pub struct OfferArgs {
    /// weir's MQTT address.
    #[arg(long, default_value = "127.0.0.1:1883")]
    pub addr: std::net::SocketAddr,
    /// Records/s per class, each on its own QoS 1 connection publishing to
    /// `<topic-prefix>/<class>/t`.
    #[arg(long, default_value = "ls=30,nm=300,lt=5000")]
    pub rates: String,
    /// First level of every topic (and of the client ids).
    #[arg(long, default_value = "dev")]
    pub topic_prefix: String,
    /// Payload bytes per record (at least 16).
    #[arg(long, default_value_t = 640)]
    pub size: usize,
    /// How long to publish.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Start publishing at this Unix time, in milliseconds (connections are
    /// made before it); default: at once.
    #[arg(long)]
    pub start_at_ms: Option<u64>,
    /// Unacknowledged publishes allowed per connection: beyond it a
    /// connection waits for PUBACKs (weir's back-pressure).
    #[arg(long, default_value_t = 1000)]
    pub window: usize,
}

/// `weir-load contention`.
#[derive(clap::Args, Clone, Debug, Serialize)]
pub struct ContentionArgs {
    /// Busy processes (`yes > /dev/null`) beside weir, one scenario each.
    #[arg(long, value_delimiter = ',', default_value = "0,1,2")]
    pub busy: Vec<usize>,
    /// MQTT connections that connect and stay silent during the load.
    #[arg(long, default_value_t = 0)]
    pub idle_connections: usize,
    /// The emulated uplink's bandwidth (`egress.link.bandwidth`).
    #[arg(long, default_value = "4Mbit/s")]
    pub uplink: String,
    /// The emulated uplink's fixed delay per transaction.
    #[arg(long, default_value = "10ms")]
    pub delay: String,
    /// Offered load, as a multiple of the uplink's bandwidth.
    #[arg(long, default_value_t = 1.7)]
    pub overload: f64,
    /// Byte shares of the offered load per class.
    #[arg(long, default_value = "ls=0.1,nm=0.2,lt=0.7")]
    pub mix: String,
    /// Payload bytes per record (at least 16).
    #[arg(long, default_value_t = 256)]
    pub size: usize,
    /// Unacknowledged QoS 1 publishes allowed per publishing connection.
    #[arg(long, default_value_t = 1000)]
    pub window: usize,
    /// Length of the measured part of each scenario.
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
    /// Load before measuring starts.
    #[arg(long, default_value_t = 5)]
    pub warmup: u64,
    /// Nice for the outside world while the scenarios run: this process
    /// (the devices and the consumer) and RabbitMQ (the cloud), in their
    /// sessions' autogroups and every thread, so that on this one machine
    /// they compete with the box as little as they would from elsewhere.
    /// weir and the busy processes run in sessions of their own at nice 0.
    /// 0 leaves every priority alone (everything shares the CPU).
    #[arg(long, default_value_t = -20, allow_negative_numbers = true)]
    pub outside_nice: i32,
    /// Move weir into this cgroup-v1 blkio cgroup once started (its
    /// throttles make the spool's disk slow: scripts/slow-disk.sh).
    #[arg(long)]
    pub blkio_cgroup: Option<PathBuf>,
    /// Write every measured record as CSV here (one file per scenario,
    /// `-<busy>` added before the extension): class, then send, ingress,
    /// batch encoded and consumed times in microseconds since the epoch.
    #[arg(long)]
    pub samples: Option<PathBuf>,
    #[command(flatten)]
    pub weir_config: WeirArgs,
}

/// `weir-load recovery`.
#[derive(clap::Args, Clone, Debug, Serialize)]
pub struct RecoveryArgs {
    /// Bytes of segments to spool before killing weir (e.g. 1GiB, 256MiB).
    #[arg(long, default_value = "1GiB")]
    pub bytes: String,
    /// Payload bytes per record (at least 16).
    #[arg(long, default_value_t = 1024)]
    pub size: usize,
    /// MQTT connections publishing in parallel.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// Unacknowledged QoS 1 publishes allowed per connection.
    #[arg(long, default_value_t = 1000)]
    pub window: usize,
    /// Also time a restart with the page cache dropped (as after a power
    /// cut); needs root (writes /proc/sys/vm/drop_caches).
    #[arg(long)]
    pub cold: bool,
    #[command(flatten)]
    pub weir_config: WeirArgs,
}

/// `weir-load broker`.
#[derive(clap::Args, Clone, Debug, Serialize)]
pub struct BrokerArgs {
    /// The broker's MQTT address.
    #[arg(long, default_value = "127.0.0.1:1883")]
    pub addr: std::net::SocketAddr,
    /// The broker's process id, to report its CPU (default: the process
    /// named `mosquitto`, if exactly one runs).
    #[arg(long)]
    pub pid: Option<u32>,
    /// MQTT connections publishing in parallel.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// No subscriber: for a relay (weir with file egress, `weir run`
    /// started by you, --pid its pid) that takes no subscriptions; only
    /// PUBACKs are counted.
    #[arg(long)]
    pub no_subscriber: bool,
    #[command(flatten)]
    #[serde(flatten)]
    pub shape: LoadShape,
}

/// How long, how big and how fast a `broker` or `grpc` load is.
#[derive(clap::Args, Clone, Debug, Serialize)]
pub struct LoadShape {
    /// Length of the measured, steady part.
    #[arg(long, default_value_t = 15)]
    pub seconds: u64,
    /// Load before measuring starts.
    #[arg(long, default_value_t = 3)]
    pub warmup: u64,
    /// Payload bytes per record (at least 16).
    #[arg(long, default_value_t = 256)]
    pub size: usize,
    /// Unacknowledged publishes (requests) allowed per connection (stream).
    #[arg(long, default_value_t = 1000)]
    pub window: usize,
    /// Total publish rate (records/s), spread over the connections;
    /// unlimited (as fast as acknowledged) unless given.
    #[arg(long)]
    pub rate: Option<f64>,
}

/// `weir-load grpc`.
#[derive(clap::Args, Clone, Debug, Serialize)]
pub struct GrpcArgs {
    /// weir's gRPC ingress address.
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub addr: std::net::SocketAddr,
    /// weir's process id, to report its CPU and peak memory.
    #[arg(long)]
    pub pid: Option<u32>,
    /// PublishStream calls in parallel, each on its own HTTP/2 connection.
    #[arg(long, default_value_t = 4)]
    pub streams: usize,
    #[command(flatten)]
    #[serde(flatten)]
    pub shape: LoadShape,
}

/// Knobs of the generated weir config.
#[derive(clap::Args, Clone, Debug, Serialize)]
pub struct WeirArgs {
    /// A tuned config instead of weir's defaults: scheduler.max_batch_records
    /// (with --max-batch-bytes).
    #[arg(long)]
    pub max_batch_records: Option<u64>,
    /// A tuned config instead of weir's defaults: scheduler.max_batch_bytes,
    /// also scheduler.burst (so that the token bucket never cuts a batch
    /// shorter), and a 10 Gbit/s scheduler.uplink (so that the token
    /// buckets never limit). Without it (and --max-batch-records), weir
    /// runs with its defaults but for addresses, classes' routes and
    /// durability: what a user who installs it gets.
    #[arg(long)]
    pub max_batch_bytes: Option<String>,
    /// Any other setting, as `table.key=value` with a TOML value (a bare
    /// word is taken as a string), e.g. `--set compression.enabled=false`;
    /// repeatable, applied last.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Durability of every class: `memory` (acknowledged once queued) or
    /// `spool` (acknowledged once on disk; the spool lives in the run's
    /// directory under the system temp dir, or in --spool-dir).
    #[arg(long, value_enum, default_value_t = DurabilityArg::Memory)]
    pub durability: DurabilityArg,
    /// Where the spool goes with `--durability spool` (put it on the disk
    /// under test, never on tmpfs: a sync there costs nothing).
    #[arg(long)]
    pub spool_dir: Option<std::path::PathBuf>,
    /// These classes (of ls, nm, lt) are `spool` and the others `memory`,
    /// whatever `--durability` says.
    #[arg(long, value_delimiter = ',')]
    pub spool_classes: Vec<String>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueTypeArg {
    Classic,
    Quorum,
    Stream,
}

impl QueueTypeArg {
    pub fn name(self) -> &'static str {
        match self {
            QueueTypeArg::Classic => "classic",
            QueueTypeArg::Quorum => "quorum",
            QueueTypeArg::Stream => "stream",
        }
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DurabilityArg {
    Memory,
    Spool,
}

impl DurabilityArg {
    pub fn name(self) -> &'static str {
        match self {
            DurabilityArg::Memory => "memory",
            DurabilityArg::Spool => "spool",
        }
    }
}

#[derive(clap::Args, Clone, Debug, Serialize)]
pub struct ThroughputArgs {
    /// Length of the measured, steady part.
    #[arg(long, default_value_t = 15)]
    pub seconds: u64,
    /// Load before measuring starts (queues fill, connections settle).
    #[arg(long, default_value_t = 3)]
    pub warmup: u64,
    /// MQTT connections publishing in parallel.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// Payload bytes per record (at least 16).
    #[arg(long, default_value_t = 256)]
    pub size: usize,
    /// Unacknowledged QoS 1 publishes allowed per connection.
    #[arg(long, default_value_t = 1000)]
    pub window: usize,
    /// Total publish rate (records/s); unlimited (as fast as weir acks)
    /// unless given.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Class the records are routed to.
    #[arg(long, value_enum, default_value_t = ClassArg::Ls)]
    pub class: ClassArg,
    /// Publish over TLS (a CA and server certificate made with openssl for
    /// the run, weir's [ingress.mqtt.tls] on another port).
    #[arg(long)]
    pub tls: bool,
    #[command(flatten)]
    pub weir_config: WeirArgs,
}

/// `weir-load tls`.
#[derive(clap::Args, Clone, Debug, Serialize)]
pub struct TlsArgs {
    /// Plain and TLS runs alternate this many times each.
    #[arg(long, default_value_t = 2)]
    pub rounds: u32,
    /// Length of each connection-rate run.
    #[arg(long, default_value_t = 5)]
    pub handshake_seconds: u64,
    /// Clients opening connections in parallel in the connection-rate runs.
    #[arg(long, default_value_t = 4)]
    pub handshake_clients: usize,
    #[command(flatten)]
    pub throughput: ThroughputArgs,
}

#[derive(clap::Args, Clone, Debug, Serialize)]
pub struct LatencyArgs {
    /// Records per second (5000 is 10% of the 50k/s goal).
    #[arg(long, default_value_t = 5000.0)]
    pub rate: f64,
    /// Length of the measured part of each run.
    #[arg(long, default_value_t = 15)]
    pub seconds: u64,
    /// Load before measuring starts.
    #[arg(long, default_value_t = 2)]
    pub warmup: u64,
    /// Payload bytes per record (at least 16).
    #[arg(long, default_value_t = 256)]
    pub size: usize,
    /// Run only one side.
    #[arg(long, value_enum)]
    pub only: Option<Side>,
    /// How sends are spread over time (both sides alike).
    #[arg(long, value_enum, default_value_t = Pacing::Even)]
    pub pacing: Pacing,
    /// Alternate weir and direct this many times (each `--seconds` long)
    /// and pool the samples, so that noise from other programs on the
    /// machine falls on both sides alike.
    #[arg(long, default_value_t = 1)]
    pub rounds: u32,
    #[command(flatten)]
    pub weir_config: WeirArgs,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ClassArg {
    Ls,
    Nm,
    Lt,
}

impl ClassArg {
    pub fn name(self) -> &'static str {
        match self {
            ClassArg::Ls => "ls",
            ClassArg::Nm => "nm",
            ClassArg::Lt => "lt",
        }
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PayloadKind {
    Random,
    Repetitive,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pacing {
    /// Each record at its own time (thread sleeps between sends).
    Even,
    /// Whatever is due at each 1 ms tick of tokio's timer, in one burst.
    Tick,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    /// Through weir only.
    Weir,
    /// Straight to RabbitMQ only.
    Direct,
}
