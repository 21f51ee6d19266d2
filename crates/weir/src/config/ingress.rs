//! `[ingress]`: where records come from. `[ingress.mqtt]` in listen mode
//! (weir is the devices' broker) or subscribe mode (weir subscribes to a
//! broker), and `[ingress.grpc]`: as written, their defaults, checked, and
//! their validation. Also the `host:port` of a broker ([`BrokerAddr`]),
//! which peering uses for its peers too.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use weir_core::classify::TopicFilter;

use super::named::named_enum;
use super::problems::Problems;
use super::tls::{check_exposed, tls, Extra, RawTls, TlsFiles};
use super::units::{HumanDuration, Size, Written};

/// Every ingress is on unless switched off: a new box accepts data at once.
pub const INGRESS_ENABLED: bool = true;

/// `[ingress]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawIngress {
    #[serde(default)]
    pub mqtt: RawMqtt,
    #[serde(default)]
    pub grpc: RawGrpc,
}

/// `[ingress]`: each ingress is `None` when disabled; at least one is on.
#[derive(Debug, Clone, PartialEq)]
pub struct IngressConfig {
    /// `[ingress.mqtt]`
    pub mqtt: Option<MqttIngress>,
    /// `[ingress.grpc]`
    pub grpc: Option<GrpcIngress>,
}

/// `[ingress]` checked, or `None` after recording why; `node_id` makes
/// the default MQTT client id.
pub(crate) fn ingress(p: &mut Problems, raw: RawIngress, node_id: u64) -> Option<IngressConfig> {
    let mqtt = mqtt(p, raw.mqtt, node_id);
    let grpc = grpc(p, raw.grpc);
    let (mqtt, grpc) = (mqtt?, grpc?);
    if mqtt.is_none() && grpc.is_none() {
        p.push(
            "ingress",
            "both ingress.mqtt and ingress.grpc are disabled; enable at least one",
        );
        return None;
    }
    Some(IngressConfig { mqtt, grpc })
}

/// Listen mode: weir is the devices' broker, no extra hop.
pub const MQTT_MODE: &str = "listen";

/// The IANA MQTT port, on loopback only: with no authentication
/// configured nothing else may reach it (as Mosquitto 2.0 decided). Listen
/// on another interface once `password_file` (or client certificates) or
/// an explicit `allow_anonymous = true` says who may connect.
pub const MQTT_LISTEN: &str = "127.0.0.1:1883";

/// `listen` (and `tls.listen`) value that turns that listener off.
pub const LISTEN_OFF: &str = "off";

/// The conventional MQTT-over-TLS port, on loopback unless configured
/// otherwise, like the plain listener.
pub const MQTT_TLS_LISTEN: &str = "127.0.0.1:8883";

/// A Mosquitto on the same box, the usual subscribe-mode setup.
pub const MQTT_BROKER: &str = "127.0.0.1:1883";

/// Subscribe mode relays everything the broker carries unless told
/// otherwise (`#` does not match `$SYS`).
pub const MQTT_TOPICS: &[&str] = &["#"];

/// At-least-once: a record the broker handed over is acknowledged only once
/// queued, so a weir restart loses nothing.
pub const MQTT_QOS: SubscribeQos = SubscribeQos::AtLeastOnce;

/// 1 MiB is ample for sensor records and bounds what one client can make
/// weir buffer for a single packet.
pub const MQTT_MAX_PACKET_SIZE: u64 = 1024 * 1024;

/// MQTT's own limit: a remaining length of at most 268 435 455 bytes plus a
/// fixed header of at most 5 (MQTT 3.1.1 section 2.2.3).
pub const MQTT_MAX_PACKET_LIMIT: u64 = 268_435_455 + 5;

/// Devices one box serves: a factory line has hundreds; each connection
/// costs a task and a 16 KiB read buffer, so 4,096 stay within tens of MiB
/// on a Pi. Beyond it a client gets CONNACK "server unavailable".
pub const MQTT_MAX_CONNECTIONS: u64 = 4096;

