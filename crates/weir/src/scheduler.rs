//! The scheduler loop: every window it runs PBTT (JANUS Algorithm 1) and
//! installs BWAllocator's rates into the class token buckets, follows the
//! egress's online uplink estimate (`C_out`), and re-plans each class's
//! batches (buffer-aided relaying); in between it drains the class queues
//! into batches, most urgent class first, within those rates, and hands them
//! to the egress when the link is free. The decisions are all `weir-core`'s
//! ([`Pbtt`], [`Drainer`], [`BatchSizer`]); this file only owns time and
//! channels.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use weir_core::batching::{
    planning_bound, BatchPlan, BatchSizer, BatchingConfig, ClassTraffic, ReferencePolicy,
};
use weir_core::drain::{rider_budget, BatchLimits, Drain, Drainer};
use weir_core::janus::allocator::ClassLoad;
use weir_core::janus::pbtt::{Pbtt, PbttConfig};
use weir_core::janus::scheme::Scheme;
use weir_core::janus::Grant;
use weir_core::link_estimate::LinkEstimate;
use weir_core::peer::{BandwidthState, OwnRate};

use crate::egress::{Delivered, LinkReady, OutBatch};
use crate::ingress::IngressHandle;

/// Least rider budget (weir-core `drain::rider_budget`): a few records may
/// always share an urgent record's transaction, even on a very slow link.
const RIDER_FLOOR_BYTES: usize = 4096;

/// What the scheduler needs from the config.
#[derive(Debug, Clone)]
pub struct SchedulerParams {
    /// Node-level scheme: Native (one FIFO), QM-only or JANUS.
    pub scheme: Scheme,
    /// PBTT counting window `t`.
    pub window: Duration,
    /// `epsilon` of JANUS Eq. 1.
    pub processing_delay: Duration,
    /// `C_out`, bytes per second.
    pub capacity: f64,
    /// Token bucket depth per class, bytes.
    pub burst_bytes: f64,
    /// Largest batch.
    pub limits: BatchLimits,
    /// Whether batches wait for records per the buffer-aided relaying plan.
    pub adaptive: bool,
    /// Reference record `i` per class rank (Eq. 5-6).
    pub reference: Vec<u32>,
    /// Whether `C_out` follows the egress's uplink estimate.
    pub track_uplink: bool,
    /// Whether batches take riders of other classes (weir-core `drain`).
    pub mix_classes: bool,
    /// Sequence number of the first batch (seeded from the clock so a
    /// restart does not reuse numbers).
    pub first_batch_seq: u64,
}

/// What the egress reports back to the scheduler.
#[derive(Debug)]
pub struct Feedback {
    /// The egress's online uplink estimate.
    pub link: tokio::sync::watch::Receiver<LinkEstimate>,
    /// Completed transactions, for the per-class batch sizers.
    pub delivered: mpsc::Receiver<Delivered>,
    /// Peering, when configured.
    pub peer: Option<PeerPort>,
}

/// The scheduler's side of peering (docs/peering.md): it publishes its PBTT
/// state for the heartbeats, and moves the grants this node made as a
/// provider into its allocation (JANUS Fig. 4).
#[derive(Debug)]
pub struct PeerPort {
    /// The tuple and allocation after every window and every applied grant.
    pub state: tokio::sync::watch::Sender<BandwidthState>,
    /// Grants made as a provider, for `Pbtt::apply_grant`.
    pub shifts: mpsc::Receiver<Grant>,
}

impl PeerPort {
    fn publish(&self, pbtt: &Pbtt, own: &OwnLoad) {
        self.state.send_replace(BandwidthState {
            tuple: pbtt.tuple().clone(),
            allocation: pbtt.allocation().clone(),
            capacity: pbtt.capacity(),
            own_rate: own.rate.rate(),
            late: own.late,
        });
    }
}

/// What peering needs beside the tuple to know what this node can lend
/// (`weir_core::peer::lendable`).
#[derive(Debug)]
struct OwnLoad {
    /// The node's own arrivals (not peers'), smoothed.
    rate: OwnRate,
    /// Whether the last window found a class late (Eq. 1).
    late: bool,
}

