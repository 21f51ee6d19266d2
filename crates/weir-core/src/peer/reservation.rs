//! A provider's reservations: grants within its unreserved spare, the shift of
//! its allocation (Fig. 4), and admission of forwarded records within each
//! reservation's rate ([`Reservations`]).

use std::collections::BTreeMap;
use std::time::Duration;

use super::pacing::Pacing;
use crate::class::ClassId;
use crate::janus::redirect::MIN_AMOUNT;
use crate::janus::{non_negative, Grant};
use crate::queueing::token_bucket::{Take, TokenBucket};
use crate::record::NodeId;

/// How a provider grants and polices reservations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReservationConfig {
    /// Longest lease granted: a reservation not renewed within it is
    /// released, so a receiver that died frees its share by itself.
    pub lease: Duration,
    /// Bucket depth of each reservation.
    pub pacing: Pacing,
}

/// One reservation held by a provider for a receiver's class.
#[derive(Debug, Clone)]
pub(crate) struct Reservation {
    rate: f64,
    expires: Duration,
    bucket: TokenBucket,
    flow: Flow,
}

/// How often a reservation's admitted rate is re-measured.
pub const FLOW_WINDOW: Duration = Duration::from_millis(250);

/// The rate actually admitted under one reservation, measured over
/// [`FLOW_WINDOW`]s.
#[derive(Debug, Clone, Default)]
pub(crate) struct Flow {
    since: Duration,
    units: f64,
    rate: f64,
}

impl Flow {
    fn starting(now: Duration) -> Self {
        Flow {
            since: now,
            ..Flow::default()
        }
    }

    fn roll(&mut self, now: Duration) {
        let elapsed = now.saturating_sub(self.since);
        if elapsed >= FLOW_WINDOW {
            self.rate = self.units / elapsed.as_secs_f64();
            self.units = 0.0;
            self.since = now;
        }
    }

    fn add(&mut self, now: Duration, units: usize) {
        self.roll(now);
        self.units += units as f64;
    }

    fn rate(&mut self, now: Duration) -> f64 {
        self.roll(now);
        self.rate
    }
}

/// What [`Reservations::grant`] decided.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reserved {
    /// Units/s reserved; 0 means none (any previous one is released).
    pub amount: f64,
    /// How long it lasts unless renewed (zero when nothing was reserved).
    pub lease: Duration,
    /// The allocation shift this grant calls for (Fig. 4's `BWReserve`,
    /// for `Pbtt::apply_grant`): the growth over the receiver's previous
    /// reservation of the class. A shrink needs none: the freed rate shows
    /// up as spare at the next PBTT window.
    pub shift: Option<Grant>,
}

/// Whether a forwarded record may enter the provider's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Within the reservation's rate.
    Accepted,
    /// No reservation for this receiver and class, or it expired.
    NoReservation,
    /// Beyond the reservation's rate and burst.
    OverRate,
}

/// The provider side: reservations per (receiver, class), granted from
/// spare not reserved for others, each enforced by its own token bucket.
#[derive(Debug, Clone)]
pub struct Reservations {
    provider: NodeId,
    config: ReservationConfig,
    entries: BTreeMap<(NodeId, ClassId), Reservation>,
}

impl Reservations {
    /// No reservations yet at node `provider`.
    pub fn new(provider: NodeId, config: ReservationConfig) -> Self {
        Reservations {
            provider,
            config,
            entries: BTreeMap::new(),
        }
    }

