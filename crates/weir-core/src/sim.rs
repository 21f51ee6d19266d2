//! A relay on a simulated clock: the [`Scheduler`] and the [`Delivery`]
//! machine joined as the relay's two drivers join them (permits, the
//! urgent-only flag, the channel of batches between them, the estimate and
//! batch size the egress publishes, the horizon the scheduler publishes),
//! fed records at fixed rates and delivering over a model link (a FIFO
//! at a fixed rate, a one-way delay, a destination that confirms after a
//! fixed time).
//!
//! It answers in milliseconds what the real-process lab answers in
//! minutes: whether the decisions, left to themselves, keep a link of a
//! given rate and round trip full and the urgent class within its bound.
//! What it leaves out: CPU (hand-offs are instant), TCP (no slow start,
//! no loss, no socket buffer limit), compression (batches go as encoded),
//! peering. A figure from it is a model's; the lab's are the ones
//! reported.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;

use crate::class::{ClassId, ClassSet};
use crate::delivery::{Delivery, DeliveryParams, Event as DeliveryEvent, Offer};
use crate::queueing::queue::QueueCapacity;
use crate::record::Record;
use crate::scheduler::{
    capacities_for, queues_for, Delivered, Event as SchedulerEvent, OutBatch, Poll, Scheduler,
    SchedulerParams,
};

/// The wall clock (µs since the Unix epoch) at the simulation's start.
const WALL0: u64 = 1_700_000_000_000_000;

/// Bytes a record takes in an encoded batch beyond its key and payload
/// (its class, origin, sequence number and timestamps as varints).
pub const WIRE_PER_RECORD: u64 = 14;

/// Bytes an encoded batch takes beyond its records (its header).
pub const WIRE_PER_BATCH: u64 = 24;

/// What carries the batches.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkModel {
    /// Bytes per second the link carries, framing included.
    pub bytes_per_sec: f64,
    /// Time from the link to the destination (propagation, one way).
    pub delay: Duration,
    /// The destination's time from a batch's arrival to its confirmation
    /// leaving (a broker's work); the way back takes no time.
    pub confirm: Duration,
    /// Link bytes per byte sent (TCP/IP and the sink's framing): 1514 /
    /// 1448 for full TCP segments on Ethernet.
    pub framing: f64,
    /// Link bytes per transaction beside the batch (the sink's own
    /// framing: an AMQP publish's method and header frames).
    pub per_transaction: u64,
    /// The destination confirms in a cadence of this period (a durable
    /// queue's fsyncs): a batch's confirmation leaves at the first tick
    /// after its own time. Zero: each at its own time.
    pub confirm_every: Duration,
    /// An emulated link (`egress.link`): one transaction at a time, each
    /// holding the send for `delay` plus its bytes over the rate, the batch
    /// reaching the destination as the send returns. `delay` is then the
    /// fixed time per transaction rather than a propagation delay.
    pub serial: bool,
}

/// The records offered.
#[derive(Debug, Clone, PartialEq)]
pub struct Load {
    /// Records per second, per class (most urgent first).
    pub rates: Vec<f64>,
    /// Payload bytes per record.
    pub payload: usize,
    /// Key (topic) bytes per record.
    pub key: usize,
}

/// A simulation's set-up.
#[derive(Debug, Clone)]
pub struct SimParams {
    /// The scheduler's parameters.
    pub scheduler: SchedulerParams,
    /// The delivery machine's.
    pub delivery: DeliveryParams,
    /// The classes.
    pub classes: ClassSet,
    /// Each class's queue capacity.
    pub capacities: Vec<QueueCapacity>,
    /// Batches the channel between scheduler and egress holds.
    pub channel: usize,
    /// The link.
    pub link: LinkModel,
    /// The load.
    pub load: Load,
    /// The simulation's step.
    pub step: Duration,
    /// How long records are offered.
    pub duration: Duration,
    /// Records whose delivery counts towards the figures arrive after
    /// this (the warm-up is left out).
    pub warm_up: Duration,
}

/// What one class saw.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClassReport {
    /// Records offered (after the warm-up).
    pub offered: u64,
    /// Records the queue refused (full: back-pressure).
    pub refused: u64,
    /// Records delivered by the end of the load (offered after the
    /// warm-up).
    pub delivered: u64,
    /// Their latencies, ingress to arrival at the destination, sorted.
    pub latencies: Vec<Duration>,
    /// When the records over their class's bound entered, in order.
    pub late_at: Vec<Duration>,
    /// Batches sent after the warm-up whose most urgent class this is,
    /// and their bytes.
    pub batches: (u64, u64),
}

