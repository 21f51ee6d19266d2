//! The AMQP egress against the real RabbitMQ on 127.0.0.1:5672
//! (guest/guest; `bash scripts/services.sh` starts it). Every test uses its
//! own exchange and queue (named after the process id and the test) and
//! deletes them at the end, so tests can run concurrently with others.
//!
//! Failures are staged without touching other clients of the broker: the
//! broker closes only this test's connection (`rabbitmqctl
//! close_connection`), or the sink talks to RabbitMQ through a small TCP
//! proxy that the test can cut, stall, or use to inject
//! `connection.blocked`.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::Channel;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use weir::config::{AmqpEgress, ExchangeType, QueueType, UrlOrder};
use weir::egress::amqp::{
    message_id, AmqpSink, HEADER_BATCH_SEQ, HEADER_CLASS, HEADER_NODE, HEADER_RECORDS,
    HEADER_SENT_US,
};
use weir::egress::{encode, run, EgressContext, EncodedBatch, Sink, SinkError};
use weir::metrics::Metrics;
use weir_core::link_estimate::LinkEstimate;
use weir_core::scheduler::OutBatch;
use weir_core::{ClassId, ClassSet, NodeId, Record};

use common::amqp::{connect_test_client, AMQP_URL as URL};
use common::process::parse_config;
use common::proxy::{Mode, Proxy};
use common::{eventually, logs, tally, unique, PATIENCE};

/// A node id unique to this process and test, so connection names
/// (`weir node <id>`) never collide with another test's.
fn node_id(test: u64) -> NodeId {
    u64::from(std::process::id()) * 100 + test
}

/// Exchange, queue and routing key names unique to this process and test.
struct Names {
    exchange: String,
    queue: String,
    routing_key: String,
}

fn names(test: &str) -> Names {
    let base = unique(test);
    Names {
        exchange: format!("{base}.x"),
        queue: format!("{base}.q"),
        routing_key: format!("{base}.rk"),
    }
}

/// The sink's settings. The confirm timeout bounds connecting as well as
/// each confirm, and its expiry fails a delivery: it is generous, so that
/// a healthy broker on a loaded machine never runs into it. Tests of the
/// timeout itself set a short one.
fn config(url: &str, n: &Names) -> AmqpEgress {
    AmqpEgress {
        urls: vec![url.to_owned()],
        url_order: UrlOrder::InOrder,
        exchange: n.exchange.clone(),
        exchange_type: ExchangeType::Direct,
        queue: n.queue.clone(),
        queue_type: QueueType::Classic,
        queue_arguments: Vec::new(),
        routing_key: n.routing_key.clone(),
        blocked_failover_after: Duration::from_secs(30),
        confirm_timeout: PATIENCE / 3,
        // Connecting has its own bound: tests that shorten confirm_timeout
        // must not make a slow connect on a loaded machine fail them.
        connect_timeout: PATIENCE / 3,
        reconnect_backoff_max: Duration::from_millis(500),
        max_in_flight: 4,
        urgent_lane: false,
    }
}

/// A batch of `n` records of `class`, with payloads that are not UTF-8 and
/// one that is empty, so that the raw bytes are checked end to end.
fn out_batch(node: NodeId, seq: u64, class: ClassId, n: u64) -> OutBatch {
    OutBatch {
        seq,
        class,
        records: (0..n)
            .map(|i| Record {
                key: Bytes::from(format!("factory/line{}/sensor{i}", class.0)),
                class,
                origin: node,
                seq: seq * 1000 + i,
                ingress_us: 1_700_000_000_000_000 + seq * 1000 + i,
                payload: if i == 0 {
                    Bytes::new()
                } else {
                    Bytes::from(vec![0xff, 0x00, (seq % 256) as u8, (i % 256) as u8, 0x9f])
                },
                spool: None,
            })
            .collect(),
    }
}

fn encoded(node: NodeId, seq: u64) -> EncodedBatch {
    let classes = ClassSet::janus_default();
    encode(
        node,
        &classes,
        &out_batch(node, seq, ClassId((seq % 3) as u8), 3),
    )
}

/// One consumed message, with what the tests look at.
struct Consumed {
    seq: u64,
    delivery: lapin::message::Delivery,
}

