//! The scheduler loop: every window it runs PBTT (JANUS Algorithm 1) and
//! installs BWAllocator's rates into the class token buckets; in between it
//! drains the class queues into batches, most urgent class first, within
//! those rates, and hands them to the egress. The decisions are all
//! `weir-core`'s ([`Pbtt`], [`Drainer`]); this file only owns time and
//! channels.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use weir_core::drain::{BatchLimits, Drain, Drainer};
use weir_core::janus::allocator::ClassLoad;
use weir_core::janus::pbtt::{Pbtt, PbttConfig};
use weir_core::janus::scheme::Scheme;

use crate::egress::{LinkReady, OutBatch};
use crate::ingress::IngressHandle;

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
    ingress: Arc<IngressHandle>,
    out: mpsc::Sender<OutBatch>,
    ready: LinkReady,
    first_batch_seq: u64,
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
    metrics.set_allocation(&initial);

    let mut last_arrived: Vec<u64> = queues
        .iter()
        .map(|(_, q)| q.stats().arrived_bytes)
        .collect();
    let mut next_window = Instant::now() + params.window;
    let mut batch_seq = first_batch_seq;
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
        if Instant::now() >= next_window {
            let t = params.window.as_secs_f64();
            let loads: Vec<ClassLoad> = queues
                .iter()
                .map(|(class, q)| {
                    let s = q.stats();
                    let arrived = s.arrived_bytes - last_arrived[class.index()];
                    last_arrived[class.index()] = s.arrived_bytes;
                    metrics.set_queued(class, s.len);
                    ClassLoad::new(
                        arrived as f64 / t,
                        (s.bytes + drainer.held_bytes(class)) as f64,
                    )
                })
                .collect();
            if let Some(p) = pbtt.as_mut() {
                match p.on_window(&loads) {
                    Ok(decision) if decision.reallocated => {
                        drainer.set_rates(now(), &decision.allocation.rates, params.capacity);
                        metrics.set_allocation(&decision.allocation.rates);
                        tracing::debug!(rates = ?decision.allocation.rates, delays = ?decision.delays, "reallocated");
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "PBTT window skipped"),
                }
            }
            next_window = (next_window + params.window).max(Instant::now());
        }

        match drainer.next_batch(now(), &queues) {
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
