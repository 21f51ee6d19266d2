//! The payload: a 16-byte stamp (send time, load-wide sequence number)
//! and the filler after it, random or repetitive; and the clock the stamps
//! use.

use std::sync::atomic::{AtomicBool, Ordering};
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
    if RANDOM.load(Ordering::Relaxed) {
        // Fresh bytes for every record, from a generator seeded by its
        // sequence number: nothing repeats within or across records, so a
        // compressor finds nothing (slices of one shared pool overlapped
        // above 267 B and compressed about 2:1 at 1 KiB), and runs stay
        // comparable.
        let mut x = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
        let mut left = fill;
        while left > 0 {
            // splitmix64
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            let n = left.min(8);
            p.put_slice(&z.to_le_bytes()[..n]);
            left -= n;
        }
    } else {
        p.resize(size, b'.');
    }
    p.freeze()
}

/// Whether fillers are random (`--payload random`) or repetitive.
static RANDOM: AtomicBool = AtomicBool::new(false);

/// The payload filler in use, for reports.
pub fn payload_kind() -> &'static str {
    if RANDOM.load(Ordering::Relaxed) {
        "random"
    } else {
        "repetitive"
    }
}

/// Makes every payload's filler random (incompressible).
pub fn init_random_filler() {
    RANDOM.store(true, Ordering::Relaxed);
}

pub fn read_stamp(payload: &[u8]) -> Option<(u64, u64)> {
    let send = u64::from_le_bytes(payload.get(..8)?.try_into().ok()?);
    let seq = u64::from_le_bytes(payload.get(8..16)?.try_into().ok()?);
    Some((send, seq))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_payloads_do_not_compress() {
        // Only the 16-byte stamps (times and sequence numbers) compress.
        init_random_filler();
        let mut all = Vec::new();
        for seq in 0..256 {
            all.extend_from_slice(&stamped(1024, seq));
        }
        let packed = zstd::bulk::compress(&all, 19).unwrap();
        assert!(
            packed.len() as f64 > all.len() as f64 * 0.98,
            "{} of {} bytes",
            packed.len(),
            all.len()
        );
    }
}
