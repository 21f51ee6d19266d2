//! AMQP egress to RabbitMQ: one batch per message, persistent and
//! `mandatory`, on a channel with publisher confirms. [`AmqpSink::deliver`]
//! returns `Ok` only once RabbitMQ has confirmed the batch (for a persistent
//! message to a durable queue, after it is written to disk).
//!
//! # Message format
//! - body: a protobuf `weir.v1.Batch` (`weir_proto::decode_batch` reads it);
//! - `content_type`: [`weir_proto::CONTENT_TYPE`];
//! - `content_encoding`: the body's compression, chosen per batch by the piping
//!   model (`identity`, `gzip` or `zstd`; `weir_proto::Encoding`);
//! - headers, each a signed 64-bit integer (AMQP type `l`; the only 64-bit
//!   integer every client reads; a node id above `i64::MAX` shows up
//!   negative, reinterpret it as unsigned): [`HEADER_NODE`],
//!   [`HEADER_RECORDS`], [`HEADER_BATCH_SEQ`], [`HEADER_CLASS`] (the most urgent class
//!   index, 0 the most urgent; each record in the body carries its class
//!   name), [`HEADER_SENT_US`] (when it was published, microseconds since
//!   the Unix epoch);
//! - `message_id` `<node>-<batch seq>`, `timestamp` (seconds),
//!   `app_id` `weir`, `delivery_mode` 2 (persistent).
//!
//! # Endpoints
//! `egress.amqp.urls` lists the nodes of a cluster. One connection at a
//! time; when it is lost, an attempt fails, or a block outlasts
//! `blocked_failover_after`, the next endpoint is tried at once, and the
//! reconnect backoff applies only once every endpoint has failed in a row
//! (`Supervisor`). `url_order = "shuffle"` shuffles the list once.
//! [`AmqpSink::start`] connects once before weir accepts anything, so that
//! a broker refusing the configured queue (`PRECONDITION_FAILED`: another
//! type or arguments) stops start-up with a [`TopologyError`] instead of a
//! reconnect loop.
//!
//! # Failures, reconnects and duplicates
//! lapin's own recovery stays off (it does not recover reliably): this sink
//! supervises its connection. Any connection or channel error, or a publish
//! or confirm that takes longer than `confirm_timeout`, drops the connection
//! and fails the delivery with [`SinkError::Unavailable`]; the next
//! `deliver` waits out an exponential backoff (capped at
//! `reconnect_backoff_max`), reconnects, declares the topology again and
//! publishes. The [`super::run`] loop retries the batch it holds until it is
//! confirmed, so a batch RabbitMQ never confirmed is published again after
//! the reconnect: nothing acknowledged at ingress is lost, but a batch whose
//! confirm was lost in flight arrives twice. Consumers dedup by each
//! record's `(origin, seq)` (or by `message_id`).
//!
//! A `basic.return` (the batch was routed to no queue) or a `basic.nack`
//! fails the delivery with [`SinkError::Refused`], counted apart
//! (`weir_egress_amqp_returns_total`, `_nacks_total`, `_timeouts_total`);
//! the channel stays up and the batch is retried as it is after a backoff,
//! so an unbound routing key stalls the egress (an error naming the
//! exchange and key) instead of silently dropping batches.
//!
//! # Blocked connections
//! Under a memory or disk alarm RabbitMQ sends `connection.blocked` and stops
//! reading from publishing connections. lapin 4 records it in
//! `Connection::status().blocked()` and stops writing to the socket until
//! `connection.unblocked`; a task per connection follows
//! `Connection::events_listener` for the broker's reason and keeps the
//! `weir_egress_amqp_blocked*` metrics. While the connection
//! is blocked, publish and confirm waits do not time out: `deliver` simply
//! waits, and since deliveries are serial and the scheduler hands batches
//! over a bounded channel, the wait back-pressures the class queues and
//! ingress. Should a broker block without telling, the confirm timeout
//! fires and the reconnect loop still paces the egress.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::uri::AMQPUri;
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ConnectionStatus,
    ErrorKind, Event, ExchangeKind,
};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::Instrument;
use weir_core::backoff::Backoff;
use weir_core::{ClassSet, NodeId};

use super::batch::EncodedBatch;
use super::sink::{Confirm, Sink, SinkError};
use crate::config::{AmqpEgress, ExchangeType, QueueArgument, UrlOrder};
use crate::metrics::amqp::AmqpMetrics;

/// Header: the sending node's id.
pub const HEADER_NODE: &str = "weir-node";
/// Header: records in the batch.
pub const HEADER_RECORDS: &str = "weir-records";
/// Header: the per-node batch sequence number.
pub const HEADER_BATCH_SEQ: &str = "weir-batch-seq";
/// Header: the index of the most urgent class in the batch (0 is the most
/// urgent; a mixed batch holds others too).
pub const HEADER_CLASS: &str = "weir-class";
/// Header: when the batch was published, microseconds since the Unix epoch
/// (the sender's clock): with each record's `ingress_us`, a consumer can
/// tell the time a record spent in weir from the time it spent on the way.
pub const HEADER_SENT_US: &str = "weir-sent-us";
/// AMQP `app_id` of every message, so mixed queues show who published.
pub const APP_ID: &str = "weir";

