//! When the writer starts a group commit: at once, or after waiting a
//! little for more appends.
//!
//! A sync writes whole pages: the page a group starts in was already
//! written (partly) by the previous group and goes to the device again.
//! That costs about half a page per group, which is a fifth of the bytes
//! when groups are a dozen kilobytes, the size they have at 100,000
//! records/s when each sync takes half a millisecond. Waiting up to
//! `commit_delay` for more appends (PostgreSQL's `commit_delay`) makes
//! groups larger and syncs fewer, at the price of that much acknowledgement
//! latency. The wait is taken only when, at the recent arrival rate, it
//! would gather at least [`WORTH_WAITING_BYTES`]: at low rates every group
//! costs a page whatever the wait, and waiting would only add latency.

use std::time::Duration;

/// A group this large is committed at once.
pub const GROUP_TARGET_BYTES: u64 = 64 << 10;
/// The wait is taken only if it is expected to gather this much (two
/// pages).
pub const WORTH_WAITING_BYTES: f64 = 8192.0;
/// Weight of the newest interval in the arrival-rate estimate.
const RATE_WEIGHT: f64 = 0.2;

/// The writer's group-commit timing.
#[derive(Debug, Clone)]
pub struct GroupCommit {
    delay: Duration,
    /// Bytes per group, smoothed.
    bytes: f64,
    /// Seconds between commits, smoothed.
    interval: f64,
    /// When the previous group was committed.
    last: Option<Duration>,
}

impl GroupCommit {
    /// Waits at most `delay` (zero: never).
    pub fn new(delay: Duration) -> Self {
        GroupCommit {
            delay,
            bytes: 0.0,
            interval: 0.0,
            last: None,
        }
    }

    /// The arrival rate as estimated (bytes per second).
    pub fn rate(&self) -> f64 {
        if self.interval > 0.0 {
            self.bytes / self.interval
        } else {
            0.0
        }
    }

    /// With `pending` bytes gathered, the first of them having arrived at
    /// `first` and the time now `now` (both since any fixed epoch): how much
    /// longer to wait for more before committing (`None`: commit now).
    pub fn wait(&self, pending: u64, first: Duration, now: Duration) -> Option<Duration> {
        if pending >= GROUP_TARGET_BYTES || self.delay.is_zero() {
            return None;
        }
        if self.rate() * self.delay.as_secs_f64() < WORTH_WAITING_BYTES {
            return None;
        }
        let left = (first + self.delay).saturating_sub(now);
        (!left.is_zero()).then_some(left)
    }

    /// A group of `bytes` was committed at `now`: updates the rate.
    pub fn committed(&mut self, bytes: u64, now: Duration) {
        // Bytes and intervals are smoothed apart (their ratio is the rate):
        // a mean of per-group ratios would be skewed by short intervals.
        if let Some(last) = self.last {
            let dt = now.saturating_sub(last).as_secs_f64();
            if self.interval == 0.0 {
                (self.bytes, self.interval) = (bytes as f64, dt);
            } else {
                self.bytes += RATE_WEIGHT * (bytes as f64 - self.bytes);
                self.interval += RATE_WEIGHT * (dt - self.interval);
            }
        }
        self.last = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: f64) -> Duration {
        Duration::from_secs_f64(v / 1000.0)
    }

    /// Drives the rule with appends of `frame` bytes at `per_s` and a sync
    /// that takes `sync`; returns the mean group size, the longest time the
    /// rule held a group back, and the longest time from a group's first
    /// append to its commit.
    fn simulate(
        delay: Duration,
        per_s: f64,
        frame: u64,
        sync: Duration,
    ) -> (f64, Duration, Duration) {
        let mut g = GroupCommit::new(delay);
        let gap = Duration::from_secs_f64(1.0 / per_s);
        let mut now = Duration::ZERO;
        let mut next_arrival = Duration::ZERO;
        let (mut groups, mut bytes) = (0u64, 0u64);
        let (mut held, mut worst) = (Duration::ZERO, Duration::ZERO);
        while now < Duration::from_secs(2) {
            // Idle until an append arrives.
            now = now.max(next_arrival);
            let first = next_arrival.min(now);
            let ready = now;
            let mut pending = 0;
            loop {
                while next_arrival <= now {
                    pending += frame;
                    next_arrival += gap;
                }
                match g.wait(pending, first, now) {
                    // Wake at the next append or when the wait is over.
                    Some(w) => now = (now + w).min(next_arrival),
                    None => break,
                }
            }
            held = held.max(now - ready);
            worst = worst.max(now - first);
            now += sync;
            g.committed(pending, now);
            groups += 1;
            bytes += pending;
        }
        (bytes as f64 / groups as f64, held, worst)
    }

    #[test]
    fn at_high_rates_groups_grow_and_the_wait_is_bounded_by_the_delay() {
        let sync = ms(0.45);
        let (without, held, _) = simulate(Duration::ZERO, 100_000.0, 276, sync);
        assert_eq!(held, Duration::ZERO);
        let (with, held, worst) = simulate(ms(1.0), 100_000.0, 276, sync);
        assert!(with > 2.0 * without, "groups {without:.0} -> {with:.0} B");
        assert!(held > ms(0.3), "held {held:?}");
        assert!(worst <= ms(1.0) + ms(0.02), "waited {worst:?}");
    }

    #[test]
    fn at_low_rates_nothing_waits() {
        let (_, held, _) = simulate(ms(1.0), 5_000.0, 276, ms(0.45));
        assert_eq!(held, Duration::ZERO);
        // A longer delay is worth it at the same rate, and is taken.
        let (group, held, worst) = simulate(ms(10.0), 5_000.0, 276, ms(0.45));
        assert!(held > ms(5.0) && group > 8192.0, "{group:.0} B, {held:?}");
        assert!(worst <= ms(10.0) + ms(0.2), "waited {worst:?}");
    }

    #[test]
    fn a_full_group_is_committed_at_once_and_zero_never_waits() {
        let mut g = GroupCommit::new(ms(5.0));
        g.committed(0, Duration::ZERO);
        g.committed(1 << 20, ms(10.0));
        assert!(g.rate() > 1e7);
        assert!(g.wait(100, ms(10.0), ms(10.5)).is_some());
        assert_eq!(g.wait(GROUP_TARGET_BYTES, ms(10.0), ms(10.5)), None);
        assert_eq!(g.wait(100, ms(10.0), ms(15.0)), None);
        let mut z = GroupCommit::new(Duration::ZERO);
        z.committed(0, Duration::ZERO);
        z.committed(1 << 20, ms(10.0));
        assert_eq!(z.wait(100, ms(10.0), ms(10.0)), None);
    }
}