    /// `receiver` asks for `asked` units/s of `class` for `lease` (zero:
    /// the provider's longest); `spare` is what this node can lend now (its
    /// tuple's total spare).
    ///
    /// Grants `min(asked, spare - reserved for others)`: the receiver's own
    /// previous reservation of the class is replaced, not added to, so a
    /// renewal is judged afresh.
    ///
    /// `spare` is what the node can lend *counting what its reservations
    /// carry now as lendable* ([`lendable`](crate::peer::lendable)): the PBTT tuple's Eq. 22
    /// demands already include the forwarded records in the provider's
    /// queues, so its bare spare would count every flowing reservation
    /// twice (once as load, once as reserved), and a renewal would shrink
    /// the grant it renews (measured in the JANUS lab: a provider with
    /// 2.2 MB/s spare settled near 1 MB/s per receiver). A reservation not
    /// yet carrying anything is not in the demands and counts once, as
    /// reserved. So the sum reserved never exceeds the capacity the node's
    /// own traffic leaves, unless it already did before this call (spare
    /// can shrink under reservations made earlier; those then run out with
    /// their leases).
    pub fn grant(
        &mut self,
        receiver: NodeId,
        class: ClassId,
        asked: f64,
        lease: Duration,
        now: Duration,
        spare: f64,
    ) -> Reserved {
        self.expire(now);
        let key = (receiver, class);
        let previous = self.entries.get(&key).map_or(0.0, |r| r.rate);
        let others = non_negative(self.reserved() - previous);
        let amount = non_negative(asked).min(non_negative(non_negative(spare) - others));
        if amount <= MIN_AMOUNT {
            self.entries.remove(&key);
            return Reserved {
                amount: 0.0,
                lease: Duration::ZERO,
                shift: None,
            };
        }
        let lease = if lease.is_zero() {
            self.config.lease
        } else {
            lease.min(self.config.lease)
        };
        let expires = now.saturating_add(lease);
        let pacing = self.config.pacing;
        match self.entries.get_mut(&key) {
            Some(r) => {
                pacing.retune(&mut r.bucket, amount, now);
                r.rate = amount;
                r.expires = expires;
            }
            None => {
                self.entries.insert(
                    key,
                    Reservation {
                        rate: amount,
                        expires,
                        bucket: pacing.bucket(amount, now),
                        flow: Flow::starting(now),
                    },
                );
            }
        }
        let growth = amount - previous;
        Reserved {
            amount,
            lease,
            shift: (growth > MIN_AMOUNT).then_some(Grant {
                provider: self.provider,
                receiver,
                class,
                amount: growth,
            }),
        }
    }

    /// Ends `receiver`'s reservation of `class` now; returns its rate.
    pub fn release(&mut self, receiver: NodeId, class: ClassId) -> f64 {
        self.entries
            .remove(&(receiver, class))
            .map_or(0.0, |r| r.rate)
    }

    /// Ends every reservation of `receiver` (it is gone); returns their
    /// total rate.
    pub fn release_all(&mut self, receiver: NodeId) -> f64 {
        let mut freed = 0.0;
        self.entries.retain(|&(r, _), res| {
            let keep = r != receiver;
            if !keep {
                freed += res.rate;
            }
            keep
        });
        freed
    }

    /// Whether a forwarded record of `units` (its size) from `receiver` in
    /// `class` may be enqueued at `now`; takes its tokens if so.
    pub fn admit(
        &mut self,
        receiver: NodeId,
        class: ClassId,
        units: usize,
        now: Duration,
    ) -> Admission {
        let key = (receiver, class);
        let Some(r) = self.entries.get_mut(&key) else {
            return Admission::NoReservation;
        };
        if now >= r.expires {
            self.entries.remove(&key);
            return Admission::NoReservation;
        }
        match r.bucket.try_take(now, units, 1) {
            Take::Granted => {
                r.flow.add(now, units);
                Admission::Accepted
            }
            Take::Wait(_) => Admission::OverRate,
        }
    }

    /// What the reservations carry now: each one's admitted rate over the
    /// last [`FLOW_WINDOW`], at most its reserved rate.
    pub fn carried(&mut self, now: Duration) -> f64 {
        self.entries
            .values_mut()
            .map(|r| r.flow.rate(now).min(r.rate))
            .sum()
    }

    /// Releases every reservation whose lease has run out by `now`;
    /// returns them as (receiver, class, rate).
    pub fn expire(&mut self, now: Duration) -> Vec<(NodeId, ClassId, f64)> {
        let mut released = Vec::new();
        self.entries.retain(|&(receiver, class), r| {
            let keep = now < r.expires;
            if !keep {
                released.push((receiver, class, r.rate));
            }
            keep
        });
        released
    }

    /// Total units/s reserved now (leases not yet expired by a call).
    pub fn reserved(&self) -> f64 {
        self.entries.values().map(|r| r.rate).sum()
    }

    /// The rate reserved for `receiver`'s `class` (0 if none).
    pub fn reserved_for(&self, receiver: NodeId, class: ClassId) -> f64 {
        self.entries.get(&(receiver, class)).map_or(0.0, |r| r.rate)
    }

    /// Number of reservations held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when none is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every reservation as (receiver, class, rate, expiry).
    pub fn iter(&self) -> impl Iterator<Item = (NodeId, ClassId, f64, Duration)> + '_ {
        self.entries
            .iter()
            .map(|(&(n, c), r)| (n, c, r.rate, r.expires))
    }

    /// The provider's own node id.
    pub fn provider(&self) -> NodeId {
        self.provider
    }

    /// The configuration.
    pub fn config(&self) -> ReservationConfig {
        self.config
    }
}
