//! Kafka egress: each batch is one Kafka record, produced with
//! `acks = all` to a Kafka-protocol service (Apache Kafka, Redpanda,
//! Amazon MSK, Confluent, Azure Event Hubs' Kafka endpoint) through
//! [`rskafka`], a pure-Rust client.
//!
//! A batch's Kafka record carries weir's batch body as its value, exactly
//! as the AMQP sink publishes it (`weir.v1.Batch`, compressed or not), and
//! its metadata as headers: `weir-encoding` (`identity`, `gzip`, `zstd`),
//! `weir-node`, `weir-batch-seq`, `weir-records`, `weir-class` and
//! `weir-sent-us` (decimal text). Its key is the node id, so one node's
//! batches go to one partition (the node id modulo the topic's partition
//! count) and stay in order there; its timestamp is the send time.
//!
//! The batch counts as confirmed when the broker answers the produce
//! request: with `acks = all`, once every in-sync replica has it. Produce
//! requests are pipelined on the client's connection to the leader, up to
//! `egress.kafka.max_in_flight` of them, by one writer task that issues
//! them in sending order. A request that fails or takes longer than
//! `egress.kafka.request_timeout` (the client retries inside that time,
//! following leader changes) fails its batch, and the delivery machine
//! sends it again: a batch may then be in the topic twice, which
//! consumers drop by `(node, batch seq)` or by the records' `(origin,
//! seq)`. The client has no idempotent producer.
//!
//! At start-up the sink connects and checks that every class's topic
//! exists (or that the brokers create it on first use); a topic that is
//! missing and may not be created stops start-up with a message naming
//! `egress.kafka.topic`. Brokers that cannot be reached are not an error:
//! the delivery machine keeps trying, and spooled classes keep
//! acknowledging meanwhile.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use rskafka::chrono;
use rskafka::client::error::{Error as KafkaError, ProtocolError};
use rskafka::client::partition::{Compression, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder, Credentials, SaslConfig};
use rskafka::record::Record;
use rskafka::BackoffConfig;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use weir_core::backoff::Retry;
use weir_core::{ClassSet, NodeId};

use super::batch::EncodedBatch;
use super::sink::{Confirm, Sink, SinkError};
use crate::config::{KafkaEgress, SaslMechanism};

/// Headers of a batch's Kafka record (decimal text values).
pub const HEADER_ENCODING: &str = "weir-encoding";
pub use super::amqp::{
    HEADER_BATCH_SEQ, HEADER_CLASS, HEADER_NODE, HEADER_RECORDS, HEADER_SENT_US,
};

/// Why start-up stops: a topic that is missing and may not be created, or
/// brokers that refuse weir (its SASL credentials, or their certificate
/// not trusted).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{key}: {message}")]
pub struct RefusedError {
    /// The config key to change.
    pub key: &'static str,
    /// Which topic, and what to do.
    pub message: String,
}

/// Produces batches to a Kafka-protocol service.
pub struct KafkaSink {
    cfg: KafkaEgress,
    node: NodeId,
    /// Class names by class id.
    classes: Vec<String>,
    /// The client and its partition clients, once connected.
    conn: Option<Connected>,
    retry: Retry<Instant>,
}

struct Connected {
    client: Client,
    /// One partition client per topic: the partition this node writes.
    partitions: HashMap<String, Arc<PartitionClient>>,
    /// Produce requests for the writer task, in sending order.
    jobs: mpsc::UnboundedSender<Job>,
}

/// One produce request, and where its outcome goes.
struct Job {
    partition: Arc<PartitionClient>,
    record: Record,
    done: oneshot::Sender<Result<(), SinkError>>,
}

impl fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSink")
            .field("brokers", &self.cfg.brokers)
            .field("topic", &self.cfg.topic)
            .field("connected", &self.conn.is_some())
            .finish()
    }
}

