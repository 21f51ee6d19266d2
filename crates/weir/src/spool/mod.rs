//! The durable spool: records of classes with `durability = "spool"` are
//! appended to per-class segment logs and made durable (fdatasync, one per
//! group of appends) before their acknowledgement goes out; they are
//! released once the egress has them confirmed or a peer has them
//! delivered, and a segment is deleted once all its records are. On start,
//! what was not released is replayed. What each decision is lives in
//! `weir_core::spool`; this module moves the bytes.
//!
//! # Threads
//! - The **writer** (`writer.rs`, one OS thread) owns every file write: it
//!   takes appends in arrival order, writes them, syncs once per group,
//!   completes their tickets and hands the records to the class queues. It
//!   also deletes released segments and writes checkpoints.
//! - The **reader** (`reader.rs`, one OS thread) refills a class queue
//!   from disk when the class fell behind (its queue was full when a
//!   record became durable): memory holds only a window of the backlog.
//!
//! # Layout
//! - `shared.rs`: the state every part shares (each class's log under its
//!   lock, the writer's channel, tickets) and the tuning constants.
//! - `files.rs`: segment files and checkpoints on disk.
//! - `recover.rs`: start-up: scan, truncate torn tails, move bad files
//!   aside, rebuild each class's log.
//! - `writer.rs`, `reader.rs`: the two threads.
//! - `sequence.rs`: the sequence-number lease that survives restarts.

pub(crate) mod files;
mod reader;
mod recover;
mod sequence;
mod shared;
mod sync;
mod writer;

#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::Notify;
use weir_core::queueing::queue::MultiLevelQueue;
use weir_core::spool::Admit;
use weir_core::{ClassId, ClassSet, Receipt, Record};

use crate::config::{ClassDurability, SpoolConfig};
use crate::metrics::{DropReason, Metrics};

use shared::{lock, ClassSlot, Msg, Shared, Submit, HOUSEKEEPING};

pub use recover::Recovered;
pub use sequence::SequenceLease;

/// Why the spool cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    /// The spool directory cannot be created or used.
    #[error("spool directory {path}: {source}; set spool.dir to a writable directory")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// Another weir process uses this spool directory.
    #[error("spool directory {path} is in use by another weir process; give each instance its own spool.dir")]
    Locked {
        /// The directory.
        path: PathBuf,
    },
    /// A thread could not be started.
    #[error("cannot start the spool's {0} thread: {1}")]
    Thread(&'static str, std::io::Error),
}

/// What to tell an operator whose spool filesystem, with `free` bytes
/// free, leaves the spool less than one segment above `min_free_bytes`:
/// spooled classes would block (acknowledgements withheld) from their
/// first records.
pub fn space_warning(config: &SpoolConfig, free: u64) -> Option<String> {
    let usable = free.saturating_sub(config.min_free_bytes);
    (usable < config.segment_bytes).then(|| {
        format!(
            "spool.dir {}: {free} bytes free on its filesystem, spool.min_free_bytes is {}: {usable} bytes usable, less than one segment (spool.segment_bytes {}); spooled classes will withhold acknowledgements until space frees (free space, lower min_free_bytes, or move spool.dir)",
            config.dir.display(),
            config.min_free_bytes,
            config.segment_bytes
        )
    })
}

/// [`space_warning`] for a configuration not yet started (`check-config`):
/// the free space of `spool.dir`, or of its nearest existing parent when
/// it does not exist yet.
pub fn check_space(config: &SpoolConfig) -> Option<String> {
    let at = config
        .dir
        .ancestors()
        .find(|d| !d.as_os_str().is_empty() && d.exists())
        .unwrap_or(std::path::Path::new("."));
    space_warning(config, files::free_bytes(at).ok()?)
}

/// Why a record was not appended.
#[derive(Debug)]
pub enum AppendError {
    /// Over the quota with `on_full = "block"` for the whole wait; the
    /// record is handed back.
    Full(Record),
    /// The spool is closing.
    Closed,
}

/// What became of an append.
#[derive(Debug)]
pub enum Appended {
    /// In the writer's hands; acknowledge once the ticket is durable.
    Pending(Ticket),
    /// Dropped by `on_full = "drop-newest"` (counted).
    Dropped,
}

/// A claim on one append: durable once the writer has synced it.
#[derive(Debug, Clone)]
pub struct Ticket {
    n: u64,
    shared: Arc<Shared>,
}

impl Ticket {
    /// Whether the record is on disk (as `spool.sync` defines it).
    pub fn is_durable(&self) -> bool {
        self.shared.durable.load(Ordering::Acquire) > self.n
    }

