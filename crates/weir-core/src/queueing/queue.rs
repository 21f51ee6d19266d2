//! Bounded lock-free multi-level queues: one queue per latency class
//! (JANUS Section IV, the Queue Manager's multi-level queues).
//!
//! Each [`ClassQueue`] is a crossbeam [`SegQueue`] (a lock-free
//! multi-producer multi-consumer queue of 31-slot blocks, allocated as
//! records arrive and freed as they leave) plus atomic record and byte
//! counts that bound it in both. An idle queue holds no slots: a
//! pre-allocated ring of 65,536 slots per class cost 19.5 MiB of an idle
//! edge box's memory before a single record arrived. A push that does not fit hands the
//! record back to the caller ([`PushError`]) so that ingress can apply
//! back-pressure (withhold the MQTT PUBACK, answer `RESOURCE_EXHAUSTED`)
//! instead of losing it: nothing in this module ever drops a record.
//!
//! **Kept records.** A record a peer redirected here has taken its one
//! peer hop: this node must send it itself, never pass it on (it could
//! otherwise bounce between providers, each hop spending a lease and
//! adding latency). Such records go in through [`ClassQueue::push_kept`]
//! into a second lock-free queue of the same class, under the same bounds;
//! [`ClassQueue::pop`] (the scheduler) takes kept records first, and
//! [`ClassQueue::pop_forwardable`] (the peer forwarder) never sees them.
//!
//! Arrival counters are monotonic; the scheduler differences them every
//! window to get the input rate `Lambda_c` of JANUS Algorithm 1 line 3.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crossbeam_queue::SegQueue;
use crossbeam_utils::CachePadded;

use crate::class::{ClassId, ClassSet};
use crate::record::Record;

/// How much one class queue may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueCapacity {
    /// Most records held at once.
    pub records: usize,
    /// Most bytes ([`Record::size`]) held at once.
    pub bytes: usize,
}

/// Why a push did not enqueue; the record is handed back, never dropped.
#[derive(Debug, PartialEq, Eq)]
pub enum PushError {
    /// The queue is full in records or bytes; retry after the scheduler has
    /// drained some (back-pressure).
    Full(Record),
    /// The record alone is larger than the queue's byte capacity: it can never
    /// fit, so retrying is pointless and the caller must refuse it.
    Oversized(Record),
}

impl PushError {
    /// The record that was not enqueued.
    pub fn into_record(self) -> Record {
        match self {
            PushError::Full(r) | PushError::Oversized(r) => r,
        }
    }
}

/// Point-in-time counters of one class queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Records waiting now.
    pub len: usize,
    /// Bytes waiting now.
    pub bytes: usize,
    /// Records ever accepted (monotonic).
    pub arrived_records: u64,
    /// Bytes ever accepted (monotonic).
    pub arrived_bytes: u64,
    /// Pushes handed back because the queue was full (monotonic).
    pub rejected_full: u64,
}

/// One bounded lock-free queue for one latency class.
pub struct ClassQueue {
    ring: SegQueue<Record>,
    /// Records this node must send itself (the module docs' kept records).
    kept: SegQueue<Record>,
    /// Bounds, changed only by a reload ([`ClassQueue::set_capacity`]).
    capacity_records: AtomicUsize,
    capacity_bytes: AtomicUsize,
    /// Records reserved or waiting (reserved before the push, so never
    /// below what the ring holds).
    len: CachePadded<AtomicUsize>,
    // Padded: producers hammer `bytes` and the arrival counters, the consumer
    // hammers `bytes` too; keep them off the ring's cache lines.
    bytes: CachePadded<AtomicUsize>,
    arrived_records: CachePadded<AtomicU64>,
    arrived_bytes: AtomicU64,
    rejected_full: AtomicU64,
}

impl ClassQueue {
    /// A queue bounded by `capacity` (both limits must be at least 1).
    pub fn new(capacity: QueueCapacity) -> Self {
        ClassQueue {
            ring: SegQueue::new(),
            kept: SegQueue::new(),
            capacity_records: AtomicUsize::new(capacity.records.max(1)),
            capacity_bytes: AtomicUsize::new(capacity.bytes.max(1)),
            len: CachePadded::new(AtomicUsize::new(0)),
            bytes: CachePadded::new(AtomicUsize::new(0)),
            arrived_records: CachePadded::new(AtomicU64::new(0)),
            arrived_bytes: AtomicU64::new(0),
            rejected_full: AtomicU64::new(0),
        }
    }