impl KafkaSink {
    /// A sink for `cfg`, producing as `node`; connects on
    /// [`KafkaSink::start`] or the first send.
    pub fn new(cfg: KafkaEgress, node: NodeId, classes: &ClassSet) -> KafkaSink {
        KafkaSink {
            node,
            classes: classes.iter().map(|(_, c)| c.name.clone()).collect(),
            conn: None,
            retry: Retry::new(Duration::from_millis(200), cfg.reconnect_backoff_max),
            cfg,
        }
    }

    /// Connects and checks every class's topic. A missing topic the
    /// brokers will not create is an error; brokers out of reach are not
    /// (logged; sending retries).
    pub async fn start(&mut self) -> Result<(), RefusedError> {
        if let Some(refused) = self.refusal().await {
            return Err(refused);
        }
        match self.connect().await {
            Ok(()) => {}
            Err(ConnectError::Topic(e)) => return Err(e),
            Err(ConnectError::Unavailable(why)) => {
                tracing::warn!(error = %why, "Kafka not reachable at start-up; batches wait (spooled classes keep acknowledging) and delivery retries");
                return Ok(());
            }
        }
        let topics: Vec<String> = {
            let mut t: Vec<String> = self
                .classes
                .iter()
                .map(|c| self.cfg.topic_for(self.node, c))
                .collect();
            t.sort();
            t.dedup();
            t
        };
        for topic in topics {
            match self.partition(&topic).await {
                Ok(_) => {}
                Err(ConnectError::Topic(e)) => return Err(e),
                Err(ConnectError::Unavailable(why)) => {
                    tracing::warn!(%topic, error = %why, "Kafka topic not checked at start-up; delivery retries");
                }
            }
        }
        Ok(())
    }

    /// Whether the brokers refuse weir outright: its SASL credentials, or a
    /// certificate the TLS client does not trust. One short attempt (the
    /// client retries any failed connection until `request_timeout`, so a
    /// refusal would otherwise look like brokers out of reach). `None` when
    /// it connects, or the brokers are only out of reach.
    async fn refusal(&self) -> Option<RefusedError> {
        if self.cfg.tls.is_none() && self.cfg.sasl.is_none() {
            return None;
        }
        let builder = match client_builder(&self.cfg, format!("weir-{}", self.node)) {
            Ok(b) => b,
            Err(refused) => return Some(refused),
        }
        .backoff_config(BackoffConfig {
            init_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(200),
            base: 2.0,
            deadline: Some(Duration::from_millis(500)),
        });
        let error = match tokio::time::timeout(self.cfg.connect_timeout, builder.build()).await {
            Ok(Err(e)) => e,
            _ => return None,
        };
        refused(&self.cfg, &self.brokers(), &error)
    }

    /// Whether the sink holds a connection.
    pub fn is_connected(&self) -> bool {
        self.conn.is_some()
    }

