//! `[egress.kafka]`: deliver batches to a Kafka-protocol service (Apache
//! Kafka, Redpanda, Amazon MSK, Confluent, Azure Event Hubs' Kafka
//! endpoint). As written, its defaults, and its checks.

use std::time::Duration;

use serde::Deserialize;
use weir_core::NodeId;

use super::named::named_enum;
use super::problems::Problems;
use super::tls::ClientFiles;
use super::units::{Auto, Count, HumanDuration, Written};

/// A broker on this machine, Kafka's own port.
pub const KAFKA_BROKER: &str = "127.0.0.1:9092";
/// One topic for every batch.
pub const KAFKA_TOPIC: &str = "weir";
/// Produce requests awaiting their acknowledgement, at most, by default:
/// as the AMQP sink's window.
pub const KAFKA_MAX_IN_FLIGHT: u64 = 64;
/// Upper limit of `egress.kafka.max_in_flight`.
pub const KAFKA_MAX_IN_FLIGHT_LIMIT: u64 = 1024;
/// How long a produce request (with its retries inside the client) may
/// take before the batch counts as failed and the delivery machine
/// retries it.
pub const KAFKA_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connecting (bootstrap, metadata) may take.
pub const KAFKA_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest pause between reconnect attempts: a broker back from a restart
/// is written to again within about this long (a down broker costs one
/// refused connection per attempt).
pub const KAFKA_RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Kafka's own limit on a topic name's length.
pub const KAFKA_TOPIC_LIMIT: usize = 249;
/// The largest Kafka message by default: the brokers' own default limit
/// (`message.max.bytes`, 1,048,588 bytes) rounded down.
pub const KAFKA_MAX_MESSAGE_BYTES: u64 = 1 << 20;
/// What a batch's Kafka record adds to weir's batch body (the record
/// batch header, key, headers), with room to spare.
pub const KAFKA_MESSAGE_OVERHEAD: u64 = 4096;
/// What one record adds inside weir's batch body beyond its MQTT packet
/// or gRPC message (class name, origin, sequence number, times), with
/// room to spare.
pub const RECORD_OVERHEAD: u64 = 1024;
/// Placeholders of `egress.kafka.topic`.
pub const TOPIC_PLACEHOLDERS: [&str; 2] = ["{node}", "{class}"];

/// `[egress.kafka]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawKafka {
    pub brokers: Option<Vec<String>>,
    pub topic: Option<String>,
    pub tls: Option<bool>,
    pub ca_file: Option<String>,
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
    pub sasl_mechanism: Option<String>,
    pub username: Option<String>,
    pub password: Option<String>,
    pub max_in_flight: Option<Written<Auto<Count>>>,
    pub request_timeout: Option<Written<HumanDuration>>,
    pub connect_timeout: Option<Written<HumanDuration>>,
    pub reconnect_backoff_max: Option<Written<HumanDuration>>,
    pub max_message_bytes: Option<Written<super::units::Size>>,
}

/// `[egress.kafka]`
#[derive(Debug, Clone, PartialEq)]
pub struct KafkaEgress {
    /// Bootstrap servers, `host:port`, at least one: the client learns
    /// the rest of the cluster from them.
    pub brokers: Vec<String>,
    /// The topic of every batch; `{node}` and `{class}` stand for the node
    /// id and the batch's most urgent class ([`KafkaEgress::topic_for`]).
    pub topic: String,
    /// TLS to the brokers (`tls = true`, or implied by `ca_file`).
    pub tls: Option<KafkaTls>,
    /// SASL authentication, if any.
    pub sasl: Option<KafkaSasl>,
    /// Produce requests awaiting their acknowledgement, at most.
    pub max_in_flight: usize,
    /// How long a produce request may take before it is retried.
    pub request_timeout: Duration,
    /// How long connecting may take before the attempt counts as failed.
    pub connect_timeout: Duration,
    /// Longest pause between reconnect attempts.
    pub reconnect_backoff_max: Duration,
    /// The largest message the brokers take (their `message.max.bytes`,
    /// or the topic's `max.message.bytes`): batches are cut to fit.
    pub max_message_bytes: u64,
}

impl KafkaEgress {
    /// `brokers` and `topic` with every other setting at its default: no
    /// TLS, no SASL.
    pub fn plain(brokers: Vec<String>, topic: String) -> KafkaEgress {
        KafkaEgress {
            brokers,
            topic,
            tls: None,
            sasl: None,
            max_in_flight: KAFKA_MAX_IN_FLIGHT as usize,
            request_timeout: KAFKA_REQUEST_TIMEOUT,
            connect_timeout: KAFKA_CONNECT_TIMEOUT,
            reconnect_backoff_max: KAFKA_RECONNECT_BACKOFF_MAX,
            max_message_bytes: KAFKA_MAX_MESSAGE_BYTES,
        }
    }

