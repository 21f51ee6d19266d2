//! `[spool]` (where and how records are kept on disk) and the per-class
//! durability keys of `[[class]]` (`durability`, `spool_max_bytes`,
//! `on_full`, `ttl`): as written, their defaults, checked types and
//! validation.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use weir_core::spool::FullPolicy;

use super::named::named_enum;
use super::problems::Problems;
use super::units::{HumanDuration, Size, Written};

/// A state directory in the place the Filesystem Hierarchy Standard (and
/// systemd's `StateDirectory=weir`) gives a daemon's variable state.
pub const SPOOL_DIR: &str = "/var/lib/weir/spool";
/// 1 GiB: hours of a typical sensor fleet's backlog (at 100 records/s of
/// 256 B, about 11 hours), and a small part of an SD card or eMMC.
pub const SPOOL_MAX_BYTES: u64 = 1 << 30;
/// 16 MiB segments: deleting one reclaims space in steps small against the
/// quota, and recovery reads one segment at a time into memory.
pub const SPOOL_SEGMENT_BYTES: u64 = 16 << 20;
/// Acknowledge only after fdatasync, grouped: see `docs/durability.md`
/// for what each mode survives and what it costs.
pub const SPOOL_SYNC: SyncMode = SyncMode::Group;
/// With `sync = "interval"`: how much a power cut can lose.
pub const SPOOL_SYNC_INTERVAL: Duration = Duration::from_secs(1);
/// Default `[spool] commit_delay`.
pub const SPOOL_COMMIT_DELAY: Duration = Duration::from_millis(1);
/// Free space weir leaves on the spool's filesystem for the rest of the
/// box (logs, package updates).
pub const SPOOL_MIN_FREE_BYTES: u64 = 64 << 20;
/// Bytes of a spooled class held in memory at once (the rest is read back
/// from disk as the queue drains): RAM stays bounded however long the
/// uplink is down.
pub const SPOOL_WINDOW_BYTES: u64 = 8 << 20;
/// Classes keep records in memory unless configured otherwise, as before
/// the spool existed; see `docs/durability.md` for why.
pub const DURABILITY: Durability = Durability::Memory;
/// A full spool holds the device back rather than lose anything.
pub const ON_FULL: OnFull = OnFull::Block;

named_enum! {
    /// Where a class's records live between acknowledgement and delivery.
    pub enum Durability {
        /// In memory only: fastest; a crash loses what was not delivered.
        Memory = "memory",
        /// On disk before the acknowledgement: a crash loses nothing
        /// acknowledged.
        Spool = "spool",
    }
}

named_enum! {
    /// When appended records are made durable.
    pub enum SyncMode {
        /// fdatasync before acknowledging, one sync for every record
        /// appended since the last (group commit).
        Group = "group",
        /// Acknowledge once written to the OS; fdatasync every
        /// `sync_interval`.
        Interval = "interval",
        /// Acknowledge once written to the OS; never fdatasync (survives a
        /// crash of weir, not a power cut).
        None = "none",
    }
}

named_enum! {
    /// What a class does when its quota, the spool's, or the disk's free
    /// reserve is reached.
    pub enum OnFull {
        /// Withhold acknowledgements until space returns (back-pressure).
        Block = "block",
        /// Delete the class's oldest segment, dropping its records.
        DropOldest = "drop-oldest",
        /// Acknowledge and drop the new record.
        DropNewest = "drop-newest",
    }
}

impl OnFull {
    /// The core's policy.
    pub fn policy(self) -> FullPolicy {
        match self {
            OnFull::Block => FullPolicy::Block,
            OnFull::DropOldest => FullPolicy::DropOldest,
            OnFull::DropNewest => FullPolicy::DropNewest,
        }
    }
}

/// `[spool]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSpool {
    pub dir: Option<PathBuf>,
    pub max_bytes: Option<Written<Size>>,
    pub segment_bytes: Option<Written<Size>>,
    pub sync: Option<String>,
    pub sync_interval: Option<Written<HumanDuration>>,
    pub commit_delay: Option<Written<HumanDuration>>,
    pub min_free_bytes: Option<Written<Size>>,
    pub window_bytes: Option<Written<Size>>,
}

/// `[spool]` checked.
#[derive(Debug, Clone, PartialEq)]
pub struct SpoolConfig {
    /// Directory of the segment files (one subdirectory per class) and of
    /// the sequence-number lease.
    pub dir: PathBuf,
    /// All classes together hold at most this on disk.
    pub max_bytes: u64,
    /// A segment file is closed and a new one started past this size.
    pub segment_bytes: u64,
    /// When appends are made durable.
    pub sync: SyncMode,
    /// With [`SyncMode::Interval`], the longest time between syncs.
    pub sync_interval: Duration,
    /// With [`SyncMode::Group`], how long the writer may wait for more
    /// appends before a sync, when the arrival rate makes that worth it
    /// (`weir_core::spool::commit`); zero: never.
    pub commit_delay: Duration,
    /// Free space on the filesystem the spool never uses.
    pub min_free_bytes: u64,
    /// Bytes of each spooled class held in memory at once.
    pub window_bytes: u64,
}

