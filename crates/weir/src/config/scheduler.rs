//! `[scheduler]` (JANUS's parameters and the scheme it runs), `[batching]`
//! (adaptive batching, buffer-aided relaying) and `[compression]` (the
//! per-batch codec choice): as written, their defaults, checked, and their
//! validation.

use std::time::Duration;

use serde::Deserialize;
use weir_core::janus::redirect::{Strategy, DEFAULT_RANDOM_SEED};
use weir_core::janus::scheme::Scheme;

use super::classes::MAX_CAPACITY_RECORDS;
use super::named::named_enum;
use super::problems::Problems;
use super::units::{Auto, Count, HumanDuration, Rate, Size, Written};

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

/// Most records per batch with `max_batch_records = "auto"` (the
/// default): the byte caps decide; this only bounds one batch's
/// per-record bookkeeping.
pub const MAX_BATCH_RECORDS: u64 = 65_536;

/// Largest batch with `max_batch_bytes = "auto"` (the default): the
/// egress's pipe asks for a quarter of the bytes it keeps in flight
/// ([`weir_core::delivery::pipe`]) up to this, and the scheduler caps it to
/// what the link carries within the tightest active class's horizon. With
/// a fixed 64 KiB cap a RabbitMQ on loopback took 84k records/s of 1 KiB;
/// with this, 217k. 4 MiB is far under RabbitMQ's message limit (16 MiB
/// by default) and costs a few milliseconds to compress.
pub const MAX_BATCH_BYTES: u64 = 4 << 20;

/// `T_sc` prior: JANUS Table III's 4G delay, the default uplink's.
pub const TRANSACTION_TIME: Duration = Duration::from_millis(50);

/// The configured uplink is a guess; weir's own transactions say better.
pub const TRACK_UPLINK: bool = true;

/// A transaction's fixed cost (the confirm's round trip) is paid whatever
/// it carries: records of other classes ride along within their tokens.
pub const MIX_CLASSES: bool = true;

/// `[scheduler]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawScheduler {
    pub scheme: Option<String>,
    pub window: Option<Written<HumanDuration>>,
    pub processing_delay: Option<Written<HumanDuration>>,
    pub uplink: Option<Written<Rate>>,
    pub burst: Option<Written<Auto<Size>>>,
    pub max_batch_records: Option<Written<Auto<Count>>>,
    pub max_batch_bytes: Option<Written<Auto<Size>>>,
    pub transaction_time: Option<Written<HumanDuration>>,
    pub track_uplink: Option<bool>,
    pub mix_classes: Option<bool>,
}

