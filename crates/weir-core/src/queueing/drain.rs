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
//!
//! **Mixed batches** (on unless [`Drainer::set_mixing`] turns them off). A
//! transaction has a fixed cost (`T_sc`, the AMQP confirm's round trip)
//! whatever it carries. Once one class closes a batch, the room left under
//! the caps is filled from the other classes, most urgent first, each within
//! its own tokens (with the same borrowing), ignoring their batch plans: a
//! plan waits to share a transaction's fixed cost among more records, and
//! riding a transaction that goes anyway costs nothing. Without it, a
//! sporadic urgent class on a link whose per-transaction cost is comparable
//! to its inter-arrival time takes every transaction for a handful of
//! records and starves the classes below (measured in the JANUS lab with
//! the 4G delay on the link: 119 records/s of 10,838 offered). Records keep
//! their order within their class; every record carries its class on the
//! wire.
//!
//! **Gathering.** A transaction also costs CPU whatever it carries: the
//! egress's hand-offs, the broker's confirm, a file's fsync. On a link
//! that is always free (a broker on the same machine or the LAN) the
//! egress would otherwise send whatever a few hundred microseconds
//! brought: 1,950 batches/s of 26 records at 50k records/s into
//! RabbitMQ, most of the CPU spent per transaction (weir's workers and
//! lapin's I/O thread switching, RabbitMQ's 14 us per record on such small
//! messages). With a *gather* set ([`Drainer::set_gather`]), a batch that
//! would not be full goes at most one gather after the batch before it:
//! transactions of partial batches are at most `1 / gather` a second,
//! records wait at most one gather longer, and a full batch (a backlog)
//! never waits. Where the link takes longer than a gather per
//! transaction, the gather has passed by the time it is free and changes
//! nothing. The scheduler keeps the gather within a small share of the
//! tightest bound ([`crate::admission::GATHER_SHARE`]).
//!
//! Riders make a transaction longer, and an urgent record aboard waits for
//! all of it. So each class has a *rider budget* (set by the caller, see
//! [`rider_budget`]): while a batch holds a record of class `c`, it holds at
//! most `budget_c` bytes. The scheduler sets it to what the link carries in
//! [`RIDER_SHARE`] of the class's bound, so riders stretch an urgent
//! record's transaction by at most that share; without it the JANUS lab's
//! `ls` (100 ms bound, 50 ms of it propagation) broke its bound on 13.6 %
//! of records behind 64 KiB mixed batches.

use std::time::Duration;

use crate::batching::{BatchLimits, BatchPlan};
use crate::class::ClassId;
use crate::queueing::queue::{ClassQueue, MultiLevelQueue};
use crate::queueing::token_bucket::{ClassBuckets, Take};
use crate::record::Record;

/// The share of a class's latency bound that riders may add to a
/// transaction carrying one of its records.
pub const RIDER_SHARE: f64 = 0.1;

/// The rider budget of a class with `bound` on a link carrying
/// `bytes_per_sec` (record bytes): the bytes sent in [`RIDER_SHARE`] of the
/// bound. Never below `floor` (a batch's worth a class may always have);
/// unlimited for a non-finite or non-positive rate.
pub fn rider_budget(bound: Duration, bytes_per_sec: f64, floor: usize) -> usize {
    if !(bytes_per_sec.is_finite() && bytes_per_sec > 0.0) {
        return usize::MAX;
    }
    let bytes = bytes_per_sec * RIDER_SHARE * bound.as_secs_f64();
    if bytes >= usize::MAX as f64 {
        usize::MAX
    } else {
        (bytes as usize).max(floor)
    }
}

/// What [`Drainer::next_batch`] found.
#[derive(Debug, PartialEq)]
pub enum Drain {
    /// Send these records now: grouped by class, most urgent class first,
    /// each class's oldest first.
    Batch {
        /// The most urgent class among the records.
        class: ClassId,
        /// The records.
        records: Vec<Record>,
    },
    /// Records wait but no bucket conforms; call again after this long.
    Wait(Duration),
    /// Records wait, fewer than a full batch, and the last batch went less
    /// than a gather ago ([`Drainer::set_gather`]): call again after this
    /// long (arrivals meanwhile need not wake the caller).
    Gather(Duration),
    /// Nothing waits anywhere.
    Empty,
}

