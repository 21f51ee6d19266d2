//! The config file as written: every field optional (defaults are applied
//! by validation, from [`super::defaults`]), unit values kept as
//! [`Written`] so that a bad one is reported with every other problem, and
//! unknown keys refused.
//!
//! A new section is one more field on [`RawConfig`] plus its struct here,
//! its checked type in `checked.rs` and its function in `validate.rs`.

use serde::Deserialize;

use super::units::{HumanDuration, Rate, Size, Written};

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    #[serde(default)]
    pub node: RawNode,
    /// `[[class]]`; `None` when absent (the JANUS defaults apply).
    pub class: Option<Vec<RawClass>>,
    #[serde(default)]
    pub classify: RawClassify,
    #[serde(default)]
    pub scheduler: RawScheduler,
    #[serde(default)]
    pub batching: RawBatching,
    #[serde(default)]
    pub compression: RawCompression,
    #[serde(default)]
    pub ingress: RawIngress,
    #[serde(default)]
    pub egress: RawEgress,
    #[serde(default)]
    pub admin: RawAdmin,
    #[serde(default)]
    pub peering: RawPeering,
    #[serde(default)]
    pub log: RawLog,
}

/// `[node]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNode {
    pub id: Option<u64>,
    pub name: Option<String>,
}

/// One `[[class]]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawClass {
    pub name: Option<String>,
    pub bound: Option<Written<HumanDuration>>,
    pub min_share: Option<f64>,
    pub capacity_records: Option<u64>,
    pub capacity_bytes: Option<Written<Size>>,
}

/// `[classify]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawClassify {
    pub default_class: Option<String>,
    #[serde(default)]
    pub route: Vec<RawRoute>,
}

/// One `[[classify.route]]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoute {
    pub mqtt: Option<String>,
    pub grpc: Option<String>,
    pub class: Option<String>,
}

/// `[scheduler]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawScheduler {
    pub scheme: Option<String>,
    pub window: Option<Written<HumanDuration>>,
    pub processing_delay: Option<Written<HumanDuration>>,
    pub uplink: Option<Written<Rate>>,
    pub burst: Option<Written<Size>>,
    pub max_batch_records: Option<u64>,
    pub max_batch_bytes: Option<Written<Size>>,
    pub transaction_time: Option<Written<HumanDuration>>,
    pub track_uplink: Option<bool>,
    pub mix_classes: Option<bool>,
}

/// `[batching]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBatching {
    pub adaptive: Option<bool>,
    /// Signed so that any integer reaches validation and its message.
    pub reference: Option<Vec<i64>>,
}

/// `[compression]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCompression {
    pub enabled: Option<bool>,
    pub candidates: Option<Vec<String>>,
    pub per: Option<String>,
    pub sample_every: Option<i64>,
    pub sample_interval: Option<Written<HumanDuration>>,
}

/// `[ingress]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawIngress {
    #[serde(default)]
    pub mqtt: RawMqtt,
    #[serde(default)]
    pub grpc: RawGrpc,
}

/// `[ingress.mqtt]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMqtt {
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
}

/// `[ingress.grpc]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGrpc {
    pub enabled: Option<bool>,
    pub listen: Option<String>,
    pub max_message_size: Option<Written<Size>>,
}

/// `[egress]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEgress {
    pub kind: Option<String>,
    pub file: Option<RawFileEgress>,
    pub amqp: Option<RawAmqp>,
    pub link: Option<RawLink>,
}

/// `[egress.file]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFileEgress {
    pub dir: Option<String>,
}

/// `[egress.amqp]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAmqp {
    pub url: Option<String>,
    pub exchange: Option<String>,
    pub exchange_type: Option<String>,
    pub queue: Option<String>,
    pub routing_key: Option<String>,
    pub confirm_timeout: Option<Written<HumanDuration>>,
    pub reconnect_backoff_max: Option<Written<HumanDuration>>,
}

/// `[egress.link]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLink {
    pub preset: Option<String>,
    pub bandwidth: Option<Written<Rate>>,
    pub delay: Option<Written<HumanDuration>>,
}

/// `[admin]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdmin {
    pub listen: Option<String>,
}

/// `[peering]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPeering {
    pub listen: Option<String>,
    #[serde(default)]
    pub peers: Vec<RawPeer>,
    pub heartbeat: Option<Written<HumanDuration>>,
    pub dead_after: Option<Written<HumanDuration>>,
    pub lease: Option<Written<HumanDuration>>,
}

/// One `[[peering.peers]]` (or inline `{ id = 2, addr = "..." }`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPeer {
    pub id: Option<u64>,
    pub addr: Option<String>,
}

/// `[log]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLog {
    pub level: Option<String>,
}
