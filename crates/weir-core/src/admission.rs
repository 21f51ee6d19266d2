//! What may be committed to the link ahead of an urgent record.
//!
//! A batch handed to the egress is no longer preemptible: once it is
//! published (or queued on the emulated link, or sitting in a socket's send
//! buffer on a shaped uplink) a more urgent record that arrives next waits
//! until the link has carried it. Two rules keep that wait within the
//! tightest bound in play:
//!
//! - **Just in time**: the egress asks for its next batch only once what
//!   is committed ahead of it would clear the link within a [`lead`] (a
//!   quarter of the *horizon*), by a [`LinkClock`] that runs each sent
//!   batch's time on the link one after another: its bytes over the
//!   bandwidth, and its `T_sc` too where transactions do not overlap (a
//!   window of one) ([`next_offer`]). The batch is built from
//!   the queues as they are when the link can take it, and what waits for
//!   a confirm no longer counts: a broker's round trip and fsync overlap
//!   the next transfer.
//! - **Batch cap**: no single batch may take longer than the horizon on the
//!   link ([`batch_cap`]), however late the scheduler woke and however many
//!   tokens it found: a late wake-up does not turn into a long
//!   non-preemptible transfer.
//!
//! The horizon is [`HORIZON_SHARE`] (35 %) of the tightest bound among the
//! classes that have traffic ([`horizon`]). An urgent record waits at most
//! the rest of the transaction under way, the lead and its own transaction,
//! each within the horizon: with the uplink saturated by less urgent
//! classes, a `ls` record (100 ms) waits at most 35 + 9 + 35 ms, where a
//! window of 8 batches of 64 KiB on a 4 Mbit/s uplink made it wait a
//! second. Riders (records of other classes sharing the urgent record's
//! transaction) may fill a batch up to the cap, since the cap already keeps
//! the transaction within the horizon.
//!
//! The price is throughput on links whose per-transaction time is large
//! against the bound: batches are smaller and fewer are in flight. Three
//! limits keep that price bounded:
//! - classes without traffic do not count, so a node carrying only `lt`
//!   (1 s) batches as large as before;
//! - a batch is never capped below one transaction's worth of bytes
//!   (`T_sc Th_up`), so the link spends at least half its time carrying
//!   bytes;
//! - where one transaction's fixed time alone passes the horizon (a 50 ms
//!   4G round trip against a 100 ms class: [`keepable`]) no rule can keep
//!   the bound, and admission stands aside for the window.

use std::time::Duration;

use crate::link_estimate::LinkEstimate;

/// The share of the tightest bound that one transaction may take on the
/// link. An urgent record waits at most the rest of the transaction under
/// way, the [`lead`], and its own transaction: `2 h + h/4 = 0.79` of the
/// bound at 0.35, leaving the rest for the queue's drain, the confirm's or
/// consumer's hop and a late wake-up.
pub const HORIZON_SHARE: f64 = 0.35;

/// No batch cap goes below this: on a link too slow for the horizon, a
/// batch still carries a few records (and the bound cannot be met anyway).
pub const MIN_BATCH_BYTES: usize = 4096;

/// The horizon for classes whose tightest bound is `tightest`.
pub fn horizon(tightest: Duration) -> Duration {
    tightest.mul_f64(HORIZON_SHARE)
}

/// How long `batches` transactions of `bytes` bytes in all take to clear
/// `link`.
pub fn drain_time(batches: usize, bytes: u64, link: &LinkEstimate) -> Duration {
    let serial = if link.bytes_per_sec > 0.0 && link.bytes_per_sec.is_finite() {
        Duration::from_secs_f64(bytes as f64 / link.bytes_per_sec)
    } else {
        Duration::ZERO
    };
    link.per_transaction
        .saturating_mul(u32::try_from(batches).unwrap_or(u32::MAX))
        .saturating_add(serial)
}

/// Whether the horizon can be kept on `link` at all: one transaction's
/// fixed time is within it. Where it is not (a 50 ms 4G round trip
/// against a 100 ms class), no admission or cap makes the bound, and
/// holding batches back would only cost throughput; the rules stand
/// aside.
pub fn keepable(link: &LinkEstimate, horizon: Duration) -> bool {
    link.per_transaction < horizon
}

