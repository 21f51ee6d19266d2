//! One redirection round as a node decides it alone: the shared matcher over
//! its view ([`decide`]), and which providers to ask ([`first_asks`],
//! [`spill_asks`]).

use std::time::Duration;

use super::state::Advert;
use super::view::PeerView;
use crate::class::ClassId;
use crate::janus::redirect::MIN_AMOUNT;
use crate::janus::{
    non_negative, offer_from, redirect, requests_from, BandwidthTuple, Grant, Offer, Strategy,
};
use crate::record::NodeId;

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
/// ([`Reservations::grant`](crate::peer::Reservations::grant)).
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
/// for what the first ones could not grant, per class: [`Spill`]'s first
/// step.
pub fn spill_asks(answered: &[(Grant, f64)], offers: &[Offer]) -> Vec<Grant> {
    Spill::new(answered).asks(offers)
}

/// Spill-over steps a round takes at most ([`Spill`]).
pub const MAX_SPILL_STEPS: usize = 3;

/// Rounds a receiver asks a provider last in its spill-over after the
/// provider gave it nothing ([`Spill::deferring`]).
pub const REFUSAL_MEMORY: u32 = 10;

/// The spill-over of one round, step by step: what the receiver still
/// lacks after its [`first_asks`], asked of providers with room.
///
/// A provider that granted less than asked is full; the others are tried
/// from the largest advertised spare down (the view's offers), each for
/// what it grants already plus as much of the shortfall as it advertises,
/// until the shortfall is covered on paper. The provider decides what it
/// really has. Adverts show what a provider can lend, not what it has
/// reserved for others, so the provider on paper may be full too: the next
/// step ([`Self::answered`], then [`Self::asks`] again) skips every
/// provider that refused anything this round. One step was not enough:
/// in `weir-lab scale`, after a provider died in a 16-node cluster,
/// receivers the new matching sent to a provider still held (leases are
/// renewed first) spilled every round onto the same full provider, and
/// the spare matched stayed at 67.5 % of what it could be; at 64 nodes
/// three steps a round still stopped at 91.6 % (32 providers advertising
/// the same spare, the full ones first), so providers that gave nothing
/// are also remembered for [`REFUSAL_MEMORY`] rounds and asked last
/// ([`Self::deferring`]) rather than skipped: with few providers the one
/// that was full may be the only one with room a round later. weir's peer
/// client runs these steps; in the 4-node real-process lab at 720 B they
/// and the single step of [`spill_asks`] were indistinguishable (95.4 %
/// and 95.3 % of the limit, means of 12 and 10 cells, each spread over
/// 91.7-99.4 %; docs/lab/scale.md).
#[derive(Debug, Clone, Default)]
pub struct Spill {
    /// Per class: the receiver and what its first asks wanted in all.
    wanted: Vec<(ClassId, NodeId, f64)>,
    /// Per (provider, class): what it grants this round.
    got: Vec<(NodeId, ClassId, f64)>,
    /// Providers that granted less than asked this round.
    refused: Vec<NodeId>,
    /// Providers asked only after every other with room.
    deferred: Vec<NodeId>,
}

impl Spill {
    /// The round so far: the first asks and what each was granted.
    pub fn new(answered: &[(Grant, f64)]) -> Self {
        let mut spill = Spill::default();
        for (ask, _) in answered {
            match spill.wanted.iter_mut().find(|w| w.0 == ask.class) {
                Some(w) => w.2 += non_negative(ask.amount),
                None => spill
                    .wanted
                    .push((ask.class, ask.receiver, non_negative(ask.amount))),
            }
        }
        spill.answered(answered);
        spill
    }

    /// Asks `providers` (those that gave this receiver nothing in recent
    /// rounds, [`REFUSAL_MEMORY`]) only after every other provider with
    /// room: where many providers advertise the same spare, the ones
    /// already full would come first again every round, and a few steps a
    /// round would not get past them; where there are few, they are still
    /// asked when nobody else has room.
    pub fn deferring(mut self, providers: impl IntoIterator<Item = NodeId>) -> Self {
        for p in providers {
            if !self.deferred.contains(&p) {
                self.deferred.push(p);
            }
        }
        self
    }

    /// Providers that refused this round.
    pub fn refused(&self) -> &[NodeId] {
        &self.refused
    }

