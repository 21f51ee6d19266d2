//! Candidate 4: okaywal. One WAL entry per group (one chunk per record); `commit()`
//! makes it durable (okaywal does its own sync_data; concurrent committers share one).
//! Replay happens inside `WriteAheadLog::recover` via `LogManager::recover`.
//! Release: okaywal's model is "checkpoint a full segment into a primary store, then
//! recycle the file". Our `checkpoint_to` blocks until the spool's release watermark
//! (in entry ids) covers the segment; it then returns Ok and okaywal renames the file
//! to `-cp` and keeps it for reuse (it is *not* deleted, so space is not returned).

use crate::common::{self, Group, Report};
use okaywal::{Configuration, Entry, EntryId, LogManager, ReadChunkResult, SegmentReader, WriteAheadLog};
use std::io::{self, Read};
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Segment size comparable to the own log's 64 MiB.
const PREALLOC: u32 = 64 << 20;
const CHECKPOINT_AFTER: u64 = 60 << 20;

#[derive(Default)]
struct Shared {
    /// Entries with id <= watermark may be checkpointed (released).
    watermark: u64,
    /// Number of segments checkpointed so far.
    checkpointed: u64,
    /// Highest last_entry_id that checkpoint_to is (or was) blocked on.
    blocked_on: u64,
    /// When the last checkpoint_to returned.
    last_cp: Option<Instant>,
}

type Sync = Arc<(Mutex<Shared>, Condvar)>;

struct Manager {
    sync: Sync,
    /// Replay callback target: (seq, payload_len) per record and per-entry max seq.
    replay: Arc<Mutex<ReplayState>>,
}

#[derive(Default)]
struct ReplayState {
    records: u64,
    seqs: Vec<(u64, usize)>,
    keep: bool,
    /// (entry id, max seq in entry)
    entries: Vec<(u64, u64)>,
}

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Manager")
    }
}

impl LogManager for Manager {
    fn recover(&mut self, entry: &mut Entry<'_>) -> io::Result<()> {
        let id = entry.id().0;
        let mut st = self.replay.lock().unwrap();
        let mut max_seq = 0;
        let mut buf = Vec::with_capacity(2048);
        let mut got: Vec<(u64, usize)> = Vec::new();
        loop {
            match entry.read_chunk()? {
                ReadChunkResult::Chunk(mut chunk) => {
                    buf.clear();
                    chunk.read_to_end(&mut buf)?;
                    if !chunk.check_crc()? {
                        return Err(io::Error::new(io::ErrorKind::InvalidData, "chunk crc"));
                    }
                    let (seq, plen) = common::decode(&buf)?;
                    max_seq = max_seq.max(seq);
                    got.push((seq, plen));
                }
                ReadChunkResult::EndOfEntry => break,
                // Torn entry (crash mid-write): okaywal reports it; drop its records.
                ReadChunkResult::AbortedEntry => return Ok(()),
            }
        }
        st.records += got.len() as u64;
        if st.keep {
            st.seqs.extend(got);
        }
        st.entries.push((id, max_seq));
        Ok(())
    }

    fn checkpoint_to(
        &mut self,
        last_checkpointed_id: EntryId,
        _entries: &mut SegmentReader,
        _wal: &WriteAheadLog,
    ) -> io::Result<()> {
        let (m, cv) = &*self.sync;
        let mut s = m.lock().unwrap();
        s.blocked_on = s.blocked_on.max(last_checkpointed_id.0);
        cv.notify_all();
        while s.watermark < last_checkpointed_id.0 {
            s = cv.wait(s).unwrap();
        }
        s.checkpointed += 1;
        s.last_cp = Some(Instant::now());
        cv.notify_all();
        Ok(())
    }
}

fn open(dir: &Path, keep: bool) -> io::Result<(WriteAheadLog, Sync, Arc<Mutex<ReplayState>>)> {
    let sync: Sync = Arc::default();
    let replay = Arc::new(Mutex::new(ReplayState { keep, ..Default::default() }));
    let mgr = Manager { sync: sync.clone(), replay: replay.clone() };
    let wal = Configuration::default_for(dir)
        .preallocate_bytes(PREALLOC)
        .checkpoint_after_bytes(CHECKPOINT_AFTER)
        .buffer_bytes(1 << 20)
        .open(mgr)?;
    Ok((wal, sync, replay))
}

pub struct Writer {
    wal: WriteAheadLog,
}

impl Writer {
    pub fn open(dir: &Path) -> io::Result<Self> {
        let (wal, _, _) = open(dir, false)?;
        Ok(Writer { wal })
    }

    pub fn commit_group(&mut self, g: &Group) -> io::Result<u64> {
        let mut w = self.wal.begin_entry()?;
        for (_seq, rec) in g.iter() {
            w.write_chunk(rec)?;
        }
        w.commit()?;
        Ok(1)
    }

    /// The checkpoint thread is parked in `checkpoint_to` (nothing released yet);
    /// we leave the log without `shutdown()` so every segment stays un-checkpointed.
    pub fn finish(self) {
        std::mem::forget(self.wal);
    }
}

/// Replay = recover. open_secs == total replay time (recovery is the replay).
pub fn replay(dir: &Path, f: &mut dyn FnMut(u64, usize)) -> io::Result<(f64, u64)> {
    let t = Instant::now();
    let (wal, _sync, st) = open(dir, true)?;
    let open_secs = t.elapsed().as_secs_f64();
    let st = std::mem::take(&mut *st.lock().unwrap());
    for (seq, plen) in st.seqs {
        f(seq, plen);
    }
    std::mem::forget(wal);
    Ok((open_secs, st.records))
}

pub fn release(dir: &Path, upto: u64, _chunk: u64, rep: &mut Report) -> io::Result<()> {
    let t0 = Instant::now();
    let (wal, sync, st) = open(dir, false)?;
    rep.add("reopen_secs", t0.elapsed().as_secs_f64());
    let entries = std::mem::take(&mut st.lock().unwrap().entries);
    // Highest entry id whose records are all < upto.
    let wm = entries.iter().filter(|(_, max)| *max < upto).map(|(id, _)| *id).max().unwrap_or(0);
    let t = Instant::now();
    let (m, cv) = &*sync;
    {
        let mut s = m.lock().unwrap();
        s.watermark = wm;
        cv.notify_all();
        // Done when checkpoint_to has moved past the watermark (blocked on a later
        // segment) or when it has been idle for a while (nothing more to do).
        loop {
            if s.blocked_on > wm {
                break;
            }
            let (g, to) = cv.wait_timeout(s, Duration::from_secs(2)).unwrap();
            s = g;
            if to.timed_out() {
                break;
            }
        }
        rep.add("segments_checkpointed", s.checkpointed);
        // Time until the last segment was handed back (not the idle timeout).
        let secs = s.last_cp.map(|c| c.saturating_duration_since(t).as_secs_f64()).unwrap_or(0.0);
        rep.add("release_secs", secs);
    }
    // okaywal renames + syncs the directory after checkpoint_to returns; give it a moment.
    std::thread::sleep(Duration::from_millis(200));
    rep.add("release_syncs", 0u64);
    rep.add("du_after_release_nocompact", common::du(dir));
    rep.add("compact_secs", 0.0f64);
    std::mem::forget(wal);
    Ok(())
}
