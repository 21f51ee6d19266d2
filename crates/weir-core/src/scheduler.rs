//! The scheduler's window step, sans-IO: what weir decides between a record
//! entering a class queue and a batch leaving for the link.
//!
//! Every window it runs PBTT (JANUS Algorithm 1) and installs BWAllocator's
//! rates into the class token buckets, follows the online uplink estimate
//! (`C_out`) with hysteresis, and re-plans each class's batches
//! (buffer-aided relaying, [`planner`]); in between it drains the class
//! queues into batches, most urgent class first, within those rates
//! ([`Drainer`]). The I/O driver (the relay's `scheduler` task) owns time,
//! channels and the link; it calls, in the shape of `quinn-proto`:
//! - `handle_*` with what happened: a transaction confirmed
//!   ([`Scheduler::handle_delivered`]), a grant made to a peer
//!   ([`Scheduler::handle_grant`]), a new uplink estimate
//!   ([`Scheduler::handle_link_estimate`]);
//! - [`Scheduler::poll_window`] when [`Scheduler::poll_timeout`] has come;
//! - [`Scheduler::poll_batch`] whenever the link is free, which returns the
//!   batch to send, or how long to wait;
//! - [`Scheduler::poll_event`] for what the driver should publish (rates
//!   for metrics, the PBTT state for peers, warnings for the log).
//!
//! Records arrive in the lock-free [`MultiLevelQueue`] directly from
//! ingress; the scheduler reads arrivals from the queues' counters, so an
//! arrival needs no call here, only a wake-up of the driver.
//!
//! Time is a [`Duration`] since an epoch of the caller's choosing; record
//! ages come from their `ingress_us` against the wall clock the caller
//! passes (`wall_us`), since records carry wall-clock stamps.

pub mod planner;

use std::collections::VecDeque;
use std::time::Duration;

use crate::admission;
use crate::batching::BatchLimits;
use crate::class::{ClassId, ClassSet};
use crate::janus::allocator::ClassLoad;
use crate::janus::pbtt::{Pbtt, PbttConfig};
use crate::janus::scheme::Scheme;
use crate::janus::{Grant, JanusError};
use crate::link_estimate::LinkEstimate;
use crate::peer::{BandwidthState, OwnRate};
use crate::queueing::drain::{rider_budget, Drain, Drainer};
use crate::queueing::queue::{MultiLevelQueue, QueueCapacity};
use crate::record::{Receipt, Record};

use planner::Planner;

/// Least rider budget ([`rider_budget`]): a few records may always share an
/// urgent record's transaction, even on a very slow link.
pub const RIDER_FLOOR_BYTES: usize = 4096;

/// A rise of capacity smaller than this fraction is not worth
/// re-allocating for (the estimate jitters from transaction to
/// transaction).
pub const CAPACITY_HYSTERESIS: f64 = 0.02;

/// A fall of capacity is followed from this fraction: less than
/// [`UPLINK_HEADROOM`], so `C_out` never stays above what the link carries
/// (at most `(1 - UPLINK_HEADROOM) / (1 - CAPACITY_FALL)`, 99 %, of the
/// estimate). With the rise's 2 % for falls too, a link 1.5 % under its
/// configured rate (what TCP carries of it, less framing) kept `C_out` at
/// the configured rate: 0.1 % above what the link carried, and in the
/// real-process JANUS lab its `tbf` queue grew to 110 kB and a third of
/// that node's `ls` records were late.
pub const CAPACITY_FALL: f64 = 0.005;

/// Share of the measured uplink `C_out` leaves unallocated when it follows
/// the estimate (`track_uplink`). The estimate is what the link carries
/// kept busy; allocating all of it runs a FIFO shaper (a modem's buffer,
/// `tc tbf`) at 100 %, where any jitter builds a standing queue that every
/// urgent record then waits behind: in the real-process JANUS lab at 1 KiB
/// (links at 99.7 %) 77 % of a busy node's `ls` records broke 100 ms.
/// A configured (pinned) uplink is taken as the operator gave it.
pub const UPLINK_HEADROOM: f64 = 0.015;

