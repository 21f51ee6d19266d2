//! weir's configuration: a TOML file, parsed into raw types, then validated
//! into checked types with every problem collected and reported together,
//! each under its key path (`class[1].bound: "0ms" must be greater than
//! zero`).
//!
//! Every key is optional; an empty file gives the defaults, which
//! `config/default.toml` spells out and [`DEFAULT_CONFIG`] embeds. Unknown
//! keys are refused, so a typo never silently falls back to a default.
//!
//! # Layout
//! One file per section (or small group of sections), each holding the
//! section as written (serde, `deny_unknown_fields`), its defaults (each
//! with why it has that value), its checked type (what the rest of weir
//! reads) and the function that turns the one into the other, collecting
//! every problem:
//! - `node.rs`: `[node]`.
//! - `classes.rs`: `[[class]]` and `[classify]`.
//! - `scheduler.rs`: `[scheduler]`, `[batching]` and `[compression]`.
//! - `ingress.rs`: `[ingress.mqtt]` and `[ingress.grpc]`.
//! - `tls.rs`: the TLS tables, and the rule that a listener other hosts
//!   can reach authenticates its clients.
//! - `egress.rs`: `[egress]` with its file, amqp and link tables;
//!   `kafka.rs`: `[egress.kafka]`.
//! - `peering.rs`: `[peering]`.
//! - `spool.rs`: `[spool]` and the per-class durability keys.
//! - `admin.rs`, `log.rs`: `[admin]`, `[log]`.
//!
//! Beside them, used by the sections and never using them:
//! - `problems.rs`: [`Problem`] and the collector sections report to.
//! - `named.rs`: values chosen by name, and the macro declaring their enums.
//! - `units.rs`: [`HumanDuration`], [`Size`] and [`Rate`] in human units.
//!
//! And on top of them: this file composes the whole ([`Config`], [`parse`],
//! [`load`], and the checks across sections), `defaults.rs` gathers every
//! default under [`defaults`], `error.rs` holds [`ConfigError`], and
//! `tests.rs` checks that the shipped examples parse and that errors name
//! their keys.
//!
//! A new section is one more file, one more field on `RawConfig` and
//! [`Config`], and one more line in `validate`.

mod admin;
mod classes;
pub mod defaults;
mod egress;
mod error;
mod ingress;
mod kafka;
mod log;
mod mqtt_egress;
mod named;
mod node;
mod peering;
mod problems;
pub mod reload;
mod scheduler;
mod spool;
mod tls;
pub mod units;

#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::path::Path;

use serde::Deserialize;
use weir_core::class::{ClassId, ClassSet};
use weir_core::classify::Classifier;
use weir_core::queueing::queue::QueueCapacity;

pub use admin::AdminConfig;
pub use egress::{
    AmqpEgress, EgressConfig, EgressSink, ExchangeType, FileEgress, LinkEmulation, LinkPreset,
    QueueArgument, QueueType, UrlOrder, AMQP_QUEUE, AMQP_URGENT_LANE, AMQP_URL,
    ROUTING_KEY_PLACEHOLDERS,
};
pub use error::{ConfigError, Location};
pub use ingress::{
    BrokerAddr, GrpcAuth, GrpcIngress, IngressConfig, MqttAuth, MqttIngress, MqttLimits,
    MqttListen, MqttMode, MqttSubscribe, MqttTls, Qos0WhenFull, SubscribeQos,
};
pub use kafka::{KafkaEgress, KafkaSasl, KafkaTls, SaslMechanism, KAFKA_BROKER, KAFKA_TOPIC};
pub use log::{LogConfig, LogFormat};
pub use mqtt_egress::{MqttEgress, MqttEgressMode};
pub use node::{CpuPriority, MemoryLimit, NodeConfig};
pub use peering::{Adverts, PeerConfig, PeeringConfig};
pub use problems::Problem;
pub use scheduler::{
    BatchingSection, CompressionSection, PayloadKind, SchedulerConfig, SchemeName,
};
pub use spool::{ClassDurability, Durability, OnFull, SpoolConfig, SyncMode};
pub use tls::{ClientFiles, TlsFiles};
pub use units::{HumanDuration, Rate, Size, UnitError};