/// The largest share of the horizon a partial batch may gather for
/// ([`crate::queueing::drain`]'s gathering): an urgent record then waits at most
/// `2 h + h/4 + h/16 = 0.81` of its bound at [`HORIZON_SHARE`] 0.35 (a 100 ms
/// class: a gather of at most 2.2 ms).
pub const GATHER_SHARE: f64 = 1.0 / 16.0;

/// The gather in force for a configured `gather` under `horizon`: never
/// more than [`GATHER_SHARE`] of it.
pub fn gather(configured: Duration, horizon: Duration) -> Duration {
    configured.min(horizon.mul_f64(GATHER_SHARE))
}

/// Share of the horizon by which the egress asks for its next batch ahead
/// of the link becoming free ([`lead`]).
pub const LEAD_SHARE: f64 = 0.25;

/// How long before the link has carried what is committed the egress asks
/// the scheduler for the next batch: long enough for the hand-off (the
/// scheduler's wake-up, the drain, compression) even on a busy box, so the
/// link does not idle between transactions; short, so that a batch is built
/// from the queues as they are when the link can take it, not a whole
/// transaction earlier (an urgent record arriving in between would wait for
/// that batch too).
pub fn lead(horizon: Duration) -> Duration {
    horizon.mul_f64(LEAD_SHARE)
}

/// The link as the egress has committed to it: when it will have carried
/// every batch sent so far. A publisher confirm is not link time: the
/// broker's round trip and its fsync overlap the next transfer, so only
/// the bytes still to cross count against an urgent record, and a slow
/// confirm does not leave the link idle.
///
/// Where transactions overlap (a sink with a window of more than one
/// unconfirmed batch) a batch occupies the link for its bytes alone,
/// `B / Th_up`: its `T_sc` (the round trip to the broker and its confirm,
/// which is what the estimator measures on a link that is not saturated)
/// passes while the next batches cross. Charged one after another, the
/// round trips of batches that each overlap the one before add up to more
/// than the time that passes: on a 4 Mbit/s uplink with a 5 ms round trip,
/// `ls` batches every 6 ms (each sent before the last was confirmed, so the
/// clock was never cleared) pushed the clock 1.8 s into the future and
/// the egress asked for nothing else: 15 % of the link carried, `nm` and
/// `lt` never sent. Where they do not overlap (a window of one, or a sink
/// whose send returns only once the link has carried the batch: the
/// emulated link) each transaction's Eq. 1 time `T_sc + B / Th_up` runs
/// after the last. Charged its bytes alone there, the next permit came as
/// a send started, a whole `T_sc` early, and its batch waited out the send
/// while later records queued behind it: on the emulated 4 Mbit/s link
/// with 10 ms per transaction (`weir_core::sim`), `ls` p99 85 ms against
/// 75 ms charged serially.
///
/// Each confirmation bounds the clock as well: the batch confirmed has
/// crossed, so the link is clear once the bytes still in flight have
/// ([`LinkClock::carried`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LinkClock {
    clear_at: Duration,
    overlapping: bool,
}

impl LinkClock {
    /// A clock for transactions that overlap (`true`: a window of more than
    /// one) or run one after another.
    pub fn new(overlapping: bool) -> Self {
        LinkClock {
            clear_at: Duration::ZERO,
            overlapping,
        }
    }

    /// How long `batches` transactions of `bytes` bytes in all occupy
    /// `link` ([`drain_time`], without `T_sc` where they overlap).
    pub fn occupancy(&self, batches: usize, bytes: u64, link: &LinkEstimate) -> Duration {
        drain_time(if self.overlapping { 0 } else { batches }, bytes, link)
    }

    /// A batch of `bytes` went to the link at `now`: it starts once the
    /// link has carried what was sent before it.
    pub fn sent(&mut self, now: Duration, bytes: u64, link: &LinkEstimate) {
        self.clear_at = self
            .clear_at
            .max(now)
            .saturating_add(self.occupancy(1, bytes, link));
    }

    /// The link has carried everything sent by `now` (the last batch sent
    /// is confirmed, or the sink's send returns only once it has): what the
    /// estimate predicted no longer counts.
    pub fn cleared(&mut self, now: Duration) {
        self.clear_at = self.clear_at.min(now);
    }