/// `[scheduler]`
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerConfig {
    /// Which node-level scheme and matcher to run, chosen by one of the
    /// names of [`SchemeName`].
    pub scheme: Scheme,
    /// PBTT counting window `t` (JANUS Algorithm 1); at most the smallest
    /// class bound.
    pub window: Duration,
    /// `epsilon` of JANUS Eq. 1; less than the smallest class bound.
    pub processing_delay: Duration,
    /// `C_out`, the initial outbound capacity, in bytes per second (> 0).
    pub uplink_bytes_per_sec: f64,
    /// Token bucket depth per class, in bytes (> 0); `None` (`"auto"`):
    /// the batch cap in force, so that a bucketful is one batch.
    pub burst_bytes: Option<usize>,
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
    /// out alone. Below it the egress's pipe and the horizon decide.
    pub max_batch_bytes: usize,
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

impl SchemeName {
    /// The scheme this name selects: what [`Scheme`]'s own parser reads
    /// from the same name (`random` with its default seed).
    pub fn scheme(self) -> Scheme {
        match self {
            SchemeName::Native => Scheme::Native,
            SchemeName::QmOnly => Scheme::QmOnly,
            SchemeName::Pmrfs => Scheme::Janus(Strategy::Pmrfs),
            SchemeName::Random => Scheme::Janus(Strategy::Random {
                seed: DEFAULT_RANDOM_SEED,
            }),
            SchemeName::Fcfs => Scheme::Janus(Strategy::Fcfs),
            SchemeName::Lrfs => Scheme::Janus(Strategy::Lrfs),
            SchemeName::BestFit => Scheme::Janus(Strategy::BestFit),
        }
    }
}

/// `[scheduler]` checked against the class `bounds`, or `None` after
/// recording why.
pub(crate) fn scheduler(
    p: &mut Problems,
    raw: RawScheduler,
    bounds: &[(String, Duration)],
) -> Option<SchedulerConfig> {
    let before = p.len();
    let tightest = bounds.iter().min_by_key(|(_, bound)| *bound);
    let scheme = p.choice("scheduler.scheme", "scheme", raw.scheme, SCHEME);
    let window = p.positive_duration("scheduler.window", raw.window, WINDOW);
    if let (Some(window), Some((class, bound))) = (window, tightest) {
        if window > *bound {
            p.push(
                "scheduler.window",
                format!(
                    "{} is longer than the bound of class {class:?} ({}); PBTT checks delays once per window and could not react before that bound passes; use at most {}",
                    HumanDuration(window),
                    HumanDuration(*bound),
                    HumanDuration(*bound),
                ),
            );
        }
    }
    let processing_delay = p.duration(
        "scheduler.processing_delay",
        raw.processing_delay,
        PROCESSING_DELAY,
    );
    if let (Some(delay), Some((class, bound))) = (processing_delay, tightest) {
        if delay >= *bound {
            p.push(
                "scheduler.processing_delay",
                format!(
                    "{} is not less than the bound of class {class:?} ({}); no record of that class could meet its bound",
                    HumanDuration(delay),
                    HumanDuration(*bound),
                ),
            );
        }
    }
    let uplink = p.positive_rate("scheduler.uplink", raw.uplink, UPLINK_BYTES_PER_SEC);
    let burst = auto_size(p, "scheduler.burst", raw.burst);
    let max_batch_records = match p.unit(
        "scheduler.max_batch_records",
        raw.max_batch_records,
        Auto::Auto,
    ) {
        Some((Auto::Auto, _)) => Some(MAX_BATCH_RECORDS),
        Some((Auto::Set(Count(0)), _)) => {
            p.push("scheduler.max_batch_records", "must be greater than zero");
            None
        }
        Some((Auto::Set(Count(n)), _)) if n > MAX_CAPACITY_RECORDS => {
            p.push(
                "scheduler.max_batch_records",
                format!("{n} is more than the limit of {MAX_CAPACITY_RECORDS}"),
            );
            None
        }
        Some((Auto::Set(Count(n)), _)) => Some(n),
        None => None,
    };
    let max_batch_bytes = match auto_size(p, "scheduler.max_batch_bytes", raw.max_batch_bytes) {
        Some(None) => Some(MAX_BATCH_BYTES as usize),
        Some(Some(b)) => Some(b),
        None => None,
    };
    let transaction_time = p.duration(
        "scheduler.transaction_time",
        raw.transaction_time,
        TRANSACTION_TIME,
    );
    if p.len() != before {
        return None;
    }
    Some(SchedulerConfig {
        transaction_time: transaction_time?,
        track_uplink: raw.track_uplink.unwrap_or(TRACK_UPLINK),
        mix_classes: raw.mix_classes.unwrap_or(MIX_CLASSES),
        scheme: scheme?.scheme(),
        window: window?,
        processing_delay: processing_delay?,
        uplink_bytes_per_sec: uplink?,
        burst_bytes: burst?,
        // At most MAX_CAPACITY_RECORDS (2^24), so it fits any usize.
        max_batch_records: max_batch_records? as usize,
        max_batch_bytes: max_batch_bytes?,
    })
}

/// A size greater than zero or `"auto"` (`Some(None)`); `None` after a
/// problem.
fn auto_size(
    p: &mut Problems,
    path: &str,
    written: Option<Written<Auto<Size>>>,
) -> Option<Option<usize>> {
    match p.unit(path, written, Auto::Auto)? {
        (Auto::Auto, _) => Some(None),
        (Auto::Set(Size(0)), text) => {
            p.push(path, format!("{text:?} must be greater than zero"));
            None
        }
        (Auto::Set(Size(b)), text) => match usize::try_from(b) {
            Ok(b) => Some(Some(b)),
            Err(_) => {
                p.push(path, format!("{text:?} is too large for this platform"));
                None
            }
        },
    }
}

/// Buffer-aided relaying pays off whenever its theorems say so; the plan
/// never lets a record miss its class bound.
pub const BATCHING_ADAPTIVE: bool = true;

/// A partial batch gathers for up to 2 ms after the batch before it: at
/// 50k records/s into RabbitMQ on the same box, batches of about 100
/// records instead of 26, a quarter of the transactions; within 1/16 of the
/// horizon (2.2 ms for a 100 ms class), so bounds are not at stake.
pub const BATCHING_GATHER: Duration = Duration::from_millis(2);

/// Reference records by class rank (buffer-aided relaying Eq. 5-6): the
/// urgent class compares against an early FIFS record, so it batches little.
pub const BATCHING_REFERENCE: [u32; 3] = weir_core::batching::DEFAULT_REFERENCE_BY_RANK;

/// `[batching]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBatching {
    pub adaptive: Option<bool>,
    /// Signed so that any integer reaches validation and its message.
    pub reference: Option<Vec<i64>>,
    pub gather: Option<Written<HumanDuration>>,
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
    /// Shortest time between a batch and a following one that is not full
    /// (zero: send whatever is queued whenever the link is free); never
    /// more than 1/16 of the horizon in force.
    pub gather: Duration,
}

