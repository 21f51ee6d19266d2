//! What the spool's parts share: each class's state under its lock, the
//! writer's channel, the ticket counter, and the tuning constants. The
//! threads (`writer.rs`, `reader.rs`), start-up (`recover.rs`) and the
//! handle (`mod.rs`) all use it; it uses none of them.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use weir_core::queueing::queue::MultiLevelQueue;
use weir_core::spool::{ClassLog, Limit, SpoolRoom};
use weir_core::{ClassId, Record};

use crate::config::{ClassDurability, SpoolConfig};
use crate::metrics::Metrics;

/// Most bytes admitted to the writer and not yet written: appends beyond
/// wait, so a burst cannot grow the writer's channel without bound. Two
/// full groups of 1 KiB records: enough to keep the disk busy, small
/// enough for the memory bound (docs/durability.md).
pub(super) const MAX_PENDING_BYTES: u64 = 16 << 20;
/// Most appends the writer takes into one group: bounds the time before
/// the first of them is acknowledged.
pub(super) const MAX_GROUP_RECORDS: usize = 8192;
/// How often the writer looks after deletions, checkpoints and free space
/// when no append wakes it.
pub(super) const HOUSEKEEPING: Duration = Duration::from_millis(100);
/// Checkpoints are rewritten at most this often: a crash replays at most
/// this much delivered traffic again.
pub(super) const CHECKPOINT_EVERY: Duration = Duration::from_millis(20);
/// Checkpoints are made durable (file and directory synced, with the
/// segment deletions before them) at most this often: after a power cut,
/// at most this much delivered traffic is sent again. A checkpoint lost
/// to a power cut costs duplicates, never a record.
pub(super) const CHECKPOINT_SYNC_EVERY: Duration = Duration::from_secs(1);

/// The most bytes a record's frame takes: what an append is admitted
/// with.
pub(super) fn frame_bound(record: &Record) -> u64 {
    weir_core::spool::frame::max_frame_len(record.key.len(), record.payload.len()) as u64
}

/// A position in a class's log: a segment and a byte offset in it.
pub(super) use weir_core::spool::LogPosition as Cursor;

/// One spooled class's state, shared by ingress, writer, reader and
/// egress under its mutex.
#[derive(Debug)]
pub(super) struct ClassState {
    pub(super) log: ClassLog,
    /// `Some`: the class queue was full when a record became durable; the
    /// reader loads records from here on. `None`: new durable records go
    /// straight to the queue.
    pub(super) behind: Option<Cursor>,
    /// End of the durable data (the writer's last synced position).
    pub(super) durable_end: Option<Cursor>,
    /// The release state changed since the last checkpoint.
    pub(super) checkpoint_dirty: bool,
    /// `Some` while appends of this class are refused by a limit.
    pub(super) blocked: Option<Blocked>,
}

/// A class whose appends a limit refuses: what an operator is told.
#[derive(Debug, Clone, Copy)]
pub(super) struct Blocked {
    pub(super) limit: Limit,
    /// The frame refused last (what must fit for the class to go on).
    pub(super) wanted: u64,
    pub(super) since: Instant,
    pub(super) logged: Instant,
}

/// While a class stays blocked, a reminder is logged this often.
pub(super) const BLOCKED_LOG_EVERY: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub(super) struct ClassSlot {
    pub(super) id: ClassId,
    pub(super) name: String,
    pub(super) dir: PathBuf,
    pub(super) settings: ClassDurability,
    pub(super) state: Mutex<ClassState>,
}

/// A message to the writer.
pub(super) enum Msg {
    Append {
        n: u64,
        record: Record,
        len: u64,
    },
    /// Releases happened: deletions and checkpoints may be due.
    Wake,
    Stop,
}

pub(super) struct Submit {
    pub(super) next: u64,
    pub(super) tx: mpsc::Sender<Msg>,
}

