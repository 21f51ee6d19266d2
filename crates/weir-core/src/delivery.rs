//! Delivery, sans-IO: the window of batches between the scheduler and a
//! sink, every decision of the egress without its I/O.
//!
//! A [`Delivery`] holds the batches handed over by the scheduler and not yet
//! confirmed, in sending order. It decides when to ask the scheduler for
//! the next batch (a *permit*: just in time for the link, within the window
//! of unconfirmed batches and the bytes the pipe holds, with the urgent
//! lane beside a full window), what to send next (retries first, after a
//! backoff), and what each confirmation teaches: the uplink estimate acted
//! on (`C_out`, [`crate::link_estimate`]) and the size of the pipe (the
//! batch size and the bytes in flight, [`pipe`]).
//!
//! The driver (the relay's `egress::deliver`) owns time, the sink and the
//! channels. In the shape of `quinn-proto`, it calls:
//! - `handle_*` with what happened: a batch handed over
//!   ([`Delivery::handle_batch`]), a send done ([`Delivery::handle_sent`]),
//!   the oldest unconfirmed batch confirmed ([`Delivery::handle_confirm`]),
//!   a send or a confirmation failed ([`Delivery::handle_failure`]), the
//!   scheduler gone ([`Delivery::handle_closed`]);
//! - [`Delivery::poll_permit`] for a permit to give the scheduler,
//!   [`Delivery::poll_send`] for the batch to send now, and
//!   [`Delivery::poll_timeout`] for when to call again at the latest;
//! - [`Delivery::poll_event`] for what to report (confirmed batches,
//!   estimates, stage timings).
//!
//! Confirmations are taken in sending order, so releases (spool, peers)
//! follow the order records were sent in. A failed send or confirmation
//! sends that batch and every later unconfirmed one again, in order, after
//! a backoff (go-back-N): a batch whose confirmation was lost arrives
//! twice, none is lost, and no batch overtakes an earlier one of its class.
//!
//! Time is a [`Duration`] since an epoch of the caller's choosing.

pub mod pipe;
pub mod probe;

use std::collections::VecDeque;
use std::time::Duration;

use crate::admission::{
    next_offer, next_permit, LinkClock, Permit, PermitStep, Window, WindowPacer,
};
use crate::backoff::Backoff;
use crate::link_estimate::{
    CarriedBound, Climb, Extreme, FitKind, LinkEstimate, LinkEstimateError, LinkEstimator,
    LinkTimer, QueueWatch, Seen, WindowedExtreme, CLIMB_STEP,
};
use pipe::Pipe;
use probe::Probe;

/// Lowest round trip, in tightest bounds, at which the urgent lane closes
/// ([`Delivery`]'s `lane`).
pub const LANE_REACH: f64 = 2.0;

/// How long the lowest round trip that closes the urgent lane is
/// remembered.
pub const LANE_WINDOW: Duration = Duration::from_secs(60);

/// First retry delay after a failed delivery.
pub const RETRY_INITIAL: Duration = Duration::from_millis(100);

/// What a [`Delivery`] is configured with.
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryParams {
    /// Most batches awaiting their confirmation at once (at least 1); the
    /// urgent lane has as many again.
    pub window: usize,
    /// Whether a batch of the most urgent class may go beyond a full window
    /// (only with a window of more than one, and sends that overlap: past
    /// a send that holds the link, an urgent batch would only queue, and
    /// each one-record batch would push the next full one back by a
    /// transaction's fixed time).
    pub urgent_lane: bool,
    /// Whether a send returns only once the link has carried the batch (an
    /// emulated link): its duration is then the link's time for it.
    pub carried_on_send: bool,
    /// The uplink estimate to start from.
    pub link_prior: LinkEstimate,
    /// Longest pause between retries.
    pub retry_max: Duration,
    /// Most bytes of batches sent or built and not yet confirmed ([`pipe`]).
    pub max_in_flight_bytes: u64,
    /// Largest batch the pipe asks for ([`pipe`]).
    pub max_batch_bytes: u64,
}