/// Per-class token buckets plus the per-class held heads.
#[derive(Debug)]
pub struct Drainer {
    buckets: ClassBuckets,
    heads: Vec<Option<Record>>,
    limits: BatchLimits,
    mixing: bool,
    budgets: Vec<usize>,
    /// Shortest time between a batch and a following partial one.
    gather: Duration,
    /// When the last batch was taken.
    last_batch: Option<Duration>,
}

impl Drainer {
    /// A drainer over `rates.len()` classes with these initial byte rates.
    pub fn new(rates: &[f64], burst_bytes: f64, limits: BatchLimits, now: Duration) -> Self {
        Drainer {
            buckets: ClassBuckets::new(rates, burst_bytes, now),
            heads: vec![None; rates.len()],
            limits,
            mixing: true,
            budgets: vec![usize::MAX; rates.len()],
            gather: Duration::ZERO,
            last_batch: None,
        }
    }

    /// A batch that would not be full goes at most `gather` after the
    /// batch before it (the module docs' gathering); zero: whenever the
    /// link is free.
    pub fn set_gather(&mut self, gather: Duration) {
        self.gather = gather;
    }

    /// How long the batch due at `now` should gather first: until one
    /// gather after the last batch, unless nothing waits or a full batch
    /// does.
    fn gathering(&self, now: Duration, queues: &MultiLevelQueue) -> Option<Duration> {
        let until = self.last_batch?.checked_add(self.gather)?;
        if now >= until {
            return None;
        }
        let (mut records, mut bytes) = (0usize, 0usize);
        for (class, q) in queues.iter() {
            let held = self.heads[class.index()].as_ref();
            records += q.len() + usize::from(held.is_some());
            bytes += q.bytes() + held.map_or(0, Record::size);
        }
        let full = records >= self.limits.max_records || bytes >= self.limits.max_bytes;
        (records > 0 && !full).then(|| until - now)
    }

    /// Per class, the most bytes a mixed batch may hold while it carries a
    /// record of that class (the module docs' rider budget); unlimited
    /// until set. Missing entries are unlimited.
    pub fn set_rider_budgets(&mut self, budgets: &[usize]) {
        for (i, b) in self.budgets.iter_mut().enumerate() {
            *b = budgets.get(i).copied().unwrap_or(usize::MAX);
        }
    }