    /// Whether the topic differs by node or class.
    pub fn topic_is_template(&self) -> bool {
        TOPIC_PLACEHOLDERS.iter().any(|p| self.topic.contains(p))
    }

    /// The largest batch body that fits a Kafka message.
    pub fn max_batch_bytes(&self) -> u64 {
        self.max_message_bytes - KAFKA_MESSAGE_OVERHEAD
    }

    /// The largest record (MQTT packet, gRPC message) a batch of its own
    /// can carry.
    pub fn max_record_bytes(&self) -> u64 {
        self.max_batch_bytes() - RECORD_OVERHEAD
    }
}

/// How the brokers' certificates are checked.
#[derive(Debug, Clone, PartialEq)]
pub struct KafkaTls {
    /// The CA file (`None`: the system's CAs, `/etc/ssl/certs`, read at
    /// start-up) and the client certificate (mutual TLS, as Amazon MSK's
    /// TLS authentication takes it).
    pub files: ClientFiles,
}

named_enum! {
    /// SASL mechanism (`egress.kafka.sasl_mechanism`).
    pub enum SaslMechanism {
        /// No SASL: the connection is not authenticated (or TLS alone
        /// authenticates it).
        None = "none",
        /// PLAIN: username and password (Azure Event Hubs: `$ConnectionString`
        /// and the connection string). Use it over TLS only.
        Plain = "plain",
        /// SCRAM-SHA-256 (Amazon MSK, Confluent, Redpanda).
        ScramSha256 = "scram-sha-256",
        /// SCRAM-SHA-512.
        ScramSha512 = "scram-sha-512",
    }
}

/// SASL credentials.
#[derive(Clone, PartialEq)]
pub struct KafkaSasl {
    pub mechanism: SaslMechanism,
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for KafkaSasl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSasl")
            .field("mechanism", &self.mechanism)
            .field("username", &self.username)
            .field("password", &"<hidden>")
            .finish()
    }
}

impl KafkaEgress {
    /// The topic of a batch whose most urgent class is `class`, sent by
    /// `node`.
    pub fn topic_for(&self, node: NodeId, class: &str) -> String {
        render(&self.topic, node, class)
    }
}

fn render(template: &str, node: NodeId, class: &str) -> String {
    template
        .replace("{node}", &node.to_string())
        .replace("{class}", class)
}

