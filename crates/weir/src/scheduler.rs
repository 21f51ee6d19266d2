//! The scheduler task: drives `weir-core`'s [`Scheduler`] (the window step:
//! PBTT, the uplink estimate, batch plans and the drain) with real time and
//! channels. It sleeps until the link is free, a record arrives, a token
//! wait ends or the next window is due; feeds the core what the egress and
//! peering report; and hands each batch to the egress. Every decision is the
//! core's; this file only owns time, wake-ups and channels.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use weir_core::link_estimate::LinkEstimate;
use weir_core::scheduler::{
    Delivered, Event, OutBatch, Poll, ReconfigureError, Scheduler, SchedulerParams,
    SchedulerWarning,
};

use crate::clock::unix_micros;
use crate::handoff::{LinkReady, PeerPort};
use crate::intake::Intake;

/// What the egress and peering report to the scheduler.
#[derive(Debug)]
pub struct Feedback {
    /// The egress's online uplink estimate.
    pub link: watch::Receiver<LinkEstimate>,
    /// Completed transactions, for the per-class batch sizers.
    pub delivered: mpsc::Receiver<Delivered>,
    /// Peering, when configured.
    pub peer: Option<PeerPort>,
    /// New parameters from a config reload.
    pub reconfigure: mpsc::Receiver<Reconfigure>,
    /// Where the scheduler tells the egress its horizon (the other way:
    /// what unconfirmed batches must clear the link within).
    pub horizon: watch::Sender<Duration>,
    /// The batch size the egress's pipe asks for
    /// ([`weir_core::delivery::pipe`]).
    pub batch_bytes: watch::Receiver<u64>,
}

/// New scheduler parameters and class bounds (a config reload), and where
/// to say whether they were applied.
#[derive(Debug)]
pub struct Reconfigure {
    /// The parameters.
    pub params: SchedulerParams,
    /// The classes, with their new bounds and shares (same names).
    pub classes: weir_core::ClassSet,
    /// The core's answer.
    pub done: tokio::sync::oneshot::Sender<Result<(), ReconfigureError>>,
}

/// Applies a reload in the core and answers it.
fn reconfigure(core: &mut Scheduler, now: Duration, r: Reconfigure) {
    let result = core.reconfigure(now, r.params, r.classes);
    let _ = r.done.send(result);
}

/// Runs until `stop` fires and the queues are empty, or until `abort` fires.
/// Dropping `out` when it returns lets the egress finish and exit. Batch
/// sequence numbers start at `first_batch_seq` (from `batches`, their
/// lease, kept ahead of them, where there is one; else from the clock), so
/// a restart does not reuse numbers.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    params: SchedulerParams,
    first_batch_seq: u64,
    batches: Option<crate::spool::SequenceLease>,
    mut feedback: Feedback,
    intake: Arc<Intake>,
    out: mpsc::Sender<OutBatch>,
    ready: LinkReady,
    stop: CancellationToken,
    abort: CancellationToken,
    heart: crate::systemd::Heartbeat,
) {
    let queues = Arc::clone(intake.queues());
    let epoch = Instant::now();
    let prior = *feedback.link.borrow_and_update();
    let mut core = Scheduler::new(
        params,
        intake.classes().clone(),
        &queues,
        prior,
        intake.foreign_bytes(),
        first_batch_seq,
        epoch.elapsed(),
    );
    core.publish_peer_state(feedback.peer.is_some());
    let mut d = Driver {
        core,
        feedback,
        metrics: Arc::clone(intake.metrics()),
        intake,
        epoch,
        abort,
    };
    d.publish();
    let mut stopping = false;
    let mut link_free = false;
    loop {
        heart.beat();
        if !link_free {
            match d.wait_for_link(&ready).await {
                Some(free) => link_free = free,
                None => return,
            }
            if !link_free {
                continue;
            }
        }
        d.take_feedback();
        // The urgent lane's permit (the egress's window is full) carries a
        // batch of the most urgent class alone.
        let urgent_only = ready.urgent_only();
        let now = d.now();
        let poll = match urgent_only {
            true => d.core.poll_urgent_batch(now, unix_micros(), &queues),
            false => d.core.poll_batch(now, unix_micros(), &queues),
        };
        let go_on = match poll {
            Poll::Batch(batch) => {
                link_free = false;
                d.hand_over(batch, batches.as_ref(), &out)
            }
            Poll::Wait(until) if urgent_only => d.wait(until, Arrivals::Urgent, &ready).await,
            Poll::Wait(until) => d.wait(until, Arrivals::Any, &ready).await,
            Poll::Gather(until) => d.wait(until, Arrivals::None, &ready).await,
            // Only the most urgent class was looked at under the urgent
            // lane's permit: the others may still hold records.
            Poll::Empty if stopping && !urgent_only => {
                tracing::info!("queues drained");
                false
            }
            Poll::Empty => d.idle(urgent_only, &ready, &stop, &mut stopping).await,
        };
        if !go_on {
            return;
        }
        stopping |= stop.is_cancelled();
    }
}

