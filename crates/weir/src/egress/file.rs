//! File egress: one file per batch in a directory, the embedded default so
//! weir relays with nothing else installed.
//!
//! Each batch is written to a temporary name, synced, then renamed into
//! place, so a reader never sees a partial batch and a confirmed batch
//! survives a power cut. Names sort in sending order:
//! `<node>-<batch seq, 20 digits>.<encoding>.weirbatch`; `weir decode`
//! reads them back.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::batch::EncodedBatch;
use super::sink::{confirmed, Confirm, Sink, SinkError};

/// File name extension of a batch file.
pub const EXTENSION: &str = "weirbatch";

/// Writes batches into a directory.
#[derive(Debug)]
pub struct FileSink {
    dir: PathBuf,
}

impl FileSink {
    /// Creates `dir` if needed.
    pub fn new(dir: impl Into<PathBuf>) -> std::io::Result<Self> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        Ok(FileSink { dir })
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
}

fn write_atomically(path: &Path, body: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(body)?;
    f.sync_data()?;
    std::fs::rename(&tmp, path)
}

impl Sink for FileSink {
    /// Writes and syncs the file; the confirmation is already in when this
    /// returns.
    async fn send(&mut self, batch: &EncodedBatch) -> Result<Confirm, SinkError> {
        let path = self.path_of(batch);
        let body = batch.body.clone();
        let shown = path.display().to_string();
        tokio::task::spawn_blocking(move || write_atomically(&path, &body))
            .await
            .map_err(|e| SinkError::Unavailable(format!("writing {shown}: {e}")))?
            .map_err(|e| SinkError::Unavailable(format!("writing {shown}: {e}")))?;
        Ok(confirmed())
    }

    fn name(&self) -> &'static str {
        "file"
    }
}
