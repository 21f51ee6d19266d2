//! The durable spool's decisions and format, without the files: how a
//! record is framed on disk and read back after a crash, which records a
//! class's log still owes, when a segment may be deleted, and what a full
//! quota means. The relay's `spool` module does the writing, syncing and
//! reading.
//!
//! # Layout
//! - [`frame`]: the segment header and the record frame (length, CRC32C,
//!   deltas against the header).
//! - [`scan`]: reading a segment back: intact frames, corrupt stretches
//!   skipped, the torn tail found.
//! - [`released`]: the low-water mark and bitmap of released records.
//! - [`log`]: one class's log: segments, appends, releases, deletions,
//!   quotas and the policy when full.
//! - [`Checkpoint`]: the release state as written beside the segments, so
//!   that a restart does not replay what was already delivered.

pub mod frame;
pub mod log;
pub mod released;
pub mod scan;

#[cfg(test)]
mod tests;

pub use frame::{Frame, FrameError, HeaderError, SegmentHeader};
pub use log::{
    Admit, ClassLog, Eviction, FullPolicy, LogPosition, ReadPlan, SegmentMeta, SpoolRoom,
};
pub use released::Released;
pub use scan::{Scan, Scanned};

use bytes::BufMut;

/// First bytes of a checkpoint file.
const CHECKPOINT_MAGIC: &[u8; 8] = b"WEIRCKP1";

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

    /// The file's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(24 + 8 * self.above.len());
        out.extend_from_slice(CHECKPOINT_MAGIC);
        out.put_u64_le(self.low_water);
        out.put_u32_le(self.above.len() as u32);
        for &i in &self.above {
            out.put_u64_le(i);
        }
        let crc = crc32c::crc32c(&out);
        out.put_u32_le(crc);
        out
    }

    /// Reads a checkpoint file; `None` if it is damaged (then nothing
    /// counts as released, and the log replays from its first segment).
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() < 24 || &bytes[..8] != CHECKPOINT_MAGIC {
            return None;
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().ok()?) {
            return None;
        }
        let low_water = u64::from_le_bytes(body[8..16].try_into().ok()?);
        let n = u32::from_le_bytes(body[16..20].try_into().ok()?) as usize;
        if body.len() != 20 + 8 * n {
            return None;
        }
        let above = body[20..]
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        Some(Checkpoint { low_water, above })
    }
}
