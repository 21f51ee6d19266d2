//! The writer thread: group commit. It takes every append queued since
//! its last group, encodes each class's frames and writes them with one
//! write per class. With `sync = "group"` the sync thread (`sync.rs`)
//! syncs each touched segment while the writer encodes the next group
//! (one group in flight) and completes the group; otherwise the writer
//! completes it (the tickets in order, the records to their class
//! queues). Between groups it deletes released segments, writes
//! checkpoints and measures free space.
//!
//! The sync thread syncs through a file description of its own, and never
//! while the writer syncs the same segment: a segment is sealed (written
//! and synced by the writer) only once the sync in flight has settled. A
//! failed sync abandons the segment at what its last good sync covered;
//! the records after that, of the group in flight and of the group being
//! encoded, are appended again with the same indices to a new segment.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_core::spool::{
    frame, Admit, Checkpoint, Eviction, FrameRef, GroupCommit, SegmentHeader, SegmentMeta,
};
use weir_core::Record;

use super::files;
use super::shared::{
    frame_bound, lock, ClassSlot, ClassState, Cursor, Msg, Shared, CHECKPOINT_EVERY,
    CHECKPOINT_SYNC_EVERY, HOUSEKEEPING, MAX_GROUP_RECORDS,
};
use super::sync::{complete, Group, Part, SyncJob, Synced, Syncer, LOCK_BATCH};
use crate::config::SyncMode;
use crate::metrics::DropReason;

/// Pause before retrying a failed write or sync (full disk, I/O error).
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// Repeated write errors are logged at most this often.
const ERROR_LOG_EVERY: Duration = Duration::from_secs(10);
/// After `close`, a write that keeps failing is given up after this many
/// attempts: its records were never acknowledged.
const ATTEMPTS_WHEN_STOPPING: u32 = 20;

/// The segment a class appends to.
struct Active {
    first_index: u64,
    file: File,
    /// The same file opened again, for the sync thread: a file
    /// description of its own reports a writeback error to it whatever
    /// the writer's description saw.
    sync_file: Arc<File>,
    header: SegmentHeader,
    /// Bytes in the file.
    len: u64,
    /// Bytes known synced (with `sync = "group"`, the durable end).
    synced: u64,
    /// Bytes written since the last sync.
    unsynced: bool,
    /// Frames encoded and not yet written.
    buf: Vec<u8>,
}

/// A record appended and then cut from the log (its write or sync
/// failed), to append again: its index is given anew, and its frame
/// length bound is the one ingress admitted it with.
fn unappended(mut record: Record) -> (Record, u64) {
    record.spool = None;
    let len = frame_bound(&record);
    (record, len)
}

/// What `append_class` does with the frames it encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flush {
    /// Writes and syncs them.
    Sync,
    /// Writes them.
    Write,
    /// Leaves them in the segment's buffer (written by the caller).
    Keep,
}

struct Writer {
    shared: Arc<Shared>,
    active: Vec<Option<Active>>,
    /// With `sync = "group"`: the thread that syncs a group while the next
    /// is encoded (`None`: it could not start; groups sync inline).
    syncer: Option<Syncer>,
    /// The classes of the group whose sync is in flight.
    inflight: Option<Vec<usize>>,
    last_sync: Instant,
    last_checkpoint: Instant,
    /// When checkpoints were last written durably (file and directory
    /// synced, so that the segment deletions before them hold too).
    last_durable_checkpoint: Instant,
    /// Per class: release state changed or segments deleted since the last
    /// durable checkpoint.
    releases_unsynced: Vec<bool>,
    last_error_log: Option<Instant>,
}