/// A permit for the scheduler, as [`Delivery::poll_permit`] gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// A slot of the window is free: a batch of any class.
    Any,
    /// Only the urgent lane is free: a batch of the most urgent class.
    Urgent,
    /// The urgent permit outstanding becomes one for any class.
    Widen,
}

/// A batch confirmed, as [`Event::Confirmed`] reports it.
#[derive(Debug)]
pub struct Confirmed<T> {
    /// The batch.
    pub batch: T,
    /// Its bytes on the wire.
    pub bytes: u64,
    /// Its time on the link ([`LinkTimer`], or the send's where the link is
    /// emulated).
    pub link_time: Duration,
    /// From the send's return to the confirmation.
    pub confirm: Duration,
}

/// What the driver reports or acts on.
#[derive(Debug)]
pub enum Event<T> {
    /// A batch went: how long it waited to be sent after it was handed over
    /// (first attempt only) and how long the send took.
    Sent {
        /// Hand-over to the start of its first send.
        prepare: Option<Duration>,
        /// The send itself.
        send: Duration,
    },
    /// The oldest unconfirmed batch is confirmed.
    Confirmed(Confirmed<T>),
    /// A send or confirmation failed: this many batches go again, `new` of
    /// them for the first time; the oldest is on its `attempt`th retry.
    Retrying {
        /// Batches to send again.
        batches: usize,
        /// Of those, sent again for the first time.
        new: usize,
        /// The oldest's attempts so far.
        attempt: u32,
    },
    /// The estimator's fit after a confirmation (for metrics).
    Fit(LinkEstimate),
    /// The estimate to act on changed (for the scheduler and compression).
    Link(LinkEstimate),
    /// The batch size the pipe asks the scheduler for changed ([`pipe`]).
    BatchBytes(u64),
    /// The uplink estimator could not start: the prior stands.
    NoEstimator(LinkEstimateError),
    /// A bandwidth probe's verdict ([`probe`]).
    Probe(probe::Verdict),
    /// What a confirmation left the machine measuring (for metrics).
    Measures(Measures),
}

/// What the machine measures, after each confirmation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measures {
    /// The estimate acted on.
    pub acted: LinkEstimate,
    /// Of the last 64 transactions, how many were sent while the link was
    /// still busy with earlier ones ([`LinkTimer::saturated`]).
    pub saturated: u32,
    /// Whether the link holds a queue ([`QueueWatch::queued`]).
    pub queued: bool,
    /// The link's queue, in time ([`QueueWatch::queue`]).
    pub queue: Duration,
    /// Bytes the pipe allows in flight.
    pub pipe_bytes: u64,
    /// The batch size the pipe asks for.
    pub batch_bytes: u64,
    /// The highest delivery rate of the pipe's window, bytes per second.
    pub delivery_rate: f64,
    /// The lowest round trip of the pipe's window.
    pub round_trip: Duration,
    /// The highest rate the bandwidth probe proved ([`probe`]), bytes per
    /// second (0 without one).
    pub proven: f64,
    /// Whether round trips show no queue on the link
    /// ([`QueueWatch::quiet`]).
    pub quiet: bool,
    /// Where the bandwidth probe is ([`Probe::phase`]).
    pub probe_phase: u8,
    /// What single transactions showed the link carries
    /// ([`CarriedBound::bound`]), bytes per second.
    pub shown: f64,
    /// The sender's mean delivery rate ([`Pipe::mean_rate`]), bytes per
    /// second.
    pub mean_rate: f64,
}

/// A batch handed over and not yet sent (or to send again).
#[derive(Debug)]
struct Pending<T> {
    batch: T,
    bytes: u64,
    attempts: u32,
    received: Duration,
    /// Taken under the urgent lane's permit: it may go beyond the window.
    beyond: bool,
}

/// A batch sent (or being sent) and awaiting its confirmation.
#[derive(Debug)]
struct InFlight<T> {
    pending: Pending<T>,
    started: Duration,
    /// When the send returned (`None` while it is under way).
    sent: Option<Duration>,
    link_time: Option<Duration>,
    pipe: pipe::Sent,
    /// The bandwidth probe's pulse it was sent in.
    probe: Option<u32>,
}

