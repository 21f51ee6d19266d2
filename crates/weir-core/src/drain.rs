//! Draining the class queues into batches, in priority order, within each
//! class's token bucket (JANUS Section IV: the queue manager forwards each
//! queue at its allocated rate `V_c`).
//!
//! [`Drainer::next_batch`] looks at the classes most urgent first and returns
//! a batch from the first class that may send; when none may it says how
//! long until one will. A record popped but not yet sent is held per class
//! (the *head*) and goes out first next time, so order within a class is
//! kept and nothing is dropped.
//!
//! **Priority borrowing.** A class whose own bucket is empty may take tokens
//! from the buckets of *less* urgent classes (least urgent first), never the
//! other way round. JANUS's BWAllocator gives the top class "all possibly
//! available bandwidth" by priority (Algorithm 2), but only once per window
//! and only as much as Eq. 22 says it needs to meet its bound *just in
//! time*; between windows a sporadic urgent record would wait for its own
//! trickle of tokens although the link is busy with tolerant traffic.
//! Borrowing keeps the strict priority of the paper at record granularity:
//! the sum of all sends still never exceeds the sum of the allocated rates
//! (so `C_out` holds), and a lower class keeps whatever the urgent classes
//! do not use.
//!
//! **Adaptive batching.** With per-class [`BatchPlan`]s (buffer-aided
//! relaying, see [`crate::batching`]) a class whose queued records do not
//! yet fill its planned batch waits, until the batch fills or its oldest
//! record has waited the plan's `max_wait`; meanwhile less urgent classes may
//! use the link. The plan only decides *when* a batch closes: once it does,
//! everything queued goes, up to the batch caps, so a backlog never drains
//! one record per transaction.

use std::time::Duration;

use crate::batching::BatchPlan;
use crate::class::ClassId;
use crate::queue::MultiLevelQueue;
use crate::record::Record;
use crate::token_bucket::{ClassBuckets, Take};

/// Largest batch the drainer builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    /// Most records in one batch.
    pub max_records: usize,
    /// Most bytes ([`Record::size`]) in one batch; a single larger record
    /// still goes out alone.
    pub max_bytes: usize,
}

/// What [`Drainer::next_batch`] found.
#[derive(Debug, PartialEq)]
pub enum Drain {
    /// Send these records (all of one class, oldest first) now.
    Batch {
        /// Their class.
        class: ClassId,
        /// The records.
        records: Vec<Record>,
    },
    /// Records wait but no bucket conforms; call again after this long.
    Wait(Duration),
    /// Nothing waits anywhere.
    Empty,
}

/// Per-class token buckets plus the per-class held heads.
#[derive(Debug)]
pub struct Drainer {
    buckets: ClassBuckets,
    heads: Vec<Option<Record>>,
    limits: BatchLimits,
}

impl Drainer {
    /// A drainer over `rates.len()` classes with these initial byte rates.
    pub fn new(rates: &[f64], burst_bytes: f64, limits: BatchLimits, now: Duration) -> Self {
        Drainer {
            buckets: ClassBuckets::new(rates, burst_bytes, now),
            heads: vec![None; rates.len()],
            limits,
        }
    }

    /// Installs new per-class rates (from BWAllocator), never above
    /// `capacity` in sum.
    pub fn set_rates(&mut self, now: Duration, rates: &[f64], capacity: f64) {
        self.buckets.apply(now, rates, capacity);
    }

    /// Current per-class byte rates.
    pub fn rates(&self) -> Vec<f64> {
        self.buckets.rates()
    }

    /// Changes the batch limits (adaptive batching resizes them).
    pub fn set_limits(&mut self, limits: BatchLimits) {
        self.limits = limits;
    }

    /// Bytes of the record held for `class`, if any: it has left the queue
    /// but not the node, so it counts as backlog.
    pub fn held_bytes(&self, class: ClassId) -> usize {
        self.heads[class.index()].as_ref().map_or(0, Record::size)
    }

    /// Takes tokens for one record of class `c`: from its own bucket, else
    /// borrowed from a less urgent class's bucket (least urgent first).
    fn take(&mut self, c: usize, now: Duration, size: usize) -> Take {
        let own = self.buckets.get_mut(c).try_take(now, size, 1);
        if own == Take::Granted {
            return own;
        }
        let mut wait = match own {
            Take::Wait(d) => d,
            Take::Granted => unreachable!("returned above"),
        };
        for lower in (c + 1..self.heads.len()).rev() {
            match self.buckets.get_mut(lower).try_take(now, size, 1) {
                Take::Granted => return Take::Granted,
                Take::Wait(d) => wait = wait.min(d),
            }
        }
        Take::Wait(wait)
    }

