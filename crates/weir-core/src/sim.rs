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
use crate::queue::QueueCapacity;
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
    /// The last uplink estimate the egress acted on, bytes per second.
    pub acted_bytes_per_sec: f64,
    /// The last batch size the pipe asked for.
    pub pipe_batch: u64,
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

/// A batch sent and not yet confirmed.
struct Sent {
    arrives: Duration,
    confirms: Duration,
}

/// Runs the simulation.
pub fn run(p: &SimParams) -> Report {
    let caps = capacities_for(p.scheduler.scheme, &p.capacities);
    let queues = queues_for(p.scheduler.scheme, &caps);
    let mut now = Duration::ZERO;
    let wall = |t: Duration| WALL0 + t.as_micros() as u64;
    let prior = p.delivery.link_prior;
    let mut sched = Scheduler::new(
        p.scheduler.clone(),
        p.classes.clone(),
        &queues,
        prior,
        0,
        1,
        now,
    );
    let mut egress: Delivery<OutBatch> = Delivery::new(p.delivery.clone(), now);
    let n = p.classes.len();
    let mut report = Report {
        classes: vec![ClassReport::default(); n],
        ..Report::default()
    };
    let interval: Vec<Option<Duration>> = p
        .load
        .rates
        .iter()
        .map(|&r| (r > 0.0).then(|| Duration::from_secs_f64(1.0 / r)))
        .collect();
    let mut next_arrival = vec![Duration::ZERO; n];
    let mut seq = 0u64;
    let key = Bytes::from(vec![b'k'; p.load.key]);
    let payload = Bytes::from(vec![0u8; p.load.payload]);

    // The drivers' shared state.
    let mut permits = 0usize;
    let mut urgent_only = false;
    let mut link_free = false;
    let mut channel: VecDeque<OutBatch> = VecDeque::new();
    let mut delivered: VecDeque<Delivered> = VecDeque::new();
    let mut link_estimate = prior;
    let mut link_changed = false;
    let mut pipe_batch: Option<u64> = None;
    let mut horizon = Duration::MAX;
    // The model link and destination.
    let mut link_clear = Duration::ZERO;
    let mut flight: VecDeque<Sent> = VecDeque::new();
    let mut link_bytes = 0u64;
    // Arrival times of the batches confirmed and not yet reported.
    let mut arrived: VecDeque<Duration> = VecDeque::new();
    let end = p.duration;

    let mut next_sample = Duration::ZERO;
    let mut measures = None;
    let mut sampled_bytes = 0u64;
    let mut all_bytes = 0u64;
    while now < end {
        if now >= next_sample {
            report.samples.push(Sample {
                at: now,
                acted: egress.link().bytes_per_sec,
                capacity: sched.capacity(),
                rates: sched.rates(),
                queued: queues.iter().map(|(_, q)| q.len()).collect(),
                in_flight: flight.len(),
                pipe_bytes: egress.pipe().in_flight_bytes(),
                pipe_batch: egress.pipe().batch_bytes(),
                link_queue: link_clear.saturating_sub(now),
                link_rate: (all_bytes - sampled_bytes) as f64 / SAMPLE_EVERY.as_secs_f64(),
                measures,
            });
            sampled_bytes = all_bytes;
            next_sample += SAMPLE_EVERY;
        }
        // Arrivals.
        for c in 0..n {
            let Some(every) = interval[c] else { continue };
            while next_arrival[c] <= now {
                seq += 1;
                let r = Record {
                    key: key.clone(),
                    class: ClassId(c as u8),
                    origin: 1,
                    seq,
                    ingress_us: wall(next_arrival[c]),
                    payload: payload.clone(),
                    spool: None,
                };
                let counted = next_arrival[c] >= p.warm_up;
                if counted {
                    report.classes[c].offered += 1;
                }
                if queues.push(r).is_err() && counted {
                    report.classes[c].refused += 1;
                }
                next_arrival[c] += every;
            }
        }
        // Confirmations due.
        while flight.front().is_some_and(|s| s.confirms <= now) {
            let s = flight.pop_front().expect("checked");
            egress.handle_confirm(s.confirms);
            arrived.push_back(s.arrives);
        }
        // Both drivers, until neither moves.
        for _ in 0..16 {
            let mut moved = false;
            // The egress's events.
            while let Some(e) = egress.poll_event() {
                match e {
                    DeliveryEvent::Confirmed(c) => {
                        let b = &c.batch;
                        let sent = arrived.pop_front().expect("one per confirmation");
                        for r in &b.records {
                            let at = r.ingress_us - WALL0;
                            if Duration::from_micros(at) < p.warm_up {
                                continue;
                            }
                            let latency = sent.saturating_sub(Duration::from_micros(at));
                            let cr = &mut report.classes[r.class.index()];
                            cr.delivered += 1;
                            cr.latencies.push(latency);
                            if latency > p.classes.get(r.class).bound {
                                cr.late_at.push(Duration::from_micros(at));
                            }
                        }
                        delivered.push_back(Delivered {
                            class: b.class,
                            bytes: c.bytes as usize,
                            raw_bytes: c.bytes as usize,
                            records: b.records.len(),
                            elapsed: c.link_time,
                        });
                    }
                    DeliveryEvent::Link(l) => {
                        link_estimate = l;
                        link_changed = true;
                    }
                    DeliveryEvent::BatchBytes(b) => pipe_batch = Some(b),
                    DeliveryEvent::Measures(m) => measures = Some(m),
                    _ => {}
                }
            }
            // The egress: takes a batch, gives a permit, sends.
            if egress.may_receive() {
                if let Some(b) = channel.pop_front() {
                    let bytes = encoded_bytes(&b);
                    egress.handle_batch(now, b, bytes);
                    moved = true;
                }
            }
            egress.set_horizon(horizon);
            match egress.poll_permit(now) {
                Some(Offer::Any) => {
                    permits += 1;
                    urgent_only = false;
                    moved = true;
                }
                Some(Offer::Urgent) => {
                    permits += 1;
                    urgent_only = true;
                    moved = true;
                }
                Some(Offer::Widen) => {
                    urgent_only = false;
                    moved = true;
                }
                None => {}
            }
            while let Some(b) = egress.poll_send(now) {
                let body = encoded_bytes(b);
                let wire = (body as f64 * p.link.framing) as u64 + p.link.per_transaction;
                let start = link_clear.max(now);
                link_clear = start + Duration::from_secs_f64(wire as f64 / p.link.bytes_per_sec);
                all_bytes += wire;
                if now >= p.warm_up {
                    link_bytes += wire;
                    report.batches += 1;
                }
                let arrives = link_clear + p.link.delay;
                let mut confirms = arrives + p.link.confirm;
                if !p.link.confirm_every.is_zero() {
                    let every = p.link.confirm_every.as_nanos();
                    let ticks = confirms.as_nanos().div_ceil(every);
                    confirms =
                        Duration::from_nanos(u64::try_from(ticks * every).unwrap_or(u64::MAX));
                }
                flight.push_back(Sent { arrives, confirms });
                egress.handle_sent(now);
                moved = true;
            }
            // The scheduler: holds a permit, builds a batch under it.
            if !link_free && permits > 0 {
                permits -= 1;
                link_free = true;
            }
            if link_free {
                while let Some(d) = delivered.pop_front() {
                    sched.handle_delivered(d);
                }
                if std::mem::take(&mut link_changed) {
                    sched.handle_link_estimate(link_estimate);
                }
                if let Some(b) = pipe_batch.take() {
                    sched.handle_pipe_batch(b);
                }
                sched.poll_window(now, &queues, 0);
                while let Some(e) = sched.poll_event() {
                    if let SchedulerEvent::Horizon(h) = e {
                        horizon = h;
                    }
                }
                let poll = match urgent_only {
                    true => sched.poll_urgent_batch(now, wall(now), &queues),
                    false => sched.poll_batch(now, wall(now), &queues),
                };
                if let Poll::Batch(b) = poll {
                    if channel.len() < p.channel {
                        channel.push_back(b);
                        link_free = false;
                        moved = true;
                    }
                }
            }
            if !moved {
                break;
            }
        }
        now += p.step;
    }
    let secs = end.saturating_sub(p.warm_up).as_secs_f64();
    for c in &mut report.classes {
        c.latencies.sort();
    }
    report.link_bytes_per_sec = link_bytes as f64 / secs;
    report.records_per_sec = report
        .classes
        .iter()
        .map(|c| c.delivered as f64)
        .sum::<f64>()
        / secs;
    report.acted_bytes_per_sec = egress.link().bytes_per_sec;
    report.pipe_batch = egress.pipe().batch_bytes();
    report
}

/// A batch's encoded size.
fn encoded_bytes(b: &OutBatch) -> u64 {
    WIRE_PER_BATCH
        + b.records
            .iter()
            .map(|r| (r.key.len() + r.payload.len()) as u64 + WIRE_PER_RECORD)
            .sum::<u64>()
}