/// What every part of the spool shares.
pub(super) struct Shared {
    pub(super) config: SpoolConfig,
    pub(super) classes: Vec<Option<ClassSlot>>,
    pub(super) queues: Arc<MultiLevelQueue>,
    pub(super) arrivals: Arc<crate::handoff::Arrivals>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) submit: Mutex<Submit>,
    /// Tickets below this are durable.
    pub(super) durable: AtomicU64,
    pub(super) durable_notify: Notify,
    /// Woken when segments are deleted (appends blocked on a quota wait).
    pub(super) space: Notify,
    /// Bytes of all logs on disk.
    pub(super) total_bytes: AtomicU64,
    /// Bytes admitted and not yet written, all classes.
    pub(super) pending: AtomicU64,
    /// Free bytes on the spool's filesystem, as last measured.
    pub(super) disk_free: AtomicU64,
    pub(super) reader_wake: (Mutex<bool>, Condvar),
    pub(super) stopping: AtomicBool,
    pub(super) writer_gone: AtomicBool,
    /// Held for the spool's life: one weir per directory.
    pub(super) _dir_lock: std::fs::File,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("dir", &self.config.dir)
            .finish_non_exhaustive()
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic in another thread holding the lock leaves the bookkeeping as
    // it was between two whole operations; go on with it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    pub(super) fn slot(&self, class: ClassId) -> Option<&ClassSlot> {
        self.classes.get(class.index()).and_then(Option::as_ref)
    }

    pub(super) fn room(&self) -> SpoolRoom {
        SpoolRoom {
            total_bytes: self.total_bytes.load(Ordering::Relaxed)
                + self.pending.load(Ordering::Relaxed),
            total_max: self.config.max_bytes,
            disk_free: self.disk_free.load(Ordering::Relaxed),
            disk_reserve: self.config.min_free_bytes,
            pending_bytes: self.pending.load(Ordering::Relaxed),
            pending_max: MAX_PENDING_BYTES,
        }
    }

    /// Records whether `slot`'s appends are refused, and by which limit:
    /// the gauge follows, and an operator reads why in the log (when it
    /// starts, every [`BLOCKED_LOG_EVERY`] while it lasts, and when it
    /// ends). The writer's own backlog passes by itself and is only shown
    /// in the gauge.
    pub(super) fn set_blocked(
        &self,
        slot: &ClassSlot,
        st: &mut ClassState,
        now: Option<(Limit, u64)>,
    ) {
        if st.blocked.is_none() && now.is_none() {
            // The append path's usual case: nothing to record.
            return;
        }
        let at = Instant::now();
        match (st.blocked.as_mut(), now) {
            (None, None) => {}
            (Some(b), Some((limit, wanted))) if b.limit == limit => {
                b.wanted = wanted;
                if at.duration_since(b.logged) >= BLOCKED_LOG_EVERY {
                    b.logged = at;
                    self.log_blocked(slot, st, true);
                }
            }
            (before, now) => {
                let since = before.as_ref().map_or(at, |b| b.since);
                if let Some(b) = before {
                    self.metrics.spool.blocked(slot.id, b.limit, false);
                }
                match now {
                    Some((limit, wanted)) => {
                        st.blocked = Some(Blocked {
                            limit,
                            wanted,
                            since,
                            logged: at,
                        });
                        self.metrics.spool.blocked(slot.id, limit, true);
                        self.log_blocked(slot, st, false);
                    }
                    None => {
                        let was = st.blocked.take().expect("blocked before");
                        if was.limit != Limit::WriterBacklog {
                            tracing::info!(
                                class = %slot.name,
                                blocked_for_s = format!("{:.1}", at.duration_since(was.since).as_secs_f64()),
                                "spool accepts this class's records again"
                            );
                        }
                    }
                }
            }
        }
    }

    fn log_blocked(&self, slot: &ClassSlot, st: &ClassState, still: bool) {
        let Some(b) = st.blocked else { return };
        let room = self.room();
        let for_s = format!("{:.1}", b.since.elapsed().as_secs_f64());
        let what = if still {
            "spool still full for this class: acknowledgements wait"
        } else {
            "spool full for this class: acknowledgements wait until space returns"
        };
        match b.limit {
            Limit::WriterBacklog => {}
            Limit::ClassQuota => tracing::warn!(
                class = %slot.name,
                reason = b.limit.as_str(),
                spool_bytes = st.log.bytes(),
                spool_max_bytes = slot.settings.max_bytes,
                blocked_for_s = for_s,
                "{what} (the class's quota is reached; space returns as records are delivered)"
            ),
            Limit::SpoolQuota => tracing::warn!(
                class = %slot.name,
                reason = b.limit.as_str(),
                spool_bytes = room.total_bytes,
                max_bytes = room.total_max,
                blocked_for_s = for_s,
                "{what} (spool.max_bytes is reached; space returns as records are delivered)"
            ),
            Limit::DiskReserve => tracing::warn!(
                class = %slot.name,
                reason = b.limit.as_str(),
                dir = %self.config.dir.display(),
                free_bytes = room.disk_free,
                min_free_bytes = room.disk_reserve,
                class_spool_bytes = st.log.bytes(),
                blocked_for_s = for_s,
                "{what} (the filesystem's free space is down to spool.min_free_bytes; space returns as records are delivered or other files are removed)"
            ),
        }
    }

    pub(super) fn wake_reader(&self) {
        let (flag, cv) = &self.reader_wake;
        *lock(flag) = true;
        cv.notify_one();
    }

    pub(super) fn publish(&self, slot: &ClassSlot, st: &ClassState) {
        self.metrics
            .spool
            .set_log(slot.id, st.log.bytes(), st.log.unreleased());
    }
}
