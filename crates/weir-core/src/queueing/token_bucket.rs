//! Token buckets per latency class, whose rates BWAllocator sets
//! (JANUS Algorithm 2's `V_c`, the per-queue output rate).
//!
//! A bucket limits both bytes/s and records/s; either may be unlimited.
//! Time is passed in as `now` (a [`Duration`] since any fixed epoch), so
//! buckets run on a virtual clock in tests and in the lab.
//!
//! A record larger than the byte burst could never conform; rather than
//! block its class forever, a *full* bucket lets it through and goes into
//! debt, which later refills repay. The long-run rate is kept either way.

use std::time::Duration;

/// Rates and depths of one bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketConfig {
    /// Sustained bytes per second (`f64::INFINITY` for no byte limit).
    pub bytes_per_sec: f64,
    /// Sustained records per second (`f64::INFINITY` for no record limit).
    pub records_per_sec: f64,
    /// Byte depth: the most bytes sent back to back after an idle spell.
    pub burst_bytes: f64,
    /// Record depth: the most records sent back to back after an idle spell.
    pub burst_records: f64,
}

impl BucketConfig {
    /// A byte-rate bucket with no record limit.
    pub fn bytes(bytes_per_sec: f64, burst_bytes: f64) -> Self {
        BucketConfig {
            bytes_per_sec,
            records_per_sec: f64::INFINITY,
            burst_bytes,
            burst_records: f64::INFINITY,
        }
    }
}

/// What [`TokenBucket::try_take`] decided.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Take {
    /// Tokens taken: send now.
    Granted,
    /// Not enough tokens: retry after this long (at the current rates).
    /// [`Duration::MAX`] when the rate is zero.
    Wait(Duration),
}

/// A dual (bytes and records) token bucket.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    config: BucketConfig,
    byte_tokens: f64,
    record_tokens: f64,
    last: Duration,
}

/// Seconds as a `Duration`, saturating on infinities and NaN.
fn secs(s: f64) -> Duration {
    if s.is_finite() && s >= 0.0 {
        Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX)
    } else {
        Duration::MAX
    }
}

impl TokenBucket {
    /// A full bucket at time `now`.
    pub fn new(config: BucketConfig, now: Duration) -> Self {
        TokenBucket {
            byte_tokens: config.burst_bytes,
            record_tokens: config.burst_records,
            config,
            last: now,
        }
    }

    /// The current configuration.
    pub fn config(&self) -> BucketConfig {
        self.config
    }

    /// Changes the byte rate at `now`, crediting tokens earned at the old rate
    /// up to `now` first (so a rate change never creates or loses credit).
    pub fn set_bytes_per_sec(&mut self, now: Duration, bytes_per_sec: f64) {
        self.refill(now);
        self.config.bytes_per_sec = bytes_per_sec.max(0.0);
    }

    /// Changes the record rate at `now`, like [`Self::set_bytes_per_sec`].
    pub fn set_records_per_sec(&mut self, now: Duration, records_per_sec: f64) {
        self.refill(now);
        self.config.records_per_sec = records_per_sec.max(0.0);
    }

    /// Changes the byte depth at `now`, keeping the credit earned so far up
    /// to the new depth: a depth that follows a changing rate must not hand
    /// out a fresh bucketful each time it changes.
    pub fn set_burst_bytes(&mut self, now: Duration, burst_bytes: f64) {
        self.refill(now);
        self.config.burst_bytes = burst_bytes.max(0.0);
        self.byte_tokens = self.byte_tokens.min(self.config.burst_bytes);
    }

    fn refill(&mut self, now: Duration) {
        self.refill_with(now, 0.0);
    }

    /// Refills to `now` and adds `extra` byte tokens (what a more urgent
    /// class's full bucket spilled, [`ClassBuckets`]); returns the byte
    /// tokens that did not fit under the depth.
    fn refill_with(&mut self, now: Duration, extra: f64) -> f64 {
        let dt = now.saturating_sub(self.last).as_secs_f64();
        self.last = self.last.max(now);
        let mut bytes = self.byte_tokens + extra;
        if dt > 0.0 {
            bytes += dt * self.config.bytes_per_sec;
            self.record_tokens = (self.record_tokens + dt * self.config.records_per_sec)
                .min(self.config.burst_records);
        }
        self.byte_tokens = bytes.min(self.config.burst_bytes);
        if bytes > self.config.burst_bytes {
            bytes - self.config.burst_bytes
        } else {
            0.0
        }
    }