/// Publishes (QoS 1 and 2) one client may have unacknowledged: announced as
/// MQTT 5's receive maximum; beyond it weir stops reading the client until
/// acknowledgements go out. QoS 2 ids awaiting PUBREL beyond it close the
/// connection. Far above what a device needs, small enough to bound what
/// one client holds.
pub const MQTT_MAX_INFLIGHT: u64 = 1024;

/// MQTT's own bound on the receive maximum.
pub const MQTT_MAX_INFLIGHT_LIMIT: u64 = 65_535;

/// How long a new connection may take to finish its TLS handshake and send
/// CONNECT: generous for a slow cellular link, short enough that idle
/// sockets (slowloris) do not pile up.
pub const MQTT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Back-pressure rather than loss, even for QoS 0: weir never drops a record
/// unless the operator says so.
pub const QOS0_WHEN_FULL: Qos0WhenFull = Qos0WhenFull::Block;

/// `[ingress.mqtt]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMqtt {
    pub enabled: Option<bool>,
    pub mode: Option<String>,
    pub listen: Option<String>,
    pub broker: Option<String>,
    pub client_id: Option<String>,
    pub topics: Option<Vec<String>>,
    /// Signed so that any integer reaches validation and its message.
    pub qos: Option<i64>,
    pub max_packet_size: Option<Written<Size>>,
    pub qos0_when_full: Option<String>,
    pub max_connections: Option<i64>,
    pub max_inflight: Option<i64>,
    pub connect_timeout: Option<Written<HumanDuration>>,
    pub allow_anonymous: Option<bool>,
    pub password_file: Option<PathBuf>,
    pub acl_file: Option<PathBuf>,
    pub tls: Option<RawTls>,
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
    /// Limits against hostile or broken clients (listen mode).
    pub limits: MqttLimits,
}

/// Limits on what MQTT clients can make weir hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MqttLimits {
    /// Open connections at once; more are refused with CONNACK "server
    /// unavailable" (3.1.1) / "server busy" (MQTT 5).
    pub max_connections: usize,
    /// Unacknowledged QoS 1/2 publishes per client (MQTT 5 receive
    /// maximum).
    pub max_inflight: usize,
    /// Time from accepting a connection to its CONNECT (TLS handshake
    /// included).
    pub connect_timeout: Duration,
}

impl Default for MqttLimits {
    fn default() -> Self {
        MqttLimits {
            max_connections: MQTT_MAX_CONNECTIONS as usize,
            max_inflight: MQTT_MAX_INFLIGHT as usize,
            connect_timeout: MQTT_CONNECT_TIMEOUT,
        }
    }
}

/// How weir gets MQTT traffic.
#[derive(Debug, Clone, PartialEq)]
pub enum MqttMode {
    /// Devices connect to weir, which speaks the broker side of MQTT 3.1.1
    /// and 5.
    Listen(MqttListen),
    /// weir connects to an existing broker and subscribes.
    Subscribe(MqttSubscribe),
}

/// Listen-mode settings: where, over what, and who may publish what.
#[derive(Debug, Clone, PartialEq)]
pub struct MqttListen {
    /// Plain TCP address; `None` when `listen = "off"` (TLS only).
    pub addr: Option<SocketAddr>,
    /// MQTT over TLS, beside or instead of plain TCP.
    pub tls: Option<MqttTls>,
    /// Who may connect and publish.
    pub auth: MqttAuth,
}

impl MqttListen {
    /// Plain TCP on `addr`, anyone may connect (tests, loopback).
    pub fn plain(addr: SocketAddr) -> Self {
        MqttListen {
            addr: Some(addr),
            tls: None,
            auth: MqttAuth {
                allow_anonymous: true,
                password_file: None,
                acl_file: None,
            },
        }
    }
}

