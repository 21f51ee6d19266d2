//! The spool's metrics (`weir_spool_*`).

use std::sync::atomic::AtomicI64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use weir_core::spool::Limit;
use weir_core::{ClassId, ClassSet};

use super::labels::{ClassLabel, ReasonLabel};

/// Why spooled records were dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// `on_full = "drop-newest"`: the new record.
    Full,
    /// `on_full = "drop-oldest"`: records of a deleted segment.
    Evicted,
    /// Older than the class's `ttl`.
    Ttl,
}

impl DropReason {
    fn as_str(self) -> &'static str {
        match self {
            DropReason::Full => "full",
            DropReason::Evicted => "evicted",
            DropReason::Ttl => "ttl",
        }
    }
}

/// `weir_spool_*`.
#[derive(Debug, Default)]
pub struct SpoolMetrics {
    names: Vec<ClassLabel>,
    bytes: Family<ClassLabel, Gauge<i64, AtomicI64>>,
    records: Family<ClassLabel, Gauge<i64, AtomicI64>>,
    appended: Family<ClassLabel, Counter>,
    recovered: Family<ClassLabel, Counter>,
    dropped: Family<ReasonLabel, Counter>,
    corrupt_frames: Family<ClassLabel, Counter>,
    torn_bytes: Family<ClassLabel, Counter>,
    blocked: Family<ReasonLabel, Gauge<i64, AtomicI64>>,
    /// Segment files moved aside because their header could not be read.
    pub quarantined_segments: Counter,
    /// fdatasync calls on segment files.
    pub syncs: Counter,
    /// Bytes written to segment files (headers and frames), each once.
    pub written_bytes: Counter,
    /// Failed writes or syncs (full disk, I/O errors).
    pub write_errors: Counter,
    /// Segments abandoned after a failed write or sync (their unsynced
    /// records rewritten to a new segment).
    pub abandoned_segments: Counter,
}

impl SpoolMetrics {
    /// The family for these classes.
    pub fn new(classes: &ClassSet) -> Self {
        SpoolMetrics {
            names: classes
                .iter()
                .map(|(_, c)| ClassLabel {
                    class: c.name.clone(),
                })
                .collect(),
            ..Default::default()
        }
    }

    /// Registers every metric under `weir_spool_`.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("spool");
        r.register(
            "bytes",
            "Bytes of segment files on disk",
            self.bytes.clone(),
        );
        r.register(
            "records",
            "Records on disk not yet delivered",
            self.records.clone(),
        );
        r.register(
            "appended_records",
            "Records appended to the spool",
            self.appended.clone(),
        );
        r.register(
            "recovered_records",
            "Undelivered records found on disk at start-up",
            self.recovered.clone(),
        );
        r.register(
            "dropped_records",
            "Spooled records dropped by policy (on_full, ttl)",
            self.dropped.clone(),
        );
        r.register(
            "corrupt_frames",
            "Damaged stretches skipped while reading segments",
            self.corrupt_frames.clone(),
        );
        r.register(
            "torn_tail_bytes",
            "Bytes cut from the end of a segment after a crash (a write that never completed)",
            self.torn_bytes.clone(),
        );
        r.register(
            "quarantined_segments",
            "Segment files moved aside (unreadable header)",
            self.quarantined_segments.clone(),
        );
        r.register(
            "blocked",
            "1 while a limit refuses the class's appends (acknowledgements wait): reason spool_max_bytes, max_bytes, min_free_bytes or writer_backlog",
            self.blocked.clone(),
        );
        r.register("syncs", "fdatasync calls on segments", self.syncs.clone());
        r.register(
            "written_bytes",
            "Bytes written to segment files (headers and frames; what the device sees is more, by the pages a sync writes again)",
            self.written_bytes.clone(),
        );
        r.register(
            "write_errors",
            "Failed segment writes or syncs (the segment is abandoned, its unsynced records rewritten to a new one)",
            self.write_errors.clone(),
        );
        r.register(
            "abandoned_segments",
            "Segments abandoned after a failed write or sync: never written through again, cut back to what was synced",
            self.abandoned_segments.clone(),
        );
    }

    fn label(&self, class: ClassId) -> &ClassLabel {
        &self.names[class.index()]
    }

    /// The class's log now.
    pub fn set_log(&self, class: ClassId, bytes: u64, records: u64) {
        self.bytes
            .get_or_create(self.label(class))
            .set(bytes as i64);
        self.records
            .get_or_create(self.label(class))
            .set(records as i64);
    }

    /// `n` records appended.
    pub fn appended(&self, class: ClassId, n: u64) {
        self.appended.get_or_create(self.label(class)).inc_by(n);
    }

    /// `n` records found at start-up.
    pub fn recovered(&self, class: ClassId, n: u64) {
        self.recovered.get_or_create(self.label(class)).inc_by(n);
    }

    /// `n` records dropped for `reason`.
    pub fn dropped(&self, class: ClassId, reason: DropReason, n: u64) {
        self.dropped
            .get_or_create(&ReasonLabel {
                class: self.label(class).class.clone(),
                reason: reason.as_str().to_owned(),
            })
            .inc_by(n);
    }

    /// A damaged stretch skipped.
    pub fn corrupt(&self, class: ClassId) {
        self.corrupt_frames.get_or_create(self.label(class)).inc();
    }

    /// Shows every limit of a spooled class as not blocking, so that the
    /// series exist before the first block.
    pub fn spooled(&self, class: ClassId) {
        for limit in Limit::ALL {
            self.blocked(class, limit, false);
        }
    }

    /// Whether `limit` refuses `class`'s appends now.
    pub fn blocked(&self, class: ClassId, limit: Limit, blocked: bool) {
        self.blocked
            .get_or_create(&ReasonLabel {
                class: self.label(class).class.clone(),
                reason: limit.as_str().to_owned(),
            })
            .set(i64::from(blocked));
    }

    /// A torn tail of `bytes` cut.
    pub fn torn(&self, class: ClassId, bytes: u64) {
        self.torn_bytes
            .get_or_create(self.label(class))
            .inc_by(bytes);
    }
}
