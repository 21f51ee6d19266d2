//! Helpers shared by the end-to-end tests: configs with loopback listeners,
//! a RabbitMQ consumer that decodes weir batches, unique names, metrics
//! scraped from the admin listener; `peering` holds the three-node peering
//! scenario.
#![allow(dead_code)]

pub mod peering;

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use weir_proto::pb;

/// The test RabbitMQ (scripts/services.sh starts it).
pub const AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// Bounds every wait so that a broken test fails instead of hanging.
pub const PATIENCE: Duration = Duration::from_secs(90);

/// The `[egress]` section publishing to the test RabbitMQ with exchange
/// `<name>.x`, queue `<name>.q` and routing key `<name>`; further
/// `[egress.amqp]` keys may follow it.
pub fn amqp_egress(name: &str) -> String {
    format!(
        "[egress]\nkind = \"amqp\"\n[egress.amqp]\nurl = \"{AMQP_URL}\"\nexchange = \"{name}.x\"\nqueue = \"{name}.q\"\nrouting_key = \"{name}\""
    )
}

/// A name unique to this process and `test`.
pub fn unique(test: &str) -> String {
    format!("weir-e2e-{}-{test}", std::process::id())
}

/// A record as the cloud saw it, with when it was consumed.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The record.
    pub record: pb::Record,
    /// When the consumer got it, microseconds since the Unix epoch.
    pub consumed_us: u64,
    /// The AMQP message's content encoding.
    pub encoding: String,
    /// The node that sent the batch (differs from the record's origin when
    /// a peer carried it).
    pub batch_node: u64,
}

/// Microseconds since the Unix epoch.
pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// How long the consumer keeps listening after `done` is satisfied, so that
/// a duplicate has the chance to show up before a test judges.
pub const LINGER: Duration = Duration::from_secs(2);

/// How often [`consume_until`] asks `done` again while no message comes.
const RECHECK: Duration = Duration::from_millis(100);

/// Consumes weir batches from `queue` until `done` says the records seen so
/// far are enough (then lingers [`LINGER`] for stragglers), or `PATIENCE`
/// passes; acks every message.
pub async fn consume_until(queue: &str, mut done: impl FnMut(&[Seen]) -> bool) -> Vec<Seen> {
    let conn = Connection::connect(AMQP_URL, ConnectionProperties::default())
        .await
        .expect("RabbitMQ on 127.0.0.1:5672 (run scripts/services.sh)");
    let ch = conn.create_channel().await.unwrap();
    ch.queue_declare(
        queue.into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    let mut consumer = ch
        .basic_consume(
            queue.into(),
            "e2e-consumer".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let now = tokio::time::Instant::now();
        let lingering = done(&seen);
        // `done` may also depend on things other than the records (the
        // test's own progress): look again at least this often.
        let until = if lingering {
            now + LINGER
        } else {
            deadline.min(now + RECHECK)
        };
        let delivery = match tokio::time::timeout_at(until, consumer.next()).await {
            Ok(Some(Ok(delivery))) => delivery,
            Ok(_) => break,
            Err(_) if lingering || until >= deadline => break,
            Err(_) => continue,
        };
        let consumed_us = now_us();
        let encoding = delivery
            .properties
            .content_encoding()
            .as_ref()
            .map(|s| s.to_string())
            .unwrap_or_default();
        let batch = weir_proto::decode_batch(&delivery.data, &encoding, 64 << 20)
            .expect("every message is a weir batch");
        for record in batch.records {
            seen.push(Seen {
                record,
                consumed_us,
                encoding: encoding.clone(),
                batch_node: batch.node,
            });
        }
        delivery.ack(BasicAckOptions::default()).await.unwrap();
    }
    let _ = conn.close(200, "done".into()).await;
    seen
}

/// Deletes a queue (and its messages).
pub async fn delete_queue(queue: &str) {
    if let Ok(conn) = Connection::connect(AMQP_URL, ConnectionProperties::default()).await {
        if let Ok(ch) = conn.create_channel().await {
            let _ = ch
                .queue_delete(queue.into(), QueueDeleteOptions::default())
                .await;
        }
        let _ = conn.close(200, "done".into()).await;
    }
}

/// Counts of each (origin, seq) among `seen`.
pub fn counts(seen: &[Seen]) -> HashMap<(u64, u64), usize> {
    let mut m = HashMap::new();
    for s in seen {
        *m.entry((s.record.origin, s.record.seq)).or_insert(0) += 1;
    }
    m
}

/// Waits until `path` answers TCP connections.
pub async fn wait_port(addr: std::net::SocketAddr) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{addr} never answered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The Prometheus text of the admin listener at `addr` (`GET /metrics`).
pub async fn scrape(addr: std::net::SocketAddr) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(addr).await?;
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: weir\r\n\r\n")
        .await?;
    let mut text = String::new();
    conn.read_to_string(&mut text).await?;
    match text.split_once("\r\n\r\n") {
        // HTTP/1.0: the body is not chunked and ends with the connection.
        Some((head, body)) if head.starts_with("HTTP/1.0 200") => Ok(body.to_owned()),
        _ => Err(std::io::Error::other(format!(
            "unexpected answer from {addr}/metrics: {text}"
        ))),
    }
}

/// The sum of every series of `name` (all label sets) in Prometheus text;
/// 0 when there is none.
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let value = if rest.starts_with('{') {
                rest.rsplit_once(' ')?.1
            } else {
                rest.strip_prefix(' ')?
            };
            value.trim().parse::<f64>().ok()
        })
        .sum()
}