/// Header `name` of a message as an unsigned number: a signed 64-bit
/// integer (AMQP type `l`, as weir and RabbitMQ's streams write them) that
/// is not negative; `None` when absent or of another type.
pub fn header_u64(properties: &BasicProperties, name: &str) -> Option<u64> {
    match properties.headers().as_ref()?.inner().get(name)? {
        AMQPValue::LongLongInt(v) => u64::try_from(*v).ok(),
        _ => None,
    }
}

/// First pause before reconnecting: short, because a closed connection or a
/// restarted broker usually accepts again at once.
const RECONNECT_INITIAL: Duration = Duration::from_millis(100);

/// Delivers batches to RabbitMQ, supervising its own connection.
pub struct AmqpSink {
    cfg: AmqpEgress,
    node: NodeId,
    /// What to connect to, or why the configuration cannot be used.
    target: Result<Target, String>,
    supervisor: Supervisor,
    metrics: Arc<AmqpMetrics>,
    span: tracing::Span,
}

/// A broker the egress may connect to.
struct Endpoint {
    /// Holds the password, so it is never printed.
    uri: AMQPUri,
    /// The URL without its password.
    shown: String,
}

/// The parsed destination.
struct Target {
    /// In the order they are tried (shuffled once with `url_order =
    /// "shuffle"`).
    endpoints: Vec<Endpoint>,
    exchange: ShortString,
    kind: ExchangeKind,
    queue: ShortString,
    queue_arguments: FieldTable,
    /// The routing key of a batch, by the index of its most urgent class.
    keys: Vec<ShortString>,
}

/// The connection, if any, which endpoint is next, and when the next
/// attempt may start.
struct Supervisor {
    link: Option<Link>,
    /// Pause after the next round of failures.
    backoff: Backoff,
    /// No connection attempt before this instant.
    retry_at: Option<Instant>,
    /// The endpoint in use, or tried next.
    current: usize,
    /// Attempts failed in a row on different endpoints since the last
    /// pause: once every endpoint has failed, the backoff applies.
    failed_in_round: usize,
    /// The endpoint of the last connection made.
    last: Option<usize>,
}

/// A connection with its confirm-mode channel and declared topology.
struct Link {
    conn: Connection,
    channel: Channel,
    /// Index of the endpoint it is connected to.
    endpoint: usize,
    /// What the confirmations of this link's publishes found out.
    health: Arc<Health>,
    /// Why RabbitMQ blocked the connection, while it does.
    blocked: Arc<Mutex<BrokerBlock>>,
    /// Stops the task that follows the connection's events.
    _events: DropGuard,
}

/// Told by pending confirmations, read by the next send.
#[derive(Default)]
struct Health {
    /// A confirm failed or timed out: reconnect before the next publish.
    broken: AtomicBool,
    /// A confirm arrived since the last send: the broker works, reset the
    /// reconnect backoff.
    confirmed: AtomicBool,
    /// A publish was nacked: publish the next on a new channel. A channel
    /// that published to a quorum queue while its leader was changing can
    /// go on being refused after the new leader is up (RabbitMQ 3.10's
    /// channel keeps the queue's old leader); a new channel asks afresh.
    nacked: AtomicBool,
}

/// Why a connection attempt failed.
enum OpenError {
    /// The broker could not be reached or the connection failed: try the
    /// next endpoint, back off.
    Unavailable(String),
    /// The broker refused a declaration (an exchange or queue exists with
    /// other settings, or the user may not declare it): a configuration
    /// problem that retrying does not mend.
    Declaration {
        /// The config key to change.
        key: &'static str,
        /// What was declared and what RabbitMQ said.
        message: String,
    },
}

/// RabbitMQ refused the configured topology at start-up: the message names
/// the key, the exchange or queue, and both settings.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{key}: {message}")]
pub struct TopologyError {
    /// The config key to change.
    pub key: &'static str,
    /// What RabbitMQ said and what to do.
    pub message: String,
}

impl AmqpSink {
    /// A sink for `cfg`, publishing as `node`; connects on
    /// [`AmqpSink::start`] or the first [`Sink::deliver`].
    pub fn new(cfg: AmqpEgress, node: NodeId) -> AmqpSink {
        let reconnect_backoff_max = cfg.reconnect_backoff_max;
        let shown: Vec<String> = cfg.urls.iter().map(|u| redacted_url(u)).collect();
        let span = tracing::info_span!("amqp_egress", node);
        let target = Target::new(&cfg, node, None);
        if let Err(e) = &target {
            tracing::error!(parent: &span, error = %e, "AMQP egress cannot connect");
        }
        let metrics = Arc::new(AmqpMetrics::default());
        metrics.endpoints(&shown);
        AmqpSink {
            cfg,
            node,
            target,
            supervisor: Supervisor {
                link: None,
                backoff: Backoff::new(RECONNECT_INITIAL, reconnect_backoff_max),
                retry_at: None,
                current: 0,
                failed_in_round: 0,
                last: None,
            },
            metrics,
            span,
        }
    }

    /// Routing keys name `classes` (`{class}` in the template; without
    /// this, the class index).
    pub fn with_classes(mut self, classes: &ClassSet) -> Self {
        self.target = Target::new(&self.cfg, self.node, Some(classes));
        self
    }

    /// Counts into `metrics` (the `/metrics` of the running weir).
    pub fn with_metrics(mut self, metrics: Arc<AmqpMetrics>) -> Self {
        if let Ok(t) = &self.target {
            let shown: Vec<String> = t.endpoints.iter().map(|e| e.shown.clone()).collect();
            metrics.endpoints(&shown);
        }
        self.metrics = metrics;
        self
    }