impl ClassReport {
    /// The `q` quantile (0..=1) of the latencies.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let n = self.latencies.len();
        (n > 0).then(|| self.latencies[((n - 1) as f64 * q).round() as usize])
    }

    /// Records over `bound`.
    pub fn late(&self, bound: Duration) -> usize {
        self.latencies.iter().filter(|l| **l > bound).count()
    }
}

/// What a simulation measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    /// Per class, most urgent first.
    pub classes: Vec<ClassReport>,
    /// Link bytes carried after the warm-up, per second.
    pub link_bytes_per_sec: f64,
    /// Transactions after the warm-up.
    pub batches: u64,
    /// Records delivered after the warm-up, per second of load.
    pub records_per_sec: f64,
    /// The state every [`SAMPLE_EVERY`], from the start.
    pub samples: Vec<Sample>,
}

/// How often [`Report::samples`] are taken.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// The relay's state at one moment ([`Report::samples`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// When.
    pub at: Duration,
    /// The estimate the egress acts on.
    pub acted: f64,
    /// The scheduler's `C_out`.
    pub capacity: f64,
    /// The class rates.
    pub rates: Vec<f64>,
    /// Records queued per class.
    pub queued: Vec<usize>,
    /// Batches in flight.
    pub in_flight: usize,
    /// Bytes the pipe allows in flight.
    pub pipe_bytes: u64,
    /// The batch size the pipe asks for.
    pub pipe_batch: u64,
    /// The link's queue, in time.
    pub link_queue: Duration,
    /// Link bytes carried since the last sample, per second.
    pub link_rate: f64,
    /// What the egress measured at its last confirmation.
    pub measures: Option<crate::delivery::Measures>,
}

/// A batch the scheduler built, with its encoded size (reckoned once).
struct Built {
    batch: OutBatch,
    bytes: u64,
}

/// A batch sent and not yet confirmed.
struct Sent {
    arrives: Duration,
    confirms: Duration,
}

/// What the two drivers share: the permits the egress gave, the channel
/// of built batches, and what each publishes to the other.
#[derive(Default)]
struct Handoff {
    permits: usize,
    urgent_only: bool,
    /// The scheduler holds a permit.
    link_free: bool,
    channel: VecDeque<Built>,
    delivered: VecDeque<Delivered>,
    link: Option<crate::link_estimate::LinkEstimate>,
    pipe_batch: Option<u64>,
}

/// The model link and destination: batches in flight in sending order.
#[derive(Default)]
struct Wire {
    clear_at: Duration,
    /// A serial link's send under way: when it returns.
    sending: Option<Duration>,
    flight: VecDeque<Sent>,
    /// Arrival times of the batches confirmed and not yet reported.
    arrived: VecDeque<Duration>,
    /// Link bytes so far, and those after the warm-up.
    bytes: u64,
    counted: u64,
    batches: u64,
}

/// The whole relay at one moment of the simulation.
struct Relay<'a> {
    p: &'a SimParams,
    queues: crate::queueing::queue::MultiLevelQueue,
    sched: Scheduler,
    egress: Delivery<Built>,
    handoff: Handoff,
    wire: Wire,
    report: Report,
    next_arrival: Vec<Duration>,
    seq: u64,
    key: Bytes,
    payload: Bytes,
    measures: Option<crate::delivery::Measures>,
    sampled_bytes: u64,
}

/// Runs the simulation.
pub fn run(p: &SimParams) -> Report {
    let mut relay = Relay::new(p);
    let mut now = Duration::ZERO;
    let mut next_sample = Duration::ZERO;
    while now < p.duration {
        if now >= next_sample {
            relay.sample(now);
            next_sample += SAMPLE_EVERY;
        }
        relay.arrivals(now);
        relay.sends_done(now);
        relay.confirmations(now);
        // Both drivers, until neither moves.
        for _ in 0..16 {
            relay.egress_events();
            let moved = relay.egress_turn(now) | relay.scheduler_turn(now);
            if !moved {
                break;
            }
        }
        now += p.step;
    }
    relay.finish()
}

