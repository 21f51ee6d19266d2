//! Sequence numbers that are never reused, across restarts and clock
//! steps: a lease of numbers recorded on disk (`dir/sequence`, synced)
//! before any of them is used. A restart starts above the last lease,
//! whatever the clock says.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Numbers leased at a time: at 500k records/s, one small synced write
/// every two seconds.
const LEASE: u64 = 1 << 20;
/// Name of the lease file.
const FILE: &str = "sequence";

/// A sequence-number source backed by a lease file.
#[derive(Debug)]
pub struct SequenceLease {
    dir: PathBuf,
    next: AtomicU64,
    /// Numbers below this may be used.
    ceiling: AtomicU64,
    renew: Mutex<()>,
}

impl SequenceLease {
    /// Opens the lease in `dir`: numbers start at the larger of `floor`
    /// (the clock-derived start) and the last lease's ceiling.
    pub fn open(dir: &Path, floor: u64) -> io::Result<Self> {
        let path = dir.join(FILE);
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
            next: AtomicU64::new(start),
            ceiling: AtomicU64::new(start),
            renew: Mutex::new(()),
        };
        lease.extend(start)?;
        Ok(lease)
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
                    tracing::error!(file = %self.dir.join(FILE).display(), error = %e, "cannot renew the sequence-number lease; numbers may be reused after a restart with the clock set back");
                }
            }
        }
        n
    }

    fn extend(&self, from: u64) -> io::Result<()> {
        let ceiling = from + LEASE;
        super::files::replace(&self.dir, FILE, &encode(ceiling), true)?;
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