fn header(d: &lapin::message::Delivery, key: &str) -> Option<AMQPValue> {
    d.properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(key).cloned())
}

fn batch_seq_of(d: &lapin::message::Delivery) -> u64 {
    match header(d, HEADER_BATCH_SEQ) {
        Some(AMQPValue::LongLongInt(v)) => v as u64,
        other => panic!("message without an integer {HEADER_BATCH_SEQ} header: {other:?}"),
    }
}

/// Consumes from `queue` until every batch seq in `want` has arrived at
/// least once; returns all messages seen (duplicates included).
async fn consume_until(channel: &Channel, queue: &str, want: &[u64]) -> Vec<Consumed> {
    let mut consumer = channel
        .basic_consume(
            queue.into(),
            format!("test-consumer-{}", std::process::id()).into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume from the test queue");
    let mut seen = Vec::new();
    let mut missing: Vec<u64> = want.to_vec();
    while !missing.is_empty() {
        let next = tokio::time::timeout(PATIENCE, consumer.next())
            .await
            .unwrap_or_else(|_| panic!("batches {missing:?} never reached queue {queue}"));
        let delivery = next.expect("consumer ended early").expect("delivery error");
        delivery.ack(BasicAckOptions::default()).await.expect("ack");
        let seq = batch_seq_of(&delivery);
        missing.retain(|&s| s != seq);
        seen.push(Consumed { seq, delivery });
    }
    channel
        .basic_cancel(
            format!("test-consumer-{}", std::process::id()).into(),
            Default::default(),
        )
        .await
        .expect("cancel the consumer");
    seen
}

async fn cleanup(channel: &Channel, n: &Names) {
    channel
        .queue_delete(n.queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .expect("delete the test queue");
    if !n.exchange.is_empty() {
        channel
            .exchange_delete(n.exchange.as_str().into(), ExchangeDeleteOptions::default())
            .await
            .expect("delete the test exchange");
    }
}

/// How many times each batch seq arrived.
fn counts(seen: &[Consumed]) -> BTreeMap<u64, usize> {
    tally(seen.iter().map(|c| c.seq))
}

async fn deliver(sink: &mut AmqpSink, batch: &EncodedBatch) -> Result<(), SinkError> {
    tokio::time::timeout(PATIENCE, sink.deliver(batch))
        .await
        .expect("deliver hung")
}

/// Delivers `batch` as the egress loop does: again, on the same sink,
/// while the sink finds the broker unavailable. For sinks whose confirm
/// timeout, the subject of their test, is short enough for a healthy
/// broker on a loaded machine to outlast. Any other outcome is returned.
async fn deliver_retrying(sink: &mut AmqpSink, batch: &EncodedBatch) -> Result<(), SinkError> {
    let give_up = tokio::time::Instant::now() + PATIENCE;
    loop {
        match deliver(sink, batch).await {
            Err(SinkError::Unavailable(why)) if tokio::time::Instant::now() < give_up => {
                eprintln!("batch {} not confirmed, again: {why}", batch.seq);
            }
            other => return other,
        }
    }
}

#[tokio::test]
async fn batches_arrive_in_weir_format() {
    logs();
    let n = names("format");
    let node = node_id(1);
    let classes = ClassSet::janus_default();
    let mut sink = AmqpSink::new(config(URL, &n), node);
    let batches: Vec<OutBatch> = (0..6)
        .map(|seq| out_batch(node, seq, ClassId((seq % 3) as u8), seq + 1))
        .collect();
    for b in &batches {
        deliver(&mut sink, &encode(node, &classes, b))
            .await
            .expect("RabbitMQ confirms the batch");
    }

    let conn = connect_test_client().await;
    let channel = conn.create_channel().await.expect("channel");
    let seqs: Vec<u64> = batches.iter().map(|b| b.seq).collect();
    let seen = consume_until(&channel, &n.queue, &seqs).await;
    assert_eq!(seen.len(), batches.len(), "one message per batch");
    for c in &seen {
        let d = &c.delivery;
        let b = &batches[c.seq as usize];
        let p = &d.properties;
        assert_eq!(
            p.content_type().as_ref().map(|s| s.as_str()),
            Some(weir_proto::CONTENT_TYPE)
        );
        assert_eq!(
            p.content_encoding().as_ref().map(|s| s.as_str()),
            Some("identity")
        );
        assert_eq!(*p.delivery_mode(), Some(2), "persistent");
        assert_eq!(
            p.message_id().as_ref().map(|s| s.as_str().to_owned()),
            Some(message_id(node, b.seq))
        );
        assert!(p.timestamp().is_some());
        assert_eq!(
            header(d, HEADER_NODE),
            Some(AMQPValue::LongLongInt(node as i64))
        );
        assert_eq!(
            header(d, HEADER_RECORDS),
            Some(AMQPValue::LongLongInt(b.records.len() as i64))
        );
        assert_eq!(
            header(d, HEADER_CLASS),
            Some(AMQPValue::LongLongInt(i64::from(b.class.0)))
        );
        // Published after every record entered, and before it was consumed.
        let Some(AMQPValue::LongLongInt(sent_us)) = header(d, HEADER_SENT_US) else {
            panic!("no {HEADER_SENT_US} header");
        };
        let consumed_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as i64;
        assert!(
            b.records.iter().all(|r| r.ingress_us as i64 <= sent_us) && sent_us <= consumed_us,
            "sent {sent_us}, consumed {consumed_us}"
        );
        let encoding = p.content_encoding().as_ref().map_or("", |s| s.as_str());
        let decoded =
            weir_proto::decode_batch(&d.data, encoding, weir_proto::codec::DEFAULT_MAX_DECODED)
                .expect("the body is a weir.v1.Batch");
        assert_eq!(decoded.node, node);
        assert_eq!(decoded.batch_seq, b.seq);
        assert_eq!(decoded.records.len(), b.records.len());
        for (got, want) in decoded.records.iter().zip(&b.records) {
            assert_eq!(got.key.as_bytes(), &want.key[..]);
            assert_eq!(got.class, classes.get(want.class).name);
            assert_eq!(got.origin, want.origin);
            assert_eq!(got.seq, want.seq);
            assert_eq!(got.ingress_us, want.ingress_us);
            assert_eq!(got.payload, want.payload, "payload bytes are untouched");
        }
    }
    cleanup(&channel, &n).await;
}

#[tokio::test]
async fn default_exchange_routes_by_queue_name() {
    logs();
    let mut n = names("default-exchange");
    n.exchange = String::new();
    n.routing_key = n.queue.clone();
    let node = node_id(2);
    let mut sink = AmqpSink::new(config(URL, &n), node);
    deliver(&mut sink, &encoded(node, 0))
        .await
        .expect("published through the default exchange");
    let conn = connect_test_client().await;
    let channel = conn.create_channel().await.expect("channel");
    let seen = consume_until(&channel, &n.queue, &[0]).await;
    assert_eq!(seen.len(), 1);
    cleanup(&channel, &n).await;
}

#[tokio::test]
async fn unroutable_batch_is_refused_not_lost() {
    logs();
    let n = names("unroutable");
    let node = node_id(3);
    let mut sink = AmqpSink::new(config(URL, &n), node);
    deliver(&mut sink, &encoded(node, 0))
        .await
        .expect("routable while bound");

    // Someone removes the binding behind the sink's back.
    let conn = connect_test_client().await;
    let channel = conn.create_channel().await.expect("channel");
    channel
        .queue_unbind(
            n.queue.as_str().into(),
            n.exchange.as_str().into(),
            n.routing_key.as_str().into(),
            FieldTable::default(),
        )
        .await
        .expect("unbind");

    match deliver(&mut sink, &encoded(node, 1)).await {
        Err(SinkError::Refused(why)) => assert!(why.contains("returned"), "{why}"),
        other => panic!("an unroutable batch must be refused, got {other:?}"),
    }
    // The return does not cost the connection: once bound again, the same
    // batch goes through on the same sink.
    channel
        .queue_bind(
            n.queue.as_str().into(),
            n.exchange.as_str().into(),
            n.routing_key.as_str().into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("bind again");
    deliver(&mut sink, &encoded(node, 1))
        .await
        .expect("routable again");
    let seen = consume_until(&channel, &n.queue, &[0, 1]).await;
    assert_eq!(
        counts(&seen),
        BTreeMap::from([(0, 1), (1, 1)]),
        "the refused publish did not reach the queue"
    );
    cleanup(&channel, &n).await;
}

/// Runs the egress loop over `sink`, set up as the app does from the
/// default config; returns the batch sender, the metrics and the loop's
/// handle.
fn spawn_run(
    sink: AmqpSink,
    node: NodeId,
) -> (
    mpsc::Sender<OutBatch>,
    Arc<Metrics>,
    tokio::task::JoinHandle<()>,
) {
    let cfg = parse_config(weir::config::DEFAULT_CONFIG, "the default config");
    let metrics = Arc::new(Metrics::new(&cfg.classes));
    let link_prior = LinkEstimate {
        bytes_per_sec: cfg.scheduler.uplink_bytes_per_sec,
        per_transaction: cfg.scheduler.transaction_time,
    };
    let ctx = EgressContext {
        compress: true,
        node,
        classes: cfg.classes.clone(),
        ready: Arc::default(),
        delivered: None,
        observers: Vec::new(),
        compression: watch::channel(cfg.compression.clone()).1,
        link_prior,
        link: watch::channel(link_prior).0,
        batch_bytes: watch::channel(0).0,
        max_in_flight_bytes: weir::memory::PIPE_BYTES,
        max_batch_bytes: cfg.scheduler.max_batch_bytes as u64,
        metrics: metrics.clone(),
        retry_max: Duration::from_millis(200),
        abort: CancellationToken::new(),
        horizon: watch::channel(Duration::MAX).1,
        urgent_lane: false,
    };
    let (tx, rx) = mpsc::channel(2);
    let handle = tokio::spawn(run(sink, rx, ctx));
    (tx, metrics, handle)
}

async fn send_batches(tx: &mpsc::Sender<OutBatch>, node: NodeId, seqs: std::ops::Range<u64>) {
    for seq in seqs {
        tx.send(out_batch(node, seq, ClassId((seq % 3) as u8), 2))
            .await
            .expect("the egress loop is running");
    }
}

/// Erlang pids of the broker's connections named `weir node <node>`.
fn broker_connections(node: NodeId) -> Vec<String> {
    let out = std::process::Command::new("rabbitmqctl")
        .args([
            "list_connections",
            "-q",
            "--no-table-headers",
            "pid",
            "client_properties",
        ])
        .output()
        .unwrap_or_else(|e| {
            panic!("running rabbitmqctl (needed to close a connection from the broker side): {e}")
        });
    assert!(
        out.status.success(),
        "rabbitmqctl list_connections failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let name = format!("\"weir node {node}\"");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&name))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn broker_closing_the_connection_loses_nothing() {
    logs();
    let n = names("broker-close");
    let node = node_id(4);
    let (tx, metrics, handle) = spawn_run(AmqpSink::new(config(URL, &n), node), node);
    let conn = connect_test_client().await;
    let channel = conn.create_channel().await.expect("channel");

    send_batches(&tx, node, 0..10).await;
    consume_until(&channel, &n.queue, &(0..10).collect::<Vec<_>>()).await;
    let before = broker_connections(node);
    assert_eq!(before.len(), 1, "one sink connection: {before:?}");

    // Only this test's connection, so concurrent tests are unaffected.
    let out = std::process::Command::new("rabbitmqctl")
        .args(["close_connection", &before[0], "test: broker closes weir"])
        .output()
        .expect("run rabbitmqctl close_connection");
    assert!(
        out.status.success(),
        "rabbitmqctl close_connection failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    send_batches(&tx, node, 10..30).await;
    let seen = consume_until(&channel, &n.queue, &(10..30).collect::<Vec<_>>()).await;
    let got = counts(&seen);
    assert!(
        (10..30).all(|s| got.contains_key(&s)),
        "every batch arrives at least once: {got:?}"
    );
    // Checked while the loop, and so the sink, is still running.
    let after = broker_connections(node);
    assert!(
        after.len() == 1 && after != before,
        "the sink reconnected on a new connection: before {before:?}, after {after:?}"
    );
    drop(tx);
    tokio::time::timeout(PATIENCE, handle)
        .await
        .expect("the egress loop drained")
        .expect("the egress loop did not panic");
    assert_eq!(metrics.batches_confirmed.get(), 30);
    cleanup(&channel, &n).await;
}

/// An AMQP method frame on channel 0.
fn method_frame(class: u16, method: u16, args: &[u8]) -> Vec<u8> {
    let mut payload = Vec::new();
    payload.extend_from_slice(&class.to_be_bytes());
    payload.extend_from_slice(&method.to_be_bytes());
    payload.extend_from_slice(args);
    let mut frame = vec![1, 0, 0];
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    frame.extend_from_slice(&payload);
    frame.push(0xce);
    frame
}

/// `connection.blocked` (class 10, method 60) with a reason.
fn connection_blocked(reason: &str) -> Vec<u8> {
    let mut args = vec![reason.len() as u8];
    args.extend_from_slice(reason.as_bytes());
    method_frame(10, 60, &args)
}

/// `connection.unblocked` (class 10, method 61).
fn connection_unblocked() -> Vec<u8> {
    method_frame(10, 61, &[])
}

#[tokio::test]
async fn uplink_outage_loses_nothing() {
    logs();
    let n = names("outage");
    let node = node_id(5);
    let proxy = Proxy::start().await;
    let (tx, metrics, handle) = spawn_run(AmqpSink::new(config(&proxy.url(), &n), node), node);
    let conn = connect_test_client().await;
    let channel = conn.create_channel().await.expect("channel");

    send_batches(&tx, node, 0..5).await;
    consume_until(&channel, &n.queue, &(0..5).collect::<Vec<_>>()).await;

    proxy.set(Mode::Down);
    // From a task: the loop holds its batch while the link is down, so the
    // bounded channel fills up and sending waits, as the scheduler would.
    let producer = tokio::spawn(async move { send_batches(&tx, node, 5..15).await });
    // Deliveries fail while the uplink is down (the counter counts batches
    // that needed a retry, once each)...
    eventually(
        "deliveries to fail and be retried while the uplink is down",
        || metrics.batches_republished.get() > 0,
    )
    .await;
    // ...and nothing is lost once it is back.
    proxy.set(Mode::Pass);
    tokio::time::timeout(PATIENCE, producer)
        .await
        .expect("every batch was handed over after the outage")
        .expect("the producer did not panic");
    tokio::time::timeout(PATIENCE, handle)
        .await
        .expect("the egress loop drained after the outage")
        .expect("the egress loop did not panic");
    let seen = consume_until(&channel, &n.queue, &(5..15).collect::<Vec<_>>()).await;
    let got = counts(&seen);
    assert!(
        (5..15).all(|s| got.contains_key(&s)),
        "every batch arrives at least once: {got:?}"
    );
    assert_eq!(metrics.batches_confirmed.get(), 15);
    cleanup(&channel, &n).await;
}

#[tokio::test]
async fn silent_broker_times_out_then_batch_is_republished() {
    logs();
    let n = names("stall");
    let node = node_id(6);
    let proxy = Proxy::start().await;
    let mut cfg = config(&proxy.url(), &n);
    cfg.confirm_timeout = Duration::from_millis(300);
    let mut sink = AmqpSink::new(cfg, node);
    // 300 ms also bounds connecting and the confirms of a healthy broker,
    // which a loaded machine can outlast: deliveries that must succeed are
    // retried as the egress loop would (a timed-out one may then arrive
    // twice; nothing below counts copies of batch 0).
    deliver_retrying(&mut sink, &encoded(node, 0))
        .await
        .expect("delivered before the stall");

    proxy.set(Mode::Stall);
    match deliver(&mut sink, &encoded(node, 1)).await {
        Err(SinkError::Unavailable(why)) => assert!(why.contains("within"), "{why}"),
        other => panic!("a silent broker must time out as unavailable, got {other:?}"),
    }
    assert!(!sink.is_connected(), "the timed-out connection was dropped");

    proxy.set(Mode::Pass);
    deliver_retrying(&mut sink, &encoded(node, 1))
        .await
        .expect("the same batch goes through after a reconnect");
    let conn = connect_test_client().await;
    let channel = conn.create_channel().await.expect("channel");
    let seen = consume_until(&channel, &n.queue, &[0, 1]).await;
    assert!(counts(&seen).contains_key(&1));
    cleanup(&channel, &n).await;
}

#[tokio::test]
async fn blocked_connection_waits_instead_of_failing() {
    logs();
    let n = names("blocked");
    let node = node_id(7);
    let proxy = Proxy::start().await;
    let mut cfg = config(&proxy.url(), &n);
    // Short, so that the wait below outlasts it several times over, yet
    // long enough for the confirm of the delivery resumed after the
    // unblock on a loaded machine (200 ms was missed there).
    const CONFIRM_TIMEOUT: Duration = Duration::from_secs(1);
    cfg.confirm_timeout = CONFIRM_TIMEOUT;
    let mut sink = AmqpSink::new(cfg, node);
    // A healthy broker on a loaded machine may miss the timeout once; what
    // this test is about is the wait while blocked, below.
    deliver_retrying(&mut sink, &encoded(node, 0))
        .await
        .expect("delivered before the alarm");

    // What RabbitMQ sends under a memory or disk alarm.
    proxy.inject(connection_blocked("low on memory"));
    tokio::time::timeout(PATIENCE, async {
        while !sink.is_blocked() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("lapin saw connection.blocked");

    let pending = tokio::spawn(async move {
        let result = sink.deliver(&encoded(node, 1)).await;
        (result, sink)
    });
    // Several confirm timeouts pass: the delivery neither fails nor
    // completes while the broker blocks the connection. An absence, which
    // only a wait can show: five confirm timeouts, each of which would
    // have failed an unblocked delivery.
    tokio::time::sleep(CONFIRM_TIMEOUT * 5).await;
    assert!(
        !pending.is_finished(),
        "deliver must wait while the connection is blocked"
    );

    proxy.inject(connection_unblocked());
    let (result, sink) = tokio::time::timeout(PATIENCE, pending)
        .await
        .expect("deliver resumed after connection.unblocked")
        .expect("the delivery task did not panic");
    result.expect("confirmed once unblocked, on the same connection");
    assert!(!sink.is_blocked());

    let conn = connect_test_client().await;
    let channel = conn.create_channel().await.expect("channel");
    let seen = consume_until(&channel, &n.queue, &[0, 1]).await;
    assert_eq!(counts(&seen), BTreeMap::from([(0, 1), (1, 1)]));
    cleanup(&channel, &n).await;
}

#[tokio::test]
async fn a_lost_endpoint_fails_over_to_the_next_without_loss() {
    logs();
    let n = names("failover");
    let node = node_id(10);
    let (first, second) = (Proxy::start().await, Proxy::start().await);
    let mut cfg = config(&first.url(), &n);
    cfg.urls = vec![first.url(), second.url()];
    let sink = AmqpSink::new(cfg, node);
    let amqp = Arc::clone(sink.metrics());
    let (tx, metrics, handle) = spawn_run(sink, node);
    let conn = connect_test_client().await;
    let channel = conn.create_channel().await.expect("channel");

    send_batches(&tx, node, 0..5).await;
    consume_until(&channel, &n.queue, &(0..5).collect::<Vec<_>>()).await;
    assert_eq!(amqp.failovers_total(), 0, "the first endpoint took them");

    // The node in use dies for good: the next endpoint takes over.
    first.set(Mode::Down);
    send_batches(&tx, node, 5..20).await;
    drop(tx);
    tokio::time::timeout(PATIENCE, handle)
        .await
        .expect("the egress loop drained through the second endpoint")
        .expect("the egress loop did not panic");
    let seen = consume_until(&channel, &n.queue, &(5..20).collect::<Vec<_>>()).await;
    let got = counts(&seen);
    assert!((5..20).all(|s| got.contains_key(&s)), "{got:?}");
    assert_eq!(metrics.batches_confirmed.get(), 20);
    assert_eq!(amqp.failovers_total(), 1);
    let shown = |p: &Proxy| format!("amqp://guest@{}:{}/%2f", p.addr.ip(), p.addr.port());
    assert_eq!(
        (
            amqp.endpoint_in_use(&shown(&first)),
            amqp.endpoint_in_use(&shown(&second))
        ),
        (0, 1),
        "the endpoint in use is the second"
    );
    cleanup(&channel, &n).await;
}

#[tokio::test]
async fn a_lasting_block_moves_to_the_next_endpoint_and_is_measured() {
    logs();
    let n = names("block-failover");
    let node = node_id(11);
    let (first, second) = (Proxy::start().await, Proxy::start().await);
    let mut cfg = config(&first.url(), &n);
    cfg.urls = vec![first.url(), second.url()];
    cfg.blocked_failover_after = Duration::from_millis(800);
    let mut sink = AmqpSink::new(cfg, node);
    let amqp = Arc::clone(sink.metrics());
    deliver_retrying(&mut sink, &encoded(node, 0))
        .await
        .expect("delivered before the alarm");

    first.inject(connection_blocked("low on disk"));
    eventually("the block to show in the metrics", || amqp.is_blocked()).await;
    // Held while blocked, then given up for the second endpoint: the
    // delivery fails once (the egress loop retries it) and the retry goes
    // through the other node.
    match deliver(&mut sink, &encoded(node, 1)).await {
        Err(SinkError::Unavailable(why)) => {
            assert!(
                why.contains("low on disk") && why.contains("blocked_failover_after"),
                "{why}"
            )
        }
        other => panic!("a lasting block must give up the endpoint, got {other:?}"),
    }
    assert!(!amqp.is_blocked(), "the blocked connection is gone");
    deliver_retrying(&mut sink, &encoded(node, 1))
        .await
        .expect("delivered through the second endpoint");
    assert_eq!(amqp.failovers_total(), 1);

    assert_eq!(
        amqp.blocks_total("low on disk"),
        1,
        "the block and its reason"
    );
    assert!(amqp.blocked_seconds() >= 0.8, "{}", amqp.blocked_seconds());
    let conn = connect_test_client().await;
    let channel = conn.create_channel().await.expect("channel");
    let seen = consume_until(&channel, &n.queue, &[0, 1]).await;
    assert!(counts(&seen).contains_key(&1));
    cleanup(&channel, &n).await;
}

#[tokio::test]
async fn nacked_batches_are_counted_and_published_again() {
    logs();
    let n = names("nack");
    let node = node_id(12);
    let mut cfg = config(URL, &n);
    // A full queue that rejects publishes: RabbitMQ nacks them.
    cfg.queue_arguments = vec![
        ("x-max-length".into(), weir::config::QueueArgument::Int(2)),
        (
            "x-overflow".into(),
            weir::config::QueueArgument::Str("reject-publish".into()),
        ),
    ];
    cfg.max_in_flight = 1;
    let sink = AmqpSink::new(cfg, node);
    let amqp = Arc::clone(sink.metrics());
    let (tx, metrics, handle) = spawn_run(sink, node);
    send_batches(&tx, node, 0..5).await;
    eventually("a publish to the full queue to be nacked", || {
        amqp.nacks.get() > 0
    })
    .await;
    assert_eq!(metrics.batches_confirmed.get(), 2, "two fit the queue");
    assert_eq!(amqp.timeouts.get(), 0, "a nack is not a timeout");
    // A consumer makes room: the nacked batches go through on a retry.
    let conn = connect_test_client().await;
    let channel = conn.create_channel().await.expect("channel");
    let seen = consume_until(&channel, &n.queue, &(0..5).collect::<Vec<_>>()).await;
    let got = counts(&seen);
    assert!((0..5).all(|s| got.contains_key(&s)), "{got:?}");
    drop(tx);
    tokio::time::timeout(PATIENCE, handle)
        .await
        .expect("drained")
        .expect("no panic");
    assert_eq!(metrics.batches_confirmed.get(), 5);
    channel
        .queue_delete(n.queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .expect("delete the test queue");
    cleanup_exchange(&channel, &n).await;
}

async fn cleanup_exchange(channel: &Channel, n: &Names) {
    channel
        .exchange_delete(n.exchange.as_str().into(), ExchangeDeleteOptions::default())
        .await
        .expect("delete the test exchange");
}

#[tokio::test]
async fn a_nack_moves_publishing_to_a_new_channel() {
    logs();
    let n = names("nack-channel");
    let node = node_id(13);
    let mut cfg = config(URL, &n);
    cfg.queue_arguments = vec![
        ("x-max-length".into(), weir::config::QueueArgument::Int(1)),
        (
            "x-overflow".into(),
            weir::config::QueueArgument::Str("reject-publish".into()),
        ),
    ];
    let mut sink = AmqpSink::new(cfg, node);
    deliver_retrying(&mut sink, &encoded(node, 0))
        .await
        .expect("the first fits");
    let before = sink.channel_id().expect("connected");
    match deliver(&mut sink, &encoded(node, 1)).await {
        Err(SinkError::Refused(why)) => assert!(why.contains("nacked"), "{why}"),
        other => panic!("a full reject-publish queue nacks, got {other:?}"),
    }
    // The retry goes out on a fresh channel of the same connection (a
    // channel refused while a quorum queue changed leader stays refused).
    let _ = deliver(&mut sink, &encoded(node, 1)).await;
    let after = sink.channel_id().expect("still connected");
    assert_ne!(before, after, "a new channel after the nack");
    assert_eq!(sink.metrics().failovers_total(), 0, "the same connection");
    let conn = connect_test_client().await;
    let channel = conn.create_channel().await.expect("channel");
    cleanup(&channel, &n).await;
}

/// The urgent lane end to end (`egress.amqp.urgent_lane`): a proxy passes
/// weir's publishes to RabbitMQ but holds the broker's replies, so the
/// window of unconfirmed batches (2) fills with `lt` and stays full; an
/// `ls` record that arrives then still reaches RabbitMQ, in a batch of its
/// own beyond the window. (Without the lane it would wait for a confirm,
/// and the consumer would not see it until the replies flow.) Once they
/// do, every record arrives, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_urgent_lane_delivers_an_urgent_record_while_confirms_are_held() {
    logs();
    let name = unique("urgent-lane");
    let queue = format!("{name}.q");
    common::amqp::delete_queue(&queue).await;
    let proxy = Proxy::start().await;
    let text = format!(
        r#"
[node]
id = {node}
[[classify.route]]
grpc = "ls"
class = "ls"
{grpc}
[egress]
kind = "amqp"
[egress.amqp]
url = "{url}"
exchange = "{name}.x"
queue = "{queue}"
routing_key = "{name}"
max_in_flight = 2
urgent_lane = true
confirm_timeout = "120s"
"#,
        node = node_id(15),
        grpc = common::process::GRPC_ONLY,
        url = proxy.url(),
    );
    let app = weir::app::App::start(parse_config(&text, "urgent-lane"))
        .await
        .expect("weir starts");
    let put = |stream: &'static str, payload: String| {
        let record = app.ingress.grpc_record(stream, Bytes::from(payload));
        let ingress = Arc::clone(&app.ingress);
        async move {
            ingress
                .enqueue(record, Some(PATIENCE))
                .await
                .expect("room in the queue");
        }
    };
    // Connected and flowing: the first record arrives.
    put("bulk", "lt-first".into()).await;
    let first = common::amqp::consume_until(&queue, |s| !s.is_empty()).await;
    assert_eq!(first.len(), 1);

    proxy.set(Mode::HoldReplies);
    // One lt batch after another until the window is full and more wait.
    for i in 0..6 {
        put("bulk", format!("lt-{i}")).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    put("ls", "ls-urgent".into()).await;
    let held =
        common::amqp::consume_until(&queue, |s| s.iter().any(|r| r.record.class == "ls")).await;
    let classes: Vec<&str> = held.iter().map(|r| r.record.class.as_str()).collect();
    assert!(
        classes.contains(&"ls"),
        "the ls record reached RabbitMQ while its confirms were held: {classes:?}"
    );
    assert!(
        classes.iter().filter(|c| **c == "lt").count() < 6,
        "the window was full of lt, so some waited: {classes:?}"
    );
    assert!(
        app.ingress.metrics().urgent_lane_batches.get() >= 1,
        "counted in weir_urgent_lane_batches_total"
    );

    proxy.set(Mode::Pass);
    let rest = common::amqp::consume_until(&queue, |s| held.len() + s.len() >= 7).await;
    app.shutdown(Duration::from_secs(30)).await;
    common::amqp::delete_queue(&queue).await;
    let mut payloads: Vec<String> = held
        .iter()
        .chain(&rest)
        .map(|r| String::from_utf8_lossy(&r.record.payload).into_owned())
        .collect();
    payloads.sort();
    let mut want: Vec<String> = (0..6).map(|i| format!("lt-{i}")).collect();
    want.push("ls-urgent".into());
    want.sort();
    assert_eq!(payloads, want, "every record once, none lost");
}
