//! Peering hot paths (weir-core `peer`): one node's redirection round over
//! its view of 1,000 nodes (goal: within 5 ms), and a provider granting,
//! admitting and holding forwarded records until delivered. Forwarding throughput over gRPC is measured by
//! `cargo test --release -p weir --lib peer::tests::forwarding_throughput
//! -- --ignored --nocapture` (it needs two running peers).

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use weir_core::janus::{BandwidthTuple, Strategy};
use weir_core::peer::{decide, Advert, Custody, Pacing, PeerView, ReservationConfig, Reservations};
use weir_core::{ClassId, NodeId};

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

/// A three-class tuple: half the nodes short in one or two classes, half
/// with spare on the top class (what BWAllocator leaves), as bytes/s.
fn tuple(mix: &mut Mix) -> BandwidthTuple {
    if mix.next().is_multiple_of(2) {
        let mut t = vec![0.0; 3];
        t[(mix.next() % 3) as usize] = -mix.range(1e3, 2e6);
        if mix.next().is_multiple_of(2) {
            t[2] = -mix.range(1e3, 2e6);
        }
        BandwidthTuple(t)
    } else {
        BandwidthTuple(vec![mix.range(1e3, 3e6), 0.0, 0.0])
    }
}

/// Node 1's view of `n - 1` live peers, and its own advert (short in lt).
fn view(n: usize) -> (PeerView, Advert) {
    let mut mix = Mix(n as u64);
    let mut v = PeerView::new(Duration::from_millis(500));
    for id in 2..=n as NodeId {
        let advert = Advert {
            round: 1,
            tuple: tuple(&mut mix),
            requesting_since_us: mix.next() % 1_000_000,
        };
        v.observe(id, advert, Duration::ZERO);
    }
    let own = Advert {
        round: 1,
        tuple: BandwidthTuple(vec![0.0, 0.0, -1e6]),
        requesting_since_us: 500_000,
    };
    (v, own)
}

fn round(c: &mut Criterion) {
    let mut g = c.benchmark_group("peer/round");
    for n in [100usize, 1000] {
        let (v, own) = view(n);
        g.throughput(Throughput::Elements(n as u64));
        for s in [Strategy::Pmrfs, Strategy::BestFit] {
            g.bench_with_input(BenchmarkId::new(s.name(), n), &n, |b, _| {
                b.iter(|| {
                    black_box(decide(
                        s,
                        1,
                        black_box(&own),
                        black_box(&v),
                        Duration::from_millis(100),
                    ))
                })
            });
        }
    }
    g.finish();
}

fn provider(c: &mut Criterion) {
    let config = ReservationConfig {
        lease: Duration::from_secs(1),
        pacing: Pacing {
            burst: Duration::from_millis(500),
            min_burst: 512.0 * 1024.0,
        },
    };
    let mut g = c.benchmark_group("peer/provider");
    g.throughput(Throughput::Elements(1));
    g.bench_function("grant_renewal_of_100", |b| {
        let mut res = Reservations::new(1, config);
        let mut now = Duration::ZERO;
        let mut receiver: NodeId = 0;
        b.iter(|| {
            receiver = receiver % 100 + 2;
            now += Duration::from_micros(10);
            black_box(res.grant(receiver, ClassId(2), 1e4, Duration::ZERO, now, 1e7))
        })
    });
    g.bench_function("admit", |b| {
        let mut res = Reservations::new(1, config);
        res.grant(2, ClassId(2), 1e12, Duration::ZERO, Duration::ZERO, 1e12);
        let mut now = Duration::ZERO;
        b.iter(|| {
            now += Duration::from_nanos(100);
            black_box(res.admit(2, ClassId(2), 288, now))
        })
    });
    g.finish();

    // Custody of forwarded records until delivered: each held, delivered
    // in a batch and acknowledged, 512 at a time (one Forward request).
    let mut g = c.benchmark_group("peer/custody");
    g.throughput(Throughput::Elements(512));
    g.bench_function("hold_deliver_ack_512", |b| {
        let mut custody = Custody::new();
        let mut seq = 0u64;
        b.iter(|| {
            let first = seq;
            for _ in 0..512 {
                custody.hold((2, seq), 7);
                seq += 1;
            }
            custody.delivered((first..seq).map(|s| (2, s)));
            black_box(custody.take_delivered(7, 8192))
        })
    });
    g.finish();
}

criterion_group!(benches, round, provider);
criterion_main!(benches);
