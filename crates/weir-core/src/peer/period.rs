//! Heartbeat periods aligned on the Unix clock, so every node matches on the
//! same period's tuples, and where in its period each heartbeat leaves.
//!
//! Rounds run half a period in, once every peer's state of the period has
//! arrived. Heartbeats are spread over the first part of the period
//! ([`heartbeat_offset`]): at the period's start, every node of a large
//! cluster would send to every peer at once, a burst of `n (n - 1)` calls
//! that queue behind each other on every uplink and node.

use std::time::Duration;

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

/// The largest share of a period heartbeats may be spread over: they must
/// arrive before the round, half a period in, with room for the transfer.
pub const MAX_HEARTBEAT_JITTER: f64 = 0.45;

/// splitmix64's finaliser: a fixed, well-spread hash of one word.
pub(super) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// How far into period `period` (of `len`) node `from` sends its heartbeat
/// to `to`: below `jitter` (a share of the period, at most
/// [`MAX_HEARTBEAT_JITTER`]) of it, spread evenly over pairs and periods
/// and the same for the same three numbers, on any node and any run (no
/// state, no randomness to seed).
pub fn heartbeat_offset(from: u64, to: u64, period: u64, len: Duration, jitter: f64) -> Duration {
    let share = if jitter.is_finite() {
        jitter.clamp(0.0, MAX_HEARTBEAT_JITTER)
    } else {
        0.0
    };
    let h = mix(from ^ mix(to ^ mix(period)));
    // The top 53 bits as a fraction in [0, 1).
    let unit = (h >> 11) as f64 / (1u64 << 53) as f64;
    len.mul_f64(share * unit)
}

/// From `unix_us`, the wait until node `from`'s next heartbeat to `to`: at
/// its [`heartbeat_offset`] into the current period if that is still
/// ahead, else into the next one (so at most one heartbeat per period).
pub fn until_heartbeat(unix_us: u64, len: Duration, from: u64, to: u64, jitter: f64) -> Duration {
    let len_us = len.as_micros().max(1) as u64;
    let current = period_of(unix_us, len);
    let at = |period: u64| {
        period * len_us + heartbeat_offset(from, to, period, len, jitter).as_micros() as u64
    };
    let mut next = at(current);
    if next <= unix_us {
        next = at(current + 1);
    }
    Duration::from_micros(next - unix_us)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEN: Duration = Duration::from_millis(100);

    #[test]
    fn heartbeats_spread_within_the_jitter_and_stay_put() {
        let mut offsets = Vec::new();
        for from in 1..=16u64 {
            for to in 1..=16u64 {
                let o = heartbeat_offset(from, to, 7, LEN, 0.3);
                assert!(o < Duration::from_millis(30), "{o:?}");
                assert_eq!(o, heartbeat_offset(from, to, 7, LEN, 0.3));
                offsets.push(o.as_micros());
            }
        }
        // 256 pairs over 30 ms: every 3 ms slice gets some, none most.
        let mut slices = [0usize; 10];
        for o in &offsets {
            slices[(*o / 3000) as usize] += 1;
        }
        assert!(slices.iter().all(|&n| (10..=45).contains(&n)), "{slices:?}");
        // Another period, other offsets; no jitter, the period's start.
        assert_ne!(
            heartbeat_offset(1, 2, 7, LEN, 0.3),
            heartbeat_offset(1, 2, 8, LEN, 0.3)
        );
        assert_eq!(heartbeat_offset(1, 2, 7, LEN, 0.0), Duration::ZERO);
        // Clamped: never past the round at half a period.
        assert!(heartbeat_offset(3, 4, 9, LEN, 5.0) < LEN.mul_f64(MAX_HEARTBEAT_JITTER));
        assert_eq!(heartbeat_offset(3, 4, 9, LEN, f64::NAN), Duration::ZERO);
    }

    #[test]
    fn one_heartbeat_per_period_at_its_offset() {
        let start = 1_700_000_000_000_000u64; // a period boundary (100 ms)
        let mut now = start;
        let mut sent = Vec::new();
        for _ in 0..5 {
            now += until_heartbeat(now, LEN, 1, 2, 0.3).as_micros() as u64;
            sent.push(now);
        }
        for (i, at) in sent.iter().enumerate() {
            let period = period_of(*at, LEN);
            assert_eq!(period, period_of(start, LEN) + i as u64, "one per period");
            let offset = heartbeat_offset(1, 2, period, LEN, 0.3).as_micros() as u64;
            assert_eq!(*at, period * 100_000 + offset);
        }
        // Without jitter it is the period's start, as until_period gives.
        assert_eq!(
            until_heartbeat(start + 1, LEN, 1, 2, 0.0),
            until_period(start + 1, LEN, Duration::ZERO)
        );
    }
}
