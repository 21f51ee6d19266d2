//! `[egress.mqtt]`: deliver to an MQTT broker (AWS IoT Core, HiveMQ,
//! EMQX, Azure IoT Hub's MQTT, a central Mosquitto). As written, its
//! defaults, and its checks.

use std::time::Duration;

use serde::Deserialize;
use weir_core::NodeId;

use super::ingress::{parse_broker, BrokerAddr};
use super::named::named_enum;
use super::problems::Problems;
use super::tls::ClientFiles;
use super::units::{HumanDuration, Size, Written};

/// A broker on this machine.
pub const MQTT_EGRESS_BROKER: &str = "mqtt://127.0.0.1:1883";
/// The client id weir connects with; `{node}` is the node id.
pub const MQTT_EGRESS_CLIENT_ID: &str = "weir-{node}";
/// Batch mode's topic.
pub const MQTT_EGRESS_TOPIC: &str = "weir/{node}/{class}";
/// AWS IoT Core's limit on a publish's payload.
pub const MQTT_EGRESS_MAX_PAYLOAD: u64 = 128 * 1024;
/// AWS IoT Core's limit on unacknowledged QoS 1 publishes per connection.
pub const MQTT_EGRESS_MAX_IN_FLIGHT: u64 = 100;
/// Upper limit of `egress.mqtt.max_in_flight` (MQTT packet ids).
pub const MQTT_EGRESS_MAX_IN_FLIGHT_LIMIT: u64 = 65_535;
pub const MQTT_EGRESS_KEEP_ALIVE: Duration = Duration::from_secs(30);
pub const MQTT_EGRESS_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
pub const MQTT_EGRESS_CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);
pub const MQTT_EGRESS_RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// What a batch's publish adds around weir's batch body, with room to
/// spare (the topic is counted on its own).
pub const MQTT_BATCH_OVERHEAD: u64 = 1024;

named_enum! {
    /// What one publish carries (`egress.mqtt.mode`).
    pub enum MqttEgressMode {
        /// Each record on its own topic (`topic_prefix` + the record's
        /// MQTT topic or gRPC stream) with its payload as it came: for
        /// consumers that expect per-device topics.
        Records = "records",
        /// A weir batch (`weir.v1.Batch`, compressed or not) on `topic`.
        Batch = "batch",
    }
}

/// `[egress.mqtt]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMqttEgress {
    pub broker: Option<String>,
    pub client_id: Option<String>,
    pub username: Option<String>,
    pub password: Option<String>,
    pub ca_file: Option<String>,
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
    pub mode: Option<String>,
    pub topic_prefix: Option<String>,
    pub topic: Option<String>,
    pub max_payload: Option<Written<Size>>,
    pub max_in_flight: Option<u64>,
    pub keep_alive: Option<Written<HumanDuration>>,
    pub clean_session: Option<bool>,
    pub connect_timeout: Option<Written<HumanDuration>>,
    pub confirm_timeout: Option<Written<HumanDuration>>,
    pub reconnect_backoff_max: Option<Written<HumanDuration>>,
}

/// `[egress.mqtt]`
#[derive(Clone, PartialEq)]
pub struct MqttEgress {
    pub broker: BrokerAddr,
    /// `mqtts://`: TLS to the broker.
    pub tls: bool,
    /// The client id, `{node}` filled in.
    pub client_id: String,
    pub username: Option<String>,
    pub password: Option<String>,
    /// The CA file and the client certificate (mutual TLS).
    pub files: ClientFiles,
    pub mode: MqttEgressMode,
    /// Records mode: put before each record's topic.
    pub topic_prefix: String,
    /// Batch mode: the topic, `{node}` and `{class}` filled in per batch.
    pub topic: String,
    /// The largest payload the broker takes: batches are cut to fit, and
    /// a record must fit alone.
    pub max_payload: u64,
    /// Unacknowledged QoS 1 publishes at once.
    pub max_in_flight: usize,
    pub keep_alive: Duration,
    /// Start a new session on every connection (`false`: a persistent
    /// one).
    pub clean_session: bool,
    pub connect_timeout: Duration,
    /// How long a publish may wait for its PUBACK before the batch is
    /// retried.
    pub confirm_timeout: Duration,
    pub reconnect_backoff_max: Duration,
}

impl std::fmt::Debug for MqttEgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MqttEgress")
            .field("broker", &self.broker)
            .field("tls", &self.tls)
            .field("client_id", &self.client_id)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<hidden>"))
            .field("mode", &self.mode)
            .field("topic_prefix", &self.topic_prefix)
            .field("topic", &self.topic)
            .field("max_payload", &self.max_payload)
            .field("max_in_flight", &self.max_in_flight)
            .finish_non_exhaustive()
    }
}

impl MqttEgress {
    /// Batch mode's topic for a batch of `class` from `node`.
    pub fn topic_for(&self, node: NodeId, class: &str) -> String {
        self.topic
            .replace("{node}", &node.to_string())
            .replace("{class}", class)
    }

    /// The largest batch body one publish carries (batch mode).
    pub fn max_batch_bytes(&self) -> u64 {
        self.max_payload.saturating_sub(MQTT_BATCH_OVERHEAD)
    }

    /// The largest record (MQTT packet, gRPC message) one publish carries.
    pub fn max_record_bytes(&self) -> u64 {
        match self.mode {
            // The record's payload alone is published; its topic is
            // counted by the ingress limit together with it.
            MqttEgressMode::Records => self.max_payload,
            MqttEgressMode::Batch => self
                .max_batch_bytes()
                .saturating_sub(super::kafka::RECORD_OVERHEAD),
        }
    }
}

