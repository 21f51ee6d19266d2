//! The ingest-to-egress hot path stage by stage, per record at
//! 256 B and 1 KiB: MQTT decode of a read burst, batch encoding (weir's
//! borrowed-record writer, `weir_proto::encode_records`, against the owned
//! prost message it replaced).
//! Classify and stamp is `metrics/classify_and_stamp_mqtt_record`, the
//! queue `queue/*`, the scheduler `scheduler/*`, codec choice
//! `models/compression/*`: a regression shows in the stage that caused it.

use bytes::{BufMut, Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use prost::Message;
use std::hint::black_box;
use weir_core::scheduler::OutBatch;
use weir_core::{ClassId, ClassSet, Record};
use weir_proto::pb;

const SIZES: [usize; 2] = [256, 1024];

/// `n` MQTT 3.1.1 QoS 1 PUBLISH packets of `size` payload bytes, as one
/// read from a client brings them.
fn publishes(n: usize, size: usize) -> BytesMut {
    let topic = b"plant/line-4/vibration";
    let mut buf = BytesMut::new();
    for i in 0..n {
        buf.put_u8(0x32);
        let mut remaining = 2 + topic.len() + 2 + size;
        loop {
            let byte = (remaining % 128) as u8;
            remaining /= 128;
            buf.put_u8(if remaining > 0 { byte | 0x80 } else { byte });
            if remaining == 0 {
                break;
            }
        }
        buf.put_u16(topic.len() as u16);
        buf.put_slice(topic);
        buf.put_u16((i % 65535 + 1) as u16);
        buf.put_bytes((i % 251) as u8, size);
    }
    buf
}

fn mqtt_decode(c: &mut Criterion) {
    let mut g = c.benchmark_group("ingest/mqtt_decode_burst_of_64");
    for size in SIZES {
        let burst = publishes(64, size);
        g.throughput(Throughput::Elements(64));
        g.bench_with_input(BenchmarkId::from_parameter(size), &burst, |b, burst| {
            b.iter(|| {
                let mut buf = burst.clone();
                black_box(weir::ingress::mqtt::listen::decode_publishes(&mut buf))
            })
        });
    }
    g.finish();
}

fn records(n: usize, size: usize) -> Vec<Record> {
    (0..n)
        .map(|i| Record {
            key: Bytes::from_static(b"plant/line-4/vibration"),
            class: ClassId((i % 3) as u8),
            origin: 1,
            seq: 1_000_000 + i as u64,
            ingress_us: 1_800_000_000_000_000 + i as u64,
            payload: Bytes::from(vec![(i % 251) as u8; size]),
            spool: None,
        })
        .collect()
}

fn batch_encode(c: &mut Criterion) {
    let classes = ClassSet::janus_default();
    for size in SIZES {
        // A 1 MiB batch, as the peer benchmark's weir builds.
        let n = ((1 << 20) / (size + 40)).min(1024);
        let batch = OutBatch {
            seq: 7,
            class: ClassId(0),
            records: records(n, size),
        };
        let mut g = c.benchmark_group(format!("ingest/batch_encode_{size}B"));
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function("weir_encode", |b| {
            b.iter(|| black_box(weir::egress::encode(1, &classes, black_box(&batch))))
        });
        // The owned message a prost encoder needs, then
        // prost's encoder.
        g.bench_function("owned_prost_message", |b| {
            b.iter(|| {
                let pb = pb::Batch {
                    padding: Default::default(),
                    node: 1,
                    batch_seq: 7,
                    created_us: 1,
                    records: batch
                        .records
                        .iter()
                        .map(|r| pb::Record {
                            key: String::from_utf8_lossy(&r.key).into_owned(),
                            class: classes.get(r.class).name.clone(),
                            origin: r.origin,
                            seq: r.seq,
                            ingress_us: r.ingress_us,
                            payload: r.payload.clone(),
                        })
                        .collect(),
                };
                black_box(Bytes::from(pb.encode_to_vec()))
            })
        });
        g.finish();
    }
}

/// The file egress's per-batch framing: a frame header (its CRC-32C over
/// the body) for a 1 MiB body, and reading a 64-frame segment back.
fn segment_frames(c: &mut Criterion) {
    use weir_proto::segment::{self, FrameHeader};
    let body: Vec<u8> = (0..1usize << 20).map(|i| (i % 251) as u8).collect();
    let header = FrameHeader {
        encoding: weir_proto::Encoding::Identity,
        len: body.len(),
        batch_seq: 7,
        written_us: 1,
    };
    let mut file = Vec::new();
    for _ in 0..64 {
        let start = file.len();
        file.extend_from_slice(&header.encode(&body));
        file.extend_from_slice(&body);
        file.resize(start + segment::frame_len(body.len()), 0);
    }
    let mut g = c.benchmark_group("segment");
    g.throughput(Throughput::Bytes(body.len() as u64));
    g.bench_function("frame_header_1MiB", |b| {
        b.iter(|| black_box(header.encode(black_box(&body))))
    });
    g.throughput(Throughput::Bytes(file.len() as u64));
    g.bench_function("read_64_frames_of_1MiB", |b| {
        b.iter(|| black_box(segment::read(black_box(&file)).frames.len()))
    });
    g.finish();
}

criterion_group!(benches, mqtt_decode, batch_encode, segment_frames);
criterion_main!(benches);