    /// Whether a closing batch takes in records of other classes (the
    /// module docs' mixed batches); on by default.
    pub fn set_mixing(&mut self, on: bool) {
        self.mixing = on;
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

    /// Changes every class bucket's depth (a reload of `burst_bytes`).
    pub fn set_burst_bytes(&mut self, now: Duration, burst_bytes: f64) {
        self.buckets.set_burst_bytes(now, burst_bytes);
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
        let own = self.buckets.try_take(c, now, size);
        if own == Take::Granted {
            return own;
        }
        let mut wait = match own {
            Take::Wait(d) => d,
            Take::Granted => unreachable!("returned above"),
        };
        for lower in (c + 1..self.heads.len()).rev() {
            match self.buckets.try_take(lower, now, size) {
                Take::Granted => return Take::Granted,
                Take::Wait(d) => wait = wait.min(d),
            }
        }
        Take::Wait(wait)
    }

    /// Adds records of class `c` (its held head first, then its queue) to
    /// `batch` while the record cap, `max_bytes` and `c`'s tokens allow; the
    /// first that does not fit is held.
    fn fill(
        &mut self,
        c: usize,
        now: Duration,
        queue: &ClassQueue,
        batch: &mut Fill,
        max_bytes: usize,
    ) {
        while batch.records.len() + batch.aside < self.limits.max_records {
            let Some(next) = self.heads[c].take().or_else(|| queue.pop()) else {
                break;
            };
            let size = next.size();
            if batch.bytes + size > max_bytes || self.take(c, now, size) != Take::Granted {
                self.heads[c] = Some(next);
                break;
            }
            batch.bytes += size;
            batch.records.push(next);
        }
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
        if let Some(d) = self.gathering(now, queues) {
            return Drain::Gather(d);
        }
        let drain = self.drain(now, wall_us, queues, plans);
        if matches!(drain, Drain::Batch { .. }) {
            self.last_batch = Some(now);
        }
        drain
    }

    /// [`Drainer::next_batch`] once any gather is over.
    fn drain(
        &mut self,
        now: Duration,
        wall_us: u64,
        queues: &MultiLevelQueue,
        plans: Option<&[BatchPlan]>,
    ) -> Drain {
        let mut wait: Option<Duration> = None;
        for (class, queue) in queues.iter() {
            let c = class.index();
            let head = match self.closed_head(c, queue, plans, wall_us) {
                Head::None => continue,
                Head::Open(d) => {
                    wait = Some(wait.map_or(d, |w| w.min(d)));
                    continue;
                }
                Head::Closed(head) => head,
            };
            match self.take(c, now, head.size()) {
                Take::Wait(d) => {
                    self.heads[c] = Some(head);
                    wait = Some(wait.map_or(d, |w| w.min(d)));
                }
                Take::Granted => {
                    if !self.mixing {
                        let mut batch = Fill {
                            bytes: head.size(),
                            records: vec![head],
                            aside: 0,
                        };
                        self.fill(c, now, queue, &mut batch, self.limits.max_bytes);
                        return Drain::Batch {
                            class,
                            records: batch.records,
                        };
                    }
                    // Every class, most urgent first, under the budgets of
                    // the classes aboard; the trigger's head (already
                    // counted in `bytes`) goes in at its class's turn, so
                    // the batch comes out in priority order.
                    let mut batch = Fill {
                        bytes: head.size(),
                        records: Vec::new(),
                        aside: 1,
                    };
                    let mut head = Some(head);
                    let mut cap = self.limits.max_bytes.min(self.budgets[c]);
                    for (other, q) in queues.iter() {
                        let o = other.index();
                        let before = batch.records.len();
                        if o == c {
                            batch.records.extend(head.take());
                            batch.aside = 0;
                        }
                        let with_o = cap.min(self.budgets[o]);
                        self.fill(o, now, q, &mut batch, with_o);
                        if batch.records.len() > before {
                            cap = with_o;
                        }
                    }
                    let top = batch.records.first().map_or(class, |r| r.class);
                    return Drain::Batch {
                        class: top,
                        records: batch.records,
                    };
                }
            }
        }
        match wait {
            Some(d) => Drain::Wait(d),
            None => Drain::Empty,
        }
    }

    /// A batch of the most urgent class alone, for a slot beyond the
    /// egress's window of unconfirmed batches (the *urgent lane*): its plan
    /// and tokens apply as in [`Drainer::next_batch`], but no other class
    /// rides along and no gather waits, so what the lane adds to the link
    /// is that class's own records.
    pub fn next_urgent(
        &mut self,
        now: Duration,
        wall_us: u64,
        queues: &MultiLevelQueue,
        plans: Option<&[BatchPlan]>,
    ) -> Drain {
        let Some((class, queue)) = queues.iter().next() else {
            return Drain::Empty;
        };
        let c = class.index();
        let head = match self.closed_head(c, queue, plans, wall_us) {
            Head::None => return Drain::Empty,
            Head::Open(d) => return Drain::Wait(d),
            Head::Closed(head) => head,
        };
        match self.take(c, now, head.size()) {
            Take::Wait(d) => {
                self.heads[c] = Some(head);
                Drain::Wait(d)
            }
            Take::Granted => {
                let mut batch = Fill {
                    bytes: head.size(),
                    records: vec![head],
                    aside: 0,
                };
                let cap = self.limits.max_bytes.min(self.budgets[c]);
                self.fill(c, now, queue, &mut batch, cap);
                self.last_batch = Some(now);
                Drain::Batch {
                    class,
                    records: batch.records,
                }
            }
        }
    }

    /// Class `c`'s head (held, or popped) if its batch plan lets it close
    /// now; else it is held and how long until the plan closes it.
    fn closed_head(
        &mut self,
        c: usize,
        queue: &ClassQueue,
        plans: Option<&[BatchPlan]>,
        wall_us: u64,
    ) -> Head {
        let Some(head) = self.heads[c].take().or_else(|| queue.pop()) else {
            return Head::None;
        };
        if let Some(plan) = plans.and_then(|p| p.get(c)) {
            let age = Duration::from_micros(wall_us.saturating_sub(head.ingress_us));
            let records = u32::try_from(queue.len() + 1).unwrap_or(u32::MAX);
            let bytes = (queue.bytes() + head.size()) as u64;
            if !plan.should_close(age, records, bytes) {
                self.heads[c] = Some(head);
                return Head::Open(plan.max_wait.saturating_sub(age));
            }
        }
        Head::Closed(head)
    }

    /// Takes every held head back out (for shutdown: they go to the spool or
    /// the last flush, never lost).
    pub fn take_heads(&mut self) -> Vec<Record> {
        self.heads.iter_mut().filter_map(Option::take).collect()
    }
}

/// A class's head as its batch plan sees it.
enum Head {
    /// The class has nothing queued.
    None,
    /// The plan keeps the batch open this much longer (the head is held).
    Open(Duration),
    /// The batch may close: the head, taken out.
    Closed(Record),
}

/// A batch being built.
struct Fill {
    /// Bytes of `records` and of the records set aside.
    bytes: usize,
    records: Vec<Record>,
    /// Records counted in `bytes` but not yet placed (the trigger's head,
    /// placed at its class's turn).
    aside: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queueing::queue::QueueCapacity;
    use bytes::Bytes;