pub(super) fn run(shared: Arc<Shared>, rx: Receiver<Msg>) {
    let n = shared.classes.len();
    let syncer = match shared.config.sync {
        SyncMode::Group => Syncer::start(shared.clone())
            .map_err(|e| tracing::warn!(error = %e, "cannot start the spool's sync thread; groups are synced by the writer"))
            .ok(),
        SyncMode::Interval | SyncMode::None => None,
    };
    let mut w = Writer {
        shared,
        active: (0..n).map(|_| None).collect(),
        syncer,
        inflight: None,
        last_sync: Instant::now(),
        last_checkpoint: Instant::now() - CHECKPOINT_EVERY,
        last_durable_checkpoint: Instant::now() - CHECKPOINT_SYNC_EVERY,
        releases_unsynced: vec![true; n],
        last_error_log: None,
    };
    let mut stop = false;
    // The group-commit wait applies where each group is synced.
    let delay = match w.shared.config.sync {
        SyncMode::Group => w.shared.config.commit_delay,
        SyncMode::Interval | SyncMode::None => Duration::ZERO,
    };
    let mut timing = GroupCommit::new(delay);
    let epoch = Instant::now();
    while !stop {
        let mut group = Vec::new();
        let mut bytes = 0u64;
        let first = if w.inflight.is_some() {
            // A group is being synced: the next one is encoded meanwhile if
            // appends are waiting; if none is, the sync is settled first.
            match rx.try_recv() {
                Ok(m) => Some(m),
                Err(TryRecvError::Empty) => {
                    w.settle(None);
                    continue;
                }
                Err(TryRecvError::Disconnected) => break,
            }
        } else {
            match rx.recv_timeout(HOUSEKEEPING) {
                Ok(m) => Some(m),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => break,
            }
        };
        let first_at = epoch.elapsed();
        let take = |m: Msg, group: &mut Vec<(u64, Record, u64)>, stop: &mut bool| match m {
            Msg::Append { n, record, len } => {
                group.push((n, record, len));
                len
            }
            Msg::Wake => 0,
            Msg::Stop => {
                *stop = true;
                0
            }
        };
        if let Some(m) = first {
            bytes += take(m, &mut group, &mut stop);
        }
        loop {
            // After Stop, everything already sent is still written: those
            // appends were admitted and their senders wait on them.
            while stop || group.len() < MAX_GROUP_RECORDS {
                match rx.try_recv() {
                    Ok(m) => bytes += take(m, &mut group, &mut stop),
                    Err(_) => break,
                }
            }
            if stop || group.is_empty() || group.len() >= MAX_GROUP_RECORDS {
                break;
            }
            // The sync in flight is this group's gathering time.
            if w.inflight.is_some() {
                break;
            }
            // Wait a little for more, when that saves page rewrites.
            let Some(wait) = timing.wait(bytes, first_at, epoch.elapsed()) else {
                break;
            };
            match rx.recv_timeout(wait) {
                Ok(m) => bytes += take(m, &mut group, &mut stop),
                Err(_) => break,
            }
        }
        if !group.is_empty() {
            w.commit(group);
            timing.committed(bytes, epoch.elapsed());
        }
        w.housekeep(stop);
    }
    w.finish();
}

impl Writer {
    fn stopping(&self) -> bool {
        self.shared.stopping.load(Ordering::Acquire)
    }

    /// Appends one group: encodes and writes it, then syncs and completes
    /// it, or (with the sync thread) hands its sync over and completes the
    /// group before it once that group's sync settled.
    fn commit(&mut self, group: Vec<(u64, Record, u64)>) {
        let shared = self.shared.clone();
        let last = group.last().map_or(0, |g| g.0);
        let pipelined = self.syncer.is_some();
        let sync = match shared.config.sync {
            SyncMode::Group => true,
            SyncMode::Interval => self.last_sync.elapsed() >= shared.config.sync_interval,
            SyncMode::None => false,
        };
        let flush = match (pipelined, sync) {
            (true, _) => Flush::Keep,
            (false, true) => Flush::Sync,
            (false, false) => Flush::Write,
        };
        // Each class's records in arrival order: classes have segments of
        // their own.
        let mut by_class: Vec<Vec<(Record, u64)>> =
            (0..self.active.len()).map(|_| Vec::new()).collect();
        let mut settled = vec![0u64; self.active.len()];
        for (_, record, len) in group {
            settled[record.class.index()] += len;
            by_class[record.class.index()].push((record, len));
        }
        for (c, len) in settled.into_iter().enumerate() {
            if len > 0 {
                let slot = shared.classes[c]
                    .as_ref()
                    .expect("only spooled classes are appended");
                lock(&slot.state).log.settled(len);
                shared.pending.fetch_sub(len, Ordering::Relaxed);
            }
        }
        let mut g = Group {
            last,
            parts: Vec::new(),
            failed: false,
        };
        for (c, records) in by_class.into_iter().enumerate() {
            if records.is_empty() {
                continue;
            }
            // A segment is sealed, and space made by eviction, only with
            // nothing of the class in flight.
            if self.in_flight(c) && !self.fits_without_sealing(c, &records) {
                self.settle(Some(&mut g));
            }
            match self.append_class(c, records, flush) {
                Some(out) => g.parts.push(Part {
                    c,
                    end: self.end_of(c),
                    out,
                }),
                // Not on disk, so never acknowledged.
                None => g.failed = true,
            }
        }
        if !pipelined {
            if sync {
                self.last_sync = Instant::now();
            }
            complete(&self.shared, g);
            return;
        }
        // The group before was synced while this one was encoded.
        self.settle(Some(&mut g));
        self.dispatch(g);
    }

