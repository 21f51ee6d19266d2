//! The test RabbitMQ (scripts/services.sh starts it): weir's
//! `[egress.amqp]` section pointing at it, a consumer that decodes weir
//! batches, queue clean-up.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use weir_proto::pb;

use super::{tally, PATIENCE};

/// The test RabbitMQ's address.
pub const BROKER: &str = "127.0.0.1:5672";

/// The test RabbitMQ, as guest.
pub const AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// The `[egress]` section publishing to the test RabbitMQ with exchange
/// `<name>.x`, queue `<name>.q` and routing key `<name>`; further
/// `[egress.amqp]` keys may follow it.
pub fn amqp_egress(name: &str) -> String {
    format!(
        "[egress]\nkind = \"amqp\"\n[egress.amqp]\nurl = \"{AMQP_URL}\"\nexchange = \"{name}.x\"\nqueue = \"{name}.q\"\nrouting_key = \"{name}\""
    )
}

/// A connection of the test's own to RabbitMQ; panics saying how to start
/// it if it is not there.
pub async fn connect_test_client() -> Connection {
    bounded(
        "connecting",
        Connection::connect(AMQP_URL, ConnectionProperties::default()),
    )
    .await
    .unwrap_or_else(|e| {
        panic!("RabbitMQ is not reachable at {BROKER} as guest/guest ({e}); start it with `bash scripts/services.sh`")
    })
}

/// Awaits one exchange with the test broker, or panics naming `what` after
/// [`PATIENCE`]: a broker that accepts the connection and then never
/// answers (booting, or left alarmed by an earlier test) fails the test
/// with a reason instead of hanging the suite.
pub async fn bounded<T>(what: &str, step: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, step)
        .await
        .unwrap_or_else(|_| {
            panic!("RabbitMQ at {BROKER} did not answer {what} within {PATIENCE:?}")
        })
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

/// How long the consumer keeps listening after `done` is satisfied, so that
/// a duplicate has the chance to show up before a test judges.
pub const LINGER: Duration = Duration::from_secs(2);

/// How often [`consume_until`] asks `done` again while no message comes.
const RECHECK: Duration = Duration::from_millis(100);

/// Consumes weir batches from `queue` until `done` says the records seen so
/// far are enough (then lingers [`LINGER`] for stragglers), or `PATIENCE`
/// passes; acks every message.
pub async fn consume_until(queue: &str, mut done: impl FnMut(&[Seen]) -> bool) -> Vec<Seen> {
    let conn = connect_test_client().await;
    let ch = bounded("a channel", conn.create_channel()).await.unwrap();
    let declare = ch.queue_declare(
        queue.into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    );
    bounded("queue.declare", declare).await.unwrap();
    let consume = ch.basic_consume(
        queue.into(),
        "e2e-consumer".into(),
        BasicConsumeOptions::default(),
        FieldTable::default(),
    );
    let mut consumer = bounded("basic.consume", consume).await.unwrap();
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
        let consumed_us = weir::clock::unix_micros();
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
        bounded("basic.ack", delivery.ack(BasicAckOptions::default()))
            .await
            .unwrap();
    }
    let _ = bounded("closing", conn.close(200, "done".into())).await;
    seen
}

/// Deletes a queue (and its messages).
pub async fn delete_queue(queue: &str) {
    let connect = Connection::connect(AMQP_URL, ConnectionProperties::default());
    if let Ok(conn) = bounded("connecting", connect).await {
        if let Ok(ch) = bounded("a channel", conn.create_channel()).await {
            let delete = ch.queue_delete(queue.into(), QueueDeleteOptions::default());
            let _ = bounded("queue.delete", delete).await;
        }
        let _ = bounded("closing", conn.close(200, "done".into())).await;
    }
}

/// Counts of each (origin, seq) among `seen`.
pub fn counts(seen: &[Seen]) -> BTreeMap<(u64, u64), usize> {
    tally(seen.iter().map(|s| (s.record.origin, s.record.seq)))
}

/// Runs `rabbitmqctl` with `args` against the test broker; panics if it
/// fails. Tests that stop the broker have a binary of their own, so no
/// other test runs while it is down.
pub fn rabbitmqctl(args: &[&str]) {
    let status = std::process::Command::new("rabbitmqctl")
        .args(args)
        .status()
        .expect("rabbitmqctl (run scripts/services.sh)");
    assert!(status.success(), "rabbitmqctl {args:?} failed");
}

/// Starts the broker's app again when dropped, even if the test panics
/// midway.
pub struct RestartGuard;

impl Drop for RestartGuard {
    fn drop(&mut self) {
        let _ = std::process::Command::new("rabbitmqctl")
            .arg("start_app")
            .status();
    }
}
