//! Peering without a coordinator: JANUS Section V-B (bandwidth tuples,
//! Algorithm 3 and its baselines, the reservation of Fig. 4) run by every
//! node over its own view of the others, each provider being the only
//! authority over its own spare.
//!
//! JANUS collects every node's tuple at a central orchestrator (a primary
//! with hot standbys) that runs the matcher and tells receivers and
//! providers what to do; the paper names that orchestrator as its
//! bottleneck (Section VI, "Scalability"). Here every node:
//! 1. advertises its PBTT tuple on heartbeats and keeps the latest
//!    [`Advert`] of every peer in a [`PeerView`]; a peer not heard from for
//!    `dead_after` is gone;
//! 2. each round runs the *same* deterministic matcher ([`redirect()`]) over
//!    its view plus its own tuple ([`decide`]) and keeps only the grants in
//!    which it is the receiver;
//! 3. asks each of those providers to reserve the granted rate for a lease.
//!    The provider grants at most the spare it has not already reserved for
//!    others ([`Reservations::grant`]), shifts its allocation as in Fig. 4
//!    ([`Reserved::shift`]), and admits forwarded records only within a
//!    token bucket at the granted rate ([`Reservations::admit`]);
//! 4. sends at most the granted rate ([`Leases`]) and keeps every record it
//!    sent until the provider acknowledges it ([`InFlight`]); the provider
//!    acknowledges a record only once it has delivered it ([`Custody`]).
//!
//! Why no coordinator is needed: views may be stale or differ between nodes
//! (a heartbeat lost, a peer seen dead by one node and alive by another),
//! so two receivers may both be matched to the same spare. The provider
//! then grants the first and refuses what no longer fits; a receiver whose
//! lease was cut short has its records refused and takes them back. Either
//! way the cost is an unused reservation or a refused record, never a
//! provider carrying more than the spare it had when it said yes.
//!
//! Units are whatever the tuples use (weir: bytes/s; a record counts for
//! [`Record::size`] bytes); time is a [`Duration`] since any epoch the
//! caller picks.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::class::ClassId;
use crate::janus::redirect::MIN_AMOUNT;
use crate::janus::{
    non_negative, offer_from, redirect, requests_from, Allocation, BandwidthTuple, Grant, Offer,
    Strategy,
};
use crate::record::{NodeId, Record};
use crate::token_bucket::{BucketConfig, Take, TokenBucket};

/// A node's bandwidth as its scheduler last computed it: what it advertises
/// and what it runs with.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BandwidthState {
    /// Spare (positive) or shortage (negative) per class (JANUS V-B1).
    pub tuple: BandwidthTuple,
    /// Per-class rates `V_c` in force.
    pub allocation: Allocation,
    /// `C_out`, the node's outbound capacity, in the tuple's units.
    pub capacity: f64,
    /// The rate at which the node's own traffic arrives (everything but
    /// what peers forward to it), smoothed over about a second.
    pub own_rate: f64,
    /// Whether a class's estimated delay (Eq. 1) broke its bound in the
    /// last window: the node is falling behind, whatever it thought it had.
    pub late: bool,
}

impl BandwidthState {
    /// A node at `tuple` with nothing else known: its capacity taken as
    /// the tuple's spare, no own traffic, not late (so it lends
    /// [`LEND_SHARE`] of that spare). For tests and tools that set tuples
    /// by hand.
    pub fn from_tuple(tuple: BandwidthTuple) -> Self {
        BandwidthState {
            capacity: tuple.spare_total(),
            tuple,
            ..BandwidthState::default()
        }
    }
}

/// What one heartbeat told about a node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Advert {
    /// The sender's message number, increasing for its whole life: a
    /// heartbeat older than one already seen is ignored.
    pub round: u64,
    /// The node's tuple.
    pub tuple: BandwidthTuple,
    /// When its current shortage began, microseconds since the Unix epoch
    /// by its own clock (0 when it has none). FCFS serves the earliest
    /// first; every node sees the same stamp, since the requester sets it.
    pub requesting_since_us: u64,
}

/// A peer's latest advert and when it arrived.
#[derive(Debug, Clone)]
struct Heard {
    advert: Advert,
    received: Duration,
}

/// What [`PeerView::observe`] made of a heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// A peer not known, or known and gone, is (again) alive.
    Joined,
    /// A newer advert of a live peer.
    Updated,
    /// Not newer than the advert held (a reordered or repeated message):
    /// ignored, so the view never goes back in time.
    Stale,
}

/// One node's view of its peers: the latest advert of each, alive while
/// heard from within `dead_after`.
#[derive(Debug, Clone)]
pub struct PeerView {
    dead_after: Duration,
    peers: BTreeMap<NodeId, Heard>,
}

impl PeerView {
    /// An empty view in which a peer is gone after `dead_after` of silence.
    pub fn new(dead_after: Duration) -> Self {
        PeerView {
            dead_after,
            peers: BTreeMap::new(),
        }
    }

    /// Records a heartbeat from `peer` received at `now`.
    ///
    /// A peer that is gone may come back with a smaller round (it restarted
    /// with a clock that went back), so rounds are only compared while it
    /// is alive.
    pub fn observe(&mut self, peer: NodeId, advert: Advert, now: Duration) -> Observed {
        let dead_after = self.dead_after;
        match self.peers.get_mut(&peer) {
            Some(h) => {
                let alive = now.saturating_sub(h.received) < dead_after;
                if alive && advert.round <= h.advert.round {
                    return Observed::Stale;
                }
                *h = Heard {
                    advert,
                    received: now,
                };
                if alive {
                    Observed::Updated
                } else {
                    Observed::Joined
                }
            }
            None => {
                self.peers.insert(
                    peer,
                    Heard {
                        advert,
                        received: now,
                    },
                );
                Observed::Joined
            }
        }
    }

    /// True if `peer` was heard from less than `dead_after` before `now`.
    pub fn is_alive(&self, peer: NodeId, now: Duration) -> bool {
        self.peers
            .get(&peer)
            .is_some_and(|h| now.saturating_sub(h.received) < self.dead_after)
    }

    /// The live peers and their latest adverts, by node id.
    pub fn alive(&self, now: Duration) -> impl Iterator<Item = (NodeId, &Advert)> + '_ {
        self.peers
            .iter()
            .filter(move |(_, h)| now.saturating_sub(h.received) < self.dead_after)
            .map(|(&id, h)| (id, &h.advert))
    }

    /// How many peers are alive at `now`.
    pub fn alive_count(&self, now: Duration) -> usize {
        self.alive(now).count()
    }

    /// The latest advert of `peer`, alive or not.
    pub fn advert(&self, peer: NodeId) -> Option<&Advert> {
        self.peers.get(&peer).map(|h| &h.advert)
    }

    /// When `peer` was last heard from.
    pub fn last_heard(&self, peer: NodeId) -> Option<Duration> {
        self.peers.get(&peer).map(|h| h.received)
    }

    /// The silence after which a peer is gone.
    pub fn dead_after(&self) -> Duration {
        self.dead_after
    }
}

/// Every grant `strategy` makes over these nodes (id, tuple, request
/// order): the whole system's matching as one node sees it.
pub fn match_nodes<'a>(
    strategy: Strategy,
    nodes: impl IntoIterator<Item = (NodeId, &'a BandwidthTuple, u64)>,
) -> Vec<Grant> {
    let mut requests = Vec::new();
    let mut offers = Vec::new();
    for (node, tuple, order) in nodes {
        requests.extend(requests_from(node, tuple, order));
        offers.extend(offer_from(node, tuple));
    }
    redirect(strategy, &requests, &offers)
}

/// One round at node `me`: the matcher over `me`'s own advert and its live
/// peers' (JANUS Algorithm 3 with the orchestrator's input, gathered by
/// heartbeats instead), keeping the grants in which `me` receives. Each is
/// a reservation `me` asks its provider for.
///
/// Every node runs this on what it knows; where views agree, nodes agree on
/// the whole matching, and where they do not, providers arbitrate
/// ([`Reservations::grant`]).
pub fn decide(
    strategy: Strategy,
    me: NodeId,
    own: &Advert,
    view: &PeerView,
    now: Duration,
) -> Vec<Grant> {
    let nodes = std::iter::once((me, &own.tuple, own.requesting_since_us)).chain(
        view.alive(now)
            .filter(|&(id, _)| id != me)
            .map(|(id, a)| (id, &a.tuple, a.requesting_since_us)),
    );
    let mut grants = match_nodes(strategy, nodes);
    // A grant from `me` to `me` would be a local reallocation, which PBTT
    // already did; a valid tuple never both offers and asks.
    grants.retain(|g| g.receiver == me && g.provider != me);
    grants
}