/// Which arrivals end a [`Driver::wait`] early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arrivals {
    /// Any record queued.
    Any,
    /// A record of the most urgent class, or the egress's window widening.
    Urgent,
    /// None.
    None,
}

/// The scheduler task's state between wake-ups: the core and what it is
/// fed from.
struct Driver {
    core: Scheduler,
    feedback: Feedback,
    intake: Arc<Intake>,
    metrics: Arc<crate::metrics::Metrics>,
    epoch: Instant,
    abort: CancellationToken,
}

impl Driver {
    /// Time on the core's clock.
    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    fn at(&self, t: Duration) -> Instant {
        self.epoch + t
    }

    fn publish(&mut self) {
        publish(&mut self.core, &self.feedback, &self.metrics);
    }

    /// The deadline passed: what is held and queued is undelivered.
    fn abandon(&mut self, in_hand: &[weir_core::Record]) {
        report_abandoned(&self.intake, in_hand, &mut self.core);
    }

    /// Waits for the egress's permit: `Some(true)` once held, `Some(false)`
    /// to loop again (a heartbeat is due, a reload was applied), `None` to
    /// end (the egress is gone, or the deadline passed).
    async fn wait_for_link(&mut self, ready: &LinkReady) -> Option<bool> {
        // Cancel safety: `acquire` is cancel safe; a permit is only
        // consumed (forgotten) once held.
        tokio::select! {
            // Waiting for the link (an outage) is alive, not stuck.
            _ = tokio::time::sleep(crate::systemd::BEAT_EVERY) => Some(false),
            Some(r) = self.feedback.reconfigure.recv() => {
                reconfigure(&mut self.core, self.epoch.elapsed(), r);
                self.publish();
                Some(false)
            }
            permit = ready.acquire() => {
                let p = permit.ok()?;
                p.forget();
                Some(true)
            }
            _ = self.abort.cancelled() => {
                self.abandon(&[]);
                None
            }
        }
    }

    /// Feeds the core what the egress, peering and reloads reported since
    /// the last step, and steps its window.
    fn take_feedback(&mut self) {
        let now = self.now();
        let (core, feedback) = (&mut self.core, &mut self.feedback);
        while let Ok(d) = feedback.delivered.try_recv() {
            core.handle_delivered(d);
        }
        while let Ok(r) = feedback.reconfigure.try_recv() {
            reconfigure(core, now, r);
        }
        if let Some(port) = feedback.peer.as_mut() {
            while let Ok(grant) = port.shifts.try_recv() {
                core.handle_grant(now, &grant);
            }
        }
        if feedback.link.has_changed().unwrap_or(false) {
            core.handle_link_estimate(*feedback.link.borrow_and_update());
        }
        if feedback.batch_bytes.has_changed().unwrap_or(false) {
            core.handle_pipe_batch(*feedback.batch_bytes.borrow_and_update());
        }
        if core.window_due(now) {
            core.handle_spooled(&self.intake.spooled_behind());
        }
        core.poll_window(now, self.intake.queues(), self.intake.foreign_bytes());
        self.publish();
    }