/// `[egress.kafka]` checked, or `None` after recording why.
pub(crate) fn kafka_egress(
    p: &mut Problems,
    raw: RawKafka,
    classes: &[String],
) -> Option<KafkaEgress> {
    const PATH: &str = "egress.kafka";
    let before = p.len();
    let brokers = raw.brokers.unwrap_or_else(|| vec![KAFKA_BROKER.to_owned()]);
    if brokers.is_empty() {
        p.push(
            format!("{PATH}.brokers"),
            "must list at least one bootstrap server, host:port",
        );
    }
    for (i, broker) in brokers.iter().enumerate() {
        let port = broker
            .rsplit_once(':')
            .map(|(host, port)| (host, port.parse::<u16>()));
        if !matches!(port, Some((host, Ok(_))) if !host.is_empty()) {
            p.push(
                format!("{PATH}.brokers[{i}]"),
                format!("{broker:?} is not host:port (e.g. \"{KAFKA_BROKER}\")"),
            );
        }
    }
    let topic = topic_template(
        p,
        raw.topic.unwrap_or_else(|| KAFKA_TOPIC.to_owned()),
        classes,
    );
    let files = super::tls::client_files(p, PATH, raw.ca_file, raw.cert_file, raw.key_file);
    let tls = match (raw.tls, files.any()) {
        (Some(false), true) => {
            p.push(
                format!("{PATH}.tls"),
                "false, but ca_file, cert_file or key_file is given; remove one of them",
            );
            None
        }
        (Some(true), _) | (None, true) => Some(KafkaTls { files }),
        (_, false) => None,
    };
    let mechanism = p.choice(
        &format!("{PATH}.sasl_mechanism"),
        "SASL mechanism",
        raw.sasl_mechanism,
        SaslMechanism::None,
    );
    let sasl = match (mechanism, raw.username, raw.password) {
        (Some(SaslMechanism::None), None, None) | (None, _, _) => None,
        (Some(SaslMechanism::None), _, _) => {
            p.push(
                format!("{PATH}.username"),
                "given, but sasl_mechanism is \"none\"; set sasl_mechanism (plain, scram-sha-256, scram-sha-512) or remove username and password",
            );
            None
        }
        (Some(mechanism), Some(username), Some(password)) => Some(KafkaSasl {
            mechanism,
            username,
            password,
        }),
        (Some(mechanism), username, _) => {
            let missing = if username.is_none() {
                "username"
            } else {
                "password"
            };
            p.push(
                format!("{PATH}.{missing}"),
                format!(
                    "missing; sasl_mechanism = {:?} needs a username and a password",
                    mechanism.as_str()
                ),
            );
            None
        }
    };
    if matches!(&sasl, Some(s) if s.mechanism == SaslMechanism::Plain) && tls.is_none() {
        p.push(
            format!("{PATH}.sasl_mechanism"),
            "\"plain\" sends the password in the clear; it needs tls = true",
        );
    }
    let max_in_flight = match p.unit(
        &format!("{PATH}.max_in_flight"),
        raw.max_in_flight,
        Auto::Auto,
    ) {
        Some((Auto::Set(Count(n)), _)) => n,
        _ => KAFKA_MAX_IN_FLIGHT,
    };
    if !(1..=KAFKA_MAX_IN_FLIGHT_LIMIT).contains(&max_in_flight) {
        p.push(
            format!("{PATH}.max_in_flight"),
            format!("{max_in_flight} is out of range: between 1 and {KAFKA_MAX_IN_FLIGHT_LIMIT}, or \"auto\""),
        );
    }
    let request_timeout = p.positive_duration(
        &format!("{PATH}.request_timeout"),
        raw.request_timeout,
        KAFKA_REQUEST_TIMEOUT,
    );
    let connect_timeout = p.positive_duration(
        &format!("{PATH}.connect_timeout"),
        raw.connect_timeout,
        KAFKA_CONNECT_TIMEOUT,
    );
    let reconnect_backoff_max = p.positive_duration(
        &format!("{PATH}.reconnect_backoff_max"),
        raw.reconnect_backoff_max,
        KAFKA_RECONNECT_BACKOFF_MAX,
    );
    let max_message_bytes = p.positive_size_u64(
        &format!("{PATH}.max_message_bytes"),
        raw.max_message_bytes,
        KAFKA_MAX_MESSAGE_BYTES,
        u64::MAX,
    );
    if let Some(m) = max_message_bytes {
        let least = KAFKA_MESSAGE_OVERHEAD + RECORD_OVERHEAD + 1024;
        if m < least {
            p.push(
                format!("{PATH}.max_message_bytes"),
                format!("{m} bytes leaves no room for records: at least {least}"),
            );
        }
    }
    if p.len() != before {
        return None;
    }
    Some(KafkaEgress {
        brokers,
        topic: topic?,
        tls,
        sasl,
        max_in_flight: max_in_flight as usize,
        request_timeout: request_timeout?,
        connect_timeout: connect_timeout?,
        reconnect_backoff_max: reconnect_backoff_max?,
        max_message_bytes: max_message_bytes?,
    })
}

/// The topic template, checked: only the known placeholders, and every
/// name it renders a legal Kafka topic name.
fn topic_template(p: &mut Problems, template: String, classes: &[String]) -> Option<String> {
    let path = "egress.kafka.topic";
    let rest = TOPIC_PLACEHOLDERS
        .iter()
        .fold(template.clone(), |t, x| t.replace(x, ""));
    if rest.contains(['{', '}']) {
        p.push(
            path,
            format!(
                "{template:?} holds a brace that is not a placeholder; the placeholders are {}",
                TOPIC_PLACEHOLDERS.join(" and ")
            ),
        );
        return None;
    }
    let before = p.len();
    let fallback = [String::new()];
    let classes = if classes.is_empty() {
        &fallback[..]
    } else {
        classes
    };
    for class in classes {
        let name = render(&template, NodeId::MAX, class);
        let legal = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        if name.is_empty()
            || name.len() > KAFKA_TOPIC_LIMIT
            || !name.chars().all(legal)
            || name == "."
            || name == ".."
        {
            p.push(
                path,
                format!(
                    "renders {name:?} (class {class:?}), not a Kafka topic name: 1 to {KAFKA_TOPIC_LIMIT} of a-z, A-Z, 0-9, '.', '_' and '-'"
                ),
            );
            break;
        }
    }
    (p.len() == before).then_some(template)
}