use admin::RawAdmin;
use classes::{RawClass, RawClassify};
use egress::RawEgress;
use ingress::RawIngress;
use log::RawLog;
use node::RawNode;
use peering::RawPeering;
use problems::Problems;
use scheduler::{RawBatching, RawCompression, RawScheduler};
use spool::RawSpool;

/// The shipped default configuration, the file weir documents its keys in.
pub const DEFAULT_CONFIG: &str = include_str!("../../../../config/default.toml");

/// Reads and validates the config file at `path`.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    load_text(path).map(|(config, _)| config)
}

/// [`load`], with the text it read (a reload compares texts to name the
/// keys that changed).
pub fn load_text(path: &Path) -> Result<(Config, String), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: path.to_owned(),
        source,
    })?;
    let config = parse(&text, &path.display().to_string())?;
    Ok((config, text))
}

/// Parses and validates config `text`; `origin` (a file name, or something
/// like `"<default>"`) is named in TOML errors.
pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
    let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Toml {
        origin: origin.to_owned(),
        location: e.span().map(|span| Location::of(text, span.start)),
        message: e.message().trim_end().to_owned(),
    })?;
    validate(raw).map_err(ConfigError::Invalid)
}

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    node: RawNode,
    /// `[[class]]`; `None` when absent (the JANUS defaults apply).
    class: Option<Vec<RawClass>>,
    #[serde(default)]
    classify: RawClassify,
    #[serde(default)]
    scheduler: RawScheduler,
    #[serde(default)]
    batching: RawBatching,
    #[serde(default)]
    compression: RawCompression,
    #[serde(default)]
    ingress: RawIngress,
    #[serde(default)]
    egress: RawEgress,
    #[serde(default)]
    spool: RawSpool,
    #[serde(default)]
    admin: RawAdmin,
    #[serde(default)]
    peering: RawPeering,
    #[serde(default)]
    log: RawLog,
}

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
    /// Durability per class, indexed by [`ClassId::index`].
    pub durability: Vec<ClassDurability>,
    /// `[spool]`: where spooled classes keep their records.
    pub spool: SpoolConfig,
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

    /// Whether any class keeps its records in the spool.
    pub fn spooled(&self) -> bool {
        self.durability.iter().any(ClassDurability::spooled)
    }

    /// The memory queue capacity of each class: a spooled class holds at
    /// most `spool.window_bytes` in memory, the rest waits on disk, and at
    /// most one record per [`SPOOL_WINDOW_BYTES_PER_SLOT`] of that window
    /// (a queued record costs about 120 bytes beside its key and payload).
    pub fn memory_capacities(&self) -> Vec<QueueCapacity> {
        self.capacities
            .iter()
            .zip(&self.durability)
            .map(|(c, d)| match d.spooled() {
                true => QueueCapacity {
                    records: c
                        .records
                        .min((self.spool.window_bytes / SPOOL_WINDOW_BYTES_PER_SLOT) as usize)
                        .max(1),
                    bytes: c.bytes.min(self.spool.window_bytes as usize),
                },
                false => *c,
            })
            .collect()
    }
}

/// A spooled class holds in memory at most one record per this many bytes
/// of `spool.window_bytes` (16,384 records for the default 8 MiB): enough
/// for records of 512 bytes and more to fill the window; smaller records
/// keep fewer bytes in memory, the rest waits on disk.
pub const SPOOL_WINDOW_BYTES_PER_SLOT: u64 = 512;

