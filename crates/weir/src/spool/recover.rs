//! Start-up: each class's segments are read back, torn tails cut, corrupt
//! stretches skipped and counted, unreadable files moved aside, and the
//! class's log rebuilt with the release state of its checkpoint. Start-up
//! never fails because of what a segment holds.

use std::io;
use std::path::Path;

use bytes::Bytes;
use weir_core::spool::{ClassLog, Damage, Released, Scan, Scanned, SegmentHeader, SegmentMeta};
use weir_core::ClassId;

use super::files;
use super::shared::{ClassState, Cursor};
use crate::config::{ClassDurability, SpoolConfig};
use crate::metrics::Metrics;

/// What start-up found on disk.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Recovered {
    /// Undelivered records found, per class (by index; 0 for memory
    /// classes).
    pub records: Vec<u64>,
    /// Damaged stretches skipped.
    pub corrupt: u64,
    /// Bytes cut from torn tails.
    pub torn_bytes: u64,
    /// Segment files moved aside.
    pub quarantined: u64,
}

/// Rebuilds one class's log from `dir`.
pub(super) fn class(
    id: ClassId,
    name: &str,
    dir: &Path,
    config: &SpoolConfig,
    settings: &ClassDurability,
    metrics: &Metrics,
    found: &mut Recovered,
) -> io::Result<ClassState> {
    let mut names: Vec<(u64, std::path::PathBuf)> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter_map(|p| files::parse_segment_name(&p).map(|i| (i, p)))
        .collect();
    names.sort();
    let checkpoint = files::read_checkpoint(dir);
    let mut released = checkpoint
        .as_ref()
        .map_or_else(|| Released::new(0), |c| c.released());
    if let Some((first, _)) = names.first() {
        // Segments below the first one were deleted: all released.
        released.release_below(*first);
    }
    let mut metas = Vec::new();
    let mut tables = Vec::new();
    let mut damage = Vec::new();
    let mut cursor: Option<Cursor> = None;
    let mut unreleased = 0u64;
    let last = names.len().saturating_sub(1);
    for (k, (first_index, path)) in names.iter().enumerate() {
        let bytes = Bytes::from(std::fs::read(path)?);
        let (header, hlen) = match SegmentHeader::decode(&bytes) {
            Ok(h) => h,
            Err(error) => {
                metrics.spool.quarantined_segments.inc();
                found.quarantined += 1;
                match files::quarantine(path) {
                    Ok(to) => {
                        tracing::error!(file = %path.display(), moved_to = %to.display(), %error, "spool segment unreadable; moved aside, its records are not replayed")
                    }
                    Err(e) => {
                        tracing::error!(file = %path.display(), %error, rename_error = %e, "spool segment unreadable and cannot be moved aside; skipped")
                    }
                }
                continue;
            }
        };
        if header.first_index != *first_index {
            tracing::warn!(file = %path.display(), header_index = header.first_index, "spool segment's name and header disagree; the header wins");
        }
        if header.class != name {
            tracing::warn!(file = %path.display(), header_class = %header.class, class = name, "spool segment written for another class name; replayed as this class");
        }
        // Indices that no intact frame holds (a skipped corrupt frame, a
        // file moved aside) will never be delivered: count them released,
        // or they would hold every later segment on disk.
        if let Some(prev) = metas.last().map(|m: &SegmentMeta| m.end_index) {
            release_range(&mut released, prev, header.first_index);
        }
        let mut end_index = header.first_index;
        let mut valid = bytes.len() as u64;
        let mut reported = false;
        let mut scan = Scan::new(&header, bytes.clone(), hlen);
        for step in &mut scan {
            match step {
                Scanned::Frame { frame, offset, .. } => {
                    release_range(&mut released, end_index, frame.index);
                    end_index = frame.index + 1;
                    if !released.is_released(frame.index) {
                        unreleased += 1;
                        if cursor.is_none() {
                            cursor = Some(Cursor {
                                segment: header.first_index,
                                offset: offset as u64,
                            });
                        }
                    }
                }
                Scanned::Corrupt { start, end, error } => {
                    damage.push(Damage {
                        segment: header.first_index,
                        start: start as u64,
                        end: end as u64,
                    });
                    metrics.spool.corrupt(id);
                    found.corrupt += 1;
                    if !reported {
                        reported = true;
                        tracing::error!(file = %path.display(), offset = start, skipped_to = end, %error, "corrupt frames in spool segment skipped (further ones in this file are counted, not logged)");
                    }
                }
                Scanned::Tail { start, error } if k == last => {
                    let cut = bytes.len() - start;
                    metrics.spool.torn(id, cut as u64);
                    found.torn_bytes += cut as u64;
                    tracing::warn!(file = %path.display(), offset = start, bytes = cut, %error, "torn write at the end of the spool cut (it was never acknowledged)");
                    files::truncate(path, start as u64)?;
                    valid = start as u64;
                }
                Scanned::Tail { start, error } => {
                    damage.push(Damage {
                        segment: header.first_index,
                        start: start as u64,
                        end: bytes.len() as u64,
                    });
                    metrics.spool.corrupt(id);
                    found.corrupt += 1;
                    tracing::error!(file = %path.display(), offset = start, %error, "spool segment damaged from here to its end; the rest of it is skipped");
                }
            }
        }
        metas.push(SegmentMeta {
            first_index: header.first_index,
            end_index,
            bytes: valid,
        });
        tables.push((header.first_index, scan.into_keys()));
    }
    let durable_end = metas.last().map(|s| Cursor {
        segment: s.first_index,
        offset: s.bytes,
    });
    let mut log = ClassLog::new(
        metas,
        released,
        config.segment_bytes,
        settings.max_bytes,
        settings.on_full.policy(),
    );
    for (segment, keys) in tables {
        log.restore_keys(segment, keys);
    }
    // Counted here; the reader skips these without counting them again.
    for d in damage {
        log.note_damage(d);
    }
    found.records[id.index()] = unreleased;
    metrics.spool.recovered(id, unreleased);
    if unreleased > 0 {
        tracing::info!(
            class = name,
            records = unreleased,
            bytes = log.bytes(),
            "replaying undelivered records from the spool"
        );
    }
    Ok(ClassState {
        log,
        behind: cursor,
        durable_end,
        checkpoint_dirty: true,
        blocked: None,
    })
}

/// Marks `from..to` released.
fn release_range(released: &mut Released, from: u64, to: u64) {
    for i in from..to {
        released.release(i);
    }
}