/// `[ingress.mqtt.tls]`
#[derive(Debug, Clone, PartialEq)]
pub struct MqttTls {
    /// Address to accept MQTT-over-TLS connections on.
    pub listen: SocketAddr,
    /// Certificate, key, and the CA that client certificates chain to.
    pub files: TlsFiles,
    /// The client certificate's subject CN is the username (the password
    /// file is then not consulted on this listener).
    pub use_identity_as_username: bool,
}

/// Authentication and authorisation of MQTT clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MqttAuth {
    /// Clients without a username (or certificate identity) may connect.
    pub allow_anonymous: bool,
    /// Users and password hashes, as `mosquitto_passwd` writes them.
    pub password_file: Option<PathBuf>,
    /// Topic ACLs in Mosquitto's `acl_file` format; without one every
    /// connected client may publish to any topic.
    pub acl_file: Option<PathBuf>,
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

/// `[ingress.mqtt]` checked, or `None` after recording why.
///
/// `Some(None)` when valid but disabled.
fn mqtt(p: &mut Problems, raw: RawMqtt, node_id: u64) -> Option<Option<MqttIngress>> {
    const PATH: &str = "ingress.mqtt";
    let before = p.len();
    let enabled = raw.enabled.unwrap_or(INGRESS_ENABLED);
    let mode = raw.mode.as_deref().unwrap_or(MQTT_MODE);
    let mode = match mode {
        "listen" => {
            let subscribe_only = [
                ("broker", raw.broker.is_some()),
                ("client_id", raw.client_id.is_some()),
                ("topics", raw.topics.is_some()),
                ("qos", raw.qos.is_some()),
            ];
            for (key, _) in subscribe_only.iter().filter(|(_, given)| *given) {
                p.push(
                    format!("{PATH}.{key}"),
                    "only used when mode = \"subscribe\"; remove it or set ingress.mqtt.mode = \"subscribe\"",
                );
            }
            listen(
                p,
                raw.listen,
                raw.tls,
                raw.allow_anonymous,
                raw.password_file,
                raw.acl_file,
            )
            .map(MqttMode::Listen)
        }
        "subscribe" => {
            let listen_only = [
                ("listen", raw.listen.is_some()),
                ("tls", raw.tls.is_some()),
                ("allow_anonymous", raw.allow_anonymous.is_some()),
                ("password_file", raw.password_file.is_some()),
                ("acl_file", raw.acl_file.is_some()),
            ];
            for (key, _) in listen_only.iter().filter(|(_, given)| *given) {
                p.push(
                    format!("{PATH}.{key}"),
                    "only used when mode = \"listen\"; remove it or set ingress.mqtt.mode = \"listen\"",
                );
            }
            subscribe(p, raw.broker, raw.client_id, raw.topics, raw.qos, node_id)
                .map(MqttMode::Subscribe)
        }
        other => {
            p.push(
                format!("{PATH}.mode"),
                format!("unknown mode {other:?} (known: listen, subscribe)"),
            );
            None
        }
    };
    let max_packet_size = p.positive_size(
        &format!("{PATH}.max_packet_size"),
        raw.max_packet_size,
        MQTT_MAX_PACKET_SIZE,
        MQTT_MAX_PACKET_LIMIT,
    );
    let qos0_when_full = p.choice(
        &format!("{PATH}.qos0_when_full"),
        "policy",
        raw.qos0_when_full,
        QOS0_WHEN_FULL,
    );
    let mut count = |key: &str, given: Option<i64>, default: u64, limit: u64| {
        let value = given.unwrap_or(default as i64);
        if value < 1 || value as u64 > limit {
            p.push(
                format!("{PATH}.{key}"),
                format!("{value} is out of range (1 to {limit})"),
            );
            return None;
        }
        Some(value as usize)
    };
    let max_connections = count(
        "max_connections",
        raw.max_connections,
        MQTT_MAX_CONNECTIONS,
        1 << 20,
    );
    let max_inflight = count(
        "max_inflight",
        raw.max_inflight,
        MQTT_MAX_INFLIGHT,
        MQTT_MAX_INFLIGHT_LIMIT,
    );
    let connect_timeout = p.positive_duration(
        &format!("{PATH}.connect_timeout"),
        raw.connect_timeout,
        MQTT_CONNECT_TIMEOUT,
    );
    if p.len() != before {
        return None;
    }
    let ingress = MqttIngress {
        mode: mode?,
        max_packet_size: max_packet_size?,
        qos0_when_full: qos0_when_full?,
        limits: MqttLimits {
            max_connections: max_connections?,
            max_inflight: max_inflight?,
            connect_timeout: connect_timeout?,
        },
    };
    Some(enabled.then_some(ingress))
}

