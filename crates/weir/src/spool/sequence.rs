//! Sequence numbers that are never reused, across restarts and clock
//! steps: a lease of numbers recorded on disk (`dir/sequence`, synced)
//! before any of them is used. A restart starts above the last lease,
//! whatever the clock says: a box without a real-time clock that boots
//! twice at the same restored time does not hand out the same numbers
//! twice. The spool's directory holds it, also when every class lives in
//! memory ([`SequenceLease::open_alone`]).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Numbers leased at a time: at 500k records/s, one small synced write
/// every two seconds.
const LEASE: u64 = 1 << 20;
/// Name of the lease file of record sequence numbers.
const FILE: &str = "sequence";
/// Name of the lease file of batch sequence numbers (a batch's file name
/// and AMQP `message_id` carry it).
const BATCH_FILE: &str = "batch-sequence";

/// A sequence-number source backed by a lease file.
#[derive(Debug)]
pub struct SequenceLease {
    dir: PathBuf,
    file: &'static str,
    next: AtomicU64,
    /// Numbers below this may be used.
    ceiling: AtomicU64,
    renew: Mutex<()>,
    /// The directory's lock, when the lease holds it (no spool does).
    _lock: Option<fs::File>,
}

impl SequenceLease {
    /// Opens the lease in `dir`: numbers start at the larger of `floor`
    /// (the clock-derived start) and the last lease's ceiling.
    pub fn open(dir: &Path, floor: u64) -> io::Result<Self> {
        Self::open_file(dir, FILE, floor)
    }

    /// The lease of batch sequence numbers in `dir` (beside the records'),
    /// from the larger of `floor` and its last ceiling. The scheduler
    /// numbers batches itself and keeps the lease ahead with
    /// [`Self::cover`].
    pub fn open_batches(dir: &Path, floor: u64) -> io::Result<Self> {
        Self::open_file(dir, BATCH_FILE, floor)
    }

