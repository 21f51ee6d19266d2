//! `[egress]`: where batches go. The sink (`[egress.file]` or
//! `[egress.amqp]`) and an optional emulated uplink in front of it
//! (`[egress.link]`): as written, their defaults, checked, and their
//! validation.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::named::named_enum;
use super::problems::Problems;
use super::units::{Auto, Count, HumanDuration, Rate, Size, Written};
use weir_core::NodeId;

/// Files need no running server: a fresh checkout works out of the box.
pub const EGRESS_KIND: &str = "file";

/// The values of `egress.kind`.
pub const SINK_KINDS: [&str; 4] = ["file", "amqp", "kafka", "mqtt"];

/// `[egress]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawEgress {
    pub kind: Option<String>,
    pub file: Option<RawFileEgress>,
    pub amqp: Option<RawAmqp>,
    pub kafka: Option<super::kafka::RawKafka>,
    pub mqtt: Option<super::mqtt_egress::RawMqttEgress>,
    pub link: Option<RawLink>,
    pub drain_timeout: Option<Written<HumanDuration>>,
}

/// `[egress]`
#[derive(Debug, Clone, PartialEq)]
pub struct EgressConfig {
    /// Where batches are written.
    pub sink: EgressSink,
    /// An emulated uplink in front of the sink, for experiments.
    pub link: Option<LinkEmulation>,
    /// How long a shutdown (SIGTERM, SIGINT) waits for the queues to drain
    /// and the egress to confirm; what is still in memory then is
    /// undelivered (counted per class, and the exit status is non-zero
    /// when records of `memory` classes are among it).
    pub drain_timeout: Duration,
}

/// A shutdown waits this long for the egress: enough for a healthy uplink
/// to carry the queues out, short of systemd's default stop timeout (90 s).
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Where batches go (`egress.kind`).
#[derive(Debug, Clone, PartialEq)]
pub enum EgressSink {
    /// `kind = "file"`: segment files of batches in a directory.
    File(FileEgress),
    /// `kind = "amqp"`: publish to RabbitMQ.
    Amqp(AmqpEgress),
    /// `kind = "kafka"`: produce to a Kafka-protocol service.
    Kafka(super::kafka::KafkaEgress),
    /// `kind = "mqtt"`: publish to an MQTT broker.
    Mqtt(super::mqtt_egress::MqttEgress),
}

/// `[egress]` checked, or `None` after recording why.
pub(crate) fn egress(
    p: &mut Problems,
    raw: RawEgress,
    classes: &[String],
    node: NodeId,
) -> Option<EgressConfig> {
    let before = p.len();
    let kind = raw.kind.as_deref().unwrap_or(EGRESS_KIND);
    // A table for a kind not chosen is a mistake worth naming.
    let given = [
        ("file", raw.file.is_some()),
        ("amqp", raw.amqp.is_some()),
        ("kafka", raw.kafka.is_some()),
        ("mqtt", raw.mqtt.is_some()),
    ];
    if SINK_KINDS.contains(&kind) {
        for (other, _) in given.iter().filter(|(k, g)| *g && *k != kind) {
            p.push(
                format!("egress.{other}"),
                format!("given, but egress.kind is {kind:?}; set egress.kind = {other:?} to use it, or remove [egress.{other}]"),
            );
        }
    }
    // Every table given is checked, chosen or not: all its problems are
    // listed at once.
    let file = raw.file.map(|f| file_egress(p, f));
    let amqp = raw.amqp.map(|a| amqp_egress(p, a, classes));
    let kafka = raw.kafka.map(|k| super::kafka::kafka_egress(p, k, classes));
    let mqtt = raw
        .mqtt
        .map(|m| super::mqtt_egress::mqtt_egress(p, m, node));
    let needs_table = |p: &mut Problems, kind: &str, what: &str| {
        p.push(
            format!("egress.{kind}"),
            format!("missing; egress.kind = {kind:?} needs an [egress.{kind}] section with at least {what}"),
        );
        None
    };
    let sink = match kind {
        "file" => {
            let default = || file_egress(p, RawFileEgress::default());
            file.unwrap_or_else(default).map(EgressSink::File)
        }
        "amqp" => match amqp {
            Some(a) => a.map(EgressSink::Amqp),
            None => needs_table(p, "amqp", "its url"),
        },
        "kafka" => match kafka {
            Some(k) => k.map(EgressSink::Kafka),
            None => needs_table(p, "kafka", "its brokers"),
        },
        "mqtt" => match mqtt {
            Some(m) => m.map(EgressSink::Mqtt),
            None => needs_table(p, "mqtt", "its broker"),
        },
        other => {
            p.push(
                "egress.kind",
                format!("unknown kind {other:?} (known: {})", SINK_KINDS.join(", ")),
            );
            None
        }
    };
    let link = match raw.link {
        None => Some(None),
        Some(raw) => link(p, raw).map(Some),
    };
    let drain_timeout =
        p.positive_duration("egress.drain_timeout", raw.drain_timeout, DRAIN_TIMEOUT);
    if p.len() != before {
        return None;
    }
    Some(EgressConfig {
        sink: sink?,
        link: link?,
        drain_timeout: drain_timeout?,
    })
}

