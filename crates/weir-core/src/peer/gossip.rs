//! Adverts spread by gossip rather than sent to every peer: bounded
//! fan-out for large clusters.
//!
//! All-to-all heartbeats cost every node `n - 1` calls a period: 5.6 kB/s
//! per peer at 100 ms, 16 % of a 4G uplink at 64 nodes (`weir-lab scale`).
//! With gossip, every `gossip_every` a node exchanges its table (its own
//! advert and every live one it holds) with [`partners`]' few peers,
//! push-pull: the call carries the caller's table, the reply the callee's.
//! Each relayed advert carries its *age*, how long ago its relayer
//! first heard that round of it, so it ages along the way and a dead
//! node's last advert expires everywhere `dead_after` after its origin
//! last spoke, however often it is passed on ([`PeerView::observe_relayed`]).
//! Ages are durations measured on one node each, so clocks need not agree.
//!
//! A relayed advert is taken only if its round is newer than the one
//! held, alive or gone, so a stale copy never brings a dead node back; a
//! node heard first-hand is taken as in all-to-all ([`PeerView::observe`]).
//! What is relayed is only ever advice: a provider grants from its own
//! spare, so a forged or stale advert costs a refused Reserve, never an
//! over-booked provider.

use std::time::Duration;

use super::period::mix;
use super::state::Advert;
use super::view::PeerView;
use crate::record::NodeId;

/// Peers a node exchanges its table with per gossip period.
pub const GOSSIP_FANOUT: usize = 2;

/// How often a node starts its exchanges.
pub const GOSSIP_EVERY: Duration = Duration::from_secs(1);

/// Gossip periods of silence after which a node is gone by default: with 2
/// partners a second an advert reaches all of 64 nodes within about 3 s
/// (`weir-lab scale`), so 6 periods leave room for an unlucky draw.
pub const GOSSIP_DEAD_AFTER_PERIODS: u32 = 6;

/// One advert in a gossiped table.
#[derive(Debug, Clone, PartialEq)]
pub struct Relayed {
    /// Whose advert it is.
    pub node: NodeId,
    pub advert: Advert,
    /// How long before the table was sent its sender first heard this
    /// round of it (0 for the sender's own).
    pub age: Duration,
}

/// The table a node sends a partner at `now`: every peer alive in its view
/// with its age, except `partner` (who knows itself better). The sender's
/// own advert travels beside it, first-hand.
pub fn table(view: &PeerView, now: Duration, partner: NodeId) -> Vec<Relayed> {
    view.alive(now)
        .filter(|&(id, _)| id != partner)
        .map(|(id, advert)| Relayed {
            node: id,
            advert: advert.clone(),
            age: now.saturating_sub(view.last_heard(id).unwrap_or(now)),
        })
        .collect()
}

/// Node `me` takes in entry `r` of the table `from` sent it at `now`
/// ([`PeerView::observe_relayed`]); `None` (ignored) when the entry is
/// about `me` or about `from` itself, whose own advert came first-hand
/// beside the table.
pub fn take(
    view: &mut PeerView,
    me: NodeId,
    from: NodeId,
    r: Relayed,
    now: Duration,
) -> Option<super::Observed> {
    (r.node != me && r.node != from).then(|| view.observe_relayed(r.node, r.advert, r.age, now))
}

