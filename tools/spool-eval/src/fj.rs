//! Candidate 2: fjall (LSM). One keyspace "spool", key = big-endian u64 seq,
//! value = encoded record. Journal persisted manually: one write batch per group,
//! then `Database::persist(PersistMode::SyncData)`.
//! Release = point tombstones (fjall 3 has no range delete) in write batches;
//! space comes back only when compaction drops the tables.

use crate::common::{self, Group, Report};
use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};
use std::io;
use std::path::Path;
use std::time::Instant;

fn e(err: fjall::Error) -> io::Error {
    io::Error::other(format!("fjall: {err:?}"))
}

fn open(dir: &Path) -> io::Result<(Database, Keyspace)> {
    let db = Database::builder(dir).manual_journal_persist(true).open().map_err(e)?;
    let ks = db.keyspace("spool", KeyspaceCreateOptions::default).map_err(e)?;
    Ok((db, ks))
}

pub struct Writer {
    db: Database,
    ks: Keyspace,
}

impl Writer {
    pub fn open(dir: &Path) -> io::Result<Self> {
        let (db, ks) = open(dir)?;
        Ok(Writer { db, ks })
    }

    pub fn commit_group(&mut self, g: &Group) -> io::Result<u64> {
        let mut b = self.db.batch();
        for (seq, rec) in g.iter() {
            b.insert(&self.ks, seq.to_be_bytes(), rec);
        }
        b.commit().map_err(e)?;
        self.db.persist(PersistMode::SyncData).map_err(e)?;
        Ok(1)
    }

    /// Wait for background flushes so that the measured write bytes include them.
    pub fn finish(self, rep: &mut Report) -> io::Result<()> {
        let t = Instant::now();
        while self.db.outstanding_flushes() > 0 || self.db.active_compactions() > 0 {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        rep.add("bg_wait_secs", t.elapsed().as_secs_f64());
        rep.add("journals", self.db.journal_count());
        rep.add("tables", self.ks.table_count());
        Ok(())
    }
}

pub fn replay(dir: &Path, f: &mut dyn FnMut(u64, usize)) -> io::Result<(f64, u64)> {
    let t = Instant::now();
    let (_db, ks) = open(dir)?;
    let open_secs = t.elapsed().as_secs_f64();
    let mut n = 0;
    for g in ks.iter() {
        let (_k, v) = g.into_inner().map_err(e)?;
        let (seq, plen) = common::decode(&v)?;
        f(seq, plen);
        n += 1;
    }
    Ok((open_secs, n))
}

pub fn release(dir: &Path, upto: u64, chunk: u64, rep: &mut Report) -> io::Result<()> {
    let (db, ks) = open(dir)?;
    let t = Instant::now();
    let mut seq = 0u64;
    while seq < upto {
        let end = (seq + chunk).min(upto);
        let mut b = db.batch();
        for s in seq..end {
            b.remove(&ks, s.to_be_bytes());
        }
        b.commit().map_err(e)?;
        seq = end;
    }
    db.persist(PersistMode::SyncData).map_err(e)?;
    rep.add("release_secs", t.elapsed().as_secs_f64());
    rep.add("release_syncs", 1u64);
    rep.add("du_after_release_nocompact", common::du(dir));
    // Force the tombstones through: flush memtable, then major compaction.
    let t = Instant::now();
    ks.rotate_memtable_and_wait().map_err(e)?;
    ks.major_compact().map_err(e)?;
    while db.outstanding_flushes() > 0 || db.active_compactions() > 0 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    rep.add("compact_secs", t.elapsed().as_secs_f64());
    // Old journals are removed lazily once their memtables are flushed; give it a moment.
    let t = Instant::now();
    while db.journal_count() > 1 && t.elapsed().as_secs() < 3 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    rep.add("journals_after", db.journal_count());
    rep.add("journal_bytes_after", db.journal_disk_space().map_err(e)?);
    rep.add("tables_after", ks.table_count());
    Ok(())
}