/// The delivery state machine (see the module docs).
#[derive(Debug)]
pub struct Delivery<T> {
    params: DeliveryParams,
    window: usize,
    urgent_lane: bool,
    /// Batches to send, oldest first: retries ahead of new ones.
    todo: VecDeque<Pending<T>>,
    /// Sent (the last maybe still being sent), oldest first.
    flight: VecDeque<InFlight<T>>,
    sending: bool,
    permit: Permit,
    offered_at: Duration,
    offer_at: Option<Duration>,
    open: bool,
    backoff: Backoff,
    retry_at: Option<Duration>,
    clock: LinkClock,
    timer: LinkTimer,
    pacer: WindowPacer,
    queue: QueueWatch,
    carried: CarriedBound,
    /// The lowest round trip (send to confirmation) over [`LANE_WINDOW`],
    /// seconds.
    reach: WindowedExtreme,
    climb: Climb,
    probe: Probe,
    estimator: Option<LinkEstimator>,
    link: LinkEstimate,
    horizon: Duration,
    pipe: Pipe,
    events: VecDeque<Event<T>>,
}

impl<T> Delivery<T> {
    /// A delivery with nothing in it, at `now`.
    pub fn new(params: DeliveryParams, now: Duration) -> Self {
        let mut events = VecDeque::new();
        let estimator = LinkEstimator::new(params.link_prior)
            .map_err(|e| events.push_back(Event::NoEstimator(e)))
            .ok();
        let window = params.window.max(1);
        let pipe = Pipe::new(
            &params.link_prior,
            params.max_in_flight_bytes,
            params.max_batch_bytes,
        );
        events.push_back(Event::BatchBytes(pipe.batch_bytes()));
        Self {
            window,
            urgent_lane: params.urgent_lane && window > 1 && !params.carried_on_send,
            todo: VecDeque::new(),
            flight: VecDeque::with_capacity(window),
            sending: false,
            permit: Permit::None,
            offered_at: now,
            offer_at: None,
            open: true,
            backoff: Backoff::new(RETRY_INITIAL, params.retry_max),
            retry_at: None,
            clock: LinkClock::new(window > 1 && !params.carried_on_send),
            timer: LinkTimer::default(),
            pacer: WindowPacer::default(),
            queue: QueueWatch::default(),
            carried: CarriedBound::default(),
            reach: WindowedExtreme::default(),
            climb: Climb::new(params.link_prior, now),
            probe: Probe::new(now),
            estimator,
            link: params.link_prior,
            horizon: Duration::MAX,
            pipe,
            events,
            params,
        }
    }

    /// The scheduler's horizon: what is unconfirmed must clear the link
    /// within it ([`crate::admission`]).
    pub fn set_horizon(&mut self, horizon: Duration) {
        self.horizon = horizon;
        self.pipe.set_horizon(horizon);
    }

    /// The estimate acted on.
    pub fn link(&self) -> LinkEstimate {
        self.link
    }

    /// The pipe's measures ([`pipe`]).
    pub fn pipe(&self) -> &Pipe {
        &self.pipe
    }

    /// Whether the urgent lane is open: configured, and the urgent class's
    /// bound within reach. Where every round trip to a confirmation for
    /// [`LANE_WINDOW`] took [`LANE_REACH`] times the tightest bound, an
    /// urgent record crosses at least half of one after its batch leaves
    /// and cannot arrive in time however soon it goes; the lane's batches
    /// of a record or two would only take slots and round trips from the
    /// others. On real links shaped to 4, 18 and 100 Mbit/s with 200 ms
    /// round trips (the link sweep), the lane held the default config to
    /// 989, 2,078 and 1,254 records/s; closed there, 1,393, 4,949 and
    /// 10,069. The window is long because a round trip includes the link's
    /// queue, which can stand for seconds on a slow link: with the lowest
    /// of 10 s the lane closed on a 1 Mbit/s link 5 ms from the broker and
    /// `ls` went from 19 % to 81 % late.
    fn lane(&self) -> bool {
        self.urgent_lane
            && self.reach.best().is_none_or(|secs| {
                secs < LANE_REACH * self.horizon.as_secs_f64() / crate::admission::HORIZON_SHARE
            })
    }

