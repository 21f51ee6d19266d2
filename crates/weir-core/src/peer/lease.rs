//! A receiver's leases: the rates providers granted it, and the pacing of what
//! it sends under them ([`Leases`]).

use std::collections::BTreeMap;
use std::time::Duration;

use super::pacing::Pacing;
use crate::class::ClassId;
use crate::janus::redirect::MIN_AMOUNT;
use crate::queueing::token_bucket::{Take, TokenBucket};
use crate::record::NodeId;

/// One rate granted to this node by a provider.
#[derive(Debug, Clone)]
pub(crate) struct Lease {
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