/// A capacity change smaller than this fraction is not worth re-allocating
/// for (the estimate jitters from transaction to transaction).
const CAPACITY_HYSTERESIS: f64 = 0.05;

/// Weight of one transaction's raw-to-wire byte ratio in its running
/// average (compression lets the link carry more record bytes than its
/// wire rate; token buckets count record bytes).
const COMPRESSION_RATIO_EWMA: f64 = 0.1;

/// Weight of a window's mean record size in its running average.
const RECORD_SIZE_EWMA: f64 = 0.2;

/// Per-class batch planning state.
struct Planner {
    sizers: Vec<BatchSizer>,
    reference: ReferencePolicy,
    /// Running mean record size per class, bytes.
    mean_size: Vec<f64>,
    plans: Vec<BatchPlan>,
}

impl Planner {
    fn new(classes: usize, limits: BatchLimits, reference: Vec<u32>) -> Self {
        let cfg = BatchingConfig {
            max_batch_records: u32::try_from(limits.max_records).unwrap_or(u32::MAX),
            max_batch_bytes: limits.max_bytes as u64,
        };
        Planner {
            sizers: (0..classes).map(|_| BatchSizer::new(cfg)).collect(),
            reference: ReferencePolicy::ByRank(reference),
            mean_size: vec![0.0; classes],
            plans: vec![
                BatchPlan::unbatched(
                    limits.max_bytes as u64,
                    weir_core::batching::PlanReason::RateTooLow
                );
                classes
            ],
        }
    }

    /// Re-plans every class from the window's arrivals, against
    /// [`planning_bound`].
    fn replan(
        &mut self,
        classes: &weir_core::ClassSet,
        arrivals: &[(u64, u64)],
        window: Duration,
        link: &LinkEstimate,
        max_batch_bytes: usize,
    ) {
        let t = window.as_secs_f64();
        let single = Duration::from_secs_f64(
            link.transaction_secs(self.mean_size.iter().copied().fold(0.0, f64::max))
                .clamp(0.0, 3600.0),
        );
        for (rank, (class, c)) in classes.iter().enumerate() {
            let i = class.index();
            let (records, bytes) = arrivals[i];
            if records > 0 {
                let mean = bytes as f64 / records as f64;
                self.mean_size[i] = if self.mean_size[i] == 0.0 {
                    mean
                } else {
                    self.mean_size[i] + RECORD_SIZE_EWMA * (mean - self.mean_size[i])
                };
            }
            let traffic = ClassTraffic {
                arrival_rate: records as f64 / t,
                mean_record_bytes: self.mean_size[i],
                latency_bound: planning_bound(c.bound, link, max_batch_bytes as u64),
                reference: self.reference.reference(rank, c.bound, single),
            };
            self.plans[i] = self.sizers[i].plan(&traffic, link);
        }
    }
}

/// Everything the loop reports per window, for metrics and tests.
#[derive(Debug, Clone, Default)]
pub struct WindowReport {
    /// Per-class rates now in force, bytes/s.
    pub rates: Vec<f64>,
    /// Whether BWAllocator ran this window.
    pub reallocated: bool,
}