    /// Hands `batch` to the egress; false if the egress is gone.
    fn hand_over(
        &mut self,
        batch: OutBatch,
        lease: Option<&crate::spool::SequenceLease>,
        out: &mpsc::Sender<OutBatch>,
    ) -> bool {
        self.intake.notify_space();
        if let Some(lease) = lease {
            lease.cover(batch.seq + 1);
        }
        // The egress announced it is waiting, so the channel has room.
        match out.try_send(batch) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(b) | mpsc::error::TrySendError::Closed(b)) => {
                self.abandon(&b.records);
                false
            }
        }
    }

    /// Waits until `until` (tokens, or the end of a gather), a reload, or
    /// the deadline (false once it passed). `arrivals` says which arrivals
    /// wake it earlier: any, only the most urgent class's (`Urgent`, under
    /// the urgent lane's permit, which also wakes when the window widens),
    /// or none (a gather: a full batch's worth arriving within it waits out
    /// the rest, at most a gather, 2 ms by default, where waking per arrival
    /// would cost more than the gather saves).
    async fn wait(&mut self, until: Duration, arrivals: Arrivals, ready: &LinkReady) -> bool {
        let at = self.at(until);
        let (any, urgent) = (arrivals == Arrivals::Any, arrivals == Arrivals::Urgent);
        // Cancel safety: all branches only wait.
        tokio::select! {
            _ = tokio::time::sleep_until(at) => true,
            _ = self.intake.arrived(), if any => true,
            _ = self.intake.urgent_arrived(), if urgent => true,
            _ = ready.widened(), if urgent => true,
            Some(r) = self.feedback.reconfigure.recv() => {
                reconfigure(&mut self.core, self.epoch.elapsed(), r);
                true
            }
            _ = self.abort.cancelled() => {
                self.abandon(&[]);
                false
            }
        }
    }

    /// Nothing to send: waits for an arrival, the core's next timer, a
    /// reload or shutdown (`stopping` set once `stop` fires). Under the
    /// urgent lane's permit only records of the most urgent class can go,
    /// so other arrivals need not wake it. False once the deadline passed.
    async fn idle(
        &mut self,
        urgent_only: bool,
        ready: &LinkReady,
        stop: &CancellationToken,
        stopping: &mut bool,
    ) -> bool {
        let at = self.at(self.core.poll_timeout());
        let not_stopping = !*stopping;
        // Cancel safety: all branches only wait.
        tokio::select! {
            _ = self.intake.arrived(), if !urgent_only => true,
            _ = self.intake.urgent_arrived(), if urgent_only => true,
            _ = ready.widened(), if urgent_only => true,
            _ = tokio::time::sleep_until(at) => true,
            Some(r) = self.feedback.reconfigure.recv() => {
                reconfigure(&mut self.core, self.epoch.elapsed(), r);
                true
            }
            _ = stop.cancelled(), if not_stopping => {
                *stopping = true;
                true
            }
            _ = self.abort.cancelled() => false,
        }
    }
}

/// Acts on what the core asks to be published or logged.
fn publish(core: &mut Scheduler, feedback: &Feedback, metrics: &crate::metrics::Metrics) {
    let peer = feedback.peer.as_ref();
    while let Some(event) = core.poll_event() {
        match event {
            Event::Rates(rates) => metrics.set_allocation(&rates),
            Event::Reallocated { rates, delays } => {
                tracing::debug!(?rates, ?delays, "reallocated");
            }
            Event::CapacityFollowed(capacity) => {
                tracing::debug!(capacity, "C_out follows the uplink estimate");
            }
            Event::PeerState(state) => {
                if let Some(port) = peer {
                    port.state.send_replace(state);
                }
            }
            Event::Horizon(h) => {
                tracing::debug!(?h, "horizon");
                feedback.horizon.send_replace(h);
            }
            Event::Warning(w @ SchedulerWarning::PbttUnavailable(_)) => {
                tracing::error!(warning = %w, "scheduler");
            }
            Event::Warning(w) => tracing::warn!(warning = %w, "scheduler"),
        }
    }
}

/// The shutdown deadline passed: counts, per class, what the scheduler
/// holds, the batch in hand and what is still queued, as undelivered.
fn report_abandoned(intake: &Intake, in_hand: &[weir_core::Record], core: &mut Scheduler) {
    let metrics = intake.metrics();
    let mut lost = 0u64;
    for r in core.take_held().iter().chain(in_hand) {
        metrics.undelivered(r.class, 1);
        lost += 1;
    }
    for (class, q) in intake.queues().iter() {
        let n = q.len() as u64;
        if n > 0 {
            metrics.undelivered(class, n);
            lost += n;
        }
    }
    if lost > 0 {
        tracing::error!(
            records = lost,
            "shutdown deadline passed before the queues drained; these records were not delivered"
        );
    }
}