    /// Whether the byte bucket is at its depth (what it earns now spills).
    fn full(&self) -> bool {
        self.byte_tokens >= self.config.burst_bytes
    }

    /// Takes tokens for `records` records of `bytes` bytes in total at `now`,
    /// or says how long to wait.
    pub fn try_take(&mut self, now: Duration, bytes: usize, records: usize) -> Take {
        self.refill(now);
        let (b, r) = (bytes as f64, records as f64);
        let bytes_ok = b <= self.byte_tokens
            || (self.byte_tokens >= self.config.burst_bytes && self.config.bytes_per_sec > 0.0);
        let records_ok = r <= self.record_tokens
            || (self.record_tokens >= self.config.burst_records
                && self.config.records_per_sec > 0.0);
        if bytes_ok && records_ok {
            if self.config.bytes_per_sec.is_finite() {
                self.byte_tokens -= b;
            }
            if self.config.records_per_sec.is_finite() {
                self.record_tokens -= r;
            }
            return Take::Granted;
        }
        let wait_for = |tokens: f64, need: f64, burst: f64, rate: f64| -> f64 {
            // Until the need is covered, or the bucket is full (debt rule).
            if tokens >= need {
                0.0
            } else if rate <= 0.0 {
                f64::INFINITY
            } else {
                (need.min(burst) - tokens).max(0.0) / rate
            }
        };
        let wait = wait_for(
            self.byte_tokens,
            b,
            self.config.burst_bytes,
            self.config.bytes_per_sec,
        )
        .max(wait_for(
            self.record_tokens,
            r,
            self.config.burst_records,
            self.config.records_per_sec,
        ));
        Take::Wait(secs(wait))
    }

    /// Byte tokens available at `now` (negative while in debt).
    pub fn available_bytes(&mut self, now: Duration) -> f64 {
        self.refill(now);
        self.byte_tokens
    }
}

/// One byte-rate [`TokenBucket`] per class; [`Self::apply`] installs an
/// allocation and keeps the sum of rates within the outbound capacity.
///
/// **Spill.** What a class's bucket earns while it is full is not lost: it
/// flows into the next less urgent class's bucket (and on down, while
/// those are full too). BWAllocator gives an urgent class the rate Eq. 22
/// says its bound needs, and the leftover of the capacity too (Algorithm 2
/// line 11), once per window; a class that sends less than that leaves its
/// bucket full, and without spill the difference was simply unsent while
/// the tolerant class had a backlog: 5-7 % of `C_out` in the cluster lab
/// at 720 B and 1 KiB (`ls` allotted 48 kB/s and sending 22). The urgent
/// class keeps a full bucket, so its bursts go at once as before; the
/// sum of what every class sends stays within the sum of the allocated
/// rates, so `C_out` holds.
#[derive(Debug, Clone)]
pub struct ClassBuckets {
    buckets: Vec<TokenBucket>,
}

impl ClassBuckets {
    /// `classes` buckets with these byte rates and one burst depth.
    pub fn new(rates: &[f64], burst_bytes: f64, now: Duration) -> Self {
        ClassBuckets {
            buckets: rates
                .iter()
                .map(|&r| TokenBucket::new(BucketConfig::bytes(r.max(0.0), burst_bytes), now))
                .collect(),
        }
    }

    /// Installs per-class byte rates at `now`. If they add up to more than
    /// `capacity` (C_out, JANUS Eq. 3's constraint) they are scaled down
    /// proportionally so the constraint holds whatever the caller passed.
    pub fn apply(&mut self, now: Duration, rates: &[f64], capacity: f64) {
        self.refill(now);
        let sum: f64 = rates.iter().map(|r| r.max(0.0)).sum();
        let scale = if sum > capacity && sum > 0.0 {
            capacity.max(0.0) / sum
        } else {
            1.0
        };
        for (bucket, rate) in self.buckets.iter_mut().zip(rates) {
            bucket.set_bytes_per_sec(now, rate.max(0.0) * scale);
        }
    }

