//! The reader thread: a class that fell behind (its queue was full when a
//! record became durable) is refilled from disk as the scheduler drains
//! it, in log order, until it has caught up with the writer; then new
//! records go straight to the queue again. Memory holds a window of the
//! backlog, never all of it. Records past their class's time to live are
//! dropped here, counted. The most urgent class behind is read first.

use std::fs::File;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use weir_core::queueing::queue::PushError;
use weir_core::spool::{frame, KeyField, ReadPlan, Scan, Scanned, SegmentHeader};
use weir_core::Record;

use super::files;
use super::shared::{lock, ClassSlot, Cursor, Shared};
use crate::clock::unix_micros;
use crate::metrics::DropReason;

/// Most bytes read from a segment at a time.
const CHUNK: usize = 1 << 20;
/// Fewest bytes read at a time while the queue has any room (a read
/// sized to a nearly full queue would cost a system call per record).
const MIN_READ: usize = 64 << 10;
/// Longest sleep between looks when nothing wakes the reader.
const IDLE_WAKE: Duration = Duration::from_millis(50);

/// The segment file the reader has open for a class.
struct Open {
    first_index: u64,
    file: File,
    header: SegmentHeader,
    header_len: u64,
}

pub(super) fn run(shared: Arc<Shared>) {
    let mut open: Vec<Option<Open>> = (0..shared.classes.len()).map(|_| None).collect();
    let mut more = false;
    loop {
        if !more {
            let (flag, cv) = &shared.reader_wake;
            let mut woken = lock(flag);
            if !*woken {
                woken = cv
                    .wait_timeout(woken, IDLE_WAKE)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            *woken = false;
        }
        if shared.stopping.load(Ordering::Acquire) {
            return;
        }
        more = refill(&shared, &mut open);
    }
}

/// Steps of refilling between looks at the stop flag.
const STEPS_PER_PASS: usize = 64;

/// Refills the classes behind, most urgent first: each step goes to the
/// most urgent class with something to read and room for it, so a less
/// urgent class is read only while every more urgent one is full or
/// caught up. (Taking turns instead, a drain after an outage would leave
/// the urgent class's queue empty while the reader filled the others',
/// and the scheduler would send their backlog first.) Returns whether
/// there is more to do at once.
fn refill(shared: &Shared, open: &mut [Option<Open>]) -> bool {
    // Classes caught up or failing sit out the rest of the pass; a full
    // queue is looked at again at every step (the scheduler drains it).
    let mut out = vec![false; open.len()];
    for _ in 0..STEPS_PER_PASS {
        let next = shared.classes.iter().flatten().find(|slot| {
            let c = slot.id.index();
            if out[c] {
                return false;
            }
            match step(shared, slot, &mut open[c]) {
                Ok(Step::Again) => true,
                Ok(Step::Done) => false,
                Ok(Step::Idle) => {
                    open[c] = None;
                    out[c] = true;
                    false
                }
                Err(e) => {
                    tracing::error!(class = %slot.name, error = %e, "cannot read the spool back; retrying");
                    open[c] = None;
                    out[c] = true;
                    false
                }
            }
        });
        if next.is_none() {
            return false;
        }
    }
    true
}

/// What one step of a refill found.
enum Step {
    /// The class is not behind: nothing to read, no file to keep open (a
    /// deleted segment's space returns only once no one has it open).
    Idle,
    /// Nothing to do (caught up, or the queue is full).
    Done,
    /// Moved on; look again.
    Again,
}

fn step(shared: &Shared, slot: &ClassSlot, open: &mut Option<Open>) -> std::io::Result<Step> {
    // Where to read, and up to where, as of now.
    let (cursor, limit, next) = {
        let mut st = lock(&slot.state);
        let Some(cursor) = st.behind else {
            return Ok(Step::Idle);
        };
        let (limit, next) = match st.log.read_plan(cursor, st.durable_end) {
            ReadPlan::CaughtUp => {
                // Nothing left on disk (all evicted): caught up.
                st.behind = None;
                return Ok(Step::Again);
            }
            ReadPlan::Skip { segment } => {
                // The segment is gone (dropped by policy): go on with the next.
                st.behind = Some(Cursor { segment, offset: 0 });
                return Ok(Step::Again);
            }
            ReadPlan::Read { limit, next } => (limit, next),
        };
        (cursor, limit, next)
    };
    if open
        .as_ref()
        .is_none_or(|o| o.first_index != cursor.segment)
    {
        let path = files::segment_path(&slot.dir, cursor.segment);
        let file = File::open(&path)?;
        let head = files::read_at(&file, 0, 512)?;
        let (header, header_len) = SegmentHeader::decode(&head)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        *open = Some(Open {
            first_index: cursor.segment,
            file,
            header,
            header_len: header_len as u64,
        });
    }
    let o = open.as_ref().expect("opened above");
    let offset = cursor.offset.max(o.header_len);
    if offset >= limit {
        let mut st = lock(&slot.state);
        if st.behind != Some(cursor) {
            return Ok(Step::Again);
        }
        match next {
            Some(segment) => {
                st.behind = Some(Cursor { segment, offset: 0 });
                Ok(Step::Again)
            }
            None => {
                // At the writer's durable end, under the lock the writer
                // takes to append: every later record goes to the queue.
                let at_end = st
                    .durable_end
                    .is_none_or(|d| d.segment == cursor.segment && d.offset <= offset);
                if at_end {
                    st.behind = None;
                    Ok(Step::Done)
                } else {
                    Ok(Step::Again)
                }
            }
        }
    } else {
        // As much as the queue has room for: a full queue is looked at
        // again at every step of a less urgent class, and reading a whole
        // chunk to push a few records would make the disk the bottleneck.
        let queue = shared.queues.class(slot.id);
        let room = queue.capacity().bytes.saturating_sub(queue.bytes());
        if room == 0 {
            return Ok(Step::Done);
        }
        let want = ((limit - offset) as usize).min(room.clamp(MIN_READ, CHUNK));
        let mut chunk = Bytes::from(files::read_at(&o.file, offset, want)?);
        let mut frames = decode_all(&o.header, &chunk);
        if frames.is_empty() {
            // A frame larger than a chunk, or damage.
            if let Some(need) =
                frame_len_at(&chunk).filter(|&n| n > chunk.len() && offset + n as u64 <= limit)
            {
                chunk = Bytes::from(files::read_at(&o.file, offset, need)?);
                frames = decode_all(&o.header, &chunk);
            }
        }
        if frames.is_empty() {
            return skip_damage(shared, slot, o, cursor, offset, limit);
        }
        Ok(push(shared, slot, cursor, offset, frames))
    }
}

/// No whole frame at `offset`: damage. Moves the cursor past it: to the end
/// start-up's scan found for it (counted there), or, for damage written
/// since, to the next intact frame (counted and logged here).
fn skip_damage(
    shared: &Shared,
    slot: &ClassSlot,
    o: &Open,
    cursor: Cursor,
    offset: u64,
    limit: u64,
) -> std::io::Result<Step> {
    let known = lock(&slot.state).log.known_damage(cursor.segment, offset);
    let skip_to = match known {
        // Found and counted by start-up's scan.
        Some(end) => end.min(limit),
        None => {
            // Damage written after start-up's scan: find the next
            // intact frame in the rest of the segment.
            let rest = Bytes::from(files::read_at(&o.file, offset, (limit - offset) as usize)?);
            let keys = lock(&slot.state)
                .log
                .keys(cursor.segment)
                .cloned()
                .unwrap_or_default();
            let skip_to = match Scan::with_keys(&o.header, rest, 0, keys).next() {
                Some(Scanned::Corrupt { end, .. }) => offset + end as u64,
                _ => limit,
            };
            shared.metrics.spool.corrupt(slot.id);
            tracing::error!(class = %slot.name, segment = cursor.segment, offset, skipped_to = skip_to, "corrupt frames in the spool skipped while reading back");
            skip_to
        }
    };
    let mut st = lock(&slot.state);
    if st.behind == Some(cursor) {
        st.behind = Some(Cursor {
            segment: cursor.segment,
            offset: skip_to,
        });
    }
    Ok(Step::Again)
}

/// Every whole frame at the start of `chunk`, with how it carries its key
/// and its end offset in the chunk.
fn decode_all(header: &SegmentHeader, chunk: &Bytes) -> Vec<(frame::Frame, KeyField, usize)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < chunk.len() {
        match frame::decode(header, &chunk.slice(pos..)) {
            Ok((f, len, key)) => {
                pos += len;
                out.push((f, key, pos));
            }
            Err(_) => break,
        }
    }
    out
}