/// Checks `raw`, returning the config or every problem found.
fn validate(raw: RawConfig) -> Result<Config, Vec<Problem>> {
    let mut p = Problems::default();
    let node = node::node(&mut p, raw.node);
    let node_id = node.as_ref().map_or(node::NODE_ID, |n| n.id);
    let classes = classes::classes(&mut p, raw.class);
    let classifier = classes::classify(&mut p, raw.classify, &classes.names);
    let sizes_given = SizesGiven {
        mqtt_packet: raw.ingress.mqtt.max_packet_size.is_some(),
        grpc_message: raw.ingress.grpc.max_message_size.is_some(),
    };
    let mut scheduler = scheduler::scheduler(&mut p, raw.scheduler, &classes.bounds);
    let batching = scheduler::batching(&mut p, raw.batching);
    let compression = scheduler::compression(&mut p, raw.compression);
    let mut ingress = ingress::ingress(&mut p, raw.ingress, node_id);
    let egress = egress::egress(&mut p, raw.egress, &classes.names, node_id);
    if let Some(fit) = egress.as_ref().and_then(|e| MessageFit::of(&e.sink)) {
        fit_message(
            &mut p,
            &fit,
            sizes_given,
            ingress.as_mut(),
            scheduler.as_mut(),
        );
    }
    let spool = spool::spool(&mut p, raw.spool);
    let admin = admin::admin(&mut p, raw.admin);
    let peering = peering::peering(&mut p, raw.peering, node_id);
    let log = log::log(&mut p, raw.log);
    if let Some(ingress) = &ingress {
        // A spooled class holds only `spool.window_bytes` in memory.
        let memory: Vec<(String, usize)> = classes
            .capacity_bytes
            .iter()
            .enumerate()
            .map(|(i, (name, bytes))| {
                let spooled = classes
                    .durability
                    .as_ref()
                    .and_then(|d| d.get(i))
                    .is_some_and(ClassDurability::spooled);
                match (&spool, spooled) {
                    (Some(s), true) => (name.clone(), (*bytes).min(s.window_bytes as usize)),
                    _ => (name.clone(), *bytes),
                }
            })
            .collect();
        check_record_fits(&mut p, ingress, &memory);
    }
    if let (Some(ingress), Some(admin)) = (&ingress, &admin) {
        let peering = peering.as_ref().and_then(Option::as_ref);
        check_listeners(&mut p, ingress, admin, peering);
    }
    match (
        node,
        classes.set,
        classes.capacities,
        classifier,
        scheduler,
        (batching, compression, peering),
        ingress,
        egress,
        (spool, classes.durability),
        admin,
        log,
    ) {
        (
            Some(node),
            Some(classes),
            Some(capacities),
            Some(classifier),
            Some(scheduler),
            (Some(batching), Some(compression), Some(peering)),
            Some(ingress),
            Some(egress),
            (Some(spool), Some(durability)),
            Some(admin),
            Some(log),
        ) if p.0.is_empty() => Ok(Config {
            node,
            classes,
            capacities,
            classifier,
            scheduler,
            batching,
            compression,
            ingress,
            egress,
            durability,
            spool,
            admin,
            peering,
            log,
        }),
        _ => {
            debug_assert!(!p.0.is_empty(), "a section failed without saying why");
            Err(p.0)
        }
    }
}

/// Which record size limits the config file sets itself.
#[derive(Debug, Clone, Copy)]
struct SizesGiven {
    mqtt_packet: bool,
    grpc_message: bool,
}

/// What one message of a sink with a size limit carries.
struct MessageFit {
    /// The key that sets the limit, and the limit.
    key: &'static str,
    limit: u64,
    /// The largest batch body, and the largest record.
    batch: u64,
    record: u64,
}

impl MessageFit {
    fn of(sink: &EgressSink) -> Option<MessageFit> {
        match sink {
            EgressSink::Kafka(k) => Some(MessageFit {
                key: "egress.kafka.max_message_bytes",
                limit: k.max_message_bytes,
                batch: k.max_batch_bytes(),
                record: k.max_record_bytes(),
            }),
            EgressSink::Mqtt(m) => Some(MessageFit {
                key: "egress.mqtt.max_payload",
                limit: m.max_payload,
                batch: m.max_batch_bytes(),
                record: m.max_record_bytes(),
            }),
            EgressSink::File(_) | EgressSink::Amqp(_) => None,
        }
    }
}

