//! The wall clock, read in one place: records carry wall-clock stamps
//! (microseconds since the Unix epoch) because they cross machines, while
//! every decision in `weir-core` runs on a monotonic `now` its driver keeps.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Time since the Unix epoch now (zero if the clock is set before 1970).
pub fn since_epoch() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
}

/// Microseconds since the Unix epoch now (ingress stamps, batch creation).
pub fn unix_micros() -> u64 {
    since_epoch().as_micros() as u64
}

/// Seconds since the Unix epoch now (AMQP's `timestamp` property).
pub fn unix_secs() -> u64 {
    since_epoch().as_secs()
}