    /// Resolves once the record is on disk; `false` if the spool stopped
    /// first (the record must not be acknowledged).
    pub async fn durable(&self) -> bool {
        loop {
            let notified = self.shared.durable_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_durable() {
                return true;
            }
            if self.shared.writer_gone.load(Ordering::Acquire) {
                return self.is_durable();
            }
            notified.await;
        }
    }
}

/// The spool: its threads and the handle ingress and egress use.
#[derive(Debug)]
pub struct Spool {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Spool {
    /// Opens the spool under `config.dir` for the classes whose durability
    /// is `spool`: recovers what is on disk (see [`Recovered`]) and starts
    /// the writer and reader. Recovered records are loaded into `queues`
    /// by the reader, most urgent class first.
    pub fn open(
        config: &SpoolConfig,
        classes: &ClassSet,
        durability: &[ClassDurability],
        queues: Arc<MultiLevelQueue>,
        arrivals: Arc<crate::handoff::Arrivals>,
        metrics: Arc<Metrics>,
    ) -> Result<(Spool, Recovered), SpoolError> {
        let dir_error = |source| SpoolError::Dir {
            path: config.dir.clone(),
            source,
        };
        files::create_dir_durable(&config.dir).map_err(dir_error)?;
        let dir_lock = files::lock_dir(&config.dir).map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock => SpoolError::Locked {
                path: config.dir.clone(),
            },
            _ => dir_error(e),
        })?;
        let disk_free = files::free_bytes(&config.dir).map_err(dir_error)?;
        if let Some(warning) = space_warning(config, disk_free) {
            tracing::warn!("{warning}");
        }
        let mut slots = Vec::new();
        let mut recovered = Recovered {
            records: vec![0; classes.len()],
            ..Recovered::default()
        };
        for (id, class) in classes.iter() {
            let settings = durability[id.index()];
            if !settings.spooled() {
                slots.push(None);
                continue;
            }
            let dir = config.dir.join(&class.name);
            files::create_dir_durable(&dir).map_err(|source| SpoolError::Dir {
                path: dir.clone(),
                source,
            })?;
            let state = recover::class(
                id,
                &class.name,
                &dir,
                config,
                &settings,
                &metrics,
                &mut recovered,
            )
            .map_err(|source| SpoolError::Dir {
                path: dir.clone(),
                source,
            })?;
            metrics.spool.spooled(id);
            slots.push(Some(ClassSlot {
                id,
                name: class.name.clone(),
                dir,
                settings,
                state: Mutex::new(state),
            }));
        }
        files::release_free_memory();
        let total: u64 = slots
            .iter()
            .flatten()
            .map(|s| lock(&s.state).log.bytes())
            .sum();
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared {
            config: config.clone(),
            classes: slots,
            queues,
            arrivals,
            metrics,
            submit: Mutex::new(Submit { next: 0, tx }),
            durable: AtomicU64::new(0),
            durable_notify: Notify::new(),
            space: Notify::new(),
            total_bytes: AtomicU64::new(total),
            pending: AtomicU64::new(0),
            disk_free: AtomicU64::new(disk_free),
            reader_wake: (Mutex::new(true), Condvar::new()),
            stopping: AtomicBool::new(false),
            writer_gone: AtomicBool::new(false),
            _dir_lock: dir_lock,
        });
        for slot in shared.classes.iter().flatten() {
            shared.publish(slot, &lock(&slot.state));
        }
        let writer = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("weir-spool-writer".into())
                .spawn(move || writer::run(shared, rx))
                .map_err(|e| SpoolError::Thread("writer", e))?
        };
        let reader = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("weir-spool-reader".into())
                .spawn(move || reader::run(shared))
                .map_err(|e| SpoolError::Thread("reader", e))?
        };
        Ok((
            Spool {
                shared,
                threads: Mutex::new(vec![writer, reader]),
            },
            recovered,
        ))
    }

    /// Whether records of `class` go to the spool.
    pub fn spools(&self, class: ClassId) -> bool {
        self.shared.slot(class).is_some()
    }

    /// Appends `record` (of a spooled class). Over a quota, `on_full`
    /// decides: `block` waits for space up to `max_wait` (`None`: until
    /// the spool closes), `drop-newest` drops it, `drop-oldest` lets the
    /// writer delete the oldest segment.
    pub async fn append(
        &self,
        record: Record,
        max_wait: Option<Duration>,
    ) -> Result<Appended, AppendError> {
        let deadline = max_wait.map(|d| tokio::time::Instant::now() + d);
        let mut record = record;
        loop {
            let space = self.shared.space.notified();
            tokio::pin!(space);
            space.as_mut().enable();
            match self.try_append(record) {
                Err(AppendError::Full(back))
                    if deadline.is_none_or(|d| d > tokio::time::Instant::now()) =>
                {
                    record = back;
                    let sleep = async {
                        match deadline {
                            Some(d) => tokio::time::sleep_until(d).await,
                            None => std::future::pending().await,
                        }
                    };
                    // Cancel safety: every branch only waits; the record is
                    // held in this frame. Deletions wake `space`; a quota
                    // freed another way (free disk space returning) is
                    // noticed by the periodic re-check.
                    tokio::select! {
                        _ = &mut space => {}
                        _ = tokio::time::sleep(HOUSEKEEPING * 5) => {}
                        _ = sleep => {}
                    }
                    if self.shared.stopping.load(Ordering::Acquire) {
                        return Err(AppendError::Closed);
                    }
                }
                other => return other,
            }
        }
    }

    /// Appends without waiting; a `block` class over its quota hands the
    /// record back.
    pub fn try_append(&self, record: Record) -> Result<Appended, AppendError> {
        let shared = &self.shared;
        if shared.stopping.load(Ordering::Acquire) {
            return Err(AppendError::Closed);
        }
        let Some(slot) = shared.slot(record.class) else {
            return Err(AppendError::Closed);
        };
        let len = shared::frame_bound(&record);
        {
            let mut st = lock(&slot.state);
            let room = shared.room();
            let limit = st.log.limit(len, &room);
            let admit = st.log.admit_under(limit);
            let blocked = (admit == Admit::Block).then_some(limit).flatten();
            shared.set_blocked(slot, &mut st, blocked.map(|l| (l, len)));
            match admit {
                Admit::Append | Admit::EvictOldest => {}
                Admit::Block => return Err(AppendError::Full(record)),
                Admit::DropNewest => {
                    shared
                        .metrics
                        .spool
                        .dropped(record.class, DropReason::Full, 1);
                    tracing::debug!(class = %slot.name, "spool full: new record dropped (on_full = drop-newest)");
                    return Ok(Appended::Dropped);
                }
            }
            st.log.admitted(len);
        }
        shared.pending.fetch_add(len, Ordering::Relaxed);
        let mut submit = lock(&shared.submit);
        let n = submit.next;
        if submit.tx.send(Msg::Append { n, record, len }).is_err() {
            return Err(AppendError::Closed);
        }
        submit.next += 1;
        Ok(Appended::Pending(Ticket {
            n,
            shared: shared.clone(),
        }))
    }

    /// The egress confirmed these records, or a peer delivered them: their
    /// space may be reclaimed.
    pub fn release(&self, records: &[Receipt]) {
        let mut any = false;
        for r in records {
            let (Some(index), Some(slot)) = (r.spool, self.shared.slot(r.class)) else {
                continue;
            };
            let mut st = lock(&slot.state);
            if st.log.release(index) {
                st.checkpoint_dirty = true;
                any = true;
            }
        }
        if any {
            let _ = lock(&self.shared.submit).tx.send(Msg::Wake);
        }
    }

    /// The class queues have room again (the scheduler drained them):
    /// classes behind on disk are refilled.
    pub fn notify_space(&self) {
        if self
            .shared
            .classes
            .iter()
            .flatten()
            .any(|s| lock(&s.state).behind.is_some())
        {
            self.shared.wake_reader();
        }
    }

    /// Records of each spooled class on disk and not yet delivered, by
    /// class index (0 for classes held in memory).
    pub fn unreleased(&self) -> Vec<u64> {
        self.shared
            .classes
            .iter()
            .map(|s| s.as_ref().map_or(0, |s| lock(&s.state).log.unreleased()))
            .collect()
    }

    /// Bytes of each spooled class on disk that the reader has yet to
    /// load back into its queue, by class index (0 for a class that is not
    /// behind or is held in memory): the part of its backlog the class
    /// queue does not show.
    pub fn behind_bytes(&self) -> Vec<u64> {
        self.shared
            .classes
            .iter()
            .map(|s| {
                s.as_ref().map_or(0, |s| {
                    let st = lock(&s.state);
                    st.behind.map_or(0, |at| st.log.bytes_from(at))
                })
            })
            .collect()
    }

    /// Stops taking appends, writes and syncs what was taken, writes the
    /// checkpoints, and stops both threads. Records not yet delivered stay
    /// on disk for the next start.
    pub fn close(&self) {
        self.shared.stopping.store(true, Ordering::Release);
        let _ = lock(&self.shared.submit).tx.send(Msg::Stop);
        self.shared.wake_reader();
        self.shared.space.notify_waiters();
        let threads = std::mem::take(&mut *lock(&self.threads));
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        self.close();
    }
}