    /// The AMQP metrics this sink counts into.
    pub fn metrics(&self) -> &Arc<AmqpMetrics> {
        &self.metrics
    }

    /// The broker in use, or tried next, without its password, for logs.
    pub fn broker(&self) -> String {
        match &self.target {
            Ok(t) => t.endpoints[self.supervisor.current].shown.clone(),
            Err(_) => self
                .cfg
                .urls
                .first()
                .map_or_else(String::new, |u| redacted_url(u)),
        }
    }

    /// Connects once at start-up, trying every endpoint, for at most
    /// `egress.amqp.connect_timeout` in all. A broker that cannot be
    /// reached is not an error (the egress keeps trying, and the spool or
    /// the queues hold the records); a broker that refuses the configured
    /// exchange or queue is: it would refuse every reconnect too.
    pub async fn start(&mut self) -> Result<(), TopologyError> {
        let target = match &self.target {
            Ok(t) => t,
            Err(e) => {
                return Err(TopologyError {
                    key: "egress.amqp",
                    message: e.clone(),
                })
            }
        };
        let deadline = Instant::now() + self.cfg.connect_timeout;
        let span = self.span.clone();
        let sup = &mut self.supervisor;
        for _ in 0..target.endpoints.len() {
            let i = sup.current;
            let attempt = Link::open(target, i, &self.cfg, self.node, &self.metrics);
            match tokio::time::timeout_at(deadline, attempt)
                .instrument(span.clone())
                .await
            {
                Ok(Ok(link)) => {
                    let _span = span.enter();
                    sup.connected(link, target, &self.metrics);
                    return Ok(());
                }
                Ok(Err(OpenError::Declaration { key, message })) => {
                    return Err(TopologyError { key, message });
                }
                Ok(Err(OpenError::Unavailable(why))) => {
                    tracing::warn!(parent: &span, endpoint = %target.endpoints[i].shown, error = %why, "RabbitMQ not reachable at start-up; the egress keeps trying");
                    sup.current = (i + 1) % target.endpoints.len();
                }
                Err(_) => {
                    tracing::warn!(parent: &span, endpoint = %target.endpoints[i].shown, "no connection to RabbitMQ within egress.amqp.connect_timeout at start-up; the egress keeps trying");
                    sup.current = (i + 1) % target.endpoints.len();
                    break;
                }
            }
        }
        Ok(())
    }

    /// Whether a connection is up and no confirm on it has failed (it may
    /// still turn out to be dead).
    pub fn is_connected(&self) -> bool {
        self.supervisor
            .link
            .as_ref()
            .is_some_and(|l| l.alive() && !l.health.broken.load(Ordering::Relaxed))
    }

    /// The number of the channel publishes go on, while connected.
    pub fn channel_id(&self) -> Option<u16> {
        self.supervisor.link.as_ref().map(|l| l.channel.id())
    }

    /// Whether RabbitMQ has blocked the connection (memory or disk alarm).
    pub fn is_blocked(&self) -> bool {
        self.supervisor
            .link
            .as_ref()
            .is_some_and(|l| l.conn.status().blocked())
    }

    async fn send_in_span(&mut self, batch: &EncodedBatch) -> Result<Confirm, SinkError> {
        let target = self
            .target
            .as_ref()
            .map_err(|e| SinkError::Unavailable(e.clone()))?;
        let sup = &mut self.supervisor;
        let n = target.endpoints.len();
        if let Some(link) = &sup.link {
            let working = link.health.confirmed.swap(false, Ordering::Relaxed);
            let broken = link.health.broken.load(Ordering::Relaxed);
            let alive = link.alive();
            let nacked = link.health.nacked.swap(false, Ordering::Relaxed);
            if working {
                sup.working();
            }
            if broken {
                // A confirm timed out or failed: the link is not to be
                // trusted, even if the socket still looks open.
                sup.give_up(target, &self.metrics);
            } else if !alive {
                tracing::warn!(endpoint = %target.endpoints[sup.current].shown, "connection to RabbitMQ lost; reconnecting");
                sup.give_up(target, &self.metrics);
            } else if nacked {
                let renewed = match sup.link.as_mut() {
                    Some(link) => link.renew_channel().await,
                    None => Ok(()),
                };
                if let Err(e) = renewed {
                    tracing::warn!(error = %e, "cannot open a new channel after a nack; reconnecting");
                    sup.give_up(target, &self.metrics);
                }
            }
        }
        if sup.link.is_none() {
            if let Some(at) = sup.retry_at {
                // Waiting here rather than failing at once gives one log line
                // per real attempt, spaced by `reconnect_backoff_max` at most.
                tokio::time::sleep_until(at).await;
            }
            let limit = self.cfg.connect_timeout;
            let i = sup.current;
            let shown = &target.endpoints[i].shown;
            let attempt = Link::open(target, i, &self.cfg, self.node, &self.metrics);
            match tokio::time::timeout(limit, attempt).await {
                Ok(Ok(link)) => sup.connected(link, target, &self.metrics),
                Ok(Err(OpenError::Unavailable(e) | OpenError::Declaration { message: e, .. })) => {
                    sup.failed(n);
                    return Err(SinkError::Unavailable(format!("{shown}: {e}")));
                }
                Err(_) => {
                    sup.failed(n);
                    return Err(SinkError::Unavailable(format!(
                        "{shown}: connecting to RabbitMQ took longer than {limit:?} (egress.amqp.connect_timeout)"
                    )));
                }
            }
        }
        let link = sup.link.as_ref().expect("connected above");
        // Moving away from a blocked node only helps with another to go to.
        let blocked_failover = (n > 1).then_some(self.cfg.blocked_failover_after);
        let limits = Limits {
            confirm: self.cfg.confirm_timeout,
            blocked_failover,
        };
        match link.publish(target, limits, batch, &self.metrics).await {
            Ok(confirm) => Ok(confirm),
            Err(why) => {
                // Dropping the connection closes it (lapin sends
                // connection.close if it is still open) without waiting.
                sup.give_up(target, &self.metrics);
                Err(SinkError::Unavailable(why))
            }
        }
    }
}