/// Relative to the working directory, next to where weir was started.
pub const EGRESS_DIR: &str = "weir-out";

/// `[egress.file]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFileEgress {
    pub dir: Option<String>,
    pub segment_bytes: Option<Written<Size>>,
    pub segment_age: Option<Written<HumanDuration>>,
}

/// `[egress.file]`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEgress {
    /// Directory the segment files are written to (relative to the working
    /// directory unless absolute).
    pub dir: PathBuf,
    /// A segment is sealed and the next one started once it holds this
    /// many bytes.
    pub segment_bytes: u64,
    /// ... or once it is this old, written to or not, so that a reader
    /// that takes whole sealed segments waits at most this long.
    pub segment_age: Duration,
}

/// A segment is sealed at this size: few files, each small enough to read
/// whole on an edge box.
pub const FILE_SEGMENT_BYTES: u64 = 64 << 20;

/// ... or at this age: a reader that takes sealed segments sees a light
/// stream's records within seconds.
pub const FILE_SEGMENT_AGE: Duration = Duration::from_secs(10);

/// `[egress.file]` checked, or `None` after recording why.
fn file_egress(p: &mut Problems, raw: RawFileEgress) -> Option<FileEgress> {
    let dir = raw.dir.unwrap_or_else(|| EGRESS_DIR.to_owned());
    let dir_problem = dir.is_empty();
    if dir_problem {
        p.push(
            "egress.file.dir",
            "must not be empty; use \".\" for the working directory",
        );
    }
    let segment_bytes = p.positive_size_u64(
        "egress.file.segment_bytes",
        raw.segment_bytes,
        FILE_SEGMENT_BYTES,
        u64::MAX,
    );
    let segment_age =
        p.positive_duration("egress.file.segment_age", raw.segment_age, FILE_SEGMENT_AGE);
    if dir_problem {
        return None;
    }
    Some(FileEgress {
        dir: PathBuf::from(dir),
        segment_bytes: segment_bytes?,
        segment_age: segment_age?,
    })
}

/// RabbitMQ's out-of-the-box account, which it accepts on loopback only.
pub const AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// One exchange per application keeps weir's traffic easy to find.
pub const AMQP_EXCHANGE: &str = "weir";

/// Direct routing: one routing key, one queue, no pattern surprises.
pub const AMQP_EXCHANGE_TYPE: &str = "direct";

/// The queue weir declares and binds, so batches wait even with no consumer.
pub const AMQP_QUEUE: &str = "weir.batches";

/// Same as the queue name, the usual direct-exchange convention.
pub const AMQP_ROUTING_KEY: &str = "weir.batches";