    /// A batch was confirmed at `now` with `batches` of `bytes` in all
    /// still in flight after it: the link is clear once those have crossed,
    /// whatever the clock ran ahead to.
    pub fn carried(&mut self, now: Duration, batches: usize, bytes: u64, link: &LinkEstimate) {
        let bound = now.saturating_add(self.occupancy(batches, bytes, link));
        self.clear_at = self.clear_at.min(bound);
    }

    /// How long from `now` until the link has carried what was sent.
    pub fn busy_for(&self, now: Duration) -> Duration {
        self.clear_at.saturating_sub(now)
    }
}

/// When the egress should ask the scheduler for its next batch, with
/// `queued` batches of `queued_bytes` built and not yet sent: once what is
/// committed ahead (the rest of what `clock` says is on the link, plus the
/// queued batches' transactions) clears within [`lead`]. At `now` when that
/// is already so, or when the horizon cannot be kept at all ([`keepable`]:
/// then only the sink's window limits what is committed).
pub fn next_offer(
    now: Duration,
    clock: &LinkClock,
    queued: usize,
    queued_bytes: u64,
    link: &LinkEstimate,
    horizon: Duration,
) -> Duration {
    if !keepable(link, horizon) {
        return now;
    }
    let mut ahead = clock.busy_for(now);
    if queued > 0 {
        ahead = ahead.saturating_add(clock.occupancy(queued, queued_bytes, link));
    }
    now.saturating_add(ahead.saturating_sub(lead(horizon)))
}

/// The largest batch whose own transaction fits `horizon` on `link`, but
/// never less than one transaction's worth of bytes (`T_sc Th_up`, so the
/// link stays at least half busy carrying bytes rather than waiting out
/// fixed costs) nor [`MIN_BATCH_BYTES`].
pub fn batch_cap(link: &LinkEstimate, horizon: Duration) -> usize {
    let room = horizon.saturating_sub(link.per_transaction).as_secs_f64();
    let floor = link.per_transaction.as_secs_f64();
    let bytes = room.max(floor) * link.bytes_per_sec;
    if bytes.is_finite() {
        (bytes as usize).max(MIN_BATCH_BYTES)
    } else {
        usize::MAX
    }
}

/// Weight of each new round trip in [`WindowPacer`]'s smoothed one (as
/// TCP's `srtt`, RFC 6298).
pub const ROUND_TRIP_GAIN: f64 = 1.0 / 8.0;

/// Offers of the slots of a window of unconfirmed batches, spread over the
/// round trip: at most one per `R / N`, with `R` the smoothed time from a
/// batch's send to its confirmation and `N` the window.
///
/// On a link whose window is the limit (the egress keeps `N` batches
/// unconfirmed and waits), each batch carries the tokens earned since the
/// batch before it. Confirmations that come back in a bunch free several
/// slots at once: the first batch takes everything earned, the next ones
/// a record or two each, and those small batches hold their slots for a
/// whole round trip and come back bunched again. Meanwhile tokens earned
/// with every slot taken overflow their buckets and are never sent. In the
/// real-process JANUS lab with the urgent lane on (4G, 4 nodes), 40-45 %
/// of batches carried under 5 kB, 25 % of the gaps between batches were
/// under 1 ms, and the gaps over the buckets' 32 ms wasted 6-7 % of the
/// tokens: the lane's cost in throughput. One offer per `R / N` keeps the
/// batches near `C_out R / N` each, the size the window needs to carry
/// `C_out`, whatever the confirmations do.
///
/// The egress paces only with the urgent lane on (`egress.amqp.urgent_lane`),
/// whose permits let an urgent record past a held-back slot. Without the
/// lane the pace would hold urgent records back as well, and measured
/// without it (the same lab, two runs) the link estimates fell to 0.16-0.69
/// of the shaped rate and PMRFS to 47-79 % of the limit, as if the
/// estimator ([`crate::link_estimate::LinkTimer`]) timed a sender paced
/// under its link rather than the link, and `C_out` followed it down.
/// With the lane the same pace left the estimates at 0.91-0.95 (as without
/// a pace); why the lane's batches keep the busy periods measurable was not
/// found, so the pace stays with the lane.
///
/// Nothing is paced while the window is empty (an idle link takes its
/// first batch at once) or for a window of one (its slot frees only at a
/// confirmation anyway). A single slow confirmation (a broker's stall)
/// moves the smoothed round trip by at most [`ROUND_TRIP_GAIN`] of twice
/// itself, so one outlier cannot hold the window back for long.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WindowPacer {
    round_trip: Option<Duration>,
    last_offer: Option<Duration>,
}