    async fn connect(&mut self) -> Result<(), ConnectError> {
        let cfg = &self.cfg;
        let builder = client_builder(cfg, format!("weir-{}", self.node))
            .map_err(|e| ConnectError::Unavailable(format!("{}: {}", e.key, e.message)))?;
        let limit = cfg.connect_timeout;
        let client = match tokio::time::timeout(limit, builder.build()).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => {
                return Err(ConnectError::Unavailable(format!(
                    "{}: {e}",
                    self.brokers()
                )))
            }
            Err(_) => {
                return Err(ConnectError::Unavailable(format!(
                    "{}: connecting took longer than {limit:?} (egress.kafka.connect_timeout)",
                    self.brokers()
                )))
            }
        };
        let (jobs, rx) = mpsc::unbounded_channel();
        tokio::spawn(writer(rx, cfg.request_timeout));
        tracing::info!(brokers = %self.brokers(), "connected to Kafka");
        self.conn = Some(Connected {
            client,
            partitions: HashMap::new(),
            jobs,
        });
        Ok(())
    }

    fn brokers(&self) -> String {
        self.cfg.brokers.join(",")
    }

    /// The partition client this node writes `topic` through.
    async fn partition(&mut self, topic: &str) -> Result<Arc<PartitionClient>, ConnectError> {
        let conn = self.conn.as_mut().expect("connected");
        if let Some(p) = conn.partitions.get(topic) {
            return Ok(Arc::clone(p));
        }
        let within = |what: &'static str| {
            move |_| {
                ConnectError::Unavailable(format!("{what} took longer than the request timeout"))
            }
        };
        let limit = self.cfg.request_timeout;
        // Asking for the topic's metadata creates it where the brokers do
        // that on first use (auto.create.topics.enable).
        let probe = tokio::time::timeout(
            limit,
            conn.client
                .partition_client(topic, 0, UnknownTopicHandling::Error),
        )
        .await
        .map_err(within("asking for the topic"))?;
        if let Err(e) = probe {
            return Err(topic_error(topic, e));
        }
        let listed = tokio::time::timeout(limit, conn.client.list_topics())
            .await
            .map_err(within("listing the topics"))?
            .map_err(|e| ConnectError::Unavailable(e.to_string()))?;
        let count = listed
            .iter()
            .find(|t| t.name == topic)
            .map_or(1, |t| t.partitions.len().max(1));
        let index = (self.node % count as u64) as i32;
        let client = tokio::time::timeout(
            limit,
            conn.client
                .partition_client(topic, index, UnknownTopicHandling::Error),
        )
        .await
        .map_err(within("asking for the partition"))?
        .map_err(|e| topic_error(topic, e))?;
        tracing::info!(
            topic,
            partition = index,
            partitions = count,
            "producing to Kafka"
        );
        let client = Arc::new(client);
        conn.partitions
            .insert(topic.to_owned(), Arc::clone(&client));
        Ok(client)
    }

    async fn send_batch(&mut self, batch: &EncodedBatch) -> Result<Confirm, SinkError> {
        if self.conn.is_none() {
            if let Some(at) = self.retry.not_before() {
                tokio::time::sleep_until(at).await;
            }
            if let Err(e) = self.connect().await {
                self.retry.failed(Instant::now());
                return Err(e.into());
            }
        }
        let class = self
            .classes
            .get(usize::from(batch.class.0))
            .map_or("", String::as_str);
        let topic = self.cfg.topic_for(self.node, class);
        let partition = match self.partition(&topic).await {
            Ok(p) => p,
            Err(e) => {
                self.drop_connection();
                return Err(e.into());
            }
        };
        let (done, outcome) = oneshot::channel();
        let job = Job {
            partition,
            record: record(batch),
            done,
        };
        let sent = self.conn.as_ref().is_some_and(|c| c.jobs.send(job).is_ok());
        if !sent {
            self.drop_connection();
            return Err(SinkError::Unavailable("the Kafka writer stopped".into()));
        }
        self.retry.succeeded();
        Ok(Box::pin(async move {
            match outcome.await {
                Ok(result) => result,
                Err(_) => Err(SinkError::Unavailable("the Kafka writer stopped".into())),
            }
        }))
    }

    fn drop_connection(&mut self) {
        if self.conn.take().is_some() {
            self.retry.failed(Instant::now());
        }
    }
}

impl Sink for KafkaSink {
    async fn send(&mut self, batch: &EncodedBatch) -> Result<Confirm, SinkError> {
        self.send_batch(batch).await
    }

    fn window(&self) -> usize {
        self.cfg.max_in_flight.max(1)
    }

    fn name(&self) -> &'static str {
        "kafka"
    }
}

