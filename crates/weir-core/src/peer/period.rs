//! Heartbeat periods aligned on the Unix clock, so every node matches on the
//! same period's tuples.

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