/// Weight of one transaction's raw-to-wire byte ratio in its running
/// average (compression lets the link carry more record bytes than its
/// wire rate; token buckets count record bytes).
pub const COMPRESSION_RATIO_EWMA: f64 = 0.1;

/// Everything the scheduler is configured with: the one parameter set of
/// the window step (the config's `[scheduler]` and `[batching]`).
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerParams {
    /// Node-level scheme: Native (one FIFO), QM-only or JANUS.
    pub scheme: Scheme,
    /// PBTT counting window `t`.
    pub window: Duration,
    /// `epsilon` of JANUS Eq. 1.
    pub processing_delay: Duration,
    /// `C_out` to start from, record bytes per second.
    pub capacity: f64,
    /// Token bucket depth per class, bytes; `None`: the batch cap in force
    /// (a bucketful is one batch, so tokens never cut a batch shorter than
    /// the pipe and the horizon allow).
    pub burst_bytes: Option<f64>,
    /// Largest batch.
    pub limits: BatchLimits,
    /// Whether batches wait for records per the buffer-aided relaying plan.
    pub adaptive: bool,
    /// Reference record `i` per class rank (Eq. 5-6).
    pub reference: Vec<u32>,
    /// Whether `C_out` follows the uplink estimate.
    pub track_uplink: bool,
    /// Whether batches take riders of other classes ([`crate::queueing::drain`]).
    pub mix_classes: bool,
    /// Shortest time between a batch and a following one that is not full
    /// ([`crate::queueing::drain`]'s gathering), within [`admission::gather`]'s cap.
    pub gather: Duration,
}

/// Why [`Scheduler::reconfigure`] refused new parameters; nothing changed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReconfigureError {
    /// The scheme decides the queues' shape (one FIFO or one per class).
    #[error("the scheme cannot change while running ({from} to {to})")]
    Scheme {
        /// The scheme in force.
        from: Scheme,
        /// The scheme asked for.
        to: Scheme,
    },
    /// Classes are queues, metrics labels and spool files: their number,
    /// names and order are fixed while running.
    #[error("the latency classes' number, names and order cannot change while running")]
    Classes,
    /// PBTT refused the new bounds, shares or capacity.
    #[error(transparent)]
    Janus(#[from] JanusError),
}

/// The queues a scheme drains: one per class, or for Native one FIFO as
/// large as the largest class queue (records and bytes taken separately).
pub fn queues_for(scheme: Scheme, capacities: &[QueueCapacity]) -> MultiLevelQueue {
    let queues = capacities_for(scheme, capacities);
    match scheme.uses_classes() {
        true => MultiLevelQueue::new(&queues),
        false => MultiLevelQueue::fifo(queues[0]),
    }
}

/// The bounds of the queues [`queues_for`] builds, in its order (for
/// [`MultiLevelQueue::set_capacities`] on a reload).
pub fn capacities_for(scheme: Scheme, capacities: &[QueueCapacity]) -> Vec<QueueCapacity> {
    if scheme.uses_classes() {
        return capacities.to_vec();
    }
    let largest = capacities.iter().fold(
        QueueCapacity {
            records: 0,
            bytes: 0,
        },
        |acc, c| QueueCapacity {
            records: acc.records.max(c.records),
            bytes: acc.bytes.max(c.bytes),
        },
    );
    vec![largest]
}

/// A batch closed by the scheduler: records grouped by class, most urgent
/// first, each class oldest first (one class unless batches mix classes).
#[derive(Debug, Clone, PartialEq)]
pub struct OutBatch {
    /// Per-node batch sequence number.
    pub seq: u64,
    /// The most urgent class among the records.
    pub class: ClassId,
    /// The records.
    pub records: Vec<Record>,
}