/// The listen-mode keys of `[ingress.mqtt]` checked, or `None` after
/// recording why.
fn listen(
    p: &mut Problems,
    listen: Option<String>,
    raw_tls: Option<RawTls>,
    allow_anonymous: Option<bool>,
    password_file: Option<PathBuf>,
    acl_file: Option<PathBuf>,
) -> Option<MqttListen> {
    const PATH: &str = "ingress.mqtt";
    let before = p.len();
    let listen = listen.unwrap_or_else(|| MQTT_LISTEN.to_owned());
    let addr = if listen == LISTEN_OFF {
        None
    } else {
        p.socket_addr(&format!("{PATH}.listen"), &listen)
    };
    let tls = raw_tls.and_then(|raw| {
        let t = tls(
            p,
            &format!("{PATH}.tls"),
            raw,
            &[Extra::Listen, Extra::Identity],
        )?;
        let listen = t.listen.unwrap_or_else(|| MQTT_TLS_LISTEN.to_owned());
        let listen = p.socket_addr(&format!("{PATH}.tls.listen"), &listen)?;
        Some(MqttTls {
            listen,
            files: t.files,
            use_identity_as_username: t.use_identity_as_username,
        })
    });
    for (key, file) in [("password_file", &password_file), ("acl_file", &acl_file)] {
        if file.as_ref().is_some_and(|f| f.as_os_str().is_empty()) {
            p.push(format!("{PATH}.{key}"), "must not be empty");
        }
    }
    if p.len() != before {
        return None;
    }
    if listen == LISTEN_OFF && tls.is_none() {
        p.push(
            format!("{PATH}.listen"),
            "\"off\" leaves no MQTT listener; configure [ingress.mqtt.tls], or disable MQTT with ingress.mqtt.enabled = false",
        );
        return None;
    }
    let passwords = password_file.is_some();
    let certificates = tls.as_ref().is_some_and(|t| t.files.require_certificate);
    const HOW: &str = "set ingress.mqtt.password_file (a file mosquitto_passwd writes)";
    if let Some(addr) = addr {
        check_exposed(
            p,
            &format!("{PATH}.listen"),
            addr,
            passwords,
            allow_anonymous,
            &format!("{PATH}.allow_anonymous"),
            HOW,
        );
    }
    if let Some(t) = &tls {
        check_exposed(
            p,
            &format!("{PATH}.tls.listen"),
            t.listen,
            passwords || certificates,
            allow_anonymous,
            &format!("{PATH}.allow_anonymous"),
            &format!("{HOW}, or ingress.mqtt.tls.require_certificate = true with a cafile"),
        );
    }
    if allow_anonymous == Some(false) && !passwords && !certificates {
        p.push(
            format!("{PATH}.allow_anonymous"),
            "false, but no ingress.mqtt.password_file or ingress.mqtt.tls.require_certificate says who may connect: nobody could",
        );
    }
    if p.len() != before {
        return None;
    }
    Some(MqttListen {
        addr,
        tls,
        auth: MqttAuth {
            // Anyone may connect until a password file says who may; the
            // checks above keep such a listener on loopback.
            allow_anonymous: allow_anonymous.unwrap_or(!passwords),
            password_file,
            acl_file,
        },
    })
}