/// A client for `cfg`'s brokers, with its TLS and SASL, as `client_id`.
/// The client retries (leader changes, reconnects) for at most
/// `request_timeout`; then the request fails and the caller (the delivery
/// machine, which knows the other batches in flight) takes over.
pub(crate) fn client_builder(
    cfg: &KafkaEgress,
    client_id: String,
) -> Result<ClientBuilder, RefusedError> {
    let mut builder = ClientBuilder::new(cfg.brokers.clone())
        .client_id(client_id)
        .backoff_config(BackoffConfig {
            init_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(500),
            base: 2.0,
            deadline: Some(cfg.request_timeout),
        });
    if let Some(tls) = &cfg.tls {
        const KEYS: crate::security::tls::SinkKeys = [
            "egress.kafka.ca_file",
            "egress.kafka.cert_file",
            "egress.kafka.key_file",
        ];
        let config = crate::security::tls::sink_client_config(KEYS, &tls.files)
            .map_err(|(key, message)| RefusedError { key, message })?;
        builder = builder.tls_config(Arc::new(config));
    }
    if let Some(sasl) = &cfg.sasl {
        let c = Credentials::new(sasl.username.clone(), sasl.password.clone());
        builder = builder.sasl_config(match sasl.mechanism {
            SaslMechanism::Plain => SaslConfig::Plain(c),
            SaslMechanism::ScramSha256 => SaslConfig::ScramSha256(c),
            SaslMechanism::ScramSha512 => SaslConfig::ScramSha512(c),
            // The config keeps no credentials without a mechanism.
            SaslMechanism::None => {
                return Err(RefusedError {
                    key: "egress.kafka.sasl_mechanism",
                    message: "SASL credentials without a mechanism".into(),
                })
            }
        });
    }
    Ok(builder)
}

/// A refusal among the client's errors. rskafka keeps the causes of a
/// failed connection in a list inside its retry error, without types to
/// match on, so their names are looked for in its description: a SASL
/// failure, or a certificate rustls refused.
fn refused(
    cfg: &KafkaEgress,
    brokers: &str,
    e: &rskafka::client::error::Error,
) -> Option<RefusedError> {
    let shown = format!("{e:?}");
    if shown.contains("SaslFailed") {
        let (mechanism, user) = cfg
            .sasl
            .as_ref()
            .map_or(("", ""), |s| (s.mechanism.as_str(), s.username.as_str()));
        return Some(RefusedError {
            key: "egress.kafka.username",
            message: format!("{brokers} refused weir's SASL {mechanism} login as `{user}` (check username, password and sasl_mechanism): {e}"),
        });
    }
    if shown.contains("AlertReceived") {
        let why = match cfg
            .tls
            .as_ref()
            .is_some_and(|t| t.files.client_cert.is_some())
        {
            true => "is cert_file signed by a CA the brokers trust?",
            false => "the brokers may want a client certificate: set cert_file and key_file",
        };
        return Some(RefusedError {
            key: "egress.kafka.cert_file",
            message: format!("{brokers} refused weir's TLS connection ({why}): {e}"),
        });
    }
    if shown.contains("InvalidCertificate") {
        return Some(RefusedError {
            key: "egress.kafka.ca_file",
            message: format!("{brokers}: the broker's TLS certificate is not trusted (set ca_file to its CA): {e}"),
        });
    }
    None
}

/// The Kafka record of a batch (see the module docs).
fn record(batch: &EncodedBatch) -> Record {
    let mut headers = BTreeMap::new();
    headers.insert(
        HEADER_ENCODING.to_owned(),
        batch.encoding.as_str().as_bytes().to_vec(),
    );
    let mut number = |name: &str, n: u64| {
        headers.insert(name.to_owned(), n.to_string().into_bytes());
    };
    number(HEADER_NODE, batch.node);
    number(HEADER_BATCH_SEQ, batch.seq);
    number(HEADER_RECORDS, batch.records as u64);
    number(HEADER_CLASS, u64::from(batch.class.0));
    let now_us = crate::clock::unix_micros();
    number(HEADER_SENT_US, now_us);
    Record {
        key: Some(batch.node.to_string().into_bytes()),
        value: Some(batch.body.to_vec()),
        headers,
        timestamp: chrono::DateTime::from_timestamp_micros(now_us as i64).unwrap_or_default(),
    }
}