    /// Whether class `c` has records in the group being synced.
    fn in_flight(&self, c: usize) -> bool {
        self.inflight.as_ref().is_some_and(|cs| cs.contains(&c))
    }

    /// Whether `records` go to class `c`'s active segment as it is
    /// ([`weir_core::spool::ClassLog::fits_active`]; each frame is at most
    /// its `len`).
    fn fits_without_sealing(&self, c: usize, records: &[(Record, u64)]) -> bool {
        let slot = self.shared.classes[c].as_ref().expect("spooled");
        let total: u64 = records.iter().map(|(_, len)| len).sum();
        lock(&slot.state)
            .log
            .fits_active(total, &self.shared.room())
    }

    /// Where class `c`'s log ends: its active segment's end, written or
    /// encoded.
    fn end_of(&self, c: usize) -> Cursor {
        self.active[c].as_ref().map_or(
            Cursor {
                segment: 0,
                offset: 0,
            },
            |a| Cursor {
                segment: a.first_index,
                offset: a.len + a.buf.len() as u64,
            },
        )
    }

    /// Writes an encoded group and hands its sync to the sync thread.
    fn dispatch(&mut self, mut g: Group) {
        let mut jobs = Vec::with_capacity(g.parts.len());
        for i in 0..g.parts.len() {
            let c = g.parts[i].c;
            match self.flush_once(c, false) {
                Ok(()) => {
                    if let Some(a) = self.active[c].as_ref() {
                        jobs.push(SyncJob {
                            c,
                            segment: a.first_index,
                            upto: a.len,
                            file: a.sync_file.clone(),
                        });
                    }
                }
                Err(e) => {
                    // Nothing of the class is in flight: its last group
                    // settled, so what it wrote before is synced.
                    let part = &mut g.parts[i];
                    self.reappend(c, &e, part, None, &mut g.failed);
                }
            }
        }
        if jobs.is_empty() {
            complete(&self.shared, g);
            return;
        }
        let classes = g.parts.iter().map(|p| p.c).collect();
        let syncer = self
            .syncer
            .as_ref()
            .expect("dispatch runs with a sync thread");
        if let Err(mpsc::SendError((jobs, mut g))) = syncer.jobs.send((jobs, g)) {
            // The sync thread is gone (it never stops before the writer):
            // sync here.
            for j in jobs {
                if let Err(e) = j.file.sync_data() {
                    self.sync_failed(&mut g, None, j.c, &e);
                } else {
                    self.synced(&j);
                }
            }
            complete(&self.shared, g);
            return;
        }
        self.inflight = Some(classes);
    }

    /// Waits for the sync in flight, mends what failed, and completes its
    /// group. `next` is the group being encoded, whose records of a class
    /// whose sync failed are appended again after the in-flight group's.
    fn settle(&mut self, mut next: Option<&mut Group>) {
        if self.inflight.take().is_none() {
            return;
        }
        let Synced { results, failed } = match self.syncer.as_ref().map(|s| s.done.recv()) {
            Some(Ok(r)) => r,
            _ => unreachable!("a group is in flight only on a running sync thread"),
        };
        let mut failed = failed;
        for (job, result) in results {
            match (result, failed.as_mut()) {
                (Ok(()), _) => self.synced(&job),
                (Err(e), Some(g)) => self.sync_failed(g, next.as_deref_mut(), job.c, &e),
                (Err(_), None) => unreachable!("a group with a failed sync comes back"),
            }
        }
        if let Some(g) = failed {
            complete(&self.shared, g);
        }
    }

