//! How a granted rate becomes a token bucket ([`Pacing`]), for providers and
//! receivers alike.

use std::time::Duration;

use crate::janus::non_negative;
use crate::queueing::token_bucket::{BucketConfig, TokenBucket};

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

    pub(crate) fn bucket(&self, rate: f64, now: Duration) -> TokenBucket {
        TokenBucket::new(BucketConfig::bytes(rate, self.depth(rate)), now)
    }

    pub(crate) fn retune(&self, bucket: &mut TokenBucket, rate: f64, now: Duration) {
        bucket.set_bytes_per_sec(now, rate);
        bucket.set_burst_bytes(now, self.depth(rate));
    }
}
