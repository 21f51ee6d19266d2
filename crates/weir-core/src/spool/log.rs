//! The bookkeeping of one class's log: its segments, the next index, what
//! is released, what may be deleted, and what a full quota means.

use std::collections::VecDeque;

use super::frame::{Frame, FrameError, VERSION};
use super::keys::{KeyField, SegmentKeys};
use super::released::Released;

/// What a class does with a record that does not fit its quota (or the
/// spool's total, or the disk's free-space reserve).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FullPolicy {
    /// Hold the record back until space returns: the device's
    /// acknowledgement waits (back-pressure). Nothing is lost.
    #[default]
    Block,
    /// Make room by deleting the class's oldest segment; its records that
    /// were not yet read back into memory are dropped and counted.
    DropOldest,
    /// Acknowledge and drop the new record, counted.
    DropNewest,
}

/// One segment file of a log, as the bookkeeping sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentMeta {
    /// Index of its first record (also its file name).
    pub first_index: u64,
    /// One past its last record's index.
    pub end_index: u64,
    /// Its length on disk, header included.
    pub bytes: u64,
}

/// A place in a class's log: a segment (by its first index) and a byte
/// offset in its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogPosition {
    /// The segment's first record index.
    pub segment: u64,
    /// Byte offset in the segment file.
    pub offset: u64,
}

/// What a reader refilling memory from the log may do next, from where it
/// stands ([`ClassLog::read_plan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadPlan {
    /// No segment at or after the reader's: everything was deleted
    /// (delivered or dropped by policy); it has caught up.
    CaughtUp,
    /// The reader's segment is gone (dropped by policy): go on at the
    /// start of this one.
    Skip {
        /// The next segment still on disk.
        segment: u64,
    },
    /// Read the reader's segment up to byte `limit`; at the limit, go on
    /// with `next` if given, else stop: the reader is at the durable end.
    Read {
        /// End of what may be read.
        limit: u64,
        /// The segment after this one, once this one is read to its end.
        next: Option<u64>,
    },
}

/// What to do with a record about to be appended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// It fits: append it.
    Append,
    /// Over a limit and the policy is [`FullPolicy::Block`]: wait for space.
    Block,
    /// Over a limit and the policy is [`FullPolicy::DropNewest`]: drop it.
    DropNewest,
    /// Over a limit and the policy is [`FullPolicy::DropOldest`]: call
    /// [`ClassLog::evict_oldest`], then ask again.
    EvictOldest,
}

/// The limits an append is checked against, besides the class's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpoolRoom {
    /// Bytes all classes' logs take now, with the appends admitted and not
    /// yet written.
    pub total_bytes: u64,
    /// The spool's total quota.
    pub total_max: u64,
    /// Free bytes on the spool's filesystem (as last measured).
    pub disk_free: u64,
    /// Free bytes weir never eats into.
    pub disk_reserve: u64,
    /// Bytes admitted to the writer and not yet written, all classes.
    pub pending_bytes: u64,
    /// Most bytes admitted and not yet written: appends beyond wait, so a
    /// burst cannot grow the writer's backlog without bound.
    pub pending_max: u64,
}

impl SpoolRoom {
    /// Free bytes the spool may still use on its filesystem.
    pub fn usable_disk(&self) -> u64 {
        self.disk_free.saturating_sub(self.disk_reserve)
    }
}

/// The limit that keeps a record out of the spool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Limit {
    /// The class's own quota (`spool_max_bytes`).
    ClassQuota,
    /// The spool's quota for all classes (`spool.max_bytes`).
    SpoolQuota,
    /// The filesystem's free space is down to `spool.min_free_bytes`.
    DiskReserve,
    /// The writer has as many bytes not yet written as it admits; passes
    /// as soon as it writes them.
    WriterBacklog,
}

impl Limit {
    /// Every limit, for metrics that show each.
    pub const ALL: [Limit; 4] = [
        Limit::ClassQuota,
        Limit::SpoolQuota,
        Limit::DiskReserve,
        Limit::WriterBacklog,
    ];

