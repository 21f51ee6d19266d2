//! Every default value of the config in one place. Each is defined, with
//! the reason for its value, next to the section it belongs to; this module
//! gathers them under one path (`weir::config::defaults`). The shipped
//! `config/default.toml` spells out the same values; a test keeps the two
//! equal.

pub use super::classes::{CAPACITY_BYTES, CAPACITY_RECORDS, MAX_CAPACITY_RECORDS};
pub use super::egress::{
    AMQP_CONFIRM_TIMEOUT, AMQP_CONNECT_TIMEOUT, AMQP_EXCHANGE, AMQP_EXCHANGE_TYPE, AMQP_QUEUE,
    AMQP_RECONNECT_BACKOFF_MAX, AMQP_ROUTING_KEY, AMQP_SHORT_STRING_LIMIT, AMQP_URL, EGRESS_DIR,
    EGRESS_KIND,
};
pub use super::ingress::{
    GRPC_LISTEN, GRPC_MAX_MESSAGE_LIMIT, GRPC_MAX_MESSAGE_SIZE, INGRESS_ENABLED, MQTT_BROKER,
    MQTT_LISTEN, MQTT_MAX_PACKET_LIMIT, MQTT_MAX_PACKET_SIZE, MQTT_MODE, MQTT_QOS, MQTT_TOPICS,
    QOS0_WHEN_FULL,
};
pub use super::log::LOG_LEVEL;
pub use super::node::{NODE_ID, NODE_NAME};
pub use super::peering::{PEER_DEAD_AFTER, PEER_HEARTBEAT, PEER_LEASE};
pub use super::scheduler::{
    BATCHING_ADAPTIVE, BATCHING_REFERENCE, BURST_BYTES, COMPRESSION_ENABLED, COMPRESSION_PER,
    COMPRESSION_SAMPLE_EVERY, COMPRESSION_SAMPLE_INTERVAL, MAX_BATCH_BYTES, MAX_BATCH_RECORDS,
    MIX_CLASSES, PROCESSING_DELAY, SCHEME, TRACK_UPLINK, TRANSACTION_TIME, UPLINK_BYTES_PER_SEC,
    WINDOW,
};
pub use super::spool::{
    DURABILITY, ON_FULL, SPOOL_DIR, SPOOL_MAX_BYTES, SPOOL_MIN_FREE_BYTES, SPOOL_SEGMENT_BYTES,
    SPOOL_SYNC, SPOOL_SYNC_INTERVAL, SPOOL_WINDOW_BYTES,
};
