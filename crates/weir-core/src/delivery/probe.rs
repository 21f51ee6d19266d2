//! The bandwidth probe: how the estimate acted on (`C_out`) finds a link
//! faster than the configured prior.
//!
//! A sender paced at `C_out` sends `C_out` and no faster, so nothing it
//! measures can say that the link carries more: every confirmation comes
//! at the rate it was sent at. [`crate::link_estimate::CarriedBound`]
//! (bytes over one transaction's round trip) lifts `C_out` where round
//! trips are short, but once the round trip is longer than a batch's time
//! on the link it reads at most `C_out` itself: on a 100 Mbit/s link 50 ms
//! from the broker, weir's default config sat at its 18 Mbit/s prior and
//! delivered a fifth of what hand-tuned 4 MiB batches did.
//!
//! So, as BBR's `ProbeBW` does, the egress now and then paces above
//! `C_out` on purpose and looks at what came back:
//! - a *pulse*: [`PULSE`] at a gain over the estimate acted on ([`GAINS`]:
//!   1.25, one rung up after each probe that proved more than its base),
//!   longer if it has not yet sent [`MIN_PULSE_BATCHES`];
//! - the *verdict*: the pulse's bytes over the span of their confirmations
//!   (the link's delivery rate while it was offered more) against the rate
//!   they were sent at, once every pulse batch is confirmed, or the first
//!   half where the round trip is shorter than the pulse. Where the link
//!   kept up ([`KEPT_UP`]), it carries at least what was sent, and that
//!   rate becomes a floor of `C_out` for [`HOLD`] ([`Probe::bound`]); the
//!   next probe follows [`FIRST_INTERVAL`] later, from the new rate;
//! - where it did not (judged during the pulse as soon as a third of its
//!   batches are back and behind), a *drain*: [`PULSE`] at `2 - gain`
//!   times the base, which empties the queue the pulse left. What earlier
//!   probes proved is forgotten, the delivery rate (never above the base)
//!   is the floor, and the probes back off ([`BACK_OFF`], up to
//!   [`MAX_INTERVAL`]).
//!
//! A probe starts only where it can teach something and cost little:
//! - some transaction of the last 10 s showed the link faster than the
//!   prior ([`FASTER`]): on a link the prior fills (a 4G uplink at the
//!   default 18 Mbit/s) a pulse finds no room and leaves a queue ahead of
//!   the urgent class. Ungated, the real-process JANUS lab had 0.9-2.9 %
//!   of `ls` records late on their own links, against none without probes;
//! - the link is quiet ([`crate::link_estimate::QueueWatch::quiet`]);
//! - the estimate does not run ahead of the evidence ([`AHEAD`]);
//! - the sender used what it was given (the mean delivery rate at least
//!   [`USING`] of `C_out`): an idle sender sends no faster in a pulse;
//! - `C_out` has not been below the prior's bandwidth ([`BELOW_PRIOR`])
//!   with a queue on the link in the last [`QUIET`]: a link that showed
//!   itself slower than the prior (a 4G uplink, a shaped 1 Mbit/s) is not
//!   probed above it. There the estimator's fits and the climb back
//!   towards the prior already find the link.
//!
//! The gate on [`FASTER`] is why a link far from the broker is not always
//! found: at 100 Mbit/s 50 ms away a transaction read 3 % over the prior
//! in two of four runs (docs/lab/link-sweep.md).

use std::time::Duration;

use crate::link_estimate::{Extreme, WindowedExtreme};

/// How much faster than the estimate a pulse paces, a rung at a time:
/// BBR's `ProbeBW` gain (1.25) first and after a probe the link did not
/// keep up with; one rung up after each probe that proved more than its
/// base ([`GREW`]), while a fast link is being found.
pub const GAINS: [f64; 2] = [1.25, 1.5];

/// A probe grew the floor when it proved at least this multiple of its
/// base.
pub const GREW: f64 = 1.05;

/// How long a pulse (and the drain after it) lasts: three of the
/// scheduler's default 100 ms windows, since a new `C_out` takes effect
/// from the next window on.
pub const PULSE: Duration = Duration::from_millis(300);

