//! Traffic redirection: JANUS Algorithm 3 (PMRFS, Prioritized Max-Request
//! First Served) and the baselines of Section V-B3 / VII (Random, FCFS,
//! LRFS, Best Fit), as pure functions from requests and offers to grants.
//!
//! A node whose [`BandwidthTuple`] has negative entries is a receiver: it
//! asks for one [`Request`] per short class ([`requests_from`]). A node with
//! positive entries is a provider: it offers its total spare
//! ([`offer_from`]). A [`Grant`] tells the receiver to redirect `amount`
//! units/s of `class` to the provider, and the provider to reserve that much
//! for the class ([`apply_grant`], Fig. 4).
//!
//! Every matcher walks providers from the largest offer down (ties by node
//! id), as PMRFS does; they differ in which request each provider serves
//! next. All are deterministic: the same input gives the same grants
//! whatever order it came in. A node that both offers and asks (a valid
//! tuple never does: Algorithm 2 leaves spare only once every demand is met)
//! may be matched with itself; such a grant is a local reallocation, which
//! [`apply_grant`] carries out correctly.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use crate::class::ClassId;
use crate::record::NodeId;

use super::allocator::fit_within;
use super::allocator::{Allocation, BandwidthTuple};
use super::error::{non_negative, JanusError};

/// Amounts at or below this many units/s are treated as nothing: they are
/// floating-point residue of subtractions, far below one byte or record per
/// second, and granting them would only add messages.
pub const MIN_AMOUNT: f64 = 1e-9;

/// Seed of `random` when the config names none: fixed, so that runs repeat.
pub const DEFAULT_RANDOM_SEED: u64 = 0x004A_414E_5553; // "JANUS" in ASCII

/// A receiver's shortage in one class (a negative tuple entry, negated).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Request {
    /// The node short of bandwidth.
    pub receiver: NodeId,
    /// The class it is short in.
    pub class: ClassId,
    /// The shortage in units/s (positive).
    pub amount: f64,
    /// When the request arrived, in any monotonic order: FCFS serves the
    /// smallest first.
    pub order: u64,
}

/// A provider's spare bandwidth (the sum of its positive tuple entries).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Offer {
    /// The node with spare bandwidth.
    pub provider: NodeId,
    /// Spare units/s (positive).
    pub amount: f64,
}

/// One match: `receiver` redirects `amount` units/s of `class` to
/// `provider`, which reserves that much for the class (Algorithm 3
/// `BWRespond` and `BWReserve`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grant {
    /// The node lending bandwidth.
    pub provider: NodeId,
    /// The node redirecting traffic.
    pub receiver: NodeId,
    /// The class of the redirected traffic.
    pub class: ClassId,
    /// Units/s granted, always above [`MIN_AMOUNT`].
    pub amount: f64,
}

/// Which matcher turns requests and offers into grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Strategy {
    /// Algorithm 3: most urgent class first, largest shortage first.
    #[default]
    Pmrfs,
    /// Requests in a random order (Section VII "Random"), seeded so that a
    /// run can be repeated.
    Random {
        /// Seed of the shuffle.
        seed: u64,
    },
    /// First Come First Served: the earliest request (smallest `order`) first.
    Fcfs,
    /// Least Request First Served: the smallest shortage first.
    Lrfs,
    /// Best Fit: each provider serves the request closest in size to what
    /// it has left.
    BestFit,
}

impl Strategy {
    /// The config name (`pmrfs`, `random`, `fcfs`, `lrfs`, `best-fit`).
    pub const fn name(self) -> &'static str {
        match self {
            Strategy::Pmrfs => "pmrfs",
            Strategy::Random { .. } => "random",
            Strategy::Fcfs => "fcfs",
            Strategy::Lrfs => "lrfs",
            Strategy::BestFit => "best-fit",
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Strategy::Random { seed } if seed != DEFAULT_RANDOM_SEED => write!(f, "random:{seed}"),
            s => f.write_str(s.name()),
        }
    }
}

impl FromStr for Strategy {
    type Err = JanusError;

    /// Parses a config name; `random:<seed>` picks the seed.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "pmrfs" => Ok(Strategy::Pmrfs),
            "random" => Ok(Strategy::Random {
                seed: DEFAULT_RANDOM_SEED,
            }),
            "fcfs" => Ok(Strategy::Fcfs),
            "lrfs" => Ok(Strategy::Lrfs),
            "best-fit" => Ok(Strategy::BestFit),
            _ => s
                .strip_prefix("random:")
                .and_then(|seed| seed.parse().ok())
                .map(|seed| Strategy::Random { seed })
                .ok_or_else(|| JanusError::UnknownScheme(s.to_owned())),
        }
    }
}

