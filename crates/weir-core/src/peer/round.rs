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