/// What a receiver asks its providers for in one round, from the matcher's
/// grants to it and the leases it already holds (provider, class, rate):
/// one Reserve per (provider, class), each replacing the previous one.
///
/// The matcher decides *how much* each class of this node gets (its total
/// grant, by the configured strategy); which providers carry it is sticky:
/// the leases already held are renewed first (largest first, up to that
/// total), and only the rest is asked of the providers the matcher named,
/// in its order. A held lease beyond the total is asked down (to zero:
/// released), so the spare moves to whoever the matcher gave it.
///
/// Why: the matcher's provider choice flips whenever two receivers' shares
/// cross (PMRFS serves the larger first, from the largest provider), and
/// a flip made each receiver ask for the provider the other one held; the
/// provider, which never reserves what it has already reserved, granted
/// little, and both lost part of a round. Totals, not provider names, are
/// what the matching fixes; the providers' reservations then stay put
/// while the totals move a little each round. Measured in the JANUS lab at
/// 93 % of the cluster's capacity (720 B records), two runs each: 10,382
/// and 9,678 records/s with sticky asks, 10,090 and 9,526 asking the
/// matched providers as named (`lt` 0 / 25 % late against 0 / 32 %): a
/// small gain, in the same direction in both. Classes this node was
/// granted nothing in are left alone: their leases run out by themselves.
pub fn first_asks(grants: &[Grant], held: &[(NodeId, ClassId, f64)]) -> Vec<Grant> {
    let mut asks: Vec<Grant> = Vec::new();
    let mut classes: Vec<ClassId> = grants.iter().map(|g| g.class).collect();
    classes.sort_unstable();
    classes.dedup();
    for class in classes {
        let mine = grants.iter().filter(|g| g.class == class);
        let Some(receiver) = mine.clone().next().map(|g| g.receiver) else {
            continue;
        };
        let mut rest: f64 = mine.clone().map(|g| non_negative(g.amount)).sum();
        let start = asks.len();
        let mut leases: Vec<(NodeId, f64)> = held
            .iter()
            .filter(|&&(_, c, rate)| c == class && rate > MIN_AMOUNT)
            .map(|&(p, _, rate)| (p, rate))
            .collect();
        leases.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        for (provider, rate) in leases {
            let amount = rate.min(rest);
            rest -= amount;
            asks.push(Grant {
                provider,
                receiver,
                class,
                amount,
            });
        }
        for g in mine {
            if rest <= MIN_AMOUNT {
                break;
            }
            let more = non_negative(g.amount).min(rest);
            rest -= more;
            match asks[start..].iter_mut().find(|a| a.provider == g.provider) {
                Some(a) => a.amount += more,
                None => asks.push(Grant { amount: more, ..*g }),
            }
        }
    }
    asks
}

/// The second step of a round: after the [`first_asks`] were answered
/// (`answered`: each ask with the amount granted), asks providers with room
/// for what the first ones could not grant, per class.
///
/// A provider that granted less than asked is full; the others are tried
/// from the largest advertised spare down (`offers`, the view's), each for
/// what it grants already plus as much of the shortfall as it advertises,
/// until the shortfall is covered on paper. The provider decides what it
/// really has; one step of spill-over is enough for two receivers trading
/// places, and the next round starts from whatever was granted.
pub fn spill_asks(answered: &[(Grant, f64)], offers: &[Offer]) -> Vec<Grant> {
    let full: Vec<NodeId> = answered
        .iter()
        .filter(|(a, got)| *got + MIN_AMOUNT < a.amount)
        .map(|(a, _)| a.provider)
        .collect();
    let mut offers: Vec<Offer> = offers
        .iter()
        .filter(|o| o.amount > MIN_AMOUNT && !full.contains(&o.provider))
        .copied()
        .collect();
    offers.sort_unstable_by(|a, b| {
        b.amount
            .total_cmp(&a.amount)
            .then(a.provider.cmp(&b.provider))
    });
    let mut classes: Vec<ClassId> = answered.iter().map(|(a, _)| a.class).collect();
    classes.sort_unstable();
    classes.dedup();
    let mut asks = Vec::new();
    for class in classes {
        let of_class = || answered.iter().filter(move |(a, _)| a.class == class);
        let mut short: f64 = of_class()
            .map(|(a, got)| non_negative(a.amount - non_negative(*got)))
            .sum();
        let Some(receiver) = of_class().next().map(|(a, _)| a.receiver) else {
            continue;
        };
        for o in offers.iter_mut() {
            if short <= MIN_AMOUNT {
                break;
            }
            let more = o.amount.min(short);
            let already = of_class()
                .find(|(a, _)| a.provider == o.provider)
                .map_or(0.0, |(_, got)| non_negative(*got));
            short -= more;
            o.amount -= more;
            asks.push(Grant {
                provider: o.provider,
                receiver,
                class,
                amount: already + more,
            });
        }
    }
    asks
}

/// The offers in `view` of the live peers other than `me` (spare as each
/// last advertised it).
pub fn offers_in(view: &PeerView, me: NodeId, now: Duration) -> Vec<Offer> {
    view.alive(now)
        .filter(|&(id, _)| id != me)
        .filter_map(|(id, a)| offer_from(id, &a.tuple))
        .collect()
}

/// How a reservation's token bucket is sized: deep enough for the bunching
/// of batched sends and network jitter, shallow enough that the burst stays
/// a small fraction of what was granted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pacing {
    /// Depth as time at the granted rate.
    pub burst: Duration,
    /// Least depth in units, so that a large record still conforms.
    pub min_burst: f64,
}

impl Pacing {
    /// The depth of a bucket at `rate` units/s.
    pub fn depth(&self, rate: f64) -> f64 {
        (non_negative(rate) * self.burst.as_secs_f64()).max(non_negative(self.min_burst))
    }

    fn bucket(&self, rate: f64, now: Duration) -> TokenBucket {
        TokenBucket::new(BucketConfig::bytes(rate, self.depth(rate)), now)
    }

    fn retune(&self, bucket: &mut TokenBucket, rate: f64, now: Duration) {
        bucket.set_bytes_per_sec(now, rate);
        bucket.set_burst_bytes(now, self.depth(rate));
    }
}

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
struct Reservation {
    rate: f64,
    expires: Duration,
    bucket: TokenBucket,
    flow: Flow,
}

/// The share of what a provider could lend that it offers: the rest is
/// headroom for its own classes' bursts, so carrying for peers does not
/// make the provider short itself (its Eq. 22 demands then turn it into a
/// receiver, and lent records travel on).
pub const LEND_SHARE: f64 = 0.9;

/// What a provider can lend: [`LEND_SHARE`] of the capacity its own
/// traffic leaves, `C_out - own_rate`. Peers' traffic is bounded by the
/// reservations it grants from that, so the node's load stays below
/// `C_out` with the rest as headroom for its own bursts.
///
/// While the node is late (a class broke its bound by Eq. 1, e.g. the
/// uplink is slower than `C_out` says), it lends no more than its PBTT
/// tuple shows: [`LEND_SHARE`] of its spare plus what its reservations
/// carry now ([`Reservations::carried`]: the tuple's Eq. 22 demands
/// already count those records as load), less its shortage. Renewals then
/// shrink until it catches up.
///
/// Why not the tuple always: Eq. 2's `s_c / t` counts whatever sits in
/// the queue at a window's end as throughput, and forwarded records arrive
/// in bunches (a Forward request carries up to 256 KiB), so on a provider
/// the tuple's spare swung by the size of a bunch from window to window.
/// In the JANUS lab an idle provider able to lend 1.9 MB/s advertised
/// about 1 MB/s on average, anywhere between 0.1 and 1.9.
pub fn lendable(state: &BandwidthState, carried: f64) -> f64 {
    let leaves = non_negative(LEND_SHARE * (state.capacity - non_negative(state.own_rate)));
    if !state.late {
        return leaves;
    }
    let tuple = &state.tuple;
    let shown = non_negative(
        LEND_SHARE * (tuple.spare_total() + non_negative(carried)) - tuple.shortage_total(),
    );
    leaves.min(shown)
}

