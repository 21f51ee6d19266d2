//! The validated configuration: what the rest of weir reads. Every value
//! here has passed validation, defaults are filled in and units converted
//! (durations to [`Duration`], sizes to bytes, rates to bytes per second).

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use weir_core::class::{ClassId, ClassSet};
use weir_core::classify::{Classifier, TopicFilter};
use weir_core::queue::QueueCapacity;
use weir_core::record::NodeId;

/// A validated weir configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `[node]`: who this node is.
    pub node: NodeConfig,
    /// `[[class]]`: the latency classes in priority order.
    pub classes: ClassSet,
    /// Queue capacity per class, indexed by [`ClassId::index`].
    pub capacities: Vec<QueueCapacity>,
    /// `[classify]`: which class each topic or stream goes to.
    pub classifier: Classifier,
    /// `[scheduler]`: JANUS parameters.
    pub scheduler: SchedulerConfig,
    /// `[batching]`: adaptive batching (buffer-aided relaying).
    pub batching: BatchingSection,
    /// `[compression]`: per-batch codec choice (the piping model).
    pub compression: CompressionSection,
    /// `[ingress]`: where records come from.
    pub ingress: IngressConfig,
    /// `[egress]`: where batches go.
    pub egress: EgressConfig,
    /// `[admin]`: the metrics listener.
    pub admin: AdminConfig,
    /// `[peering]`: redirection to neighbours; `None` without
    /// `peering.listen`.
    pub peering: Option<PeeringConfig>,
    /// `[log]`: logging.
    pub log: LogConfig,
}

impl Config {
    /// The queue capacity of `class`.
    pub fn capacity(&self, class: ClassId) -> QueueCapacity {
        self.capacities[class.index()]
    }
}

/// `[node]`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    /// Origin id stamped on every record entering here; never 0.
    pub id: NodeId,
    /// Name for logs and metrics.
    pub name: String,
}

/// `[scheduler]`
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerConfig {
    /// Which node-level scheme and matcher to run.
    pub scheme: SchemeName,
    /// PBTT counting window `t` (JANUS Algorithm 1); at most the smallest
    /// class bound.
    pub window: Duration,
    /// `epsilon` of JANUS Eq. 1; less than the smallest class bound.
    pub processing_delay: Duration,
    /// `C_out`, the initial outbound capacity, in bytes per second (> 0).
    pub uplink_bytes_per_sec: f64,
    /// Token bucket depth per class, in bytes (> 0).
    pub burst_bytes: usize,
    /// Prior of the fixed per-transaction time `T_sc` (piping model Eq. 1),
    /// until the link estimator has measured it.
    pub transaction_time: Duration,
    /// Whether `C_out` follows the online estimate of the uplink bandwidth
    /// (otherwise `uplink` stays fixed).
    pub track_uplink: bool,
    /// Whether a closing batch takes in records of other classes within
    /// their tokens (one transaction instead of one per class).
    pub mix_classes: bool,
    /// Most records in one batch (> 0).
    pub max_batch_records: usize,
    /// Most bytes in one batch (> 0); a single larger record still goes
    /// out alone.
    pub max_batch_bytes: usize,
}

/// `[batching]`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchingSection {
    /// Whether batches wait for records (buffer-aided relaying); when off,
    /// a batch is whatever is queued when the link is free.
    pub adaptive: bool,
    /// The reference record `i` of Eq. 5-6 per class rank (most urgent
    /// first; the last entry repeats for further classes).
    pub reference: Vec<u32>,
}

/// `[compression]`
#[derive(Debug, Clone, PartialEq)]
pub struct CompressionSection {
    /// Whether batches may be compressed at all.
    pub enabled: bool,
    /// The codecs the chooser picks among.
    pub candidates: Vec<weir_core::compression::Codec>,
    /// What a "kind of payload" is, for the per-kind tables.
    pub per: PayloadKind,
    /// Batches between samples of a codec not in use.
    pub sample_every: u32,
    /// Longest time between samples of a codec not in use.
    pub sample_interval: Duration,
}

/// `[ingress]`: each ingress is `None` when disabled; at least one is on.
#[derive(Debug, Clone, PartialEq)]
pub struct IngressConfig {
    /// `[ingress.mqtt]`
    pub mqtt: Option<MqttIngress>,
    /// `[ingress.grpc]`
    pub grpc: Option<GrpcIngress>,
}