/// A publisher confirm slower than this means the broker is in trouble;
/// the batch is retried rather than waited on forever.
pub const AMQP_CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);

/// Connecting includes a TCP handshake, AMQP's own handshake, opening a
/// channel and declaring the topology: several round trips, on a cellular
/// uplink or to a broker that is just starting; an attempt slower than this
/// is abandoned and retried with backoff.
pub const AMQP_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// With several endpoints, a connection RabbitMQ has blocked (memory or
/// disk alarm) this long is given up for the next endpoint: a short alarm
/// (a burst of memory use) is waited out where it is, a lasting one is not.
pub const AMQP_BLOCKED_FAILOVER_AFTER: Duration = Duration::from_secs(30);

/// Reconnect attempts back off up to this, so a broker outage costs a
/// reconnect every 30 s at worst and recovery is noticed quickly.
pub const AMQP_RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Batches published and awaiting their confirm at once with
/// `max_in_flight = "auto"` (the default): their bytes follow the pipe's
/// bandwidth-delay product ([`weir_core::delivery::pipe`]), and this only
/// bounds how many batches carry them.
pub const AMQP_MAX_IN_FLIGHT: u64 = 64;

/// `egress.amqp.urgent_lane` unless set: on. In the real-process JANUS lab
/// (4G, PMRFS) it met the `ls` bound at every size with throughput at
/// least the lane-less egress's (docs/scheduling.md, "The urgent lane").
pub const AMQP_URGENT_LANE: bool = true;

/// Upper limit of `egress.amqp.max_in_flight`: RabbitMQ's confirms and
/// weir's memory both grow with the window.
pub const AMQP_MAX_IN_FLIGHT_LIMIT: u64 = 1024;

/// AMQP 0-9-1 short strings (exchange, queue and routing key names) carry
/// a one-byte length.
pub const AMQP_SHORT_STRING_LIMIT: usize = 255;

/// `[egress.amqp]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAmqp {
    pub url: Option<String>,
    pub urls: Option<Vec<String>>,
    pub url_order: Option<String>,
    pub exchange: Option<String>,
    pub exchange_type: Option<String>,
    pub queue: Option<String>,
    pub queue_type: Option<String>,
    pub queue_arguments: Option<toml::Table>,
    pub routing_key: Option<String>,
    pub blocked_failover_after: Option<Written<HumanDuration>>,
    pub confirm_timeout: Option<Written<HumanDuration>>,
    pub connect_timeout: Option<Written<HumanDuration>>,
    pub reconnect_backoff_max: Option<Written<HumanDuration>>,
    pub max_in_flight: Option<Written<Auto<Count>>>,
    pub urgent_lane: Option<bool>,
}

/// `[egress.amqp]`
#[derive(Debug, Clone, PartialEq)]
pub struct AmqpEgress {
    /// `amqp://` or `amqps://` URLs, credentials included: the nodes of
    /// one RabbitMQ cluster (or brokers that share a topology), at least
    /// one (`url` or `urls`).
    pub urls: Vec<String>,
    /// Which endpoint is tried first, and after a failure which next.
    pub url_order: UrlOrder,
    /// Exchange to publish to; empty means the default exchange.
    pub exchange: String,
    /// Type the exchange is declared with.
    pub exchange_type: ExchangeType,
    /// Queue declared and bound to the exchange; empty declares none (the
    /// operator's own bindings route, e.g. to a super stream).
    pub queue: String,
    /// The type the queue is declared with.
    pub queue_type: QueueType,
    /// Further `x-` arguments of the queue declaration, in key order.
    pub queue_arguments: Vec<(String, QueueArgument)>,
    /// Routing key of every publish and of the binding; `{node}` and
    /// `{class}` stand for the node id and the batch's most urgent class
    /// ([`AmqpEgress::routing_key_for`]).
    pub routing_key: String,
    /// With several endpoints, how long a blocked connection is waited on
    /// before moving to the next endpoint.
    pub blocked_failover_after: Duration,
    /// How long to wait for a publisher confirm before retrying.
    pub confirm_timeout: Duration,
    /// How long connecting (TCP, AMQP handshake, channel, declarations)
    /// may take before the attempt counts as failed and is retried.
    pub connect_timeout: Duration,
    /// Longest pause between reconnect attempts.
    pub reconnect_backoff_max: Duration,
    /// Batches published and not yet confirmed, at most (1 = one round
    /// trip per batch).
    pub max_in_flight: usize,
    /// While `max_in_flight` batches await their confirms (or the next is
    /// held back by the pace over the round trip), batches of the most
    /// urgent class alone may still go, up to as many again (the urgent
    /// lane, docs/scheduling.md): that class's records never wait for a
    /// confirm; the window's other batches are paced over the round trip.
    pub urgent_lane: bool,
}

