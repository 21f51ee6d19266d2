//! The test Kafka broker (scripts/kafka.sh, started by
//! scripts/services.sh): weir's `[egress.kafka]` section pointing at it,
//! topics made on purpose (the broker creates none on first use), a reader
//! that decodes weir batches from a topic, and killing and restarting the
//! broker.

use std::path::PathBuf;
use std::time::Duration;

use rskafka::client::partition::{OffsetAt, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};

use super::amqp::Seen;
use super::PATIENCE;

/// The test broker.
pub const BROKER: &str = "127.0.0.1:9092";

/// The test broker's SASL over TLS listener (user `weir`, password
/// `weir-secret`; PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512).
pub const SASL_BROKER: &str = "127.0.0.1:9094";

/// The test broker's TLS listener that asks for a client certificate from
/// the test CA ([`tls_file`] `client.pem` and `client.key`).
pub const TLS_BROKER: &str = "127.0.0.1:9095";

/// A file of the test TLS material made by scripts/kafka.sh: `ca.pem`
/// (the CA of the broker's certificate and of `client.pem`),
/// `client.pem`, `client.key`, and `other-client.pem` / `.key` from a CA
/// the broker does not trust.
pub fn tls_file(name: &str) -> PathBuf {
    let home = std::env::var("WEIR_KAFKA_HOME").unwrap_or_else(|_| "/opt/weir-kafka".into());
    std::path::Path::new(&home).join("tls").join(name)
}

/// The `[egress]` section producing to `topic` on the test broker;
/// further `[egress.kafka]` keys may follow it.
pub fn kafka_egress(topic: &str) -> String {
    format!(
        "[egress]\nkind = \"kafka\"\n[egress.kafka]\nbrokers = [\"{BROKER}\"]\ntopic = \"{topic}\""
    )
}

/// A client of the test's own; panics saying how to start the broker if
/// it is not there.
pub async fn client() -> Client {
    client_at(&[BROKER]).await
}

/// A client bootstrapped from `brokers`.
pub async fn client_at(brokers: &[&str]) -> Client {
    let list: Vec<String> = brokers.iter().map(|b| (*b).to_owned()).collect();
    tokio::time::timeout(PATIENCE, ClientBuilder::new(list).build())
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_else(|| {
            panic!(
                "Kafka is not reachable at {brokers:?}; start it with `bash scripts/services.sh`"
            )
        })
}

/// A topic name for `test` unique to this run: the broker keeps its topics
/// across runs, and a later process may get the same pid.
pub fn topic_name(test: &str) -> String {
    format!("{}-{}", super::unique(test), weir::clock::unix_micros())
}

/// Creates `topic` with `partitions` partitions.
pub async fn create_topic(topic: &str, partitions: i32) {
    let c = client().await;
    c.controller_client()
        .unwrap()
        .create_topic(topic, partitions, 1, 10_000)
        .await
        .unwrap_or_else(|e| panic!("creating topic {topic}: {e}"));
}

/// Every weir record in `topic` (all partitions), once `done` says the
/// records read so far are enough, or after [`PATIENCE`].
pub async fn read_until(topic: &str, done: impl FnMut(&[Seen]) -> bool) -> Vec<Seen> {
    read_until_at(&[BROKER], topic, done).await
}

/// [`read_until`] from the cluster that `brokers` bootstrap.
pub async fn read_until_at(
    brokers: &[&str],
    topic: &str,
    mut done: impl FnMut(&[Seen]) -> bool,
) -> Vec<Seen> {
    let c = client_at(brokers).await;
    let partitions = c
        .list_topics()
        .await
        .unwrap()
        .into_iter()
        .find(|t| t.name == topic)
        .unwrap_or_else(|| panic!("topic {topic} exists"))
        .partitions;
    let mut readers = Vec::new();
    for p in partitions {
        let pc = c
            .partition_client(topic, p, UnknownTopicHandling::Retry)
            .await
            .unwrap();
        let start = pc.get_offset(OffsetAt::Earliest).await.unwrap();
        readers.push((pc, start));
    }
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !done(&seen) && tokio::time::Instant::now() < deadline {
        for (pc, next) in &mut readers {
            let (records, _high) = pc.fetch_records(*next, 1..(16 << 20), 200).await.unwrap();
            for r in records {
                *next = r.offset + 1;
                let header = |name: &str| {
                    String::from_utf8(r.record.headers.get(name).cloned().unwrap_or_default())
                        .unwrap()
                };
                let encoding = header("weir-encoding");
                let value = r.record.value.unwrap_or_default();
                let batch = weir_proto::decode_batch(&value, &encoding, 64 << 20)
                    .expect("every Kafka record is a weir batch");
                assert_eq!(header("weir-node"), batch.node.to_string());
                let consumed_us = weir::clock::unix_micros();
                for record in batch.records {
                    seen.push(Seen {
                        record,
                        consumed_us,
                        encoding: encoding.clone(),
                        batch_node: batch.node,
                    });
                }
            }
        }
    }
    seen
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/kafka.sh")
}

/// Kills the broker with SIGKILL (a crash: no clean shutdown).
pub fn kill_broker() {
    let home = std::env::var("WEIR_KAFKA_HOME").unwrap_or_else(|_| "/opt/weir-kafka".into());
    let pid = std::fs::read_to_string(format!("{home}/kafka.pid"))
        .expect("scripts/kafka.sh started the broker");
    let status = std::process::Command::new("kill")
        .args(["-9", pid.trim()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -9 {pid}");
}

/// Starts the broker again (on its data) and waits until it serves
/// metadata.
pub fn start_broker() {
    let status = std::process::Command::new("bash")
        .arg(script())
        .status()
        .expect("bash scripts/kafka.sh");
    assert!(
        status.success(),
        "scripts/kafka.sh failed to start the broker"
    );
}

/// Starts the broker again when dropped, even if the test panics midway.
pub struct StartGuard;

impl Drop for StartGuard {
    fn drop(&mut self) {
        let _ = std::process::Command::new("bash").arg(script()).status();
    }
}

/// How long the broker stays down in the fault tests.
pub const DOWN: Duration = Duration::from_secs(3);
