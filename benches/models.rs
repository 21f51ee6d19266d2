//! The online models: link estimation, batch planning and the
//! compression choice. Goal: the per-batch decision (batch plan and codec)
//! under 1% of a transaction, i.e. under 500 us for a 50 ms transaction;
//! aim under 1 us. The refits on each completed transaction (`observe`) are
//! O(window²) and also run once per transaction, not per record.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use weir_core::batching::{BatchLimits, BatchSizer, ClassTraffic};
use weir_core::compression::{ChooserConfig, CompressionChooser, DEFAULT_CANDIDATES};
use weir_core::link_estimate::{LinkEstimate, LinkEstimator, WINDOW};

/// Deterministic pseudo-random numbers (splitmix64).
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..hi`.
    fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (self.next() >> 11) as f64 / (1u64 << 53) as f64 * (hi - lo)
    }
}

/// The 4G link of JANUS Table III: 18 Mbit/s, 50 ms.
fn link_4g() -> LinkEstimate {
    LinkEstimate {
        bytes_per_sec: 18e6 / 8.0,
        per_transaction: Duration::from_millis(50),
    }
}

/// Transactions of 1 kB..1 MB on the 4G link with ±3% noise.
fn transactions(n: usize, seed: u64) -> Vec<(u64, Duration)> {
    let mut mix = Mix(seed);
    (0..n)
        .map(|_| {
            let size = mix.range(1e3, 1e6);
            let t = (0.05 + size / 2.25e6) * mix.range(0.97, 1.03);
            (size as u64, Duration::from_secs_f64(t))
        })
        .collect()
}

fn link(c: &mut Criterion) {
    let mut g = c.benchmark_group("models/link_estimator");
    g.throughput(Throughput::Elements(1));
    let txs = transactions(1024, 1);
    let mut est = LinkEstimator::new(link_4g()).expect("valid prior");
    for (b, t) in &txs[..WINDOW] {
        est.observe(*b, *t);
    }
    let mut k = 0;
    g.bench_function("observe_and_estimate_full_window", |b| {
        b.iter(|| {
            let (bytes, t) = txs[k % txs.len()];
            k += 1;
            est.observe(black_box(bytes), black_box(t));
            black_box(est.estimate())
        })
    });
    // All transactions one size: the bandwidth-only fallback.
    let mut same = LinkEstimator::new(link_4g()).expect("valid prior");
    let mut mix = Mix(2);
    g.bench_function("observe_and_estimate_one_size", |b| {
        b.iter(|| {
            let t = Duration::from_secs_f64(0.05 + 0.02 * mix.range(0.97, 1.03));
            same.observe(black_box(45_000), t);
            black_box(same.estimate())
        })
    });
    g.bench_function("estimate", |b| {
        b.iter(|| black_box(black_box(&est).estimate()))
    });
    g.finish();
}

fn batching(c: &mut Criterion) {
    let mut g = c.benchmark_group("models/batching");
    g.throughput(Throughput::Elements(1));
    let mut sizer = BatchSizer::new(BatchLimits::default());
    let mut mix = Mix(3);
    let batches: Vec<(u32, Duration)> = (0..1024)
        .map(|_| {
            let s = 1 + (mix.next() % 100) as u32;
            let t = (0.05 + s as f64 * 256.0 / 2.25e6) * mix.range(0.97, 1.03);
            (s, Duration::from_secs_f64(t))
        })
        .collect();
    for (s, t) in &batches[..WINDOW] {
        sizer.observe(*s, *t);
    }
    let mut k = 0;
    g.bench_function("observe_full_window", |b| {
        b.iter(|| {
            let (s, t) = batches[k % batches.len()];
            k += 1;
            sizer.observe(black_box(s), black_box(t));
        })
    });
    let traffic = ClassTraffic {
        arrival_rate: 2_000.0,
        mean_record_bytes: 256.0,
        latency_bound: Duration::from_millis(500),
        reference: 6,
    };
    let link = link_4g();
    g.bench_function("plan", |b| {
        b.iter(|| black_box(sizer.plan(black_box(&traffic), black_box(&link))))
    });
    g.finish();
}

/// A chooser with every default candidate measured on 100 kinds.
fn measured_chooser() -> CompressionChooser {
    let mut ch = CompressionChooser::new(ChooserConfig::default()).expect("valid config");
    let mut mix = Mix(4);
    for kind in 0..100 {
        let kind = format!("factory/line-{kind}/vibration");
        for codec in &DEFAULT_CANDIDATES[1..] {
            let cr = mix.range(1.0, 12.0);
            let thc = mix.range(1e6, 500e6);
            ch.observe(
                &kind,
                *codec,
                1 << 20,
                ((1 << 20) as f64 / cr) as u64,
                Duration::from_secs_f64((1 << 20) as f64 / thc),
            );
        }
    }
    ch
}

fn compression(c: &mut Criterion) {
    let mut g = c.benchmark_group("models/compression");
    g.throughput(Throughput::Elements(1));
    let mut ch = measured_chooser();
    let link = link_4g();
    let kind = "factory/line-42/vibration";
    g.bench_function("choose_8_candidates", |b| {
        b.iter(|| black_box(ch.choose(black_box(kind), black_box(64 << 10), black_box(&link))))
    });
    let mut now = Duration::ZERO;
    g.bench_function("sample_due", |b| {
        b.iter(|| {
            now += Duration::from_millis(50);
            black_box(ch.sample_due(black_box(kind), now))
        })
    });
    let mut mix = Mix(5);
    g.bench_function("observe", |b| {
        b.iter(|| {
            let compressed = (mix.next() % 30_000) + 5_000;
            ch.observe(
                black_box(kind),
                weir_core::compression::Codec::Zstd(3),
                64 << 10,
                compressed,
                Duration::from_micros(200),
            )
        })
    });
    g.finish();
}

/// The whole per-batch decision: batch plan for the class, codec for the
/// batch (the goal: under 1% of the transaction time).
fn per_batch(c: &mut Criterion) {
    let mut g = c.benchmark_group("models/per_batch_decision");
    g.throughput(Throughput::Elements(1));
    let ch = measured_chooser();
    let mut est = LinkEstimator::new(link_4g()).expect("valid prior");
    for (b, t) in transactions(WINDOW, 6) {
        est.observe(b, t);
    }
    let sizer = BatchSizer::new(BatchLimits::default());
    let traffic = ClassTraffic {
        arrival_rate: 2_000.0,
        mean_record_bytes: 256.0,
        latency_bound: Duration::from_millis(500),
        reference: 6,
    };
    let kind = "factory/line-42/vibration";
    g.bench_function("plan_and_choose", |b| {
        b.iter(|| {
            let link = est.estimate();
            let plan = sizer.plan(black_box(&traffic), &link);
            let bytes = u64::from(plan.target_records) * 256;
            black_box(ch.choose(black_box(kind), bytes, &link))
        })
    });
    g.finish();
}

criterion_group!(benches, link, batching, compression, per_batch);
criterion_main!(benches);
