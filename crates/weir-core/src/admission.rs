//! What may be committed to the link ahead of an urgent record.
//!
//! A batch handed to the egress is no longer preemptible: once it is
//! published (or queued on the emulated link, or sitting in a socket's send
//! buffer on a shaped uplink) a more urgent record that arrives next waits
//! until the link has carried it. Two rules keep that wait within the
//! tightest bound in play:
//!
//! - **Admission**: the egress takes another batch only while what it has
//!   not yet had confirmed would clear the link within the *horizon*
//!   ([`admits`]): `k` transactions of `B` bytes take about
//!   `k T_sc + B / Th_up` (the link estimate's Eq. 1, with `T_sc` as the
//!   estimator measures it: the part of a transaction that does not overlap
//!   the one before).
//! - **Batch cap**: no single batch may take longer than the horizon on the
//!   link ([`batch_cap`]), however late the scheduler woke and however many
//!   tokens it found: a late wake-up does not turn into a long
//!   non-preemptible transfer.
//!
//! The horizon is half the tightest bound among the classes that have
//! traffic ([`horizon`]): half for what is already committed, half for the
//! urgent record's own wait and transaction. With the uplink saturated by
//! less urgent classes, a `ls` record (100 ms) then waits at most about
//! 50 ms behind them, where a window of 8 batches of 64 KiB on a 4 Mbit/s
//! uplink made it wait a second.
//!
//! The price is throughput on links whose per-transaction time is large
//! against the bound: batches are smaller and fewer are in flight. Three
//! limits keep that price bounded:
//! - classes without traffic do not count, so a node carrying only `lt`
//!   (1 s) batches as large as before;
//! - a batch is never capped below one transaction's worth of bytes
//!   (`T_sc Th_up`), so the link spends at least half its time carrying
//!   bytes;
//! - where one transaction's fixed time alone passes the horizon (a 50 ms
//!   4G round trip against a 100 ms class: [`keepable`]) no rule can keep
//!   the bound, and admission stands aside for the window.

use std::time::Duration;

use crate::link_estimate::LinkEstimate;

/// The share of the tightest bound that what is already committed to the
/// link may take to clear.
pub const HORIZON_SHARE: f64 = 0.5;

/// No batch cap goes below this: on a link too slow for the horizon, a
/// batch still carries a few records (and the bound cannot be met anyway).
pub const MIN_BATCH_BYTES: usize = 4096;

/// The horizon for classes whose tightest bound is `tightest`.
pub fn horizon(tightest: Duration) -> Duration {
    tightest.mul_f64(HORIZON_SHARE)
}

/// How long `batches` transactions of `bytes` bytes in all take to clear
/// `link`.
pub fn drain_time(batches: usize, bytes: u64, link: &LinkEstimate) -> Duration {
    let serial = if link.bytes_per_sec > 0.0 && link.bytes_per_sec.is_finite() {
        Duration::from_secs_f64(bytes as f64 / link.bytes_per_sec)
    } else {
        Duration::ZERO
    };
    link.per_transaction
        .saturating_mul(u32::try_from(batches).unwrap_or(u32::MAX))
        .saturating_add(serial)
}

/// Whether the horizon can be kept on `link` at all: one transaction's
/// fixed time is within it. Where it is not (a 50 ms 4G round trip
/// against a 100 ms class), no admission or cap makes the bound, and
/// holding batches back would only cost throughput; the rules stand
/// aside.
pub fn keepable(link: &LinkEstimate, horizon: Duration) -> bool {
    link.per_transaction < horizon
}

/// Whether one more batch may be committed to the link while `batches`
/// of `bytes` bytes are unconfirmed: always when nothing is or when the
/// horizon cannot be kept ([`keepable`]), else only while those clear
/// within `horizon`.
pub fn admits(batches: usize, bytes: u64, link: &LinkEstimate, horizon: Duration) -> bool {
    batches == 0 || !keepable(link, horizon) || drain_time(batches, bytes, link) < horizon
}

/// The largest batch whose own transaction fits `horizon` on `link`, but
/// never less than one transaction's worth of bytes (`T_sc Th_up`, so the
/// link stays at least half busy carrying bytes rather than waiting out
/// fixed costs) nor [`MIN_BATCH_BYTES`].
pub fn batch_cap(link: &LinkEstimate, horizon: Duration) -> usize {
    let room = horizon.saturating_sub(link.per_transaction).as_secs_f64();
    let floor = link.per_transaction.as_secs_f64();
    let bytes = room.max(floor) * link.bytes_per_sec;
    if bytes.is_finite() {
        (bytes as usize).max(MIN_BATCH_BYTES)
    } else {
        usize::MAX
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);

    fn link(bytes_per_sec: f64, per_transaction: Duration) -> LinkEstimate {
        LinkEstimate {
            bytes_per_sec,
            per_transaction,
        }
    }

    #[test]
    fn a_4_mbit_link_with_a_100ms_class_takes_batches_of_20_kb() {
        let l = link(500_000.0, MS * 10);
        let h = horizon(MS * 100);
        assert_eq!(h, MS * 50);
        assert_eq!(batch_cap(&l, h), 20_000);
        assert!(admits(0, 0, &l, h), "an idle link always takes one");
        assert!(admits(1, 10_000, &l, h), "30 ms to clear");
        assert!(!admits(1, 20_000, &l, h), "a full batch takes the horizon");
        assert!(!admits(2, 20_000, &l, h), "two transactions take 60 ms");
    }

    #[test]
    fn a_slow_link_still_carries_a_few_records_per_batch() {
        let l = link(10_000.0, MS * 5);
        assert_eq!(batch_cap(&l, horizon(MS * 10)), MIN_BATCH_BYTES);
    }

    #[test]
    fn where_one_transaction_passes_the_horizon_the_rules_stand_aside() {
        // 4G as JANUS Table III has it: 50 ms, 18 Mbit/s; `ls` 100 ms.
        let l = link(2_250_000.0, MS * 50);
        let h = horizon(MS * 100);
        assert!(!keepable(&l, h));
        assert!(admits(7, 7 << 16, &l, h), "the window decides");
        assert_eq!(batch_cap(&l, h), 112_500, "one transaction's bytes");
    }

    proptest! {
        /// Whatever the link, batches admitted one at a time at the cap
        /// never leave more than the horizon plus one batch's transaction
        /// committed ahead of the next record.
        #[test]
        fn what_is_committed_clears_within_the_horizon_and_one_batch(
            bw in 10_000.0f64..1e9,
            tsc_ms in 0u64..200,
            bound_ms in 10u64..5_000,
        ) {
            let l = link(bw, MS * tsc_ms as u32);
            let h = horizon(MS * bound_ms as u32);
            let cap = batch_cap(&l, h);
            let mut batches = 0;
            let mut bytes = 0u64;
            while admits(batches, bytes, &l, h) && batches < 10_000 {
                batches += 1;
                bytes += cap as u64;
            }
            let one = drain_time(1, cap as u64, &l);
            if keepable(&l, h) {
                prop_assert!(drain_time(batches, bytes, &l) <= h + one);
            }
            // A batch fits the horizon, or is no more than one
            // transaction's worth (or the floor).
            let fits = one <= h + MS;
            let bdp = cap as f64 <= (l.per_transaction.as_secs_f64() * bw).max(MIN_BATCH_BYTES as f64) + 1.0;
            prop_assert!(fits || bdp);
        }
    }
}