/// `[batching]` checked, or `None` after recording why.
pub(crate) fn batching(p: &mut Problems, raw: RawBatching) -> Option<BatchingSection> {
    let before = p.len();
    let reference = match raw.reference {
        None => BATCHING_REFERENCE.to_vec(),
        Some(list) => {
            if list.is_empty() {
                p.push(
                    "batching.reference",
                    "give at least one reference record (1 = never batch)",
                );
            }
            let mut out = Vec::with_capacity(list.len());
            for (i, r) in list.into_iter().enumerate() {
                match u32::try_from(r) {
                    Ok(v) if v >= 1 => out.push(v),
                    _ => p.push(
                        format!("batching.reference[{i}]"),
                        format!("{r} is not a record index: use 1 or more (1 = never batch)"),
                    ),
                }
            }
            out
        }
    };
    let gather = p.duration("batching.gather", raw.gather, BATCHING_GATHER);
    if p.len() != before {
        return None;
    }
    Some(BatchingSection {
        adaptive: raw.adaptive.unwrap_or(BATCHING_ADAPTIVE),
        reference,
        gather: gather?,
    })
}

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

/// `[compression]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCompression {
    pub enabled: Option<bool>,
    pub candidates: Option<Vec<String>>,
    pub per: Option<String>,
    pub sample_every: Option<i64>,
    pub sample_interval: Option<Written<HumanDuration>>,
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

/// `[compression]` checked, or `None` after recording why.
pub(crate) fn compression(p: &mut Problems, raw: RawCompression) -> Option<CompressionSection> {
    use weir_core::compression::{Codec, DEFAULT_CANDIDATES};
    let before = p.len();
    let candidates = match raw.candidates {
        None => DEFAULT_CANDIDATES.to_vec(),
        Some(names) => {
            if names.is_empty() {
                p.push(
                    "compression.candidates",
                    "give at least one codec (e.g. [\"none\"]), or set enabled = false",
                );
            }
            let mut out = Vec::with_capacity(names.len());
            for (i, name) in names.iter().enumerate() {
                match name
                    .parse::<Codec>()
                    .map_err(|e| e.to_string())
                    .and_then(|c| c.validate().map_err(|e| e.to_string()))
                {
                    Ok(c) if out.contains(&c) => p.push(
                        format!("compression.candidates[{i}]"),
                        format!("{name:?} is listed twice"),
                    ),
                    Ok(c) => out.push(c),
                    Err(e) => p.push(
                        format!("compression.candidates[{i}]"),
                        format!("{e} (known: none, gzip-1..gzip-9, zstd-1..zstd-22)"),
                    ),
                }
            }
            out
        }
    };
    let per = p.choice("compression.per", "payload kind", raw.per, COMPRESSION_PER);
    let sample_every = match raw.sample_every {
        None => Some(COMPRESSION_SAMPLE_EVERY),
        Some(n) => match u32::try_from(n) {
            Ok(v) if v >= 1 => Some(v),
            _ => {
                p.push(
                    "compression.sample_every",
                    format!("{n} is not a number of batches: use 1 or more"),
                );
                None
            }
        },
    };
    let sample_interval = p.positive_duration(
        "compression.sample_interval",
        raw.sample_interval,
        COMPRESSION_SAMPLE_INTERVAL,
    );
    if p.len() != before {
        return None;
    }
    Some(CompressionSection {
        enabled: raw.enabled.unwrap_or(COMPRESSION_ENABLED),
        candidates,
        per: per?,
        sample_every: sample_every?,
        sample_interval: sample_interval?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each name gives the scheme weir-core's own parser reads from it, the
    /// one weir ran before the config carried the parsed scheme.
    #[test]
    fn every_scheme_name_gives_the_scheme_of_that_name() {
        for &name in SchemeName::NAMES {
            let named = SchemeName::from_name(name).expect("a listed name");
            assert_eq!(Ok(named.scheme()), name.parse::<Scheme>(), "{name}");
            assert_eq!(named.scheme().to_string(), name);
        }
    }
}
