//! Every default value of the config, with the reason for it. The shipped
//! `config/default.toml` spells out the same values; a test keeps the two
//! equal.

use std::time::Duration;

use super::checked::{PayloadKind, Qos0WhenFull, SchemeName, SubscribeQos};

/// One node needs no id planning; nodes that peer must each set their own.
pub const NODE_ID: u64 = 1;

/// Short and recognisable in logs and metrics when nothing better is given.
pub const NODE_NAME: &str = "weir";

/// At JANUS's evaluation rate of 5k records/s this holds about 13 s of
/// backlog per class, enough to ride out an uplink stall of a few seconds.
pub const CAPACITY_RECORDS: u64 = 65_536;

/// 64 MiB per class keeps the default three classes under 200 MiB, which a
/// Raspberry Pi class edge box can spare.
pub const CAPACITY_BYTES: u64 = 64 * 1024 * 1024;

/// The record ring of a class queue is allocated up front, so a typo such as
/// an extra digit must not ask for gigabytes; 16 Mi records is far beyond
/// any sensible backlog.
pub const MAX_CAPACITY_RECORDS: u64 = 1 << 24;

/// PMRFS is JANUS's own matcher (Algorithm 3); the others are baselines.
pub const SCHEME: SchemeName = SchemeName::Pmrfs;

/// The counting window `t` of PBTT (Algorithm 1): as long as the tightest
/// default bound (`ls`, 100 ms), so a violation is seen within one bound.
pub const WINDOW: Duration = Duration::from_millis(100);

/// `epsilon` of JANUS Eq. 1: about what weir spends handling a record on a
/// small ARM box, small against the 100 ms `ls` bound.
pub const PROCESSING_DELAY: Duration = Duration::from_millis(1);

/// `C_out`: JANUS Table III's 4G link (18 Mbit/s), the paper's headline
/// setting, in bytes per second.
pub const UPLINK_BYTES_PER_SEC: f64 = 18e6 / 8.0;

/// Token bucket depth per class: about 29 ms of the default 18 Mbit/s
/// uplink, so a burst cannot eat a third of the `ls` bound.
pub const BURST_BYTES: u64 = 64 * 1024;

/// Most records per batch: with small sensor records the byte limit
/// decides; this only caps the per-record bookkeeping of one batch.
pub const MAX_BATCH_RECORDS: u64 = 1024;

/// Most bytes per batch: the default burst, so one batch goes out on one
/// bucketful (about 29 ms of the default uplink) and a batch of a lower
/// class delays an urgent one by little.
pub const MAX_BATCH_BYTES: u64 = 64 * 1024;

/// Every ingress is on unless switched off: a new box accepts data at once.
pub const INGRESS_ENABLED: bool = true;

/// Listen mode: weir is the devices' broker, no extra hop.
pub const MQTT_MODE: &str = "listen";

/// The IANA MQTT port on every interface, as a broker would.
pub const MQTT_LISTEN: &str = "0.0.0.0:1883";

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

/// Back-pressure rather than loss, even for QoS 0: weir never drops a record
/// unless the operator says so.
pub const QOS0_WHEN_FULL: Qos0WhenFull = Qos0WhenFull::Block;

/// The conventional gRPC port on every interface.
pub const GRPC_LISTEN: &str = "0.0.0.0:50051";

/// tonic's own default decode limit, so clients see no surprise.
pub const GRPC_MAX_MESSAGE_SIZE: u64 = 4 * 1024 * 1024;

/// gRPC frames carry a 4-byte length, so no message can be larger.
pub const GRPC_MAX_MESSAGE_LIMIT: u64 = u32::MAX as u64;

/// Files need no running server: a fresh checkout works out of the box.
pub const EGRESS_KIND: &str = "file";

/// Relative to the working directory, next to where weir was started.
pub const EGRESS_DIR: &str = "weir-out";

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

/// Reconnect attempts back off up to this, so a broker outage costs a
/// reconnect every 30 s at worst and recovery is noticed quickly.
pub const AMQP_RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// AMQP 0-9-1 short strings (exchange, queue and routing key names) carry
/// a one-byte length.
pub const AMQP_SHORT_STRING_LIMIT: usize = 255;

/// Operators want to see connections and errors, not every record.
pub const LOG_LEVEL: &str = "info";

/// `T_sc` prior: JANUS Table III's 4G delay, the default uplink's.
pub const TRANSACTION_TIME: Duration = Duration::from_millis(50);

/// The configured uplink is a guess; weir's own transactions say better.
pub const TRACK_UPLINK: bool = true;

/// A transaction's fixed cost (the confirm's round trip) is paid whatever
/// it carries: records of other classes ride along within their tokens.
pub const MIX_CLASSES: bool = true;

/// Buffer-aided relaying pays off whenever its theorems say so; the plan
/// never lets a record miss its class bound.
pub const BATCHING_ADAPTIVE: bool = true;

/// Reference records by class rank (buffer-aided relaying Eq. 5-6): the
/// urgent class compares against an early FIFS record, so it batches little.
pub const BATCHING_REFERENCE: [u32; 3] = weir_core::batching::DEFAULT_REFERENCE_BY_RANK;

/// Compression pays on slow uplinks and costs nothing when the chooser
/// predicts it would not (it then sends raw).
pub const COMPRESSION_ENABLED: bool = true;

/// Records of one class tend to be alike; per-topic tables need more
/// samples before they help.
pub const COMPRESSION_PER: PayloadKind = PayloadKind::Class;

/// Batches between samples of a codec not in use: about 3% of batches.
pub const COMPRESSION_SAMPLE_EVERY: u32 = weir_core::compression::DEFAULT_SAMPLE_EVERY_BATCHES;

/// Longest time between samples, so a quiet stream's table stays fresh.
pub const COMPRESSION_SAMPLE_INTERVAL: Duration = weir_core::compression::DEFAULT_SAMPLE_EVERY;

/// Peers exchange tuples once per PBTT window (the default `scheduler.window`),
/// so each round matches on tuples at most one window old.
pub const PEER_HEARTBEAT: Duration = Duration::from_millis(100);

/// Five missed heartbeats: one lost packet or a GC-like stall does not drop
/// a peer, a dead one stops being matched within half a second.
pub const PEER_DEAD_AFTER: Duration = Duration::from_millis(500);

/// Ten rounds: a receiver renews every round, so a reservation survives a
/// few lost renewals, and a dead receiver's reservation is freed in a second.
pub const PEER_LEASE: Duration = Duration::from_secs(1);
