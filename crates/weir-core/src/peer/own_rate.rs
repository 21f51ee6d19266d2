//! The node's own arrival rate, peers' records excluded, smoothed
//! ([`OwnRate`]).

use std::time::Duration;

/// Time constant of a node's own arrival rate as peering sees it
/// ([`OwnRate`]): long enough to smooth a window's bunching, short against
/// a load change.
pub const OWN_RATE_TAU: Duration = Duration::from_secs(1);

/// The rate of a node's own arrivals (everything but what peers forwarded
/// to it), smoothed over [`OWN_RATE_TAU`]: what [`lendable`](crate::peer::lendable) subtracts from
/// `C_out` ([`BandwidthState::own_rate`](crate::peer::BandwidthState::own_rate)).
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