/// The durability keys of one `[[class]]`, as written.
#[derive(Debug, Default)]
pub(crate) struct RawDurability {
    pub durability: Option<String>,
    pub spool_max_bytes: Option<Written<Size>>,
    pub on_full: Option<String>,
    pub ttl: Option<Written<HumanDuration>>,
}

/// One class's durability, checked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClassDurability {
    /// Memory or spool.
    pub durability: Durability,
    /// Most bytes the class may hold on disk.
    pub max_bytes: u64,
    /// What a full quota does.
    pub on_full: OnFull,
    /// Records older than this (since ingress) are dropped instead of
    /// sent; `None`: kept until delivered.
    pub ttl: Option<Duration>,
}

impl ClassDurability {
    /// Whether records of this class go to the spool.
    pub fn spooled(&self) -> bool {
        self.durability == Durability::Spool
    }
}

/// `[spool]` checked, or `None` after recording why.
pub(crate) fn spool(p: &mut Problems, raw: RawSpool) -> Option<SpoolConfig> {
    let before = p.len();
    let dir = raw.dir.unwrap_or_else(|| PathBuf::from(SPOOL_DIR));
    if dir.as_os_str().is_empty() {
        p.push("spool.dir", "must not be empty");
    }
    let max_bytes =
        p.positive_size_u64("spool.max_bytes", raw.max_bytes, SPOOL_MAX_BYTES, u64::MAX);
    let segment_bytes = p.positive_size(
        "spool.segment_bytes",
        raw.segment_bytes,
        SPOOL_SEGMENT_BYTES,
        1 << 30,
    );
    if let Some(s) = segment_bytes.filter(|&s| s < 4096) {
        p.push(
            "spool.segment_bytes",
            format!("{} is too small; use at least 4KiB", Size(s as u64)),
        );
    }
    if let (Some(seg), Some(max)) = (segment_bytes, max_bytes) {
        if seg as u64 > max {
            p.push(
                "spool.segment_bytes",
                format!(
                    "{} is larger than spool.max_bytes ({}); segments are deleted whole, so it must be smaller",
                    Size(seg as u64),
                    Size(max)
                ),
            );
        }
    }
    let sync = p.choice("spool.sync", "sync mode", raw.sync, SPOOL_SYNC);
    let sync_interval = p.positive_duration(
        "spool.sync_interval",
        raw.sync_interval,
        SPOOL_SYNC_INTERVAL,
    );
    let commit_delay = p.duration("spool.commit_delay", raw.commit_delay, SPOOL_COMMIT_DELAY);
    if let Some(d) = commit_delay.filter(|d| *d > Duration::from_secs(1)) {
        p.push(
            "spool.commit_delay",
            format!(
                "{} is too long: every acknowledgement may wait that long; use at most 1s",
                HumanDuration(d)
            ),
        );
    }
    let min_free_bytes = p
        .unit(
            "spool.min_free_bytes",
            raw.min_free_bytes,
            Size(SPOOL_MIN_FREE_BYTES),
        )
        .map(|(v, _)| v.0);
    let window_bytes = p.positive_size(
        "spool.window_bytes",
        raw.window_bytes,
        SPOOL_WINDOW_BYTES,
        u64::MAX,
    );
    if p.len() != before {
        return None;
    }
    Some(SpoolConfig {
        dir,
        max_bytes: max_bytes?,
        segment_bytes: segment_bytes? as u64,
        sync: sync?,
        sync_interval: sync_interval?,
        commit_delay: commit_delay?,
        min_free_bytes: min_free_bytes?,
        window_bytes: window_bytes? as u64,
    })
}

/// One class's durability keys checked (`path` is `class[i]`).
pub(crate) fn class_durability(
    p: &mut Problems,
    path: &str,
    raw: RawDurability,
) -> Option<ClassDurability> {
    let before = p.len();
    let durability = p.choice(
        &format!("{path}.durability"),
        "durability",
        raw.durability,
        DURABILITY,
    );
    let max_bytes = p.positive_size_u64(
        &format!("{path}.spool_max_bytes"),
        raw.spool_max_bytes,
        u64::MAX,
        u64::MAX,
    );
    let on_full = p.choice(&format!("{path}.on_full"), "policy", raw.on_full, ON_FULL);
    let ttl = match raw.ttl {
        None => Some(None),
        Some(w) => p
            .positive_duration(&format!("{path}.ttl"), Some(w), Duration::ZERO)
            .map(Some),
    };
    if p.len() != before {
        return None;
    }
    Some(ClassDurability {
        durability: durability?,
        max_bytes: max_bytes?,
        on_full: on_full?,
        ttl: ttl?,
    })
}

/// The durability of a class whose `[[class]]` sets none of the keys.
pub(crate) fn default_durability() -> ClassDurability {
    ClassDurability {
        durability: DURABILITY,
        max_bytes: u64::MAX,
        on_full: ON_FULL,
        ttl: None,
    }
}