/// `[ingress.mqtt]`
#[derive(Debug, Clone, PartialEq)]
pub struct MqttIngress {
    /// Act as the broker, or subscribe to one.
    pub mode: MqttMode,
    /// Largest MQTT packet accepted, in bytes.
    pub max_packet_size: usize,
    /// What to do with a QoS 0 publish when its class queue is full.
    pub qos0_when_full: Qos0WhenFull,
}

/// How weir gets MQTT traffic.
#[derive(Debug, Clone, PartialEq)]
pub enum MqttMode {
    /// Devices connect to weir, which speaks the broker side of MQTT 3.1.1.
    Listen {
        /// Address to accept MQTT connections on.
        addr: SocketAddr,
    },
    /// weir connects to an existing broker and subscribes.
    Subscribe(MqttSubscribe),
}

/// Subscribe-mode settings.
#[derive(Debug, Clone, PartialEq)]
pub struct MqttSubscribe {
    /// The broker to connect to.
    pub broker: BrokerAddr,
    /// MQTT client id weir connects with.
    pub client_id: String,
    /// Filters to subscribe to, at least one.
    pub topics: Vec<TopicFilter>,
    /// QoS requested for the subscriptions.
    pub qos: SubscribeQos,
}

/// A broker's `host:port`; the host is resolved when connecting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerAddr {
    /// Host name or IP address (IPv6 without brackets); never empty.
    pub host: String,
    /// TCP port; never 0.
    pub port: u16,
}

impl fmt::Display for BrokerAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// QoS of weir's MQTT subscriptions. QoS 2's four-way handshake buys
/// nothing here: weir deduplicates by `(origin, seq)` downstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SubscribeQos {
    /// QoS 0: records may be lost if weir restarts.
    AtMostOnce,
    /// QoS 1: acknowledged only once queued.
    AtLeastOnce,
}

impl SubscribeQos {
    /// The MQTT QoS number.
    pub fn level(self) -> u8 {
        match self {
            SubscribeQos::AtMostOnce => 0,
            SubscribeQos::AtLeastOnce => 1,
        }
    }
}

/// `[ingress.grpc]`
#[derive(Debug, Clone, PartialEq)]
pub struct GrpcIngress {
    /// Address to accept gRPC connections on.
    pub listen: SocketAddr,
    /// Largest gRPC message accepted, in bytes.
    pub max_message_size: usize,
}

/// `[egress]`
#[derive(Debug, Clone, PartialEq)]
pub struct EgressConfig {
    /// Where batches are written.
    pub sink: EgressSink,
    /// An emulated uplink in front of the sink, for experiments.
    pub link: Option<LinkEmulation>,
}

/// Where batches go (`egress.kind`).
#[derive(Debug, Clone, PartialEq)]
pub enum EgressSink {
    /// `kind = "file"`: one file per batch in a directory.
    File(FileEgress),
    /// `kind = "amqp"`: publish to RabbitMQ.
    Amqp(AmqpEgress),
}

/// `[egress.file]`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEgress {
    /// Directory batches are written to (relative to the working directory
    /// unless absolute).
    pub dir: PathBuf,
}

/// `[egress.amqp]`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmqpEgress {
    /// `amqp://` or `amqps://` URL, credentials included.
    pub url: String,
    /// Exchange to publish to; empty means the default exchange.
    pub exchange: String,
    /// Type the exchange is declared with.
    pub exchange_type: ExchangeType,
    /// Queue declared and bound to the exchange.
    pub queue: String,
    /// Routing key of every publish and of the binding.
    pub routing_key: String,
    /// How long to wait for a publisher confirm before retrying.
    pub confirm_timeout: Duration,
    /// Longest pause between reconnect attempts.
    pub reconnect_backoff_max: Duration,
}

/// `[egress.link]`: an emulated uplink.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkEmulation {
    /// The JANUS Table III preset it came from, if any.
    pub preset: Option<LinkPreset>,
    /// Bandwidth in bytes per second (> 0).
    pub bandwidth_bytes_per_sec: f64,
    /// Latency added to every transfer.
    pub delay: Duration,
}

/// `[admin]`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminConfig {
    /// Where to serve Prometheus metrics; `None` serves none.
    pub listen: Option<SocketAddr>,
}