/// The shortage a node asks peers for, per class (JANUS tuple entries,
/// negative): its PBTT tuple's, less the part that what it `carried` for
/// peers explains. That part it sheds by lending less ([`lendable`]),
/// rather than passing lent records on to a third node.
///
/// A node carrying for peers that is not late and whose own traffic leaves
/// it something to lend has no shortage of its own at all: its tuple's is
/// the bunching of forwarded records (see [`lendable`]), which reached
/// twice the rate it carried for a window at a time. Advertised, it turned
/// the provider into a receiver for that round, and every renewal it
/// answered meanwhile was granted nothing.
pub fn own_shortage(state: &BandwidthState, carried: f64) -> BandwidthTuple {
    let tuple = &state.tuple;
    let shortage = tuple.shortage_total();
    let carrying = carried > MIN_AMOUNT;
    let settled = carrying && !state.late && LEND_SHARE * state.capacity > state.own_rate;
    if shortage <= 0.0 || settled {
        return BandwidthTuple(vec![0.0; tuple.0.len()]);
    }
    let own = non_negative(shortage - non_negative(carried)) / shortage;
    BandwidthTuple(
        tuple
            .0
            .iter()
            .map(|&b| if b < 0.0 { b * own } else { 0.0 })
            .collect(),
    )
}

/// The tuple a node advertises, from its scheduler's `state`, what it
/// `carried` for peers (measured) and what it `reserved` for them: the
/// shortage it asks peers for ([`own_shortage`], which counts what it
/// reserved as carried, so that a reservation not yet measured as
/// carrying does not make it ask for help with peers' records), or, when
/// it has none of its own, its spare entries scaled to sum to what it can
/// lend ([`lendable`]; all in the top class when it has no spare entry).
/// Never both asks and offers.
///
/// Counting only the measured rate (over 250 ms), a provider in its first
/// window of a new reservation saw the bunching of forwarded records as
/// its own shortage and passed records on to the other provider, which
/// sometimes sent them back.
pub fn advertised(state: &BandwidthState, carried: f64, reserved: f64) -> BandwidthTuple {
    let local = &state.tuple;
    let own = own_shortage(state, carried.max(reserved));
    if own.shortage_total() > 0.0 {
        return own;
    }
    let lendable = lendable(state, carried);
    let mut t = BandwidthTuple(local.0.iter().map(|b| b.max(0.0)).collect());
    let spare = t.spare_total();
    if spare > 0.0 {
        t.0.iter_mut().for_each(|b| *b *= lendable / spare);
    } else if let Some(top) = t.0.first_mut() {
        *top = lendable;
    }
    t
}

/// The heartbeat period running at `unix_us` (microseconds since 1970):
/// periods of `len` are aligned on the Unix clock, so nodes whose clocks
/// agree (NTP) share them.
pub fn period_of(unix_us: u64, len: Duration) -> u64 {
    unix_us / (len.as_micros().max(1) as u64)
}

/// From `unix_us`, the wait until `offset` into the next period of `len`
/// (the current one's, if not yet passed): at most one period.
pub fn until_period(unix_us: u64, len: Duration, offset: Duration) -> Duration {
    let len_us = len.as_micros().max(1) as u64;
    let at = period_of(unix_us, len) * len_us + offset.as_micros() as u64;
    let at = if at <= unix_us { at + len_us } else { at };
    Duration::from_micros(at - unix_us)
}

/// Time constant of a node's own arrival rate as peering sees it
/// ([`OwnRate`]): long enough to smooth a window's bunching, short against
/// a load change.
pub const OWN_RATE_TAU: Duration = Duration::from_secs(1);

/// The rate of a node's own arrivals (everything but what peers forwarded
/// to it), smoothed over [`OWN_RATE_TAU`]: what [`lendable`] subtracts from
/// `C_out` ([`BandwidthState::own_rate`]).
#[derive(Debug, Clone, Default)]
pub struct OwnRate {
    rate: f64,
    started: bool,
    last_foreign: u64,
}

impl OwnRate {
    /// Starts from the ingress's foreign-bytes counter as it is now.
    pub fn new(foreign_total: u64) -> Self {
        OwnRate {
            last_foreign: foreign_total,
            ..OwnRate::default()
        }
    }

    /// Folds in a window of `t` seconds in which `arrived` units entered
    /// the queues, `foreign_total` being the foreign counter now (the first
    /// window is taken as is); returns the smoothed rate.
    pub fn window(&mut self, arrived: u64, foreign_total: u64, t: f64) -> f64 {
        let foreign = foreign_total.saturating_sub(self.last_foreign);
        self.last_foreign = foreign_total;
        let own = arrived.saturating_sub(foreign) as f64 / t;
        if self.started {
            let w = (t / OWN_RATE_TAU.as_secs_f64()).min(1.0);
            self.rate += w * (own - self.rate);
        } else {
            self.rate = own;
            self.started = true;
        }
        self.rate
    }

    /// The smoothed rate, units/s.
    pub fn rate(&self) -> f64 {
        self.rate
    }
}

/// How often a reservation's admitted rate is re-measured.
pub const FLOW_WINDOW: Duration = Duration::from_millis(250);

/// The rate actually admitted under one reservation, measured over
/// [`FLOW_WINDOW`]s.
#[derive(Debug, Clone, Default)]
struct Flow {
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
    /// carry now as lendable* ([`lendable`]): the PBTT tuple's Eq. 22
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

/// One rate granted to this node by a provider.
#[derive(Debug, Clone)]
struct Lease {
    rate: f64,
    expires: Duration,
    bucket: TokenBucket,
}

/// The receiver side: the rates providers granted this node per
/// (provider, class), each paced by a token bucket so that sending never
/// outruns what the provider will admit.
#[derive(Debug, Clone)]
pub struct Leases {
    pacing: Pacing,
    entries: BTreeMap<(NodeId, ClassId), Lease>,
}

impl Leases {
    /// No leases, sending paced by `pacing` (shallower than the
    /// providers' buckets, so jitter does not turn into refusals).
    pub fn new(pacing: Pacing) -> Self {
        Leases {
            pacing,
            entries: BTreeMap::new(),
        }
    }

    /// `provider` granted `rate` units/s of `class` until `expires` (a rate
    /// of 0 ends the lease). Credit earned so far is kept across renewals.
    pub fn set(
        &mut self,
        provider: NodeId,
        class: ClassId,
        rate: f64,
        expires: Duration,
        now: Duration,
    ) {
        let key = (provider, class);
        if !(rate.is_finite() && rate > MIN_AMOUNT) || expires <= now {
            self.entries.remove(&key);
            return;
        }
        match self.entries.get_mut(&key) {
            Some(l) => {
                self.pacing.retune(&mut l.bucket, rate, now);
                l.rate = rate;
                l.expires = expires;
            }
            None => {
                self.entries.insert(
                    key,
                    Lease {
                        rate,
                        expires,
                        bucket: self.pacing.bucket(rate, now),
                    },
                );
            }
        }
    }

    /// Ends the lease of `class` at `provider` (it refused records).
    pub fn end(&mut self, provider: NodeId, class: ClassId) {
        self.entries.remove(&(provider, class));
    }

    /// Ends every lease at `provider` (it is gone).
    pub fn end_all(&mut self, provider: NodeId) {
        self.entries.retain(|&(p, _), _| p != provider);
    }

    /// Drops leases that ran out by `now`; returns how many.
    pub fn expire(&mut self, now: Duration) -> usize {
        let before = self.entries.len();
        self.entries.retain(|_, l| now < l.expires);
        before - self.entries.len()
    }

    /// Classes with a live lease at `provider`, most urgent first.
    pub fn active(&self, provider: NodeId, now: Duration) -> Vec<ClassId> {
        self.entries
            .range((provider, ClassId(0))..=(provider, ClassId(u8::MAX)))
            .filter(|(_, l)| now < l.expires)
            .map(|(&(_, c), _)| c)
            .collect()
    }

    /// True if `provider` has granted this node anything still live.
    pub fn has_active(&self, provider: NodeId, now: Duration) -> bool {
        !self.active(provider, now).is_empty()
    }