impl fmt::Debug for AmqpSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Hand-written: the config and the parsed URI hold the password.
        f.debug_struct("AmqpSink")
            .field("broker", &self.broker())
            .field("exchange", &self.cfg.exchange)
            .field("queue", &self.cfg.queue)
            .field("routing_key", &self.cfg.routing_key)
            .field("node", &self.node)
            .field("connected", &self.is_connected())
            .finish_non_exhaustive()
    }
}

impl Sink for AmqpSink {
    async fn send(&mut self, batch: &EncodedBatch) -> Result<Confirm, SinkError> {
        let span = self.span.clone();
        self.send_in_span(batch).instrument(span).await
    }

    fn window(&self) -> usize {
        self.cfg.max_in_flight
    }

    fn name(&self) -> &'static str {
        "amqp"
    }
}

impl Target {
    fn new(cfg: &AmqpEgress, node: NodeId, classes: Option<&ClassSet>) -> Result<Target, String> {
        let mut endpoints = cfg
            .urls
            .iter()
            .enumerate()
            .map(|(i, url)| Endpoint::new(cfg, i, url))
            .collect::<Result<Vec<_>, _>>()?;
        if endpoints.is_empty() {
            return Err("egress.amqp.urls: no endpoint".to_owned());
        }
        if cfg.url_order == UrlOrder::Shuffle {
            shuffle(&mut endpoints, node);
        }
        let short = |key: &str, value: &str| {
            ShortString::try_new(value).map_err(|e| format!("egress.amqp.{key}: {e}"))
        };
        let names: Vec<String> = match classes {
            Some(c) => c.iter().map(|(_, c)| c.name.clone()).collect(),
            // Without the class set, the index stands for the name.
            None => (0..=u8::MAX).map(|i| i.to_string()).collect(),
        };
        let keys = names
            .iter()
            .map(|c| short("routing_key", &cfg.routing_key_for(node, c)))
            .collect::<Result<Vec<_>, _>>()?;
        let mut queue_arguments = FieldTable::default();
        for (k, v) in cfg.declared_arguments() {
            queue_arguments.insert(short("queue_arguments", &k)?, amqp_value(v));
        }
        Ok(Target {
            endpoints,
            exchange: short("exchange", &cfg.exchange)?,
            kind: match cfg.exchange_type {
                ExchangeType::Direct => ExchangeKind::Direct,
                ExchangeType::Fanout => ExchangeKind::Fanout,
                ExchangeType::Topic => ExchangeKind::Topic,
                ExchangeType::Headers => ExchangeKind::Headers,
            },
            queue: short("queue", &cfg.queue)?,
            queue_arguments,
            keys,
        })
    }

    /// The routing key of a batch whose most urgent class is `class`.
    fn key(&self, class: weir_core::ClassId) -> &ShortString {
        let i = class.index().min(self.keys.len() - 1);
        &self.keys[i]
    }

    /// The distinct routing keys this node publishes with, for bindings.
    fn distinct_keys(&self) -> Vec<&ShortString> {
        let mut keys: Vec<&ShortString> = Vec::new();
        for k in &self.keys {
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        keys
    }
}

impl Endpoint {
    fn new(cfg: &AmqpEgress, i: usize, url: &str) -> Result<Endpoint, String> {
        let key = if cfg.urls.len() == 1 {
            "egress.amqp.url".to_owned()
        } else {
            format!("egress.amqp.urls[{i}]")
        };
        let shown = redacted_url(url);
        let mut uri: AMQPUri = url
            .parse()
            .map_err(|e| format!("{key} ({shown}) is not a valid AMQP URL: {e}"))?;
        // amq-protocol-uri reads only domain hosts: an IPv6 literal would
        // silently become `localhost`.
        let authority = url
            .split_once("://")
            .map_or("", |(_, rest)| rest.split(['/', '?']).next().unwrap_or(""));
        if authority
            .rsplit('@')
            .next()
            .is_some_and(|h| h.starts_with('['))
        {
            return Err(format!(
                "{key} ({shown}): IPv6 address literals are not supported by the AMQP client (it would connect to localhost); use a host name"
            ));
        }
        // Bound the TCP connect inside lapin's I/O thread too, so an
        // abandoned attempt to a black-holed host does not linger.
        if uri.query.connection_timeout.is_none() {
            uri.query.connection_timeout = Some(
                cfg.connect_timeout
                    .as_millis()
                    .try_into()
                    .unwrap_or(u64::MAX),
            );
        }
        Ok(Endpoint { uri, shown })
    }
}

/// Shuffles the endpoints, seeded by the node id and the clock, so a fleet
/// started together still spreads over the cluster.
fn shuffle(endpoints: &mut [Endpoint], node: NodeId) {
    let mut x = node ^ crate::clock::unix_micros() ^ 0x9e37_79b9_7f4a_7c15;
    for i in (1..endpoints.len()).rev() {
        // xorshift64
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let j = (x % (i as u64 + 1)) as usize;
        endpoints.swap(i, j);
    }
}

/// A queue argument as the AMQP field of its kind.
fn amqp_value(v: QueueArgument) -> AMQPValue {
    match v {
        QueueArgument::Int(i) => AMQPValue::LongLongInt(i),
        QueueArgument::Float(f) => AMQPValue::Double(f),
        QueueArgument::Bool(b) => AMQPValue::Boolean(b),
        QueueArgument::Str(s) => AMQPValue::LongString(s.into()),
    }
}

impl Supervisor {
    /// A connection attempt or the link failed: the next attempt goes to
    /// the next endpoint, at once while some endpoint of this round is
    /// untried, after a backoff once every one has failed.
    fn failed(&mut self, endpoints: usize) {
        self.current = (self.current + 1) % endpoints;
        self.failed_in_round += 1;
        if self.failed_in_round >= endpoints {
            self.failed_in_round = 0;
            self.retry_at = Some(Instant::now() + self.backoff.failed());
        } else {
            self.retry_at = None;
        }
    }