impl WindowPacer {
    /// A batch was confirmed `round_trip` after it was sent.
    pub fn confirmed(&mut self, round_trip: Duration) {
        self.round_trip = Some(match self.round_trip {
            None => round_trip,
            Some(r) => {
                let sample = round_trip.min(r.saturating_mul(2)).as_secs_f64();
                let r = r.as_secs_f64();
                Duration::from_secs_f64(r + ROUND_TRIP_GAIN * (sample - r))
            }
        });
    }

    /// A slot of the window was offered at `now`.
    pub fn offered(&mut self, now: Duration) {
        self.last_offer = Some(now);
    }

    /// The earliest the next slot of a window of `window` batches may be
    /// offered, with `in_flight` of them unconfirmed; [`Duration::ZERO`]
    /// when nothing holds it back.
    pub fn next(&self, window: usize, in_flight: usize) -> Duration {
        match (self.round_trip, self.last_offer) {
            (Some(r), Some(last)) if window > 1 && in_flight > 0 => {
                last.saturating_add(r / u32::try_from(window).unwrap_or(u32::MAX))
            }
            _ => Duration::ZERO,
        }
    }

    /// The smoothed round trip, once a batch was confirmed.
    pub fn round_trip(&self) -> Option<Duration> {
        self.round_trip
    }
}

/// The permit the egress has handed to the scheduler and not yet seen
/// turned into a batch (at most one is out at a time).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Permit {
    /// None is out.
    #[default]
    None,
    /// A permit for any batch.
    Any,
    /// The urgent lane's: a batch of the most urgent class alone, which may
    /// go beyond a full window.
    Urgent,
}

/// The egress's window of unconfirmed batches as it stands, for
/// [`next_permit`]: the sink's window, what is in flight (sent, not yet
/// confirmed) and built (taken from the scheduler, not yet sent), each with
/// the urgent lane's share of it, and the permit out.
///
/// The urgent lane's batches have a window of their own beside the others'
/// (they are small: one class, no riders); sharing one would leave the
/// others a slot short for every urgent batch in flight.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Window {
    /// The sink's window (at least 1).
    pub size: usize,
    /// Sent and not yet confirmed.
    pub in_flight: usize,
    /// Of `in_flight`, the urgent lane's.
    pub lane_in_flight: usize,
    /// Taken from the scheduler and not yet sent (retries included).
    pub built: usize,
    /// Of `built`, the urgent lane's.
    pub lane_built: usize,
    /// Whether the urgent lane is on (`egress.amqp.urgent_lane`, and a
    /// window of more than one).
    pub urgent_lane: bool,
    /// Whether the scheduler still hands batches over (not shut down).
    pub open: bool,
    /// The permit out.
    pub out: Permit,
}

impl Window {
    /// Batches other than the lane's committed to the link: in flight or
    /// built.
    pub fn committed(&self) -> usize {
        self.in_flight - self.lane_in_flight + self.built - self.lane_built
    }

    /// Whether a built batch may be sent now: the lane's while the lane's
    /// own window has room, any other while the window has.
    pub fn may_send(&self, lane: bool) -> bool {
        match lane {
            true => self.lane_in_flight < self.size,
            false => self.in_flight - self.lane_in_flight < self.size,
        }
    }

    /// Whether a permit for any batch may be offered once it is due (none
    /// is out and a slot is free).
    pub fn may_offer(&self) -> bool {
        self.open && self.out == Permit::None && self.committed() < self.size
    }

    /// Whether the egress takes the scheduler's next batch: nothing built
    /// waits to be sent and the batch has room (a free slot, or the urgent
    /// lane's permit, whose batch goes beyond the window).
    pub fn may_receive(&self) -> bool {
        self.open
            && self.built == 0
            && (self.in_flight - self.lane_in_flight < self.size || self.out == Permit::Urgent)
    }