impl OutBatch {
    /// Records per class, in the batch's order: `(class, records, bytes)`
    /// for each run of one class.
    pub fn class_runs(&self) -> Vec<(ClassId, usize, usize)> {
        let mut runs: Vec<(ClassId, usize, usize)> = Vec::new();
        for r in &self.records {
            match runs.last_mut() {
                Some((c, n, b)) if *c == r.class => {
                    *n += 1;
                    *b += r.size();
                }
                _ => runs.push((r.class, 1, r.size())),
            }
        }
        runs
    }

    /// Bytes of the records ([`Record::size`]).
    pub fn bytes(&self) -> usize {
        self.records.iter().map(Record::size).sum()
    }

    /// The receipts of its records ([`Receipt`]): what the egress keeps
    /// of the batch once it is encoded, until it is confirmed.
    pub fn receipts(&self) -> Vec<Receipt> {
        self.records.iter().map(Receipt::from).collect()
    }
}

/// One confirmed transaction, as the egress reports it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Delivered {
    /// The batch's class.
    pub class: ClassId,
    /// Body bytes sent (after compression).
    pub bytes: usize,
    /// Body bytes before compression: `raw_bytes / bytes` is how much more
    /// record data the link carried than its wire rate.
    pub raw_bytes: usize,
    /// Records in the batch.
    pub records: usize,
    /// Wall time from the start of the delivery to its confirmation.
    pub elapsed: Duration,
}

/// What the driver should act on, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The per-class rates in force changed (bytes/s, by class index).
    Rates(Vec<f64>),
    /// BWAllocator re-allocated this window (for the debug log).
    Reallocated {
        /// The new rates.
        rates: Vec<f64>,
        /// Eq. 1's estimated delay per class, seconds.
        delays: Vec<f64>,
    },
    /// `C_out` now follows the uplink estimate (record bytes/s).
    CapacityFollowed(f64),
    /// The PBTT state peers should hear (after every window and every
    /// grant); only with [`Scheduler::publish_peer_state`].
    PeerState(BandwidthState),
    /// The horizon changed ([`crate::admission`]): what the egress may
    /// have unconfirmed must clear the link within it.
    Horizon(Duration),
    /// Something went wrong that the scheduler works around; for the log.
    Warning(SchedulerWarning),
}

/// A problem the scheduler worked around.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SchedulerWarning {
    /// PBTT could not start; classes drain at even shares of `C_out`.
    #[error("PBTT cannot start ({0}); draining at even shares")]
    PbttUnavailable(JanusError),
    /// A new uplink estimate was not applied.
    #[error("uplink estimate not applied: {0}")]
    CapacityRejected(JanusError),
    /// PBTT skipped a window.
    #[error("PBTT window skipped: {0}")]
    WindowSkipped(JanusError),
}

/// What [`Scheduler::poll_batch`] found.
#[derive(Debug, PartialEq)]
pub enum Poll {
    /// Send this batch now.
    Batch(OutBatch),
    /// Records wait but none may go yet; call again at this time (never
    /// later than the next window).
    Wait(Duration),
    /// Records wait for a partial batch to gather (the drainer's gathering):
    /// call again at this time; arrivals before it need not wake the caller.
    Gather(Duration),
    /// Nothing waits anywhere; call again on an arrival or at the next
    /// window ([`Scheduler::poll_timeout`]).
    Empty,
}

/// What peering needs beside the tuple to know what this node can lend
/// ([`crate::peer::lendable`]).
#[derive(Debug, Clone)]
struct OwnLoad {
    /// The node's own arrivals (not peers'), smoothed.
    rate: OwnRate,
    /// Whether the last window found a class late (Eq. 1).
    late: bool,
}