    /// The name metrics and logs use: the config key that sets the limit,
    /// or what it is.
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::ClassQuota => "spool_max_bytes",
            Limit::SpoolQuota => "max_bytes",
            Limit::DiskReserve => "min_free_bytes",
            Limit::WriterBacklog => "writer_backlog",
        }
    }
}

/// A segment dropped whole by [`FullPolicy::DropOldest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Eviction {
    /// The segment to delete.
    pub segment: SegmentMeta,
    /// Whether it was the segment being appended to (its file must be
    /// closed; the next append starts a new one).
    pub was_active: bool,
    /// Records in it that were not released before.
    pub dropped: u64,
}

/// A damaged stretch of a segment, known from a scan: a reader that meets
/// it again skips it without counting it twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Damage {
    /// The segment (its first index).
    pub segment: u64,
    /// Byte offset where the damage starts.
    pub start: u64,
    /// Byte offset of the next intact frame (or the readable end).
    pub end: u64,
}

/// The bookkeeping of one class's log. The last segment is the one being
/// appended to; all others are sealed.
#[derive(Debug, Clone)]
pub struct ClassLog {
    segments: VecDeque<SegmentMeta>,
    /// Damage found by start-up's scan in segments still in the log.
    damage: Vec<Damage>,
    /// Each segment's key table, beside `segments`.
    keys: VecDeque<SegmentKeys>,
    next_index: u64,
    released: Released,
    segment_bytes: u64,
    max_bytes: u64,
    policy: FullPolicy,
    bytes: u64,
    /// Bytes admitted and not yet written: they count against the
    /// class's quota before they are on disk.
    pending: u64,
    /// The last segment takes no more appends: it was abandoned (a write
    /// or sync of it failed), or it was sealed before the one abandoned.
    sealed: bool,
}

impl ClassLog {
    /// A log holding `segments` (ascending, as found on disk; empty for a
    /// new log), with `released` as read from its checkpoint. New segments
    /// start once the active one would pass `segment_bytes`; the class may
    /// hold `max_bytes` on disk.
    pub fn new(
        segments: Vec<SegmentMeta>,
        released: Released,
        segment_bytes: u64,
        max_bytes: u64,
        policy: FullPolicy,
    ) -> Self {
        let next_index = segments.last().map_or(released.low_water(), |s| {
            s.end_index.max(released.low_water())
        });
        let bytes = segments.iter().map(|s| s.bytes).sum();
        ClassLog {
            keys: segments
                .iter()
                .map(|_| SegmentKeys::for_version(VERSION))
                .collect(),
            segments: segments.into(),
            damage: Vec::new(),
            next_index,
            released,
            segment_bytes,
            max_bytes,
            policy,
            bytes,
            pending: 0,
            sealed: false,
        }
    }

    /// Index the next append gets.
    pub fn next_index(&self) -> u64 {
        self.next_index
    }

    /// Bytes on disk, headers included.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The release state (for checkpoints).
    pub fn released(&self) -> &Released {
        &self.released
    }

    /// Records appended and not released.
    pub fn unreleased(&self) -> u64 {
        self.next_index - self.released.low_water() - self.released.above().count() as u64
    }

    /// Bytes on disk from `at` on (a reader's backlog: what it has yet to
    /// read back, headers of later segments included).
    pub fn bytes_from(&self, at: LogPosition) -> u64 {
        self.segments
            .iter()
            .skip_while(|s| s.first_index < at.segment)
            .map(|s| match s.first_index == at.segment {
                true => s.bytes.saturating_sub(at.offset),
                false => s.bytes,
            })
            .sum()
    }

    /// The segments, oldest first.
    pub fn segments(&self) -> impl ExactSizeIterator<Item = &SegmentMeta> {
        self.segments.iter()
    }