/// Matches requests with offers by `strategy`. Requests and offers whose
/// amount is not a finite number above [`MIN_AMOUNT`] are ignored.
///
/// Whatever the strategy, no provider is granted more than it offered, no
/// receiver more than it asked for a class (up to float rounding), and the
/// total granted is `min(total asked, total offered)`.
pub fn redirect(strategy: Strategy, requests: &[Request], offers: &[Offer]) -> Vec<Grant> {
    let mut receivers: Vec<Request> = requests
        .iter()
        .filter(|r| usable(r.amount))
        .copied()
        .collect();
    let mut providers: Vec<Offer> = offers
        .iter()
        .filter(|o| usable(o.amount))
        .copied()
        .collect();
    if receivers.is_empty() || providers.is_empty() {
        return Vec::new();
    }
    // Largest offer first (Algorithm 3 line 4), then by node id.
    providers.sort_unstable_by(|a, b| {
        b.amount
            .total_cmp(&a.amount)
            .then(a.provider.cmp(&b.provider))
    });

    match strategy {
        Strategy::Pmrfs => {
            // Algorithm 3 line 3: priority first, then the largest shortage.
            receivers.sort_unstable_by(|a, b| {
                a.class
                    .cmp(&b.class)
                    .then(b.amount.total_cmp(&a.amount))
                    .then(a.receiver.cmp(&b.receiver))
                    .then(a.order.cmp(&b.order))
            });
            fill(&receivers, &providers)
        }
        Strategy::Fcfs => {
            receivers.sort_unstable_by(|a, b| {
                a.order
                    .cmp(&b.order)
                    .then(a.class.cmp(&b.class))
                    .then(a.receiver.cmp(&b.receiver))
                    .then(a.amount.total_cmp(&b.amount))
            });
            fill(&receivers, &providers)
        }
        Strategy::Lrfs => {
            receivers.sort_unstable_by(|a, b| {
                a.amount
                    .total_cmp(&b.amount)
                    .then(a.class.cmp(&b.class))
                    .then(a.receiver.cmp(&b.receiver))
                    .then(a.order.cmp(&b.order))
            });
            fill(&receivers, &providers)
        }
        Strategy::Random { seed } => {
            // A canonical order first, so the shuffle does not depend on the
            // order requests were collected in.
            receivers.sort_unstable_by(|a, b| {
                a.receiver
                    .cmp(&b.receiver)
                    .then(a.class.cmp(&b.class))
                    .then(a.order.cmp(&b.order))
                    .then(a.amount.total_cmp(&b.amount))
            });
            shuffle(&mut receivers, seed);
            fill(&receivers, &providers)
        }
        Strategy::BestFit => best_fit(&receivers, &providers),
    }
}

/// True for an amount worth matching.
#[inline]
fn usable(amount: f64) -> bool {
    amount.is_finite() && amount > MIN_AMOUNT
}

/// Algorithm 3 lines 5-22 over receivers and providers already in order:
/// each provider serves receivers in turn, fully while it has enough, else
/// with all it has (the receiver keeps its remainder for the next provider).
///
/// Each step either completes a receiver or exhausts a provider, so this is
/// O(p + r), not the paper's O(p * r).
fn fill(receivers: &[Request], providers: &[Offer]) -> Vec<Grant> {
    let mut grants = Vec::with_capacity(receivers.len() + providers.len());
    let mut ri = 0;
    let mut need = receivers[0].amount;
    'providers: for p in providers {
        let mut free = p.amount;
        while let Some(r) = receivers.get(ri) {
            if free >= need {
                grants.push(grant(p, r, need));
                free -= need;
                ri += 1;
                match receivers.get(ri) {
                    Some(next) => need = next.amount,
                    None => break 'providers,
                }
                if free <= MIN_AMOUNT {
                    break;
                }
            } else {
                grants.push(grant(p, r, free));
                need -= free;
                if need <= MIN_AMOUNT {
                    ri += 1;
                    match receivers.get(ri) {
                        Some(next) => need = next.amount,
                        None => break 'providers,
                    }
                }
                break;
            }
        }
    }
    grants
}

