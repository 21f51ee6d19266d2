//! Per-record costs of the relay's metrics on its hot paths: the egress
//! recording each confirmed record's latency against its class bound
//! (`weir_record_latency_seconds`, `weir_records_late_total`), and ingress
//! classifying through the reloadable classifier (an `ArcSwap` load).

use std::sync::Arc;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use weir::intake::Intake;
use weir::metrics::Metrics;
use weir_core::classify::{Classifier, Rule, Source, TopicFilter};
use weir_core::queueing::queue::{MultiLevelQueue, QueueCapacity};
use weir_core::{ClassId, ClassSet, Record};

fn batch(n: usize, now_us: u64) -> Vec<Record> {
    (0..n)
        .map(|i| Record {
            key: Bytes::from_static(b"plant/a/t"),
            class: ClassId((i % 3) as u8),
            origin: 1,
            seq: i as u64,
            // Spread over 0 to 2 s old: every bucket and both sides of the
            // bounds are hit.
            ingress_us: now_us - (i as u64 * 7_919) % 2_000_000,
            payload: Bytes::from_static(&[0u8; 256]),
            spool: None,
        })
        .collect()
}

fn latency(c: &mut Criterion) {
    let classes = ClassSet::janus_default();
    let metrics = Metrics::new(&classes);
    let now = 1_800_000_000_000_000;
    let records: Vec<weir_core::Receipt> = batch(1024, now)
        .iter()
        .map(weir_core::Receipt::from)
        .collect();
    let mut g = c.benchmark_group("metrics");
    g.throughput(Throughput::Elements(records.len() as u64));
    g.bench_function("latency_per_batch_of_1024", |b| {
        b.iter(|| metrics.latency.delivered(black_box(&records), now))
    });
    g.finish();
}

fn classify(c: &mut Criterion) {
    let classes = ClassSet::janus_default();
    let rule = |filter: &str, class| Rule {
        source: Source::MqttFilter(TopicFilter::parse(filter).expect("valid filter")),
        class,
    };
    let rules = vec![
        rule("plant/+/alarm", ClassId(0)),
        rule("plant/+/cooling/#", ClassId(1)),
    ];
    let intake = Intake::new(
        1,
        classes.clone(),
        Classifier::new(rules, ClassId(2)).unwrap(),
        Arc::new(MultiLevelQueue::uniform(
            &classes,
            QueueCapacity {
                records: 1024,
                bytes: 1 << 20,
            },
        )),
        1,
        tokio_util::sync::CancellationToken::new(),
        Arc::new(Metrics::new(&classes)),
    );
    let topic = Bytes::from_static(b"plant/7/cooling/pump");
    let payload = Bytes::from_static(&[0u8; 256]);
    c.bench_function("metrics/classify_and_stamp_mqtt_record", |b| {
        b.iter(|| intake.mqtt_record(black_box(topic.clone()), payload.clone()))
    });
}

criterion_group!(benches, latency, classify);
criterion_main!(benches);
