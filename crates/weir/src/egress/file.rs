//! File egress: one file per batch in a directory, the embedded default so
//! weir relays with nothing else installed.
//!
//! Each batch is written to a temporary name, synced, then renamed into
//! place, so a reader never sees a partial batch and a confirmed batch
//! survives a power cut. Names sort in sending order:
//! `<node>-<batch seq, 20 digits>.<encoding>.weirbatch`; `weir decode`
//! reads them back.
//!
//! The write bypasses the page cache (`O_DIRECT`) where the filesystem
//! allows it: every batch is synced anyway, and under a sustained stream a
//! buffered write spends most of its CPU in page-cache reclaim and dirty
//! throttling (1.6 ms of CPU per MiB here against 0.35 ms direct; see
//! docs/benchmarks.md, issue 20). weir's batch encoder aligns the body on
//! 4 KiB, so all its whole blocks go from memory to disk without a copy;
//! the last partial block is copied into an aligned buffer, written padded
//! to the block size, and the file cut back to the body's length before
//! the sync. A filesystem that refuses direct I/O
//! (EINVAL: tmpfs on older kernels, some network filesystems) gets the
//! buffered write from then on, with one log line.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::batch::EncodedBatch;
use super::sink::{confirmed, Confirm, Sink, SinkError};

/// File name extension of a batch file.
pub const EXTENSION: &str = "weirbatch";

/// Alignment of a direct write's buffer, offset and length: the largest
/// logical block size in common use.
const ALIGN: usize = 4096;

/// Writes batches into a directory.
#[derive(Debug)]
pub struct FileSink {
    dir: PathBuf,
    /// The writer, held here between batches (its aligned buffer is reused).
    writer: Option<Writer>,
}

impl FileSink {
    /// Creates `dir` if needed.
    pub fn new(dir: impl Into<PathBuf>) -> std::io::Result<Self> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        Ok(FileSink {
            dir,
            writer: Some(Writer::default()),
        })
    }

    /// The file a batch goes to.
    pub fn path_of(&self, batch: &EncodedBatch) -> PathBuf {
        self.dir.join(format!(
            "{}-{:020}.{}.{EXTENSION}",
            batch.node,
            batch.seq,
            batch.encoding.as_str()
        ))
    }

    /// Whether the next batch is written with `O_DIRECT`.
    pub fn writes_direct(&self) -> bool {
        self.writer.as_ref().is_some_and(|w| w.direct)
    }
}

/// Writes one batch file at a time; owns the aligned buffer direct writes
/// need.
#[derive(Debug)]
struct Writer {
    /// Still trying `O_DIRECT` (false once the filesystem refused it).
    direct: bool,
    scratch: Vec<u8>,
}

impl Default for Writer {
    fn default() -> Self {
        Writer {
            direct: true,
            scratch: Vec::new(),
        }
    }
}

impl Writer {
    /// Writes `body` to a temporary name beside `path`, syncs it and
    /// renames it into place.
    fn write_atomically(&mut self, path: &Path, body: &[u8]) -> std::io::Result<()> {
        let tmp = path.with_extension("tmp");
        if self.direct {
            match self.write_direct(&tmp, body) {
                Ok(()) => return std::fs::rename(&tmp, path),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    tracing::info!(
                        dir = %path.parent().unwrap_or(Path::new(".")).display(),
                        "the filesystem refuses direct I/O; batch files are written through the page cache"
                    );
                    self.direct = false;
                    self.scratch = Vec::new();
                }
                Err(e) => return Err(e),
            }
        }
        let mut f = File::create(&tmp)?;
        f.write_all(body)?;
        f.sync_data()?;
        std::fs::rename(&tmp, path)
    }

    /// An aligned body (weir's own encoder aligns it) goes to the disk
    /// straight from memory, all but its last partial block; that tail,
    /// or the whole of an unaligned body, is copied into the aligned
    /// scratch buffer first.
    fn write_direct(&mut self, tmp: &Path, body: &[u8]) -> std::io::Result<()> {
        let direct_part = if body.as_ptr().align_offset(ALIGN) == 0 {
            body.len() / ALIGN * ALIGN
        } else {
            0
        };
        let rest = &body[direct_part..];
        let padded = rest.len().div_ceil(ALIGN) * ALIGN;
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT)
            .open(tmp)?;
        f.write_all(&body[..direct_part])?;
        if padded > 0 {
            if self.scratch.len() < padded + ALIGN {
                self.scratch = vec![0; padded + ALIGN];
            }
            let start = self.scratch.as_ptr().align_offset(ALIGN);
            let buf = &mut self.scratch[start..start + padded];
            buf[..rest.len()].copy_from_slice(rest);
            buf[rest.len()..].fill(0);
            f.write_all(buf)?;
            if padded != rest.len() {
                f.set_len(body.len() as u64)?;
            }
        }
        f.sync_data()
    }
}