    /// Enqueues `record`, or hands it back if it does not fit.
    ///
    /// Lock-free: bytes are reserved with a compare-and-swap loop first,
    /// then a record slot; if no slot is left both reservations are
    /// returned.
    #[inline]
    pub fn push(&self, record: Record) -> Result<(), PushError> {
        self.push_into(&self.ring, record)
    }

    /// Enqueues a record this node must send itself (one a peer redirected
    /// here): under the same bounds as [`ClassQueue::push`], popped by
    /// [`ClassQueue::pop`] before the others, never by
    /// [`ClassQueue::pop_forwardable`].
    pub fn push_kept(&self, record: Record) -> Result<(), PushError> {
        self.push_into(&self.kept, record)
    }

    fn push_into(&self, ring: &SegQueue<Record>, record: Record) -> Result<(), PushError> {
        let size = record.size();
        let capacity_bytes = self.capacity_bytes.load(Ordering::Relaxed);
        if size > capacity_bytes {
            return Err(PushError::Oversized(record));
        }
        let mut current = self.bytes.load(Ordering::Relaxed);
        loop {
            if current + size > capacity_bytes {
                self.rejected_full.fetch_add(1, Ordering::Relaxed);
                return Err(PushError::Full(record));
            }
            match self.bytes.compare_exchange_weak(
                current,
                current + size,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(seen) => current = seen,
            }
        }
        if self.len.fetch_add(1, Ordering::AcqRel) >= self.capacity_records.load(Ordering::Relaxed)
        {
            self.len.fetch_sub(1, Ordering::AcqRel);
            self.bytes.fetch_sub(size, Ordering::AcqRel);
            self.rejected_full.fetch_add(1, Ordering::Relaxed);
            return Err(PushError::Full(record));
        }
        ring.push(record);
        self.arrived_records.fetch_add(1, Ordering::Relaxed);
        self.arrived_bytes.fetch_add(size as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Changes the bounds (a config reload). Records already queued stay,
    /// even above a lowered bound; new ones wait until the queue is below
    /// it.
    pub fn set_capacity(&self, capacity: QueueCapacity) {
        self.capacity_records
            .store(capacity.records.max(1), Ordering::Relaxed);
        self.capacity_bytes
            .store(capacity.bytes.max(1), Ordering::Relaxed);
    }

    /// Dequeues the oldest kept record, else the oldest other one.
    #[inline]
    pub fn pop(&self) -> Option<Record> {
        let record = self.kept.pop().or_else(|| self.ring.pop())?;
        Some(self.popped(record))
    }

    /// Dequeues the oldest record this node may pass to a peer (not a kept
    /// one), if any.
    pub fn pop_forwardable(&self) -> Option<Record> {
        let record = self.ring.pop()?;
        Some(self.popped(record))
    }

    #[inline]
    fn popped(&self, record: Record) -> Record {
        self.bytes.fetch_sub(record.size(), Ordering::AcqRel);
        self.len.fetch_sub(1, Ordering::AcqRel);
        record
    }

    /// Records waiting now.
    pub fn len(&self) -> usize {
        // A push in progress has its slot reserved but may not be in the
        // ring yet: count what the rings hold, bounded by the reservations.
        (self.ring.len() + self.kept.len()).min(self.len.load(Ordering::Acquire))
    }

    /// True when no record waits.
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty() && self.kept.is_empty()
    }

    /// Bytes waiting now.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Acquire)
    }

    /// The limits this queue was built with.
    pub fn capacity(&self) -> QueueCapacity {
        QueueCapacity {
            records: self.capacity_records.load(Ordering::Relaxed),
            bytes: self.capacity_bytes.load(Ordering::Relaxed),
        }
    }

