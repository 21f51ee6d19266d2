//! The payload: a 16-byte stamp (send time, load-wide sequence number)
//! and the filler after it, random or repetitive; and the clock the stamps
//! use.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{BufMut, Bytes, BytesMut};
use tokio::time::Instant;

/// Bytes at the head of every payload: send time and sequence number.
pub const STAMP: usize = 16;

/// Microseconds since the Unix epoch now.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_micros() as u64
}

/// The Unix time of a monotonic instant (close enough for windowing).
pub fn unix_us_at(at: Instant) -> u64 {
    let now = Instant::now();
    let us = now_us();
    if at <= now {
        us - now.duration_since(at).as_micros() as u64
    } else {
        us + at.duration_since(now).as_micros() as u64
    }
}

/// A payload of `size` bytes: send time, sequence number, filler.
pub fn stamped(size: usize, seq: u64) -> Bytes {
    let mut p = BytesMut::with_capacity(size);
    p.put_u64_le(now_us());
    p.put_u64_le(seq);
    let fill = size.saturating_sub(STAMP);
    match FILLER.get() {
        Some(pool) if pool.len() > fill => {
            // A different window of the pool per record, so that batches
            // do not repeat themselves either.
            let at = (seq as usize).wrapping_mul(251) % (pool.len() - fill);
            p.extend_from_slice(&pool[at..at + fill]);
        }
        _ => p.resize(size, b'.'),
    }
    p.freeze()
}

/// Random bytes that payloads are cut from (`--payload random`); unset
/// means repetitive filler.
static FILLER: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();

/// Size of the random pool: far larger than any batch's payload.
const FILLER_POOL: usize = 1 << 20;

/// The payload filler in use, for reports.
pub fn payload_kind() -> &'static str {
    if FILLER.get().is_some() {
        "random"
    } else {
        "repetitive"
    }
}

/// Fills [`FILLER`] from a fixed-seed xorshift, so runs are comparable.
pub fn init_random_filler() {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let pool = (0..FILLER_POOL / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect();
    let _ = FILLER.set(pool);
}

pub fn read_stamp(payload: &[u8]) -> Option<(u64, u64)> {
    let send = u64::from_le_bytes(payload.get(..8)?.try_into().ok()?);
    let seq = u64::from_le_bytes(payload.get(8..16)?.try_into().ok()?);
    Some((send, seq))
}