    /// What a reader at `at` may read, given `durable_end`, the end of
    /// what the writer has synced (`None`: nothing written since start).
    /// Only durable bytes are read. The segment holding the durable end is
    /// read up to it and never left: a later segment may have been started
    /// by the group being written, whose records in this one (past the
    /// durable end) are not readable yet. An earlier segment is sealed,
    /// and whole on disk.
    pub fn read_plan(&self, at: LogPosition, durable_end: Option<LogPosition>) -> ReadPlan {
        let mut segs = self
            .segments
            .iter()
            .skip_while(|s| s.first_index < at.segment);
        let Some(here) = segs.next() else {
            return ReadPlan::CaughtUp;
        };
        if here.first_index != at.segment {
            return ReadPlan::Skip {
                segment: here.first_index,
            };
        }
        match durable_end {
            Some(d) if d.segment <= at.segment => ReadPlan::Read {
                limit: d.offset,
                next: None,
            },
            _ => ReadPlan::Read {
                limit: here.bytes,
                next: segs.next().map(|s| s.first_index),
            },
        }
    }

    /// Sets the key table of a segment found on disk, as its scan learnt
    /// it (and its format version allows).
    pub fn restore_keys(&mut self, segment: u64, keys: SegmentKeys) {
        if let Ok(k) = self.position(segment) {
            self.keys[k] = keys;
        }
    }

    /// How the next frame, at byte `offset` of the active segment, carries
    /// `key` ([`SegmentKeys::field`]).
    ///
    /// # Panics
    /// If there is no active segment.
    pub fn key_field(&mut self, key: &[u8], offset: u64) -> KeyField {
        self.keys
            .back_mut()
            .expect("a key needs an active segment")
            .field(key, offset)
    }

    /// The key table of `segment`, if it is still in the log.
    pub fn keys(&self, segment: u64) -> Option<&SegmentKeys> {
        Some(&self.keys[self.position(segment).ok()?])
    }

    fn position(&self, segment: u64) -> Result<usize, usize> {
        self.segments
            .binary_search_by_key(&segment, |s| s.first_index)
    }

    /// Fills in the key of a frame of `segment` read back with `field`
    /// (the writer defined every id before the frame became readable).
    pub fn resolve_key(
        &self,
        segment: u64,
        frame: &mut Frame,
        field: KeyField,
    ) -> Result<(), FrameError> {
        match (field, self.keys(segment)) {
            (KeyField::Use(id), Some(keys)) => {
                frame.key = keys.get(id).ok_or(FrameError::UnknownKey(id))?.clone();
                Ok(())
            }
            (KeyField::Use(id), None) => Err(FrameError::UnknownKey(id)),
            _ => Ok(()),
        }
    }

    /// Whether `index` is released.
    pub fn is_released(&self, index: u64) -> bool {
        self.released.is_released(index)
    }

    /// A frame of `frame_len` bytes was admitted: it counts against the
    /// class's quota until [`Self::settled`].
    pub fn admitted(&mut self, frame_len: u64) {
        self.pending += frame_len;
    }

    /// An admitted frame left the writer's backlog (appended, or given up
    /// unacknowledged).
    pub fn settled(&mut self, frame_len: u64) {
        self.pending = self.pending.saturating_sub(frame_len);
    }

    /// The limit a frame of `frame_len` bytes would pass, if any: the
    /// writer's backlog first (it passes by itself), then the class's
    /// quota, the spool's, and the disk's reserve.
    pub fn limit(&self, frame_len: u64, room: &SpoolRoom) -> Option<Limit> {
        if room.pending_bytes > 0 && room.pending_bytes + frame_len > room.pending_max {
            Some(Limit::WriterBacklog)
        } else if self.bytes + self.pending + frame_len > self.max_bytes {
            Some(Limit::ClassQuota)
        } else if room.total_bytes + frame_len > room.total_max {
            Some(Limit::SpoolQuota)
        } else if room.usable_disk() < frame_len {
            Some(Limit::DiskReserve)
        } else {
            None
        }
    }

