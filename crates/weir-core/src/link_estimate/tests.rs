use super::*;
use proptest::prelude::*;

/// An estimate of `bytes_per_sec` with the default 50 ms `T_sc`.
fn with_50ms_t_sc(bytes_per_sec: f64) -> LinkEstimate {
    LinkEstimate {
        bytes_per_sec,
        per_transaction: Duration::from_millis(50),
    }
}

/// Deterministic pseudo-random numbers (splitmix64) for synthetic noise.
pub(crate) struct Mix(pub u64);

impl Mix {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..hi`.
    pub(crate) fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (self.next() >> 11) as f64 / (1u64 << 53) as f64 * (hi - lo)
    }
}

fn prior() -> LinkEstimate {
    LinkEstimate {
        bytes_per_sec: 1e6,
        per_transaction: Duration::from_millis(20),
    }
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * b.abs()
}

#[test]
fn paper_two_transfer_example() {
    // Section III.C: US(s) = 0.14 MB at 0.36 MB/s, US(l) = 1.24 MB at
    // 2.06 MB/s; the paper derives Th_up = 5.167 MB/s, T_sc = 0.362 s.
    let mb = 1e6;
    let t_small = Duration::from_secs_f64(0.14 / 0.36);
    let t_large = Duration::from_secs_f64(1.24 / 2.06);
    let est = two_transfer_probe((0.14 * mb) as u64, t_small, (1.24 * mb) as u64, t_large).unwrap();
    assert!(close(est.bytes_per_sec / mb, 5.167, 0.002), "{est:?}");
    assert!(
        close(est.per_transaction.as_secs_f64(), 0.362, 0.002),
        "{est:?}"
    );
    // Eq. 6 as printed: both equations hold with the solved values.
    let (th, tsc) = (est.bytes_per_sec / mb, est.per_transaction.as_secs_f64());
    assert!(close(th - 2.571 * th * tsc, 0.36, 0.01));
    assert!(close(th - 1.661 * th * tsc, 2.06, 0.01));
    // Order of the arguments does not matter.
    let swapped =
        two_transfer_probe((1.24 * mb) as u64, t_large, (0.14 * mb) as u64, t_small).unwrap();
    assert_eq!(est, swapped);
}

#[test]
fn probe_rejects_what_it_cannot_solve() {
    let t = Duration::from_millis(100);
    assert_eq!(
        two_transfer_probe(10, t, 10, t),
        Err(LinkEstimateError::SameSize(10, 10))
    );
    assert!(matches!(
        two_transfer_probe(10, t, 1000, t),
        Err(LinkEstimateError::NotSlower {
            smaller: 10,
            larger: 1000
        })
    ));
    // Noise that puts T_sc below zero reports zero.
    let est = two_transfer_probe(
        1000,
        Duration::from_millis(1),
        2000,
        Duration::from_millis(3),
    )
    .unwrap();
    assert_eq!(est.per_transaction, Duration::ZERO);
    assert!(close(est.bytes_per_sec, 500_000.0, 1e-9));
}

#[test]
fn eq3_effective_throughput() {
    // 5 MB/s, T_sc 0.39 s, 30.88 MB (accel.csv): 4.703 MB/s.
    let link = LinkEstimate {
        bytes_per_sec: 5e6,
        per_transaction: Duration::from_millis(390),
    };
    let th = link.effective_throughput(30.88e6);
    assert!(close(th, 5e6 / (1.0 + 5e6 * 0.39 / 30.88e6), 1e-12));
    assert!(close(th / 1e6, 4.703, 0.001));
    assert!(close(30.88e6 / th, link.transaction_secs(30.88e6), 1e-12));
    assert_eq!(link.effective_throughput(0.0), 0.0);
}

#[test]
fn starts_at_the_prior() {
    let est = LinkEstimator::new(prior()).unwrap();
    assert_eq!(est.estimate(), prior());
    assert_eq!(est.fit_kind(), FitKind::Prior);
    assert!(est.is_empty());
    assert!(matches!(
        LinkEstimator::new(LinkEstimate {
            bytes_per_sec: 0.0,
            per_transaction: Duration::ZERO
        }),
        Err(LinkEstimateError::BadBandwidth(_))
    ));
}

/// A 3 MB/s link with T_sc = 45 ms: transactions of 1 KB..1 MB with ±3%
/// timing noise, and every tenth transaction stalled by 0.2..1 s.
fn synthetic(est: &mut LinkEstimator, n: usize, outliers: bool, mix: &mut Mix) {
    for k in 0..n {
        let size = mix.range(1e3, 1e6);
        let mut t = (0.045 + size / 3e6) * mix.range(0.97, 1.03);
        if outliers && k % 10 == 3 {
            t += mix.range(0.2, 1.0);
        }
        est.observe(size as u64, Duration::from_secs_f64(t));
    }
}

#[test]
fn robust_fit_recovers_known_link_despite_outliers() {
    let mut est = LinkEstimator::new(prior()).unwrap();
    let mut mix = Mix(7);
    synthetic(&mut est, 200, true, &mut mix);
    let e = est.estimate();
    assert_eq!(est.fit_kind(), FitKind::Full);
    assert_eq!(est.len(), WINDOW);
    assert!(close(e.bytes_per_sec, 3e6, 0.05), "{e:?}");
    assert!(close(e.per_transaction.as_secs_f64(), 0.045, 0.1), "{e:?}");
}

#[test]
fn least_squares_would_not_have_survived_those_outliers() {
    // The same data through ordinary least squares, to show why the fit
    // is robust: the stalls drag the intercept far off.
    let mut est = LinkEstimator::new(prior()).unwrap();
    let mut mix = Mix(7);
    synthetic(&mut est, 200, true, &mut mix);
    let (xs, ys) = (est.window.xs(), est.window.ys());
    let n = xs.len() as f64;
    let (mx, my) = (xs.iter().sum::<f64>() / n, ys.iter().sum::<f64>() / n);
    let sxy: f64 = xs.iter().zip(ys).map(|(x, y)| (x - mx) * (y - my)).sum();
    let sxx: f64 = xs.iter().map(|x| (x - mx) * (x - mx)).sum();
    let intercept = my - sxy / sxx * mx;
    assert!(!close(intercept, 0.045, 0.5), "OLS intercept {intercept}");
}

#[test]
fn follows_a_link_that_changes() {
    let mut est = LinkEstimator::new(prior()).unwrap();
    let mut mix = Mix(3);
    synthetic(&mut est, 64, false, &mut mix);
    // The link drops to 1 MB/s with 80 ms fixed cost.
    for _ in 0..64 {
        let size = mix.range(1e3, 1e6);
        let t = 0.080 + size / 1e6;
        est.observe(size as u64, Duration::from_secs_f64(t));
    }
    let e = est.estimate();
    assert!(close(e.bytes_per_sec, 1e6, 0.01), "{e:?}");
    assert!(close(e.per_transaction.as_secs_f64(), 0.080, 0.01), "{e:?}");
}

#[test]
fn same_size_window_keeps_the_anchor_and_fits_bandwidth() {
    let mut est = LinkEstimator::new(prior()).unwrap();
    // 2 MB/s, T_sc 20 ms (= the prior), every transaction 100 kB.
    for k in 0..40 {
        let jitter = 1.0 + 0.01 * ((k % 5) as f64 - 2.0);
        est.observe(100_000, Duration::from_secs_f64((0.020 + 0.05) * jitter));
    }
    let e = est.estimate();
    assert_eq!(est.fit_kind(), FitKind::BandwidthOnly);
    assert_eq!(e.per_transaction, Duration::from_millis(20));
    assert!(close(e.bytes_per_sec, 2e6, 0.02), "{e:?}");
}

#[test]
fn bunched_confirms_over_close_sizes_do_not_make_a_line() {
    // A 500 kB/s, 10 ms link carrying batches of 8-12 kB, timed from
    // a broker that confirms in bunches: one transaction of a pair
    // looks free, the other twice as long.
    let mut est = LinkEstimator::new(LinkEstimate {
        bytes_per_sec: 500_000.0,
        per_transaction: Duration::from_millis(10),
    })
    .unwrap();
    let mut mix = Mix(5);
    for k in 0..64 {
        let bytes = mix.range(8_000.0, 12_000.0);
        let real = 0.010 + bytes / 500_000.0;
        let seen = match k % 2 {
            0 => mix.range(0.0005, 0.003),
            _ => 2.0 * real - mix.range(0.0, 0.004),
        };
        est.observe(bytes as u64, Duration::from_secs_f64(seen));
    }
    assert_ne!(est.fit_kind(), FitKind::Full, "{:?}", est.estimate());
}

#[test]
fn anchor_is_the_last_fitted_t_sc_not_the_prior() {
    let mut est = LinkEstimator::new(prior()).unwrap();
    let mut mix = Mix(11);
    synthetic(&mut est, 64, false, &mut mix);
    assert_eq!(est.fit_kind(), FitKind::Full);
    // Then a full window of identical transactions at the same link.
    for _ in 0..WINDOW {
        est.observe(500_000, Duration::from_secs_f64(0.045 + 500_000.0 / 3e6));
    }
    let e = est.estimate();
    assert_eq!(est.fit_kind(), FitKind::BandwidthOnly);
    assert!(close(e.per_transaction.as_secs_f64(), 0.045, 0.05), "{e:?}");
    assert!(close(e.bytes_per_sec, 3e6, 0.05), "{e:?}");
}

#[test]
fn transactions_faster_than_the_anchor_split_the_time() {
    // Prior T_sc 20 ms but every 1 kB transaction takes 10 ms.
    let mut est = LinkEstimator::new(prior()).unwrap();
    for _ in 0..10 {
        est.observe(1000, Duration::from_millis(10));
    }
    let e = est.estimate();
    assert_eq!(e.per_transaction, Duration::from_millis(5));
    assert!(close(e.bytes_per_sec, 1000.0 / 0.005, 1e-9), "{e:?}");
}

#[test]
fn empty_transactions_measure_t_sc() {
    let mut est = LinkEstimator::new(prior()).unwrap();
    est.observe(0, Duration::from_millis(30));
    est.observe(0, Duration::from_millis(34));
    est.observe(0, Duration::from_millis(32));
    let e = est.estimate();
    assert_eq!(e.per_transaction, Duration::from_millis(32));
    assert_eq!(e.bytes_per_sec, prior().bytes_per_sec);
    // A zero elapsed is ignored.
    est.observe(5, Duration::ZERO);
    assert_eq!(est.len(), 3);
}

#[test]
fn a_line_within_its_timing_noise_is_not_a_measurement() {
    // 4G's 2.25 MB/s, transactions of 2-12 kB (1-5 ms of transfer)
    // timed to the next millisecond plus up to a millisecond of
    // wake-up: the lab's lending nodes with an emulated link.
    let mut est = LinkEstimator::new(prior()).unwrap();
    let mut mix = Mix(7);
    let mut published = Vec::new();
    for _ in 0..400 {
        let size = mix.range(2e3, 12e3);
        let t = ((size / 2.25e6) * 1e3).ceil() / 1e3 + mix.range(0.0, 1e-3);
        est.observe(size as u64, Duration::from_secs_f64(t));
        if est.fit_kind() == FitKind::Full {
            published.push(est.estimate().bytes_per_sec);
        }
    }
    // Whatever was published is within a fifth of the truth (without
    // the test: 1.6-3.5 MB/s).
    assert!(
        published.iter().all(|bw| close(*bw, 2.25e6, 0.2)),
        "{:?}",
        published
            .iter()
            .map(|b| (b / 1e3) as u64)
            .collect::<Vec<_>>()
    );
    // The same noise over 10-400 kB (4-180 ms of transfer) measures.
    let mut est = LinkEstimator::new(prior()).unwrap();
    for _ in 0..200 {
        let size = mix.range(10e3, 400e3);
        let t = ((size / 2.25e6) * 1e3).ceil() / 1e3 + mix.range(0.0, 1e-3);
        est.observe(size as u64, Duration::from_secs_f64(t));
    }
    assert_eq!(est.fit_kind(), FitKind::Full);
    assert!(
        close(est.estimate().bytes_per_sec, 2.25e6, 0.02),
        "{:?}",
        est.estimate()
    );
}

#[test]
fn slope_error_is_zero_on_the_line_and_grows_with_noise() {
    let xs: Vec<f64> = (1..=20).map(|i| f64::from(i) * 1000.0).collect();
    let on: Vec<f64> = xs.iter().map(|x| 0.01 + x / 1e6).collect();
    assert!(slope_error(&xs, &on, 1e-6, 0.01) < 1e-9);
    let mut mix = Mix(3);
    let noisy: Vec<f64> = on.iter().map(|y| y + mix.range(-5e-3, 5e-3)).collect();
    let e = slope_error(&xs, &noisy, 1e-6, 0.01);
    assert!(e > 0.05 && e < 1.0, "{e}");
    assert_eq!(slope_error(&xs, &on, 0.0, 0.01), f64::INFINITY);
}

#[test]
fn a_queue_is_round_trips_above_the_floor_of_alike_sizes() {
    let ms = Duration::from_millis;
    let mut q = QueueWatch::default();
    // 50 ms round trips, the larger transactions longer by their bytes at
    // 1 MB/s: each size against its own floor, no queue.
    for i in 0..40u64 {
        let bytes = (i % 4) * 10_000;
        q.confirmed(ms(10 * i), ms(50 + bytes / 1_000), bytes);
    }
    assert!(q.queue() < ms(1), "{:?}", q.queue());
    assert!(!q.queued() && q.quiet());
    // 20 ms more for a while: a queue, once most of the span shows it.
    for i in 40..50u64 {
        q.confirmed(ms(10 * i), ms(70), 0);
    }
    assert!(q.queued() && !q.quiet(), "{:?}", q.queue());
    assert!(q.queue().abs_diff(ms(20)) < ms(1), "{:?}", q.queue());
    // A floor is forgotten after FLOOR_WINDOW: a route now 70 ms long
    // is no queue.
    for i in 0..20u64 {
        q.confirmed(ms(500) + FLOOR_WINDOW + ms(10 * i), ms(70), 0);
    }
    assert!(!q.queued(), "{:?}", q.queue());
}

#[test]
fn a_link_faster_than_any_nominal_rate_shows_no_queue() {
    // An idle 100 Mbit/s link 200 ms away: batches of 10-160 kB, each
    // 200 ms plus its own transfer. Measured against the 18 Mbit/s prior,
    // the 160 kB batch would read 57 ms below the floor and every smaller
    // one as queued.
    let ms = Duration::from_millis;
    let mut q = QueueWatch::default();
    for i in 0..64u64 {
        let bytes = 10_000 << (i % 5);
        let transfer = Duration::from_secs_f64(bytes as f64 / 12.5e6);
        q.confirmed(ms(20 * i), ms(200) + transfer, bytes);
    }
    assert!(!q.queued() && q.quiet(), "{:?}", q.queue());
}

#[test]
fn what_a_transaction_carried_bounds_the_link_from_below_for_a_while() {
    let mut c = CarriedBound::default();
    assert_eq!(c.bound(), 0.0);
    c.confirmed(Duration::from_secs(1), 2000, Duration::from_micros(500));
    c.confirmed(Duration::from_secs(2), 1000, Duration::from_millis(1));
    assert_eq!(c.bound(), 4e6, "the highest of the window");
    c.confirmed(Duration::from_secs(12), 100, Duration::from_millis(1));
    assert_eq!(c.bound(), 1e6, "the 4 MB/s sample left the window");
    let prior = with_50ms_t_sc(2e6);
    let mut climb = Climb::new(prior, Duration::ZERO);
    let floor = |saturated, carried| Seen {
        saturated,
        queued: true,
        carried,
        delivered: 0.0,
    };
    let acted = climb.update_at_least(Duration::from_secs(1), None, prior, floor(0, 5e6));
    assert_eq!(acted.bytes_per_sec, 5e6, "above the prior, queue or not");
    let low = with_50ms_t_sc(1e5);
    let acted = climb.update_at_least(Duration::from_secs(2), Some(low), prior, floor(64, 3e5));
    assert_eq!(
        acted.bytes_per_sec, 1e5,
        "below the prior a sample is no floor (a shaper's bucket)"
    );
}

#[test]
fn without_a_queue_the_estimate_climbs_back_to_the_prior() {
    let s = Duration::from_secs_f64;
    let prior = with_50ms_t_sc(1e6);
    let low = LinkEstimate {
        bytes_per_sec: 5e5,
        ..prior
    };
    let mut c = Climb::new(prior, Duration::ZERO);
    // A low fit with the link seen busy and queued: acted on at once.
    assert_eq!(c.update(s(1.0), Some(low), prior, 64, true), low);
    // No queue: the same fits again (a sender paced at them), and the
    // estimate climbs at CLIMB_PER_SEC of itself a second.
    let mut at = 1.0;
    while at < 2.0 - 1e-9 {
        at += 0.01;
        c.update(s(at), Some(low), prior, 64, false);
    }
    let climbed = c.value().bytes_per_sec;
    let expect = 5e5 * (1.0 + CLIMB_PER_SEC * 0.01f64).powi(100);
    assert!((climbed - expect).abs() < 1e3, "{climbed} vs {expect}");
    // Without a fit too, and never past the prior.
    assert_eq!(c.update(s(9.0), None, prior, 64, false).bytes_per_sec, 1e6);
    // A queue: the low fit stands again.
    assert_eq!(c.update(s(9.5), Some(low), prior, 64, true), low);
    // Queued and no fit: unchanged.
    assert_eq!(c.update(s(12.0), None, prior, 64, true), low);
    // Above the prior, to_act_on's rule alone.
    let fast = LinkEstimate {
        bytes_per_sec: 2e6,
        ..prior
    };
    assert_eq!(
        c.update(s(13.0), Some(fast), prior, MIN_SATURATED_ABOVE, false),
        fast
    );
    assert_eq!(
        c.update(s(14.0), Some(fast), prior, 0, false).bytes_per_sec,
        1e6
    );
}

#[test]
fn median_of_even_and_odd() {
    assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
    assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
    assert!(median(&mut []).is_nan());
}

proptest! {
    #[test]
    fn estimates_stay_finite_and_positive(
        prior_bw in 1.0f64..1e10,
        prior_tsc_us in 0u64..5_000_000,
        txs in proptest::collection::vec((0u64..10_000_000_000, 0u64..100_000_000_000), 0..150),
    ) {
        let mut est = LinkEstimator::new(LinkEstimate {
            bytes_per_sec: prior_bw,
            per_transaction: Duration::from_micros(prior_tsc_us),
        }).unwrap();
        for (bytes, nanos) in txs {
            est.observe(bytes, Duration::from_nanos(nanos));
            let e = est.estimate();
            prop_assert!(e.bytes_per_sec.is_finite());
            prop_assert!(e.bytes_per_sec >= MIN_BYTES_PER_SEC);
            prop_assert!(e.bytes_per_sec <= MAX_BYTES_PER_SEC);
            prop_assert!(e.per_transaction <= MAX_PER_TRANSACTION);
            let t = e.transaction_secs(bytes as f64);
            prop_assert!(t.is_finite() && t >= 0.0);
        }
    }

    #[test]
    fn probe_is_finite_or_an_error(
        s1 in 0u64..1_000_000_000, t1 in 1u64..10_000_000_000,
        s2 in 0u64..1_000_000_000, t2 in 1u64..10_000_000_000,
    ) {
        if let Ok(e) = two_transfer_probe(s1, Duration::from_nanos(t1), s2, Duration::from_nanos(t2)) {
            prop_assert!(e.bytes_per_sec.is_finite() && e.bytes_per_sec > 0.0);
        }
    }
}

#[test]
fn a_fit_goes_below_the_prior_only_once_the_link_was_seen_saturated() {
    let prior = with_50ms_t_sc(2.25e6);
    let slow = LinkEstimate {
        bytes_per_sec: 0.5e6,
        per_transaction: Duration::from_millis(52),
    };
    let idle = to_act_on(slow, prior, MIN_SATURATED - 1);
    assert_eq!(idle.bytes_per_sec, 2.25e6);
    assert_eq!(idle.per_transaction, Duration::from_millis(52));
    assert_eq!(to_act_on(slow, prior, MIN_SATURATED), slow);
    let fast = LinkEstimate {
        bytes_per_sec: 5e6,
        ..slow
    };
    // Above the prior a fit needs a link seen busy most of the time.
    for saturated in [0, MIN_SATURATED, MIN_SATURATED_ABOVE - 1] {
        let early = to_act_on(fast, prior, saturated);
        assert_eq!(early.bytes_per_sec, 2.25e6, "{saturated} saturated");
        assert_eq!(early.per_transaction, Duration::from_millis(52));
    }
    assert_eq!(to_act_on(fast, prior, MIN_SATURATED_ABOVE), fast);
    // Within the fit's jitter of the prior it stands at once.
    let near = LinkEstimate {
        bytes_per_sec: 2.27e6,
        ..slow
    };
    assert_eq!(to_act_on(near, prior, 0), near);
}

#[test]
fn a_transaction_is_timed_as_the_link_served_it() {
    let ms = Duration::from_millis;
    let t_sc = ms(50);
    let mut t = LinkTimer::default();
    // Alone: from its send to its confirmation.
    assert_eq!(t.confirmed(ms(100), ms(160), t_sc, 10_000, None), ms(60));
    // Sent at 105, before the first left the link (at 160 - 50): it
    // started on the link at 110.
    assert_eq!(t.confirmed(ms(105), ms(170), t_sc, 10_000, None), ms(60));
    assert_eq!(t.saturated(), 1);
    // Sent at 230, after the link was free (170 - 50): from its send.
    assert_eq!(t.confirmed(ms(230), ms(295), t_sc, 10_000, None), ms(65));
    assert_eq!(t.saturated(), 1);
    // A busy run of 6 batches of 10 kB, all sent at 150, one confirmed
    // every 5 ms: once 4 intervals are seen, each is charged T_sc plus
    // its bytes at the run's rate (2 MB/s).
    for k in 0..6u64 {
        let e = t.confirmed(ms(150), ms(300 + 5 * k), t_sc, 10_000, None);
        if k >= 3 {
            assert_eq!(e, ms(55), "confirmation {k}");
        }
    }
    assert_eq!(t.saturated(), 7);
    // The sink's own time stands and counts as saturated.
    assert_eq!(t.confirmed(ms(400), ms(500), t_sc, 1, Some(ms(7))), ms(7));
    assert_eq!(t.saturated(), 8);
}

#[test]
fn a_bunch_of_confirmations_is_timed_over_the_bunch_before_it() {
    // Small batches queued behind a 1 Mbit/s link (119.5 kB/s of payload)
    // are confirmed by the broker in bunches, each within half a
    // millisecond, every 250 ms: each bunch carried 250 ms of the link.
    let link = 119_500.0;
    let t_sc = Duration::from_millis(50);
    let mut t = LinkTimer::default();
    let mut est = LinkEstimator::new(LinkEstimate {
        bytes_per_sec: 2.15e6,
        per_transaction: t_sc,
    })
    .unwrap();
    let sizes = [315u64, 610, 905, 1200];
    let mut rates = Vec::new();
    for bunch in 0..20u64 {
        let at = Duration::from_millis(1_000 + 250 * bunch);
        // The bunch's sizes add up to what 250 ms of the link carry.
        let mut left = (link * 0.25) as u64;
        let mut k = 0;
        while left > 0 {
            let bytes = sizes[k % sizes.len()].min(left);
            left -= bytes;
            let now = at + Duration::from_micros(7 * k as u64);
            // Sent long before: the link was busy all along.
            let charged = t.confirmed(Duration::from_millis(100), now, t_sc, bytes, None);
            est.observe(bytes, charged);
            if bunch > 2 && charged > t_sc {
                rates.push(bytes as f64 / (charged - t_sc).as_secs_f64());
            }
            k += 1;
        }
    }
    rates.sort_by(f64::total_cmp);
    let median = rates[rates.len() / 2];
    assert!(
        median < 2.0 * link,
        "bunched confirmations read as {median} B/s on a {link} B/s link"
    );
    let fit = est.estimate();
    assert!(
        fit.bytes_per_sec < 2.0 * link,
        "the fit reads {} B/s on a {link} B/s link",
        fit.bytes_per_sec
    );
}

#[test]
fn under_the_prior_a_fit_lifts_the_estimate_no_further_than_above_what_was_delivered() {
    let s = Duration::from_secs_f64;
    let prior = with_50ms_t_sc(2e6);
    let fit = |bytes_per_sec| LinkEstimate {
        bytes_per_sec,
        ..prior
    };
    let seen = |queued, delivered| Seen {
        saturated: 64,
        queued,
        carried: 0.0,
        delivered,
    };
    let mut c = Climb::new(prior, Duration::ZERO);
    // A fit under what the queued link delivered stands.
    let acted = c.observe(s(1.0), fit(3.5e5), false, prior, seen(true, 4e5));
    assert_eq!(acted.map(|a| a.bytes_per_sec), Some(3.5e5));
    // One that read three times that lifts the estimate only a little
    // above it, queue or not.
    let acted = c.observe(s(1.1), fit(1.3e6), false, prior, seen(true, 4e5));
    assert_eq!(acted.map(|a| a.bytes_per_sec), Some(DELIVERED_AHEAD * 4e5));
    // Without a queue, the climb from there.
    let acted = c.observe(s(1.15), fit(1.3e6), true, prior, seen(false, 4e5));
    let climbed = DELIVERED_AHEAD * 4e5 * (1.0 + CLIMB_PER_SEC * 0.05);
    assert!(
        (acted.unwrap().bytes_per_sec - climbed).abs() < 1.0,
        "{acted:?}"
    );
    // With no queue, never under the rate delivered lately.
    let acted = c.observe(s(1.2), fit(3e5), true, prior, seen(false, 1.5e6));
    assert_eq!(
        acted.map(|a| a.bytes_per_sec),
        Some(DELIVERED_FLOOR * 1.5e6)
    );
    let acted = c.observe(s(1.3), fit(3e5), true, prior, seen(false, 9e6));
    assert_eq!(acted.map(|a| a.bytes_per_sec), Some(2e6), "up to the prior");
    // From the prior, the rules over it alone.
    let mut c = Climb::new(prior, Duration::ZERO);
    let acted = c.observe(s(1.0), fit(3e6), true, prior, seen(false, 4e5));
    assert_eq!(acted.map(|a| a.bytes_per_sec), Some(3e6));
}
