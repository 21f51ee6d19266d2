//! File egress: batches appended to segment files in a directory, the
//! embedded default so weir relays with nothing else installed.
//!
//! One writer thread owns the segment being written,
//! `<node>-<first batch seq, 20 digits>.weirseg.open`. It appends each
//! batch as a frame ([`weir_proto::segment`]: header with a CRC-32C, body,
//! zeros up to the next 4 KiB), and confirms the batches it has written
//! with one `fdatasync` for all of them (group commit: while one sync runs,
//! the next batches queue up and share the next one). A confirmed batch
//! survives a power cut. A segment is sealed, renamed to `….weirseg` with
//! the directory synced, once it holds `segment_bytes` or is `segment_age`
//! old; every batch in a sealed segment is confirmed. Names sort in sending
//! order. `weir decode` reads segments; docs/consuming.md has the format.
//!
//! Frames go to the disk without the page cache (`O_DIRECT`) where the
//! filesystem allows it: every batch is synced anyway, and under a
//! sustained stream a buffered write spends most of its CPU in page-cache
//! reclaim and dirty throttling (1.6 ms of CPU per MiB against 0.35 ms
//! direct; docs/benchmarks.md). weir's batch encoder leaves room for the
//! frame header in front of the body ([`weir_proto::BODY_OFFSET`]), so the
//! header and the body's first bytes fill the first block from a small
//! aligned buffer, the body's whole blocks go from memory to disk without a
//! copy, and its last partial block is copied and padded. A filesystem that
//! refuses direct I/O (EINVAL) gets buffered writes from then on, with one
//! log line.
//!
//! A failed write or sync fails that batch and every later one already
//! queued; the segment is sealed at its last confirmed frame (removed if it
//! has none), and the delivery loop's resend of the failed batch starts a
//! new segment. A segment left open by a crash is sealed at the next start,
//! cut after its last intact frame.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use weir_core::NodeId;
use weir_proto::segment::{self, FrameHeader, BLOCK, HEADER_LEN, OPEN_SUFFIX};

use super::batch::EncodedBatch;
use super::sink::{Confirm, Sink, SinkError};
use crate::clock::unix_micros;
use crate::config::FileEgress;
use crate::spool::files::{create_dir_durable, lock_file, sync_dir};

/// Batches sent and not yet confirmed, at most: enough to fill a sync's
/// time with the next group's writes.
pub const WINDOW: usize = 16;

/// Writes batches into segment files in a directory.
#[derive(Debug)]
pub struct FileSink {
    jobs: Option<mpsc::Sender<Job>>,
    writer: Option<std::thread::JoinHandle<()>>,
    /// Held while this sink writes the node's segments.
    _lock: File,
}

/// One batch for the writer thread, and where its outcome goes.
#[derive(Debug)]
struct Job {
    batch: EncodedBatch,
    done: oneshot::Sender<Result<(), String>>,
}

/// How segments are cut.
#[derive(Debug, Clone, Copy)]
pub struct Rolling {
    /// Seal a segment once it holds this many bytes.
    pub bytes: u64,
    /// ... or once it is this old.
    pub age: Duration,
}

impl FileSink {
    /// Creates `cfg.dir` if needed (durably), seals the segments of `node` a crash
    /// left open there, and starts the writer thread.
    pub fn new(cfg: &FileEgress, node: NodeId) -> std::io::Result<Self> {
        let rolling = Rolling {
            bytes: cfg.segment_bytes,
            age: cfg.segment_age,
        };
        Self::with_rolling(&cfg.dir, node, rolling)
    }

    /// [`FileSink::new`] with the directory and rolling given directly.
    ///
    /// Fails with `WouldBlock` while another process writes `node`'s
    /// segments in `dir` (it holds `dir/.weir-<node>.lock`).
    pub fn with_rolling(dir: &Path, node: NodeId, rolling: Rolling) -> std::io::Result<Self> {
        // Synced in its parent: a power cut must not take the directory
        // with the segments synced into it.
        create_dir_durable(dir)?;
        let lock = lock_file(&dir.join(format!(".weir-{node}.lock"))).map_err(|e| {
            if e.kind() == std::io::ErrorKind::WouldBlock {
                std::io::Error::new(
                    e.kind(),
                    format!("another process writes node {node}'s segments here (it holds .weir-{node}.lock)"),
                )
            } else {
                e
            }
        })?;
        recover(dir, node)?;
        let (tx, rx) = mpsc::channel();
        let mut writer = Writer {
            dir: dir.to_owned(),
            node,
            rolling,
            open: None,
            direct: true,
            failed: None,
            scratch: Vec::new(),
        };
        let handle = std::thread::Builder::new()
            .name("weir-file-egress".into())
            .spawn(move || writer.run(&rx))?;
        Ok(FileSink {
            jobs: Some(tx),
            writer: Some(handle),
            _lock: lock,
        })
    }
}