    /// The broker answered a publish: the link works, reset the backoff.
    fn working(&mut self) {
        self.backoff.reset();
        self.retry_at = None;
        self.failed_in_round = 0;
    }

    /// A connection is up.
    fn connected(&mut self, link: Link, target: &Target, metrics: &AmqpMetrics) {
        let i = link.endpoint;
        let failover = self.last.is_some_and(|last| last != i);
        tracing::info!(
            endpoint = %target.endpoints[i].shown,
            exchange = %target.exchange,
            queue = %target.queue,
            routing_key = %target.key(weir_core::ClassId(0)),
            failover,
            "connected to RabbitMQ"
        );
        metrics.connected(&target.endpoints[i].shown, failover);
        self.last = Some(i);
        self.current = i;
        self.link = Some(link);
    }

    /// The link failed: drop the connection (lapin closes it without
    /// waiting) and move on to the next endpoint ([`Supervisor::failed`]).
    fn give_up(&mut self, target: &Target, metrics: &AmqpMetrics) {
        if let Some(link) = self.link.take() {
            metrics.disconnected(&target.endpoints[link.endpoint].shown);
        }
        self.failed(target.endpoints.len());
    }
}

/// A declaration error: the broker's words, and whether it is one that a
/// retry cannot mend (PRECONDITION_FAILED, ACCESS_REFUSED).
fn declaration_error(e: &lapin::Error, key: &'static str, what: String) -> OpenError {
    let fatal = matches!(
        e.kind(),
        ErrorKind::ProtocolError(err) if matches!(
            err.kind(),
            AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED | AMQPSoftError::ACCESSREFUSED)
        )
    );
    let message = format!("{what}: {}", explain_broker(&e.to_string()));
    if fatal {
        OpenError::Declaration { key, message }
    } else {
        OpenError::Unavailable(message)
    }
}

/// The broker's words, with what they mean where RabbitMQ's are
/// misleading: a queue declared without a type (a classic queue) has its
/// `x-queue-type` reported as "none".
fn explain_broker(said: &str) -> String {
    if said.contains("'x-queue-type'") && said.contains("current is none") {
        format!("{said} (\"none\" is RabbitMQ's name for a classic queue here: the queue exists as classic; delete it, or set egress.amqp.queue_type = \"classic\")")
    } else {
        said.to_owned()
    }
}

/// How long a publish and its confirm may take.
#[derive(Clone, Copy)]
struct Limits {
    /// Without a block: `confirm_timeout`.
    confirm: Duration,
    /// With a block: give up this long into it (with another endpoint to
    /// go to), else wait.
    blocked_failover: Option<Duration>,
}