/// The scheduler's state between calls.
#[derive(Debug)]
pub struct Scheduler {
    params: SchedulerParams,
    classes: ClassSet,
    queue_count: usize,
    pbtt: Option<Pbtt>,
    drainer: Drainer,
    planner: Option<Planner>,
    capacity: f64,
    raw_per_wire: f64,
    own: OwnLoad,
    last_arrived: Vec<(u64, u64)>,
    link: LinkEstimate,
    /// The link as configured: what `link` stays at without tracking.
    prior: LinkEstimate,
    next_window: Duration,
    next_seq: u64,
    publish_peer_state: bool,
    events: VecDeque<Event>,
    /// The tightest bound among classes with traffic (all classes until
    /// the first window has seen any).
    tightest: Duration,
    /// The batch size the egress's pipe asks for, once it has said.
    pipe_batch: Option<usize>,
    /// The latest time a `poll_*` or `reconfigure` was called with.
    clock: Duration,
    /// Bytes of each class spooled on disk and not yet back in its queue,
    /// by class index ([`Scheduler::handle_spooled`]).
    spooled: Vec<u64>,
}

impl Scheduler {
    /// A scheduler over `queues` (one per class of `classes`, or Native's
    /// single FIFO) starting at `now`, with the uplink estimate `link`, the
    /// foreign-bytes counter as it is now (see [`OwnRate`]), and batch
    /// sequence numbers from `first_batch_seq`.
    pub fn new(
        params: SchedulerParams,
        classes: ClassSet,
        queues: &MultiLevelQueue,
        link: LinkEstimate,
        foreign_bytes: u64,
        first_batch_seq: u64,
        now: Duration,
    ) -> Self {
        let mut events = VecDeque::new();
        let pbtt = if params.scheme.reallocates() {
            let config = PbttConfig {
                window: params.window,
                processing_delay: params.processing_delay,
                capacity: params.capacity,
            };
            match Pbtt::new(&classes, config) {
                Ok(p) => Some(p),
                Err(e) => {
                    events.push_back(Event::Warning(SchedulerWarning::PbttUnavailable(e)));
                    None
                }
            }
        } else {
            None
        };
        let queue_count = queues.classes();
        let initial: Vec<f64> = match &pbtt {
            Some(p) => p.allocation().rates.clone(),
            // Native: one FIFO gets the whole link.
            None if queue_count == 1 => vec![params.capacity],
            None => vec![params.capacity / queue_count as f64; queue_count],
        };
        let burst = params.burst_bytes.unwrap_or(params.limits.max_bytes as f64);
        let mut drainer = Drainer::new(&initial, burst, params.limits, now);
        drainer.set_mixing(params.mix_classes);
        // Batch plans only for class queues: Native's single FIFO mixes bounds.
        let planner = (params.adaptive && queue_count == classes.len())
            .then(|| Planner::new(classes.len(), params.limits, params.reference.clone()));
        let last_arrived = queues
            .iter()
            .map(|(_, q)| {
                let s = q.stats();
                (s.arrived_records, s.arrived_bytes)
            })
            .collect();
        events.push_back(Event::Rates(initial));
        let mut s = Scheduler {
            capacity: params.capacity,
            next_window: now + params.window,
            classes,
            queue_count,
            pbtt,
            drainer,
            planner,
            raw_per_wire: 1.0,
            own: OwnLoad {
                rate: OwnRate::new(foreign_bytes),
                late: false,
            },
            last_arrived,
            link,
            prior: link,
            next_seq: first_batch_seq,
            publish_peer_state: false,
            events,
            tightest: Duration::MAX,
            pipe_batch: None,
            clock: now,
            spooled: Vec::new(),
            params,
        };
        s.drainer.set_rider_budgets(&s.rider_budgets());
        s.set_tightest(s.classes.iter().map(|(_, c)| c.bound).min());
        s
    }

    /// Whether [`Event::PeerState`] is emitted (a node with peers).
    pub fn publish_peer_state(&mut self, on: bool) {
        self.publish_peer_state = on;
    }