impl Drop for FileSink {
    /// Stops the writer, which seals the open segment.
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(h) = self.writer.take() {
            let _ = h.join();
        }
    }
}

/// The path of `node`'s segment starting at `first_seq`, sealed or open.
pub fn segment_path(dir: &Path, node: NodeId, first_seq: u64, open: bool) -> PathBuf {
    let suffix = if open { OPEN_SUFFIX } else { "" };
    dir.join(format!(
        "{node}-{first_seq:020}.{}{suffix}",
        segment::EXTENSION
    ))
}

/// Seals every segment of `node` left open in `dir` (a crash, a power
/// cut): cut after its last intact frame, renamed, the directory synced.
/// One with no intact frame is removed.
fn recover(dir: &Path, node: NodeId) -> std::io::Result<()> {
    let prefix = format!("{node}-");
    let mut changed = false;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(sealed) = name.strip_suffix(OPEN_SUFFIX) else {
            continue;
        };
        if !name.starts_with(&prefix) || !segment::is_segment_name(name) {
            continue;
        }
        let bytes = std::fs::read(&path)?;
        let seg = segment::read(&bytes);
        changed = true;
        if seg.frames.is_empty() {
            std::fs::remove_file(&path)?;
            tracing::info!(segment = %path.display(), "removed a segment left open with no complete batch");
            continue;
        }
        let f = OpenOptions::new().write(true).open(&path)?;
        f.set_len(seg.end as u64)?;
        f.sync_all()?;
        std::fs::rename(&path, dir.join(sealed))?;
        tracing::info!(
            segment = %dir.join(sealed).display(),
            batches = seg.frames.len(),
            cut_bytes = bytes.len() - seg.end,
            "sealed a segment left open by the last run"
        );
    }
    if changed {
        sync_dir(dir)?;
    }
    Ok(())
}

/// The segment being written.
#[derive(Debug)]
struct OpenSegment {
    file: File,
    first_seq: u64,
    opened: Instant,
    /// Bytes written (frames end here).
    len: u64,
    /// Bytes confirmed (synced).
    synced: u64,
}

/// The writer thread's state.
#[derive(Debug)]
struct Writer {
    dir: PathBuf,
    node: NodeId,
    rolling: Rolling,
    open: Option<OpenSegment>,
    /// Still trying `O_DIRECT` (false once the filesystem refused it).
    direct: bool,
    /// The batch whose write or sync failed; later batches sent before its
    /// resend are refused, so a segment holds batches in sending order.
    failed: Option<u64>,
    /// Aligned room for a frame's first and last blocks.
    scratch: Vec<u8>,
}

