//! One connection to RabbitMQ: its confirm-mode channel and topology, the
//! task that follows the broker's blocks, and the waits on publishes and
//! confirms that a block does not time out.

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
use lapin::types::{FieldTable, LongString};
use lapin::{
    Channel, Confirmation, Connection, ConnectionProperties, ConnectionStatus, ErrorKind, Event,
};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};
use weir_core::NodeId;

use super::message::properties;
use super::target::Target;
use crate::config::AmqpEgress;
use crate::egress::batch::EncodedBatch;
use crate::egress::sink::{Confirm, SinkError};
use crate::metrics::amqp::AmqpMetrics;

/// Why a connection attempt failed.
pub(super) enum OpenError {
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

/// A connection with its confirm-mode channel and declared topology.
pub(super) struct Link {
    pub(super) conn: Connection,
    pub(super) channel: Channel,
    /// Index of the endpoint it is connected to.
    pub(super) endpoint: usize,
    /// What the confirmations of this link's publishes found out.
    pub(super) health: Arc<Health>,
    /// Why RabbitMQ blocked the connection, while it does.
    pub(super) blocked: Arc<Mutex<BrokerBlock>>,
    /// Stops the task that follows the connection's events.
    pub(super) _events: DropGuard,
}

/// Told by pending confirmations, read by the next send.
#[derive(Default)]
pub(super) struct Health {
    /// A confirm failed or timed out: reconnect before the next publish.
    pub(super) broken: AtomicBool,
    /// A confirm arrived since the last send: the broker works, reset the
    /// reconnect backoff.
    pub(super) confirmed: AtomicBool,
    /// A publish was nacked: publish the next on a new channel. A channel
    /// that published to a quorum queue while its leader was changing can
    /// go on being refused after the new leader is up (RabbitMQ 3.10's
    /// channel keeps the queue's old leader); a new channel asks afresh.
    pub(super) nacked: AtomicBool,
}

/// A declaration error: the broker's words, and whether it is one that a
/// retry cannot mend (PRECONDITION_FAILED, ACCESS_REFUSED).
pub(super) fn declaration_error(e: &lapin::Error, key: &'static str, what: String) -> OpenError {
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
pub(super) fn explain_broker(said: &str) -> String {
    if said.contains("'x-queue-type'") && said.contains("current is none") {
        format!("{said} (\"none\" is RabbitMQ's name for a classic queue here: the queue exists as classic; delete it, or set egress.amqp.queue_type = \"classic\")")
    } else {
        said.to_owned()
    }
}

/// How long a publish and its confirm may take.
#[derive(Clone, Copy)]
pub(super) struct Limits {
    /// Without a block: `confirm_timeout`.
    pub(super) confirm: Duration,
    /// With a block: give up this long into it (with another endpoint to
    /// go to), else wait.
    pub(super) blocked_failover: Option<Duration>,
}

impl Link {
    /// Connects to endpoint `i`, opens a confirm-mode channel and declares
    /// the topology.
    pub(super) async fn open(
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

    pub(super) fn alive(&self) -> bool {
        self.conn.status().connected() && self.channel.status().connected()
    }

    /// Replaces the channel with a new confirm-mode one (the topology is
    /// declared already). Confirms pending on the old one are lost to it:
    /// the egress publishes those batches again.
    pub(super) async fn renew_channel(&mut self) -> Result<(), String> {
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
    pub(super) async fn publish(
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
pub(super) struct BrokerBlock {
    reason: Option<String>,
    blocks: u64,
}

/// Follows a connection's events until it closes or `stop` fires: the
/// broker's block and its reason, into `blocked` and the metrics.
pub(super) async fn follow_events(
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
pub(super) struct Watch {
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
    pub(super) async fn within<F: Future>(&self, what: &str, fut: F) -> Result<F::Output, String> {
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
