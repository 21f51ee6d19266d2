//! Queue, token-bucket and drain hot paths (goal: push+pop of a
//! 256-byte record at most 100 ns single-threaded).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use weir_core::batching::BatchLimits;
use weir_core::janus::scheme::Scheme;
use weir_core::link_estimate::LinkEstimate;
use weir_core::queueing::drain::{Drain, Drainer};
use weir_core::queueing::queue::{ClassQueue, MultiLevelQueue, QueueCapacity};
use weir_core::queueing::token_bucket::{BucketConfig, Take, TokenBucket};
use weir_core::scheduler::{Poll, Scheduler, SchedulerParams};
use weir_core::{ClassId, ClassSet, Record};

const CAP: QueueCapacity = QueueCapacity {
    records: 65_536,
    bytes: 64 << 20,
};

fn record(class: u8) -> Record {
    Record {
        key: Bytes::from_static(b"factory/line-1/vibration"),
        class: ClassId(class),
        origin: 1,
        seq: 0,
        ingress_us: 0,
        payload: Bytes::from(vec![0xA5u8; 256]),
        spool: None,
    }
}

fn push_pop(c: &mut Criterion) {
    let mut g = c.benchmark_group("queue");
    g.throughput(Throughput::Elements(1));
    let q = ClassQueue::new(CAP);
    let r = record(0);
    g.bench_function("push_pop_256B_1thread", |b| {
        b.iter(|| {
            q.push(black_box(r.clone())).unwrap();
            black_box(q.pop().unwrap());
        })
    });
    let m = MultiLevelQueue::new(&[CAP, CAP, CAP]);
    let lt = record(2);
    g.bench_function("multilevel_push_pop_strict_priority_256B", |b| {
        b.iter(|| {
            m.push(black_box(lt.clone())).unwrap();
            black_box(m.pop_strict_priority().unwrap());
        })
    });
    g.finish();

    // Two threads: a producer thread pushes while the bench thread pops;
    // time per record moved across threads.
    let mut g = c.benchmark_group("queue_2threads");
    const N: u64 = 100_000;
    g.throughput(Throughput::Elements(N));
    g.bench_function(BenchmarkId::new("producer_consumer_256B", N), |b| {
        b.iter(|| {
            let q = Arc::new(ClassQueue::new(CAP));
            let producer = {
                let q = Arc::clone(&q);
                let r = record(0);
                std::thread::spawn(move || {
                    for _ in 0..N {
                        let mut rec = r.clone();
                        while let Err(e) = q.push(rec) {
                            rec = e.into_record();
                            std::hint::spin_loop();
                        }
                    }
                })
            };
            let mut got = 0;
            while got < N {
                if q.pop().is_some() {
                    got += 1;
                } else {
                    std::hint::spin_loop();
                }
            }
            producer.join().unwrap();
        })
    });
    g.finish();
}

fn token_bucket(c: &mut Criterion) {
    let mut g = c.benchmark_group("token_bucket");
    g.throughput(Throughput::Elements(1));
    let mut tb = TokenBucket::new(BucketConfig::bytes(1e12, 1e9), Duration::ZERO);
    let mut now = Duration::ZERO;
    g.bench_function("try_take_granted", |b| {
        b.iter(|| {
            now += Duration::from_nanos(10);
            black_box(tb.try_take(black_box(now), 288, 1) == Take::Granted)
        })
    });
    let mut tb = TokenBucket::new(BucketConfig::bytes(1.0, 1.0), Duration::ZERO);
    g.bench_function("try_take_wait", |b| {
        b.iter(|| black_box(tb.try_take(black_box(Duration::ZERO), 288, 1)))
    });
    g.finish();
}

/// Draining a three-class backlog into 64-record batches: per record, what
/// the scheduler pays to pop, charge tokens and build a batch, per class and
/// with mixed batches (riders from the other classes).
fn drain(c: &mut Criterion) {
    const BATCH: usize = 64;
    let mut g = c.benchmark_group("drain");
    g.throughput(Throughput::Elements(BATCH as u64));
    for mixing in [false, true] {
        let q = MultiLevelQueue::new(&[CAP, CAP, CAP]);
        let limits = BatchLimits {
            max_records: BATCH,
            max_bytes: 1 << 20,
        };
        let mut d = Drainer::new(&[1e12; 3], 1e12, limits, Duration::ZERO);
        d.set_mixing(mixing);
        let name = if mixing { "mixed_64" } else { "per_class_64" };
        let mut k = 0u8;
        g.bench_function(name, |b| {
            b.iter(|| {
                // One batch's worth in, spread over the classes, one out.
                for _ in 0..BATCH {
                    k = (k + 1) % 3;
                    let _ = q.push(record(k));
                }
                let mut out = 0;
                while out < BATCH {
                    match d.next_batch(Duration::ZERO, 0, &q, None) {
                        Drain::Batch { records, .. } => out += black_box(records).len(),
                        other => panic!("{other:?}"),
                    }
                }
            })
        });
    }
    g.finish();
}

/// The scheduler core's per-batch step (`Scheduler::poll_batch`, the drain
/// with batch plans and sequence numbers) and its window step
/// (`poll_window`: queue counters, PBTT, re-planning), as the relay's task
/// calls them.
fn scheduler(c: &mut Criterion) {
    const BATCH: usize = 64;
    let classes = ClassSet::janus_default();
    let params = SchedulerParams {
        scheme: Scheme::QmOnly,
        window: Duration::from_millis(100),
        processing_delay: Duration::from_millis(1),
        capacity: 1e12,
        burst_bytes: Some(1e12),
        limits: BatchLimits {
            max_records: BATCH,
            max_bytes: 1 << 20,
        },
        adaptive: true,
        reference: vec![2, 6, 11],
        track_uplink: false,
        mix_classes: true,
        // The bench polls back to back; a gather would only make it wait.
        gather: Duration::ZERO,
    };
    let link = LinkEstimate {
        bytes_per_sec: 1e12,
        per_transaction: Duration::from_millis(1),
    };
    let mut g = c.benchmark_group("scheduler");
    g.throughput(Throughput::Elements(BATCH as u64));
    let q = MultiLevelQueue::new(&[CAP, CAP, CAP]);
    let mut s = Scheduler::new(
        params.clone(),
        classes.clone(),
        &q,
        link,
        0,
        1,
        Duration::ZERO,
    );
    let mut k = 0u8;
    g.bench_function("poll_batch_64", |b| {
        b.iter(|| {
            for _ in 0..BATCH {
                k = (k + 1) % 3;
                let _ = q.push(record(k));
            }
            let mut out = 0;
            while out < BATCH {
                match s.poll_batch(Duration::ZERO, 0, &q) {
                    Poll::Batch(batch) => out += black_box(batch).records.len(),
                    other => panic!("{other:?}"),
                }
            }
        })
    });
    g.throughput(Throughput::Elements(1));
    let q = MultiLevelQueue::new(&[CAP, CAP, CAP]);
    let mut s = Scheduler::new(params, classes, &q, link, 0, 1, Duration::ZERO);
    let mut now = Duration::ZERO;
    g.bench_function("poll_window", |b| {
        b.iter(|| {
            now += Duration::from_millis(100);
            black_box(s.poll_window(now, &q, 0));
            while s.poll_event().is_some() {}
        })
    });
    g.finish();
}

criterion_group!(benches, push_pop, token_bucket, drain, scheduler);
criterion_main!(benches);
