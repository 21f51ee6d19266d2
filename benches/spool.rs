//! The spool's hot paths: encoding a frame, decoding one, and
//! append + group commit per record through the real writer thread on this
//! machine's disk (the spool directory goes under the system temp dir; put
//! TMPDIR on the disk you care about, never on tmpfs).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use weir::config::{ClassDurability, Durability, OnFull, SpoolConfig, SyncMode};
use weir::metrics::Metrics;
use weir::spool::{Appended, Spool};
use weir_core::queueing::queue::{MultiLevelQueue, QueueCapacity};
use weir_core::spool::{frame, Frame, SegmentHeader, SegmentKeys};
use weir_core::{ClassId, ClassSet, Record};

const KEY: &[u8] = b"factory/line-1/vibration";

fn header() -> SegmentHeader {
    SegmentHeader {
        version: frame::VERSION,
        first_index: 1_000_000,
        origin: 1,
        base_seq: 5_000_000,
        base_us: 1_700_000_000_000_000,
        class: "ls".into(),
    }
}

fn frame_of(i: u64) -> Frame {
    Frame {
        index: 1_000_000 + i,
        origin: 1,
        seq: 5_000_000 + i,
        ingress_us: 1_700_000_000_000_000 + i * 20,
        key: Bytes::from_static(KEY),
        payload: Bytes::from(vec![0xA5u8; 256]),
    }
}

fn frames(c: &mut Criterion) {
    let mut g = c.benchmark_group("spool");
    g.throughput(Throughput::Elements(1));
    let h = header();
    let f = frame_of(17);
    let mut out = Vec::with_capacity(1 << 20);
    // The key table's lookup included: after the first frame the topic is
    // an id, as for a device publishing to the same topic.
    let mut keys = SegmentKeys::for_version(frame::VERSION);
    g.bench_function("encode_frame_256B", |b| {
        b.iter(|| {
            out.clear();
            let key = keys.field(black_box(KEY), 4096);
            frame::encode(&h, black_box(&f.borrowed()), key, &mut out);
            black_box(out.len())
        })
    });
    out.clear();
    frame::encode(&h, &f.borrowed(), keys.field(KEY, 4096), &mut out);
    let bytes = Bytes::from(out.clone());
    g.bench_function("decode_frame_256B", |b| {
        b.iter(|| black_box(frame::decode(&h, black_box(&bytes)).unwrap()))
    });
    g.finish();
}

fn record(seq: u64) -> Record {
    Record {
        key: Bytes::from_static(KEY),
        class: ClassId(0),
        origin: 1,
        seq,
        ingress_us: 1_700_000_000_000_000 + seq,
        payload: Bytes::from(vec![0xA5u8; 256]),
        spool: None,
    }
}

/// Appends `group` records, waits until all are durable (one group commit
/// when the writer is idle), and releases them, `iters` times over.
fn append_commit(c: &mut Criterion) {
    let mut g = c.benchmark_group("spool");
    let classes = ClassSet::janus_default();
    let dir = std::env::temp_dir().join(format!("weir-bench-spool-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let config = SpoolConfig {
        dir: dir.clone(),
        max_bytes: 1 << 30,
        segment_bytes: 16 << 20,
        sync: SyncMode::Group,
        sync_interval: Duration::from_secs(1),
        commit_delay: Duration::from_millis(1),
        min_free_bytes: 0,
        window_bytes: 64 << 20,
    };
    let durability: Vec<ClassDurability> = (0..classes.len())
        .map(|_| ClassDurability {
            durability: Durability::Spool,
            max_bytes: u64::MAX,
            on_full: OnFull::Block,
            ttl: None,
        })
        .collect();
    let queues = Arc::new(MultiLevelQueue::new(
        &(0..classes.len())
            .map(|_| QueueCapacity {
                records: 1 << 20,
                bytes: 1 << 30,
            })
            .collect::<Vec<_>>(),
    ));
    let (spool, _) = Spool::open(
        &config,
        &classes,
        &durability,
        Arc::clone(&queues),
        Arc::default(),
        Arc::new(Metrics::new(&classes)),
    )
    .expect("spool opens");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut seq = 0u64;
    for group in [1usize, 64, 512] {
        g.throughput(Throughput::Elements(group as u64));
        g.bench_function(format!("append_group_commit_256B_x{group}"), |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    rt.block_on(async {
                        let mut tickets = Vec::with_capacity(group);
                        for _ in 0..group {
                            seq += 1;
                            match spool.try_append(record(seq)).expect("room") {
                                Appended::Pending(t) => tickets.push(t),
                                Appended::Dropped => unreachable!("block never drops"),
                            }
                        }
                        for t in &tickets {
                            assert!(t.durable().await);
                        }
                    });
                    let mut taken = Vec::with_capacity(group);
                    while let Some(r) = queues.pop_strict_priority() {
                        taken.push(weir_core::Receipt::from(&r));
                    }
                    spool.release(&taken);
                }
                start.elapsed()
            })
        });
    }
    g.finish();
    spool.close();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, frames, append_commit);
criterion_main!(benches);
