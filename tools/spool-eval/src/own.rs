//! Candidate 1: a minimal segment log written for this evaluation.
//!
//! Directory of `seg-<first_seq:020>.log` files, each at most `SEGMENT_BYTES`.
//! Frame = u32 body_len (LE) + u32 crc32c(body) + body (the encoded record).
//! Group commit = flush the BufWriter, `sync_data` every file written since the last
//! commit (normally just the active one) and, if a segment was created, fsync the dir.
//! Replay = read segments in name order, check each CRC, stop at a torn/corrupt tail.
//! Release = advance a watermark; delete every non-active segment whose last seq is
//! at or below it (whole-file unlink), then fsync the directory once.

use crate::common::{self, Group, Report};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

pub const SEGMENT_BYTES: u64 = 64 << 20;
const FRAME_HDR: usize = 8;

fn seg_name(first_seq: u64) -> String {
    format!("seg-{first_seq:020}.log")
}

/// Sorted (first_seq, path) of all segments in `dir`.
fn list_segments(dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut v = Vec::new();
    for e in fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name();
        let name = name.to_string_lossy();
        if let Some(n) = name.strip_prefix("seg-").and_then(|s| s.strip_suffix(".log")) {
            if let Ok(first) = n.parse::<u64>() {
                v.push((first, e.path()));
            }
        }
    }
    v.sort();
    Ok(v)
}

pub struct Writer {
    dir: PathBuf,
    cur: BufWriter<File>,
    cur_len: u64,
    /// Rotated-out files not yet synced.
    pending: Vec<File>,
    dir_dirty: bool,
}

impl Writer {
    /// Opens a fresh log (the eval always appends to an empty dir; a real spool would
    /// replay first and start a new segment after the last valid frame).
    pub fn open(dir: &Path, next_seq: u64) -> io::Result<Self> {
        fs::create_dir_all(dir)?;
        let f = Self::create(dir, next_seq)?;
        Ok(Writer {
            dir: dir.to_path_buf(),
            cur: BufWriter::with_capacity(1 << 20, f),
            cur_len: 0,
            pending: Vec::new(),
            dir_dirty: true,
        })
    }

    fn create(dir: &Path, first_seq: u64) -> io::Result<File> {
        OpenOptions::new().create_new(true).append(true).open(dir.join(seg_name(first_seq)))
    }

    fn rotate(&mut self, first_seq: u64) -> io::Result<()> {
        let f = Self::create(&self.dir, first_seq)?;
        let old = std::mem::replace(&mut self.cur, BufWriter::with_capacity(1 << 20, f));
        let old = old.into_inner().map_err(|e| e.into_error())?;
        self.pending.push(old);
        self.cur_len = 0;
        self.dir_dirty = true;
        Ok(())
    }

    /// Appends every record of the group and makes them durable. Returns sync calls.
    pub fn commit_group(&mut self, g: &Group) -> io::Result<u64> {
        for (seq, rec) in g.iter() {
            let frame_len = (FRAME_HDR + rec.len()) as u64;
            if self.cur_len > 0 && self.cur_len + frame_len > SEGMENT_BYTES {
                self.rotate(seq)?;
            }
            let crc = crc32c::crc32c(rec);
            self.cur.write_all(&(rec.len() as u32).to_le_bytes())?;
            self.cur.write_all(&crc.to_le_bytes())?;
            self.cur.write_all(rec)?;
            self.cur_len += frame_len;
        }
        self.cur.flush()?;
        let mut syncs = 0;
        for f in self.pending.drain(..) {
            f.sync_data()?;
            syncs += 1;
        }
        self.cur.get_ref().sync_data()?;
        syncs += 1;
        if self.dir_dirty {
            common::sync_dir(&self.dir)?;
            self.dir_dirty = false;
            syncs += 1;
        }
        Ok(syncs)
    }
}

/// Sequential replay. Returns (open_secs, records) and calls `f(seq, payload_len)`.
pub fn replay(dir: &Path, f: &mut dyn FnMut(u64, usize)) -> io::Result<(f64, u64)> {
    let t = Instant::now();
    let segs = list_segments(dir)?;
    let open_secs = t.elapsed().as_secs_f64();
    let mut n = 0u64;
    let mut body = Vec::with_capacity(4096);
    let last = segs.len().saturating_sub(1);
    for (i, (_, path)) in segs.iter().enumerate() {
        let mut r = BufReader::with_capacity(1 << 20, File::open(path)?);
        let mut hdr = [0u8; FRAME_HDR];
        loop {
            match r.read_exact(&mut hdr) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
                Err(e) => return Err(e),
            }
            let len = u32::from_le_bytes(hdr[0..4].try_into().unwrap()) as usize;
            let crc = u32::from_le_bytes(hdr[4..8].try_into().unwrap());
            body.resize(len, 0);
            let ok = r.read_exact(&mut body).is_ok() && crc32c::crc32c(&body) == crc;
            if !ok {
                if i == last {
                    // Torn tail of the active segment: the real spool truncates here.
                    break;
                }
                return Err(io::Error::new(io::ErrorKind::InvalidData, format!("corrupt frame in {path:?}")));
            }
            let (seq, plen) = common::decode(&body)?;
            f(seq, plen);
            n += 1;
        }
    }
    Ok((open_secs, n))
}

/// Release every record with seq < `upto`, in FIFO chunks of `chunk` records.
pub fn release(dir: &Path, upto: u64, chunk: u64, rep: &mut Report) -> io::Result<()> {
    let t = Instant::now();
    let mut segs = list_segments(dir)?;
    let mut syncs = 0u64;
    let mut watermark = 0u64; // all seq < watermark are released
    let mut deleted = 0u64;
    while watermark < upto {
        watermark = (watermark + chunk).min(upto);
        // A segment's last seq is the next segment's first_seq - 1; never delete the last one.
        while segs.len() > 1 && segs[1].0 <= watermark {
            fs::remove_file(&segs[0].1)?;
            segs.remove(0);
            deleted += 1;
        }
    }
    common::sync_dir(dir)?;
    syncs += 1;
    rep.add("release_secs", t.elapsed().as_secs_f64());
    rep.add("release_syncs", syncs);
    rep.add("segments_deleted", deleted);
    Ok(())
}