    /// Changes every bucket's depth at `now`, keeping the credit each has
    /// up to the new depth.
    pub fn set_burst_bytes(&mut self, now: Duration, burst_bytes: f64) {
        self.refill(now);
        for bucket in &mut self.buckets {
            bucket.set_burst_bytes(now, burst_bytes);
        }
    }

    /// Refills every bucket to `now`, most urgent first, each full one
    /// spilling into the next.
    fn refill(&mut self, now: Duration) {
        let mut spill = 0.0;
        for bucket in &mut self.buckets {
            spill = bucket.refill_with(now, spill);
        }
    }

    /// Takes `bytes` from class `index`'s own bucket at `now`, or says how
    /// long until it can: at its own rate plus what the full buckets
    /// directly above it spill.
    pub fn try_take(&mut self, index: usize, now: Duration, bytes: usize) -> Take {
        self.refill(now);
        let take = self.buckets[index].try_take(now, bytes, 1);
        let Take::Wait(own) = take else {
            return take;
        };
        let mut inflow = self.buckets[index].config.bytes_per_sec;
        for above in self.buckets[..index].iter().rev() {
            if !above.full() {
                break;
            }
            inflow += above.config.bytes_per_sec;
        }
        let b = &self.buckets[index];
        let need = (bytes as f64).min(b.config.burst_bytes) - b.byte_tokens;
        if inflow > b.config.bytes_per_sec && need > 0.0 {
            // The record limit (none for class buckets) still counts.
            Take::Wait(own.min(secs(need / inflow)))
        } else {
            take
        }
    }

    /// Byte tokens class `index` has at `now` (negative while in debt).
    pub fn available_bytes(&mut self, index: usize, now: Duration) -> f64 {
        self.refill(now);
        self.buckets[index].byte_tokens
    }