    /// The window as it stands, with the permit outstanding.
    fn state(&self) -> Window {
        Window {
            size: self.window,
            in_flight: self.flight.len(),
            lane_in_flight: self.flight.iter().filter(|f| f.pending.beyond).count(),
            built: self.todo.len(),
            lane_built: self.todo.iter().filter(|p| p.beyond).count(),
            urgent_lane: self.lane(),
            open: self.open,
            out: self.permit,
        }
    }

    /// Bytes sent or built outside the urgent lane, not yet confirmed.
    fn committed_bytes(&self) -> u64 {
        let flight = self.flight.iter().map(|f| &f.pending);
        flight
            .chain(self.todo.iter())
            .filter(|p| !p.beyond)
            .map(|p| p.bytes)
            .sum()
    }

    /// When the next batch is due ([`next_offer`]), never before the
    /// window's pace (only with the urgent lane: without it the pace would
    /// hold the urgent records back too).
    fn due(&self, now: Duration, w: &Window) -> Duration {
        let paced = match self.lane() {
            true => self
                .pacer
                .next(self.pipe.slots(self.window), w.in_flight - w.lane_in_flight),
            false => Duration::ZERO,
        };
        let built: u64 = self.todo.iter().map(|p| p.bytes).sum();
        next_offer(
            now,
            &self.clock,
            self.todo.len(),
            built,
            &self.link,
            self.horizon,
        )
        .max(paced)
    }

    /// A permit for the scheduler, if one is due at `now`: one at a time,
    /// while a slot of the window is free and the pipe has room, just in
    /// time (once what is committed ahead would clear the link within the
    /// lead, [`crate::admission`]); the urgent lane's meanwhile.
    pub fn poll_permit(&mut self, now: Duration) -> Option<Offer> {
        let mut w = self.state();
        if w.out == Permit::None && self.committed_bytes() >= self.pipe.in_flight_bytes() {
            // The pipe is full: no slot but the urgent lane's.
            w.size = w.size.min(w.committed());
        }
        let step = next_permit(&w, now, self.due(now, &w));
        self.offer_at = None;
        match step {
            PermitStep::Offer => {
                self.permit = Permit::Any;
                self.offered_at = now;
                self.pacer.offered(now);
                Some(Offer::Any)
            }
            PermitStep::OfferUrgent { recheck } => {
                self.permit = Permit::Urgent;
                self.offered_at = now;
                self.offer_at = recheck;
                Some(Offer::Urgent)
            }
            PermitStep::Widen => {
                self.permit = Permit::Any;
                self.pacer.offered(now);
                Some(Offer::Widen)
            }
            PermitStep::WaitUntil(at) => {
                self.offer_at = Some(at);
                None
            }
            PermitStep::Idle => None,
        }
    }

    /// Whether the driver may take the next batch from the scheduler: one
    /// was permitted and nothing built waits.
    pub fn may_receive(&self) -> bool {
        self.state().may_receive()
    }

    /// The scheduler handed over `batch` of `bytes` on the wire at `now`
    /// (under the permit outstanding). Returns how long after the permit.
    pub fn handle_batch(&mut self, now: Duration, batch: T, bytes: u64) -> Duration {
        let beyond = std::mem::take(&mut self.permit) == Permit::Urgent;
        self.todo.push_back(Pending {
            batch,
            bytes,
            attempts: 0,
            received: now,
            beyond,
        });
        now.saturating_sub(self.offered_at)
    }

    /// Whether the batch handed over last went under the urgent lane's
    /// permit.
    pub fn last_was_urgent(&self) -> bool {
        self.todo.back().is_some_and(|p| p.beyond)
    }

    /// The scheduler has shut down: no more batches come.
    pub fn handle_closed(&mut self) {
        self.open = false;
        self.permit = Permit::None;
    }