    /// The next batch to send at `now`, most urgent class that may send
    /// first. `plans` (one per queue, or `None` to send whatever is queued)
    /// say when a partial batch closes; ages are measured from each record's
    /// `ingress_us` against `wall_us` (microseconds since the Unix epoch).
    pub fn next_batch(
        &mut self,
        now: Duration,
        wall_us: u64,
        queues: &MultiLevelQueue,
        plans: Option<&[BatchPlan]>,
    ) -> Drain {
        let mut wait: Option<Duration> = None;
        for (class, queue) in queues.iter() {
            let c = class.index();
            let Some(head) = self.heads[c].take().or_else(|| queue.pop()) else {
                continue;
            };
            if let Some(plan) = plans.and_then(|p| p.get(c)) {
                let age = Duration::from_micros(wall_us.saturating_sub(head.ingress_us));
                let records = u32::try_from(queue.len() + 1).unwrap_or(u32::MAX);
                let bytes = (queue.bytes() + head.size()) as u64;
                if !plan.should_close(age, records, bytes) {
                    self.heads[c] = Some(head);
                    let d = plan.max_wait.saturating_sub(age);
                    wait = Some(wait.map_or(d, |w| w.min(d)));
                    continue;
                }
            }
            match self.take(c, now, head.size()) {
                Take::Wait(d) => {
                    self.heads[c] = Some(head);
                    wait = Some(wait.map_or(d, |w| w.min(d)));
                }
                Take::Granted => {
                    let mut bytes = head.size();
                    let mut records = vec![head];
                    while records.len() < self.limits.max_records {
                        let Some(next) = queue.pop() else { break };
                        let size = next.size();
                        if bytes + size > self.limits.max_bytes
                            || self.take(c, now, size) != Take::Granted
                        {
                            self.heads[c] = Some(next);
                            break;
                        }
                        bytes += size;
                        records.push(next);
                    }
                    return Drain::Batch { class, records };
                }
            }
        }
        match wait {
            Some(d) => Drain::Wait(d),
            None => Drain::Empty,
        }
    }

