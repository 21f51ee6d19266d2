//! Candidate 3: redb (copy-on-write B-tree, single file). Table u64 seq -> record bytes.
//! One write transaction per group with `Durability::Immediate`.
//! Release = `retain_in(..)` deleting key ranges in FIFO chunks (non-durable commits,
//! a final Immediate commit); freed pages are reused but the file shrinks only with
//! `Database::compact()`.

use crate::common::{self, Group, Report};
use redb::{Database, Durability, ReadableDatabase, TableDefinition};
use std::io;
use std::path::Path;
use std::time::Instant;

const TABLE: TableDefinition<u64, &[u8]> = TableDefinition::new("spool");
const FILE: &str = "spool.redb";

fn e<E: std::fmt::Debug>(err: E) -> io::Error {
    io::Error::other(format!("redb: {err:?}"))
}

pub struct Writer {
    db: Database,
}

impl Writer {
    pub fn open(dir: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let db = Database::create(dir.join(FILE)).map_err(e)?;
        Ok(Writer { db })
    }

    pub fn commit_group(&mut self, g: &Group) -> io::Result<u64> {
        let mut tx = self.db.begin_write().map_err(e)?;
        tx.set_durability(Durability::Immediate).map_err(e)?;
        {
            let mut t = tx.open_table(TABLE).map_err(e)?;
            for (seq, rec) in g.iter() {
                t.insert(seq, rec).map_err(e)?;
            }
        }
        tx.commit().map_err(e)?;
        Ok(1)
    }
}

pub fn replay(dir: &Path, f: &mut dyn FnMut(u64, usize)) -> io::Result<(f64, u64)> {
    let t = Instant::now();
    let db = Database::open(dir.join(FILE)).map_err(e)?;
    let open_secs = t.elapsed().as_secs_f64();
    let tx = db.begin_read().map_err(e)?;
    let table = tx.open_table(TABLE).map_err(e)?;
    let mut n = 0;
    for item in table.range::<u64>(..).map_err(e)? {
        let (_k, v) = item.map_err(e)?;
        let (seq, plen) = common::decode(v.value())?;
        f(seq, plen);
        n += 1;
    }
    Ok((open_secs, n))
}

pub fn release(dir: &Path, upto: u64, chunk: u64, rep: &mut Report) -> io::Result<()> {
    let mut db = Database::open(dir.join(FILE)).map_err(e)?;
    let t = Instant::now();
    let mut seq = 0u64;
    let mut syncs = 0u64;
    while seq < upto {
        let end = (seq + chunk).min(upto);
        let mut tx = db.begin_write().map_err(e)?;
        let last = end == upto;
        tx.set_durability(if last { Durability::Immediate } else { Durability::None }).map_err(e)?;
        {
            let mut t = tx.open_table(TABLE).map_err(e)?;
            t.retain_in(seq..end, |_, _| false).map_err(e)?;
        }
        tx.commit().map_err(e)?;
        if last {
            syncs += 1;
        }
        seq = end;
    }
    rep.add("release_secs", t.elapsed().as_secs_f64());
    rep.add("release_syncs", syncs);
    rep.add("du_after_release_nocompact", common::du(dir));
    let t = Instant::now();
    let mut rounds = 0u64;
    while db.compact().map_err(e)? {
        rounds += 1;
        if rounds > 50 {
            break;
        }
    }
    rep.add("compact_secs", t.elapsed().as_secs_f64());
    Ok(())
}