    /// Current counters.
    pub fn stats(&self) -> QueueStats {
        QueueStats {
            len: self.len(),
            bytes: self.bytes(),
            arrived_records: self.arrived_records.load(Ordering::Relaxed),
            arrived_bytes: self.arrived_bytes.load(Ordering::Relaxed),
            rejected_full: self.rejected_full.load(Ordering::Relaxed),
        }
    }
}

impl std::fmt::Debug for ClassQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClassQueue")
            .field("capacity", &self.capacity())
            .field("stats", &self.stats())
            .finish()
    }
}

/// One [`ClassQueue`] per latency class, most urgent first.
///
/// The Native scheme of JANUS Section VII (no queue management) is
/// [`MultiLevelQueue::fifo`]: one queue for every class, records keep their
/// class for reporting.
#[derive(Debug)]
pub struct MultiLevelQueue {
    queues: Vec<ClassQueue>,
    fifo: bool,
}

impl MultiLevelQueue {
    /// One queue per capacity, in class priority order.
    pub fn new(capacities: &[QueueCapacity]) -> Self {
        MultiLevelQueue {
            queues: capacities.iter().map(|c| ClassQueue::new(*c)).collect(),
            fifo: false,
        }
    }

    /// A single FIFO that takes records of every class (the Native scheme).
    pub fn fifo(capacity: QueueCapacity) -> Self {
        MultiLevelQueue {
            queues: vec![ClassQueue::new(capacity)],
            fifo: true,
        }
    }

    /// The index of the queue that holds records of `class`.
    #[inline]
    fn slot(&self, class: ClassId) -> usize {
        if self.fifo {
            0
        } else {
            class.index()
        }
    }

    /// Changes each queue's bounds, in the order [`MultiLevelQueue::new`]
    /// took them (one for [`MultiLevelQueue::fifo`]); extra entries are
    /// ignored.
    pub fn set_capacities(&self, capacities: &[QueueCapacity]) {
        for (q, c) in self.queues.iter().zip(capacities) {
            q.set_capacity(*c);
        }
    }

    /// The same capacity for every class of `classes`.
    pub fn uniform(classes: &ClassSet, capacity: QueueCapacity) -> Self {
        MultiLevelQueue::new(&vec![capacity; classes.len()])
    }

    /// Enqueues into the record's class queue.
    ///
    /// # Panics
    /// If the record's class is not one of this queue's classes: classes come
    /// from the classifier built from the same config, so this is a bug.
    #[inline]
    pub fn push(&self, record: Record) -> Result<(), PushError> {
        self.queues[self.slot(record.class)].push(record)
    }

    /// Enqueues a record this node must send itself into its class queue
    /// ([`ClassQueue::push_kept`]).
    ///
    /// # Panics
    /// As [`MultiLevelQueue::push`].
    pub fn push_kept(&self, record: Record) -> Result<(), PushError> {
        self.queues[self.slot(record.class)].push_kept(record)
    }

    /// The queue that holds records of `class`.
    #[inline]
    pub fn class(&self, class: ClassId) -> &ClassQueue {
        &self.queues[self.slot(class)]
    }

    /// Dequeues from the most urgent non-empty class.
    pub fn pop_strict_priority(&self) -> Option<Record> {
        self.queues.iter().find_map(ClassQueue::pop)
    }

    /// Number of queues (1 for a FIFO).
    pub fn classes(&self) -> usize {
        self.queues.len()
    }