    /// Whether there is a queue per class (not Native's single FIFO).
    fn per_class(&self) -> bool {
        self.queue_count == self.classes.len()
    }

    /// The per-class rider budgets at the current `C_out` (none for
    /// Native's FIFO, which has no classes to mix). Where a capped batch's
    /// transaction fits the horizon, riders may fill a batch up to the cap:
    /// the cap already keeps every transaction within it ([`admission`]).
    /// Not for a class more urgent than the horizon's (one without traffic
    /// in the last window): batches may be larger than its bound allows,
    /// so its own transaction stays short.
    fn rider_budgets(&self) -> Vec<usize> {
        if !self.per_class() {
            return Vec::new();
        }
        let horizon = self.horizon();
        let cap = admission::batch_cap(&self.link, horizon);
        let fits = admission::drain_time(1, cap as u64, &self.link) <= horizon;
        self.classes
            .iter()
            .map(|(_, c)| {
                let own = rider_budget(c.bound, self.capacity, RIDER_FLOOR_BYTES);
                match fits && c.bound >= self.tightest {
                    true => own.max(cap),
                    false => own,
                }
            })
            .collect()
    }

    /// Applies new parameters and class bounds and shares at `now` (a config
    /// reload), keeping every queued and held record, the token credit
    /// (up to the new burst depth), the uplink estimate and, when the batch
    /// limits and references are unchanged, the learned batch fits. PBTT
    /// restarts from the new bounds at the `C_out` in force (tracked) or
    /// configured, and the next window comes a full new window from `now`.
    /// The scheme and the classes' names and order cannot change.
    pub fn reconfigure(
        &mut self,
        now: Duration,
        params: SchedulerParams,
        classes: ClassSet,
    ) -> Result<(), ReconfigureError> {
        if params.scheme != self.params.scheme {
            return Err(ReconfigureError::Scheme {
                from: self.params.scheme,
                to: params.scheme,
            });
        }
        let same_names = classes.len() == self.classes.len()
            && classes
                .iter()
                .zip(self.classes.iter())
                .all(|((_, a), (_, b))| a.name == b.name);
        if !same_names {
            return Err(ReconfigureError::Classes);
        }
        let capacity = if params.track_uplink && self.params.track_uplink {
            self.capacity
        } else {
            params.capacity
        };
        let pbtt = match params.scheme.reallocates() {
            true => Some(Pbtt::new(
                &classes,
                PbttConfig {
                    window: params.window,
                    processing_delay: params.processing_delay,
                    capacity,
                },
            )?),
            false => None,
        };
        // Checked: from here on nothing can fail.
        let rates: Vec<f64> = match &pbtt {
            Some(p) => p.allocation().rates.clone(),
            None => vec![capacity / self.queue_count as f64; self.queue_count],
        };
        self.pbtt = pbtt;
        self.capacity = capacity;
        self.clock = self.clock.max(now);
        if let Some(b) = params.burst_bytes {
            self.drainer.set_burst_bytes(now, b);
        }
        self.drainer.set_rates(now, &rates, capacity);
        self.drainer.set_limits(params.limits);
        self.drainer.set_mixing(params.mix_classes);
        let keep_fits = self.planner.is_some()
            && params.adaptive
            && params.limits == self.params.limits
            && params.reference == self.params.reference;
        if !keep_fits {
            self.planner = (params.adaptive && self.per_class())
                .then(|| Planner::new(classes.len(), params.limits, params.reference.clone()));
        }
        self.classes = classes;
        self.next_window = now + params.window;
        if !params.track_uplink {
            self.link = self.prior;
        }
        self.params = params;
        // The bounds may have changed: all classes count until the next
        // window says which have traffic.
        self.tightest = Duration::MAX;
        self.set_tightest(self.classes.iter().map(|(_, c)| c.bound).min());
        let budgets = self.rider_budgets();
        self.drainer.set_rider_budgets(&budgets);
        self.events.push_back(Event::Rates(rates));
        self.push_peer_state();
        Ok(())
    }