    /// Whether a frame of `frame_len` bytes may be appended now. The
    /// writer's backlog always blocks (it passes by itself); any other
    /// limit is the class's policy's to answer.
    pub fn admit(&self, frame_len: u64, room: &SpoolRoom) -> Admit {
        self.admit_under(self.limit(frame_len, room))
    }

    /// [`Self::admit`] for a frame that [`Self::limit`] already placed
    /// under `limit`.
    pub fn admit_under(&self, limit: Option<Limit>) -> Admit {
        match limit {
            None => return Admit::Append,
            Some(Limit::WriterBacklog) => return Admit::Block,
            Some(_) => {}
        }
        match self.policy {
            FullPolicy::Block => Admit::Block,
            FullPolicy::DropNewest => Admit::DropNewest,
            FullPolicy::DropOldest if self.segments.is_empty() => Admit::Block,
            FullPolicy::DropOldest => Admit::EvictOldest,
        }
    }

    /// Whether appending a frame of `frame_len` bytes must first start a
    /// new segment (there is none, or the active one would pass
    /// `segment_bytes` and already holds a record).
    pub fn needs_segment(&self, frame_len: u64) -> bool {
        match self.segments.back() {
            None => true,
            Some(_) if self.sealed => true,
            Some(s) => s.end_index > s.first_index && s.bytes + frame_len > self.segment_bytes,
        }
    }

    /// Whether frames of `frame_len` bytes in all go to the active segment
    /// as it is: no new segment first, and no segment evicted to make room
    /// (what the writer checks before appending beside a sync in flight).
    pub fn fits_active(&self, frame_len: u64, room: &SpoolRoom) -> bool {
        !self.needs_segment(frame_len) && self.admit(frame_len, room) != Admit::EvictOldest
    }

    /// A new active segment of `header_len` bytes starts at
    /// [`Self::next_index`]; the previous one is sealed.
    pub fn start_segment(&mut self, header_len: u64) -> SegmentMeta {
        let s = SegmentMeta {
            first_index: self.next_index,
            end_index: self.next_index,
            bytes: header_len,
        };
        self.segments.push_back(s);
        self.sealed = false;
        if let Some(k) = self.keys.back_mut() {
            k.seal();
        }
        self.keys.push_back(SegmentKeys::for_version(VERSION));
        self.bytes += header_len;
        s
    }

    /// A frame of `frame_len` bytes was appended to the active segment;
    /// returns its index.
    ///
    /// # Panics
    /// If there is no active segment ([`Self::needs_segment`] said so).
    pub fn append(&mut self, frame_len: u64) -> u64 {
        let s = self
            .segments
            .back_mut()
            .expect("append needs an active segment");
        let index = self.next_index;
        s.end_index = index + 1;
        s.bytes += frame_len;
        self.bytes += frame_len;
        self.next_index += 1;
        index
    }

    /// A write or sync of the active segment failed: the segment keeps only
    /// its first `kept_bytes` (what was synced before), holding the records
    /// below `kept_end`, and nothing more is appended to it (after a
    /// failed sync the file's state cannot be trusted: Linux may have
    /// dropped the data and report the next sync as a success). The
    /// records from `kept_end` on are appended again, with the same
    /// indices, to a new segment. A segment left without a record leaves
    /// the log (its file is replaced by the new segment, which has its
    /// name). Returns the bytes the log no longer counts.
    ///
    /// # Panics
    /// If there is no active segment, or `kept_end` is outside it.
    pub fn abandon_active(&mut self, kept_bytes: u64, kept_end: u64) -> u64 {
        let s = self
            .segments
            .back_mut()
            .expect("abandoning needs an active segment");
        assert!(
            (s.first_index..=s.end_index).contains(&kept_end),
            "records kept must be the segment's"
        );
        self.next_index = kept_end;
        self.sealed = true;
        if kept_end == s.first_index {
            let gone = s.bytes;
            self.segments.pop_back();
            self.keys.pop_back();
            self.bytes -= gone;
            return gone;
        }
        let dropped = s.bytes.saturating_sub(kept_bytes);
        s.bytes -= dropped;
        s.end_index = kept_end;
        self.bytes -= dropped;
        dropped
    }