/// Best Fit: each provider (largest first) repeatedly serves the request
/// whose size is closest to what it has left; on a tie, the one that fits,
/// so that the tie completes a request instead of splitting one.
///
/// Pending requests sit in a set ordered by amount, so each choice is two
/// range lookups: O((p + r) log r).
fn best_fit(receivers: &[Request], providers: &[Offer]) -> Vec<Grant> {
    // (amount bits, class, receiver, order, index): for positive finite
    // floats the bit pattern orders like the value, and the rest breaks ties
    // by priority, then node id.
    type Key = (u64, ClassId, NodeId, u64, usize);
    let key = |amount: f64, i: usize| -> Key {
        let r = &receivers[i];
        (amount.to_bits(), r.class, r.receiver, r.order, i)
    };
    let mut pending: BTreeSet<Key> = (0..receivers.len())
        .map(|i| key(receivers[i].amount, i))
        .collect();
    let mut grants = Vec::with_capacity(receivers.len() + providers.len());

    for p in providers {
        let mut free = p.amount;
        while free > MIN_AMOUNT {
            let bits = free.to_bits();
            // The largest amount <= free, the first of its ties ...
            let fits = pending
                .range(..=(bits, ClassId(u8::MAX), NodeId::MAX, u64::MAX, usize::MAX))
                .next_back()
                .and_then(|k| pending.range((k.0, ClassId(0), 0, 0, 0)..).next())
                .copied();
            // ... and the smallest amount > free.
            let over = pending
                .range((bits + 1, ClassId(0), 0, 0, 0)..)
                .next()
                .copied();
            let pick = match (fits, over) {
                (Some(f), Some(o)) => {
                    if free - f64::from_bits(f.0) <= f64::from_bits(o.0) - free {
                        f
                    } else {
                        o
                    }
                }
                (Some(k), None) | (None, Some(k)) => k,
                (None, None) => return grants,
            };
            pending.remove(&pick);
            let amount = f64::from_bits(pick.0);
            let r = &receivers[pick.4];
            if amount <= free {
                grants.push(grant(p, r, amount));
                free -= amount;
            } else {
                grants.push(grant(p, r, free));
                let rest = amount - free;
                if rest > MIN_AMOUNT {
                    pending.insert(key(rest, pick.4));
                }
                free = 0.0;
            }
        }
    }
    grants
}

#[inline]
fn grant(p: &Offer, r: &Request, amount: f64) -> Grant {
    Grant {
        provider: p.provider,
        receiver: r.receiver,
        class: r.class,
        amount,
    }
}

/// Fisher-Yates with splitmix64 (Steele et al. 2014): a few lines instead
/// of a `rand` dependency, and the same permutation for the same seed on
/// every platform.
fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut state = seed;
    for i in (1..items.len()).rev() {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        // Lemire's multiply-shift maps z onto 0..=i without a division.
        let j = ((u128::from(z) * (i as u128 + 1)) >> 64) as usize;
        items.swap(i, j);
    }
}

/// One [`Request`] per short class of `node`'s tuple, stamped with `order`.
pub fn requests_from(node: NodeId, tuple: &BandwidthTuple, order: u64) -> Vec<Request> {
    tuple
        .shortages()
        .filter(|&(_, amount)| usable(amount))
        .map(|(class, amount)| Request {
            receiver: node,
            class,
            amount,
            order,
        })
        .collect()
}

/// `node`'s [`Offer`]: its total spare, if any.
pub fn offer_from(node: NodeId, tuple: &BandwidthTuple) -> Option<Offer> {
    let amount = tuple.spare_total();
    usable(amount).then_some(Offer {
        provider: node,
        amount,
    })
}

/// Provider side of a grant (Algorithm 3 `BWReserve`, Fig. 4): moves up to
/// `grant.amount` of spare out of the tuple and into the granted class's
/// rate, and returns the amount moved (at most the spare left).
///
/// Spare is taken from the least urgent class first, so the most urgent
/// class keeps its headroom longest. The total rate never grows. Fig. 4:
/// E2 at `[18, 10, 2]` offering `[8, 0, 0]`, granted 5 for `lt`, ends at
/// `[13, 10, 7]` offering `[3, 0, 0]`.
pub fn apply_grant(allocation: &mut Allocation, tuple: &mut BandwidthTuple, grant: &Grant) -> f64 {
    let class = grant.class.index();
    let n = allocation.len().min(tuple.0.len());
    if class >= n {
        return 0.0;
    }
    let cap = allocation.total();
    let mut want = non_negative(grant.amount);
    let mut moved = 0.0;
    for c in (0..n).rev() {
        if want <= 0.0 {
            break;
        }
        let take = non_negative(tuple.0[c]).min(want);
        if take <= 0.0 {
            continue;
        }
        let before = allocation.rates[c];
        allocation.rates[c] = non_negative(before - take);
        tuple.0[c] -= take;
        moved += before - allocation.rates[c];
        want -= take;
    }
    allocation.rates[class] += moved;
    fit_within(&mut allocation.rates[..n], cap);
    moved
}

