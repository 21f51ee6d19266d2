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
//!   name);
//! - `message_id` `<node>-<batch seq>`, `timestamp` (seconds),
//!   `app_id` `weir`, `delivery_mode` 2 (persistent).
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
//! fails the delivery with [`SinkError::Refused`]; the channel stays up and
//! the batch is retried as it is, so an unbound routing key stalls the
//! egress (visible in the log) instead of silently dropping batches.
//!
//! # Blocked connections
//! Under a memory or disk alarm RabbitMQ sends `connection.blocked` and stops
//! reading from publishing connections. lapin 4 records it in
//! `Connection::status().blocked()` (also reported as
//! `Event::ConnectionBlocked` on `Connection::events_listener`) and stops
//! writing to the socket until `connection.unblocked`. While the connection
//! is blocked, publish and confirm waits do not time out: `deliver` simply
//! waits, and since deliveries are serial and the scheduler hands batches
//! over a bounded channel, the wait back-pressures the class queues and
//! ingress. Should a broker block without telling, the confirm timeout
//! fires and the reconnect loop still paces the egress.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::uri::AMQPUri;
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ConnectionStatus,
    ExchangeKind,
};
use tokio::time::Instant;
use tracing::Instrument;
use weir_core::NodeId;

use super::batch::EncodedBatch;
use super::sink::{Confirm, Sink, SinkError};
use crate::config::{AmqpEgress, ExchangeType};

/// Header: the sending node's id.
pub const HEADER_NODE: &str = "weir-node";
/// Header: records in the batch.
pub const HEADER_RECORDS: &str = "weir-records";
/// Header: the per-node batch sequence number.
pub const HEADER_BATCH_SEQ: &str = "weir-batch-seq";
/// Header: the index of the most urgent class in the batch (0 is the most
/// urgent; a mixed batch holds others too).
pub const HEADER_CLASS: &str = "weir-class";
/// AMQP `app_id` of every message, so mixed queues show who published.
pub const APP_ID: &str = "weir";

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
    span: tracing::Span,
}

/// The parsed destination; holds the password, so it is never printed.
struct Target {
    uri: AMQPUri,
    exchange: ShortString,
    kind: ExchangeKind,
    queue: ShortString,
    routing_key: ShortString,
}

/// The connection, if any, and when the next attempt may start.
struct Supervisor {
    link: Option<Link>,
    /// Pause after the next failure.
    backoff: Duration,
    /// No connection attempt before this instant.
    retry_at: Option<Instant>,
}

/// A connection with its confirm-mode channel and declared topology.
struct Link {
    conn: Connection,
    channel: Channel,
    /// What the confirmations of this link's publishes found out.
    health: Arc<Health>,
}

/// Told by pending confirmations, read by the next send.
#[derive(Default)]
struct Health {
    /// A confirm failed or timed out: reconnect before the next publish.
    broken: AtomicBool,
    /// A confirm arrived since the last send: the broker works, reset the
    /// reconnect backoff.
    confirmed: AtomicBool,
}

impl AmqpSink {
    /// A sink for `cfg`, publishing as `node`; connects on the first
    /// [`Sink::deliver`].
    pub fn new(cfg: AmqpEgress, node: NodeId) -> AmqpSink {
        let broker = redacted_url(&cfg.url);
        let span = tracing::info_span!("amqp_egress", broker = %broker, node);
        let target = Target::new(&cfg);
        if let Err(e) = &target {
            tracing::error!(parent: &span, error = %e, "AMQP egress cannot connect");
        }
        AmqpSink {
            cfg,
            node,
            target,
            supervisor: Supervisor {
                link: None,
                backoff: RECONNECT_INITIAL,
                retry_at: None,
            },
            span,
        }
    }

    /// The broker URL without its password, for logs.
    pub fn broker(&self) -> String {
        redacted_url(&self.cfg.url)
    }

    /// Whether a connection is up and no confirm on it has failed (it may
    /// still turn out to be dead).
    pub fn is_connected(&self) -> bool {
        self.supervisor
            .link
            .as_ref()
            .is_some_and(|l| l.alive() && !l.health.broken.load(Ordering::Relaxed))
    }