    /// The link the scheduler plans with: the estimate, or the configured
    /// link without `track_uplink`.
    pub fn link(&self) -> LinkEstimate {
        self.link
    }

    /// The horizon in force ([`crate::admission::horizon`]).
    pub fn horizon(&self) -> Duration {
        admission::horizon(self.tightest)
    }

    /// Sets the tightest bound in play (`None`: keep the one in force),
    /// announces a new horizon, and caps batches to it.
    fn set_tightest(&mut self, tightest: Option<Duration>) {
        if let Some(t) = tightest {
            if t != self.tightest {
                self.tightest = t;
                self.events.push_back(Event::Horizon(self.horizon()));
            }
        }
        self.cap_batches();
    }

    /// Batch limits within the batch cap at the current link estimate, and
    /// the rider budgets that follow it.
    fn cap_batches(&mut self) {
        let cap = admission::batch_cap(&self.link, self.horizon());
        let pipe = self.pipe_batch.unwrap_or(usize::MAX);
        let max_bytes = self.params.limits.max_bytes.min(cap).min(pipe);
        self.drainer.set_limits(BatchLimits {
            max_bytes,
            ..self.params.limits
        });
        if self.params.burst_bytes.is_none() {
            self.drainer.set_burst_bytes(self.clock, max_bytes as f64);
        }
        let budgets = self.rider_budgets();
        self.drainer.set_rider_budgets(&budgets);
        self.drainer
            .set_gather(admission::gather(self.params.gather, self.horizon()));
    }

    /// `C_out` in force, record bytes per second.
    pub fn capacity(&self) -> f64 {
        self.capacity
    }

    /// The per-class rates in force.
    pub fn rates(&self) -> Vec<f64> {
        self.drainer.rates()
    }

    /// When the next window is due: the latest the driver may sleep until.
    pub fn poll_timeout(&self) -> Duration {
        self.next_window
    }

    /// The next thing for the driver to publish or log.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// A transaction was confirmed: it refines the compression ratio that
    /// turns the wire rate into record bytes, and its class's `L_up(s)` fit.
    pub fn handle_delivered(&mut self, d: Delivered) {
        if d.bytes > 0 {
            let ratio = (d.raw_bytes as f64 / d.bytes as f64).max(1.0);
            self.raw_per_wire += COMPRESSION_RATIO_EWMA * (ratio - self.raw_per_wire);
        }
        if let Some(p) = self.planner.as_mut() {
            p.observe(d.class, d.records, d.elapsed);
        }
    }

    /// This node, as a provider, reserved spare for a peer: the spare moves
    /// into the grant's class (JANUS Fig. 4). Returns the rate moved.
    pub fn handle_grant(&mut self, now: Duration, grant: &Grant) -> f64 {
        let Some(p) = self.pbtt.as_mut() else {
            return 0.0;
        };
        let moved = p.apply_grant(grant);
        if moved > 0.0 {
            let rates = p.allocation().rates.clone();
            self.drainer.set_rates(now, &rates, self.capacity);
            self.events.push_back(Event::Rates(rates));
            self.push_peer_state();
        }
        moved
    }

    /// Whether [`Scheduler::poll_window`] would run its window step at
    /// `now` (what a driver asks before gathering figures for it).
    pub fn window_due(&self, now: Duration) -> bool {
        now >= self.next_window
    }

    /// The bytes of each class (by class index) spooled on disk and not
    /// yet read back into its queue: backlog that PBTT counts with the
    /// queue's own at the next window. Without it, a class whose backlog
    /// is mostly on disk would look as short as its queue's window of it,
    /// and a less urgent class with a fuller queue could take the link
    /// from it while both drain after an outage.
    pub fn handle_spooled(&mut self, behind: &[u64]) {
        self.spooled.clear();
        self.spooled.extend_from_slice(behind);
    }