/// The subscribe-mode keys of `[ingress.mqtt]` checked, or `None` after
/// recording why.
fn subscribe(
    p: &mut Problems,
    broker: Option<String>,
    client_id: Option<String>,
    topics: Option<Vec<String>>,
    qos: Option<i64>,
    node_id: u64,
) -> Option<MqttSubscribe> {
    let before = p.len();
    let broker = broker.unwrap_or_else(|| MQTT_BROKER.to_owned());
    let broker = match parse_broker(&broker) {
        Ok(addr) => Some(addr),
        Err(why) => {
            p.push("ingress.mqtt.broker", format!("{broker:?}: {why}"));
            None
        }
    };
    let client_id = client_id.unwrap_or_else(|| format!("weir-{node_id}"));
    if client_id.is_empty() {
        p.push(
            "ingress.mqtt.client_id",
            "must not be empty; leave it out for \"weir-<node.id>\"",
        );
    }
    let topics = topics.unwrap_or_else(|| MQTT_TOPICS.iter().map(|t| t.to_string()).collect());
    if topics.is_empty() {
        p.push(
            "ingress.mqtt.topics",
            "subscribe to at least one topic filter, e.g. [\"#\"]",
        );
    }
    let mut filters = Vec::with_capacity(topics.len());
    for (i, topic) in topics.iter().enumerate() {
        match TopicFilter::parse(topic) {
            Ok(filter) => filters.push(filter),
            Err(e) => p.push(format!("ingress.mqtt.topics[{i}]"), e.to_string()),
        }
    }
    let qos = match qos {
        None => Some(MQTT_QOS),
        Some(0) => Some(SubscribeQos::AtMostOnce),
        Some(1) => Some(SubscribeQos::AtLeastOnce),
        Some(2) => {
            p.push(
                "ingress.mqtt.qos",
                "QoS 2 is not supported (records are deduplicated downstream by origin and sequence number); use 1",
            );
            None
        }
        Some(other) => {
            p.push(
                "ingress.mqtt.qos",
                format!("{other} is not an MQTT QoS; use 0 or 1"),
            );
            None
        }
    };
    if p.len() != before {
        return None;
    }
    Some(MqttSubscribe {
        broker: broker?,
        client_id,
        topics: filters,
        qos: qos?,
    })
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

/// `host:port`, `[v6-address]:port`.
pub(crate) fn parse_broker(text: &str) -> Result<BrokerAddr, &'static str> {
    const HOW: &str = "expected host:port, e.g. \"127.0.0.1:1883\" or \"broker.local:1883\"";
    if text.contains("://") {
        return Err("give host:port without a scheme, e.g. \"127.0.0.1:1883\"");
    }
    let (host, port) = text.rsplit_once(':').ok_or(HOW)?;
    let host = match host.strip_prefix('[') {
        Some(v6) => v6
            .strip_suffix(']')
            .ok_or("an IPv6 address needs its closing bracket, e.g. \"[::1]:1883\"")?,
        None if host.contains(':') => {
            return Err("write an IPv6 address in brackets, e.g. \"[::1]:1883\"")
        }
        None => host,
    };
    if host.is_empty() {
        return Err(HOW);
    }
    if host.contains(|c: char| c.is_whitespace() || c == '/') {
        return Err("the host contains a space or a slash");
    }
    match port.parse::<u16>() {
        Ok(0) | Err(_) => Err("the port must be a number from 1 to 65535"),
        Ok(port) => Ok(BrokerAddr {
            host: host.to_owned(),
            port,
        }),
    }
}

/// The conventional gRPC port, on loopback only unless authentication or
/// `allow_anonymous = true` is configured (as for MQTT).
pub const GRPC_LISTEN: &str = "127.0.0.1:50051";

/// tonic's own default decode limit, so clients see no surprise.
pub const GRPC_MAX_MESSAGE_SIZE: u64 = 4 * 1024 * 1024;

/// gRPC frames carry a 4-byte length, so no message can be larger.
pub const GRPC_MAX_MESSAGE_LIMIT: u64 = u32::MAX as u64;