/// `[peering]`: redirection of overflow to neighbouring nodes without a
/// coordinator (docs/peering.md).
#[derive(Debug, Clone, PartialEq)]
pub struct PeeringConfig {
    /// Where this node serves `weir.v1.Peer`.
    pub listen: SocketAddr,
    /// The nodes it peers with; ids unique and not this node's.
    pub peers: Vec<PeerConfig>,
    /// How often it sends its state to each peer and runs a redirection
    /// round.
    pub heartbeat: Duration,
    /// Silence after which a peer counts as gone; longer than `heartbeat`.
    pub dead_after: Duration,
    /// How long a reservation lasts unless renewed; longer than
    /// `heartbeat`.
    pub lease: Duration,
}

/// One `peering.peers` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerConfig {
    /// Its `node.id`.
    pub id: NodeId,
    /// Where it serves `weir.v1.Peer` (`peering.listen` on that node).
    pub addr: BrokerAddr,
}

/// `[log]`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    /// A `tracing` filter: a level (`info`) or comma-separated
    /// `target=level` directives, each level checked.
    pub level: String,
}

/// A value chosen by name in the config, so validation can look names up
/// and list the choices in one place.
pub(crate) trait Named: Sized {
    /// Every accepted name.
    const NAMES: &'static [&'static str];
    /// The value called `name`, if any.
    fn from_name(name: &str) -> Option<Self>;
}

/// An enum chosen by name in the config, with the list of names for error
/// messages.
macro_rules! named_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal,)+ }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every accepted name, in documentation order.
            pub const NAMES: &'static [&'static str] = &[$($text),+];

            /// The name as written in the config.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }

            /// The value called `name`, if any.
            pub fn from_name(name: &str) -> Option<Self> {
                match name {
                    $($text => Some($name::$variant),)+
                    _ => None,
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl Named for $name {
            const NAMES: &'static [&'static str] = $name::NAMES;

            fn from_name(name: &str) -> Option<Self> {
                $name::from_name(name)
            }
        }
    };
}

named_enum! {
    /// The node-level scheme (`scheduler.scheme`): JANUS with one of its
    /// redirection matchers, or one of the paper's node-level baselines.
    pub enum SchemeName {
        /// One FIFO queue, no classes (JANUS's Native baseline).
        Native = "native",
        /// Multi-level queues and reallocation, no redirection.
        QmOnly = "qm-only",
        /// Prioritized Max-Request First Served (JANUS Algorithm 3).
        Pmrfs = "pmrfs",
        /// Redirection matched at random.
        Random = "random",
        /// Earliest request first.
        Fcfs = "fcfs",
        /// Least request first.
        Lrfs = "lrfs",
        /// Request closest in size to the provider's availability.
        BestFit = "best-fit",
    }
}

named_enum! {
    /// What counts as one kind of payload for the compression tables
    /// (`compression.per`).
    pub enum PayloadKind {
        /// One table per latency class.
        Class = "class",
        /// One table per MQTT topic or gRPC stream (up to a cap).
        Key = "key",
    }
}

named_enum! {
    /// What a full class queue does to a QoS 0 publish, which has no
    /// acknowledgement to withhold.
    pub enum Qos0WhenFull {
        /// Stop reading the connection until there is room (back-pressure).
        Block = "block",
        /// Drop the record and count it.
        Drop = "drop",
    }
}

named_enum! {
    /// AMQP exchange type (`egress.amqp.exchange_type`).
    pub enum ExchangeType {
        /// Routes on exact routing key.
        Direct = "direct",
        /// Routes to every bound queue.
        Fanout = "fanout",
        /// Routes on routing key patterns.
        Topic = "topic",
        /// Routes on message headers.
        Headers = "headers",
    }
}

named_enum! {
    /// The emulated networks of JANUS Table III.
    pub enum LinkPreset {
        /// WiFi: 5 ms, 200 Mbit/s.
        Wifi = "wifi",
        /// 4G: 50 ms, 18 Mbit/s.
        FourG = "4g",
        /// 3G: 100 ms, 780 kbit/s.
        ThreeG = "3g",
    }
}

impl LinkPreset {
    /// Bandwidth in bytes per second (JANUS Table III).
    pub fn bandwidth_bytes_per_sec(self) -> f64 {
        match self {
            LinkPreset::Wifi => 200e6 / 8.0,
            LinkPreset::FourG => 18e6 / 8.0,
            LinkPreset::ThreeG => 780e3 / 8.0,
        }
    }

    /// Added latency (JANUS Table III, applied there with `tc netem delay`).
    pub fn delay(self) -> Duration {
        match self {
            LinkPreset::Wifi => Duration::from_millis(5),
            LinkPreset::FourG => Duration::from_millis(50),
            LinkPreset::ThreeG => Duration::from_millis(100),
        }
    }
}
