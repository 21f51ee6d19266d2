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
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;
use weir_core::backoff::Backoff;
use weir_core::{ClassSet, NodeId};

use super::batch::EncodedBatch;
use super::sink::{Confirm, Sink, SinkError};
use crate::config::AmqpEgress;
use crate::metrics::amqp::AmqpMetrics;

mod link;
mod message;
mod target;

use link::{Limits, Link, OpenError};
pub use message::{
    header_u64, message_id, redacted_url, APP_ID, HEADER_BATCH_SEQ, HEADER_CLASS, HEADER_NODE,
    HEADER_RECORDS, HEADER_SENT_US,
};
use target::Target;

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

#[cfg(test)]
mod tests;