    /// The sync thread synced class `job.c`'s segment as far as `job.upto`.
    fn synced(&mut self, job: &SyncJob) {
        self.shared.metrics.spool.syncs.inc();
        if let Some(a) = self.active[job.c].as_mut() {
            if a.first_index == job.segment {
                a.synced = a.synced.max(job.upto);
                a.unsynced = a.len > a.synced;
            }
        }
    }

    /// Class `c`'s sync in group `g` failed: its segment is abandoned at
    /// the last good sync, and its records from there on (in `g`, then in
    /// `next`) go to a new segment, synced before anything is
    /// acknowledged.
    fn sync_failed(&mut self, g: &mut Group, next: Option<&mut Group>, c: usize, e: &io::Error) {
        self.shared.metrics.spool.write_errors.inc();
        let Some(i) = g.parts.iter().position(|p| p.c == c) else {
            return;
        };
        self.reappend(c, e, &mut g.parts[i], next, &mut g.failed);
    }

    /// The active segment of class `c` failed under `part` (written, or
    /// synced): abandons it at its last good sync and appends the records
    /// of `part` that were in it, then those of the same class in `next`,
    /// again, synced. Sets `failed` if they were given up (shutdown).
    fn reappend(
        &mut self,
        c: usize,
        e: &io::Error,
        part: &mut Part,
        next: Option<&mut Group>,
        failed: &mut bool,
    ) {
        let shared = self.shared.clone();
        let slot = shared.classes[c].as_ref().expect("spooled");
        let Some(segment) = self.active[c].as_ref().map(|a| a.first_index) else {
            return;
        };
        // Records before the active segment were synced when it was sealed.
        let k = part
            .out
            .iter()
            .position(|(_, at)| at.segment == segment)
            .unwrap_or(part.out.len());
        let kept_end = part.out.get(k).and_then(|(r, _)| r.spool);
        let mut again: Vec<(Record, u64)> =
            part.out.drain(k..).map(|(r, _)| unappended(r)).collect();
        let mine = again.len();
        let mut later = next.and_then(|n| {
            let j = n.parts.iter().position(|p| p.c == c)?;
            Some(&mut n.parts[j])
        });
        if let Some(p) = later.as_deref_mut() {
            again.extend(p.out.drain(..).map(|(r, _)| unappended(r)));
        }
        self.abandon(slot, e, kept_end, true);
        match self.append_class(c, again, Flush::Sync) {
            Some(mut out) => {
                let rest = out.split_off(mine);
                part.end = rest.first().map_or_else(|| self.end_of(c), |(_, at)| *at);
                part.out.extend(out);
                if let Some(p) = later {
                    p.out = rest;
                    p.end = self.end_of(c);
                }
            }
            None => *failed = true,
        }
    }