    /// Takes tokens to send a record of `units` of `class` to `provider`;
    /// `Wait(Duration::MAX)` when there is no live lease.
    pub fn take(&mut self, provider: NodeId, class: ClassId, units: usize, now: Duration) -> Take {
        match self.entries.get_mut(&(provider, class)) {
            Some(l) if now < l.expires => l.bucket.try_take(now, units, 1),
            _ => Take::Wait(Duration::MAX),
        }
    }

    /// The rate granted by `provider` for `class` (0 if none).
    pub fn rate(&self, provider: NodeId, class: ClassId) -> f64 {
        self.entries.get(&(provider, class)).map_or(0.0, |l| l.rate)
    }

    /// Every live lease as (provider, class, rate).
    pub fn iter(&self, now: Duration) -> impl Iterator<Item = (NodeId, ClassId, f64)> + '_ {
        self.entries
            .iter()
            .filter(move |(_, l)| now < l.expires)
            .map(|(&(p, c), l)| (p, c, l.rate))
    }

    /// Total rate granted to this node by every provider.
    pub fn total(&self) -> f64 {
        self.entries.values().map(|l| l.rate).sum()
    }

    /// Number of leases held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when none is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// `(origin, seq)`: a record's identity end to end.
pub type RecordKey = (NodeId, u64);

/// The identity of `record`.
#[inline]
pub fn key_of(record: &Record) -> RecordKey {
    (record.origin, record.seq)
}

/// Records sent to a provider and not yet settled. A record leaves only
/// when the provider acknowledges it (it has delivered it: the cloud
/// confirmed it, or a further provider did; see [`Custody`]) or when it is
/// taken back (refused, or the stream broke), so a provider that dies
/// mid-stream, even one that had already queued the record, loses nothing:
/// whatever it did not acknowledge is still here.
#[derive(Debug, Default)]
pub struct InFlight {
    records: HashMap<RecordKey, Record>,
    bytes: usize,
}

impl InFlight {
    /// Nothing in flight.
    pub fn new() -> Self {
        Self::default()
    }

    /// Holds `record`, about to be sent. A record with the same identity
    /// already in flight is handed back: sending it twice at once would
    /// leave one copy untracked.
    pub fn sent(&mut self, record: Record) -> Result<(), Record> {
        let key = key_of(&record);
        if self.records.contains_key(&key) {
            return Err(record);
        }
        self.bytes += record.size();
        self.records.insert(key, record);
        Ok(())
    }

    /// The provider has it: forget it (returned for accounting). `None`
    /// for an unknown identity (a repeated or stray acknowledgement), which
    /// changes nothing.
    pub fn acked(&mut self, key: RecordKey) -> Option<Record> {
        self.take(key)
    }

    /// The provider refused it: hand it back to be queued here again.
    pub fn refused(&mut self, key: RecordKey) -> Option<Record> {
        self.take(key)
    }

    /// The stream broke: hand back everything unacknowledged, oldest first
    /// (by ingress time, then identity), so the caller can queue it again.
    pub fn take_all(&mut self) -> Vec<Record> {
        self.bytes = 0;
        let mut all: Vec<Record> = self.records.drain().map(|(_, r)| r).collect();
        all.sort_unstable_by_key(|r| (r.ingress_us, r.origin, r.seq));
        all
    }

    fn take(&mut self, key: RecordKey) -> Option<Record> {
        let r = self.records.remove(&key)?;
        self.bytes -= r.size();
        Some(r)
    }

    /// Records in flight.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// True when nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Bytes ([`Record::size`]) in flight.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// One Forward stream on a provider, as [`Custody`] tells them apart.
pub type StreamId = u64;

/// Forwarded records a provider holds for the senders that gave them: each
/// is acknowledged to the stream that sent it only once it has been
/// delivered (confirmed by the cloud, or by a further provider), so a
/// provider that dies with records in its queues loses nothing its senders
/// forgot. The caller holds a record *before* it enqueues it, so that a
/// delivery racing the enqueue still finds it, and releases a stream's
/// records when the stream ends (its sender takes them back then).
///
/// A record held again by another stream is owed to every stream that
/// sent it: an acknowledgement only says the record reached the cloud,
/// which is true for each of them. Two cases send a record twice: its
/// sender took it back and sent it again on a newer stream (the older one
/// has ended or will, and an acknowledgement there is ignored), and a
/// record that travelled on and came back, e.g. from E1 to E2, on to E3
/// and back to E2 while E2 still held it for E1. Owed only to the latest
/// stream, as weir first did, the second case left E1 never acknowledged:
/// it took the record back when its stream ended and the cloud got it
/// twice (the JANUS lab counted 12-213 such duplicates in some runs).
#[derive(Debug, Default)]
pub struct Custody {
    /// Undelivered records and the first stream each is owed to.
    held: HashMap<RecordKey, StreamId>,
    /// The other streams a record is owed to, in the rare case of more than
    /// one (kept apart so that the common case allocates nothing).
    also: HashMap<RecordKey, Vec<StreamId>>,
    /// Per stream: records held (undelivered) and delivered records whose
    /// acknowledgement is not yet sent.
    streams: HashMap<StreamId, Owed>,
    /// Records delivered and not yet acknowledged, all streams.
    due: usize,
}

/// What a provider owes one stream.
#[derive(Debug, Default)]
struct Owed {
    held: usize,
    delivered: Vec<RecordKey>,
}

impl Custody {
    /// Nothing held.
    pub fn new() -> Self {
        Self::default()
    }

    /// Holds `key` for `stream` until it is delivered (as well as for any
    /// other stream holding it already).
    pub fn hold(&mut self, key: RecordKey, stream: StreamId) {
        match self.held.entry(key) {
            Entry::Vacant(v) => {
                v.insert(stream);
            }
            Entry::Occupied(o) => {
                if *o.get() == stream {
                    return;
                }
                let others = self.also.entry(key).or_default();
                if others.contains(&stream) {
                    return;
                }
                others.push(stream);
            }
        }
        self.owed(stream).held += 1;
    }

    /// Stops owing `key` to its first stream: another one it is owed to
    /// takes that place, if any.
    fn drop_first(&mut self, key: RecordKey) {
        match self.also.get_mut(&key).and_then(Vec::pop) {
            Some(next) => {
                self.held.insert(key, next);
                if self.also.get(&key).is_some_and(Vec::is_empty) {
                    self.also.remove(&key);
                }
            }
            None => {
                self.held.remove(&key);
            }
        }
    }

    /// `key` did not make it into the queue after all (refused at enqueue):
    /// nothing is owed for it to `stream`. No-op unless `stream` holds it.
    pub fn unhold(&mut self, key: RecordKey, stream: StreamId) {
        match self.held.get(&key) {
            Some(&first) if first == stream => self.drop_first(key),
            Some(_) => {
                let Some(others) = self.also.get_mut(&key) else {
                    return;
                };
                let Some(i) = others.iter().position(|&s| s == stream) else {
                    return;
                };
                others.swap_remove(i);
                if others.is_empty() {
                    self.also.remove(&key);
                }
            }
            None => return,
        }
        self.owed(stream).held -= 1;
        self.tidy(stream);
    }

    /// These records were delivered: each one held is owed an
    /// acknowledgement on its stream from now on. Keys not held (this
    /// node's own records, or a stream that ended) are ignored. Returns
    /// how many were held.
    pub fn delivered(&mut self, keys: impl IntoIterator<Item = RecordKey>) -> usize {
        if self.held.is_empty() {
            return 0;
        }
        let mut n = 0;
        for key in keys {
            let Some(first) = self.held.remove(&key) else {
                continue;
            };
            let others = if self.also.is_empty() {
                None
            } else {
                self.also.remove(&key)
            };
            for stream in std::iter::once(first).chain(others.into_iter().flatten()) {
                let owed = self.owed(stream);
                owed.held -= 1;
                owed.delivered.push(key);
                self.due += 1;
            }
            n += 1;
        }
        n
    }

    /// Up to `max` delivered records of `stream` to acknowledge now, in the
    /// order they were delivered; they are no longer owed.
    pub fn take_delivered(&mut self, stream: StreamId, max: usize) -> Vec<RecordKey> {
        let Some(owed) = self.streams.get_mut(&stream) else {
            return Vec::new();
        };
        let n = owed.delivered.len().min(max);
        let out: Vec<RecordKey> = owed.delivered.drain(..n).collect();
        self.due -= out.len();
        self.tidy(stream);
        out
    }