/// Fewest batches a pulse must have sent for a verdict: the rates are
/// taken over the gaps between them.
pub const MIN_PULSE_BATCHES: usize = 4;

/// The link kept up with a pulse when it delivered at least this share of
/// the rate the pulse's batches were sent at.
pub const KEPT_UP: f64 = 0.95;

/// How long a rate a probe proved stays a floor of `C_out`.
pub const HOLD: Duration = Duration::from_secs(60);

/// Time from one verdict to the next probe after a probe the link kept
/// up with.
pub const FIRST_INTERVAL: Duration = Duration::from_millis(200);

/// How much longer the wait for the next probe grows after each probe
/// the link did not keep up with.
pub const BACK_OFF: u32 = 4;

/// Longest time between probes, after probes the link did not keep up
/// with (well within [`HOLD`], so that a proven floor is renewed before
/// it lapses).
pub const MAX_INTERVAL: Duration = Duration::from_secs(30);

/// A sender uses what it is given when its mean delivery rate is at least
/// this share of `C_out`.
pub const USING: f64 = 0.8;

/// A probe starts only on a link where some transaction showed at least
/// this multiple of the prior's bandwidth
/// ([`crate::link_estimate::CarriedBound`]).
pub const FASTER: f64 = 1.03;

/// A pulse starts only from an estimate at most this multiple of the
/// higher of the prior and the rate probes proved.
pub const AHEAD: f64 = 1.02;

/// `C_out` counts as below the prior under this share of its bandwidth.
pub const BELOW_PRIOR: f64 = 0.95;

/// How long a link that showed itself slower than the prior is not probed
/// above it.
pub const QUIET: Duration = Duration::from_secs(60);

/// What the egress measured of the link after a confirmation, as
/// [`Probe::step`] takes it (bandwidths in bytes per second).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Seen {
    /// The bandwidth `C_out` would be without the probe.
    pub acted: f64,
    /// The configured prior's.
    pub prior: f64,
    /// What single transactions showed the link carries
    /// ([`crate::link_estimate::CarriedBound`]).
    pub shown: f64,
    /// The sender's mean delivery rate.
    pub using: f64,
    /// Whether the link is not shown quiet
    /// ([`crate::link_estimate::QueueWatch::quiet`]).
    pub queued: bool,
    /// Whether round trips show a queue on the link
    /// ([`crate::link_estimate::QueueWatch::queued`]): `acted` under the
    /// prior shows the link slower than the prior only with one.
    pub backlog: bool,
}

/// Where the probe is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// No probe until then.
    Waiting { at: Duration },
    /// Pacing at `gain * base` until `until`.
    Pulse {
        base: f64,
        gain: f64,
        until: Duration,
    },
    /// Pacing at `(2 - gain) * base` until `until`.
    Drain {
        base: f64,
        gain: f64,
        until: Duration,
    },
    /// Waiting for the pulse's batches to be confirmed.
    Verdict { base: f64, gain: f64 },
}

/// What a verdict found, for metrics and tests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    /// The link carried the pulse: it carries at least `rate` bytes/s.
    KeptUp {
        /// The pulse's rate, as sent and delivered (the lower).
        rate: f64,
    },
    /// The link delivered `rate` bytes/s of a pulse sent faster.
    Full {
        /// What the link delivered.
        rate: f64,
    },
    /// The pulse sent too little to tell.
    NoVerdict,
}

/// The probe's state (see the module docs).
#[derive(Debug, Clone)]
pub struct Probe {
    phase: Phase,
    interval: Duration,
    /// Rates the probes proved, highest first within [`HOLD`].
    proven: WindowedExtreme,
    /// When `C_out` was last below the prior ([`BELOW_PRIOR`]) with a
    /// queue on the link.
    below_prior_at: Option<Duration>,
    /// The pulse's batches: (sent at, bytes), in sending order.
    sent: Vec<(Duration, u64)>,
    /// Their confirmations so far: (confirmed at, bytes).
    confirmed: Vec<(Duration, u64)>,
    /// The pulse under way (or last), numbered from 1.
    pulse: u32,
    /// The next pulse's gain, an index into [`GAINS`].
    rung: usize,
}