    /// The batch to send now, if any: the oldest not sent, unless a retry's
    /// backoff runs or the window has no room for it. The driver sends it
    /// and then calls [`Delivery::handle_sent`] or
    /// [`Delivery::handle_failure`]; meanwhile it may give permits.
    pub fn poll_send(&mut self, now: Duration) -> Option<&T> {
        if self.sending || self.retry_at.is_some_and(|at| at > now) {
            return None;
        }
        let w = self.state();
        if !self.todo.front().is_some_and(|p| w.may_send(p.beyond)) {
            return None;
        }
        self.retry_at = None;
        let pending = self.todo.pop_front().expect("not empty");
        self.clock.sent(now, pending.bytes, &self.link);
        let pipe = self.pipe.sent(now, self.flight.is_empty());
        let probe = self.probe.sent(now, pending.bytes);
        self.sending = true;
        self.flight.push_back(InFlight {
            pending,
            started: now,
            sent: None,
            link_time: None,
            pipe,
            probe,
        });
        self.flight.back().map(|f| &f.pending.batch)
    }

    /// The send under way returned at `now`: the batch awaits its
    /// confirmation.
    pub fn handle_sent(&mut self, now: Duration) {
        if !std::mem::take(&mut self.sending) {
            return;
        }
        if self.params.carried_on_send {
            self.clock.cleared(now);
        }
        let f = self.flight.back_mut().expect("a send was under way");
        f.sent = Some(now);
        let send = now.saturating_sub(f.started);
        f.link_time = self.params.carried_on_send.then_some(send);
        let prepare =
            (f.pending.attempts == 0).then(|| f.started.saturating_sub(f.pending.received));
        self.events.push_back(Event::Sent { prepare, send });
    }

    /// The oldest unconfirmed batch is confirmed at `now`.
    pub fn handle_confirm(&mut self, now: Duration) {
        let Some(done) = self.flight.front() else {
            return;
        };
        if done.sent.is_none() {
            return;
        }
        let done = self.flight.pop_front().expect("checked");
        let sent = done.sent.expect("checked");
        let bytes = done.pending.bytes;
        // The transaction's own time: the link's where the sink knows it
        // (an emulated link), else as the link served it (`LinkTimer`).
        let link_time = self.timer.confirmed(
            done.started,
            now,
            self.link.per_transaction,
            bytes,
            done.link_time,
        );
        match self.flight.is_empty() {
            // Everything sent is confirmed, so carried.
            true => self.clock.cleared(now),
            false => {
                let bytes = self.flight.iter().map(|f| f.pending.bytes).sum();
                self.clock
                    .carried(now, self.flight.len(), bytes, &self.link);
            }
        }
        let confirm = now.saturating_sub(sent);
        if !done.pending.beyond {
            self.pacer.confirmed(confirm);
        }
        self.backoff.reset();
        self.queue.confirmed(now, confirm, bytes);
        let round_trip = now.saturating_sub(done.started);
        self.carried.confirmed(now, bytes, round_trip);
        self.reach
            .push(now, round_trip.as_secs_f64(), LANE_WINDOW, Extreme::Lowest);
        if let Some(pulse) = done.probe {
            self.probe.confirmed(now, bytes, pulse);
        }
        self.learn(now, bytes, link_time);
        if let Some(b) =
            self.pipe
                .confirmed(now, bytes, &done.pipe, now.saturating_sub(done.started))
        {
            self.events.push_back(Event::BatchBytes(b));
        }
        self.events.push_back(Event::Measures(Measures {
            acted: self.link,
            saturated: self.timer.saturated(),
            queued: self.queue.queued(),
            queue: self.queue.queue(),
            pipe_bytes: self.pipe.in_flight_bytes(),
            batch_bytes: self.pipe.batch_bytes(),
            delivery_rate: self.pipe.delivery_rate().unwrap_or(0.0),
            round_trip: self.pipe.round_trip().unwrap_or_default(),
            proven: self.probe.bound(),
            quiet: self.queue.quiet(),
            probe_phase: self.probe.phase(),
            shown: self.carried.bound(),
            mean_rate: self.pipe.mean_rate(),
        }));
        self.events.push_back(Event::Confirmed(Confirmed {
            batch: done.pending.batch,
            bytes,
            link_time,
            confirm,
        }));
    }