#[cfg(test)]
mod tests {
    use super::*;
    // Our `Strategy` enum, not proptest's trait (kept in scope unnamed).
    use super::Strategy;
    use proptest::prelude::*;
    use proptest::strategy::Strategy as _;
    use std::collections::HashMap;

    fn req(receiver: NodeId, class: u8, amount: f64, order: u64) -> Request {
        Request {
            receiver,
            class: ClassId(class),
            amount,
            order,
        }
    }

    fn offer(provider: NodeId, amount: f64) -> Offer {
        Offer { provider, amount }
    }

    /// (provider, receiver, amount) of each grant, in order.
    fn triples(grants: &[Grant]) -> Vec<(NodeId, NodeId, f64)> {
        grants
            .iter()
            .map(|g| (g.provider, g.receiver, g.amount))
            .collect()
    }

    #[test]
    fn fig_4_working_example() {
        const E1: NodeId = 1;
        const E2: NodeId = 2;
        let e1_alloc = Allocation {
            rates: vec![10.0, 10.0, 10.0],
        };
        let e1_tuple = BandwidthTuple(vec![0.0, 0.0, -5.0]);
        let mut e2_alloc = Allocation {
            rates: vec![18.0, 10.0, 2.0],
        };
        let mut e2_tuple = BandwidthTuple(vec![8.0, 0.0, 0.0]);

        let requests = requests_from(E1, &e1_tuple, 0);
        assert_eq!(requests, vec![req(E1, 2, 5.0, 0)]);
        assert_eq!(requests_from(E2, &e2_tuple, 0), vec![]);
        let offers: Vec<Offer> = [offer_from(E1, &e1_tuple), offer_from(E2, &e2_tuple)]
            .into_iter()
            .flatten()
            .collect();
        assert_eq!(offers, vec![offer(E2, 8.0)]);

        let grants = redirect(Strategy::Pmrfs, &requests, &offers);
        // [0, 0, 5] from E2 to E1's lt class.
        assert_eq!(
            grants,
            vec![Grant {
                provider: E2,
                receiver: E1,
                class: ClassId(2),
                amount: 5.0,
            }]
        );

        assert_eq!(apply_grant(&mut e2_alloc, &mut e2_tuple, &grants[0]), 5.0);
        assert_eq!(e2_alloc.rates, vec![13.0, 10.0, 7.0]);
        assert_eq!(e2_tuple, BandwidthTuple(vec![3.0, 0.0, 0.0]));
        assert_eq!(e1_alloc.total(), 30.0);
    }

    #[test]
    fn apply_grant_is_capped_by_spare() {
        let mut alloc = Allocation {
            rates: vec![12.0, 10.0, 8.0],
        };
        let mut tuple = BandwidthTuple(vec![2.0, 0.0, 1.0]);
        let g = Grant {
            provider: 2,
            receiver: 1,
            class: ClassId(1),
            amount: 10.0,
        };
        // lt's spare goes first, then ls's.
        assert_eq!(apply_grant(&mut alloc, &mut tuple, &g), 3.0);
        assert_eq!(alloc.rates, vec![10.0, 13.0, 7.0]);
        assert_eq!(tuple, BandwidthTuple(vec![0.0, 0.0, 0.0]));
        let out_of_range = Grant {
            class: ClassId(9),
            ..g
        };
        assert_eq!(apply_grant(&mut alloc, &mut tuple, &out_of_range), 0.0);
    }

    #[test]
    fn pmrfs_serves_priority_then_size_and_splits_across_providers() {
        let requests = [req(1, 1, 4.0, 0), req(2, 0, 2.0, 1), req(3, 1, 6.0, 2)];
        let offers = [offer(11, 4.0), offer(10, 5.0)];
        let grants = redirect(Strategy::Pmrfs, &requests, &offers);
        assert_eq!(
            triples(&grants),
            vec![(10, 2, 2.0), (10, 3, 3.0), (11, 3, 3.0), (11, 1, 1.0)]
        );
    }