impl Probe {
    /// A probe that starts no earlier than [`FIRST_INTERVAL`] after `now`.
    pub fn new(now: Duration) -> Self {
        Self {
            phase: Phase::Waiting {
                at: now + FIRST_INTERVAL,
            },
            interval: FIRST_INTERVAL,
            proven: WindowedExtreme::default(),
            below_prior_at: None,
            sent: Vec::new(),
            confirmed: Vec::new(),
            pulse: 0,
            rung: 0,
        }
    }

    /// The highest rate a probe proved within [`HOLD`], bytes per second
    /// (0 without one): a floor of `C_out`.
    pub fn bound(&self) -> f64 {
        self.proven.best().unwrap_or(0.0)
    }

    /// Where the probe is: 0 waiting, 1 pulsing, 2 awaiting its verdict,
    /// 3 draining.
    pub fn phase(&self) -> u8 {
        match self.phase {
            Phase::Waiting { .. } => 0,
            Phase::Pulse { .. } => 1,
            Phase::Verdict { .. } => 2,
            Phase::Drain { .. } => 3,
        }
    }

    /// Whether a pulse is under way.
    pub fn pulsing(&self) -> bool {
        matches!(self.phase, Phase::Pulse { .. })
    }

    /// The rate to pace at now, given `acted`, the estimate acted on: its
    /// bandwidth, or the pulse's or the drain's.
    pub fn pace(&self, acted: f64) -> f64 {
        match self.phase {
            Phase::Pulse { base, gain, .. } => (base * gain).max(acted),
            Phase::Drain { base, gain, .. } => (base * (2.0 - gain)).min(acted),
            _ => acted,
        }
    }

    /// A batch of `bytes` goes at `now`: returns the pulse it is part
    /// of, if any, to be reported to [`Probe::confirmed`].
    pub fn sent(&mut self, now: Duration, bytes: u64) -> Option<u32> {
        self.pulsing().then(|| {
            self.sent.push((now, bytes));
            self.pulse
        })
    }

    /// A batch of `bytes` sent in `pulse` was confirmed at `now`.
    pub fn confirmed(&mut self, now: Duration, bytes: u64, pulse: u32) {
        if pulse == self.pulse && self.confirmed.len() < self.sent.len() {
            self.confirmed.push((now, bytes));
        }
    }

    /// Everything unconfirmed goes again (a failure): the pulse under way,
    /// if any, teaches nothing.
    pub fn abort(&mut self, now: Duration) {
        self.sent.clear();
        self.confirmed.clear();
        self.pulse += 1;
        if !matches!(self.phase, Phase::Waiting { .. }) {
            self.phase = Phase::Waiting {
                at: now + self.interval,
            };
        }
    }