    /// Takes every held head back out (for shutdown: they go to the spool or
    /// the last flush, never lost).
    pub fn take_heads(&mut self) -> Vec<Record> {
        self.heads.iter_mut().filter_map(Option::take).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::QueueCapacity;
    use bytes::Bytes;

    fn rec(class: u8, seq: u64) -> Record {
        Record {
            key: Bytes::new(),
            class: ClassId(class),
            origin: 1,
            seq,
            ingress_us: 0,
            payload: Bytes::from(vec![0u8; 68]),
        }
    }
    const SIZE: usize = 100; // 68 + RECORD_OVERHEAD
    const CAP: QueueCapacity = QueueCapacity {
        records: 1024,
        bytes: 1 << 20,
    };
    const LIMITS: BatchLimits = BatchLimits {
        max_records: 4,
        max_bytes: 1 << 20,
    };

    #[test]
    fn urgent_class_goes_first_and_batches_respect_limits() {
        let q = MultiLevelQueue::new(&[CAP, CAP]);
        for s in 0..3 {
            q.push(rec(1, s)).unwrap();
        }
        for s in 10..16 {
            q.push(rec(0, s)).unwrap();
        }
        let mut d = Drainer::new(&[1e9, 1e9], 1e9, LIMITS, Duration::ZERO);
        let seqs = |d: Drain| match d {
            Drain::Batch { records, .. } => records.iter().map(|r| r.seq).collect::<Vec<_>>(),
            other => panic!("expected a batch, got {other:?}"),
        };
        assert_eq!(
            seqs(d.next_batch(Duration::ZERO, 0, &q, None)),
            vec![10, 11, 12, 13]
        );
        assert_eq!(
            seqs(d.next_batch(Duration::ZERO, 0, &q, None)),
            vec![14, 15]
        );
        assert_eq!(
            seqs(d.next_batch(Duration::ZERO, 0, &q, None)),
            vec![0, 1, 2]
        );
        assert_eq!(d.next_batch(Duration::ZERO, 0, &q, None), Drain::Empty);
    }

    #[test]
    fn a_class_out_of_tokens_waits_and_keeps_its_order() {
        let q = MultiLevelQueue::new(&[CAP, CAP]);
        for s in 0..3 {
            q.push(rec(1, s)).unwrap();
        }
        q.push(rec(0, 100)).unwrap();
        // Class 1: one record's worth of burst at 1000 B/s; class 0 plenty
        // (but class 1 may not borrow from the more urgent class 0).
        let mut d = Drainer::new(&[1e9, 1000.0], SIZE as f64, LIMITS, Duration::ZERO);
        let first = d.next_batch(Duration::ZERO, 0, &q, None);
        assert!(matches!(
            first,
            Drain::Batch {
                class: ClassId(0),
                ..
            }
        ));
        let second = d.next_batch(Duration::ZERO, 0, &q, None);
        assert!(
            matches!(second, Drain::Batch { class: ClassId(1), ref records } if records.len() == 1)
        );
        assert_eq!(d.held_bytes(ClassId(1)), SIZE);
        // Class 1 waits: 100 bytes at 1000 B/s.
        assert_eq!(
            d.next_batch(Duration::ZERO, 0, &q, None),
            Drain::Wait(Duration::from_millis(100))
        );
        let third = d.next_batch(Duration::from_millis(100), 0, &q, None);
        assert!(
            matches!(third, Drain::Batch { class: ClassId(1), ref records } if records[0].seq == 1)
        );
    }

    #[test]
    fn an_urgent_class_borrows_from_less_urgent_buckets_never_the_reverse() {
        let q = MultiLevelQueue::new(&[CAP, CAP, CAP]);
        // ls has no rate at all (BWAllocator gave it nothing this window),
        // lt has room for exactly two records, nm none.
        let mut d = Drainer::new(&[0.0, 0.0, 1e-9], 2.0 * SIZE as f64, LIMITS, Duration::ZERO);
        // Drain the ls and nm buckets' initial burst so only lt has tokens.
        for class in [0u8, 1] {
            for s in 0..2 {
                q.push(rec(class, s)).unwrap();
            }
            assert!(matches!(
                d.next_batch(Duration::ZERO, 0, &q, None),
                Drain::Batch { .. }
            ));
        }
        q.push(rec(0, 10)).unwrap();
        q.push(rec(1, 20)).unwrap();
        // ls borrows lt's two records' worth: one for ls...
        match d.next_batch(Duration::ZERO, 0, &q, None) {
            Drain::Batch { class, records } => {
                assert_eq!(class, ClassId(0));
                assert_eq!(records[0].seq, 10);
            }
            other => panic!("ls should borrow, got {other:?}"),
        }
        // ...and nm (more urgent than lt) borrows the other.
        assert!(matches!(
            d.next_batch(Duration::ZERO, 0, &q, None),
            Drain::Batch {
                class: ClassId(1),
                ..
            }
        ));
        // lt itself now waits: nothing borrows upward.
        q.push(rec(2, 30)).unwrap();
        assert!(matches!(
            d.next_batch(Duration::ZERO, 0, &q, None),
            Drain::Wait(_)
        ));
    }

    #[test]
    fn a_partial_batch_waits_for_its_plan_and_others_use_the_link() {
        use crate::batching::PlanReason;
        let q = MultiLevelQueue::new(&[CAP, CAP]);
        let mut d = Drainer::new(&[1e9, 1e9], 1e9, LIMITS, Duration::ZERO);
        let plan = BatchPlan {
            target_records: 3,
            max_bytes: 1 << 20,
            max_wait: Duration::from_millis(50),
            expected_records: 3,
            reason: PlanReason::Batching(crate::batching::SizeLimit::Reference),
        };
        let plans = [plan, BatchPlan::unbatched(1 << 20, PlanReason::RateTooLow)];
        let t0 = 1_000_000u64; // wall clock, µs
        let mut r = rec(0, 1);
        r.ingress_us = t0;
        q.push(r).unwrap();
        q.push(rec(1, 50)).unwrap();
        // Class 0 has 1 of 3 records and has waited 0 ms: class 1 goes.
        assert!(matches!(
            d.next_batch(Duration::ZERO, t0, &q, Some(&plans)),
            Drain::Batch {
                class: ClassId(1),
                ..
            }
        ));
        // Now only class 0 waits, until its 50 ms deadline.
        assert_eq!(
            d.next_batch(Duration::ZERO, t0 + 10_000, &q, Some(&plans)),
            Drain::Wait(Duration::from_millis(40))
        );
        // Filling the batch closes it at once...
        for s in 2..4 {
            let mut r = rec(0, s);
            r.ingress_us = t0 + 10_000;
            q.push(r).unwrap();
        }
        match d.next_batch(Duration::ZERO, t0 + 10_000, &q, Some(&plans)) {
            Drain::Batch { class, records } => {
                assert_eq!(class, ClassId(0));
                assert_eq!(
                    records.iter().map(|r| r.seq).collect::<Vec<_>>(),
                    vec![1, 2, 3]
                );
            }
            other => panic!("expected the filled batch, got {other:?}"),
        }
        // ...and a lone record goes when its wait is over.
        let mut r = rec(0, 9);
        r.ingress_us = t0;
        q.push(r).unwrap();
        assert!(matches!(
            d.next_batch(Duration::ZERO, t0 + 50_000, &q, Some(&plans)),
            Drain::Batch {
                class: ClassId(0),
                ..
            }
        ));
    }

    #[test]
    fn heads_are_returned_on_shutdown() {
        let q = MultiLevelQueue::new(&[CAP]);
        q.push(rec(0, 1)).unwrap();
        let mut d = Drainer::new(&[0.0], 0.0, LIMITS, Duration::ZERO);
        assert_eq!(
            d.next_batch(Duration::ZERO, 0, &q, None),
            Drain::Wait(Duration::MAX)
        );
        assert_eq!(d.take_heads().len(), 1);
        assert!(q.is_empty_all());
    }
}