impl Link {
    /// Connects to endpoint `i`, opens a confirm-mode channel and declares
    /// the topology.
    async fn open(
        target: &Target,
        i: usize,
        cfg: &AmqpEgress,
        node: NodeId,
        metrics: &Arc<AmqpMetrics>,
    ) -> Result<Link, OpenError> {
        let props = ConnectionProperties::default()
            .with_connection_name(LongString::from(format!("weir node {node}")));
        let conn = Connection::connect_uri(target.endpoints[i].uri.clone(), props)
            .await
            .map_err(|e| OpenError::Unavailable(format!("connecting to RabbitMQ: {e}")))?;
        // Follow blocked/unblocked from the start: RabbitMQ blocks a
        // connection at its first publish under an alarm.
        let blocked = Arc::new(Mutex::new(BrokerBlock::default()));
        let stop = CancellationToken::new();
        tokio::spawn(follow_events(
            conn.events_listener(),
            Arc::clone(&blocked),
            Arc::clone(metrics),
            stop.clone(),
        ));
        let channel = conn
            .create_channel()
            .await
            .map_err(|e| OpenError::Unavailable(format!("opening a channel: {e}")))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| OpenError::Unavailable(format!("enabling publisher confirms: {e}")))?;
        let refused = |e: lapin::Error, key: &'static str, what: String| {
            let err = declaration_error(&e, key, what);
            if matches!(err, OpenError::Declaration { .. }) {
                metrics.declare_failures.inc();
            }
            err
        };
        // The default exchange ("") exists already and cannot be declared
        // or bound to; it routes by queue name.
        if !cfg.exchange.is_empty() {
            channel
                .exchange_declare(
                    target.exchange.clone(),
                    target.kind.clone(),
                    ExchangeDeclareOptions {
                        durable: true,
                        ..ExchangeDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await
                .map_err(|e| {
                    refused(e, "egress.amqp.exchange_type", format!(
                        "declaring durable {} exchange `{}` (egress.amqp.exchange_type = \"{}\"; an exchange of that name that exists with another type or durability is refused)",
                        cfg.exchange_type, cfg.exchange, cfg.exchange_type
                    ))
                })?;
        }
        // An empty queue name declares nothing: the operator's bindings
        // route (a `mandatory` return shows when none matches).
        if !cfg.queue.is_empty() {
            channel
                .queue_declare(
                    target.queue.clone(),
                    QueueDeclareOptions::durable(),
                    target.queue_arguments.clone(),
                )
                .await
                .map_err(|e| {
                    refused(e, "egress.amqp.queue_type", format!(
                        "declaring durable queue `{}` with {} (egress.amqp.queue_type, egress.amqp.queue_arguments) was refused: a queue of that name exists with other settings, or the user may not declare it; RabbitMQ says",
                        cfg.queue,
                        cfg.queue_settings()
                    ))
                })?;
            if !cfg.exchange.is_empty() {
                for key in target.distinct_keys() {
                    channel
                        .queue_bind(
                            target.queue.clone(),
                            target.exchange.clone(),
                            key.clone(),
                            QueueBindOptions::default(),
                            FieldTable::default(),
                        )
                        .await
                        .map_err(|e| {
                            refused(
                                e,
                                "egress.amqp.routing_key",
                                format!(
                                    "binding queue `{}` to exchange `{}` with routing key `{key}`",
                                    cfg.queue, cfg.exchange
                                ),
                            )
                        })?;
                }
            }
        }
        Ok(Link {
            conn,
            channel,
            endpoint: i,
            health: Arc::default(),
            blocked,
            _events: stop.drop_guard(),
        })
    }

    fn alive(&self) -> bool {
        self.conn.status().connected() && self.channel.status().connected()
    }

    /// Replaces the channel with a new confirm-mode one (the topology is
    /// declared already). Confirms pending on the old one are lost to it:
    /// the egress publishes those batches again.
    async fn renew_channel(&mut self) -> Result<(), String> {
        let channel = self
            .conn
            .create_channel()
            .await
            .map_err(|e| format!("opening a channel: {e}"))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| format!("enabling publisher confirms: {e}"))?;
        let old = std::mem::replace(&mut self.channel, channel);
        // Closing it fails the confirms still pending on it.
        let _ = old.close(200, "renewed after a nack".into()).await;
        Ok(())
    }

    /// Publishes one batch; returns once lapin has written it, with the
    /// future of its confirm.
    async fn publish(
        &self,
        target: &Target,
        limits: Limits,
        batch: &EncodedBatch,
        metrics: &Arc<AmqpMetrics>,
    ) -> Result<Confirm, String> {
        let watch = Watch {
            status: self.conn.status().clone(),
            blocked: Arc::clone(&self.blocked),
            limits,
            metrics: Arc::clone(metrics),
        };
        let routing_key = target.key(batch.class).clone();
        let publish = self.channel.basic_publish(
            target.exchange.clone(),
            routing_key.clone(),
            BasicPublishOptions {
                mandatory: true,
                immediate: false,
            },
            &batch.body,
            properties(batch),
        );
        // Resolves once lapin has written the frames (it holds them while
        // the connection is blocked).
        let confirm = watch
            .within("publish", publish)
            .await?
            .map_err(|e| format!("publishing batch {}: {e}", batch.seq))?;
        let health = Arc::clone(&self.health);
        let seq = batch.seq;
        let exchange = target.exchange.clone();
        let metrics = Arc::clone(metrics);
        Ok(Box::pin(async move {
            let confirmation = match watch.within("publisher confirm", confirm).await {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => {
                    health.broken.store(true, Ordering::Relaxed);
                    return Err(SinkError::Unavailable(format!(
                        "awaiting the confirm of batch {seq}: {e}"
                    )));
                }
                Err(why) => {
                    health.broken.store(true, Ordering::Relaxed);
                    return Err(SinkError::Unavailable(why));
                }
            };
            match confirmation {
                Confirmation::Ack(None) => {
                    health.confirmed.store(true, Ordering::Relaxed);
                    Ok(())
                }
                Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)) => {
                    metrics.returns.inc();
                    tracing::error!(
                        batch = seq,
                        exchange = %exchange,
                        routing_key = %routing_key,
                        "RabbitMQ returned a batch as unroutable: no queue is bound to the exchange for this routing key; the batch is held and retried"
                    );
                    Err(SinkError::Refused(format!(
                        "RabbitMQ returned batch {seq} ({} {}): no queue is bound to exchange `{exchange}` with routing key `{routing_key}`; bind one or fix egress.amqp.routing_key",
                        returned.reply_code, returned.reply_text,
                    )))
                }
                Confirmation::Nack(None) => {
                    metrics.nacks.inc();
                    health.nacked.store(true, Ordering::Relaxed);
                    Err(SinkError::Refused(format!(
                        "RabbitMQ nacked batch {seq} (it could not store it; for a quorum queue, no majority, or x-overflow = reject-publish on a full queue)"
                    )))
                }
                Confirmation::NotRequested => {
                    health.broken.store(true, Ordering::Relaxed);
                    Err(SinkError::Unavailable(
                        "the channel is not in confirm mode".to_owned(),
                    ))
                }
            }
        }))
    }
}