    /// One case on which every matcher differs: asked 6 in all, offered 6.
    fn contested() -> (Vec<Request>, Vec<Offer>) {
        (
            vec![req(1, 1, 2.0, 2), req(2, 0, 3.0, 1), req(3, 2, 1.0, 0)],
            vec![offer(11, 2.5), offer(10, 3.5)],
        )
    }

    #[test]
    fn pmrfs_on_the_contested_case() {
        let (r, o) = contested();
        assert_eq!(
            triples(&redirect(Strategy::Pmrfs, &r, &o)),
            vec![(10, 2, 3.0), (10, 1, 0.5), (11, 1, 1.5), (11, 3, 1.0)]
        );
    }

    #[test]
    fn fcfs_serves_the_earliest_request_first() {
        let (r, o) = contested();
        assert_eq!(
            triples(&redirect(Strategy::Fcfs, &r, &o)),
            vec![(10, 3, 1.0), (10, 2, 2.5), (11, 2, 0.5), (11, 1, 2.0)]
        );
    }

    #[test]
    fn lrfs_serves_the_smallest_request_first() {
        let (r, o) = contested();
        assert_eq!(
            triples(&redirect(Strategy::Lrfs, &r, &o)),
            vec![(10, 3, 1.0), (10, 1, 2.0), (10, 2, 0.5), (11, 2, 2.5)]
        );
    }

    #[test]
    fn best_fit_serves_the_closest_request() {
        let (r, o) = contested();
        // 3.5 left: 3 is closest; 0.5 left: 1 is closest (nothing fits);
        // 2.5 left: 2 beats 0.5; 0.5 left: the remaining 0.5 fits exactly.
        assert_eq!(
            triples(&redirect(Strategy::BestFit, &r, &o)),
            vec![(10, 2, 3.0), (10, 3, 0.5), (11, 1, 2.0), (11, 3, 0.5)]
        );
    }

    #[test]
    fn best_fit_prefers_the_request_that_fits_on_a_tie() {
        let requests = [req(1, 0, 5.0, 0), req(2, 1, 3.0, 0)];
        let grants = redirect(Strategy::BestFit, &requests, &[offer(10, 4.0)]);
        assert_eq!(triples(&grants), vec![(10, 2, 3.0), (10, 1, 1.0)]);
    }

    #[test]
    fn random_is_seeded_and_ignores_input_order() {
        let (r, o) = contested();
        let s = Strategy::Random { seed: 7 };
        let a = redirect(s, &r, &o);
        let mut reversed = r.clone();
        reversed.reverse();
        assert_eq!(a, redirect(s, &reversed, &o));
        assert_eq!(a.iter().map(|g| g.amount).sum::<f64>(), 6.0);
        // Some seed orders the requests differently from the canonical order.
        let orders: std::collections::HashSet<Vec<NodeId>> = (0..32)
            .map(|seed| {
                redirect(Strategy::Random { seed }, &r, &o)
                    .iter()
                    .map(|g| g.receiver)
                    .collect()
            })
            .collect();
        assert!(orders.len() > 1);
    }

    #[test]
    fn unusable_amounts_are_ignored_and_zero_grants_never_made() {
        let requests = [
            req(1, 0, 0.0, 0),
            req(2, 0, -3.0, 0),
            req(3, 0, f64::NAN, 0),
            req(4, 0, f64::INFINITY, 0),
            req(5, 1, 2.0, 0),
        ];
        let offers = [offer(10, f64::NAN), offer(11, 0.0), offer(12, 1.0)];
        for s in ALL {
            let grants = redirect(s, &requests, &offers);
            assert_eq!(triples(&grants), vec![(12, 5, 1.0)], "{s}");
        }
        assert!(redirect(Strategy::Pmrfs, &[], &offers).is_empty());
        assert!(redirect(Strategy::Pmrfs, &requests, &[]).is_empty());
    }

    #[test]
    fn equal_offers_are_taken_by_node_id() {
        let grants = redirect(
            Strategy::Pmrfs,
            &[req(1, 0, 3.0, 0)],
            &[offer(9, 2.0), offer(4, 2.0)],
        );
        assert_eq!(triples(&grants), vec![(4, 1, 2.0), (9, 1, 1.0)]);
    }