named_enum! {
    /// In which order the endpoints are tried (`egress.amqp.url_order`).
    pub enum UrlOrder {
        /// As listed, first to last, then round again: the first is the
        /// preferred node.
        InOrder = "in_order",
        /// Shuffled once per process, so a fleet spreads over the cluster.
        Shuffle = "shuffle",
    }
}

named_enum! {
    /// The RabbitMQ queue type (`egress.amqp.queue_type`, declared as the
    /// `x-queue-type` argument).
    pub enum QueueType {
        /// A classic queue, on one node. Declared without `x-queue-type`,
        /// as weir always did, so an existing queue stays equivalent.
        Classic = "classic",
        /// A replicated quorum queue (Raft): a confirm means a majority of
        /// the cluster's nodes have it on disk.
        Quorum = "quorum",
        /// A replicated, append-only stream: consumers read from an offset
        /// and may replay.
        Stream = "stream",
    }
}

/// A value of `egress.amqp.queue_arguments`: a TOML scalar, sent as the
/// AMQP field of the same kind.
#[derive(Debug, Clone, PartialEq)]
pub enum QueueArgument {
    /// A TOML integer (AMQP `l`, signed 64-bit).
    Int(i64),
    /// A TOML float (AMQP `d`).
    Float(f64),
    /// A TOML boolean (AMQP `t`).
    Bool(bool),
    /// A TOML string (AMQP `S`).
    Str(String),
}

impl fmt::Display for QueueArgument {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueueArgument::Int(v) => write!(f, "{v}"),
            QueueArgument::Float(v) => write!(f, "{v}"),
            QueueArgument::Bool(v) => write!(f, "{v}"),
            QueueArgument::Str(v) => write!(f, "{v:?}"),
        }
    }
}

/// The placeholders a routing key may hold.
pub const ROUTING_KEY_PLACEHOLDERS: [&str; 2] = ["{node}", "{class}"];

impl AmqpEgress {
    /// The routing key of a batch whose most urgent class is `class`, sent
    /// by `node`: the template with `{node}` and `{class}` filled in.
    pub fn routing_key_for(&self, node: NodeId, class: &str) -> String {
        render_routing_key(&self.routing_key, node, class)
    }

    /// Whether the routing key differs by node or class.
    pub fn routing_key_is_template(&self) -> bool {
        ROUTING_KEY_PLACEHOLDERS
            .iter()
            .any(|p| self.routing_key.contains(p))
    }

    /// The queue's declaration arguments, `x-queue-type` first (none for
    /// a classic queue), as `(name, value)`.
    pub fn declared_arguments(&self) -> Vec<(String, QueueArgument)> {
        let mut args = Vec::with_capacity(self.queue_arguments.len() + 1);
        if self.queue_type != QueueType::Classic {
            args.push((
                "x-queue-type".to_owned(),
                QueueArgument::Str(self.queue_type.to_string()),
            ));
        }
        args.extend(self.queue_arguments.iter().cloned());
        args
    }

