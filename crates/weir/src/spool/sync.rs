//! The spool's sync thread: with `sync = "group"` it syncs the segments
//! a group was written to while the writer encodes the next group, and
//! completes the group (class ends, queues, acknowledgements) as soon as
//! its syncs succeeded. A group whose sync failed goes back to the writer,
//! which mends it (`writer.rs`) before completing it.

use std::fs::File;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;

use weir_core::queueing::queue::PushError;
use weir_core::{ClassId, Record};

use super::shared::{lock, Cursor, Shared};

/// The writer lets go of a class's lock at least every this many records.
pub(super) const LOCK_BATCH: usize = 256;

/// One class's share of a group.
pub(super) struct Part {
    pub(super) c: usize,
    /// Each record with its index and where its frame is (kept until
    /// acknowledged: after a failed sync they are appended again).
    pub(super) out: Vec<(Record, Cursor)>,
    /// Where the part ends in the class's log.
    pub(super) end: Cursor,
}

/// A group encoded (and, once dispatched, written and being synced).
pub(super) struct Group {
    /// Its last ticket.
    pub(super) last: u64,
    pub(super) parts: Vec<Part>,
    /// Some records were given up at shutdown: none is acknowledged.
    pub(super) failed: bool,
}

/// A segment for the sync thread to sync, as far as it was written.
pub(super) struct SyncJob {
    pub(super) c: usize,
    pub(super) segment: u64,
    pub(super) upto: u64,
    pub(super) file: Arc<File>,
}

/// A group's syncs as the sync thread ran them; the group comes back to
/// the writer only if one failed (else the sync thread completed it).
pub(super) struct Synced {
    pub(super) results: Vec<(SyncJob, io::Result<()>)>,
    pub(super) failed: Option<Group>,
}

/// The sync thread and its two channels.
pub(super) struct Syncer {
    pub(super) jobs: mpsc::Sender<(Vec<SyncJob>, Group)>,
    pub(super) done: Receiver<Synced>,
    pub(super) thread: std::thread::JoinHandle<()>,
}

impl Syncer {
    /// Starts the thread: it syncs each group's segments and, if every
    /// sync succeeded, completes the group at once (the writer may be
    /// encoding the next one).
    pub(super) fn start(shared: Arc<Shared>) -> io::Result<Syncer> {
        let (jobs, job_rx) = mpsc::channel::<(Vec<SyncJob>, Group)>();
        let (done_tx, done) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("weir-spool-sync".into())
            .spawn(move || {
                for (jobs, group) in job_rx {
                    let results: Vec<_> = jobs
                        .into_iter()
                        .map(|j| {
                            let r = j.file.sync_data();
                            (j, r)
                        })
                        .collect();
                    let failed = if results.iter().all(|(_, r)| r.is_ok()) {
                        complete(&shared, group);
                        None
                    } else {
                        Some(group)
                    };
                    if done_tx.send(Synced { results, failed }).is_err() {
                        break;
                    }
                }
            })?;
        Ok(Syncer { jobs, done, thread })
    }
}

/// Completes a group on disk: the class ends move, the records go to
/// their queues, the tickets are acknowledged.
pub(super) fn complete(shared: &Shared, g: Group) {
    // The durable end first, so that a class that falls behind here is
    // read back from the right place.
    for part in &g.parts {
        let slot = shared.classes[part.c]
            .as_ref()
            .expect("touched classes are spooled");
        lock(&slot.state).durable_end = Some(part.end);
    }
    let mut pushed = false;
    let mut fell_behind = false;
    let mut counts = vec![0u64; shared.classes.len()];
    for part in g.parts {
        let slot = shared.classes[part.c].as_ref().expect("spooled");
        counts[part.c] += part.out.len() as u64;
        shared.metrics.accepted_n(slot.id, part.out.len() as u64);
        let mut records = part.out.into_iter();
        // The class's lock is taken per batch: the reader takes it to
        // catch up, ingress to admit.
        loop {
            let mut st = lock(&slot.state);
            let mut held = 0;
            for (record, cursor) in records.by_ref() {
                if st.behind.is_some() {
                    continue;
                }
                match shared.queues.push(record) {
                    Ok(()) => pushed = true,
                    Err(PushError::Full(_)) | Err(PushError::Oversized(_)) => {
                        st.behind = Some(cursor);
                        fell_behind = true;
                    }
                }
                held += 1;
                if held == LOCK_BATCH {
                    break;
                }
            }
            if records.len() == 0 {
                break;
            }
        }
    }
    for (c, n) in counts.iter().enumerate() {
        if *n > 0 {
            let slot = shared.classes[c].as_ref().expect("spooled");
            shared.metrics.spool.appended(slot.id, *n);
            shared.publish(slot, &lock(&slot.state));
        }
    }
    if pushed {
        for (c, n) in counts.iter().enumerate() {
            if *n > 0 {
                shared.arrivals.ring(ClassId(c as u8));
            }
        }
    }
    if fell_behind {
        shared.wake_reader();
    }
    // A group that failed at shutdown is never acknowledged (some of it
    // may be on disk, and is replayed: a duplicate, never a loss).
    if !g.failed {
        shared.durable.fetch_max(g.last + 1, Ordering::AcqRel);
        shared.durable_notify.notify_waiters();
    }
}
