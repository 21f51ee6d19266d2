//! `[egress]`: where batches go. The sink (`[egress.file]` or
//! `[egress.amqp]`) and an optional emulated uplink in front of it
//! (`[egress.link]`): as written, their defaults, checked, and their
//! validation.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::named::named_enum;
use super::problems::Problems;
use super::units::{HumanDuration, Rate, Written};

/// Files need no running server: a fresh checkout works out of the box.
pub const EGRESS_KIND: &str = "file";

/// `[egress]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawEgress {
    pub kind: Option<String>,
    pub file: Option<RawFileEgress>,
    pub amqp: Option<RawAmqp>,
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
    /// `kind = "file"`: one file per batch in a directory.
    File(FileEgress),
    /// `kind = "amqp"`: publish to RabbitMQ.
    Amqp(AmqpEgress),
}

/// `[egress]` checked, or `None` after recording why.
pub(crate) fn egress(p: &mut Problems, raw: RawEgress) -> Option<EgressConfig> {
    let before = p.len();
    let kind = raw.kind.as_deref().unwrap_or(EGRESS_KIND);
    let file_given = raw.file.is_some();
    let amqp_given = raw.amqp.is_some();
    let file = raw.file.map(|f| file_egress(p, f));
    let amqp = raw.amqp.map(|a| amqp_egress(p, a));
    let sink = match kind {
        "file" => {
            if amqp_given {
                p.push(
                    "egress.amqp",
                    "given, but egress.kind is \"file\"; set egress.kind = \"amqp\" to publish to RabbitMQ, or remove [egress.amqp]",
                );
            }
            let default = || {
                Some(FileEgress {
                    dir: PathBuf::from(EGRESS_DIR),
                })
            };
            file.unwrap_or_else(default).map(EgressSink::File)
        }
        "amqp" => {
            if file_given {
                p.push(
                    "egress.file",
                    "given, but egress.kind is \"amqp\"; set egress.kind = \"file\" to write files, or remove [egress.file]",
                );
            }
            match amqp {
                Some(amqp) => amqp.map(EgressSink::Amqp),
                None => {
                    p.push(
                        "egress.amqp",
                        "missing; egress.kind = \"amqp\" needs an [egress.amqp] section with at least its url",
                    );
                    None
                }
            }
        }
        other => {
            p.push(
                "egress.kind",
                format!("unknown kind {other:?} (known: file, amqp)"),
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
}

/// `[egress.file]`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEgress {
    /// Directory batches are written to (relative to the working directory
    /// unless absolute).
    pub dir: PathBuf,
}

/// `[egress.file]` checked, or `None` after recording why.
fn file_egress(p: &mut Problems, raw: RawFileEgress) -> Option<FileEgress> {
    let dir = raw.dir.unwrap_or_else(|| EGRESS_DIR.to_owned());
    if dir.is_empty() {
        p.push(
            "egress.file.dir",
            "must not be empty; use \".\" for the working directory",
        );
        return None;
    }
    Some(FileEgress {
        dir: PathBuf::from(dir),
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

/// Reconnect attempts back off up to this, so a broker outage costs a
/// reconnect every 30 s at worst and recovery is noticed quickly.
pub const AMQP_RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Batches published and awaiting their confirm at once. One batch per
/// round trip caps a 64 KiB-batch egress near 50k records/s of 1 KiB on
/// loopback; a window of 8 hides the confirm latency (docs/benchmarks.md)
/// and holds at most 8 batches' bytes besides the queues.
pub const AMQP_MAX_IN_FLIGHT: u64 = 8;

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
    pub exchange: Option<String>,
    pub exchange_type: Option<String>,
    pub queue: Option<String>,
    pub routing_key: Option<String>,
    pub confirm_timeout: Option<Written<HumanDuration>>,
    pub connect_timeout: Option<Written<HumanDuration>>,
    pub reconnect_backoff_max: Option<Written<HumanDuration>>,
    pub max_in_flight: Option<u64>,
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
    /// How long connecting (TCP, AMQP handshake, channel, declarations)
    /// may take before the attempt counts as failed and is retried.
    pub connect_timeout: Duration,
    /// Longest pause between reconnect attempts.
    pub reconnect_backoff_max: Duration,
    /// Batches published and not yet confirmed, at most (1 = one round
    /// trip per batch).
    pub max_in_flight: usize,
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
fn amqp_egress(p: &mut Problems, raw: RawAmqp) -> Option<AmqpEgress> {
    const PATH: &str = "egress.amqp";
    let before = p.len();
    let url = raw.url.unwrap_or_else(|| AMQP_URL.to_owned());
    if !(url.starts_with("amqp://") || url.starts_with("amqps://")) {
        // The URL may hold a password: show only its scheme.
        let scheme = url.split_once("://").map_or("no scheme", |(s, _)| s);
        p.push(
            format!("{PATH}.url"),
            format!(
                "must start with amqp:// or amqps:// (found {scheme:?}), e.g. \"amqp://guest:guest@127.0.0.1:5672/%2f\""
            ),
        );
    }
    let exchange = raw.exchange.unwrap_or_else(|| AMQP_EXCHANGE.to_owned());
    let exchange = short_string(p, &format!("{PATH}.exchange"), exchange, true);
    let exchange_type = p.choice(
        &format!("{PATH}.exchange_type"),
        "exchange type",
        raw.exchange_type,
        ExchangeType::from_name(AMQP_EXCHANGE_TYPE).expect("the default is a known type"),
    );
    let queue = raw.queue.unwrap_or_else(|| AMQP_QUEUE.to_owned());
    let queue = short_string(p, &format!("{PATH}.queue"), queue, false);
    let routing_key = raw
        .routing_key
        .unwrap_or_else(|| AMQP_ROUTING_KEY.to_owned());
    let routing_key = short_string(p, &format!("{PATH}.routing_key"), routing_key, true);
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
    let max_in_flight = raw.max_in_flight.unwrap_or(AMQP_MAX_IN_FLIGHT);
    if !(1..=AMQP_MAX_IN_FLIGHT_LIMIT).contains(&max_in_flight) {
        p.push(
            format!("{PATH}.max_in_flight"),
            format!(
                "{max_in_flight} is out of range: between 1 (one batch per confirm round trip) and {AMQP_MAX_IN_FLIGHT_LIMIT}"
            ),
        );
    }
    if p.len() != before {
        return None;
    }
    Some(AmqpEgress {
        url,
        exchange: exchange?,
        exchange_type: exchange_type?,
        queue: queue?,
        routing_key: routing_key?,
        confirm_timeout: confirm_timeout?,
        connect_timeout: connect_timeout?,
        reconnect_backoff_max: reconnect_backoff_max?,
        max_in_flight: max_in_flight as usize,
    })
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