    /// Marks a delivered record released; returns whether it was not yet.
    pub fn release(&mut self, index: u64) -> bool {
        index < self.next_index && self.released.release(index)
    }

    /// Sealed segments every record of which is released, oldest first,
    /// removed from the log: delete their files.
    pub fn take_deletable(&mut self) -> Vec<SegmentMeta> {
        let mut out = Vec::new();
        while self.segments.len() > 1 {
            let front = self.segments[0];
            if front.end_index > self.released.low_water() {
                break;
            }
            self.segments.pop_front();
            self.keys.pop_front();
            self.bytes -= front.bytes;
            self.damage.retain(|d| d.segment != front.first_index);
            out.push(front);
        }
        out
    }

    /// The active segment, removed from the log, when every record in it is
    /// released and a frame of `wanted` bytes (one the class could not
    /// append) still passes a limit: a delivered segment would otherwise
    /// hold its bytes against every limit for good, since only an append
    /// could seal it and no append is admitted. The caller closes and
    /// deletes its file; the next append starts a new segment. Without
    /// such pressure a delivered active segment stays, to be appended to.
    pub fn reclaim_active(&mut self, wanted: u64, room: &SpoolRoom) -> Option<SegmentMeta> {
        let active = *self.segments.back()?;
        let delivered =
            (active.first_index..active.end_index).all(|i| self.released.is_released(i));
        let pressed = matches!(
            self.limit(wanted, room),
            Some(Limit::ClassQuota | Limit::SpoolQuota | Limit::DiskReserve)
        );
        if !delivered || !pressed {
            return None;
        }
        self.segments.pop_back();
        self.keys.pop_back();
        self.bytes -= active.bytes;
        self.damage.retain(|d| d.segment != active.first_index);
        // A segment left behind it is sealed: the next append starts anew.
        self.sealed = true;
        Some(active)
    }

    /// Damage that start-up's scan found (and counted) in `segment`.
    pub fn note_damage(&mut self, damage: Damage) {
        self.damage.push(damage);
    }

    /// The end of a damaged stretch known to start at `offset` of
    /// `segment`, if a scan already found (and counted) it.
    pub fn known_damage(&self, segment: u64, offset: u64) -> Option<u64> {
        self.damage
            .iter()
            .find(|d| d.segment == segment && d.start <= offset && offset < d.end)
            .map(|d| d.end)
    }