    /// All queues, most urgent first.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (ClassId, &ClassQueue)> {
        self.queues
            .iter()
            .enumerate()
            .map(|(i, q)| (ClassId(i as u8), q))
    }

    /// Records waiting in all classes.
    pub fn total_len(&self) -> usize {
        self.queues.iter().map(ClassQueue::len).sum()
    }

    /// True when no class has a record waiting.
    pub fn is_empty_all(&self) -> bool {
        self.queues.iter().all(ClassQueue::is_empty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use proptest::prelude::*;
    use std::collections::HashSet;
    use std::sync::Arc;

    fn rec(class: u8, origin: u64, seq: u64, len: usize) -> Record {
        Record {
            key: Bytes::from_static(b"t"),
            class: ClassId(class),
            origin,
            seq,
            ingress_us: 0,
            payload: Bytes::from(vec![0u8; len]),
            spool: None,
        }
    }

    #[test]
    fn full_in_records_hands_the_record_back() {
        let q = ClassQueue::new(QueueCapacity {
            records: 2,
            bytes: 1 << 20,
        });
        q.push(rec(0, 1, 1, 10)).unwrap();
        q.push(rec(0, 1, 2, 10)).unwrap();
        let back = q.push(rec(0, 1, 3, 10)).unwrap_err();
        assert!(matches!(back, PushError::Full(ref r) if r.seq == 3));
        assert_eq!(q.stats().rejected_full, 1);
        assert_eq!(q.pop().unwrap().seq, 1);
        q.push(back.into_record()).unwrap();
        assert_eq!(q.len(), 2);
    }

    #[test]
    fn a_new_capacity_keeps_what_is_queued_and_bounds_what_comes() {
        let q = MultiLevelQueue::new(&[QueueCapacity {
            records: 4,
            bytes: 1 << 20,
        }]);
        for seq in 0..4 {
            q.push(rec(0, 1, seq, 10)).unwrap();
        }
        assert!(q.push(rec(0, 1, 4, 10)).is_err(), "full at 4");
        q.set_capacities(&[QueueCapacity {
            records: 2,
            bytes: 1 << 20,
        }]);
        assert_eq!(q.class(ClassId(0)).len(), 4, "nothing dropped");
        q.class(ClassId(0)).pop().unwrap();
        q.class(ClassId(0)).pop().unwrap();
        assert!(q.push(rec(0, 1, 5, 10)).is_err(), "still at the new bound");
        q.set_capacities(&[QueueCapacity {
            records: 8,
            bytes: 1 << 20,
        }]);
        for seq in 6..12 {
            q.push(rec(0, 1, seq, 10)).unwrap();
        }
        assert_eq!(q.class(ClassId(0)).capacity().records, 8);
    }

    #[test]
    fn full_in_bytes_hands_the_record_back_and_accounts_bytes() {
        let one = rec(0, 1, 1, 100).size();
        let q = ClassQueue::new(QueueCapacity {
            records: 100,
            bytes: one * 2,
        });
        q.push(rec(0, 1, 1, 100)).unwrap();
        q.push(rec(0, 1, 2, 100)).unwrap();
        assert_eq!(q.bytes(), one * 2);
        assert!(matches!(q.push(rec(0, 1, 3, 100)), Err(PushError::Full(_))));
        q.pop().unwrap();
        assert_eq!(q.bytes(), one);
        q.push(rec(0, 1, 3, 100)).unwrap();
    }

    #[test]
    fn oversized_is_distinguished_from_full() {
        let q = ClassQueue::new(QueueCapacity {
            records: 10,
            bytes: 64,
        });
        assert!(matches!(
            q.push(rec(0, 1, 1, 1000)),
            Err(PushError::Oversized(_))
        ));
        assert!(q.is_empty());
        assert_eq!(q.stats().rejected_full, 0);
    }

    #[test]
    fn strict_priority_pops_the_most_urgent_class_first() {
        let cap = QueueCapacity {
            records: 8,
            bytes: 1 << 16,
        };
        let m = MultiLevelQueue::new(&[cap, cap, cap]);
        m.push(rec(2, 1, 1, 1)).unwrap();
        m.push(rec(1, 1, 2, 1)).unwrap();
        m.push(rec(0, 1, 3, 1)).unwrap();
        m.push(rec(2, 1, 4, 1)).unwrap();
        let order: Vec<u64> = std::iter::from_fn(|| m.pop_strict_priority())
            .map(|r| r.seq)
            .collect();
        assert_eq!(order, vec![3, 2, 1, 4]);
        assert_eq!(m.class(ClassId(2)).stats().arrived_records, 2);
    }

    #[test]
    fn fifo_keeps_arrival_order_across_classes() {
        let m = MultiLevelQueue::fifo(QueueCapacity {
            records: 8,
            bytes: 1 << 16,
        });
        m.push(rec(2, 1, 1, 1)).unwrap();
        m.push(rec(0, 1, 2, 1)).unwrap();
        assert_eq!(m.classes(), 1);
        assert_eq!(m.pop_strict_priority().unwrap().class, ClassId(2));
        assert_eq!(m.pop_strict_priority().unwrap().class, ClassId(0));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Concurrent producers and a concurrent consumer: every accepted
        /// record comes out exactly once, every refused one is handed back,
        /// and per-producer FIFO order holds.
        #[test]
        fn no_record_lost_or_duplicated_under_concurrency(
            producers in 1usize..5,
            per_producer in 1usize..400,
            cap_records in 1usize..64,
            cap_bytes_records in 1usize..64,
            payload in 0usize..64,
        ) {
            let size = rec(0, 0, 0, payload).size();
            let q = Arc::new(ClassQueue::new(QueueCapacity {
                records: cap_records,
                bytes: size * cap_bytes_records,
            }));
            let total = producers * per_producer;
            let consumer = {
                let q = Arc::clone(&q);
                std::thread::spawn(move || {
                    let mut got = Vec::with_capacity(total);
                    while got.len() < total {
                        match q.pop() {
                            Some(r) => got.push((r.origin, r.seq)),
                            None => std::thread::yield_now(),
                        }
                    }
                    got
                })
            };
            let handles: Vec<_> = (0..producers)
                .map(|p| {
                    let q = Arc::clone(&q);
                    std::thread::spawn(move || {
                        let mut handed_back = 0u64;
                        for s in 0..per_producer {
                            let mut r = rec(0, p as u64, s as u64, payload);
                            // Back-pressure: retry the very record handed back.
                            loop {
                                match q.push(r) {
                                    Ok(()) => break,
                                    Err(PushError::Full(back)) => {
                                        handed_back += 1;
                                        r = back;
                                        std::thread::yield_now();
                                    }
                                    Err(PushError::Oversized(_)) => unreachable!(),
                                }
                            }
                        }
                        handed_back
                    })
                })
                .collect();
            let handed_back: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
            let got = consumer.join().unwrap();
            let unique: HashSet<_> = got.iter().copied().collect();
            prop_assert_eq!(unique.len(), total);
            prop_assert_eq!(got.len(), total);
            for p in 0..producers as u64 {
                let seqs: Vec<u64> = got.iter().filter(|(o, _)| *o == p).map(|(_, s)| *s).collect();
                prop_assert!(seqs.windows(2).all(|w| w[0] < w[1]), "FIFO per producer");
            }
            prop_assert!(q.is_empty());
            prop_assert_eq!(q.bytes(), 0);
            prop_assert_eq!(q.stats().arrived_records, total as u64);
            prop_assert_eq!(q.stats().rejected_full, handed_back);
        }
    }

    #[test]
    fn kept_records_go_first_to_the_scheduler_and_never_to_the_forwarder() {
        let q = ClassQueue::new(QueueCapacity {
            records: 3,
            bytes: 1 << 20,
        });
        q.push(rec(0, 1, 1, 10)).unwrap();
        q.push_kept(rec(0, 2, 7, 10)).unwrap();
        q.push(rec(0, 1, 2, 10)).unwrap();
        // One bound for both: the fourth does not fit, kept or not.
        assert!(matches!(
            q.push_kept(rec(0, 2, 8, 10)),
            Err(PushError::Full(_))
        ));
        assert_eq!(q.len(), 3);
        assert_eq!(q.bytes(), 3 * (10 + 1 + crate::record::RECORD_OVERHEAD));
        // The forwarder sees only this node's own records.
        assert_eq!(q.pop_forwardable().map(|r| r.seq), Some(1));
        assert_eq!(q.pop_forwardable().map(|r| r.seq), Some(2));
        assert_eq!(q.pop_forwardable(), None);
        assert!(!q.is_empty());
        assert_eq!(q.len(), 1);
        q.push(rec(0, 1, 3, 10)).unwrap();
        // The scheduler takes the kept record first.
        assert_eq!(q.pop().map(|r| (r.origin, r.seq)), Some((2, 7)));
        assert_eq!(q.pop().map(|r| (r.origin, r.seq)), Some((1, 3)));
        assert!(q.is_empty());
        assert_eq!((q.len(), q.bytes()), (0, 0));
        assert_eq!(q.stats().arrived_records, 4);
    }
}