    #[test]
    fn strategy_names_round_trip() {
        for s in ALL {
            assert_eq!(s.to_string().parse::<Strategy>(), Ok(s));
        }
        assert_eq!(
            "random".parse::<Strategy>(),
            Ok(Strategy::Random {
                seed: DEFAULT_RANDOM_SEED
            })
        );
        assert_eq!("random:9".parse(), Ok(Strategy::Random { seed: 9 }));
        assert!("random:x".parse::<Strategy>().is_err());
        assert!("PMRFS".parse::<Strategy>().is_err());
    }

    const ALL: [Strategy; 6] = [
        Strategy::Pmrfs,
        Strategy::Random {
            seed: DEFAULT_RANDOM_SEED,
        },
        Strategy::Random { seed: 42 },
        Strategy::Fcfs,
        Strategy::Lrfs,
        Strategy::BestFit,
    ];

    fn requests_strategy() -> impl proptest::strategy::Strategy<Value = Vec<Request>> {
        prop::collection::vec((0u64..20, 0u8..4, 0.0f64..100.0, 0u64..50), 0..40)
            .prop_map(|v| v.into_iter().map(|(n, c, a, o)| req(n, c, a, o)).collect())
    }

    fn offers_strategy() -> impl proptest::strategy::Strategy<Value = Vec<Offer>> {
        prop::collection::vec((100u64..120, 0.0f64..150.0), 0..30)
            .prop_map(|v| v.into_iter().map(|(n, a)| offer(n, a)).collect())
    }

    /// Rounding slack on a sum of amounts.
    fn slack(total: f64) -> f64 {
        1e-9 * (1.0 + total)
    }

    proptest! {
        #[test]
        fn no_matcher_overgrants(
            requests in requests_strategy(),
            offers in offers_strategy(),
        ) {
            let mut asked: HashMap<(NodeId, ClassId), f64> = HashMap::new();
            for r in &requests {
                *asked.entry((r.receiver, r.class)).or_default() += r.amount;
            }
            let mut offered: HashMap<NodeId, f64> = HashMap::new();
            for o in &offers {
                *offered.entry(o.provider).or_default() += o.amount;
            }
            let total_asked: f64 = asked.values().sum();
            let total_offered: f64 = offered.values().sum();
            for s in ALL {
                let grants = redirect(s, &requests, &offers);
                let mut got: HashMap<(NodeId, ClassId), f64> = HashMap::new();
                let mut gave: HashMap<NodeId, f64> = HashMap::new();
                for g in &grants {
                    prop_assert!(g.amount > MIN_AMOUNT && g.amount.is_finite(), "{s}: {g:?}");
                    *got.entry((g.receiver, g.class)).or_default() += g.amount;
                    *gave.entry(g.provider).or_default() += g.amount;
                }
                for (k, v) in &got {
                    let a = asked.get(k).copied().unwrap_or(0.0);
                    prop_assert!(*v <= a + slack(a), "{s}: {k:?} got {v} of {a}");
                }
                for (k, v) in &gave {
                    let o = offered.get(k).copied().unwrap_or(0.0);
                    prop_assert!(*v <= o + slack(o), "{s}: {k} gave {v} of {o}");
                }
                // Work-conserving: nothing is left unmatched on both sides.
                let total: f64 = grants.iter().map(|g| g.amount).sum();
                let want = total_asked.min(total_offered);
                prop_assert!((total - want).abs() <= 1e-6 * (1.0 + want), "{s}: {total} vs {want}");
            }
        }

        #[test]
        fn pmrfs_serves_a_class_fully_before_the_next(
            requests in requests_strategy(),
            offers in offers_strategy(),
        ) {
            let grants = redirect(Strategy::Pmrfs, &requests, &offers);
            let mut asked = [0.0f64; 4];
            for r in &requests {
                asked[r.class.index()] += r.amount;
            }
            let mut got = [0.0f64; 4];
            for g in &grants {
                got[g.class.index()] += g.amount;
            }
            for c in 0..4 {
                if got[c] > 0.0 {
                    for higher in 0..c {
                        prop_assert!(
                            got[higher] + 1e-6 * (1.0 + asked[higher]) >= asked[higher],
                            "class {c} served before class {higher} was full: {got:?} of {asked:?}"
                        );
                    }
                }
            }
            // And within the grants' order, classes never go back up.
            prop_assert!(grants.windows(2).all(|w| w[0].class <= w[1].class));
        }
    }
}
