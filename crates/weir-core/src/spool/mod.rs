//! The durable spool's decisions and format, without the files: how a
//! record is framed on disk and read back after a crash, which records a
//! class's log still owes, when a segment may be deleted, and what a full
//! quota means. The relay's `spool` module does the writing, syncing and
//! reading.
//!
//! # Layout
//! - [`frame`]: the segment header and the record frame (length, CRC32C,
//!   deltas against the header).
//! - [`commit`]: when a group commit starts (waiting for more appends
//!   when that saves page rewrites).
//! - [`keys`]: a segment's key table (a repeated topic is an id).
//! - [`scan`]: reading a segment back: intact frames, corrupt stretches
//!   skipped, the torn tail found.
//! - [`released`]: the low-water mark and bitmap of released records.
//! - [`log`]: one class's log: segments, appends, releases, deletions,
//!   quotas and the policy when full.
//! - [`Checkpoint`]: the release state as written beside the segments, so
//!   that a restart does not replay what was already delivered.

pub mod commit;
pub mod frame;
pub mod keys;
pub mod log;
pub mod released;
pub mod scan;

#[cfg(test)]
mod tests;

pub use commit::GroupCommit;
pub use frame::{Frame, FrameError, FrameRef, HeaderError, SegmentHeader};
pub use keys::{KeyField, SegmentKeys};
pub use log::{
    Admit, ClassLog, Damage, Eviction, FullPolicy, Limit, LogPosition, ReadPlan, SegmentMeta,
    SpoolRoom,
};
pub use released::Released;
pub use scan::{Scan, Scanned};

use bytes::BufMut;

/// First bytes of a version 1 checkpoint file (every released index
/// above the mark, 8 bytes each); still read.
const CHECKPOINT_MAGIC_V1: &[u8; 8] = b"WEIRCKP1";
/// Released indices above the mark a checkpoint may hold.
const MAX_CHECKPOINT_ABOVE: u64 = 1 << 24;
/// First bytes of a checkpoint file: the released indices above the mark
/// as runs.
const CHECKPOINT_MAGIC: &[u8; 8] = b"WEIRCKP2";

/// A class log's release state as stored: the low-water mark and the
/// released indices above it. A lost or stale checkpoint only means
/// records delivered before the crash are delivered again (consumers
/// deduplicate by `(origin, seq)`), never that one is lost, so it is
/// written without fsync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// Everything below is released.
    pub low_water: u64,
    /// Released indices above the mark, ascending.
    pub above: Vec<u64>,
}

impl Checkpoint {
    /// The checkpoint of `released`.
    pub fn of(released: &Released) -> Self {
        Checkpoint {
            low_water: released.low_water(),
            above: released.above().collect(),
        }
    }

    /// The release state it describes.
    pub fn released(&self) -> Released {
        let mut r = Released::new(self.low_water);
        for &i in &self.above {
            r.release(i);
        }
        r
    }

    /// The file's bytes: the mark, then the released indices above it as
    /// runs (gap from the previous run's end, length less one; varints),
    /// then a CRC32C. Out-of-order releases come in runs (a batch
    /// confirmed ahead of another), so a checkpoint stays a few bytes per
    /// batch in flight, however many records those hold.
    pub fn encode(&self) -> Vec<u8> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for &i in &self.above {
            match runs.last_mut() {
                Some((start, len)) if *start + *len == i => *len += 1,
                _ => runs.push((i, 1)),
            }
        }
        let mut out = Vec::with_capacity(24 + 4 * runs.len());
        out.extend_from_slice(CHECKPOINT_MAGIC);
        out.put_u64_le(self.low_water);
        out.put_u32_le(runs.len() as u32);
        let mut end = self.low_water;
        for (start, len) in runs {
            frame::put_varint(&mut out, start - end);
            frame::put_varint(&mut out, len - 1);
            end = start + len;
        }
        let crc = crc32c::crc32c(&out);
        out.put_u32_le(crc);
        out
    }

    /// Reads a checkpoint file; `None` if it is damaged (then nothing
    /// counts as released, and the log replays from its first segment).
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() < 24 {
            return None;
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().ok()?) {
            return None;
        }
        let low_water = u64::from_le_bytes(body[8..16].try_into().ok()?);
        let n = u32::from_le_bytes(body[16..20].try_into().ok()?) as usize;
        let rest = &body[20..];
        let above = match &body[..8] {
            m if m == CHECKPOINT_MAGIC_V1 => {
                if rest.len() != 8 * n {
                    return None;
                }
                rest.chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                    .collect()
            }
            m if m == CHECKPOINT_MAGIC => {
                let mut above = Vec::new();
                let (mut at, mut end) = (0, low_water);
                for _ in 0..n {
                    let (gap, a) = frame::get_varint(&rest[at..])?;
                    let (len, b) = frame::get_varint(&rest[at + a..])?;
                    at += a + b;
                    let start = end.checked_add(gap)?;
                    end = start.checked_add(len)?.checked_add(1)?;
                    // More than the releases any log holds in flight is
                    // damage, not a checkpoint.
                    if above.len() as u64 + len >= MAX_CHECKPOINT_ABOVE {
                        return None;
                    }
                    above.extend(start..end);
                }
                if at != rest.len() {
                    return None;
                }
                above
            }
            _ => return None,
        };
        Some(Checkpoint { low_water, above })
    }
}