    /// After a confirmation at `now`: `acted` is the bandwidth `C_out`
    /// would be without the probe, `prior` the configured one, `shown`
    /// what single transactions showed the link carries
    /// ([`crate::link_estimate::CarriedBound`]), `using` the sender's mean
    /// delivery rate, `queued` whether the link holds a queue. Moves the
    /// probe on; returns the verdict if one was reached.
    pub fn step(&mut self, now: Duration, link: Seen) -> Option<Verdict> {
        let Seen {
            acted,
            prior,
            shown,
            using,
            queued,
            backlog,
        } = link;
        // Without a queue on the link, an estimate under the prior is the
        // sender's own pace read back (a sender paced at `C_out` is
        // confirmed at `C_out`, with its jitter), not a slow link: on a
        // 100 Mbit/s link, 5 ms away, under the 18 Mbit/s prior, fits
        // dipped under it and kept the probe off in two of five runs.
        if acted < BELOW_PRIOR * prior && backlog {
            self.below_prior_at = Some(now);
        }
        match self.phase {
            Phase::Waiting { at } => {
                let quiet = self
                    .below_prior_at
                    .is_none_or(|t| now.saturating_sub(t) >= QUIET);
                // An estimate above both the prior and what probes proved
                // runs ahead of the evidence already (fits of a busy
                // link): a pulse from it would start over the link.
                let evidenced = acted <= AHEAD * prior.max(shown).max(self.bound());
                // Only a link some transaction showed faster than the
                // prior: on one the prior fills (a 4G uplink at the
                // default 18 Mbit/s) a pulse finds no room and leaves a
                // queue ahead of the urgent class (in the real-process
                // JANUS lab, 0.9-2.9 % of `ls` records late on their own
                // links with probes there, none without).
                let faster = shown > FASTER * prior;
                if now >= at && quiet && faster && evidenced && !queued && using >= USING * acted {
                    self.sent.clear();
                    self.confirmed.clear();
                    self.pulse += 1;
                    self.phase = Phase::Pulse {
                        base: acted,
                        gain: GAINS[self.rung],
                        until: now + PULSE,
                    };
                }
                None
            }
            Phase::Pulse { base, gain, until } => {
                // A link that falls behind the pulse ends it at once.
                let judged = self.confirmed.len();
                let long_enough = judged >= MIN_PULSE_BATCHES
                    && self.sent[judged - 1].0.saturating_sub(self.sent[0].0) >= PULSE / 3;
                if long_enough {
                    if let Verdict::Full { .. } = self.verdict(judged, base, gain) {
                        if self.sent_rate(judged) >= base {
                            self.phase = Phase::Verdict { base, gain };
                            return self.judge(now, true);
                        }
                    }
                }
                // Until it has sent enough batches to be judged (large
                // batches on a slow estimate go a few a second), within
                // four times its length.
                let sent_enough = self.sent.len() >= MIN_PULSE_BATCHES;
                if now >= until && (sent_enough || now >= until + PULSE * 3) {
                    self.phase = Phase::Verdict { base, gain };
                }
                None
            }
            Phase::Verdict { .. } => self.judge(now, false),
            Phase::Drain { until, .. } => {
                if now >= until {
                    self.phase = Phase::Waiting {
                        at: now + self.interval,
                    };
                }
                None
            }
        }
    }

    /// Once every pulse batch is confirmed: the verdict; then a drain
    /// where the link did not keep up, and the next probe's time.
    fn judge(&mut self, now: Duration, behind: bool) -> Option<Verdict> {
        let Phase::Verdict { base, gain } = self.phase else {
            return None;
        };
        // All of the pulse's batches, or (where the round trip is shorter
        // than the pulse) those of its first half or more: a link that
        // could not keep up starts its drain a round trip sooner.
        let judged = self.confirmed.len();
        let early = judged >= MIN_PULSE_BATCHES
            && self.sent[judged - 1].0.saturating_sub(self.sent[0].0) >= PULSE / 2;
        if judged < self.sent.len() && !early && !behind {
            return None;
        }
        let verdict = self.verdict(judged, base, gain);
        match verdict {
            Verdict::KeptUp { rate } => {
                self.proven.push(now, rate, HOLD, Extreme::Highest);
                if rate >= GREW * base {
                    self.rung = (self.rung + 1).min(GAINS.len() - 1);
                }
                self.interval = FIRST_INTERVAL;
                self.phase = Phase::Waiting {
                    at: now + self.interval,
                };
            }
            Verdict::Full { rate } => {
                // What the link delivered of more than it could take; a
                // broker's bunched confirms can make that read a little
                // over what it carries, so never above the rate the pulse
                // started from.
                // And what probes proved before is forgotten: a link that
                // could not take this pulse may have been proved faster
                // than it is (confirms that came in a bunch), and a floor
                // above the link would keep a queue standing on it.
                self.proven = WindowedExtreme::default();
                self.proven
                    .push(now, rate.min(base), HOLD, Extreme::Highest);
                self.interval = (self.interval * BACK_OFF).min(MAX_INTERVAL);
                self.rung = 0;
                self.phase = Phase::Drain {
                    base,
                    gain,
                    until: now + PULSE,
                };
            }
            Verdict::NoVerdict => {
                self.phase = Phase::Waiting {
                    at: now + self.interval,
                };
            }
        }
        self.sent.clear();
        self.confirmed.clear();
        self.pulse += 1;
        Some(verdict)
    }

    /// The rate the pulse's first `judged` batches were sent at (0 for
    /// fewer than two).
    fn sent_rate(&self, judged: usize) -> f64 {
        rate(&self.sent[..judged]).unwrap_or(0.0)
    }