/// `[egress.mqtt]` checked, or `None` after recording why.
pub(crate) fn mqtt_egress(
    p: &mut Problems,
    raw: RawMqttEgress,
    node: NodeId,
) -> Option<MqttEgress> {
    const PATH: &str = "egress.mqtt";
    let before = p.len();
    let url = raw.broker.unwrap_or_else(|| MQTT_EGRESS_BROKER.to_owned());
    let (tls, rest, port) = match url.split_once("://") {
        Some(("mqtt", rest)) => (false, rest, 1883),
        Some(("mqtts", rest)) => (true, rest, 8883),
        _ => {
            p.push(
                format!("{PATH}.broker"),
                format!("{url:?}: give mqtt://host[:port] or mqtts://host[:port]"),
            );
            (false, "", 1883)
        }
    };
    // The port is optional: the scheme's own.
    let broker = if rest.is_empty() {
        None
    } else {
        match parse_broker(rest)
            .or_else(|first| parse_broker(&format!("{rest}:{port}")).map_err(|_| first))
        {
            Ok(b) => Some(b),
            Err(why) => {
                p.push(format!("{PATH}.broker"), format!("{url:?}: {why}"));
                None
            }
        }
    };
    let client_id = raw
        .client_id
        .unwrap_or_else(|| MQTT_EGRESS_CLIENT_ID.to_owned())
        .replace("{node}", &node.to_string());
    if client_id.is_empty() {
        p.push(format!("{PATH}.client_id"), "must not be empty");
    }
    if raw.password.is_some() && raw.username.is_none() {
        p.push(format!("{PATH}.password"), "given without a username");
    }
    let files = super::tls::client_files(p, PATH, raw.ca_file, raw.cert_file, raw.key_file);
    if !tls && files.any() {
        p.push(
            format!("{PATH}.broker"),
            "ca_file, cert_file and key_file are for TLS: use an mqtts:// broker",
        );
    }
    if !tls && raw.password.is_some() && broker.as_ref().is_some_and(|b| !is_loopback(&b.host)) {
        p.push(
            format!("{PATH}.password"),
            "would go to another host in the clear: use an mqtts:// broker",
        );
    }
    let mode = p.choice(
        &format!("{PATH}.mode"),
        "mode",
        raw.mode,
        MqttEgressMode::Records,
    );
    let topic_prefix = raw.topic_prefix.unwrap_or_default();
    if topic_prefix.contains(['+', '#', '\0']) {
        p.push(
            format!("{PATH}.topic_prefix"),
            format!("{topic_prefix:?}: a topic may hold no wildcard (+, #) or NUL"),
        );
    }
    let topic = raw.topic.unwrap_or_else(|| MQTT_EGRESS_TOPIC.to_owned());
    let rest = ["{node}", "{class}"]
        .iter()
        .fold(topic.clone(), |t, x| t.replace(x, ""));
    if topic.is_empty() || rest.contains(['+', '#', '\0', '{', '}']) {
        p.push(
            format!("{PATH}.topic"),
            format!("{topic:?}: a topic, not empty, with no wildcard (+, #); the placeholders are {{node}} and {{class}}"),
        );
    }
    let max_payload = p.positive_size_u64(
        &format!("{PATH}.max_payload"),
        raw.max_payload,
        MQTT_EGRESS_MAX_PAYLOAD,
        256 << 20,
    );
    if max_payload.is_some_and(|m| m < 4 * MQTT_BATCH_OVERHEAD) {
        p.push(
            format!("{PATH}.max_payload"),
            format!("at least {}", 4 * MQTT_BATCH_OVERHEAD),
        );
    }
    let max_in_flight = raw.max_in_flight.unwrap_or(MQTT_EGRESS_MAX_IN_FLIGHT);
    if !(1..=MQTT_EGRESS_MAX_IN_FLIGHT_LIMIT).contains(&max_in_flight) {
        p.push(
            format!("{PATH}.max_in_flight"),
            format!(
                "{max_in_flight} is out of range: between 1 and {MQTT_EGRESS_MAX_IN_FLIGHT_LIMIT}"
            ),
        );
    }
    let keep_alive = p.positive_duration(
        &format!("{PATH}.keep_alive"),
        raw.keep_alive,
        MQTT_EGRESS_KEEP_ALIVE,
    );
    let connect_timeout = p.positive_duration(
        &format!("{PATH}.connect_timeout"),
        raw.connect_timeout,
        MQTT_EGRESS_CONNECT_TIMEOUT,
    );
    let confirm_timeout = p.positive_duration(
        &format!("{PATH}.confirm_timeout"),
        raw.confirm_timeout,
        MQTT_EGRESS_CONFIRM_TIMEOUT,
    );
    let reconnect_backoff_max = p.positive_duration(
        &format!("{PATH}.reconnect_backoff_max"),
        raw.reconnect_backoff_max,
        MQTT_EGRESS_RECONNECT_BACKOFF_MAX,
    );
    if p.len() != before {
        return None;
    }
    Some(MqttEgress {
        broker: broker?,
        tls,
        client_id,
        username: raw.username,
        password: raw.password,
        files,
        mode: mode?,
        topic_prefix,
        topic,
        max_payload: max_payload?,
        max_in_flight: max_in_flight as usize,
        keep_alive: keep_alive?,
        clean_session: raw.clean_session.unwrap_or(false),
        connect_timeout: connect_timeout?,
        confirm_timeout: confirm_timeout?,
        reconnect_backoff_max: reconnect_backoff_max?,
    })
}

fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}