impl<'a> Relay<'a> {
    fn new(p: &'a SimParams) -> Self {
        let caps = capacities_for(p.scheduler.scheme, &p.capacities);
        let queues = queues_for(p.scheduler.scheme, &caps);
        let prior = p.delivery.link_prior;
        let sched = Scheduler::new(
            p.scheduler.clone(),
            p.classes.clone(),
            &queues,
            prior,
            0,
            1,
            Duration::ZERO,
        );
        let n = p.classes.len();
        Relay {
            p,
            queues,
            sched,
            egress: Delivery::new(p.delivery.clone(), Duration::ZERO),
            handoff: Handoff::default(),
            wire: Wire::default(),
            report: Report {
                classes: vec![ClassReport::default(); n],
                ..Report::default()
            },
            next_arrival: vec![Duration::ZERO; n],
            seq: 0,
            key: Bytes::from(vec![b'k'; p.load.key]),
            payload: Bytes::from(vec![0u8; p.load.payload]),
            measures: None,
            sampled_bytes: 0,
        }
    }

    fn sample(&mut self, now: Duration) {
        let pipe = self.egress.pipe();
        self.report.samples.push(Sample {
            at: now,
            acted: self.egress.link().bytes_per_sec,
            capacity: self.sched.capacity(),
            rates: self.sched.rates(),
            queued: self.queues.iter().map(|(_, q)| q.len()).collect(),
            in_flight: self.wire.flight.len(),
            pipe_bytes: pipe.in_flight_bytes(),
            pipe_batch: pipe.batch_bytes(),
            link_queue: self.wire.clear_at.saturating_sub(now),
            link_rate: (self.wire.bytes - self.sampled_bytes) as f64 / SAMPLE_EVERY.as_secs_f64(),
            measures: self.measures,
        });
        self.sampled_bytes = self.wire.bytes;
    }

    /// Queues the records due by `now`, each class at its fixed rate.
    fn arrivals(&mut self, now: Duration) {
        for (c, &rate) in self.p.load.rates.iter().enumerate() {
            if rate <= 0.0 {
                continue;
            }
            let every = Duration::from_secs_f64(1.0 / rate);
            while self.next_arrival[c] <= now {
                self.seq += 1;
                let at = self.next_arrival[c];
                let r = Record {
                    key: self.key.clone(),
                    class: ClassId(c as u8),
                    origin: 1,
                    seq: self.seq,
                    ingress_us: WALL0 + at.as_micros() as u64,
                    payload: self.payload.clone(),
                    spool: None,
                };
                let refused = self.queues.push(r).is_err();
                if at >= self.p.warm_up {
                    let cr = &mut self.report.classes[c];
                    cr.offered += 1;
                    cr.refused += u64::from(refused);
                }
                self.next_arrival[c] += every;
            }
        }
    }

    /// A serial link's send that returned by `now`.
    fn sends_done(&mut self, now: Duration) {
        if let Some(done) = self.wire.sending.filter(|&d| d <= now) {
            self.wire.sending = None;
            self.egress.handle_sent(done);
        }
    }

    /// Hands the egress every confirmation the destination sent by `now`.
    fn confirmations(&mut self, now: Duration) {
        while self.wire.flight.front().is_some_and(|s| s.confirms <= now) {
            let s = self.wire.flight.pop_front().expect("checked");
            self.egress.handle_confirm(s.confirms);
            self.wire.arrived.push_back(s.arrives);
        }
    }

    /// What the egress reports: confirmed records (their latencies), and
    /// what the scheduler hears of it.
    fn egress_events(&mut self) {
        while let Some(e) = self.egress.poll_event() {
            match e {
                DeliveryEvent::Confirmed(c) => {
                    let arrived = self.wire.arrived.pop_front().expect("one per confirmation");
                    self.delivered(&c.batch.batch, arrived);
                    self.handoff.delivered.push_back(Delivered {
                        class: c.batch.batch.class,
                        bytes: c.bytes as usize,
                        raw_bytes: c.bytes as usize,
                        records: c.batch.batch.records.len(),
                        elapsed: c.link_time,
                    });
                }
                DeliveryEvent::Link(l) => self.handoff.link = Some(l),
                DeliveryEvent::BatchBytes(b) => self.handoff.pipe_batch = Some(b),
                DeliveryEvent::Measures(m) => self.measures = Some(m),
                _ => {}
            }
        }
    }

    /// `batch` reached the destination at `arrived`.
    fn delivered(&mut self, batch: &OutBatch, arrived: Duration) {
        for r in &batch.records {
            let at = Duration::from_micros(r.ingress_us - WALL0);
            if at < self.p.warm_up {
                continue;
            }
            let latency = arrived.saturating_sub(at);
            let cr = &mut self.report.classes[r.class.index()];
            cr.delivered += 1;
            cr.latencies.push(latency);
            if latency > self.p.classes.get(r.class).bound {
                cr.late_at.push(at);
            }
        }
    }