    fn rec(class: u8, seq: u64) -> Record {
        Record {
            key: Bytes::new(),
            class: ClassId(class),
            origin: 1,
            seq,
            ingress_us: 0,
            payload: Bytes::from(vec![0u8; 68]),
            spool: None,
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
        // Per-class behaviour: see the mixing tests for riders.
        d.set_mixing(false);
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
        // Class 1: one record's worth of burst at 1000 B/s; class 0 one
        // record's worth and no rate (class 1 may not borrow from the more
        // urgent class 0, and an empty bucket spills nothing).
        let mut d = Drainer::new(&[0.0, 1000.0], SIZE as f64, LIMITS, Duration::ZERO);
        // Per-class behaviour: see the mixing tests for riders.
        d.set_mixing(false);
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
        // Per-class behaviour: see the mixing tests for riders.
        d.set_mixing(false);
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
    fn a_tolerant_backlog_sends_what_the_urgent_classes_leave_unused() {
        // ls and nm allotted 1000 B/s each and idle, lt 1000 B/s with a
        // backlog: over 10 s lt sends the whole 3000 B/s, not its own 1000.
        let q = MultiLevelQueue::new(&[CAP, CAP, CAP]);
        for s in 0..1000 {
            q.push(rec(2, s)).unwrap();
        }
        let mut d = Drainer::new(
            &[1000.0, 1000.0, 1000.0],
            2.0 * SIZE as f64,
            LIMITS,
            Duration::ZERO,
        );
        let mut now = Duration::ZERO;
        let mut sent = 0usize;
        while now <= Duration::from_secs(10) {
            match d.next_batch(now, 0, &q, None) {
                Drain::Batch { records, .. } => sent += records.len(),
                Drain::Wait(w) => now += w.max(Duration::from_millis(1)),
                other => panic!("lt has a backlog: {other:?}"),
            }
        }
        // 3000 B/s for 10 s plus lt's own initial burst, in 100 B records
        // (the urgent classes keep theirs).
        let expected = (3000 * 10 + 2 * SIZE) / SIZE;
        assert!(
            sent + 2 >= expected && sent <= expected + 2,
            "lt sent {sent} records, expected about {expected}"
        );
        // The urgent classes still hold their whole bursts.
        q.push(rec(0, 5000)).unwrap();
        q.push(rec(0, 5001)).unwrap();
        match d.next_batch(now, 0, &q, None) {
            Drain::Batch { class, records } => {
                assert_eq!(class, ClassId(0));
                assert_eq!(records.iter().filter(|r| r.class == ClassId(0)).count(), 2);
            }
            other => panic!("ls goes at once, got {other:?}"),
        }
    }

    #[test]
    fn a_partial_batch_waits_for_its_plan_and_others_use_the_link() {
        use crate::batching::PlanReason;
        let q = MultiLevelQueue::new(&[CAP, CAP]);
        let mut d = Drainer::new(&[1e9, 1e9], 1e9, LIMITS, Duration::ZERO);
        // Per-class behaviour: see the mixing tests for riders.
        d.set_mixing(false);
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

    fn classes_and_seqs(d: Drain) -> (ClassId, Vec<(u8, u64)>) {
        match d {
            Drain::Batch { class, records } => {
                (class, records.iter().map(|r| (r.class.0, r.seq)).collect())
            }
            other => panic!("expected a batch, got {other:?}"),
        }
    }

    #[test]
    fn a_closing_batch_takes_riders_from_other_classes_in_priority_order() {
        let q = MultiLevelQueue::new(&[CAP, CAP, CAP]);
        q.push(rec(0, 1)).unwrap();
        for s in 10..13 {
            q.push(rec(2, s)).unwrap();
        }
        q.push(rec(1, 5)).unwrap();
        let mut d = Drainer::new(&[1e9; 3], 1e9, LIMITS, Duration::ZERO);
        // One transaction: ls first, then nm, then lt up to the 4-record cap.
        assert_eq!(
            classes_and_seqs(d.next_batch(Duration::ZERO, 0, &q, None)),
            (ClassId(0), vec![(0, 1), (1, 5), (2, 10), (2, 11)])
        );
        // The lt record that did not fit is held, first of the next batch.
        assert_eq!(
            classes_and_seqs(d.next_batch(Duration::ZERO, 0, &q, None)),
            (ClassId(2), vec![(2, 12)])
        );
        assert_eq!(d.next_batch(Duration::ZERO, 0, &q, None), Drain::Empty);
    }

    #[test]
    fn riders_pay_with_their_own_tokens() {
        let q = MultiLevelQueue::new(&[CAP, CAP]);
        q.push(rec(0, 1)).unwrap();
        for s in 10..13 {
            q.push(rec(1, s)).unwrap();
        }
        // Class 1 can afford one record now, then 1000 B/s.
        let mut d = Drainer::new(&[1e9, 1000.0], SIZE as f64, LIMITS, Duration::ZERO);
        assert_eq!(
            classes_and_seqs(d.next_batch(Duration::ZERO, 0, &q, None)),
            (ClassId(0), vec![(0, 1), (1, 10)])
        );
        assert!(matches!(
            d.next_batch(Duration::ZERO, 0, &q, None),
            Drain::Wait(_)
        ));
        // Order within the class is kept across the held head.
        assert_eq!(
            classes_and_seqs(d.next_batch(Duration::from_millis(100), 0, &q, None)),
            (ClassId(1), vec![(1, 11)])
        );
    }

    #[test]
    fn a_waiting_plan_rides_along_and_the_batch_is_sorted_by_priority() {
        use crate::batching::PlanReason;
        let q = MultiLevelQueue::new(&[CAP, CAP]);
        let mut d = Drainer::new(&[1e9, 1e9], 1e9, LIMITS, Duration::ZERO);
        let waiting = BatchPlan {
            target_records: 3,
            max_bytes: 1 << 20,
            max_wait: Duration::from_millis(50),
            expected_records: 3,
            reason: PlanReason::Batching(crate::batching::SizeLimit::Reference),
        };
        let plans = [
            waiting,
            BatchPlan::unbatched(1 << 20, PlanReason::RateTooLow),
        ];
        let t0 = 1_000_000u64;
        let mut r = rec(0, 1);
        r.ingress_us = t0;
        q.push(r).unwrap();
        q.push(rec(1, 50)).unwrap();
        // Class 0 would wait for two more records; class 1 closes a batch
        // and class 0's record rides it, placed first.
        assert_eq!(
            classes_and_seqs(d.next_batch(Duration::ZERO, t0, &q, Some(&plans))),
            (ClassId(0), vec![(0, 1), (1, 50)])
        );
        assert_eq!(
            d.next_batch(Duration::ZERO, t0, &q, Some(&plans)),
            Drain::Empty
        );
    }

    #[test]
    fn mixing_never_loses_or_reorders_records() {
        // Many classes, rates and caps: every record comes out exactly once,
        // each class in its own order.
        let q = MultiLevelQueue::new(&[CAP, CAP, CAP, CAP]);
        let mut pushed = 0;
        for s in 0..200u64 {
            q.push(rec((s * 7 % 4) as u8, s)).unwrap();
            pushed += 1;
        }
        let limits = BatchLimits {
            max_records: 7,
            max_bytes: 5 * SIZE,
        };
        let mut d = Drainer::new(
            &[5000.0, 1e9, 300.0, 2000.0],
            3.0 * SIZE as f64,
            limits,
            Duration::ZERO,
        );
        let mut last = [None::<u64>; 4];
        let mut got = 0;
        let mut now = Duration::ZERO;
        while got < pushed {
            match d.next_batch(now, 0, &q, None) {
                Drain::Batch { class, records } => {
                    assert!(records.len() <= 7 && records.len() * SIZE <= 5 * SIZE);
                    assert_eq!(class.0, records.iter().map(|r| r.class.0).min().unwrap());
                    let classes: Vec<u8> = records.iter().map(|r| r.class.0).collect();
                    assert!(classes.windows(2).all(|w| w[0] <= w[1]), "{classes:?}");
                    for r in records {
                        let c = r.class.index();
                        assert!(last[c].is_none_or(|l| l < r.seq));
                        last[c] = Some(r.seq);
                        got += 1;
                    }
                }
                Drain::Wait(w) => now += w.max(Duration::from_millis(1)),
                Drain::Gather(_) | Drain::Empty => panic!("{got} of {pushed} out"),
            }
        }
        assert_eq!(d.next_batch(now, 0, &q, None), Drain::Empty);
    }

    #[test]
    fn an_urgent_record_aboard_caps_the_batch_at_its_budget() {
        let q = MultiLevelQueue::new(&[CAP, CAP]);
        let limits = BatchLimits {
            max_records: 100,
            max_bytes: 10 * SIZE,
        };
        let mut d = Drainer::new(&[1e9, 1e9], 1e9, limits, Duration::ZERO);
        d.set_rider_budgets(&[3 * SIZE]);
        for s in 0..30 {
            q.push(rec(1, s)).unwrap();
        }
        q.push(rec(0, 100)).unwrap();
        // ls aboard: 3 records in all.
        assert_eq!(
            classes_and_seqs(d.next_batch(Duration::ZERO, 0, &q, None)),
            (ClassId(0), vec![(0, 100), (1, 0), (1, 1)])
        );
        // lt alone: the byte cap (class 1 has no budget: unlimited).
        let (class, got) = classes_and_seqs(d.next_batch(Duration::ZERO, 0, &q, None));
        assert_eq!((class, got.len()), (ClassId(1), 10));
        // Another ls record goes first, with the held lt record and one more.
        q.push(rec(0, 101)).unwrap();
        assert_eq!(
            classes_and_seqs(d.next_batch(Duration::ZERO, 0, &q, None)),
            (ClassId(0), vec![(0, 101), (1, 12), (1, 13)])
        );
    }

    #[test]
    fn rider_budget_is_a_share_of_the_bound_on_the_link() {
        // 2.25 MB/s for a tenth of 100 ms.
        assert_eq!(
            rider_budget(Duration::from_millis(100), 2.25e6, 1024),
            22_500
        );
        assert_eq!(rider_budget(Duration::from_millis(1), 2.25e6, 1024), 1024);
        assert_eq!(rider_budget(Duration::from_secs(1), 0.0, 1024), usize::MAX);
        assert_eq!(
            rider_budget(Duration::from_secs(1), f64::INFINITY, 1024),
            usize::MAX
        );
    }

    #[test]
    fn a_partial_batch_gathers_until_one_gather_after_the_last() {
        let q = MultiLevelQueue::new(&[CAP, CAP]);
        let limits = BatchLimits {
            max_records: 10,
            max_bytes: 1 << 20,
        };
        let ms = Duration::from_millis(1);
        let mut d = Drainer::new(&[1e9, 1e9], 1e9, limits, Duration::ZERO);
        d.set_gather(ms * 2);
        // The first batch does not gather: nothing went before it.
        q.push(rec(1, 0)).unwrap();
        assert!(matches!(
            d.next_batch(Duration::ZERO, 0, &q, None),
            Drain::Batch { .. }
        ));
        // Nothing queued: empty, not a gather.
        assert_eq!(d.next_batch(ms / 2, 0, &q, None), Drain::Empty);
        // A partial batch half a millisecond later gathers for the rest.
        for seq in 1..4 {
            q.push(rec(0, seq)).unwrap();
        }
        assert_eq!(d.next_batch(ms / 2, 0, &q, None), Drain::Gather(ms * 3 / 2));
        q.push(rec(1, 4)).unwrap();
        match d.next_batch(ms * 2, 0, &q, None) {
            Drain::Batch { records, .. } => assert_eq!(records.len(), 4),
            other => panic!("{other:?}"),
        }
        // A full batch's worth never waits, records or bytes.
        for seq in 10..20 {
            q.push(rec(1, seq)).unwrap();
        }
        assert!(matches!(
            d.next_batch(ms * 2, 0, &q, None),
            Drain::Batch { .. }
        ));
        d.set_limits(BatchLimits {
            max_records: 100,
            max_bytes: 3 * SIZE,
        });
        for seq in 20..23 {
            q.push(rec(0, seq)).unwrap();
        }
        assert!(matches!(
            d.next_batch(ms * 2, 0, &q, None),
            Drain::Batch { .. }
        ));
        // After a long pause a lone record goes at once.
        q.push(rec(0, 30)).unwrap();
        assert!(matches!(
            d.next_batch(ms * 10, 0, &q, None),
            Drain::Batch { .. }
        ));
        // Without a gather, whatever is queued goes whenever asked.
        d.set_gather(Duration::ZERO);
        q.push(rec(0, 31)).unwrap();
        assert!(matches!(
            d.next_batch(ms * 10, 0, &q, None),
            Drain::Batch { .. }
        ));
    }

    #[test]
    fn the_urgent_lane_takes_the_most_urgent_class_alone() {
        let q = MultiLevelQueue::new(&[CAP, CAP, CAP]);
        for s in 0..3 {
            q.push(rec(2, s)).unwrap();
        }
        // Nothing urgent: the lane has nothing, whatever else waits.
        let mut d = Drainer::new(&[1e9, 1e9, 1e9], 1e9, LIMITS, Duration::ZERO);
        assert_eq!(d.next_urgent(Duration::ZERO, 0, &q, None), Drain::Empty);
        q.push(rec(0, 10)).unwrap();
        q.push(rec(1, 20)).unwrap();
        q.push(rec(0, 11)).unwrap();
        // Mixing is on, yet no other class rides in the lane.
        match d.next_urgent(Duration::ZERO, 0, &q, None) {
            Drain::Batch { class, records } => {
                assert_eq!(class, ClassId(0));
                assert_eq!(records.iter().map(|r| r.seq).collect::<Vec<_>>(), [10, 11]);
            }
            other => panic!("expected the urgent records, got {other:?}"),
        }
        // The rest is left for the window, in order.
        match d.next_batch(Duration::ZERO, 0, &q, None) {
            Drain::Batch { records, .. } => {
                assert_eq!(
                    records.iter().map(|r| r.seq).collect::<Vec<_>>(),
                    [20, 0, 1, 2]
                );
            }
            other => panic!("expected a batch, got {other:?}"),
        }
    }

    #[test]
    fn the_urgent_lane_keeps_the_class_plan_and_tokens() {
        let q = MultiLevelQueue::new(&[CAP]);
        q.push(rec(0, 1)).unwrap();
        q.push(rec(0, 2)).unwrap();
        // Tokens for one record, no class to borrow from: one goes, the
        // other waits (held, not lost).
        let mut d = Drainer::new(&[1000.0], SIZE as f64, LIMITS, Duration::ZERO);
        assert!(
            matches!(d.next_urgent(Duration::ZERO, 0, &q, None), Drain::Batch { ref records, .. } if records.len() == 1)
        );
        assert!(matches!(
            d.next_urgent(Duration::ZERO, 0, &q, None),
            Drain::Wait(_)
        ));
        assert_eq!(d.take_heads().len(), 1);
        let q = MultiLevelQueue::new(&[CAP, CAP]);
        q.push(rec(0, 1)).unwrap();
        // A plan that waits for more records keeps the batch open.
        let plan = BatchPlan {
            target_records: 4,
            max_bytes: 1 << 20,
            max_wait: Duration::from_millis(30),
            expected_records: 4,
            reason: crate::batching::PlanReason::Batching(crate::batching::SizeLimit::Reference),
        };
        let mut d = Drainer::new(&[1e9, 1e9], 1e9, LIMITS, Duration::ZERO);
        let plans = [plan, plan];
        assert_eq!(
            d.next_urgent(Duration::ZERO, 10_000, &q, Some(&plans)),
            Drain::Wait(Duration::from_millis(20))
        );
        assert!(matches!(
            d.next_urgent(Duration::ZERO, 30_000, &q, Some(&plans)),
            Drain::Batch { .. }
        ));
    }
}