    /// True while `stream` is owed anything: records not yet delivered, or
    /// acknowledgements not yet taken.
    pub fn owes(&self, stream: StreamId) -> bool {
        self.streams.contains_key(&stream)
    }

    /// Records held for `stream`, not yet delivered.
    pub fn held_by(&self, stream: StreamId) -> usize {
        self.streams.get(&stream).map_or(0, |o| o.held)
    }

    /// `stream` ended: its sender takes back what was not acknowledged, so
    /// nothing is owed to it any more (records still queued here will be
    /// delivered anyway, and the cloud may see them twice). Returns how
    /// many records were held or delivered without an acknowledgement.
    pub fn release(&mut self, stream: StreamId) -> usize {
        let Some(owed) = self.streams.remove(&stream) else {
            return 0;
        };
        if owed.held > 0 {
            self.also.retain(|_, others| {
                others.retain(|&s| s != stream);
                !others.is_empty()
            });
            let firsts: Vec<RecordKey> = self
                .held
                .iter()
                .filter(|&(_, &s)| s == stream)
                .map(|(&k, _)| k)
                .collect();
            for key in firsts {
                self.drop_first(key);
            }
        }
        self.due -= owed.delivered.len();
        owed.held + owed.delivered.len()
    }

    /// Records held, not yet delivered, all streams.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Records delivered whose acknowledgement is not yet taken, all
    /// streams.
    pub fn due(&self) -> usize {
        self.due
    }

    fn owed(&mut self, stream: StreamId) -> &mut Owed {
        self.streams.entry(stream).or_default()
    }