/// The broker's block of a connection: its reason while it lasts, and how
/// many blocks there were (a wait that spans a whole block, between two of
/// its looks at the connection, still learns of it).
#[derive(Debug, Default)]
struct BrokerBlock {
    reason: Option<String>,
    blocks: u64,
}

/// Follows a connection's events until it closes or `stop` fires: the
/// broker's block and its reason, into `blocked` and the metrics.
async fn follow_events(
    events: impl futures::Stream<Item = Event> + Send + 'static,
    blocked: Arc<Mutex<BrokerBlock>>,
    metrics: Arc<AmqpMetrics>,
    stop: CancellationToken,
) {
    let mut events = std::pin::pin!(events);
    loop {
        let event = tokio::select! {
            e = events.next() => e,
            () = stop.cancelled() => None,
        };
        match event {
            Some(Event::ConnectionBlocked(reason)) => {
                tracing::warn!(reason = %reason, "RabbitMQ blocked the connection (a resource alarm); publishing waits until it unblocks");
                metrics.blocked(&reason);
                let mut b = blocked.lock().unwrap_or_else(|e| e.into_inner());
                b.reason = Some(reason);
                b.blocks += 1;
            }
            Some(Event::ConnectionUnblocked) => {
                metrics.unblocked();
                blocked.lock().unwrap_or_else(|e| e.into_inner()).reason = None;
            }
            Some(_) => {}
            None => break,
        }
    }
    if blocked
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .reason
        .take()
        .is_some()
    {
        metrics.unblocked();
    }
}

/// What a wait on the broker watches: the connection's block, and the
/// limits.
#[derive(Clone)]
struct Watch {
    status: ConnectionStatus,
    blocked: Arc<Mutex<BrokerBlock>>,
    limits: Limits,
    metrics: Arc<AmqpMetrics>,
}

impl Watch {
    /// Awaits `fut` for at most the confirm timeout, except that time
    /// spent while RabbitMQ blocks the connection does not count: a
    /// blocked broker is waited for (back-pressure), up to
    /// `blocked_failover` when another endpoint could take over; a silent
    /// one is given up on.
    async fn within<F: Future>(&self, what: &str, fut: F) -> Result<F::Output, String> {
        let limit = self.limits.confirm;
        let mut fut = std::pin::pin!(fut);
        let mut deadline = Instant::now() + limit;
        let mut blocked_since: Option<Instant> = None;
        let blocks = || {
            self.blocked
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .blocks
        };
        let mut blocks_seen = blocks();
        let tick = limit.min(Duration::from_secs(1));
        loop {
            // Cancel safety: `fut` is pinned outside the loop and polled by
            // reference, so the timer winning loses nothing.
            tokio::select! {
                out = &mut fut => {
                    if let Some(since) = blocked_since {
                        tracing::info!(blocked_for = ?since.elapsed(), "RabbitMQ unblocked the connection");
                    }
                    return Ok(out);
                }
                () = tokio::time::sleep_until(deadline.min(Instant::now() + tick)) => {}
            }
            let now = Instant::now();
            if self.status.blocked() {
                blocks_seen = blocks();
                let since = *blocked_since.get_or_insert(now);
                if let Some(after) = self.limits.blocked_failover {
                    if now - since >= after {
                        let reason = self
                            .blocked
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .reason
                            .clone()
                            .unwrap_or_else(|| "no reason given".to_owned());
                        return Err(format!(
                            "RabbitMQ has blocked the connection for {:?} ({reason}); moving to the next endpoint (egress.amqp.blocked_failover_after)",
                            now - since
                        ));
                    }
                }
                deadline = now + limit;
            } else if let Some(since) = blocked_since.take() {
                // Unblocked since the last check: the broker has only just
                // resumed reading, so it gets a whole period again.
                tracing::info!(blocked_for = ?since.elapsed(), "RabbitMQ unblocked the connection");
                deadline = now + limit;
            } else if now >= deadline && blocks() != blocks_seen {
                // A block began and ended between two looks: the broker has
                // only just resumed reading, as above.
                blocks_seen = blocks();
                deadline = now + limit;
            } else if now >= deadline {
                self.metrics.timeouts.inc();
                return Err(format!(
                    "no {what} from RabbitMQ within {limit:?} (egress.amqp.confirm_timeout)"
                ));
            }
        }
    }
}

/// The AMQP properties of a batch message (see the module docs).
fn properties(batch: &EncodedBatch) -> BasicProperties {
    // Signed 64-bit for every header: see the module docs.
    let mut headers = FieldTable::default();
    headers.insert(
        HEADER_NODE.into(),
        AMQPValue::LongLongInt(batch.node as i64),
    );
    headers.insert(
        HEADER_RECORDS.into(),
        AMQPValue::LongLongInt(batch.records as i64),
    );
    headers.insert(
        HEADER_BATCH_SEQ.into(),
        AMQPValue::LongLongInt(batch.seq as i64),
    );
    headers.insert(
        HEADER_CLASS.into(),
        AMQPValue::LongLongInt(i64::from(batch.class.0)),
    );
    headers.insert(
        HEADER_SENT_US.into(),
        AMQPValue::LongLongInt(crate::clock::unix_micros() as i64),
    );
    let now = crate::clock::unix_secs();
    BasicProperties::default()
        .with_content_type(weir_proto::CONTENT_TYPE.into())
        .with_content_encoding(batch.encoding.as_str().into())
        .with_delivery_mode(2)
        .with_headers(headers)
        .with_message_id(message_id(batch.node, batch.seq).into())
        .with_timestamp(now)
        .with_app_id(APP_ID.into())
}