    /// Drops the oldest segment whole (policy [`FullPolicy::DropOldest`]):
    /// its records count as released.
    pub fn evict_oldest(&mut self) -> Option<Eviction> {
        let segment = self.segments.pop_front()?;
        self.keys.pop_front();
        self.bytes -= segment.bytes;
        self.damage.retain(|d| d.segment != segment.first_index);
        let was_active = self.segments.is_empty();
        let dropped = self.released.release_below(segment.end_index);
        Some(Eviction {
            segment,
            was_active,
            dropped,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn room(total: u64) -> SpoolRoom {
        SpoolRoom {
            total_bytes: total,
            total_max: 1 << 30,
            disk_free: 1 << 40,
            disk_reserve: 1 << 20,
            pending_bytes: 0,
            pending_max: 16 << 20,
        }
    }

    fn log(policy: FullPolicy) -> ClassLog {
        ClassLog::new(Vec::new(), Released::new(0), 1000, 3000, policy)
    }

    fn fill(log: &mut ClassLog, n: usize) -> Vec<u64> {
        (0..n)
            .map(|_| {
                if log.needs_segment(100) {
                    log.start_segment(50);
                }
                log.append(100)
            })
            .collect()
    }

    #[test]
    fn what_fits_the_active_segment_needs_no_seal_and_no_eviction() {
        let mut l = log(FullPolicy::DropOldest);
        assert!(!l.fits_active(100, &room(0)), "no active segment yet");
        fill(&mut l, 2);
        // 50 + 2 x 100 of the segment's 1000 bytes.
        assert!(l.fits_active(750, &room(l.bytes())));
        assert!(!l.fits_active(751, &room(l.bytes())), "it would seal");
        // Over the class's 3000-byte quota a drop-oldest class evicts.
        fill(&mut l, 25);
        assert!(!l.fits_active(100, &room(l.bytes())));
    }

    #[test]
    fn a_readers_backlog_is_the_rest_of_its_segment_and_every_later_one() {
        let mut log = log(FullPolicy::Block);
        fill(&mut log, 25);
        let at = |segment, offset| LogPosition { segment, offset };
        assert_eq!(log.bytes_from(at(0, 0)), 950 + 950 + 750);
        assert_eq!(log.bytes_from(at(9, 150)), 800 + 750);
        assert_eq!(log.bytes_from(at(18, 750)), 0);
        // A segment deleted under the reader: what is left after it.
        assert_eq!(log.bytes_from(at(5, 10)), 950 + 750);
    }

    #[test]
    fn a_reader_reads_only_what_is_durable_and_never_leaves_the_durable_segment() {
        let mut log = log(FullPolicy::Block);
        fill(&mut log, 25);
        let firsts: Vec<(u64, u64)> = log.segments().map(|s| (s.first_index, s.bytes)).collect();
        assert_eq!(firsts, [(0, 950), (9, 950), (18, 750)]);
        let at = |segment, offset| LogPosition { segment, offset };
        let end = Some(at(18, 750));
        // A sealed segment: to its end, then the next.
        assert_eq!(
            log.read_plan(at(0, 50), end),
            ReadPlan::Read {
                limit: 950,
                next: Some(9)
            }
        );
        assert_eq!(
            log.read_plan(at(0, 50), None),
            log.read_plan(at(0, 50), end)
        );
        // The segment holding the durable end: up to it, and no further.
        assert_eq!(
            log.read_plan(at(18, 100), end),
            ReadPlan::Read {
                limit: 750,
                next: None
            }
        );
        // A group being written started segment 18 while some of its
        // records went to the end of 9: the reader stays in 9.
        assert_eq!(
            log.read_plan(at(9, 50), Some(at(9, 500))),
            ReadPlan::Read {
                limit: 500,
                next: None
            }
        );
        assert_eq!(log.read_plan(at(30, 0), end), ReadPlan::CaughtUp);
        // The reader's segment deleted under it (dropped by policy).
        for i in 0..9 {
            log.release(i);
        }
        assert_eq!(log.take_deletable().len(), 1);
        assert_eq!(
            log.read_plan(at(0, 300), end),
            ReadPlan::Skip { segment: 9 }
        );
    }

    #[test]
    fn segments_roll_over_and_are_deleted_once_released() {
        let mut l = log(FullPolicy::Block);
        let idx = fill(&mut l, 25);
        assert_eq!(idx, (0..25).collect::<Vec<_>>());
        // 50-byte header plus nine 100-byte frames fit in 1000 bytes.
        assert_eq!(l.segments().count(), 3);
        assert_eq!(l.bytes(), 3 * 50 + 25 * 100);
        for i in 0..9 {
            l.release(i);
        }
        let gone = l.take_deletable();
        assert_eq!(gone.len(), 1);
        assert_eq!((gone[0].first_index, gone[0].end_index), (0, 9));
        // Released out of order: the second segment waits for index 9.
        for i in 10..25 {
            l.release(i);
        }
        assert!(l.take_deletable().is_empty());
        l.release(9);
        // The active segment is never deleted, even when drained.
        assert_eq!(l.take_deletable().len(), 1);
        assert_eq!(l.segments().count(), 1);
        assert_eq!(l.unreleased(), 0);
    }

    #[test]
    fn each_policy_answers_a_full_quota_its_own_way() {
        for (policy, expect) in [
            (FullPolicy::Block, Admit::Block),
            (FullPolicy::DropNewest, Admit::DropNewest),
            (FullPolicy::DropOldest, Admit::EvictOldest),
        ] {
            let mut l = log(policy);
            fill(&mut l, 27);
            assert_eq!(l.bytes(), 2850);
            assert_eq!(l.admit(151, &room(0)), expect, "{policy:?}");
            assert_eq!(l.admit(150, &room(0)), Admit::Append);
        }
        let l = log(FullPolicy::Block);
        assert_eq!(l.admit(100, &room((1 << 30) - 50)), Admit::Block);
        let mut tight = room(0);
        tight.disk_free = (1 << 20) + 99;
        assert_eq!(l.admit(100, &tight), Admit::Block);
    }

    #[test]
    fn each_limit_is_named_and_the_writer_backlog_always_blocks() {
        let l = log(FullPolicy::DropNewest);
        let mut r = room(0);
        assert_eq!(l.limit(100, &r), None);
        r.pending_bytes = (16 << 20) - 50;
        assert_eq!(l.limit(100, &r), Some(Limit::WriterBacklog));
        assert_eq!(l.admit(100, &r), Admit::Block, "whatever the policy");
        r.pending_bytes = 0;
        assert_eq!(l.limit(3001, &r), Some(Limit::ClassQuota));
        // Admitted bytes count against the class's quota until settled.
        let mut l = l;
        l.admitted(2950);
        assert_eq!(l.limit(100, &r), Some(Limit::ClassQuota));
        l.settled(2950);
        assert_eq!(l.limit(100, &r), None);
        r.total_bytes = (1 << 30) - 50;
        assert_eq!(l.limit(100, &r), Some(Limit::SpoolQuota));
        r.total_bytes = 0;
        r.disk_free = (1 << 20) + 99;
        assert_eq!(l.limit(100, &r), Some(Limit::DiskReserve));
        assert_eq!(l.admit(100, &r), Admit::DropNewest);
        assert_eq!(r.usable_disk(), 99);
        r.disk_free = 10;
        assert_eq!(r.usable_disk(), 0);
    }

    #[test]
    fn a_delivered_active_segment_is_reclaimed_only_when_it_blocks_the_class() {
        // One segment, filled until the disk's reserve is reached: the
        // spool's whole room is the active segment.
        let mut l = ClassLog::new(
            Vec::new(),
            Released::new(0),
            1 << 20,
            1 << 30,
            FullPolicy::Block,
        );
        let idx = fill(&mut l, 8);
        assert_eq!(l.segments().count(), 1);
        let mut full = room(l.bytes());
        full.disk_free = full.disk_reserve + 50;
        assert_eq!(l.admit(100, &full), Admit::Block);
        // Not yet delivered: kept.
        for &i in &idx[..7] {
            l.release(i);
        }
        assert_eq!(l.reclaim_active(100, &full), None);
        l.release(idx[7]);
        // Delivered, but with room to spare: kept, to be appended to.
        assert_eq!(l.reclaim_active(100, &room(l.bytes())), None);
        // Delivered and blocking: reclaimed, and the next append starts a
        // new segment numbered after it.
        let gone = l.reclaim_active(100, &full).expect("reclaimed");
        assert_eq!((gone.first_index, gone.end_index, gone.bytes), (0, 8, 850));
        assert_eq!(l.bytes(), 0);
        assert_eq!(l.unreleased(), 0);
        assert!(l.needs_segment(100));
        assert_eq!(fill(&mut l, 1), vec![8]);
        // The writer's backlog passes by itself: no reason to reclaim.
        for i in 8..9 {
            l.release(i);
        }
        let mut backlog = room(0);
        backlog.pending_bytes = 16 << 20;
        assert_eq!(l.reclaim_active(100, &backlog), None);
        // Released out of order: the older segment keeps a record, the
        // active one is delivered; it may still go.
        let mut l = log(FullPolicy::Block);
        fill(&mut l, 12);
        for i in 1..12 {
            l.release(i);
        }
        let mut quota = room(l.bytes());
        quota.total_max = l.bytes();
        let gone = l.reclaim_active(100, &quota).expect("reclaimed");
        assert_eq!((gone.first_index, gone.end_index), (9, 12));
        assert_eq!(l.unreleased(), 1);
        assert!(
            l.needs_segment(1),
            "the sealed segment left is not appended to"
        );
        assert_eq!(fill(&mut l, 1), vec![12]);
        assert_eq!(l.segments().last().map(|s| s.first_index), Some(12));
    }

    #[test]
    fn an_abandoned_segment_keeps_what_was_synced_and_the_rest_goes_to_a_new_one() {
        let mut l = log(FullPolicy::Block);
        // Five records synced, three more written by a group whose sync
        // failed.
        fill(&mut l, 8);
        assert_eq!(l.bytes(), 850);
        assert_eq!(l.abandon_active(550, 5), 300);
        assert_eq!((l.bytes(), l.next_index(), l.unreleased()), (550, 5, 5));
        assert!(l.needs_segment(1), "nothing more goes to it");
        // Appended again with the same indices, in a new segment.
        assert_eq!(fill(&mut l, 3), vec![5, 6, 7]);
        let segs: Vec<(u64, u64, u64)> = l
            .segments()
            .map(|s| (s.first_index, s.end_index, s.bytes))
            .collect();
        assert_eq!(segs, [(0, 5, 550), (5, 8, 350)]);
        assert!(!l.needs_segment(100), "the new one is appended to");
        // A segment left without a record leaves the log: the next one
        // takes its first index (and its file name).
        assert_eq!(l.abandon_active(50, 5), 350);
        assert_eq!(l.segments().count(), 1);
        assert!(l.needs_segment(1));
        assert_eq!(fill(&mut l, 1), vec![5]);
        let firsts: Vec<u64> = l.segments().map(|s| s.first_index).collect();
        assert_eq!(firsts, [0, 5]);
    }

    #[test]
    fn known_damage_is_found_by_any_offset_inside_it_until_its_segment_goes() {
        let mut l = log(FullPolicy::Block);
        fill(&mut l, 12);
        l.note_damage(Damage {
            segment: 0,
            start: 250,
            end: 450,
        });
        assert_eq!(l.known_damage(0, 250), Some(450));
        assert_eq!(l.known_damage(0, 449), Some(450));
        assert_eq!(l.known_damage(0, 450), None);
        assert_eq!(l.known_damage(9, 250), None);
        for i in 0..9 {
            l.release(i);
        }
        assert_eq!(l.take_deletable().len(), 1);
        assert_eq!(l.known_damage(0, 250), None);
    }

    #[test]
    fn evicting_counts_only_records_not_yet_released() {
        let mut l = log(FullPolicy::DropOldest);
        fill(&mut l, 12);
        l.release(0);
        l.release(3);
        let e = l.evict_oldest().unwrap();
        assert_eq!(e.dropped, 7);
        assert!(!e.was_active);
        assert_eq!(l.released().low_water(), 9);
        let e = l.evict_oldest().unwrap();
        assert!(e.was_active);
        assert_eq!(l.bytes(), 0);
        assert!(l.needs_segment(100));
        assert_eq!(fill(&mut l, 1), vec![12]);
    }

    #[test]
    fn a_recovered_log_continues_its_numbering() {
        let segs = vec![
            SegmentMeta {
                first_index: 40,
                end_index: 49,
                bytes: 950,
            },
            SegmentMeta {
                first_index: 49,
                end_index: 52,
                bytes: 350,
            },
        ];
        let mut l = ClassLog::new(segs, Released::new(45), 1000, 1 << 20, FullPolicy::Block);
        assert_eq!(l.next_index(), 52);
        assert_eq!(l.unreleased(), 7);
        assert!(!l.needs_segment(100));
        assert_eq!(l.append(100), 52);
        assert!(l.release(45));
        assert!(!l.release(44));
        assert!(!l.release(99));
    }
}