    /// Forgets a stream once nothing is owed to it.
    fn tidy(&mut self, stream: StreamId) {
        if self
            .streams
            .get(&stream)
            .is_some_and(|o| o.held == 0 && o.delivered.is_empty())
        {
            self.streams.remove(&stream);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    // Our `Strategy` enum, not proptest's trait.
    use super::Strategy;
    use crate::janus::apply_grant;
    use bytes::Bytes;
    use proptest::prelude::*;

    const E1: NodeId = 1;
    const E2: NodeId = 2;
    const LT: ClassId = ClassId(2);
    const MS: Duration = Duration::from_millis(1);

    fn at(ms: u64) -> Duration {
        MS * ms as u32
    }

    fn tuple(v: &[f64]) -> BandwidthTuple {
        BandwidthTuple(v.to_vec())
    }

    /// A node at `v`, late (so it lends no more than its tuple shows), with
    /// `C_out` 100 and own traffic 20.
    fn late(v: &[f64]) -> BandwidthState {
        BandwidthState {
            tuple: tuple(v),
            capacity: 100.0,
            own_rate: 20.0,
            late: true,
            ..BandwidthState::default()
        }
    }

    fn advert(round: u64, v: &[f64], since: u64) -> Advert {
        Advert {
            round,
            tuple: tuple(v),
            requesting_since_us: since,
        }
    }

    fn config() -> ReservationConfig {
        ReservationConfig {
            lease: Duration::from_secs(1),
            pacing: Pacing {
                burst: Duration::from_secs(1),
                min_burst: 1.0,
            },
        }
    }

    fn record(origin: NodeId, seq: u64) -> Record {
        Record {
            key: Bytes::from_static(b"k"),
            class: LT,
            origin,
            seq,
            ingress_us: seq,
            payload: Bytes::from(vec![0u8; 7]),
        }
    }

    #[test]
    fn fig_4_end_to_end() {
        // E1 at [10, 10, 10] bursts in lt and asks [0, 0, -5]; E2 at
        // [18, 10, 2] advertises [8, 0, 0].
        let e1 = advert(1, &[0.0, 0.0, -5.0], 1_000);
        let e2 = advert(1, &[8.0, 0.0, 0.0], 0);
        let mut e2_alloc = Allocation {
            rates: vec![18.0, 10.0, 2.0],
        };
        let mut e2_tuple = e2.tuple.clone();

        // Each node decides on its own view; both reach the same matching.
        let mut e1_view = PeerView::new(Duration::from_millis(500));
        assert_eq!(e1_view.observe(E2, e2.clone(), at(0)), Observed::Joined);
        let mut e2_view = PeerView::new(Duration::from_millis(500));
        e2_view.observe(E1, e1.clone(), at(0));
        let want = Grant {
            provider: E2,
            receiver: E1,
            class: LT,
            amount: 5.0,
        };
        assert_eq!(
            decide(Strategy::Pmrfs, E1, &e1, &e1_view, at(10)),
            vec![want]
        );
        assert!(decide(Strategy::Pmrfs, E2, &e2, &e2_view, at(10)).is_empty());
        assert_eq!(
            match_nodes(
                Strategy::Pmrfs,
                [(E2, &e2.tuple, 0), (E1, &e1.tuple, 1_000)]
            ),
            vec![want]
        );

        // E1 asks E2 to reserve [0, 0, 5]; E2 has 8 spare and grants it all.
        let mut e2_res = Reservations::new(E2, config());
        let r = e2_res.grant(E1, LT, 5.0, Duration::ZERO, at(10), e2_tuple.spare_total());
        assert_eq!(r.amount, 5.0);
        assert_eq!(r.lease, Duration::from_secs(1));
        assert_eq!(r.shift, Some(want));
        // The shift [5 down, 0, 5 up]: [18, 10, 2] -> [13, 10, 7].
        assert_eq!(
            apply_grant(&mut e2_alloc, &mut e2_tuple, &r.shift.unwrap()),
            5.0
        );
        assert_eq!(e2_alloc.rates, vec![13.0, 10.0, 7.0]);
        assert_eq!(e2_tuple, tuple(&[3.0, 0.0, 0.0]));

        // E1 sends 5 units/s of lt; E2 admits that and refuses more.
        let mut e1_leases = Leases::new(config().pacing);
        e1_leases.set(E2, LT, r.amount, at(10) + r.lease, at(10));
        assert_eq!(e1_leases.active(E2, at(10)), vec![LT]);
        for _ in 0..5 {
            assert_eq!(e1_leases.take(E2, LT, 1, at(10)), Take::Granted);
            assert_eq!(e2_res.admit(E1, LT, 1, at(10)), Admission::Accepted);
        }
        assert!(matches!(e1_leases.take(E2, LT, 1, at(10)), Take::Wait(_)));
        assert_eq!(e2_res.admit(E1, LT, 1, at(10)), Admission::OverRate);
        // A fifth of a second later, one more unit has accrued.
        assert_eq!(e2_res.admit(E1, LT, 1, at(210)), Admission::Accepted);
        assert_eq!(
            e2_res.admit(E1, ClassId(0), 1, at(210)),
            Admission::NoReservation
        );
    }

    #[test]
    fn a_renewal_replaces_the_reservation_instead_of_adding_to_it() {
        let mut res = Reservations::new(E2, config());
        assert_eq!(
            res.grant(E1, LT, 6.0, Duration::ZERO, at(0), 10.0).amount,
            6.0
        );
        let again = res.grant(E1, LT, 6.0, Duration::ZERO, at(100), 10.0);
        assert_eq!(again.amount, 6.0);
        assert_eq!(again.shift, None, "nothing grew");
        assert_eq!(res.reserved(), 6.0);
        // Another receiver gets only what is left.
        assert_eq!(
            res.grant(3, LT, 6.0, Duration::ZERO, at(100), 10.0).amount,
            4.0
        );
        // A smaller renewal frees room, and needs no shift.
        let smaller = res.grant(E1, LT, 2.0, Duration::ZERO, at(200), 10.0);
        assert_eq!((smaller.amount, smaller.shift), (2.0, None));
        let grown = res.grant(3, LT, 9.0, Duration::ZERO, at(200), 10.0);
        assert_eq!(grown.amount, 8.0);
        assert_eq!(grown.shift.map(|g| g.amount), Some(4.0));
        // Asking for nothing releases.
        assert_eq!(
            res.grant(3, LT, 0.0, Duration::ZERO, at(200), 10.0).amount,
            0.0
        );
        assert_eq!(res.reserved_for(3, LT), 0.0);
        assert_eq!(res.len(), 1);
        assert_eq!(res.release_all(E1), 2.0);
        assert!(res.is_empty());
    }

    #[test]
    fn divergent_views_never_overload_the_provider() {
        // Three receivers each short 6 of lt; one provider with 10 spare.
        let p: NodeId = 10;
        let short = [0.0, 0.0, -6.0];
        let provider = advert(1, &[10.0, 0.0, 0.0], 0);
        let receivers: [NodeId; 3] = [1, 2, 3];
        let own = |id: NodeId| advert(1, &short, 100 + id);
        // R1 hears only the provider; R2 hears everyone; R3 has lost R1
        // and R2 (their heartbeats are late).
        let mut views = Vec::new();
        for (i, &r) in receivers.iter().enumerate() {
            let mut v = PeerView::new(Duration::from_millis(500));
            v.observe(p, provider.clone(), at(1000));
            for &other in &receivers {
                if other != r && i == 1 {
                    v.observe(other, own(other), at(1000));
                }
                if other != r && i == 2 {
                    v.observe(other, own(other), at(0));
                }
            }
            views.push(v);
        }
        let asks: Vec<Grant> = receivers
            .iter()
            .zip(&views)
            .flat_map(|(&r, v)| decide(Strategy::Pmrfs, r, &own(r), v, at(1000)))
            .collect();
        // R1 and R3 each think the spare is theirs: 6 + 6 + R2's share.
        let asked: f64 = asks.iter().map(|g| g.amount).sum();
        assert!(asked > 10.0, "the views disagree: {asks:?}");

        let mut res = Reservations::new(p, config());
        let granted: f64 = asks
            .iter()
            .map(|g| {
                res.grant(
                    g.receiver,
                    g.class,
                    g.amount,
                    Duration::ZERO,
                    at(1000),
                    10.0,
                )
                .amount
            })
            .sum();
        assert_eq!(granted, 10.0);
        assert_eq!(res.reserved(), 10.0);
    }

    #[test]
    fn a_renewal_is_not_shrunk_by_the_traffic_it_carries() {
        let mut res = Reservations::new(E2, config());
        // 10 spare: E1 gets 6.
        assert_eq!(
            res.grant(E1, LT, 6.0, Duration::ZERO, at(0), 10.0).amount,
            6.0
        );
        // E1 sends at its full 6/s (units of 1, one every 166 ms).
        for k in 0..6u64 {
            assert_eq!(res.admit(E1, LT, 1, at(k * 166)), Admission::Accepted);
        }
        // The PBTT tuple now counts that traffic as load: spare 4, but 4 + 6
        // carried are lendable (less the headroom). Renewing, E1 still gets
        // its 6...
        let carried = res.carried(at(900));
        assert!((carried - 6.0).abs() < 0.1, "{carried}");
        let spare = lendable(&late(&[4.0, 0.0, 0.0]), 6.0);
        assert!((spare - 9.0).abs() < 1e-9);
        assert_eq!(
            res.grant(E1, LT, 6.0, Duration::ZERO, at(900), spare)
                .amount,
            6.0
        );
        // ...and another receiver only what is left beside E1's 6.
        assert!((res.grant(3, LT, 9.0, Duration::ZERO, at(900), spare).amount - 3.0).abs() < 1e-9);
        // A node short by 1 lends 1 less; short by more than it could
        // lend, nothing.
        assert!((lendable(&late(&[0.0, 0.0, -1.0]), 6.0) - 4.4).abs() < 1e-9);
        assert_eq!(lendable(&late(&[0.0, 0.0, -9.0]), 6.0), 0.0);
        // What it carries explains a shortage of 2: it asks for nothing;
        // of 8, it asks for the 2 its own traffic needs.
        let t = |lt| BandwidthTuple(vec![0.0, 0.0, lt]);
        assert_eq!(own_shortage(&late(&[0.0, 0.0, -2.0]), 6.0), t(0.0));
        assert_eq!(own_shortage(&late(&[0.0, 0.0, -8.0]), 6.0), t(-2.0));
        assert!((res.reserved() - 9.0).abs() < 1e-9);
        // A reservation carrying nothing counts once, as reserved.
        let mut idle = Reservations::new(E2, config());
        idle.grant(E1, LT, 6.0, Duration::ZERO, at(0), 10.0);
        assert_eq!(
            idle.grant(3, LT, 9.0, Duration::ZERO, at(900), 10.0).amount,
            4.0
        );
    }

    #[test]
    fn reservations_expire_unless_renewed() {
        let mut res = Reservations::new(E2, config());
        res.grant(E1, LT, 4.0, Duration::from_millis(300), at(0), 10.0);
        res.grant(3, LT, 4.0, Duration::ZERO, at(0), 10.0);
        assert_eq!(res.admit(E1, LT, 1, at(299)), Admission::Accepted);
        assert_eq!(res.admit(E1, LT, 1, at(300)), Admission::NoReservation);
        assert_eq!(res.len(), 1, "admit dropped the expired reservation");
        // Renewed before its end, a reservation lives on.
        res.grant(3, LT, 4.0, Duration::ZERO, at(900), 10.0);
        assert!(res.expire(at(1500)).is_empty());
        assert_eq!(res.expire(at(1900)), vec![(3, LT, 4.0)]);
        assert!(res.is_empty());
        // Expired reservations no longer count against the spare.
        res.grant(E1, LT, 10.0, Duration::ZERO, at(0), 10.0);
        assert_eq!(
            res.grant(3, LT, 5.0, Duration::ZERO, at(500), 10.0).amount,
            0.0
        );
        assert_eq!(
            res.grant(3, LT, 5.0, Duration::ZERO, at(1000), 10.0).amount,
            5.0
        );
        // A lease longer than the provider's is cut to it.
        assert_eq!(
            res.grant(3, LT, 5.0, Duration::from_secs(60), at(1000), 10.0)
                .lease,
            Duration::from_secs(1)
        );
    }

    #[test]
    fn the_view_ignores_stale_heartbeats_and_forgets_the_silent() {
        let mut v = PeerView::new(Duration::from_millis(500));
        assert_eq!(v.observe(E2, advert(5, &[1.0], 0), at(0)), Observed::Joined);
        assert_eq!(v.observe(E2, advert(4, &[9.0], 0), at(10)), Observed::Stale);
        assert_eq!(v.advert(E2).unwrap().tuple, tuple(&[1.0]));
        assert_eq!(
            v.observe(E2, advert(6, &[2.0], 0), at(20)),
            Observed::Updated
        );
        assert!(v.is_alive(E2, at(519)));
        assert!(!v.is_alive(E2, at(520)));
        assert_eq!(v.alive_count(at(520)), 0);
        // Gone, then back after a restart with a smaller round.
        assert_eq!(
            v.observe(E2, advert(1, &[3.0], 0), at(600)),
            Observed::Joined
        );
        assert_eq!(v.alive(at(600)).count(), 1);
        assert_eq!(v.last_heard(E2), Some(at(600)));
        // A dead provider is not matched.
        let me = advert(1, &[-1.0], 7);
        assert_eq!(decide(Strategy::Pmrfs, E1, &me, &v, at(600)).len(), 1);
        assert!(decide(Strategy::Pmrfs, E1, &me, &v, at(1100)).is_empty());
    }

    #[test]
    fn leases_pace_sending_and_end() {
        let pacing = Pacing {
            burst: Duration::from_millis(100),
            min_burst: 10.0,
        };
        let mut l = Leases::new(pacing);
        l.set(E2, LT, 1000.0, at(1000), at(0));
        l.set(E2, ClassId(1), 1000.0, at(1000), at(0));
        l.set(3, LT, 1000.0, at(1000), at(0));
        assert_eq!(l.active(E2, at(0)), vec![ClassId(1), LT]);
        // Depth: 100 ms at 1000/s.
        assert_eq!(l.take(E2, LT, 100, at(0)), Take::Granted);
        assert!(matches!(l.take(E2, LT, 10, at(0)), Take::Wait(_)));
        assert_eq!(l.take(E2, LT, 10, at(10)), Take::Granted);
        l.end(E2, ClassId(1));
        assert_eq!(l.active(E2, at(0)), vec![LT]);
        assert_eq!(l.take(E2, LT, 1, at(1000)), Take::Wait(Duration::MAX));
        assert_eq!(l.expire(at(1000)), 2);
        l.set(3, LT, 5.0, at(2000), at(1000));
        l.set(3, LT, 0.0, at(2000), at(1000));
        assert!(l.is_empty());
        l.set(3, LT, 5.0, at(2000), at(1000));
        l.end_all(3);
        assert!(!l.has_active(3, at(1000)));
    }

    #[test]
    fn in_flight_records_leave_only_when_settled() {
        let mut f = InFlight::new();
        for seq in 0..4 {
            f.sent(record(E1, seq)).unwrap();
        }
        assert!(f.sent(record(E1, 2)).is_err(), "same identity twice");
        assert_eq!(f.bytes(), 4 * record(E1, 0).size());
        assert!(f.acked((E1, 1)).is_some());
        assert!(f.acked((E1, 1)).is_none(), "a repeated ack changes nothing");
        assert_eq!(f.refused((E1, 3)).map(|r| r.seq), Some(3));
        let back: Vec<u64> = f.take_all().iter().map(|r| r.seq).collect();
        assert_eq!(back, vec![0, 2]);
        assert!(f.is_empty());
        assert_eq!(f.bytes(), 0);
    }

    #[test]
    fn custody_acknowledges_on_the_sending_stream_only_after_delivery() {
        let mut c = Custody::new();
        for seq in 0..3 {
            c.hold((E1, seq), 7);
        }
        c.hold((E2, 0), 8);
        assert_eq!(c.held(), 4);
        assert_eq!(c.held_by(7), 3);
        assert!(c.take_delivered(7, 10).is_empty(), "nothing delivered yet");

        // A batch with two of stream 7's, one of 8's and one of this
        // node's own records.
        assert_eq!(c.delivered([(E1, 2), (E2, 0), (E1, 0), (9, 9)]), 3);
        assert_eq!(c.due(), 3);
        assert_eq!(c.take_delivered(7, 1), vec![(E1, 2)]);
        assert_eq!(c.take_delivered(7, 10), vec![(E1, 0)]);
        assert!(c.owes(7), "(E1, 1) is still undelivered");
        assert_eq!(c.delivered([(E1, 2)]), 0, "a second copy owes nothing");

        // Refused at enqueue: nothing owed; another stream's unhold of it
        // changes nothing.
        c.unhold((E1, 1), 8);
        assert_eq!(c.held_by(7), 1);
        c.unhold((E1, 1), 7);
        assert!(!c.owes(7));

        // Stream 8 ends before its ack is taken: its sender takes the
        // record back, nothing stays owed.
        assert_eq!(c.release(8), 1);
        assert!(!c.owes(8));
        assert_eq!((c.held(), c.due()), (0, 0));
    }

    #[test]
    fn custody_owes_a_record_to_every_stream_that_sent_it() {
        let mut c = Custody::new();
        c.hold((E1, 5), 1);
        // The sender gave up on stream 1 and sent the record again on 2
        // before this provider saw stream 1 end: owed to both until one
        // ends.
        c.hold((E1, 5), 2);
        c.hold((E1, 5), 2);
        assert!(c.owes(1) && c.owes(2));
        assert_eq!((c.held(), c.held_by(1), c.held_by(2)), (1, 1, 1));
        assert_eq!(c.release(1), 1);
        assert_eq!(c.delivered([(E1, 5)]), 1);
        assert_eq!(c.take_delivered(2, 10), vec![(E1, 5)]);
        assert_eq!((c.held(), c.due()), (0, 0));

        // E1's record 6 came in on stream 1 (from E1), went on to a third
        // node and came back on stream 3 (from that node) while still held
        // for E1: delivered once, it is acknowledged to both, so E1 does
        // not take it back and send it again.
        c.hold((E1, 6), 1);
        c.hold((E1, 6), 3);
        assert_eq!(c.delivered([(E1, 6)]), 1);
        assert_eq!(c.due(), 2);
        assert_eq!(c.take_delivered(1, 10), vec![(E1, 6)]);
        assert_eq!(c.take_delivered(3, 10), vec![(E1, 6)]);
        assert!(!c.owes(1) && !c.owes(3));
        // Refused at enqueue on one stream: still owed to the other.
        c.hold((E1, 7), 1);
        c.hold((E1, 7), 3);
        c.unhold((E1, 7), 3);
        assert_eq!((c.held_by(1), c.held_by(3)), (1, 0));
        assert_eq!(c.delivered([(E1, 7)]), 1);
        assert_eq!(c.take_delivered(1, 10), vec![(E1, 7)]);
    }

    proptest! {
        #[test]
        fn custody_acknowledges_each_held_record_at_most_once_and_only_after_delivery(
            ops in prop::collection::vec((0u8..5, 0u64..20, 0u64..3), 0..300)
        ) {
            let mut c = Custody::new();
            // Model: which streams hold what; what was delivered while held
            // by whom.
            let mut held: HashMap<u64, Vec<u64>> = HashMap::new();
            let mut due: HashMap<u64, Vec<u64>> = HashMap::new();
            for (op, seq, stream) in ops {
                match op {
                    0 | 1 => {
                        c.hold((E1, seq), stream);
                        let h = held.entry(seq).or_default();
                        if !h.contains(&stream) {
                            h.push(stream);
                        }
                    }
                    2 => {
                        let n = c.delivered([(E1, seq)]);
                        match held.remove(&seq) {
                            Some(streams) => {
                                prop_assert_eq!(n, 1);
                                for s in streams {
                                    due.entry(s).or_default().push(seq);
                                }
                            }
                            None => prop_assert_eq!(n, 0),
                        }
                    }
                    3 => {
                        let acked: Vec<u64> =
                            c.take_delivered(stream, 2).into_iter().map(|k| k.1).collect();
                        let expected: Vec<u64> = {
                            let d = due.entry(stream).or_default();
                            let n = d.len().min(2);
                            d.drain(..n).collect()
                        };
                        prop_assert_eq!(acked, expected);
                    }
                    _ => {
                        let owed = held.values().filter(|h| h.contains(&stream)).count()
                            + due.get(&stream).map_or(0, Vec::len);
                        prop_assert_eq!(c.release(stream), owed);
                        held.retain(|_, h| {
                            h.retain(|&s| s != stream);
                            !h.is_empty()
                        });
                        due.remove(&stream);
                    }
                }
                prop_assert_eq!(c.held(), held.len());
                prop_assert_eq!(c.due(), due.values().map(Vec::len).sum::<usize>());
                for s in 0..3 {
                    let owed = held.values().any(|h| h.contains(&s))
                        || due.get(&s).is_some_and(|d| !d.is_empty());
                    prop_assert_eq!(c.owes(s), owed);
                    prop_assert_eq!(
                        c.held_by(s),
                        held.values().filter(|h| h.contains(&s)).count()
                    );
                }
            }
        }

        #[test]
        fn a_provider_never_grants_more_than_its_spare(
            ops in prop::collection::vec(
                (0u64..5, 0u8..3, -10.0f64..100.0, 0.0f64..100.0, 0u64..400, 0u64..1500),
                1..80,
            )
        ) {
            let mut res = Reservations::new(99, config());
            let mut now = Duration::ZERO;
            for (receiver, class, asked, spare, dt, lease) in ops {
                now += at(dt);
                res.expire(now);
                let others = res.reserved() - res.reserved_for(receiver, ClassId(class));
                let r = res.grant(receiver, ClassId(class), asked, at(lease), now, spare);
                prop_assert!(r.amount >= 0.0 && r.amount <= asked.max(0.0) + 1e-9);
                prop_assert!(
                    r.amount == 0.0 || others + r.amount <= spare + 1e-9,
                    "granted {} with {} reserved for others and {} spare", r.amount, others, spare
                );
                prop_assert!((res.reserved() - (others + r.amount)).abs() <= 1e-9);
                prop_assert!(r.lease <= config().lease);
            }
        }

        #[test]
        fn in_flight_loses_and_duplicates_nothing(
            ops in prop::collection::vec((0u8..4, 0u64..30), 0..200)
        ) {
            let mut f = InFlight::new();
            let mut sent = std::collections::HashSet::new();
            let mut settled = std::collections::HashSet::new();
            let mut back = Vec::new();
            for (op, seq) in ops {
                match op {
                    0 => {
                        if f.sent(record(E1, seq)).is_ok() {
                            sent.insert(seq);
                            settled.remove(&seq);
                        }
                    }
                    1 => {
                        if f.acked((E1, seq)).is_some() {
                            prop_assert!(settled.insert(seq));
                        }
                    }
                    2 => {
                        if let Some(r) = f.refused((E1, seq)) {
                            prop_assert!(settled.insert(r.seq));
                            back.push(r.seq);
                        }
                    }
                    _ => {
                        for r in f.take_all() {
                            prop_assert!(settled.insert(r.seq));
                            back.push(r.seq);
                        }
                    }
                }
            }
            // Every identity ever sent is settled exactly once or still held.
            for seq in &sent {
                let held = f.records.contains_key(&(E1, *seq));
                prop_assert!(held != settled.contains(seq), "seq {seq}");
            }
            prop_assert_eq!(f.bytes(), f.len() * record(E1, 0).size());
        }
    }

    #[test]
    fn advertised_asks_its_own_shortage_or_offers_what_it_can_lend() {
        let t = |v: [f64; 3]| BandwidthTuple(v.to_vec());
        // Late, short by 8 while carrying 6: asks for its own 2.
        assert_eq!(
            advertised(&late(&[0.0, 0.0, -8.0]), 6.0, 0.0),
            t([0.0, 0.0, -2.0])
        );
        // Late, short by 1 while carrying 6: offers 0.9 * 6 - 1, in the top
        // class.
        let a = advertised(&late(&[0.0, 0.0, -1.0]), 6.0, 0.0);
        assert!((a.0[0] - 4.4).abs() < 1e-9 && a.0[1] == 0.0 && a.0[2] == 0.0);
        // Late, spare 3 + 1 carrying 6: 9 lendable, spread as the spare is.
        let a = advertised(&late(&[3.0, 1.0, 0.0]), 6.0, 0.0);
        assert!((a.0[0] - 6.75).abs() < 1e-9 && (a.0[1] - 2.25).abs() < 1e-9);
        // On time: what C_out less its own traffic leaves (0.9 * (100 - 20)),
        // whatever the bunching of forwarded records did to the tuple.
        let on_time = |v: [f64; 3]| BandwidthState {
            late: false,
            ..late(&v)
        };
        let a = advertised(&on_time([3.0, 1.0, 0.0]), 6.0, 6.0);
        assert!((a.0[0] - 54.0).abs() < 1e-9 && (a.0[1] - 18.0).abs() < 1e-9);
        let a = advertised(&on_time([0.0, 0.0, -50.0]), 6.0, 6.0);
        assert!((a.0[0] - 72.0).abs() < 1e-9, "{a:?}");
        // Carrying nothing and nothing reserved, its shortage is its own;
        // with a reservation not yet carrying, it is not.
        assert_eq!(
            advertised(&on_time([0.0, 0.0, -50.0]), 0.0, 0.0),
            t([0.0, 0.0, -50.0])
        );
        let a = advertised(&on_time([0.0, 0.0, -50.0]), 0.0, 5.0);
        assert_eq!(a.shortage_total(), 0.0);
        // Its own traffic past what it may lend: its shortage is its own too.
        let busy = BandwidthState {
            own_rate: 95.0,
            ..on_time([0.0, 0.0, -50.0])
        };
        assert_eq!(advertised(&busy, 6.0, 6.0), t([0.0, 0.0, -44.0]));
    }

    fn ask(provider: NodeId, amount: f64) -> Grant {
        Grant {
            provider,
            receiver: E1,
            class: LT,
            amount,
        }
    }

    #[test]
    fn first_asks_keep_the_providers_already_carrying() {
        // The matcher moved E1 from provider 3 (which it holds at 6) to
        // provider 4, 7 in all: it renews 3 at 6 and asks 4 for 1 more.
        let asks = first_asks(&[ask(4, 7.0)], &[(3, LT, 6.0)]);
        assert_eq!(asks, vec![ask(3, 6.0), ask(4, 1.0)]);
        // A smaller total asks the held lease down, and the rest (to zero:
        // released) from the smaller one.
        let asks = first_asks(&[ask(4, 5.0)], &[(3, LT, 6.0), (4, LT, 2.0)]);
        assert_eq!(asks, vec![ask(3, 5.0), ask(4, 0.0)]);
        // The rest beyond held leases goes to the matched providers in order,
        // onto a held one when it is among them.
        let asks = first_asks(&[ask(3, 4.0), ask(5, 4.0)], &[(3, LT, 2.0)]);
        assert_eq!(asks, vec![ask(3, 6.0), ask(5, 2.0)]);
        // Other classes' leases are not touched.
        assert_eq!(
            first_asks(&[ask(4, 1.0)], &[(3, ClassId(0), 6.0)]),
            vec![ask(4, 1.0)]
        );
        assert!(first_asks(&[], &[(3, LT, 6.0)]).is_empty());
    }

    #[test]
    fn spill_asks_cover_what_full_providers_refused() {
        let offers = |v: &[(NodeId, f64)]| -> Vec<Offer> {
            v.iter()
                .map(|&(provider, amount)| Offer { provider, amount })
                .collect()
        };
        // 3 granted 2 of 6: 4 is asked for 4 more on top of its 1.
        let answered = [(ask(3, 6.0), 2.0), (ask(4, 1.0), 1.0)];
        let spill = spill_asks(&answered, &offers(&[(3, 9.0), (4, 3.0), (5, 8.0)]));
        // 5 advertises most: it gets the whole 4 (3 refused, so it is full).
        assert_eq!(spill, vec![ask(5, 4.0)]);
        let spill = spill_asks(&answered, &offers(&[(4, 3.0), (5, 2.0)]));
        assert_eq!(spill, vec![ask(4, 4.0), ask(5, 1.0)]);
        // Everything granted: nothing to spill.
        assert!(spill_asks(&[(ask(3, 6.0), 6.0)], &offers(&[(4, 9.0)])).is_empty());
    }

    #[test]
    fn own_rate_counts_only_this_nodes_arrivals_and_smooths_them() {
        let mut own = OwnRate::new(500);
        // 0.1 s windows. First: 3,000 bytes arrived, 1,000 of them from
        // peers (the counter went 500 -> 1,500): 20,000 B/s, taken as is.
        own.window(3_000, 1_500, 0.1);
        assert!((own.rate() - 20_000.0).abs() < 1e-6, "{}", own.rate());
        // Then a window of peers' records only: a tenth of the way to 0
        // (one window of a one-second time constant).
        own.window(4_000, 5_500, 0.1);
        assert!((own.rate() - 18_000.0).abs() < 1e-6, "{}", own.rate());
        // A counter read ahead of the queues' own never goes negative.
        own.window(0, 6_000, 0.1);
        assert!((own.rate() - 16_200.0).abs() < 1e-6, "{}", own.rate());
    }

    #[test]
    fn periods_are_aligned_on_the_clock() {
        let len = Duration::from_millis(100);
        assert_eq!(period_of(1_234_567, len), 12);
        // 34,567 us into period 12: its middle is 15,433 us away, its
        // start (passed) the next period's, 65,433 us away.
        let half = Duration::from_millis(50);
        assert_eq!(
            until_period(1_234_567, len, half),
            Duration::from_micros(15_433)
        );
        assert_eq!(
            until_period(1_234_567, len, Duration::ZERO),
            Duration::from_micros(65_433)
        );
        // Exactly at a start: the next one, a whole period away.
        assert_eq!(until_period(1_200_000, len, Duration::ZERO), len);
    }

    #[test]
    fn lendable_is_what_own_traffic_leaves_unless_late() {
        let mut s = BandwidthState {
            tuple: BandwidthTuple(vec![0.0, 0.0, 1.0]),
            capacity: 10.0,
            own_rate: 2.0,
            ..BandwidthState::default()
        };
        assert!((lendable(&s, 0.0) - 7.2).abs() < 1e-9);
        assert!((lendable(&s, 5.0) - 7.2).abs() < 1e-9);
        // Late: no more than the tuple shows, 0.9 * (1 + 5).
        s.late = true;
        assert!((lendable(&s, 5.0) - 5.4).abs() < 1e-9);
        // Own traffic past C_out: nothing; no capacity known: nothing.
        s.late = false;
        s.own_rate = 20.0;
        assert_eq!(lendable(&s, 5.0), 0.0);
        assert_eq!(lendable(&BandwidthState::default(), 5.0), 0.0);
        // By hand from a tuple: 0.9 of its spare.
        let h = BandwidthState::from_tuple(BandwidthTuple(vec![4.0, 6.0, 0.0]));
        assert!((lendable(&h, 0.0) - 9.0).abs() < 1e-9);
    }
}