    /// Makes sure the class has an open segment with room for a frame of
    /// about `len` bytes: opens the last one after a restart, or starts a
    /// new one (the caller has sealed the last).
    fn ensure_segment(
        &mut self,
        slot: &ClassSlot,
        st: &mut ClassState,
        record: &Record,
        len: u64,
    ) -> io::Result<()> {
        let c = slot.id.index();
        let last = st.log.segments().last().map(|s| (s.first_index, s.bytes));
        let current = self.active[c].as_ref().map(|a| a.first_index);
        if !st.log.needs_segment(len) {
            let (first, bytes) = last.expect("needs_segment is false only with a segment");
            if current == Some(first) {
                return Ok(());
            }
            // After a restart: append to the last segment found on disk.
            let (file, header) = files::open_segment(&slot.dir, first)?;
            let sync_file = Arc::new(File::open(files::segment_path(&slot.dir, first))?);
            self.active[c] = Some(Active {
                first_index: first,
                file,
                sync_file,
                header,
                len: bytes,
                synced: bytes,
                unsynced: false,
                buf: Vec::new(),
            });
            return Ok(());
        }
        // The caller wrote and sealed the previous one.
        debug_assert!(current.is_none(), "a new segment after the last was sealed");
        let header = SegmentHeader {
            version: frame::VERSION,
            first_index: st.log.next_index(),
            origin: record.origin,
            base_seq: record.seq,
            base_us: record.ingress_us,
            class: slot.name.clone(),
        };
        let (file, hlen) = files::create_segment(&slot.dir, &header)?;
        let sync_file = match File::open(files::segment_path(&slot.dir, header.first_index)) {
            Ok(f) => Arc::new(f),
            Err(e) => {
                let _ = files::delete_segment(&slot.dir, header.first_index);
                return Err(e);
            }
        };
        st.log.start_segment(hlen);
        self.shared.total_bytes.fetch_add(hlen, Ordering::Relaxed);
        self.shared.metrics.spool.written_bytes.inc_by(hlen);
        self.active[c] = Some(Active {
            first_index: header.first_index,
            file,
            sync_file,
            header,
            len: hlen,
            synced: hlen,
            unsynced: false,
            buf: Vec::new(),
        });
        Ok(())
    }