    /// The queue's settings as written, for errors: `queue_type = "quorum",
    /// queue_arguments = { x-max-length-bytes = 1000 }`.
    pub fn queue_settings(&self) -> String {
        let mut out = format!("queue_type = \"{}\"", self.queue_type);
        if !self.queue_arguments.is_empty() {
            let args: Vec<String> = self
                .queue_arguments
                .iter()
                .map(|(k, v)| format!("{k} = {v}"))
                .collect();
            out.push_str(&format!(", queue_arguments = {{ {} }}", args.join(", ")));
        }
        out
    }
}

fn render_routing_key(template: &str, node: NodeId, class: &str) -> String {
    template
        .replace("{node}", &node.to_string())
        .replace("{class}", class)
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

/// `[egress.amqp]` checked, or `None` after recording why.
fn amqp_egress(p: &mut Problems, raw: RawAmqp, classes: &[String]) -> Option<AmqpEgress> {
    const PATH: &str = "egress.amqp";
    let before = p.len();
    let urls = match (raw.url, raw.urls) {
        (Some(_), Some(_)) => {
            p.push(
                format!("{PATH}.urls"),
                "give url (one endpoint) or urls (several), not both",
            );
            Vec::new()
        }
        (Some(url), None) => {
            check_url(p, &format!("{PATH}.url"), &url);
            vec![url]
        }
        (None, Some(urls)) => {
            if urls.is_empty() {
                p.push(
                    format!("{PATH}.urls"),
                    "must list at least one amqp:// or amqps:// URL",
                );
            }
            for (i, url) in urls.iter().enumerate() {
                check_url(p, &format!("{PATH}.urls[{i}]"), url);
            }
            urls
        }
        (None, None) => vec![AMQP_URL.to_owned()],
    };
    let url_order = p.choice(
        &format!("{PATH}.url_order"),
        "order",
        raw.url_order,
        UrlOrder::InOrder,
    );
    let queue_type = p.choice(
        &format!("{PATH}.queue_type"),
        "queue type",
        raw.queue_type,
        QueueType::Classic,
    );
    let queue_arguments = queue_arguments(p, raw.queue_arguments.unwrap_or_default());
    let blocked_failover_after = p.positive_duration(
        &format!("{PATH}.blocked_failover_after"),
        raw.blocked_failover_after,
        AMQP_BLOCKED_FAILOVER_AFTER,
    );
    let exchange = raw.exchange.unwrap_or_else(|| AMQP_EXCHANGE.to_owned());
    let exchange = short_string(p, &format!("{PATH}.exchange"), exchange, true);
    let exchange_type = p.choice(
        &format!("{PATH}.exchange_type"),
        "exchange type",
        raw.exchange_type,
        ExchangeType::from_name(AMQP_EXCHANGE_TYPE).expect("the default is a known type"),
    );
    let queue = raw.queue.unwrap_or_else(|| AMQP_QUEUE.to_owned());
    let queue = short_string(p, &format!("{PATH}.queue"), queue, true);
    if queue.as_deref() == Some("") && exchange.as_deref() == Some("") {
        p.push(
            format!("{PATH}.queue"),
            "must not be empty with the default exchange (exchange = \"\"), which routes by queue name; an empty queue declares none and needs a named exchange",
        );
    }
    let routing_key = raw
        .routing_key
        .unwrap_or_else(|| AMQP_ROUTING_KEY.to_owned());
    let routing_key = routing_key_template(p, routing_key, exchange.as_deref(), classes);
    let confirm_timeout = p.positive_duration(
        &format!("{PATH}.confirm_timeout"),
        raw.confirm_timeout,
        AMQP_CONFIRM_TIMEOUT,
    );
    let connect_timeout = p.positive_duration(
        &format!("{PATH}.connect_timeout"),
        raw.connect_timeout,
        AMQP_CONNECT_TIMEOUT,
    );
    let reconnect_backoff_max = p.positive_duration(
        &format!("{PATH}.reconnect_backoff_max"),
        raw.reconnect_backoff_max,
        AMQP_RECONNECT_BACKOFF_MAX,
    );
    let max_in_flight = match p.unit(
        &format!("{PATH}.max_in_flight"),
        raw.max_in_flight,
        Auto::Auto,
    ) {
        Some((Auto::Auto, _)) => AMQP_MAX_IN_FLIGHT,
        Some((Auto::Set(Count(n)), _)) => n,
        // Already a problem: the default stands in for the checks below.
        None => AMQP_MAX_IN_FLIGHT,
    };
    if !(1..=AMQP_MAX_IN_FLIGHT_LIMIT).contains(&max_in_flight) {
        p.push(
            format!("{PATH}.max_in_flight"),
            format!(
                "{max_in_flight} is out of range: between 1 (one batch per confirm round trip) and {AMQP_MAX_IN_FLIGHT_LIMIT}, or \"auto\""
            ),
        );
    }
    if p.len() != before {
        return None;
    }
    Some(AmqpEgress {
        urls,
        url_order: url_order?,
        exchange: exchange?,
        exchange_type: exchange_type?,
        queue: queue?,
        queue_type: queue_type?,
        queue_arguments,
        routing_key: routing_key?,
        blocked_failover_after: blocked_failover_after?,
        confirm_timeout: confirm_timeout?,
        connect_timeout: connect_timeout?,
        reconnect_backoff_max: reconnect_backoff_max?,
        max_in_flight: max_in_flight as usize,
        urgent_lane: raw.urgent_lane.unwrap_or(AMQP_URGENT_LANE),
    })
}

/// An endpoint must be an AMQP URL; it may hold a password, so a problem
/// shows only its scheme.
fn check_url(p: &mut Problems, path: &str, url: &str) {
    if !(url.starts_with("amqp://") || url.starts_with("amqps://")) {
        let scheme = url.split_once("://").map_or("no scheme", |(s, _)| s);
        p.push(
            path,
            format!(
                "must start with amqp:// or amqps:// (found {scheme:?}), e.g. \"amqp://guest:guest@127.0.0.1:5672/%2f\""
            ),
        );
    }
}

/// `egress.amqp.queue_arguments`: scalars only, and not `x-queue-type`
/// (that is `queue_type`).
fn queue_arguments(p: &mut Problems, raw: toml::Table) -> Vec<(String, QueueArgument)> {
    let mut out = Vec::with_capacity(raw.len());
    for (key, value) in raw {
        let path = format!("egress.amqp.queue_arguments.{key}");
        if key == "x-queue-type" {
            p.push(path, "set egress.amqp.queue_type instead");
            continue;
        }
        if key.len() > AMQP_SHORT_STRING_LIMIT {
            p.push(
                path,
                "the name is longer than an AMQP short string (255 bytes)",
            );
            continue;
        }
        let value = match value {
            toml::Value::Integer(v) => QueueArgument::Int(v),
            toml::Value::Float(v) => QueueArgument::Float(v),
            toml::Value::Boolean(v) => QueueArgument::Bool(v),
            toml::Value::String(v) => QueueArgument::Str(v),
            other => {
                p.push(
                    path,
                    format!(
                        "must be an integer, float, boolean or string (found {}), as RabbitMQ's x- arguments are",
                        other.type_str()
                    ),
                );
                continue;
            }
        };
        out.push((key, value));
    }
    out
}

/// `egress.amqp.routing_key`: `{node}` and `{class}` are the only
/// placeholders, and the longest key it renders must fit a short string.
fn routing_key_template(
    p: &mut Problems,
    template: String,
    exchange: Option<&str>,
    classes: &[String],
) -> Option<String> {
    let path = "egress.amqp.routing_key";
    let rest = ROUTING_KEY_PLACEHOLDERS
        .iter()
        .fold(template.clone(), |t, x| t.replace(x, ""));
    if rest.contains(['{', '}']) {
        p.push(
            path,
            format!(
                "{template:?} holds a brace that is not a placeholder; the placeholders are {}",
                ROUTING_KEY_PLACEHOLDERS.join(" and ")
            ),
        );
        return None;
    }
    let is_template = ROUTING_KEY_PLACEHOLDERS
        .iter()
        .any(|x| template.contains(x));
    if is_template && exchange == Some("") {
        p.push(
            path,
            "placeholders need a named exchange: with the default exchange (exchange = \"\") the routing key is the queue's name",
        );
        return None;
    }
    let longest_class = classes
        .iter()
        .max_by_key(|c| c.len())
        .map_or("", String::as_str);
    let longest = render_routing_key(&template, NodeId::MAX, longest_class);
    if longest.len() > AMQP_SHORT_STRING_LIMIT {
        p.push(
            path,
            format!(
                "renders up to {} bytes (node id {} and class {longest_class:?}); AMQP allows at most {AMQP_SHORT_STRING_LIMIT}",
                longest.len(),
                NodeId::MAX
            ),
        );
        return None;
    }
    Some(template)
}

/// A name or id that must not be empty and must fit an AMQP short
/// string; `may_be_empty` for the default exchange.
fn short_string(p: &mut Problems, path: &str, value: String, may_be_empty: bool) -> Option<String> {
    if value.is_empty() && !may_be_empty {
        p.push(path, "must not be empty");
        return None;
    }
    if value.len() > AMQP_SHORT_STRING_LIMIT {
        p.push(
            path,
            format!(
                "is {} bytes long; AMQP allows at most {}",
                value.len(),
                AMQP_SHORT_STRING_LIMIT
            ),
        );
        return None;
    }
    Some(value)
}

/// `[egress.link]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLink {
    pub preset: Option<String>,
    pub bandwidth: Option<Written<Rate>>,
    pub delay: Option<Written<HumanDuration>>,
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

/// `[egress.link]` checked, or `None` after recording why.
fn link(p: &mut Problems, raw: RawLink) -> Option<LinkEmulation> {
    const PATH: &str = "egress.link";
    let presets = LinkPreset::NAMES.join(", ");
    match (raw.preset, raw.bandwidth, raw.delay) {
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
            p.push(PATH, "give either preset or bandwidth and delay, not both");
            None
        }
        (Some(name), None, None) => {
            let preset = LinkPreset::from_name(&name);
            match preset {
                Some(preset) => Some(LinkEmulation {
                    preset: Some(preset),
                    bandwidth_bytes_per_sec: preset.bandwidth_bytes_per_sec(),
                    delay: preset.delay(),
                }),
                None => {
                    p.push(
                        format!("{PATH}.preset"),
                        format!("unknown preset {name:?} (known: {presets})"),
                    );
                    None
                }
            }
        }
        (None, None, None) => {
            p.push(
                PATH,
                format!("give a preset ({presets}) or both bandwidth and delay"),
            );
            None
        }
        (None, Some(_), None) => {
            p.push(
                format!("{PATH}.delay"),
                "missing; with bandwidth give delay too, e.g. delay = \"50ms\"",
            );
            None
        }
        (None, None, Some(_)) => {
            p.push(
                format!("{PATH}.bandwidth"),
                "missing; with delay give bandwidth too, e.g. bandwidth = \"18Mbit/s\"",
            );
            None
        }
        (None, Some(bandwidth), Some(delay)) => {
            let bandwidth = p.positive_rate(&format!("{PATH}.bandwidth"), Some(bandwidth), 0.0);
            let delay = p.duration(&format!("{PATH}.delay"), Some(delay), Duration::ZERO);
            Some(LinkEmulation {
                preset: None,
                bandwidth_bytes_per_sec: bandwidth?,
                delay: delay?,
            })
        }
    }
}
