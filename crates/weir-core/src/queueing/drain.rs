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
mod tests;