impl Writer {
    fn run(&mut self, jobs: &mpsc::Receiver<Job>) {
        loop {
            let first = match &self.open {
                Some(seg) => {
                    let left = self.rolling.age.saturating_sub(seg.opened.elapsed());
                    match jobs.recv_timeout(left) {
                        Ok(job) => job,
                        Err(RecvTimeoutError::Timeout) => {
                            self.seal();
                            continue;
                        }
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                }
                None => match jobs.recv() {
                    Ok(job) => job,
                    Err(_) => break,
                },
            };
            let mut group = Vec::new();
            for job in std::iter::once(first).chain(jobs.try_iter()) {
                self.write(job, &mut group);
            }
            self.commit(group);
        }
        self.seal();
    }

    /// Appends one batch's frame, to be confirmed by the group's sync; or
    /// fails it (and what is written but unsynced before it).
    fn write(&mut self, job: Job, group: &mut Vec<Job>) {
        let seq = job.batch.seq;
        let roll = self
            .open
            .as_ref()
            .is_some_and(|s| s.len >= self.rolling.bytes || s.opened.elapsed() >= self.rolling.age);
        if roll {
            // What the group wrote is confirmed in the segment it is in.
            self.commit(std::mem::take(group));
            self.seal();
        }
        if let Some(failed) = self.failed {
            if seq > failed {
                let _ = job.done.send(Err(format!(
                    "not written: batch {failed} before it failed and is sent again first"
                )));
                return;
            }
            self.failed = None;
        }
        match self.append(&job.batch) {
            Ok(()) => group.push(job),
            Err(e) => {
                let why = format!("writing batch {seq}: {e}");
                self.fail(seq, group, &why);
                let _ = job.done.send(Err(why));
            }
        }
    }

    fn append(&mut self, batch: &EncodedBatch) -> std::io::Result<()> {
        if self.open.is_none() {
            self.open = Some(self.create(batch.seq)?);
        }
        let header = FrameHeader {
            encoding: batch.encoding,
            len: batch.body.len(),
            batch_seq: batch.seq,
            written_us: unix_micros(),
        };
        if batch.body.len() > segment::MAX_BODY {
            return Err(std::io::Error::other("a batch body over 4 GiB"));
        }
        let head = header.encode(&batch.body);
        let at = self.open.as_ref().expect("opened above").len;
        match self.write_frame(at, &head, &batch.body) {
            Err(e) if self.direct && e.raw_os_error() == Some(libc::EINVAL) => {
                self.refuse_direct();
                let seg = self.open.as_mut().expect("opened above");
                seg.file = OpenOptions::new().write(true).open(segment_path(
                    &self.dir,
                    self.node,
                    seg.first_seq,
                    true,
                ))?;
                self.write_frame(at, &head, &batch.body)?;
            }
            r => r?,
        }
        self.open.as_mut().expect("opened above").len +=
            segment::frame_len(batch.body.len()) as u64;
        Ok(())
    }

    /// The filesystem refused `O_DIRECT`: buffered writes from now on,
    /// said once.
    fn refuse_direct(&mut self) {
        self.direct = false;
        tracing::info!(
            dir = %self.dir.display(),
            "the filesystem refuses direct I/O; segments are written through the page cache"
        );
    }

    /// Creates the segment starting at `first_seq` and syncs the directory,
    /// so its name survives a power cut with the batches it confirms.
    fn create(&mut self, first_seq: u64) -> std::io::Result<OpenSegment> {
        let path = segment_path(&self.dir, self.node, first_seq, true);
        let open = |direct: bool| {
            let mut o = OpenOptions::new();
            o.write(true).create_new(true);
            if direct {
                o.custom_flags(libc::O_DIRECT);
            }
            o.open(&path)
        };
        let file = match open(self.direct) {
            Err(e) if self.direct && e.raw_os_error() == Some(libc::EINVAL) => {
                self.refuse_direct();
                open(false)?
            }
            r => r?,
        };
        sync_dir(&self.dir)?;
        Ok(OpenSegment {
            file,
            first_seq,
            opened: Instant::now(),
            len: 0,
            synced: 0,
        })
    }

    /// Writes a frame at `at`: the header and the body's first bytes from
    /// the aligned scratch block, the body's whole blocks straight from
    /// memory when the encoder placed it so, the rest from scratch, padded.
    fn write_frame(
        &mut self,
        at: u64,
        head: &[u8; HEADER_LEN],
        body: &[u8],
    ) -> std::io::Result<()> {
        let file = &self.open.as_ref().expect("open while writing").file;
        let first = BLOCK - HEADER_LEN;
        let placed = (body.as_ptr() as usize) % BLOCK == HEADER_LEN;
        let frame = segment::frame_len(body.len());
        if !placed || body.len() < first {
            let buf = aligned(&mut self.scratch, frame);
            buf[..HEADER_LEN].copy_from_slice(head);
            buf[HEADER_LEN..HEADER_LEN + body.len()].copy_from_slice(body);
            buf[HEADER_LEN + body.len()..].fill(0);
            return file.write_all_at(buf, at);
        }
        let middle = (body.len() - first) / BLOCK * BLOCK;
        let tail = &body[first + middle..];
        let tail_padded = tail.len().div_ceil(BLOCK) * BLOCK;
        let buf = aligned(&mut self.scratch, BLOCK + tail_padded);
        buf[..HEADER_LEN].copy_from_slice(head);
        buf[HEADER_LEN..BLOCK].copy_from_slice(&body[..first]);
        file.write_all_at(&buf[..BLOCK], at)?;
        file.write_all_at(&body[first..first + middle], at + BLOCK as u64)?;
        if tail_padded > 0 {
            let t = &mut buf[BLOCK..];
            t[..tail.len()].copy_from_slice(tail);
            t[tail.len()..].fill(0);
            file.write_all_at(t, at + (BLOCK + middle) as u64)?;
        }
        Ok(())
    }

    /// Syncs what the group wrote and confirms it; or fails it all.
    fn commit(&mut self, mut group: Vec<Job>) {
        let Some(first) = group.first().map(|j| j.batch.seq) else {
            return;
        };
        let seg = self.open.as_mut().expect("a group was written to it");
        match seg.file.sync_data() {
            Ok(()) => {
                seg.synced = seg.len;
                for job in group {
                    let _ = job.done.send(Ok(()));
                }
            }
            Err(e) => self.fail(first, &mut group, &format!("syncing: {e}")),
        }
    }

    /// A write or sync failed at batch `seq`: the unsynced batches written
    /// before it fail with it, and the segment is sealed at what was
    /// confirmed (removed if nothing was).
    fn fail(&mut self, seq: u64, group: &mut Vec<Job>, why: &str) {
        let first = group.first().map_or(seq, |j| j.batch.seq);
        for job in group.drain(..) {
            let _ = job.done.send(Err(why.to_owned()));
        }
        self.failed = Some(first);
        tracing::warn!(dir = %self.dir.display(), batch = first, error = why, "file egress failed; the batches are sent again");
        self.seal();
    }

    /// Seals the open segment at its confirmed length: renamed without
    /// `.open`, the directory synced; removed if it holds nothing
    /// confirmed. Errors are logged: its batches are either confirmed
    /// (and stay readable under the open name) or sent again.
    fn seal(&mut self) {
        let Some(seg) = self.open.take() else {
            return;
        };
        let open = segment_path(&self.dir, self.node, seg.first_seq, true);
        let sealed = segment_path(&self.dir, self.node, seg.first_seq, false);
        let done = if seg.synced == 0 {
            std::fs::remove_file(&open)
        } else {
            (|| {
                if seg.len != seg.synced {
                    seg.file.set_len(seg.synced)?;
                    seg.file.sync_all()?;
                }
                std::fs::rename(&open, &sealed)
            })()
        };
        if let Err(e) = done.and_then(|()| sync_dir(&self.dir)) {
            tracing::warn!(segment = %open.display(), error = %e, "could not seal the segment; the next start does");
        }
    }
}

/// A `len`-byte slice of `scratch` that starts on a [`BLOCK`] boundary.
fn aligned(scratch: &mut Vec<u8>, len: usize) -> &mut [u8] {
    if scratch.len() < len + BLOCK {
        *scratch = vec![0; len + BLOCK];
    }
    let start = scratch.as_ptr().align_offset(BLOCK);
    &mut scratch[start..start + len]
}

/// One batch read back from a segment.
#[derive(Debug, Clone)]
pub struct ReadBatch {
    /// The segment it is in.
    pub segment: PathBuf,
    /// Its frame header (encoding, length, when it was written).
    pub frame: FrameHeader,
    /// The batch, decoded.
    pub batch: weir_proto::pb::Batch,
}

/// Every batch in the segments of `dir` (every node's, sealed and open),
/// in name order and, within a segment, in file order; damaged frames are
/// skipped. Batches that decode to more than `max_decoded` bytes are an
/// error. For tests, the lab and tools that read what weir wrote.
pub fn read_batches(dir: &Path, max_decoded: usize) -> std::io::Result<Vec<ReadBatch>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(segment::is_segment_name)
        })
        .collect();
    paths.sort();
    let mut out = Vec::new();
    for path in paths {
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            // Sealed (renamed) since it was listed: read under its new name.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                match path.to_str().and_then(|p| p.strip_suffix(OPEN_SUFFIX)) {
                    Some(sealed) => std::fs::read(sealed)?,
                    None => return Err(e),
                }
            }
            Err(e) => return Err(e),
        };
        for f in segment::read(&bytes).frames {
            let batch = weir_proto::decode_batch(f.body, f.header.encoding.as_str(), max_decoded)
                .map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{} at offset {}: {e}", path.display(), f.offset),
                )
            })?;
            out.push(ReadBatch {
                segment: path.clone(),
                frame: f.header,
                batch,
            });
        }
    }
    Ok(out)
}

impl Sink for FileSink {
    /// Hands the batch to the writer thread; its confirmation comes once
    /// the batch is written and synced.
    async fn send(&mut self, batch: &EncodedBatch) -> Result<Confirm, SinkError> {
        let (done, outcome) = oneshot::channel();
        let stopped = || SinkError::Unavailable("the file writer stopped".into());
        self.jobs
            .as_ref()
            .ok_or_else(stopped)?
            .send(Job {
                batch: batch.clone(),
                done,
            })
            .map_err(|_| stopped())?;
        Ok(Box::pin(async move {
            outcome
                .await
                .map_err(|_| SinkError::Unavailable("the file writer stopped".into()))?
                .map_err(SinkError::Unavailable)
        }))
    }

    fn window(&self) -> usize {
        WINDOW
    }

    fn name(&self) -> &'static str {
        "file"
    }
}

#[cfg(test)]
mod tests;