impl Sink for FileSink {
    /// Writes and syncs the file; the confirmation is already in when this
    /// returns.
    async fn send(&mut self, batch: &EncodedBatch) -> Result<Confirm, SinkError> {
        let path = self.path_of(batch);
        let body = batch.body.clone();
        let shown = path.display().to_string();
        let mut writer = self.writer.take().unwrap_or_default();
        let (writer, written) = tokio::task::spawn_blocking(move || {
            let written = writer.write_atomically(&path, &body);
            (writer, written)
        })
        .await
        .map_err(|e| SinkError::Unavailable(format!("writing {shown}: {e}")))?;
        self.writer = Some(writer);
        written.map_err(|e| SinkError::Unavailable(format!("writing {shown}: {e}")))?;
        Ok(confirmed())
    }

    fn name(&self) -> &'static str {
        "file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tempdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("weir-file-sink-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn bodies() -> Vec<Vec<u8>> {
        // Empty, shorter than a block, exactly one, one more than one, and
        // several blocks with a tail.
        [0usize, 1, 100, ALIGN, ALIGN + 1, 3 * ALIGN + 17, 1 << 20]
            .iter()
            .map(|&n| (0..n).map(|i| (i * 31 % 251) as u8).collect())
            .collect()
    }

    #[test]
    fn every_length_reads_back_exactly() {
        let dir = tempdir("lengths");
        let mut w = Writer::default();
        for (i, body) in bodies().iter().enumerate() {
            let path = dir.join(format!("{i}.{EXTENSION}"));
            w.write_atomically(&path, body).unwrap();
            assert_eq!(&std::fs::read(&path).unwrap(), body, "length {}", body.len());
            assert!(!path.with_extension("tmp").exists());
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn aligned_bodies_read_back_exactly() {
        let dir = tempdir("aligned");
        let mut w = Writer::default();
        for (i, body) in bodies().iter().enumerate() {
            // Aligned as weir's encoder leaves a batch body.
            let mut v: Vec<u8> = Vec::with_capacity(body.len() + ALIGN);
            let start = v.as_ptr().align_offset(ALIGN);
            v.resize(start, 0);
            v.extend_from_slice(body);
            let aligned = bytes::Bytes::from(v).slice(start..);
            assert_eq!(aligned.as_ptr().align_offset(ALIGN), 0);
            let path = dir.join(format!("{i}.{EXTENSION}"));
            w.write_atomically(&path, &aligned).unwrap();
            assert_eq!(&std::fs::read(&path).unwrap(), body, "length {}", body.len());
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn direct_io_is_used_where_the_filesystem_allows_it() {
        // Whatever the temporary directory's filesystem is: direct when it
        // takes an O_DIRECT open, buffered (and still correct) when not.
        let dir = tempdir("direct");
        let mut w = Writer::default();
        let path = dir.join(format!("x.{EXTENSION}"));
        w.write_atomically(&path, b"abc").unwrap();
        let probe = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT)
            .open(dir.join("probe"));
        assert_eq!(w.direct, probe.is_ok());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_refused_direct_write_falls_back_to_the_page_cache() {
        let dir = tempdir("fallback");
        let mut w = Writer {
            direct: false,
            scratch: Vec::new(),
        };
        let path = dir.join(format!("y.{EXTENSION}"));
        w.write_atomically(&path, b"hello").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"hello");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