/// The total length the frame at the start of `bytes` claims.
fn frame_len_at(bytes: &[u8]) -> Option<usize> {
    let len = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
    (len <= frame::MAX_BODY).then_some(frame::FRAME_PREFIX + len)
}

/// Pushes decoded frames into the class queue until it is full; moves the
/// cursor past what was pushed, released or expired.
fn push(
    shared: &Shared,
    slot: &ClassSlot,
    cursor: Cursor,
    offset: u64,
    frames: Vec<(frame::Frame, KeyField, usize)>,
) -> Step {
    let ttl = slot.settings.ttl.map(|t| t.as_micros() as u64);
    let now = unix_micros();
    let mut st = lock(&slot.state);
    if st.behind != Some(cursor) {
        return Step::Again;
    }
    let mut at = offset;
    let mut pushed = 0u64;
    let mut expired = 0u64;
    let mut full = false;
    let mut lost = 0u64;
    for (mut f, key, end) in frames {
        let next = offset + end as u64;
        if st.log.is_released(f.index) {
            at = next;
            continue;
        }
        if let Err(e) = st.log.resolve_key(cursor.segment, &mut f, key) {
            // Cannot happen while the writer defines every id before its
            // frame is readable; never replay a record without its key.
            tracing::error!(class = %slot.name, index = f.index, error = %e, "spooled record without its key skipped");
            st.log.release(f.index);
            st.checkpoint_dirty = true;
            lost += 1;
            at = next;
            continue;
        }
        if ttl.is_some_and(|ttl| f.ingress_us.saturating_add(ttl) < now) {
            st.log.release(f.index);
            st.checkpoint_dirty = true;
            expired += 1;
            at = next;
            continue;
        }
        // Copied out of the chunk: a record kept in a queue must not pin a
        // whole megabyte of read buffer.
        let record = Record {
            key: Bytes::copy_from_slice(&f.key),
            class: slot.id,
            origin: f.origin,
            seq: f.seq,
            ingress_us: f.ingress_us,
            payload: Bytes::copy_from_slice(&f.payload),
            spool: Some(f.index),
        };
        match shared.queues.push(record) {
            Ok(()) => {
                pushed += 1;
                at = next;
            }
            Err(PushError::Full(_)) | Err(PushError::Oversized(_)) => {
                full = true;
                break;
            }
        }
    }
    st.behind = Some(Cursor {
        segment: cursor.segment,
        offset: at,
    });
    drop(st);
    for _ in 0..lost {
        shared.metrics.spool.corrupt(slot.id);
    }
    if expired > 0 {
        shared
            .metrics
            .spool
            .dropped(slot.id, DropReason::Ttl, expired);
        tracing::warn!(class = %slot.name, records = expired, "spooled records older than the class's ttl dropped");
    }
    if pushed > 0 {
        shared.arrivals.ring(slot.id);
    }
    if full {
        Step::Done
    } else {
        Step::Again
    }
}
