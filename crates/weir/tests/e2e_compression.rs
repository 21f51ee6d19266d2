//! End to end against the real RabbitMQ over an emulated 4 Mbit/s uplink:
//! a compressible stream (sensor-CSV rows) reaches RabbitMQ compressed with
//! the codec the piping model picks, an incompressible one (random bytes)
//! goes raw once sampled, and in both every record decodes to identical
//! bytes exactly once.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use common::amqp::*;
use common::process::{parse_config, GRPC_ONLY};
use common::*;
use weir::app::App;
use weir_core::compression::Codec;

fn config(test: &str) -> weir::config::Config {
    let name = unique(test);
    let amqp = amqp_egress(&name);
    let text = format!(
        r#"
[node]
id = 7
[classify]
default_class = "lt"
[[classify.route]]
grpc = "accel"
class = "nm"
[scheduler]
uplink = "4Mbit/s"
transaction_time = "20ms"
{GRPC_ONLY}
{amqp}
[egress.link]
bandwidth = "4Mbit/s"
delay = "20ms"
"#
    );
    parse_config(&text, test)
}

/// Timestamped accelerometer rows, as the piping paper's accel.csv: each
/// row a little different from the last.
fn csv_rows(n: usize) -> Vec<Bytes> {
    let (mut x, mut y) = (123i64, -9876i64);
    (0..n)
        .map(|i| {
            x += (i as i64 * 7919) % 5 - 2;
            y += (i as i64 * 104_729) % 3 - 1;
            Bytes::from(format!(
                "2026-11-22T10:{:02}:{:02}.{:03},0.{:04},-0.{:04},9.81\n",
                (i / 60_000) % 60,
                (i / 1000) % 60,
                i % 1000,
                x.rem_euclid(10_000),
                y.rem_euclid(10_000),
            ))
        })
        .collect()
}

/// Seeded xorshift noise: incompressible, reproducible.
fn noise(n: usize, size: usize) -> Vec<Bytes> {
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    (0..n)
        .map(|_| {
            Bytes::from(
                (0..size)
                    .map(|_| {
                        s ^= s << 13;
                        s ^= s >> 7;
                        s ^= s << 17;
                        s as u8
                    })
                    .collect::<Vec<u8>>(),
            )
        })
        .collect()
}

/// What a run saw: records by encoding, and the egress's batch counts.
struct Outcome {
    records_by_encoding: HashMap<String, usize>,
    batches_raw: u64,
    batches_compressed: u64,
    samples: u64,
}

/// Runs weir, pushes `payloads` through its ingress on stream `stream`,
/// consumes everything from RabbitMQ and checks each record arrived once
/// with identical bytes.
async fn relay(test: &str, stream: &str, payloads: Vec<Bytes>) -> Outcome {
    let name = unique(test);
    let queue = format!("{name}.q");
    delete_queue(&queue).await;
    let app = App::start(config(test)).await.unwrap();
    let total = payloads.len();
    let consumer = tokio::spawn({
        let queue = queue.clone();
        async move { consume_until(&queue, |s| s.len() >= total).await }
    });
    let mut expected = HashMap::new();
    for p in payloads {
        let record = app.ingress.grpc_record(stream, p.clone());
        expected.insert(record.seq, p);
        app.ingress
            .enqueue(record, Some(PATIENCE))
            .await
            .expect("the queue drains over the emulated link");
    }
    let seen = tokio::time::timeout(PATIENCE * 2, consumer)
        .await
        .expect("the consumer finishes")
        .unwrap();
    let metrics = std::sync::Arc::clone(app.ingress.metrics());
    app.shutdown(Duration::from_secs(30)).await;
    delete_queue(&queue).await;

    let counts = counts(&seen);
    for seq in expected.keys() {
        assert_eq!(
            counts.get(&(7, *seq)),
            Some(&1),
            "record {seq} arrived once"
        );
    }
    assert_eq!(seen.len(), expected.len(), "no extra records");
    let mut records_by_encoding = HashMap::new();
    for s in &seen {
        assert_eq!(
            s.record.payload, expected[&s.record.seq],
            "record {} has its bytes",
            s.record.seq
        );
        assert_eq!(s.record.key, stream);
        *records_by_encoding.entry(s.encoding.clone()).or_insert(0) += 1;
    }
    let samples = metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix("weir_compression_samples_total "))
        .expect("the samples counter is exported")
        .parse()
        .unwrap();
    let compressed = weir_core::compression::DEFAULT_CANDIDATES[1..]
        .iter()
        .map(|c| metrics.encoded_total(*c))
        .sum();
    Outcome {
        records_by_encoding,
        batches_raw: metrics.encoded_total(Codec::None),
        batches_compressed: compressed,
        samples,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compressible_stream_reaches_rabbitmq_compressed_and_intact() {
    let rows = csv_rows(20_000);
    let out = relay("csv", "accel", rows).await;
    eprintln!(
        "records by encoding {:?}; batches: {} compressed, {} raw, {} samples",
        out.records_by_encoding, out.batches_compressed, out.batches_raw, out.samples
    );
    let total: usize = out.records_by_encoding.values().sum();
    let compressed = out.records_by_encoding.get("gzip").unwrap_or(&0)
        + out.records_by_encoding.get("zstd").unwrap_or(&0);
    // Every candidate was sampled once; after that the chooser compresses
    // (only a batch too small for compression to beat T_sc may go raw).
    assert!(out.samples >= 7, "{} samples", out.samples);
    assert!(
        out.batches_compressed > out.batches_raw,
        "{} compressed vs {} raw batches",
        out.batches_compressed,
        out.batches_raw
    );
    assert!(
        compressed * 10 >= total * 9,
        "{compressed} of {total} records compressed: {:?}",
        out.records_by_encoding
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incompressible_stream_goes_raw_once_sampled() {
    let out = relay("noise", "noise", noise(300, 4096)).await;
    eprintln!(
        "records by encoding {:?}; batches: {} compressed, {} raw, {} samples",
        out.records_by_encoding, out.batches_compressed, out.batches_raw, out.samples
    );
    // Samples may shave a little protobuf framing and be sent compressed;
    // every batch the chooser decided went raw.
    assert!(out.samples >= 1);
    assert!(
        out.batches_compressed <= out.samples,
        "{} compressed batches, {} samples",
        out.batches_compressed,
        out.samples
    );
    assert!(
        out.batches_raw > out.batches_compressed,
        "{} raw vs {} compressed batches",
        out.batches_raw,
        out.batches_compressed
    );
}
