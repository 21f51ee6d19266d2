//! Start-up: each class's segments are read back, torn tails cut, corrupt
//! stretches skipped and counted, unreadable files moved aside, and the
//! class's log rebuilt with the release state of its checkpoint. Start-up
//! never fails because of what a segment holds.

use std::io;
use std::path::Path;

use bytes::Bytes;
use weir_core::spool::{
    ClassLog, Damage, Released, Scan, Scanned, SegmentHeader, SegmentKeys, SegmentMeta,
};
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
    let mut replay = Replay {
        id,
        class: name,
        metrics,
        found,
        released,
        metas: Vec::new(),
        tables: Vec::new(),
        damage: Vec::new(),
        cursor: None,
        unreleased: 0,
    };
    let last = names.len().saturating_sub(1);
    for (k, (first_index, path)) in names.iter().enumerate() {
        replay.segment(*first_index, path, k == last)?;
    }
    let Replay {
        found,
        released,
        metas,
        tables,
        damage,
        cursor,
        unreleased,
        ..
    } = replay;
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

/// What the read-back of one class's segments has found so far.
struct Replay<'a> {
    id: ClassId,
    class: &'a str,
    metrics: &'a Metrics,
    found: &'a mut Recovered,
    released: Released,
    metas: Vec<SegmentMeta>,
    tables: Vec<(u64, SegmentKeys)>,
    damage: Vec<Damage>,
    /// The first unreleased record: where the reader starts.
    cursor: Option<Cursor>,
    unreleased: u64,
}

impl Replay<'_> {
    /// Reads one segment file back: moved aside if its header is
    /// unreadable, its torn tail cut if it is the `last`, corrupt
    /// stretches noted.
    fn segment(&mut self, first_index: u64, path: &Path, last: bool) -> io::Result<()> {
        let bytes = Bytes::from(std::fs::read(path)?);
        let (header, hlen) = match SegmentHeader::decode(&bytes) {
            Ok(h) => h,
            Err(error) => {
                self.metrics.spool.quarantined_segments.inc();
                self.found.quarantined += 1;
                match files::quarantine(path) {
                    Ok(to) => {
                        tracing::error!(file = %path.display(), moved_to = %to.display(), %error, "spool segment unreadable; moved aside, its records are not replayed")
                    }
                    Err(e) => {
                        tracing::error!(file = %path.display(), %error, rename_error = %e, "spool segment unreadable and cannot be moved aside; skipped")
                    }
                }
                return Ok(());
            }
        };
        if header.first_index != first_index {
            tracing::warn!(file = %path.display(), header_index = header.first_index, "spool segment's name and header disagree; the header wins");
        }
        if header.class != self.class {
            tracing::warn!(file = %path.display(), header_class = %header.class, class = self.class, "spool segment written for another class name; replayed as this class");
        }
        // Indices that no intact frame holds (a skipped corrupt frame, a
        // file moved aside) will never be delivered: count them released,
        // or they would hold every later segment on disk.
        if let Some(prev) = self.metas.last().map(|m| m.end_index) {
            release_range(&mut self.released, prev, header.first_index);
        }
        let mut end_index = header.first_index;
        let mut valid = bytes.len() as u64;
        let mut reported = false;
        let mut scan = Scan::new(&header, bytes.clone(), hlen);
        for step in &mut scan {
            match step {
                Scanned::Frame { frame, offset, .. } => {
                    release_range(&mut self.released, end_index, frame.index);
                    end_index = frame.index + 1;
                    if !self.released.is_released(frame.index) {
                        self.unreleased += 1;
                        self.cursor.get_or_insert(Cursor {
                            segment: header.first_index,
                            offset: offset as u64,
                        });
                    }
                }
                Scanned::Corrupt { start, end, error } => {
                    self.damaged(header.first_index, start, end);
                    if !reported {
                        reported = true;
                        tracing::error!(file = %path.display(), offset = start, skipped_to = end, %error, "corrupt frames in spool segment skipped (further ones in this file are counted, not logged)");
                    }
                }
                Scanned::Tail { start, error } if last => {
                    let cut = bytes.len() - start;
                    self.metrics.spool.torn(self.id, cut as u64);
                    self.found.torn_bytes += cut as u64;
                    tracing::warn!(file = %path.display(), offset = start, bytes = cut, %error, "torn write at the end of the spool cut (it was never acknowledged)");
                    files::truncate(path, start as u64)?;
                    valid = start as u64;
                }
                Scanned::Tail { start, error } => {
                    self.damaged(header.first_index, start, bytes.len());
                    tracing::error!(file = %path.display(), offset = start, %error, "spool segment damaged from here to its end; the rest of it is skipped");
                }
            }
        }
        self.metas.push(SegmentMeta {
            first_index: header.first_index,
            end_index,
            bytes: valid,
        });
        self.tables.push((header.first_index, scan.into_keys()));
        Ok(())
    }

    /// Notes (and counts, once) a damaged stretch of a segment.
    fn damaged(&mut self, segment: u64, start: usize, end: usize) {
        self.damage.push(Damage {
            segment,
            start: start as u64,
            end: end as u64,
        });
        self.metrics.spool.corrupt(self.id);
        self.found.corrupt += 1;
    }
}

/// Marks `from..to` released.
fn release_range(released: &mut Released, from: u64, to: u64) {
    for i in from..to {
        released.release(i);
    }
}