    /// Whether RabbitMQ has blocked the connection (memory or disk alarm);
    /// worth exporting as a gauge.
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
        if let Some(link) = &sup.link {
            let working = link.health.confirmed.swap(false, Ordering::Relaxed);
            let broken = link.health.broken.load(Ordering::Relaxed);
            let alive = link.alive();
            if working {
                sup.working();
            }
            if broken {
                // A confirm timed out or failed: the link is not to be
                // trusted, even if the socket still looks open.
                sup.link = None;
                sup.failed(self.cfg.reconnect_backoff_max);
            } else if !alive {
                tracing::warn!("connection to RabbitMQ lost; reconnecting");
                sup.link = None;
                sup.failed(self.cfg.reconnect_backoff_max);
            }
        }
        if sup.link.is_none() {
            if let Some(at) = sup.retry_at {
                // Waiting here rather than failing at once gives one log line
                // per real attempt, spaced by `reconnect_backoff_max` at most.
                tokio::time::sleep_until(at).await;
            }
            let limit = self.cfg.connect_timeout;
            match tokio::time::timeout(limit, Link::open(target, &self.cfg, self.node)).await {
                Ok(Ok(link)) => {
                    tracing::info!(
                        exchange = %target.exchange,
                        queue = %target.queue,
                        routing_key = %target.routing_key,
                        "connected to RabbitMQ"
                    );
                    sup.link = Some(link);
                }
                Ok(Err(e)) => {
                    sup.failed(self.cfg.reconnect_backoff_max);
                    return Err(SinkError::Unavailable(e));
                }
                Err(_) => {
                    sup.failed(self.cfg.reconnect_backoff_max);
                    return Err(SinkError::Unavailable(format!(
                        "connecting to RabbitMQ took longer than {limit:?} (egress.amqp.connect_timeout)"
                    )));
                }
            }
        }
        let link = sup.link.as_ref().expect("connected above");
        match link.publish(target, self.cfg.confirm_timeout, batch).await {
            Ok(confirm) => Ok(confirm),
            Err(why) => {
                // Dropping the connection closes it (lapin sends
                // connection.close if it is still open) without waiting.
                sup.link = None;
                sup.failed(self.cfg.reconnect_backoff_max);
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
    fn new(cfg: &AmqpEgress) -> Result<Target, String> {
        let mut uri: AMQPUri = cfg.url.parse().map_err(|e| {
            format!(
                "egress.amqp.url ({}) is not a valid AMQP URL: {e}",
                redacted_url(&cfg.url)
            )
        })?;
        // amq-protocol-uri reads only domain hosts: an IPv6 literal would
        // silently become `localhost`.
        let authority = cfg
            .url
            .split_once("://")
            .map_or("", |(_, rest)| rest.split(['/', '?']).next().unwrap_or(""));
        if authority
            .rsplit('@')
            .next()
            .is_some_and(|h| h.starts_with('['))
        {
            return Err(format!(
                "egress.amqp.url ({}): IPv6 address literals are not supported by the AMQP client (it would connect to localhost); use a host name",
                redacted_url(&cfg.url)
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
        let short = |key: &str, value: &str| {
            ShortString::try_new(value).map_err(|e| format!("egress.amqp.{key}: {e}"))
        };
        Ok(Target {
            uri,
            exchange: short("exchange", &cfg.exchange)?,
            kind: match cfg.exchange_type {
                ExchangeType::Direct => ExchangeKind::Direct,
                ExchangeType::Fanout => ExchangeKind::Fanout,
                ExchangeType::Topic => ExchangeKind::Topic,
                ExchangeType::Headers => ExchangeKind::Headers,
            },
            queue: short("queue", &cfg.queue)?,
            routing_key: short("routing_key", &cfg.routing_key)?,
        })
    }
}

impl Supervisor {
    /// A connection attempt or the link failed: pause before the next one.
    fn failed(&mut self, max: Duration) {
        self.retry_at = Some(Instant::now() + self.backoff);
        self.backoff = (self.backoff * 2).min(max);
    }

    /// The broker answered a publish: the link works, reset the backoff.
    fn working(&mut self) {
        self.backoff = RECONNECT_INITIAL;
        self.retry_at = None;
    }
}

impl Link {
    /// Connects, opens a confirm-mode channel and declares the topology.
    async fn open(target: &Target, cfg: &AmqpEgress, node: NodeId) -> Result<Link, String> {
        let props = ConnectionProperties::default()
            .with_connection_name(LongString::from(format!("weir node {node}")));
        let conn = Connection::connect_uri(target.uri.clone(), props)
            .await
            .map_err(|e| format!("connecting to RabbitMQ: {e}"))?;
        let channel = conn
            .create_channel()
            .await
            .map_err(|e| format!("opening a channel: {e}"))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| format!("enabling publisher confirms: {e}"))?;
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
                    format!(
                        "declaring durable {} exchange `{}` (egress.amqp.exchange; an existing exchange of another type or durability is refused): {e}",
                        cfg.exchange_type, cfg.exchange
                    )
                })?;
        }
        channel
            .queue_declare(
                target.queue.clone(),
                QueueDeclareOptions::durable(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| {
                format!(
                    "declaring durable queue `{}` (egress.amqp.queue; an existing queue with other arguments is refused): {e}",
                    cfg.queue
                )
            })?;
        if !cfg.exchange.is_empty() {
            channel
                .queue_bind(
                    target.queue.clone(),
                    target.exchange.clone(),
                    target.routing_key.clone(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(|e| {
                    format!(
                        "binding queue `{}` to exchange `{}` with routing key `{}`: {e}",
                        cfg.queue, cfg.exchange, cfg.routing_key
                    )
                })?;
        }
        Ok(Link {
            conn,
            channel,
            health: Arc::default(),
        })
    }

    fn alive(&self) -> bool {
        self.conn.status().connected() && self.channel.status().connected()
    }

    /// Publishes one batch; returns once lapin has written it, with the
    /// future of its confirm.
    async fn publish(
        &self,
        target: &Target,
        limit: Duration,
        batch: &EncodedBatch,
    ) -> Result<Confirm, String> {
        let status = self.conn.status().clone();
        let publish = self.channel.basic_publish(
            target.exchange.clone(),
            target.routing_key.clone(),
            BasicPublishOptions {
                mandatory: true,
                immediate: false,
            },
            &batch.body,
            properties(batch),
        );
        // Resolves once lapin has written the frames (it holds them while
        // the connection is blocked).
        let confirm = within(&status, limit, "publish", publish)
            .await?
            .map_err(|e| format!("publishing batch {}: {e}", batch.seq))?;
        let health = Arc::clone(&self.health);
        let seq = batch.seq;
        let exchange = target.exchange.clone();
        let routing_key = target.routing_key.clone();
        Ok(Box::pin(async move {
            let confirmation = match within(&status, limit, "publisher confirm", confirm).await {
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
                    Err(SinkError::Refused(format!(
                        "RabbitMQ returned batch {seq} ({} {}): no queue is bound to exchange `{exchange}` with routing key `{routing_key}`; bind one or fix egress.amqp.routing_key",
                        returned.reply_code, returned.reply_text,
                    )))
                }
                Confirmation::Nack(None) => Err(SinkError::Refused(format!(
                    "RabbitMQ nacked batch {seq} (it could not store it)"
                ))),
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

/// Awaits `fut` for at most `limit`, except that time spent while RabbitMQ
/// blocks the connection does not count: a blocked broker is waited for
/// (back-pressure), a silent one is given up on.
async fn within<F: Future>(
    status: &ConnectionStatus,
    limit: Duration,
    what: &str,
    fut: F,
) -> Result<F::Output, String> {
    let mut fut = std::pin::pin!(fut);
    let mut deadline = Instant::now() + limit;
    let mut blocked_since: Option<Instant> = None;
    loop {
        // Cancel safety: `fut` is pinned outside the loop and polled by
        // reference, so the timer winning loses nothing; the timer is
        // rebuilt from `deadline` on every turn.
        tokio::select! {
            out = &mut fut => {
                if let Some(since) = blocked_since {
                    tracing::info!(blocked_for = ?since.elapsed(), "RabbitMQ unblocked the connection");
                }
                return Ok(out);
            }
            () = tokio::time::sleep_until(deadline) => {}
        }
        let now = Instant::now();
        if status.blocked() {
            if blocked_since.is_none() {
                tracing::warn!(
                    "RabbitMQ blocked the connection (memory or disk alarm); holding the batch until it unblocks"
                );
                blocked_since = Some(now);
            }
            deadline = now + limit;
        } else if let Some(since) = blocked_since.take() {
            // Unblocked since the last check: the broker has only just
            // resumed reading, so it gets a whole period again.
            tracing::info!(blocked_for = ?since.elapsed(), "RabbitMQ unblocked the connection");
            deadline = now + limit;
        } else {
            return Err(format!(
                "no {what} from RabbitMQ within {limit:?} (egress.amqp.confirm_timeout)"
            ));
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
        let err = Target::new(&cfg).err().expect("refused");
        assert!(err.contains("IPv6") && !err.contains("hunter2"), "{err}");
        cfg.url = "amqp://weir:hunter2@rabbit.example:5672/%2f".into();
        assert!(Target::new(&cfg).is_ok());
    }

    fn config(url: &str) -> AmqpEgress {
        AmqpEgress {
            url: url.into(),
            exchange: "weir".into(),
            exchange_type: ExchangeType::Direct,
            queue: "weir.batches".into(),
            routing_key: "weir.batches".into(),
            confirm_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            reconnect_backoff_max: Duration::from_secs(1),
            max_in_flight: 4,
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