    /// Current byte rates, most urgent class first.
    pub fn rates(&self) -> Vec<f64> {
        self.buckets
            .iter()
            .map(|b| b.config.bytes_per_sec)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn burst_then_rate() {
        let mut b = TokenBucket::new(BucketConfig::bytes(1000.0, 500.0), Duration::ZERO);
        assert_eq!(b.try_take(Duration::ZERO, 300, 1), Take::Granted);
        assert_eq!(b.try_take(Duration::ZERO, 200, 1), Take::Granted);
        // Empty: 100 bytes at 1000 B/s need 100 ms.
        assert_eq!(b.try_take(Duration::ZERO, 100, 1), Take::Wait(100 * MS));
        assert_eq!(b.try_take(100 * MS, 100, 1), Take::Granted);
    }

    #[test]
    fn record_rate_limits_independently() {
        let cfg = BucketConfig {
            bytes_per_sec: f64::INFINITY,
            records_per_sec: 10.0,
            burst_bytes: f64::INFINITY,
            burst_records: 1.0,
        };
        let mut b = TokenBucket::new(cfg, Duration::ZERO);
        assert_eq!(b.try_take(Duration::ZERO, 1 << 20, 1), Take::Granted);
        assert_eq!(b.try_take(Duration::ZERO, 1, 1), Take::Wait(100 * MS));
    }

    #[test]
    fn oversized_take_from_a_full_bucket_goes_into_debt() {
        let mut b = TokenBucket::new(BucketConfig::bytes(1000.0, 100.0), Duration::ZERO);
        assert_eq!(b.try_take(Duration::ZERO, 400, 1), Take::Granted);
        assert_eq!(b.available_bytes(Duration::ZERO), -300.0);
        // Repaying 300 of debt and refilling the full 100 burst takes 400 ms.
        assert_eq!(b.try_take(Duration::ZERO, 400, 1), Take::Wait(400 * MS));
        assert_eq!(b.try_take(400 * MS, 400, 1), Take::Granted);
    }

    #[test]
    fn zero_rate_waits_forever() {
        let mut b = TokenBucket::new(BucketConfig::bytes(0.0, 0.0), Duration::ZERO);
        assert_eq!(b.try_take(Duration::ZERO, 1, 1), Take::Wait(Duration::MAX));
    }

    #[test]
    fn rate_change_credits_the_old_rate_first() {
        let mut b = TokenBucket::new(BucketConfig::bytes(1000.0, 1000.0), Duration::ZERO);
        assert_eq!(b.try_take(Duration::ZERO, 1000, 1), Take::Granted);
        b.set_bytes_per_sec(500 * MS, 0.0);
        assert_eq!(b.available_bytes(2000 * MS), 500.0);
    }

    #[test]
    fn a_full_bucket_spills_into_the_next_less_urgent_one() {
        let mut b = ClassBuckets::new(&[100.0, 200.0, 300.0], 100.0, Duration::ZERO);
        // Class 2 spends its burst; classes 0 and 1 stay full.
        assert_eq!(b.try_take(2, Duration::ZERO, 100), Take::Granted);
        assert_eq!(b.available_bytes(2, Duration::ZERO), 0.0);
        // Until it can take 60 bytes: its own 300 B/s plus the 100 + 200
        // the full buckets above it spill.
        assert_eq!(
            b.try_take(2, Duration::ZERO, 60),
            Take::Wait(Duration::from_millis(100))
        );
        // 100 ms later: 30 of its own, 10 + 20 spilled.
        assert_eq!(b.available_bytes(2, 100 * MS), 60.0);
        // A class that is not full spills nothing: class 1 spends its
        // burst, and class 2 gets only its own and class 0's... which
        // stops at class 1 (it refills first).
        assert_eq!(b.try_take(1, 100 * MS, 100), Take::Granted);
        assert_eq!(b.try_take(2, 100 * MS, 60), Take::Granted);
        assert_eq!(b.available_bytes(1, 200 * MS), 30.0);
        assert_eq!(b.available_bytes(2, 200 * MS), 30.0);
        // Never upward: class 0 does not gain from class 2's rate.
        assert_eq!(b.try_take(0, 200 * MS, 100), Take::Granted);
        assert_eq!(b.available_bytes(0, 300 * MS), 10.0);
    }

    #[test]
    fn burst_change_keeps_credit_up_to_the_new_depth() {
        let mut b = TokenBucket::new(BucketConfig::bytes(1000.0, 1000.0), Duration::ZERO);
        b.set_burst_bytes(Duration::ZERO, 5000.0);
        assert_eq!(
            b.available_bytes(Duration::ZERO),
            1000.0,
            "no fresh bucketful"
        );
        assert_eq!(b.available_bytes(10_000 * MS), 5000.0);
        b.set_burst_bytes(10_000 * MS, 200.0);
        assert_eq!(b.available_bytes(10_000 * MS), 200.0);
    }

    #[test]
    fn class_buckets_never_exceed_capacity() {
        let mut cb = ClassBuckets::new(&[0.0; 3], 1000.0, Duration::ZERO);
        cb.apply(Duration::ZERO, &[600.0, 600.0, 300.0], 1000.0);
        let sum: f64 = cb.rates().iter().sum();
        assert!((sum - 1000.0).abs() < 1e-9);
        cb.apply(Duration::ZERO, &[100.0, 200.0, 300.0], 1000.0);
        assert_eq!(cb.rates(), vec![100.0, 200.0, 300.0]);
    }

    proptest! {
        /// Over any schedule of takes, what is granted never exceeds
        /// burst + rate * elapsed (plus one record's debt).
        #[test]
        fn long_run_rate_holds(
            rate in 1.0f64..1e6,
            burst in 1.0f64..1e5,
            takes in proptest::collection::vec((0u64..50, 1usize..20_000), 1..200),
        ) {
            let mut b = TokenBucket::new(BucketConfig::bytes(rate, burst), Duration::ZERO);
            let mut now = Duration::ZERO;
            let mut granted = 0.0;
            let mut largest = 0.0f64;
            for (dt_ms, size) in takes {
                now += Duration::from_millis(dt_ms);
                if b.try_take(now, size, 1) == Take::Granted {
                    granted += size as f64;
                    largest = largest.max(size as f64);
                }
            }
            let bound = burst + rate * now.as_secs_f64() + largest;
            prop_assert!(granted <= bound + 1e-6, "granted {granted} > bound {bound}");
        }
    }
}