/// Runs until `stop` fires and the queues are empty, or until `abort` fires.
/// Dropping `out` when it returns lets the egress finish and exit.
pub async fn run(
    params: SchedulerParams,
    mut feedback: Feedback,
    ingress: Arc<IngressHandle>,
    out: mpsc::Sender<OutBatch>,
    ready: LinkReady,
    stop: CancellationToken,
    abort: CancellationToken,
) {
    let classes = ingress.classes().clone();
    let queues = Arc::clone(ingress.queues());
    let metrics = Arc::clone(ingress.metrics());
    let epoch = Instant::now();
    let now = || epoch.elapsed();

    let mut pbtt = if params.scheme.reallocates() {
        match Pbtt::new(
            &classes,
            PbttConfig {
                window: params.window,
                processing_delay: params.processing_delay,
                capacity: params.capacity,
            },
        ) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::error!(error = %e, "PBTT cannot start; draining at even shares");
                None
            }
        }
    } else {
        None
    };
    let initial: Vec<f64> = match &pbtt {
        Some(p) => p.allocation().rates.clone(),
        // Native: one FIFO gets the whole link.
        None if queues.classes() == 1 => vec![params.capacity],
        None => vec![params.capacity / queues.classes() as f64; queues.classes()],
    };
    let mut drainer = Drainer::new(&initial, params.burst_bytes, params.limits, now());
    drainer.set_mixing(params.mix_classes);
    // Native's single FIFO has no classes to mix, and no budgets.
    let per_class = queues.classes() == classes.len();
    let rider_budgets = |capacity: f64| -> Vec<usize> {
        if !per_class {
            return Vec::new();
        }
        classes
            .iter()
            .map(|(_, c)| rider_budget(c.bound, capacity, RIDER_FLOOR_BYTES))
            .collect()
    };
    drainer.set_rider_budgets(&rider_budgets(params.capacity));
    metrics.set_allocation(&initial);

    let mut last_arrived: Vec<(u64, u64)> = queues
        .iter()
        .map(|(_, q)| {
            let s = q.stats();
            (s.arrived_records, s.arrived_bytes)
        })
        .collect();
    // Batch plans only for class queues: Native's single FIFO mixes bounds.
    let mut planner = (params.adaptive && queues.classes() == classes.len())
        .then(|| Planner::new(classes.len(), params.limits, params.reference.clone()));
    let mut capacity = params.capacity;
    let mut own_load = OwnLoad {
        rate: OwnRate::new(ingress.foreign_bytes()),
        late: false,
    };
    let mut raw_per_wire = 1.0f64;
    let mut next_window = Instant::now() + params.window;
    let mut batch_seq = params.first_batch_seq;
    let mut stopping = false;
    let mut link_free = false;

    loop {
        if !link_free {
            // Cancel safety: `acquire` is cancel safe; a permit is only
            // consumed (forgotten) once held.
            tokio::select! {
                permit = ready.acquire() => match permit {
                    Ok(p) => {
                        p.forget();
                        link_free = true;
                    }
                    Err(_) => return,
                },
                _ = abort.cancelled() => {
                    report_abandoned(&ingress, 0, &mut drainer);
                    return;
                }
            }
        }
        // Completed transactions refine each class's L_up(s) fit.
        while let Ok(d) = feedback.delivered.try_recv() {
            if d.bytes > 0 {
                let ratio = (d.raw_bytes as f64 / d.bytes as f64).max(1.0);
                raw_per_wire += COMPRESSION_RATIO_EWMA * (ratio - raw_per_wire);
            }
            if let Some(p) = planner.as_mut() {
                if let Some(sizer) = p.sizers.get_mut(d.class.index()) {
                    sizer.observe(u32::try_from(d.records).unwrap_or(u32::MAX), d.elapsed);
                }
            }
        }
        // Reservations granted to peers move spare into their class (Fig. 4).
        if let (Some(port), Some(p)) = (feedback.peer.as_mut(), pbtt.as_mut()) {
            let mut moved = 0.0;
            while let Ok(grant) = port.shifts.try_recv() {
                moved += p.apply_grant(&grant);
            }
            if moved > 0.0 {
                drainer.set_rates(now(), &p.allocation().rates, capacity);
                metrics.set_allocation(&p.allocation().rates);
                port.publish(p, &own_load);
            }
        }
        if Instant::now() >= next_window {
            let t = params.window.as_secs_f64();
            let link = *feedback.link.borrow_and_update();
            let mut window_arrivals = Vec::with_capacity(queues.classes());
            let loads: Vec<ClassLoad> = queues
                .iter()
                .map(|(class, q)| {
                    let s = q.stats();
                    let (last_records, last_bytes) = last_arrived[class.index()];
                    let arrived = (
                        s.arrived_records - last_records,
                        s.arrived_bytes - last_bytes,
                    );
                    last_arrived[class.index()] = (s.arrived_records, s.arrived_bytes);
                    window_arrivals.push(arrived);
                    metrics.set_queued(class, s.len);
                    ClassLoad::new(
                        arrived.1 as f64 / t,
                        (s.bytes + drainer.held_bytes(class)) as f64,
                    )
                })
                .collect();
            // C_out in record bytes: the wire rate times what compression
            // currently saves.
            let record_rate = link.bytes_per_sec * raw_per_wire;
            if params.track_uplink
                && record_rate.is_finite()
                && record_rate > 0.0
                && (record_rate - capacity).abs() > CAPACITY_HYSTERESIS * capacity
            {
                capacity = record_rate;
                match pbtt.as_mut() {
                    Some(p) => match p.set_capacity(capacity) {
                        Ok(()) => drainer.set_rates(now(), &p.allocation().rates, capacity),
                        Err(e) => tracing::warn!(error = %e, "uplink estimate not applied"),
                    },
                    None => {
                        let n = queues.classes() as f64;
                        drainer.set_rates(now(), &vec![capacity / n; queues.classes()], capacity);
                    }
                }
                metrics.set_allocation(&drainer.rates());
                drainer.set_rider_budgets(&rider_budgets(capacity));
                tracing::debug!(capacity, "C_out follows the uplink estimate");
            }
            if let Some(p) = planner.as_mut() {
                p.replan(
                    &classes,
                    &window_arrivals,
                    params.window,
                    &link,
                    params.limits.max_bytes,
                );
            }
            own_load.rate.window(
                window_arrivals.iter().map(|a| a.1).sum(),
                ingress.foreign_bytes(),
                t,
            );
            if let Some(p) = pbtt.as_mut() {
                match p.on_window(&loads) {
                    Ok(decision) => {
                        own_load.late = decision.violated.iter().any(|&v| v);
                        if decision.reallocated {
                            drainer.set_rates(now(), &decision.allocation.rates, capacity);
                            metrics.set_allocation(&decision.allocation.rates);
                            tracing::debug!(rates = ?decision.allocation.rates, delays = ?decision.delays, "reallocated");
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "PBTT window skipped"),
                }
                if let Some(port) = &feedback.peer {
                    port.publish(p, &own_load);
                }
            }
            next_window = (next_window + params.window).max(Instant::now());
        }

        let plans = planner.as_ref().map(|p| p.plans.as_slice());
        match drainer.next_batch(now(), crate::ingress::unix_micros(), &queues, plans) {
            Drain::Batch { class, records } => {
                ingress.notify_space();
                let batch = OutBatch {
                    seq: batch_seq,
                    class,
                    records,
                };
                batch_seq += 1;
                link_free = false;
                // The egress announced it is waiting, so the channel has room.
                if let Err(e) = out.try_send(batch) {
                    let n = match &e {
                        mpsc::error::TrySendError::Full(b)
                        | mpsc::error::TrySendError::Closed(b) => b.records.len(),
                    };
                    report_abandoned(&ingress, n, &mut drainer);
                    return;
                }
            }
            Drain::Wait(d) => {
                let until = Instant::now()
                    .checked_add(d)
                    .map_or(next_window, |t| t.min(next_window));
                // Cancel safety: all branches only wait.
                tokio::select! {
                    _ = tokio::time::sleep_until(until) => {}
                    _ = ingress.arrived() => {}
                    _ = abort.cancelled() => {
                        report_abandoned(&ingress, 0, &mut drainer);
                        return;
                    }
                }
            }
            Drain::Empty => {
                if stopping {
                    tracing::info!("queues drained");
                    return;
                }
                // Cancel safety: all branches only wait.
                tokio::select! {
                    _ = ingress.arrived() => {}
                    _ = tokio::time::sleep_until(next_window) => {}
                    _ = stop.cancelled(), if !stopping => {
                        stopping = true;
                    }
                    _ = abort.cancelled() => return,
                }
            }
        }
        if !stopping && stop.is_cancelled() {
            stopping = true;
        }
    }
}

fn report_abandoned(ingress: &IngressHandle, in_hand: usize, drainer: &mut Drainer) {
    let held = drainer.take_heads().len();
    let queued = ingress.queues().total_len();
    let lost = in_hand + held + queued;
    if lost > 0 {
        tracing::error!(
            records = lost,
            "shutdown deadline passed before the queues drained; these records were not delivered"
        );
    }
}