    fn lane_free(&self) -> bool {
        self.urgent_lane && self.open && self.lane_in_flight + self.lane_built < self.size
    }
}

/// What the egress does about its permit ([`next_permit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermitStep {
    /// Offer a permit for any batch now.
    Offer,
    /// Offer the urgent lane's permit now (an urgent record need not wait
    /// for the window or the pace), and look again at `recheck`, when a
    /// permit for any batch is due, if one is.
    OfferUrgent {
        /// When a permit for any batch is due.
        recheck: Option<Duration>,
    },
    /// The urgent lane's permit out may now carry any batch: widen it.
    Widen,
    /// Nothing now; look again at this time.
    WaitUntil(Duration),
    /// Nothing until the window, the permit or the scheduler changes.
    Idle,
}

/// Which permit the egress offers the scheduler, and when, given its
/// window `w`, the time `now` and when a permit for any batch is `due`
/// (the lead, [`next_offer`], and with the urgent lane the window's pace,
/// [`WindowPacer`]).
///
/// - With a slot free and no permit out: a permit for any batch once due.
///   Until then, with the urgent lane, the lane's permit: an urgent record
///   need not wait for the lead or the pace.
/// - With the lane's permit out and a slot free: once due, the permit is
///   widened to any batch (as a new permit would be offered).
/// - With the window full and no permit out: the lane's permit, while the
///   lane's own window has room; its class alone may go beyond a full
///   window, so an urgent record does not wait for a confirmation.
pub fn next_permit(w: &Window, now: Duration, due: Duration) -> PermitStep {
    let slot = w.committed() < w.size;
    match w.out {
        Permit::None if w.open && slot => match (due <= now, w.lane_free()) {
            (true, _) => PermitStep::Offer,
            (false, true) => PermitStep::OfferUrgent { recheck: Some(due) },
            (false, false) => PermitStep::WaitUntil(due),
        },
        Permit::None if w.lane_free() => PermitStep::OfferUrgent { recheck: None },
        Permit::Urgent if slot => match due <= now {
            true => PermitStep::Widen,
            false => PermitStep::WaitUntil(due),
        },
        _ => PermitStep::Idle,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);

    fn link(bytes_per_sec: f64, per_transaction: Duration) -> LinkEstimate {
        LinkEstimate {
            bytes_per_sec,
            per_transaction,
        }
    }

    #[test]
    fn a_4_mbit_link_with_a_100ms_class_takes_batches_of_12_kb() {
        let l = link(500_000.0, MS * 10);
        let h = horizon(MS * 100);
        assert_eq!(h, MS * 35);
        assert_eq!(batch_cap(&l, h), 12_500);
        assert_eq!(lead(h), MS * 35 / 4);
    }

    #[test]
    fn the_next_batch_is_asked_for_a_lead_before_the_link_is_clear() {
        let l = link(500_000.0, MS * 10);
        let h = horizon(MS * 100);
        let mut clock = LinkClock::default();
        assert_eq!(
            next_offer(MS * 5, &clock, 0, 0, &l, h),
            MS * 5,
            "an idle link: now"
        );
        // 10 kB: 10 ms + 20 ms on the link.
        clock.sent(MS * 5, 10_000, &l);
        assert_eq!(clock.busy_for(MS * 5), MS * 30);
        assert_eq!(
            next_offer(MS * 5, &clock, 0, 0, &l, h),
            MS * 5 + MS * 30 - lead(h)
        );
        // Sent while the link is busy, a batch starts once it is clear.
        clock.sent(MS * 20, 10_000, &l);
        assert_eq!(clock.busy_for(MS * 20), MS * 45);
        // A batch built and not yet sent counts too.
        assert_eq!(
            next_offer(MS * 20, &clock, 1, 5_000, &l, h),
            MS * 20 + MS * 45 + MS * 20 - lead(h)
        );
        // Confirmed: the prediction gives way to what happened.
        clock.cleared(MS * 40);
        assert_eq!(clock.busy_for(MS * 40), Duration::ZERO);
        assert_eq!(next_offer(MS * 40, &clock, 0, 0, &l, h), MS * 40);
    }

    #[test]
    fn overlapping_transactions_occupy_the_link_for_their_bytes_alone() {
        // 4 Mbit/s, a 6 ms round trip: a 300 B batch every 6 ms, each sent
        // before the last is confirmed.
        let l = link(500_000.0, MS * 6);
        let mut serial = LinkClock::default();
        let mut overlapping = LinkClock::new(true);
        for i in 0..100u32 {
            serial.sent(MS * 6 * i, 300, &l);
            overlapping.sent(MS * 6 * i, 300, &l);
        }
        let now = MS * 6 * 99;
        assert!(serial.busy_for(now) > MS * 6, "round trips add up");
        assert_eq!(overlapping.busy_for(now), Duration::from_micros(600));
        // A confirmation bounds the clock by the bytes still in flight.
        let mut c = LinkClock::new(true);
        c.sent(Duration::ZERO, 500_000, &link(100_000.0, MS));
        c.carried(MS * 100, 1, 50_000, &l);
        assert_eq!(c.busy_for(MS * 100), MS * 100);
    }

    #[test]
    fn a_slow_link_still_carries_a_few_records_per_batch() {
        let l = link(10_000.0, MS * 5);
        assert_eq!(batch_cap(&l, horizon(MS * 10)), MIN_BATCH_BYTES);
    }

    #[test]
    fn where_one_transaction_passes_the_horizon_the_rules_stand_aside() {
        // 4G as JANUS Table III has it: 50 ms, 18 Mbit/s; `ls` 100 ms.
        let l = link(2_250_000.0, MS * 50);
        let h = horizon(MS * 100);
        assert!(!keepable(&l, h));
        let mut clock = LinkClock::default();
        clock.sent(MS, 7 << 16, &l);
        assert_eq!(
            next_offer(MS, &clock, 7, 7 << 16, &l, h),
            MS,
            "the window decides"
        );
        assert_eq!(batch_cap(&l, h), 112_500, "one transaction's bytes");
    }

    proptest! {
        /// Whatever the link, with batches at the cap and a hand-off no
        /// longer than the lead: at every offer no more than the lead is
        /// committed ahead (an urgent record waits at most the lead and
        /// one batch), and the link never idles between transactions.
        #[test]
        fn batches_are_asked_for_just_in_time(
            bw in 10_000.0f64..1e9,
            tsc_ms in 0u64..200,
            bound_ms in 10u64..5_000,
            handoffs in proptest::collection::vec(0.0f64..=1.0, 1..50),
        ) {
            let l = link(bw, MS * tsc_ms as u32);
            let h = horizon(MS * bound_ms as u32);
            let cap = batch_cap(&l, h) as u64;
            let mut clock = LinkClock::default();
            let mut now = Duration::ZERO;
            for share in handoffs {
                let offer = next_offer(now, &clock, 0, 0, &l, h);
                prop_assert!(offer >= now);
                if keepable(&l, h) {
                    prop_assert!(clock.busy_for(offer) <= lead(h));
                }
                // The batch arrives within the lead and goes straight on.
                let arrives = offer + lead(h).mul_f64(share);
                let was_busy_until = now + clock.busy_for(now);
                if keepable(&l, h) && now > Duration::ZERO {
                    prop_assert!(arrives <= was_busy_until.max(offer), "the link idled");
                }
                clock.sent(arrives, cap, &l);
                now = arrives;
            }
            // A batch fits the horizon, or is no more than one
            // transaction's worth (or the floor).
            let one = drain_time(1, cap, &l);
            let fits = one <= h + MS;
            let bdp = cap as f64 <= (l.per_transaction.as_secs_f64() * bw).max(MIN_BATCH_BYTES as f64) + 1.0;
            prop_assert!(fits || bdp);
        }
    }

    fn window(size: usize, in_flight: usize, lane_in_flight: usize, out: Permit) -> Window {
        Window {
            size,
            in_flight,
            lane_in_flight,
            built: 0,
            lane_built: 0,
            urgent_lane: true,
            open: true,
            out,
        }
    }

    #[test]
    fn a_free_slot_is_offered_once_due_and_the_lane_meanwhile() {
        let w = window(8, 3, 0, Permit::None);
        assert_eq!(next_permit(&w, MS * 10, MS * 10), PermitStep::Offer);
        assert_eq!(
            next_permit(&w, MS * 10, MS * 14),
            PermitStep::OfferUrgent {
                recheck: Some(MS * 14)
            },
            "not yet due: the lane's permit meanwhile"
        );
        let off = Window {
            urgent_lane: false,
            ..w
        };
        assert_eq!(
            next_permit(&off, MS * 10, MS * 14),
            PermitStep::WaitUntil(MS * 14),
            "without the lane, nothing until due"
        );
        // The lane's permit out and a slot free: widened once due.
        let u = window(8, 3, 0, Permit::Urgent);
        assert_eq!(
            next_permit(&u, MS * 10, MS * 14),
            PermitStep::WaitUntil(MS * 14)
        );
        assert_eq!(next_permit(&u, MS * 14, MS * 14), PermitStep::Widen);
        // A permit for any batch out: nothing more.
        let a = window(8, 3, 0, Permit::Any);
        assert_eq!(next_permit(&a, MS * 14, MS * 14), PermitStep::Idle);
    }

    #[test]
    fn a_full_window_leaves_the_urgent_lane_its_own() {
        // Eight others in flight (or built): no slot, the lane's permit.
        let full = window(8, 8, 0, Permit::None);
        assert!(!full.may_offer());
        assert!(!full.may_send(false));
        assert!(full.may_send(true));
        assert_eq!(
            next_permit(&full, MS, MS),
            PermitStep::OfferUrgent { recheck: None }
        );
        let built = Window {
            in_flight: 6,
            built: 2,
            ..full
        };
        assert_eq!(
            next_permit(&built, MS, MS),
            PermitStep::OfferUrgent { recheck: None }
        );
        // Its batch may be taken beyond the window, no other.
        assert!(!full.may_receive());
        assert!(Window {
            out: Permit::Urgent,
            ..full
        }
        .may_receive());
        // The lane's batches do not take the others' slots...
        let lane = window(8, 10, 4, Permit::None);
        assert_eq!(lane.committed(), 6);
        assert_eq!(next_permit(&lane, MS, MS), PermitStep::Offer);
        // ...and have a window of their own.
        let lane_full = Window {
            lane_built: 2,
            built: 2,
            ..window(8, 14, 6, Permit::None)
        };
        assert_eq!(next_permit(&lane_full, MS, MS), PermitStep::Idle);
        // Without the lane a full window waits for a confirmation.
        let off = Window {
            urgent_lane: false,
            ..full
        };
        assert_eq!(next_permit(&off, MS, MS), PermitStep::Idle);
    }

    #[test]
    fn once_the_scheduler_has_shut_down_nothing_is_offered() {
        for out in [Permit::None, Permit::Any] {
            for in_flight in [0, 8] {
                let w = Window {
                    open: false,
                    ..window(8, in_flight, 0, out)
                };
                assert_eq!(next_permit(&w, MS, MS), PermitStep::Idle);
                assert!(!w.may_offer() && !w.may_receive());
            }
        }
    }

    #[test]
    fn the_pacer_spreads_a_window_over_its_round_trip() {
        let mut p = WindowPacer::default();
        // Nothing measured yet: nothing held back.
        assert_eq!(p.next(8, 3), Duration::ZERO);
        p.confirmed(80 * MS);
        p.offered(1000 * MS);
        assert_eq!(p.next(8, 3), 1010 * MS);
        // An empty window or a window of one is never paced.
        assert_eq!(p.next(8, 0), Duration::ZERO);
        assert_eq!(p.next(1, 1), Duration::ZERO);
        // Smoothed: a 160 ms round trip moves 80 ms by an eighth of 80.
        p.confirmed(160 * MS);
        let r = p.round_trip().unwrap();
        assert!(r.abs_diff(90 * MS) < Duration::from_micros(1), "{r:?}");
    }

    #[test]
    fn one_stalled_confirmation_moves_the_pace_by_little() {
        let mut p = WindowPacer::default();
        p.confirmed(80 * MS);
        // A 5 s stall counts as twice the round trip at most.
        p.confirmed(5000 * MS);
        let r = p.round_trip().unwrap();
        assert!(r.abs_diff(90 * MS) < Duration::from_micros(1), "{r:?}");
        for _ in 0..40 {
            p.confirmed(80 * MS);
        }
        let r = p.round_trip().unwrap();
        assert!(r >= 80 * MS && r < 81 * MS, "{r:?}");
    }
}