    fn open_file(dir: &Path, file: &'static str, floor: u64) -> io::Result<Self> {
        let path = dir.join(file);
        let leased = match fs::read(&path) {
            Ok(bytes) => parse(&bytes).unwrap_or_else(|| {
                // Start-up does not fail on a damaged state file; the clock
                // is the fallback it was before the lease existed.
                tracing::error!(file = %path.display(), "sequence-number lease damaged; starting from the clock");
                0
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e),
        };
        let start = floor.max(leased);
        let lease = SequenceLease {
            dir: dir.to_owned(),
            file,
            next: AtomicU64::new(start),
            ceiling: AtomicU64::new(start),
            renew: Mutex::new(()),
            _lock: None,
        };
        lease.extend(start)?;
        Ok(lease)
    }

    /// A lease in `dir` for a weir whose classes all live in memory: the
    /// directory is created (durably) and locked as the spool's is, one
    /// weir per directory. `None`, with a warning, where that cannot be
    /// done (a directory weir may not write, or another weir's): numbers
    /// then start from the clock, which a restart at a clock set back can
    /// repeat.
    pub fn open_alone(dir: &Path, floor: u64) -> Option<Self> {
        let opened = super::files::create_dir_durable(dir)
            .and_then(|()| super::files::lock_dir(dir))
            .and_then(|lock| {
                let mut lease = Self::open(dir, floor)?;
                lease._lock = Some(lock);
                Ok(lease)
            });
        match opened {
            Ok(lease) => Some(lease),
            Err(e) => {
                let why = if e.kind() == io::ErrorKind::WouldBlock {
                    "another weir process uses this directory".to_owned()
                } else {
                    e.to_string()
                };
                tracing::warn!(dir = %dir.display(), error = %why, "no sequence-number lease in spool.dir: record sequence numbers start from the clock, so a restart with the clock set back (a box without a real-time clock) may repeat (origin, seq) and a deduplicating consumer would drop those records; give weir a writable spool.dir of its own");
                None
            }
        }
    }

    /// The first number this lease handed out or will hand out.
    pub fn peek(&self) -> u64 {
        self.next.load(Ordering::Relaxed)
    }

    /// The next number. Renews the lease (one synced write) when half of
    /// it is used; a failed renewal is logged and retried, and numbers are
    /// still handed out from the clock-free counter.
    pub fn next(&self) -> u64 {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        if n + LEASE / 2 >= self.ceiling.load(Ordering::Acquire) {
            let _guard = self.renew.lock().unwrap_or_else(|e| e.into_inner());
            if n + LEASE / 2 >= self.ceiling.load(Ordering::Acquire) {
                if let Err(e) = self.extend(n) {
                    tracing::error!(file = %self.dir.join(self.file).display(), error = %e, "cannot renew the sequence-number lease; numbers may be reused after a restart with the clock set back");
                }
            }
        }
        n
    }

    /// Numbers up to `n` are about to be used (counted elsewhere, as the
    /// scheduler counts batches): renews the lease (one synced write) once
    /// `n` passes half of it.
    pub fn cover(&self, n: u64) {
        if n + LEASE / 2 >= self.ceiling.load(Ordering::Acquire) {
            let _guard = self.renew.lock().unwrap_or_else(|e| e.into_inner());
            if let Err(e) = self.extend(n) {
                tracing::error!(file = %self.dir.join(self.file).display(), error = %e, "cannot renew the batch sequence-number lease; batch numbers may be reused after a restart with the clock set back");
            }
        }
    }

    fn extend(&self, from: u64) -> io::Result<()> {
        let ceiling = from + LEASE;
        super::files::replace(&self.dir, self.file, &encode(ceiling), true)?;
        self.ceiling.store(ceiling, Ordering::Release);
        Ok(())
    }
}

fn encode(ceiling: u64) -> Vec<u8> {
    let mut out = ceiling.to_le_bytes().to_vec();
    out.extend_from_slice(&crc32c::crc32c(&out).to_le_bytes());
    out
}

fn parse(bytes: &[u8]) -> Option<u64> {
    if bytes.len() != 12 {
        return None;
    }
    let (v, crc) = bytes.split_at(8);
    (crc32c::crc32c(v).to_le_bytes() == crc).then(|| u64::from_le_bytes(v.try_into().expect("8")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restart_never_reuses_numbers_even_with_the_clock_set_back() {
        let dir = tempdir();
        let first = SequenceLease::open(&dir, 1_000).unwrap();
        let used: Vec<u64> = (0..10).map(|_| first.next()).collect();
        assert_eq!(used[0], 1_000);
        drop(first);
        // The clock went back to 5.
        let second = SequenceLease::open(&dir, 5).unwrap();
        assert!(second.next() > *used.last().unwrap());
        // A damaged lease falls back to the clock, loudly.
        fs::write(dir.join(FILE), b"garbage").unwrap();
        assert_eq!(SequenceLease::open(&dir, 5).unwrap().next(), 5);
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_batch_lease_covered_by_its_user_is_never_passed_after_a_restart() {
        let dir = tempdir();
        let first = SequenceLease::open_batches(&dir, 10).unwrap();
        assert_eq!(first.peek(), 10);
        // Three leases' worth of batches numbered by the scheduler.
        let last = 10 + 3 * LEASE;
        for n in (10..=last).step_by(1 << 10) {
            first.cover(n);
        }
        first.cover(last);
        drop(first);
        let second = SequenceLease::open_batches(&dir, 10).unwrap();
        assert!(second.peek() > last);
        // Apart from the records' lease.
        assert_eq!(SequenceLease::open(&dir, 10).unwrap().peek(), 10);
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_lease_alone_creates_and_locks_its_directory() {
        let dir = tempdir().join("state");
        let first = SequenceLease::open_alone(&dir, 1_000).expect("a writable directory");
        assert_eq!(first.next(), 1_000);
        assert!(
            SequenceLease::open_alone(&dir, 1_000).is_none(),
            "one weir per directory"
        );
        drop(first);
        let second = SequenceLease::open_alone(&dir, 1_000).expect("unlocked");
        assert!(second.next() > 1_000);
        fs::remove_dir_all(dir.parent().unwrap()).unwrap();
    }

    fn tempdir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "weir-seq-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }
}