    /// Providers that granted nothing at all this round: the ones to skip
    /// in the next rounds' spill-over ([`REFUSAL_MEMORY`]). One that granted
    /// part of an ask had room a moment ago and may again next round (in
    /// the 4-node cluster lab, skipping those too left the providers'
    /// links 5-10 % emptier).
    pub fn gave_nothing(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.refused.iter().copied().filter(|p| {
            self.got
                .iter()
                .filter(|g| g.0 == *p)
                .all(|g| g.2 <= MIN_AMOUNT)
        })
    }

    /// Records what providers granted to a step's asks.
    pub fn answered(&mut self, answered: &[(Grant, f64)]) {
        for &(ask, got) in answered {
            let got = non_negative(got);
            if got + MIN_AMOUNT < ask.amount && !self.refused.contains(&ask.provider) {
                self.refused.push(ask.provider);
            }
            match self
                .got
                .iter_mut()
                .find(|g| g.0 == ask.provider && g.1 == ask.class)
            {
                Some(g) => g.2 = got,
                None => self.got.push((ask.provider, ask.class, got)),
            }
        }
    }

    /// The next step's asks, from the view's `offers`: empty once nothing
    /// is short or no provider that has not refused has room on paper.
    pub fn asks(&self, offers: &[Offer]) -> Vec<Grant> {
        let mut offers: Vec<Offer> = offers
            .iter()
            .filter(|o| o.amount > MIN_AMOUNT && !self.refused.contains(&o.provider))
            .copied()
            .collect();
        let deferred = |p: NodeId| self.deferred.contains(&p);
        offers.sort_unstable_by(|a, b| {
            deferred(a.provider)
                .cmp(&deferred(b.provider))
                .then(b.amount.total_cmp(&a.amount))
                .then(a.provider.cmp(&b.provider))
        });
        let mut wanted = self.wanted.clone();
        wanted.sort_unstable_by_key(|w| w.0);
        let mut asks = Vec::new();
        for (class, receiver, want) in wanted {
            let granted = |provider: NodeId| {
                self.got
                    .iter()
                    .find(|g| g.0 == provider && g.1 == class)
                    .map_or(0.0, |g| g.2)
            };
            let have: f64 = self.got.iter().filter(|g| g.1 == class).map(|g| g.2).sum();
            let mut short = non_negative(want - have);
            for o in offers.iter_mut() {
                if short <= MIN_AMOUNT {
                    break;
                }
                let more = o.amount.min(short);
                short -= more;
                o.amount -= more;
                asks.push(Grant {
                    provider: o.provider,
                    receiver,
                    class,
                    amount: granted(o.provider) + more,
                });
            }
        }
        asks
    }
}

/// What a receiver remembers between rounds for its spill-over: the
/// providers that gave it nothing lately, each until when it is asked last
/// ([`Spill::deferring`]; [`REFUSAL_MEMORY`] periods, refreshed when it
/// gives nothing again).
#[derive(Debug, Clone, Default)]
pub struct Refusals(Vec<(NodeId, Duration)>);

impl Refusals {
    /// The spill-over of the round at `now` after the first asks were
    /// `answered`, with the providers remembered at `now` asked last.
    pub fn spill(&mut self, answered: &[(Grant, f64)], now: Duration) -> Spill {
        self.0.retain(|&(_, until)| until > now);
        Spill::new(answered).deferring(self.0.iter().map(|r| r.0))
    }

    /// Remembers the providers that gave nothing in `spill`, the round at
    /// `now` of a receiver whose rounds are `period` apart.
    pub fn remember(&mut self, spill: &Spill, now: Duration, period: Duration) {
        let until = now + period * REFUSAL_MEMORY;
        for p in spill.gave_nothing() {
            match self.0.iter_mut().find(|r| r.0 == p) {
                Some(r) => r.1 = until,
                None => self.0.push((p, until)),
            }
        }
    }
}

/// The offers in `view` of the live peers other than `me` (spare as each
/// last advertised it).
pub fn offers_in(view: &PeerView, me: NodeId, now: Duration) -> Vec<Offer> {
    view.alive(now)
        .filter(|&(id, _)| id != me)
        .filter_map(|(id, a)| offer_from(id, &a.tuple))
        .collect()
}