    /// The egress's pipe asks for batches of `bytes`
    /// ([`crate::delivery::pipe`]): the batch cap in force is that, within
    /// `max_batch_bytes` and what the link carries within the horizon.
    pub fn handle_pipe_batch(&mut self, bytes: u64) {
        self.pipe_batch = Some(usize::try_from(bytes).unwrap_or(usize::MAX));
        self.cap_batches();
    }

    /// The uplink estimate changed; it is used from the next window on,
    /// unless `track_uplink` is off: then the link is the one configured
    /// (for `C_out`, the batch cap, the rider budgets and the plans alike),
    /// since the operator pinned it.
    pub fn handle_link_estimate(&mut self, link: LinkEstimate) {
        if !self.params.track_uplink {
            return;
        }
        self.link = link;
        self.cap_batches();
    }

    fn push_peer_state(&mut self) {
        if !self.publish_peer_state {
            return;
        }
        if let Some(p) = &self.pbtt {
            self.events.push_back(Event::PeerState(BandwidthState {
                tuple: p.tuple().clone(),
                allocation: p.allocation().clone(),
                capacity: p.capacity(),
                own_rate: self.own.rate.rate(),
                late: self.own.late,
            }));
        }
    }

    /// Runs the window step if it is due at `now`: reads each queue's
    /// arrivals since the last window, follows the uplink estimate, re-plans
    /// batches, updates the node's own rate (arrivals less the
    /// `foreign_bytes` counter's growth) and runs PBTT. Returns whether it
    /// ran.
    pub fn poll_window(
        &mut self,
        now: Duration,
        queues: &MultiLevelQueue,
        foreign_bytes: u64,
    ) -> bool {
        self.clock = self.clock.max(now);
        if now < self.next_window {
            return false;
        }
        let window = self.params.window;
        let t = window.as_secs_f64();
        let mut window_arrivals = Vec::with_capacity(self.queue_count);
        let loads: Vec<ClassLoad> = queues
            .iter()
            .map(|(class, q)| {
                let s = q.stats();
                let (last_records, last_bytes) = self.last_arrived[class.index()];
                let arrived = (
                    s.arrived_records - last_records,
                    s.arrived_bytes - last_bytes,
                );
                self.last_arrived[class.index()] = (s.arrived_records, s.arrived_bytes);
                window_arrivals.push(arrived);
                ClassLoad::new(
                    arrived.1 as f64 / t,
                    (s.bytes as u64
                        + self.drainer.held_bytes(class) as u64
                        + self.spooled.get(class.index()).copied().unwrap_or(0))
                        as f64,
                )
            })
            .collect();
        self.follow_uplink(now);
        // The horizon follows the classes that have traffic.
        let active = match self.per_class() {
            true => self
                .classes
                .iter()
                .zip(&window_arrivals)
                .filter(|(_, a)| a.0 > 0)
                .map(|((_, c), _)| c.bound)
                .min(),
            false => self.classes.iter().map(|(_, c)| c.bound).min(),
        };
        self.set_tightest(active);
        if let Some(p) = self.planner.as_mut() {
            p.replan(&self.classes, &window_arrivals, window, &self.link);
        }
        self.own
            .rate
            .window(window_arrivals.iter().map(|a| a.1).sum(), foreign_bytes, t);
        if let Some(p) = self.pbtt.as_mut() {
            match p.on_window(&loads) {
                Ok(decision) => {
                    self.own.late = decision.violated.iter().any(|&v| v);
                    if decision.reallocated {
                        let rates = decision.allocation.rates;
                        self.drainer.set_rates(now, &rates, self.capacity);
                        self.events.push_back(Event::Rates(rates.clone()));
                        self.events.push_back(Event::Reallocated {
                            rates,
                            delays: decision.delays,
                        });
                    }
                }
                Err(e) => self
                    .events
                    .push_back(Event::Warning(SchedulerWarning::WindowSkipped(e))),
            }
            self.push_peer_state();
        }
        self.next_window = (self.next_window + window).max(now);
        true
    }