    /// A confirmed transaction teaches the estimator; what to act on
    /// (`Climb::observe`: a full fit, or any with a queue on the link, and
    /// with no queue a climb back towards the prior) is published when it
    /// changes.
    fn learn(&mut self, now: Duration, bytes: u64, link_time: Duration) {
        let Some(est) = self.estimator.as_mut() else {
            return;
        };
        // The transaction alone (not compression or queueing): Eq. 1's
        // `T_sc + US / Th_up` for the bytes on the wire.
        est.observe(bytes, link_time);
        let fit = est.estimate();
        self.events.push_back(Event::Fit(fit));
        let full = est.fit_kind() == FitKind::Full;
        let prior = self.params.link_prior;
        let delivered = self.pipe.mean_rate();
        let seen = Seen {
            saturated: self.timer.saturated(),
            // An emulated link's send is timed exactly: its fits are the
            // link's, as with a queue on a real one.
            queued: self.queue.queued() || self.params.carried_on_send,
            carried: self.carried.bound().max(self.probe.bound()),
            delivered,
        };
        let climbed = self.climb.observe(now, fit, full, prior, seen);
        // The bandwidth probe paces around the estimate (an emulated
        // link's sends are timed exactly, and never probed).
        let acted = self.climb.value();
        if !self.params.carried_on_send {
            let verdict = self.probe.step(
                now,
                probe::Seen {
                    acted: acted.bytes_per_sec,
                    prior: prior.bytes_per_sec,
                    shown: self.carried.bound(),
                    using: delivered,
                    queued: !self.queue.quiet(),
                    backlog: self.queue.queued(),
                },
            );
            if let Some(v) = verdict {
                self.events.push_back(Event::Probe(v));
            }
        }
        let paced = LinkEstimate {
            bytes_per_sec: self.probe.pace(acted.bytes_per_sec),
            ..acted
        };
        let moved = (paced.bytes_per_sec - self.link.bytes_per_sec).abs()
            > CLIMB_STEP * self.link.bytes_per_sec;
        if climbed.is_some() || moved {
            self.link = paced;
            self.events.push_back(Event::Link(paced));
        }
    }

    /// The send under way, or else the oldest batch's confirmation, failed
    /// at `now`: every unconfirmed batch goes back, in sending order, to be
    /// sent again after the backoff.
    pub fn handle_failure(&mut self, now: Duration) {
        self.sending = false;
        self.clock.cleared(now);
        let again = self.flight.len();
        for f in self.flight.drain(..).rev() {
            self.todo.push_front(f.pending);
        }
        let mut new = 0;
        for p in self.todo.iter_mut().take(again) {
            if p.attempts == 0 {
                new += 1;
            }
            p.attempts += 1;
        }
        let attempt = self.todo.front().map_or(0, |p| p.attempts);
        self.events.push_back(Event::Retrying {
            batches: again,
            new,
            attempt,
        });
        self.pipe.restart();
        self.probe.abort(now);
        self.retry_at = Some(now.saturating_add(self.backoff.failed()));
    }

    /// The next thing to report.
    pub fn poll_event(&mut self) -> Option<Event<T>> {
        self.events.pop_front()
    }

    /// When to call [`Delivery::poll_permit`] and [`Delivery::poll_send`]
    /// again at the latest (a retry's backoff ends, a permit falls due);
    /// `None`: only when something happens.
    pub fn poll_timeout(&self) -> Option<Duration> {
        let retry = self.retry_at.filter(|_| !self.todo.is_empty());
        match (retry, self.offer_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether the scheduler has shut down and everything is confirmed.
    pub fn is_done(&self) -> bool {
        !self.open && self.todo.is_empty() && self.flight.is_empty()
    }

    /// Every batch not confirmed (built, being sent or awaiting its
    /// confirmation), oldest first: what a shutdown past its deadline
    /// leaves undelivered.
    pub fn unconfirmed(&self) -> impl Iterator<Item = &T> {
        self.flight
            .iter()
            .map(|f| &f.pending)
            .chain(self.todo.iter())
            .map(|p| &p.batch)
    }
}

#[cfg(test)]
mod tests;