    /// The pulse's first `judged` batches against what came back, for a
    /// pulse from `base` at `gain`.
    fn verdict(&self, judged: usize, base: f64, gain: f64) -> Verdict {
        if judged < MIN_PULSE_BATCHES {
            return Verdict::NoVerdict;
        }
        let (Some(sent), Some(delivered)) = (rate(&self.sent[..judged]), rate(&self.confirmed))
        else {
            return Verdict::NoVerdict;
        };
        // Kept up with what was sent, or (a burst sent faster than the
        // pulse's pace) with the pulse's pace at least.
        let kept_up = delivered >= KEPT_UP * sent || delivered >= KEPT_UP * gain * base;
        match kept_up {
            true => Verdict::KeptUp {
                rate: sent.min(delivered),
            },
            false => Verdict::Full { rate: delivered },
        }
    }
}

/// Bytes per second over `(time, bytes)` events: a batch's bytes gathered
/// before it was sent and crossed the link before its confirmation, so
/// the bytes after the first over the span from the first to the last.
fn rate(v: &[(Duration, u64)]) -> Option<f64> {
    let (first, last) = (v.first()?, v.last()?);
    let span = last.0.saturating_sub(first.0).as_secs_f64();
    let bytes: u64 = v[1..].iter().map(|b| b.1).sum();
    (span > 0.0).then(|| bytes as f64 / span)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    const MS: Duration = Duration::from_millis(1);

    /// On a link a transaction showed faster than the prior.
    fn seen(acted: f64, prior: f64, using: f64, queued: bool) -> Seen {
        Seen {
            acted,
            prior,
            shown: 2.0 * prior,
            using,
            queued,
            backlog: queued,
        }
    }

    /// Runs one probe against a link of `link` bytes/s with a round trip
    /// of `rtt`, the sender always having more than the pace to send, in
    /// batches of `batch` bytes; returns the verdict, the probe and the
    /// longest queue the link held, in time.
    fn probe_once(acted: f64, link: f64, rtt: Duration, batch: u64) -> (Verdict, Probe, Duration) {
        let mut p = Probe::new(Duration::ZERO);
        let mut now = FIRST_INTERVAL;
        let mut link_free = now;
        let mut flight: VecDeque<(Duration, u64, Option<u32>)> = VecDeque::new();
        let mut next_send = now;
        let mut longest = Duration::ZERO;
        loop {
            // Send at the pace in force.
            while next_send <= now {
                let pulse = p.sent(next_send, batch);
                let start = link_free.max(next_send);
                longest = longest.max(start - next_send);
                link_free = start + Duration::from_secs_f64(batch as f64 / link);
                flight.push_back((link_free + rtt, batch, pulse));
                next_send += Duration::from_secs_f64(batch as f64 / p.pace(acted));
            }
            while flight.front().is_some_and(|f| f.0 <= now) {
                let (at, bytes, pulse) = flight.pop_front().unwrap();
                if let Some(id) = pulse {
                    p.confirmed(at, bytes, id);
                }
            }
            if let Some(v) = p.step(now, seen(acted, 2e6, acted, false)) {
                return (v, p, longest);
            }
            now += MS;
            assert!(now < Duration::from_secs(10), "no verdict");
        }
    }

    #[test]
    fn a_link_with_room_keeps_up_and_its_rate_becomes_a_floor() {
        let (v, p, _) = probe_once(2e6, 12.5e6, MS * 50, 16 << 10);
        let Verdict::KeptUp { rate } = v else {
            panic!("{v:?}")
        };
        assert!(rate > 2e6 * 1.2 && rate < 2e6 * 1.3, "{rate}");
        assert_eq!(p.bound(), rate);
        assert_eq!(p.rung, 1, "the next pulse steps further");
        assert!(!matches!(p.phase, Phase::Drain { .. }), "no drain");
    }

    #[test]
    fn a_full_link_is_found_full_drained_and_proves_only_what_it_carried() {
        let (v, p, longest) = probe_once(2e6, 2.05e6, MS * 50, 16 << 10);
        let Verdict::Full { rate } = v else {
            panic!("{v:?}")
        };
        assert!(rate <= 2.05e6 * 1.01, "{rate}");
        assert!(p.bound() <= 2e6, "never above the pulse's base");
        assert_eq!(p.interval, FIRST_INTERVAL * BACK_OFF, "backs off");
        assert!(matches!(p.phase, Phase::Drain { .. }));
        assert!(p.pace(2e6) < 2e6);
        // Judged on the pulse's first half: the queue it left is under
        // what the whole pulse and a round trip would have.
        assert!(longest < PULSE.mul_f64(GAINS[0] - 1.0), "{longest:?}");
    }

    #[test]
    fn no_probe_on_a_link_no_transaction_showed_faster_than_the_prior() {
        let mut p = Probe::new(Duration::ZERO);
        let mut s = seen(2e6, 2e6, 2e6, false);
        // Over the prior, but by less than the gate.
        s.shown = 2e6 * (1.0 + (FASTER - 1.0) / 2.0);
        p.step(FIRST_INTERVAL, s);
        assert!(!p.pulsing());
        s.shown = 2e6 * FASTER * 1.05;
        p.step(FIRST_INTERVAL + MS, s);
        assert!(p.pulsing());
    }

    #[test]
    fn an_estimate_under_the_prior_without_a_queue_does_not_stop_probes() {
        let mut p = Probe::new(Duration::ZERO);
        p.step(MS, seen(1e6, 2e6, 1e6, false));
        p.step(FIRST_INTERVAL * 2, seen(2e6, 2e6, 2e6, false));
        assert!(p.pulsing(), "no queue: the sender's own pace read back");
    }

    #[test]
    fn no_probe_on_a_link_below_the_prior_or_queued_or_for_an_idle_sender() {
        let mut p = Probe::new(Duration::ZERO);
        p.step(MS, seen(1e6, 2e6, 1e6, true));
        p.step(FIRST_INTERVAL * 2, seen(2e6, 2e6, 2e6, false));
        assert!(!p.pulsing(), "below the prior within QUIET");
        p.step(QUIET + MS * 2, seen(2e6, 2e6, 2e6, true));
        assert!(!p.pulsing(), "a queue on the link");
        p.step(QUIET + MS * 3, seen(2e6, 2e6, 2e6, false));
        assert!(p.pulsing(), "QUIET later, no queue");

        let mut idle = Probe::new(Duration::ZERO);
        idle.step(FIRST_INTERVAL, seen(2e6, 2e6, 0.5e6, false));
        assert!(!idle.pulsing(), "a sender using a quarter of C_out");
    }

    #[test]
    fn a_pulse_paces_above_the_base_and_teaches_nothing_without_batches() {
        let mut p = Probe::new(Duration::ZERO);
        p.step(FIRST_INTERVAL, seen(2e6, 2e6, 2e6, false));
        assert_eq!(p.pace(2e6), 2e6 * GAINS[0]);
        let v = p.step(FIRST_INTERVAL + PULSE, seen(2e6, 2e6, 2e6, false));
        assert_eq!(v, None);
        assert!(p.pulsing(), "a pulse that sent nothing goes on");
        let v = p.step(FIRST_INTERVAL + PULSE * 4, seen(2e6, 2e6, 2e6, false));
        assert_eq!(v, None, "the pulse gave up");
        let v = p.step(FIRST_INTERVAL + PULSE * 4 + MS, seen(2e6, 2e6, 2e6, false));
        assert_eq!(v, Some(Verdict::NoVerdict));
        assert_eq!(p.pace(2e6), 2e6);
        assert_eq!(p.bound(), 0.0);
    }

    #[test]
    fn confirmations_of_an_aborted_pulse_are_ignored() {
        let mut p = Probe::new(Duration::ZERO);
        p.step(FIRST_INTERVAL, seen(2e6, 2e6, 2e6, false));
        let id = p.sent(FIRST_INTERVAL, 1000).expect("in the pulse");
        p.abort(FIRST_INTERVAL + MS);
        p.confirmed(FIRST_INTERVAL + MS * 2, 1000, id);
        assert!(p.confirmed.is_empty());
        assert!(!p.pulsing());
    }
}