/// `[ingress.grpc]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawGrpc {
    pub enabled: Option<bool>,
    pub listen: Option<String>,
    pub max_message_size: Option<Written<Size>>,
    pub allow_anonymous: Option<bool>,
    pub tokens_file: Option<PathBuf>,
    pub allow: Option<BTreeMap<String, Vec<String>>>,
    pub tls: Option<RawTls>,
}

/// `[ingress.grpc]`
#[derive(Debug, Clone, PartialEq)]
pub struct GrpcIngress {
    /// Address to accept gRPC connections on.
    pub listen: SocketAddr,
    /// Largest gRPC message accepted, in bytes.
    pub max_message_size: usize,
    /// TLS on `listen` (instead of plain HTTP/2).
    pub tls: Option<TlsFiles>,
    /// Who may call, and which streams each may publish to.
    pub auth: GrpcAuth,
}

/// Authentication and authorisation of gRPC callers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcAuth {
    /// Callers with neither a token nor a client certificate may call.
    pub allow_anonymous: bool,
    /// Bearer tokens: `<name> <sha256 hex>` lines.
    pub tokens_file: Option<PathBuf>,
    /// Identity (token name or certificate CN; `""` anonymous) to the
    /// stream patterns it may publish to; `None`: any stream.
    pub allow: Option<BTreeMap<String, Vec<String>>>,
}

impl GrpcAuth {
    /// Anyone, any stream.
    pub fn open() -> Self {
        GrpcAuth {
            allow_anonymous: true,
            tokens_file: None,
            allow: None,
        }
    }
}

/// `[ingress.grpc]` checked, or `None` after recording why.
///
/// `Some(None)` when valid but disabled.
fn grpc(p: &mut Problems, raw: RawGrpc) -> Option<Option<GrpcIngress>> {
    let before = p.len();
    let enabled = raw.enabled.unwrap_or(INGRESS_ENABLED);
    let listen = raw.listen.as_deref().unwrap_or(GRPC_LISTEN);
    let listen = p.socket_addr("ingress.grpc.listen", listen);
    let max_message_size = p.positive_size(
        "ingress.grpc.max_message_size",
        raw.max_message_size,
        GRPC_MAX_MESSAGE_SIZE,
        GRPC_MAX_MESSAGE_LIMIT,
    );
    let tls = raw
        .tls
        .and_then(|t| tls(p, "ingress.grpc.tls", t, &[]).map(|t| t.files));
    if raw
        .tokens_file
        .as_ref()
        .is_some_and(|f| f.as_os_str().is_empty())
    {
        p.push("ingress.grpc.tokens_file", "must not be empty");
    }
    for (identity, patterns) in raw.allow.iter().flatten() {
        for pattern in patterns {
            if let Some(why) = weir_core::security::gate::stream_pattern_problem(pattern) {
                p.push(format!("ingress.grpc.allow.{identity:?}"), why);
            }
        }
    }
    let certificates = tls.as_ref().is_some_and(|t| t.require_certificate);
    let authenticates = raw.tokens_file.is_some() || certificates;
    if let Some(addr) = listen {
        check_exposed(
            p,
            "ingress.grpc.listen",
            addr,
            authenticates,
            raw.allow_anonymous,
            "ingress.grpc.allow_anonymous",
            "set ingress.grpc.tokens_file (bearer tokens), or [ingress.grpc.tls] with require_certificate = true",
        );
    }
    if raw.allow_anonymous == Some(false)
        && !authenticates
        && tls.as_ref().is_none_or(|t| t.cafile.is_none())
    {
        p.push(
            "ingress.grpc.allow_anonymous",
            "false, but no tokens_file or client certificates say who may call: nobody could",
        );
    }
    if p.len() != before {
        return None;
    }
    let ingress = GrpcIngress {
        listen: listen?,
        max_message_size: max_message_size?,
        tls,
        auth: GrpcAuth {
            allow_anonymous: raw.allow_anonymous.unwrap_or(!authenticates),
            tokens_file: raw.tokens_file,
            allow: raw.allow,
        },
    };
    Some(enabled.then_some(ingress))
}