/// The `message_id` of a batch: unique per node and batch, so a consumer
/// can spot a re-published batch.
pub fn message_id(node: NodeId, seq: u64) -> String {
    format!("{node}-{seq}")
}

/// `url` with its password left out: `amqp://user@host:port/vhost`.
pub fn redacted_url(url: &str) -> String {
    match url.parse::<AMQPUri>() {
        Ok(uri) => format!(
            "{}://{}@{}:{}/{}",
            uri.scheme,
            uri.authority.userinfo.username,
            uri.authority.host,
            uri.authority.port,
            percent_encode_vhost(&uri.vhost)
        ),
        // Unparseable: show only the scheme, the rest may hold a password.
        Err(_) => {
            let scheme = url.split_once("://").map_or("?", |(s, _)| s);
            format!("{scheme}://<unparseable>")
        }
    }
}

/// The vhost as written in a URL (`/` is `%2f`).
fn percent_encode_vhost(vhost: &str) -> String {
    let mut out = String::with_capacity(vhost.len());
    for b in vhost.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02x}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_core::ClassId;
    use weir_proto::Encoding;

    #[test]
    fn a_queue_type_of_none_is_called_classic() {
        let said = "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': received the value 'quorum' of type 'longstr' but current is none";
        let explained = explain_broker(said);
        assert!(explained.starts_with(said), "{explained}");
        assert!(explained.contains("exists as classic"), "{explained}");
        let other = "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'q'";
        assert_eq!(explain_broker(other), other);
    }

    #[test]
    fn redacted_url_never_shows_the_password() {
        let shown = redacted_url("amqp://weir:s3cr%2Fet@rabbit.example:5671/edge?heartbeat=10");
        assert_eq!(shown, "amqp://weir@rabbit.example:5671/edge");
        assert!(!shown.contains("s3cr"));
        assert_eq!(
            redacted_url("amqp://guest:guest@127.0.0.1:5672/%2f"),
            "amqp://guest@127.0.0.1:5672/%2f"
        );
        let bad = redacted_url("amqp://user:hunter2@host:notaport/");
        assert!(!bad.contains("hunter2"), "{bad}");
    }

    #[test]
    fn ipv6_literal_hosts_are_refused_not_rewritten() {
        let mut cfg = config("amqp://weir:hunter2@[::1]:5672/%2f");
        let err = Target::new(&cfg, 1, None).err().expect("refused");
        assert!(err.contains("IPv6") && !err.contains("hunter2"), "{err}");
        cfg.urls = vec!["amqp://weir:hunter2@rabbit.example:5672/%2f".into()];
        assert!(Target::new(&cfg, 1, None).is_ok());
    }

    fn config(url: &str) -> AmqpEgress {
        AmqpEgress {
            urls: vec![url.into()],
            url_order: UrlOrder::InOrder,
            exchange: "weir".into(),
            exchange_type: ExchangeType::Direct,
            queue: "weir.batches".into(),
            queue_type: crate::config::QueueType::Classic,
            queue_arguments: Vec::new(),
            routing_key: "weir.batches".into(),
            blocked_failover_after: Duration::from_secs(30),
            confirm_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            reconnect_backoff_max: Duration::from_secs(1),
            max_in_flight: 4,
            urgent_lane: false,
        }
    }

    #[test]
    fn debug_output_hides_the_password() {
        let sink = AmqpSink::new(config("amqp://weir:hunter2@127.0.0.1:5672/%2f"), 1);
        let shown = format!("{sink:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("amqp://weir@127.0.0.1:5672/%2f"), "{shown}");
    }

    #[test]
    fn properties_carry_format_and_headers() {
        let batch = EncodedBatch {
            seq: 9,
            class: ClassId(2),
            records: 3,
            node: 7,
            body: bytes::Bytes::from_static(b"x"),
            encoding: Encoding::Identity,
        };
        let p = properties(&batch);
        assert_eq!(
            p.content_type().as_ref().map(ShortString::as_str),
            Some(weir_proto::CONTENT_TYPE)
        );
        assert_eq!(
            p.content_encoding().as_ref().map(ShortString::as_str),
            Some("identity")
        );
        assert_eq!(*p.delivery_mode(), Some(2));
        assert_eq!(
            p.message_id().as_ref().map(ShortString::as_str),
            Some("7-9")
        );
        let headers = p.headers().as_ref().expect("headers set");
        let get = |k: &str| headers.inner().get(k).cloned();
        assert_eq!(get(HEADER_NODE), Some(AMQPValue::LongLongInt(7)));
        assert_eq!(get(HEADER_RECORDS), Some(AMQPValue::LongLongInt(3)));
        assert_eq!(get(HEADER_BATCH_SEQ), Some(AMQPValue::LongLongInt(9)));
        assert_eq!(get(HEADER_CLASS), Some(AMQPValue::LongLongInt(2)));
    }
}