    /// The egress driver: takes a built batch, gives the permit due, sends
    /// what the machine says onto the model link. Whether anything moved.
    fn egress_turn(&mut self, now: Duration) -> bool {
        let mut moved = false;
        if self.egress.may_receive() {
            if let Some(b) = self.handoff.channel.pop_front() {
                let bytes = b.bytes;
                self.egress.handle_batch(now, b, bytes);
                moved = true;
            }
        }
        match self.egress.poll_permit(now) {
            Some(Offer::Any) => {
                self.handoff.permits += 1;
                self.handoff.urgent_only = false;
            }
            Some(Offer::Urgent) => {
                self.handoff.permits += 1;
                self.handoff.urgent_only = true;
            }
            Some(Offer::Widen) => self.handoff.urgent_only = false,
            None => return self.send(now) || moved,
        }
        self.send(now);
        true
    }

    /// Sends every batch the egress lets go at `now`.
    fn send(&mut self, now: Duration) -> bool {
        let link = &self.p.link;
        let mut sent = false;
        while self.wire.sending.is_none() {
            let Some(b) = self.egress.poll_send(now) else {
                break;
            };
            let wire = (b.bytes as f64 * link.framing) as u64 + link.per_transaction;
            let transfer = Duration::from_secs_f64(wire as f64 / link.bytes_per_sec);
            self.wire.bytes += wire;
            if now >= self.p.warm_up {
                self.wire.counted += wire;
                self.wire.batches += 1;
                let c = &mut self.report.classes[b.batch.class.index()].batches;
                c.0 += 1;
                c.1 += b.bytes;
            }
            let arrives = match link.serial {
                true => {
                    let done = now + link.delay + transfer;
                    self.wire.clear_at = done;
                    self.wire.sending = Some(done);
                    done
                }
                false => {
                    self.wire.clear_at = self.wire.clear_at.max(now) + transfer;
                    self.wire.clear_at + link.delay
                }
            };
            let mut confirms = arrives + link.confirm;
            if !link.confirm_every.is_zero() {
                let every = link.confirm_every.as_nanos();
                let ticks = confirms.as_nanos().div_ceil(every);
                confirms = Duration::from_nanos(u64::try_from(ticks * every).unwrap_or(u64::MAX));
            }
            self.wire.flight.push_back(Sent { arrives, confirms });
            if !link.serial {
                self.egress.handle_sent(now);
            }
            sent = true;
        }
        sent
    }

    /// The scheduler driver: holds a permit, hears the egress, builds a
    /// batch under the permit. Whether it built one.
    fn scheduler_turn(&mut self, now: Duration) -> bool {
        let h = &mut self.handoff;
        if !h.link_free && h.permits > 0 {
            h.permits -= 1;
            h.link_free = true;
        }
        // The real driver is handed a permit only while the channel has
        // room; a batch built into a full one would be lost.
        if !h.link_free || h.channel.len() >= self.p.channel {
            return false;
        }
        while let Some(d) = h.delivered.pop_front() {
            self.sched.handle_delivered(d);
        }
        if let Some(l) = h.link.take() {
            self.sched.handle_link_estimate(l);
        }
        if let Some(b) = h.pipe_batch.take() {
            self.sched.handle_pipe_batch(b);
        }
        self.sched.poll_window(now, &self.queues, 0);
        while let Some(e) = self.sched.poll_event() {
            if let SchedulerEvent::Horizon(horizon) = e {
                self.egress.set_horizon(horizon);
            }
        }
        let wall = WALL0 + now.as_micros() as u64;
        let poll = match h.urgent_only {
            true => self.sched.poll_urgent_batch(now, wall, &self.queues),
            false => self.sched.poll_batch(now, wall, &self.queues),
        };
        match poll {
            Poll::Batch(batch) => {
                let bytes = encoded_bytes(&batch);
                h.channel.push_back(Built { batch, bytes });
                h.link_free = false;
                true
            }
            _ => false,
        }
    }

    fn finish(mut self) -> Report {
        let secs = self.p.duration.saturating_sub(self.p.warm_up).as_secs_f64();
        let r = &mut self.report;
        for c in &mut r.classes {
            c.latencies.sort();
        }
        r.link_bytes_per_sec = self.wire.counted as f64 / secs;
        r.batches = self.wire.batches;
        r.records_per_sec = r.classes.iter().map(|c| c.delivered as f64).sum::<f64>() / secs;
        self.report
    }
}

/// A batch's encoded size.
fn encoded_bytes(b: &OutBatch) -> u64 {
    WIRE_PER_BATCH
        + b.records
            .iter()
            .map(|r| (r.key.len() + r.payload.len()) as u64 + WIRE_PER_RECORD)
            .sum::<u64>()
}