/// Batches and records fit one message of a sink with a size limit (Kafka,
/// MQTT): the batch cap is lowered to what a message holds, and so are the
/// ingress limits the file leaves at their defaults; a limit the file sets
/// higher is a problem (such a record could never be delivered).
fn fit_message(
    p: &mut Problems,
    fit: &MessageFit,
    given: SizesGiven,
    ingress: Option<&mut IngressConfig>,
    scheduler: Option<&mut SchedulerConfig>,
) {
    let (batch, record) = (fit.batch as usize, fit.record as usize);
    let raise = format!("lower it, or raise {} and the broker's own limit", fit.key);
    if let Some(s) = scheduler {
        if s.max_batch_bytes > batch && s.max_batch_bytes as u64 != scheduler::MAX_BATCH_BYTES {
            p.push(
                "scheduler.max_batch_bytes",
                format!(
                    "{} is larger than one message holds ({} {} less the message's own fields); {raise}",
                    Size(s.max_batch_bytes as u64),
                    fit.key,
                    Size(fit.limit),
                ),
            );
        }
        s.max_batch_bytes = s.max_batch_bytes.min(batch);
    }
    let Some(ingress) = ingress else { return };
    let limits = [
        (
            "ingress.mqtt.max_packet_size",
            given.mqtt_packet,
            ingress.mqtt.as_mut().map(|m| &mut m.max_packet_size),
        ),
        (
            "ingress.grpc.max_message_size",
            given.grpc_message,
            ingress.grpc.as_mut().map(|g| &mut g.max_message_size),
        ),
    ];
    for (path, given, limit) in limits {
        let Some(limit) = limit else { continue };
        if *limit > record && given {
            p.push(
                path,
                format!(
                    "{} is larger than a record one message can carry ({}: {} {} less the message's own fields); {raise}",
                    Size(*limit as u64),
                    Size(record as u64),
                    fit.key,
                    Size(fit.limit),
                ),
            );
        }
        *limit = (*limit).min(record);
    }
}

/// A record as large as an ingress accepts must fit every class queue, or
/// it is refused as oversized however empty the queue is.
fn check_record_fits(p: &mut Problems, ingress: &IngressConfig, capacities: &[(String, usize)]) {
    let Some((class, smallest)) = capacities.iter().min_by_key(|(_, bytes)| *bytes) else {
        return;
    };
    let limits = [
        (
            "ingress.mqtt.max_packet_size",
            ingress.mqtt.as_ref().map(|m| m.max_packet_size),
        ),
        (
            "ingress.grpc.max_message_size",
            ingress.grpc.as_ref().map(|g| g.max_message_size),
        ),
    ];
    for (path, limit) in limits {
        if let Some(limit) = limit.filter(|limit| limit > smallest) {
            p.push(
                path,
                format!(
                    "{} is larger than the memory capacity of class {class:?} ({}) (its capacity_bytes, or spool.window_bytes if it is spooled); a record that large could never be queued; lower this or raise the capacity",
                    Size(limit as u64),
                    Size(*smallest as u64),
                ),
            );
        }
    }
}

/// Two enabled listeners on one port (port 0 picks a free one, so never
/// conflicts).
fn check_listeners(
    p: &mut Problems,
    ingress: &IngressConfig,
    admin: &AdminConfig,
    peering: Option<&PeeringConfig>,
) {
    let mqtt = ingress.mqtt.as_ref().and_then(|m| match &m.mode {
        MqttMode::Listen(l) => Some(l),
        MqttMode::Subscribe(_) => None,
    });
    let listeners = [
        ("ingress.mqtt.listen", mqtt.and_then(|l| l.addr)),
        (
            "ingress.mqtt.tls.listen",
            mqtt.and_then(|l| l.tls.as_ref().map(|t| t.listen)),
        ),
        (
            "ingress.grpc.listen",
            ingress.grpc.as_ref().map(|g| g.listen),
        ),
        ("admin.listen", admin.listen),
        ("peering.listen", peering.map(|p| p.listen)),
    ];
    let listeners: Vec<(&str, SocketAddr)> = listeners
        .into_iter()
        .filter_map(|(path, addr)| addr.map(|a| (path, a)))
        .filter(|(_, addr)| addr.port() != 0)
        .collect();
    for (i, (path, addr)) in listeners.iter().enumerate() {
        let clash = listeners[..i].iter().find(|(_, other)| {
            other.port() == addr.port()
                && other.is_ipv4() == addr.is_ipv4()
                && (other.ip() == addr.ip()
                    || other.ip().is_unspecified()
                    || addr.ip().is_unspecified())
        });
        if let Some((other_path, other)) = clash {
            p.push(
                *path,
                format!(
                    "{addr} clashes with {other_path} ({other}); give each listener its own port"
                ),
            );
        }
    }
}
