//! JANUS hot paths: BWAllocator (Algorithm 2), PBTT (Algorithm 1) and the
//! redirection matchers (Algorithm 3 and baselines). Goal: PMRFS matching
//! 1,000 providers with 1,000 receivers within 5 ms.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use weir_core::janus::{
    redirect, BwAllocator, ClassLoad, Offer, Pbtt, PbttConfig, Request, Strategy,
};
use weir_core::{ClassId, ClassSet, NodeId};

/// Deterministic pseudo-random numbers (splitmix64), so every run matches
/// the same instance.
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

/// `n` classes with bounds from 50 ms up, and loads that overrun 10 MB/s.
fn allocator_case(n: usize) -> (BwAllocator, Vec<ClassLoad>, Vec<f64>) {
    let bounds: Vec<f64> = (0..n).map(|c| 0.05 * (c as f64 + 1.0)).collect();
    let allocator = BwAllocator::strict(bounds).expect("valid bounds");
    let mut mix = Mix(n as u64);
    let loads = (0..n)
        .map(|_| ClassLoad::new(mix.range(0.0, 2e6), mix.range(0.0, 1e5)))
        .collect();
    let current = vec![1e7 / n as f64; n];
    (allocator, loads, current)
}

fn allocator(c: &mut Criterion) {
    let mut g = c.benchmark_group("janus/bw_allocator");
    for n in [3usize, 16] {
        let (a, loads, current) = allocator_case(n);
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| {
                black_box(
                    a.allocate(black_box(&loads), 1.0, black_box(&current), 1e7)
                        .expect("valid input"),
                )
            })
        });
    }
    g.finish();
}

fn pbtt(c: &mut Criterion) {
    let mut g = c.benchmark_group("janus/pbtt_on_window");
    g.throughput(Throughput::Elements(3));
    let config = PbttConfig {
        window: Duration::from_millis(100),
        processing_delay: Duration::from_millis(2),
        capacity: 2.25e6, // 18 Mbit/s, JANUS Table III's 4G, in bytes/s
    };
    let classes = ClassSet::janus_default();
    // Light: every bound holds, the allocation is kept.
    let light = [
        ClassLoad::new(1e4, 0.0),
        ClassLoad::new(1e5, 1e3),
        ClassLoad::new(2e5, 1e4),
    ];
    // Heavy: ls breaks its bound every window, BWAllocator runs each time.
    let heavy = [
        ClassLoad::new(3e6, 1e5),
        ClassLoad::new(1e6, 1e5),
        ClassLoad::new(1e6, 1e6),
    ];
    for (name, loads) in [("keep", light), ("reallocate", heavy)] {
        let mut p = Pbtt::new(&classes, config).expect("valid config");
        g.bench_function(name, |b| {
            b.iter(|| black_box(p.on_window(black_box(&loads)).expect("valid input")))
        });
    }
    g.finish();
}

/// `n` providers and `n` receivers (one request each, classes mixed),
/// offering and asking about the same total so that matching runs to the end.
fn redirect_case(n: usize) -> (Vec<Request>, Vec<Offer>) {
    let mut mix = Mix(0xBEEF ^ n as u64);
    let requests = (0..n)
        .map(|i| Request {
            receiver: i as NodeId,
            class: ClassId((mix.next() % 3) as u8),
            amount: mix.range(1e3, 1e5),
            order: mix.next() % (n as u64),
        })
        .collect();
    let offers = (0..n)
        .map(|i| Offer {
            provider: (n + i) as NodeId,
            amount: mix.range(1e3, 1e5),
        })
        .collect();
    (requests, offers)
}

fn pmrfs(c: &mut Criterion) {
    let mut g = c.benchmark_group("janus/pmrfs");
    for n in [10usize, 100, 1_000, 10_000] {
        let (requests, offers) = redirect_case(n);
        g.throughput(Throughput::Elements(2 * n as u64));
        g.bench_with_input(BenchmarkId::new("providers_x_receivers", n), &n, |b, _| {
            b.iter(|| {
                black_box(redirect(
                    Strategy::Pmrfs,
                    black_box(&requests),
                    black_box(&offers),
                ))
            })
        });
    }
    g.finish();
}

fn baselines(c: &mut Criterion) {
    let mut g = c.benchmark_group("janus/matchers_1000x1000");
    let (requests, offers) = redirect_case(1_000);
    g.throughput(Throughput::Elements(2_000));
    for s in [
        Strategy::Pmrfs,
        Strategy::Random { seed: 1 },
        Strategy::Fcfs,
        Strategy::Lrfs,
        Strategy::BestFit,
    ] {
        g.bench_function(s.name(), |b| {
            b.iter(|| black_box(redirect(s, black_box(&requests), black_box(&offers))))
        });
    }
    g.finish();
}

criterion_group!(benches, allocator, pbtt, pmrfs, baselines);
criterion_main!(benches);