    /// Appends `records` of class `c` to its segment and writes them and
    /// syncs them as `flush` says; returns each record (with its index) and
    /// where it is, or `None` if it gave up (only when stopping: those
    /// records were never acknowledged).
    ///
    /// A failed write or sync is never retried on the same file: the
    /// segment is abandoned at what was synced before ([`Self::abandon`])
    /// and the records not yet on disk are appended again, with the same
    /// indices, to a new segment, after a pause that grows with each
    /// failure. Acknowledgements wait meanwhile (back-pressure).
    fn append_class(
        &mut self,
        c: usize,
        records: Vec<(Record, u64)>,
        flush: Flush,
    ) -> Option<Vec<(Record, Cursor)>> {
        let shared = self.shared.clone();
        let slot = shared.classes[c].as_ref().expect("spooled");
        let mut out: Vec<(Record, Cursor)> = Vec::with_capacity(records.len());
        let mut todo: VecDeque<(Record, u64)> = records.into();
        // `out[unwritten..]` are in the active segment's buffer, not yet on
        // disk.
        let mut unwritten = 0;
        let mut failures = 0u32;
        loop {
            let failure = 'pass: {
                let mut st = lock(&slot.state);
                let mut held = 0;
                while let Some((mut record, len)) = todo.pop_front() {
                    // The class's lock is let go now and then: ingress takes
                    // it to admit appends.
                    held += 1;
                    if held == LOCK_BATCH {
                        held = 0;
                        drop(st);
                        st = lock(&slot.state);
                    }
                    // drop-oldest: make room before appending.
                    while st.log.admit(len, &shared.room()) == Admit::EvictOldest {
                        let Some(ev) = st.log.evict_oldest() else {
                            break;
                        };
                        self.evicted(slot, &mut st, ev);
                    }
                    if st.log.needs_segment(len) && self.active[c].is_some() {
                        // Seal the active segment: its frames reach the
                        // disk before any frame of the next.
                        debug_assert!(
                            !self.in_flight(c),
                            "a segment is sealed only with nothing in flight"
                        );
                        drop(st);
                        if let Err(e) = self.flush_once(c, true) {
                            todo.push_front((record, len));
                            break 'pass Some(e);
                        }
                        self.active[c] = None;
                        unwritten = out.len();
                        st = lock(&slot.state);
                    }
                    let mut attempts = 0u32;
                    while let Err(e) = self.ensure_segment(slot, &mut st, &record, len) {
                        // Never sleep holding the class's lock.
                        drop(st);
                        self.error(&e, "cannot create a spool segment; retrying");
                        attempts += 1;
                        if self.stopping() && attempts >= ATTEMPTS_WHEN_STOPPING {
                            return None;
                        }
                        std::thread::sleep(RETRY_PAUSE);
                        self.refresh_free_space();
                        st = lock(&slot.state);
                    }
                    let active = self.active[c].as_mut().expect("ensured");
                    let offset = active.len + active.buf.len() as u64;
                    let before = active.buf.len();
                    let index = st.log.next_index();
                    let key = st.log.key_field(&record.key, offset);
                    frame::encode(
                        &active.header,
                        &FrameRef {
                            index,
                            origin: record.origin,
                            seq: record.seq,
                            ingress_us: record.ingress_us,
                            key: &record.key,
                            payload: &record.payload,
                        },
                        key,
                        &mut active.buf,
                    );
                    let flen = (active.buf.len() - before) as u64;
                    let appended = st.log.append(flen);
                    debug_assert_eq!(appended, index);
                    shared.total_bytes.fetch_add(flen, Ordering::Relaxed);
                    record.spool = Some(index);
                    out.push((
                        record,
                        Cursor {
                            segment: active.first_index,
                            offset,
                        },
                    ));
                }
                drop(st);
                match flush {
                    Flush::Sync => self.flush_once(c, true).err(),
                    Flush::Write => self.flush_once(c, false).err(),
                    Flush::Keep => None,
                }
            };
            let Some(e) = failure else {
                return Some(out);
            };
            failures += 1;
            let kept_end = out.get(unwritten).and_then(|(r, _)| r.spool);
            self.abandon(slot, &e, kept_end, false);
            // What was not on disk is appended again, first.
            for (record, _) in out.drain(unwritten..).rev() {
                todo.push_front(unappended(record));
            }
            if self.stopping() && failures >= ATTEMPTS_WHEN_STOPPING {
                tracing::error!(class = %slot.name, records = todo.len(), "giving up a spool write at shutdown; those records were never acknowledged");
                return None;
            }
            if e.raw_os_error() == Some(libc::ENOSPC) {
                self.free_space_for(c);
            }
            std::thread::sleep(RETRY_PAUSE * (1 << (failures - 1).min(5)));
            self.refresh_free_space();
        }
    }

    /// A write or sync of class `slot`'s active segment failed: the file is
    /// closed and never written through again (after a failed fsync Linux
    /// may have dropped the data and report the next fsync of the same
    /// file as a success). The log keeps what was written before this
    /// failure (`kept_end`: the first record not on disk; `None`: every
    /// record appended is kept, as after a failed sync of writes already
    /// acknowledged with `sync = "interval"` or `"none"`), the file is cut
    /// back to it where it can be (to what the last good sync covered if
    /// `to_synced`, else to what was written), and the next append starts
    /// a new segment.
    fn abandon(&mut self, slot: &ClassSlot, e: &io::Error, kept_end: Option<u64>, to_synced: bool) {
        let c = slot.id.index();
        let Some(a) = self.active[c].take() else {
            return;
        };
        let kept_bytes = if to_synced { a.synced } else { a.len };
        let first = a.first_index;
        drop(a);
        let mut st = lock(&slot.state);
        let kept_end = kept_end.unwrap_or_else(|| st.log.next_index());
        let dropped = st.log.abandon_active(kept_bytes, kept_end);
        self.shared
            .total_bytes
            .fetch_sub(dropped, Ordering::Relaxed);
        drop(st);
        let path = files::segment_path(&slot.dir, first);
        let tidied = if kept_end == first {
            files::delete_segment(&slot.dir, first)
        } else {
            files::truncate(&path, kept_bytes)
        };
        if let Err(te) = tidied {
            tracing::debug!(file = %path.display(), error = %te, "cannot cut an abandoned spool segment back; start-up skips what it holds past that");
        }
        self.shared.metrics.spool.abandoned_segments.inc();
        let due = self
            .last_error_log
            .is_none_or(|t| t.elapsed() >= ERROR_LOG_EVERY);
        if due {
            self.last_error_log = Some(Instant::now());
            tracing::error!(
                class = %slot.name,
                file = %path.display(),
                kept_bytes,
                error = %e,
                "spool write or sync failed: segment abandoned (never written through again); its records not yet on disk go to a new segment and their acknowledgements wait"
            );
        }
    }

    /// Writes a class's encoded frames and, if `sync`, fdatasyncs them:
    /// one attempt. On an error the segment must be abandoned.
    fn flush_once(&mut self, c: usize, sync: bool) -> io::Result<()> {
        let Some(a) = self.active[c].as_mut() else {
            return Ok(());
        };
        if a.buf.is_empty() && !(sync && a.unsynced) {
            return Ok(());
        }
        let result = a.file.write_all_at(&a.buf, a.len).and_then(|()| {
            if sync {
                a.file.sync_data()
            } else {
                Ok(())
            }
        });
        if let Err(e) = result {
            self.shared.metrics.spool.write_errors.inc();
            return Err(e);
        }
        a.len += a.buf.len() as u64;
        if sync {
            a.synced = a.len;
        }
        self.shared
            .metrics
            .spool
            .written_bytes
            .inc_by(a.buf.len() as u64);
        a.unsynced = !sync && (a.unsynced || !a.buf.is_empty());
        a.buf.clear();
        if sync {
            self.shared.metrics.spool.syncs.inc();
        }
        Ok(())
    }

    /// Syncs what class `c` wrote without syncing (`sync = "interval"` or
    /// `"none"`); a failure abandons the segment, and the records it
    /// acknowledged since its last sync may be lost.
    fn sync_written(&mut self, c: usize) {
        if !self.active[c].as_ref().is_some_and(|a| a.unsynced) {
            return;
        }
        if let Err(e) = self.flush_once(c, true) {
            let shared = self.shared.clone();
            let slot = shared.classes[c].as_ref().expect("spooled");
            tracing::error!(class = %slot.name, error = %e, "spool sync failed: records acknowledged since the last sync (spool.sync is not \"group\") may not be on disk");
            self.abandon(slot, &e, None, false);
        }
    }

    /// On a full disk, a `drop-oldest` class deletes its oldest sealed
    /// segment; other classes wait for releases to free space.
    fn free_space_for(&mut self, c: usize) {
        let shared = self.shared.clone();
        let Some(slot) = shared.classes[c].as_ref() else {
            return;
        };
        if slot.settings.on_full.policy() != weir_core::spool::FullPolicy::DropOldest {
            return;
        }
        let mut st = lock(&slot.state);
        if st.log.segments().len() > 1 {
            if let Some(ev) = st.log.evict_oldest() {
                self.evicted(slot, &mut st, ev);
            }
        }
    }

    /// The class's delivered active segment left the log (it blocked the
    /// class): its file is closed here and deleted by the caller; nothing
    /// in it is left to read, and the next append starts a new segment.
    fn reclaimed(&mut self, slot: &ClassSlot, st: &mut ClassState, segment: &SegmentMeta) {
        let c = slot.id.index();
        if self.active[c]
            .as_ref()
            .is_some_and(|a| a.first_index == segment.first_index)
        {
            self.active[c] = None;
        }
        if st
            .durable_end
            .is_some_and(|d| d.segment == segment.first_index)
        {
            st.durable_end = None;
        }
        if st.behind.is_some_and(|b| b.segment == segment.first_index) {
            st.behind = None;
        }
        st.checkpoint_dirty = true;
        tracing::info!(
            class = %slot.name,
            segment = segment.first_index,
            bytes = segment.bytes,
            "delivered spool segment reclaimed to make room (the class was blocked by a limit)"
        );
    }

    /// A segment was dropped by `drop-oldest`: delete it, count its
    /// records.
    fn evicted(&mut self, slot: &ClassSlot, st: &mut ClassState, ev: Eviction) {
        let c = slot.id.index();
        if ev.was_active {
            self.active[c] = None;
        }
        if let Err(e) = files::delete_segment(&slot.dir, ev.segment.first_index) {
            tracing::warn!(error = %e, "cannot delete an evicted spool segment");
        }
        self.shared
            .total_bytes
            .fetch_sub(ev.segment.bytes, Ordering::Relaxed);
        st.checkpoint_dirty = true;
        if ev.dropped > 0 {
            self.shared
                .metrics
                .spool
                .dropped(slot.id, DropReason::Evicted, ev.dropped);
            tracing::warn!(class = %slot.name, records = ev.dropped, "spool full: oldest segment dropped (on_full = drop-oldest)");
        }
    }

    fn error(&mut self, e: &io::Error, what: &str) {
        let due = self
            .last_error_log
            .is_none_or(|t| t.elapsed() >= ERROR_LOG_EVERY);
        if due {
            self.last_error_log = Some(Instant::now());
            tracing::error!(dir = %self.shared.config.dir.display(), error = %e, "{what}");
        }
    }

    fn refresh_free_space(&self) {
        if let Ok(free) = files::free_bytes(&self.shared.config.dir) {
            self.shared.disk_free.store(free, Ordering::Relaxed);
        }
    }

    /// Deletes released segments, writes due checkpoints, syncs an
    /// interval's appends, measures free space.
    fn housekeep(&mut self, force: bool) {
        let shared = self.shared.clone();
        let mut freed = false;
        let checkpoint_due = force || self.last_checkpoint.elapsed() >= CHECKPOINT_EVERY;
        let durable_due = force || self.last_durable_checkpoint.elapsed() >= CHECKPOINT_SYNC_EVERY;
        let room = shared.room();
        for slot in shared.classes.iter().flatten() {
            let (gone, checkpoint) = {
                let mut st = lock(&slot.state);
                let mut gone = st.log.take_deletable();
                // A class refused by a limit while its only undelivered
                // bytes are gone: the delivered active segment goes too.
                let reclaimed = st
                    .blocked
                    .and_then(|b| st.log.reclaim_active(b.wanted, &room));
                if let Some(active) = reclaimed {
                    self.reclaimed(slot, &mut st, &active);
                    gone.push(active);
                }
                if let Some(b) = st.blocked {
                    if st.log.limit(b.wanted, &room).is_none() {
                        shared.set_blocked(slot, &mut st, None);
                    }
                }
                let c = slot.id.index();
                self.releases_unsynced[c] |= st.checkpoint_dirty || !gone.is_empty();
                let durable = durable_due && self.releases_unsynced[c];
                let checkpoint = ((checkpoint_due && st.checkpoint_dirty) || durable).then(|| {
                    st.checkpoint_dirty = false;
                    Checkpoint::of(st.log.released())
                });
                shared.publish(slot, &st);
                (gone, checkpoint)
            };
            for s in &gone {
                if let Err(e) = files::delete_segment(&slot.dir, s.first_index) {
                    tracing::warn!(class = %slot.name, error = %e, "cannot delete a delivered spool segment");
                }
                shared.total_bytes.fetch_sub(s.bytes, Ordering::Relaxed);
                freed = true;
            }
            if let Some(cp) = checkpoint {
                let c = slot.id.index();
                let durable = durable_due && self.releases_unsynced[c];
                match files::write_checkpoint(&slot.dir, &cp, durable) {
                    Ok(()) if durable => self.releases_unsynced[c] = false,
                    Ok(()) => {}
                    Err(e) => {
                        tracing::warn!(class = %slot.name, error = %e, "cannot write the spool checkpoint; a restart would replay delivered records")
                    }
                }
            }
        }
        if checkpoint_due {
            self.last_checkpoint = Instant::now();
        }
        if durable_due {
            self.last_durable_checkpoint = Instant::now();
        }
        let interval_due = shared.config.sync == SyncMode::Interval
            && self.last_sync.elapsed() >= shared.config.sync_interval;
        if interval_due || (force && shared.config.sync != SyncMode::Group) {
            for c in 0..self.active.len() {
                self.sync_written(c);
            }
            self.last_sync = Instant::now();
        }
        self.refresh_free_space();
        if freed {
            shared.space.notify_waiters();
        }
    }

    /// At close: everything written is synced, checkpoints are current.
    fn finish(&mut self) {
        self.settle(None);
        if let Some(s) = self.syncer.take() {
            drop(s.jobs);
            let _ = s.thread.join();
        }
        for c in 0..self.active.len() {
            self.sync_written(c);
        }
        self.housekeep(true);
        self.shared.writer_gone.store(true, Ordering::Release);
        self.shared.durable_notify.notify_waiters();
    }
}
