//! Batch compression as weir's egress runs it, against the zstd crate alone
//! on the same body. Goal: zstd level 1 inside weir at least 80%
//! of the zstd crate's own throughput.
//!
//! The body is a ~64 KiB `weir.v1.Batch` of sensor-CSV records (the piping
//! paper's accel.csv shape), the default `max_batch_bytes`. Throughput is
//! in uncompressed bytes per second.
//!
//! - `zstd_crate_bulk`: `zstd::bulk::compress`, the crate's one-shot call.
//! - `zstd_crate_stream`: `zstd::stream::encode_all`, its streaming call.
//! - `weir_compress`: `weir_proto::compress`, what the egress calls.
//! - `weir_off_reactor`: the same handed to tokio's blocking pool and
//!   awaited, as the egress does per batch (adds the hand-off cost).
//! - `handoff_only`: that hand-off with nothing to compress (throughput
//!   figures here are per batch of the same size, for comparison).
//! - `weir_decompress`: `weir_proto::decompress` of the zstd-1 body with
//!   the default cap, what a consumer runs.

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use weir_proto::{compress, decompress, encode_batch, pb, Encoding};

/// Target size of the batch body: the default `max_batch_bytes`.
const BODY_BYTES: usize = 64 << 10;

/// zstd level under test: the fastest of the default candidates.
const LEVEL: i32 = 1;

/// A `weir.v1.Batch` of accelerometer rows, just under [`BODY_BYTES`].
fn sensor_body() -> Bytes {
    let (mut x, mut y) = (123i64, -9876i64);
    let mut records = Vec::new();
    let mut batch = pb::Batch {
        padding: Default::default(),
        node: 1,
        batch_seq: 1,
        created_us: 1_763_800_000_000_000,
        records: Vec::new(),
    };
    for i in 0u64.. {
        x += (i as i64 * 7919) % 5 - 2;
        y += (i as i64 * 104_729) % 3 - 1;
        records.push(pb::Record {
            key: "factory/line-3/accel".into(),
            class: "nm".into(),
            origin: 1,
            seq: i,
            ingress_us: 1_763_800_000_000_000 + i * 1000,
            payload: Bytes::from(format!(
                "2026-11-22T10:{:02}:{:02}.{:03},0.{:04},-0.{:04},9.81\n",
                (i / 60_000) % 60,
                (i / 1000) % 60,
                i % 1000,
                x.rem_euclid(10_000),
                y.rem_euclid(10_000),
            )),
        });
        if i % 64 == 0 {
            batch.records = records.clone();
            if encode_batch(&batch).len() >= BODY_BYTES {
                records.truncate(records.len() - 64);
                break;
            }
        }
    }
    batch.records = records;
    encode_batch(&batch)
}

fn zstd_level_1(c: &mut Criterion) {
    let body = sensor_body();
    let compressed = compress(&body, Encoding::Zstd, LEVEL).expect("compresses");
    eprintln!(
        "body {} bytes, zstd-{LEVEL} {} bytes (ratio {:.2})",
        body.len(),
        compressed.len(),
        body.len() as f64 / compressed.len() as f64
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .expect("runtime");

    let mut g = c.benchmark_group("compression/zstd-1");
    g.throughput(Throughput::Bytes(body.len() as u64));
    g.bench_function("zstd_crate_bulk", |b| {
        b.iter(|| zstd::bulk::compress(black_box(&body), LEVEL).unwrap())
    });
    g.bench_function("zstd_crate_stream", |b| {
        b.iter(|| zstd::stream::encode_all(black_box(&body[..]), LEVEL).unwrap())
    });
    g.bench_function("weir_compress", |b| {
        b.iter(|| compress(black_box(&body), Encoding::Zstd, LEVEL).unwrap())
    });
    g.bench_function("weir_off_reactor", |b| {
        b.iter(|| {
            let body = body.clone();
            rt.block_on(async move {
                tokio::task::spawn_blocking(move || compress(&body, Encoding::Zstd, LEVEL))
                    .await
                    .unwrap()
                    .unwrap()
            })
        })
    });
    // The hand-off alone (an empty closure): what `weir_off_reactor` adds
    // to `weir_compress`, a fixed cost per batch whatever its size.
    g.bench_function("handoff_only", |b| {
        b.iter(|| {
            rt.block_on(async {
                tokio::task::spawn_blocking(|| black_box(0u8))
                    .await
                    .unwrap()
            })
        })
    });
    g.bench_function("weir_decompress", |b| {
        b.iter(|| {
            decompress(
                black_box(&compressed),
                Encoding::Zstd,
                weir_proto::codec::DEFAULT_MAX_DECODED,
            )
            .unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, zstd_level_1);
criterion_main!(benches);