/// Issues produce requests in the order they come and reports each
/// outcome; several are in flight at once (pipelined on the connection).
async fn writer(mut jobs: mpsc::UnboundedReceiver<Job>, timeout: Duration) {
    let mut in_flight = FuturesUnordered::new();
    loop {
        tokio::select! {
            // New requests first, so that each is issued (first polled) in
            // sending order, right after the ones before it.
            biased;
            job = jobs.recv() => match job {
                Some(job) => in_flight.push(produce(job, timeout)),
                None => break,
            },
            Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
        }
    }
}

async fn produce(job: Job, timeout: Duration) {
    let Job {
        partition,
        record,
        done,
    } = job;
    let produced = tokio::time::timeout(
        timeout,
        partition.produce(vec![record], Compression::NoCompression),
    )
    .await;
    let outcome = match produced {
        Ok(Ok(_offsets)) => Ok(()),
        Ok(Err(e)) => Err(produce_error(partition.topic(), e)),
        Err(_) => Err(SinkError::Unavailable(format!(
            "no acknowledgement from Kafka within {timeout:?} (egress.kafka.request_timeout)"
        ))),
    };
    let _ = done.send(outcome);
}

fn produce_error(topic: &str, e: KafkaError) -> SinkError {
    match &e {
        KafkaError::ServerError {
            protocol_error:
                ProtocolError::MessageTooLarge
                | ProtocolError::RecordListTooLarge
                | ProtocolError::InvalidRecord,
            ..
        } => SinkError::Refused(format!("topic {topic}: {e}")),
        _ => SinkError::Unavailable(format!("topic {topic}: {e}")),
    }
}

/// Why connecting or finding a topic failed.
enum ConnectError {
    /// Retry later.
    Unavailable(String),
    /// The topic is missing and may not be created.
    Topic(RefusedError),
}

impl From<ConnectError> for SinkError {
    fn from(e: ConnectError) -> SinkError {
        match e {
            ConnectError::Unavailable(why) => SinkError::Unavailable(why),
            ConnectError::Topic(e) => SinkError::Refused(e.to_string()),
        }
    }
}

fn topic_error(topic: &str, e: KafkaError) -> ConnectError {
    match e {
        KafkaError::ServerError {
            protocol_error: ProtocolError::UnknownTopicOrPartition,
            ..
        } => ConnectError::Topic(RefusedError {
            key: "egress.kafka.topic",
            message: format!(
                "topic {topic:?} does not exist and the brokers do not create topics on first use (auto.create.topics.enable = false): create it (e.g. kafka-topics.sh --create --topic {topic}) or change egress.kafka.topic"
            ),
        }),
        KafkaError::ServerError {
            protocol_error: ProtocolError::TopicAuthorizationFailed,
            ..
        } => ConnectError::Topic(RefusedError {
            key: "egress.kafka.topic",
            message: format!("not authorized to write topic {topic:?}: grant this user WRITE and DESCRIBE on it, or change egress.kafka.topic"),
        }),
        other => ConnectError::Unavailable(format!("topic {topic}: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use weir_core::ClassId;
    use weir_proto::Encoding;

    #[test]
    fn a_batch_record_carries_the_body_and_its_metadata() {
        let batch = EncodedBatch {
            seq: 42,
            class: ClassId(2),
            records: 7,
            node: 9,
            body: Bytes::from_static(b"body"),
            encoding: Encoding::Zstd,
        };
        let r = record(&batch);
        assert_eq!(r.key.as_deref(), Some(&b"9"[..]));
        assert_eq!(r.value.as_deref(), Some(&b"body"[..]));
        let h = |name: &str| String::from_utf8(r.headers[name].clone()).unwrap();
        assert_eq!(h(HEADER_ENCODING), "zstd");
        assert_eq!(h(HEADER_NODE), "9");
        assert_eq!(h(HEADER_BATCH_SEQ), "42");
        assert_eq!(h(HEADER_RECORDS), "7");
        assert_eq!(h(HEADER_CLASS), "2");
        assert!(h(HEADER_SENT_US).parse::<u64>().unwrap() > 0);
    }
}