    /// `C_out` in record bytes follows the wire rate times what compression
    /// currently saves, less [`UPLINK_HEADROOM`], when tracking is on and
    /// the change passes the hysteresis ([`CAPACITY_HYSTERESIS`] up,
    /// [`CAPACITY_FALL`] down).
    fn follow_uplink(&mut self, now: Duration) {
        let record_rate = self.link.bytes_per_sec * self.raw_per_wire * (1.0 - UPLINK_HEADROOM);
        let beyond = match record_rate > self.capacity {
            true => record_rate - self.capacity > CAPACITY_HYSTERESIS * self.capacity,
            false => self.capacity - record_rate > CAPACITY_FALL * self.capacity,
        };
        if !(self.params.track_uplink && record_rate.is_finite() && record_rate > 0.0 && beyond) {
            return;
        }
        self.capacity = record_rate;
        match self.pbtt.as_mut() {
            Some(p) => match p.set_capacity(record_rate) {
                Ok(()) => {
                    let rates = p.allocation().rates.clone();
                    self.drainer.set_rates(now, &rates, record_rate);
                }
                Err(e) => self
                    .events
                    .push_back(Event::Warning(SchedulerWarning::CapacityRejected(e))),
            },
            None => {
                let n = self.queue_count;
                self.drainer
                    .set_rates(now, &vec![record_rate / n as f64; n], record_rate);
            }
        }
        self.events.push_back(Event::Rates(self.drainer.rates()));
        let budgets = self.rider_budgets();
        self.drainer.set_rider_budgets(&budgets);
        self.events.push_back(Event::CapacityFollowed(record_rate));
    }

    /// The batch to send at `now` if the link is free, most urgent class
    /// that may send first; or how long until one may (never past the next
    /// window). Record ages are measured against `wall_us`.
    pub fn poll_batch(&mut self, now: Duration, wall_us: u64, queues: &MultiLevelQueue) -> Poll {
        self.clock = self.clock.max(now);
        let plans = self.planner.as_ref().map(Planner::plans);
        let drain = self.drainer.next_batch(now, wall_us, queues, plans);
        self.polled(now, drain)
    }

    /// What the drain found, as the driver acts on it: a batch numbered
    /// in order, or until when to wait (never past the next window).
    fn polled(&mut self, now: Duration, drain: Drain) -> Poll {
        match drain {
            Drain::Batch { class, records } => {
                let seq = self.next_seq;
                self.next_seq += 1;
                Poll::Batch(OutBatch {
                    seq,
                    class,
                    records,
                })
            }
            Drain::Wait(d) => Poll::Wait(now.saturating_add(d).min(self.next_window)),
            Drain::Gather(d) => Poll::Gather(now.saturating_add(d)),
            Drain::Empty => Poll::Empty,
        }
    }

    /// A batch of the most urgent class alone, for a slot beyond the
    /// egress's window of unconfirmed batches (the *urgent lane*,
    /// [`Drainer::next_urgent`]): [`Poll::Empty`] when that class has
    /// nothing queued, and always for Native's single FIFO.
    pub fn poll_urgent_batch(
        &mut self,
        now: Duration,
        wall_us: u64,
        queues: &MultiLevelQueue,
    ) -> Poll {
        if !self.per_class() {
            return Poll::Empty;
        }
        let plans = self.planner.as_ref().map(Planner::plans);
        let drain = self.drainer.next_urgent(now, wall_us, queues, plans);
        self.polled(now, drain)
    }

    /// Takes back every record popped from a queue but not yet sent (for
    /// the count of what an aborted shutdown leaves behind).
    pub fn take_held(&mut self) -> Vec<Record> {
        self.drainer.take_heads()
    }
}

#[cfg(test)]
mod tests;