/// Whom node `me` gossips with in gossip period `period`: `fanout` of
/// `candidates` (fewer if there are fewer), distinct, spread evenly over
/// nodes and periods, and the same for the same arguments on any node (a
/// hash, no state or randomness to seed). `me` is never chosen.
pub fn partners(me: NodeId, period: u64, candidates: &[NodeId], fanout: usize) -> Vec<NodeId> {
    let mut pool: Vec<NodeId> = candidates.iter().copied().filter(|&c| c != me).collect();
    pool.sort_unstable();
    pool.dedup();
    let mut chosen = Vec::with_capacity(fanout.min(pool.len()));
    let mut k = 0u64;
    while chosen.len() < fanout && !pool.is_empty() {
        // The heartbeats' hash of the three numbers, reduced to the pool.
        let h = mix(me ^ mix(k ^ mix(period)));
        let i = (h % pool.len() as u64) as usize;
        chosen.push(pool.swap_remove(i));
        k += 1;
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::janus::BandwidthTuple;
    use crate::peer::Observed;

    const S: Duration = Duration::from_secs(1);

    fn advert(round: u64) -> Advert {
        Advert {
            round,
            tuple: BandwidthTuple(vec![round as f64, 0.0, 0.0]),
            requesting_since_us: 0,
        }
    }

    #[test]
    fn partners_are_distinct_spread_and_never_the_node_itself() {
        let all: Vec<NodeId> = (1..=64).collect();
        let mut hits = vec![0usize; 65];
        for period in 0..1000 {
            let p = partners(7, period, &all, 2);
            assert_eq!(p.len(), 2);
            assert_ne!(p[0], p[1]);
            assert!(!p.contains(&7));
            assert_eq!(p, partners(7, period, &all, 2), "deterministic");
            for id in p {
                hits[id as usize] += 1;
            }
        }
        // 2,000 picks over 63 peers: about 32 each.
        let picked: Vec<usize> = (1..=64).filter(|&i| i != 7).map(|i| hits[i]).collect();
        assert!(picked.iter().all(|&n| (10..=60).contains(&n)), "{picked:?}");
        // Fewer candidates than the fan-out: all of them.
        let mut few = partners(1, 3, &[2, 3, 1], 5);
        few.sort();
        assert_eq!(few, vec![2, 3]);
        assert!(partners(1, 3, &[1], 2).is_empty());
    }

    #[test]
    fn a_relayed_advert_ages_and_expires_when_its_origin_last_spoke() {
        let mut view = PeerView::new(6 * S);
        // Heard 2 s ago by the relayer: alive, and 2 s old here.
        let now = 100 * S;
        assert_eq!(
            view.observe_relayed(3, advert(5), 2 * S, now),
            Observed::Joined
        );
        assert!(view.is_alive(3, now));
        assert_eq!(view.last_heard(3), Some(98 * S));
        // Passed on again 1 s later: its age says 3 s, as it is.
        let t = table(&view, now + S, 9);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].age, 3 * S);
        // Nothing newer: gone 6 s after its origin spoke, not after it
        // was last passed on.
        assert_eq!(
            view.observe_relayed(3, advert(5), Duration::ZERO, now + 3 * S),
            Observed::Stale
        );
        assert!(view.is_alive(3, 103 * S));
        assert!(!view.is_alive(3, 104 * S));
        // A copy older than dead_after is not taken at all.
        assert_eq!(
            view.observe_relayed(4, advert(1), 7 * S, now),
            Observed::Stale
        );
        assert!(!view.is_alive(4, now));
    }

    #[test]
    fn a_stale_copy_never_brings_a_dead_node_back() {
        let mut view = PeerView::new(6 * S);
        view.observe(3, advert(5), Duration::ZERO);
        assert!(!view.is_alive(3, 7 * S));
        // Another node, which learnt round 5 late, passes it on as fresh.
        assert_eq!(
            view.observe_relayed(3, advert(5), Duration::ZERO, 7 * S),
            Observed::Stale
        );
        assert!(!view.is_alive(3, 7 * S));
        // A newer round is news: the node spoke again.
        assert_eq!(
            view.observe_relayed(3, advert(6), S, 7 * S),
            Observed::Joined
        );
        assert_eq!(view.advert(3).map(|a| a.round), Some(6));
        // First-hand, a restarted node with a smaller round is taken once
        // gone, as with heartbeats.
        assert_eq!(view.observe(3, advert(1), 20 * S), Observed::Joined);
    }

    #[test]
    fn the_table_leaves_out_the_partner_and_the_dead() {
        let mut view = PeerView::new(6 * S);
        view.observe(2, advert(1), Duration::ZERO);
        view.observe(3, advert(1), 5 * S);
        view.observe(4, advert(1), 5 * S);
        let t = table(&view, 7 * S, 4);
        assert_eq!(
            t,
            vec![Relayed {
                node: 3,
                advert: advert(1),
                age: 2 * S
            }]
        );
    }

    /// Twenty nodes, each hearing only the two partners it calls each
    /// period (and their tables): every node knows every other within a
    /// few periods, and a node that stops is gone everywhere within
    /// `dead_after` of its last advert, plus a period.
    #[test]
    fn twenty_nodes_learn_each_other_and_forget_the_dead() {
        let n = 20u64;
        let ids: Vec<NodeId> = (1..=n).collect();
        let mut views: Vec<PeerView> = ids.iter().map(|_| PeerView::new(6 * S)).collect();
        let complete = |views: &[PeerView], now: Duration, live: &[NodeId]| {
            live.iter().all(|&i| {
                live.iter()
                    .all(|&j| i == j || views[i as usize - 1].is_alive(j, now))
            })
        };
        let mut alive: Vec<NodeId> = ids.clone();
        let mut learnt = None;
        for period in 0..30u64 {
            let now = S * period as u32;
            if period == 15 {
                alive.retain(|&i| i != 5);
            }
            for &i in &alive {
                for j in partners(i, period, &ids, GOSSIP_FANOUT) {
                    if !alive.contains(&j) {
                        continue;
                    }
                    let (a, b) = (i as usize - 1, j as usize - 1);
                    let to_j = table(&views[a], now, j);
                    let to_i = table(&views[b], now, i);
                    views[b].observe(i, advert(period + 1), now);
                    views[a].observe(j, advert(period + 1), now);
                    for r in to_j {
                        take(&mut views[b], j, i, r, now);
                    }
                    for r in to_i {
                        take(&mut views[a], i, j, r, now);
                    }
                }
            }
            if learnt.is_none() && complete(&views, now, &alive) {
                learnt = Some(period);
            }
        }
        let learnt = learnt.expect("views never complete");
        assert!(learnt <= 8, "complete after {learnt} periods");
        // Node 5 last spoke in period 14: gone everywhere by period 21.
        assert!(alive
            .iter()
            .all(|&i| !views[i as usize - 1].is_alive(5, 21 * S)));
    }
}
