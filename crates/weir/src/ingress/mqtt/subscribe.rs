//! MQTT `subscribe` mode: weir is a client of an existing broker (Mosquitto
//! in the JANUS deployment) and relays what it receives on the configured
//! topic filters.
//!
//! # Guarantees
//! - **At least once for QoS 1.** weir connects with a fixed client id and
//!   a persistent session (`clean_session = false`) and acknowledges a
//!   PUBLISH only after its record is in its class queue (manual acks). A
//!   publish that was not acknowledged when weir stopped, crashed or lost the
//!   connection is sent again by the broker on the next connection; one that
//!   arrived while weir was offline waits in the broker's session.
//! - **Back-pressure.** One task reads the connection and enqueues; while a
//!   class queue is full it waits in [`Intake::enqueue`] and stops
//!   reading. The broker then holds every further QoS 1 delivery once its
//!   in-flight window of un-acknowledged publishes is used up (MQTT 3.1.1
//!   gives the client no say in that window: it is the broker's setting,
//!   Mosquitto's `max_inflight_messages`, default 20; rumqttc's own
//!   `inflight` option counts weir's *outgoing* publishes, of which there are
//!   none). QoS 0 publishes follow `qos0_when_full`: `block` waits like
//!   QoS 1 (the TCP window then fills and the broker buffers or drops by its
//!   own limits), `drop` drops the record and counts it.
//! - **Resubscribe on every connection**, whatever `session_present` says
//!   (see `Subscriber::on_connack` for why).
//! - **Bad packets do not stop the loop.** A malformed packet from the
//!   broker (a topic that is not UTF-8, a packet over `max_packet_size`)
//!   makes rumqttc drop the connection; weir counts a protocol error, logs
//!   what to fix, and reconnects with a capped backoff.
//!
//! # Layout
//! - [`run`]: the entry point the app spawns.
//! - `Subscriber`: the rumqttc client and event loop, and what weir does on
//!   each event.
//! - `Outbox`: requests (acks, the subscription) for rumqttc's bounded
//!   request channel that did not fit yet.

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rumqttc::mqttbytes::Error as PacketError;
use rumqttc::{
    AsyncClient, ConnAck, ConnectionError, Event, EventLoop, MqttOptions, Outgoing, Packet,
    Publish, QoS, StateError, SubAck, SubscribeFilter, SubscribeReasonCode,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use weir_core::backoff::Backoff;

use crate::config::{MqttIngress, MqttSubscribe, Qos0WhenFull, SubscribeQos};
use crate::intake::{Accepted, EnqueueError, Intake};

/// MQTT keep-alive: the broker drops a silent weir after 1.5 times this and
/// weir gives up on a broker that misses a PINGRESP within about twice it.
/// Short enough to notice a dead link within a minute; long enough that a
/// class queue full for a while (weir does not poll, so it does not ping)
/// rarely costs a reconnect. If it does, nothing is lost: the publish weir
/// was holding is redelivered.
const KEEP_ALIVE: Duration = Duration::from_secs(30);

/// First pause after a failed connection or poll: short, because a broker
/// restart on the same box is back within a fraction of a second.
const RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(200);

/// Longest pause between reconnect attempts: bounds the extra delay after an
/// outage ends, while an unreachable broker costs one attempt per 10 s.
const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(10);

/// A connection that lived this long was healthy, so the next failure starts
/// again from [`RECONNECT_BACKOFF_MIN`]; a packet that kills every fresh
/// connection (one the broker redelivers) keeps backing off instead.
const STABLE_CONNECTION: Duration = Duration::from_secs(10);

/// Capacity of rumqttc's request channel (acks, SUBSCRIBE, DISCONNECT). One
/// read yields at most 10 packets and the broker's in-flight window (20 on
/// Mosquitto) bounds the acks owed, so this rarely fills; when it does, the
/// [`Outbox`] keeps the rest, because the task that polls the event loop
/// must never wait on the channel the event loop drains.
const REQUEST_CHANNEL_CAPACITY: usize = 64;

/// rumqttc's window of weir's *outgoing* QoS 1 publishes, which weir never
/// sends; it also numbers SUBSCRIBE packets, of which at most a couple are
/// outstanding, so a small value keeps rumqttc's per-slot table small.
const OUTGOING_INFLIGHT: u16 = 10;

/// How long shutdown waits to deliver the owed acks and a DISCONNECT before
/// it drops the socket (the broker then redelivers what was not acked).
const DISCONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Runs subscribe mode until `shutdown`: connects to `sub.broker`,
/// subscribes, enqueues every publish, reconnects with backoff; on shutdown
/// it stops reading, sends the acks it owes and disconnects cleanly.
pub async fn run(
    cfg: MqttIngress,
    sub: MqttSubscribe,
    ingress: Arc<Intake>,
    shutdown: CancellationToken,
) {
    let span = tracing::info_span!(
        "mqtt_subscribe",
        broker = %sub.broker,
        client_id = %sub.client_id
    );
    async move {
        let Some(subscriber) = Subscriber::new(&cfg, &sub, ingress) else {
            return;
        };
        subscriber.run(shutdown).await;
    }
    .instrument(span)
    .await
}

/// One acknowledgement owed to the broker: enough of a PUBLISH to build its
/// PUBACK (QoS 1) or PUBREC (QoS 2, which weir never asks for but a broker
/// might still send).
#[derive(Debug, Clone, Copy)]
struct Ack {
    qos: QoS,
    pkid: u16,
}

impl Ack {
    /// The ack a publish needs, or `None` for QoS 0.
    fn of(publish: &Publish) -> Option<Ack> {
        (publish.qos != QoS::AtMostOnce).then_some(Ack {
            qos: publish.qos,
            pkid: publish.pkid,
        })
    }

    /// A PUBLISH stub carrying only what `AsyncClient::try_ack` reads (QoS
    /// and packet id), so the owed acks do not pin topics and payloads.
    fn stub(self) -> Publish {
        let mut publish = Publish::new("", self.qos, Vec::new());
        publish.pkid = self.pkid;
        publish
    }
}

/// Requests for the event loop that did not fit its bounded channel yet;
/// flushed before every poll, in order.
#[derive(Debug, Default)]
struct Outbox {
    /// Acks owed, in the order the publishes arrived (MQTT 3.1.1 section
    /// 4.6 asks for PUBACKs in that order).
    acks: VecDeque<Ack>,
    /// The SUBSCRIBE for this connection is still to be queued.
    subscribe: bool,
}

impl Outbox {
    /// Queues as much as the channel takes; the rest waits for the next call.
    fn flush(&mut self, client: &AsyncClient, filters: &[SubscribeFilter]) {
        while let Some(ack) = self.acks.front() {
            // The only failure left is a full channel (the event loop, which
            // owns the receiver, lives as long as `client`): retry later.
            if client.try_ack(&ack.stub()).is_err() {
                return;
            }
            self.acks.pop_front();
        }
        if self.subscribe && client.try_subscribe_many(filters.iter().cloned()).is_ok() {
            self.subscribe = false;
        }
    }

    /// Forgets what belonged to a connection that is gone: rumqttc drops
    /// the acks still in its channel too, because packet ids are per
    /// connection and the broker redelivers those publishes anyway.
    fn connection_lost(&mut self) {
        self.acks.clear();
        self.subscribe = false;
    }
}

/// The rumqttc client, its event loop, and what weir does with each event.
struct Subscriber {
    client: AsyncClient,
    eventloop: EventLoop,
    ingress: Arc<Intake>,
    /// Every configured filter at the configured QoS, sent as one SUBSCRIBE.
    filters: Vec<SubscribeFilter>,
    qos0_when_full: Qos0WhenFull,
    max_packet_size: usize,
    outbox: Outbox,
}

impl Subscriber {
    /// Builds the client; `None` (logged) if the settings cannot work.
    fn new(cfg: &MqttIngress, sub: &MqttSubscribe, ingress: Arc<Intake>) -> Option<Self> {
        // Validation refuses an empty client id; rumqttc would panic on it
        // with a persistent session, so refuse rather than bring weir down.
        if sub.client_id.is_empty() {
            tracing::error!("MQTT subscribe mode needs a client id (ingress.mqtt.client_id)");
            return None;
        }
        let qos = match sub.qos {
            SubscribeQos::AtMostOnce => QoS::AtMostOnce,
            SubscribeQos::AtLeastOnce => QoS::AtLeastOnce,
        };
        let filters: Vec<SubscribeFilter> = sub
            .topics
            .iter()
            .map(|f| SubscribeFilter::new(f.as_str().to_owned(), qos))
            .collect();
        // rumqttc checks filters again and refuses the whole SUBSCRIBE if one
        // fails; weir-core validated them by the same MQTT rules, so a
        // mismatch is a bug worth naming rather than a silent retry loop.
        if let Some(bad) = filters.iter().find(|f| !rumqttc::valid_filter(&f.path)) {
            tracing::error!(filter = %bad.path, "topic filter refused by the MQTT client library");
            return None;
        }

        // rumqttc joins host and port as `host:port`, so an IPv6 literal
        // needs its brackets to resolve.
        let host = if sub.broker.host.contains(':') {
            format!("[{}]", sub.broker.host)
        } else {
            sub.broker.host.clone()
        };
        let mut options = MqttOptions::new(sub.client_id.clone(), host, sub.broker.port);
        options
            .set_clean_session(false)
            .set_manual_acks(true)
            .set_keep_alive(KEEP_ALIVE)
            .set_max_packet_size(cfg.max_packet_size, cfg.max_packet_size)
            .set_inflight(OUTGOING_INFLIGHT)
            .set_request_channel_capacity(REQUEST_CHANNEL_CAPACITY);
        let (client, eventloop) = AsyncClient::new(options, REQUEST_CHANNEL_CAPACITY);
        Some(Subscriber {
            client,
            eventloop,
            ingress,
            filters,
            qos0_when_full: cfg.qos0_when_full,
            max_packet_size: cfg.max_packet_size,
            outbox: Outbox::default(),
        })
    }

    /// The connection loop: poll, handle, back off after errors.
    async fn run(mut self, shutdown: CancellationToken) {
        let mut backoff = Backoff::new(RECONNECT_BACKOFF_MIN, RECONNECT_BACKOFF_MAX);
        let mut connected_at: Option<Instant> = None;
        loop {
            self.outbox.flush(&self.client, &self.filters);
            // Cancel safety: dropping `poll` on shutdown may lose a packet it
            // was reading; that is at worst an un-acked publish, which the
            // broker redelivers. `biased`: a busy broker must not delay
            // shutdown.
            let event = tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                event = self.eventloop.poll() => event,
            };
            match event {
                Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                    connected_at = Some(Instant::now());
                    self.on_connack(&ack);
                }
                Ok(Event::Incoming(Packet::Publish(publish))) => {
                    if self.on_publish(publish, &shutdown).await.is_break() {
                        break;
                    }
                }
                Ok(Event::Incoming(Packet::SubAck(ack))) => self.on_suback(&ack),
                Ok(_) => {}
                Err(error) => {
                    self.outbox.connection_lost();
                    if connected_at
                        .take()
                        .is_some_and(|t| t.elapsed() >= STABLE_CONNECTION)
                    {
                        backoff.reset();
                    }
                    let wait = backoff.failed();
                    self.on_error(&error, wait);
                    // Cancel safety: only a sleep; nothing is held.
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
        self.disconnect().await;
    }

    /// A new connection: subscribe to every filter again.
    ///
    /// Why always, even when `session_present` says the broker kept the
    /// subscriptions: (1) the session may be gone without weir having
    /// asked for it (first connection, a broker restarted without
    /// persistence, Mosquitto's `persistent_client_expiration`, or another
    /// client that took the client id over with a clean session), and then
    /// nothing would ever arrive; (2) rumqttc discards the requests it had
    /// queued for the old connection when the new one has no session, so a
    /// SUBSCRIBE sent just before a drop is lost; (3) subscribing again to
    /// an existing filter is harmless (MQTT 3.1.1 section 3.8.4: it replaces
    /// the subscription without interrupting the flow) and picks up filters
    /// added to the config since the session was created. The cost: the
    /// broker re-sends retained messages matching the filters.
    fn on_connack(&mut self, ack: &ConnAck) {
        tracing::info!(
            session_present = ack.session_present,
            "connected to the MQTT broker; subscribing"
        );
        self.outbox.subscribe = true;
    }

    /// Logs filters the broker refused or downgraded.
    fn on_suback(&self, ack: &SubAck) {
        for (filter, code) in self.filters.iter().zip(&ack.return_codes) {
            match code {
                SubscribeReasonCode::Failure => tracing::error!(
                    filter = %filter.path,
                    "the broker refused the subscription; check its ACL for this client id"
                ),
                SubscribeReasonCode::Success(granted) if *granted < filter.qos => {
                    tracing::warn!(
                        filter = %filter.path,
                        granted = *granted as u8,
                        requested = filter.qos as u8,
                        "the broker granted a lower QoS than requested"
                    )
                }
                SubscribeReasonCode::Success(_) => {}
            }
        }
    }

    /// Enqueues one publish and acks it once queued; `Break` on shutdown.
    async fn on_publish(
        &mut self,
        publish: Publish,
        shutdown: &CancellationToken,
    ) -> ControlFlow<()> {
        let ack = Ack::of(&publish);
        let record = self
            .ingress
            .mqtt_record(Bytes::from(publish.topic.into_bytes()), publish.payload);
        let (class, topic) = (record.class, record.key.clone());

        let outcome = if ack.is_none() && self.qos0_when_full == Qos0WhenFull::Drop {
            match self.ingress.try_accept(record) {
                Err(EnqueueError::Full { .. }) => {
                    self.ingress.metrics().dropped(class);
                    Ok(Accepted::Dropped)
                }
                other => other,
            }
        } else {
            // Cancel safety: dropping `accept` drops the record before it
            // was queued and before it was acked, so the broker still owns
            // it (QoS 1) and redelivers it on the next connection.
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => Err(EnqueueError::ShuttingDown),
                outcome = self.ingress.accept(record, None) => outcome,
            }
        };

        match outcome {
            Ok(Accepted::Spooling(ticket)) if ack.is_some() => {
                // The broker's acknowledgement means on disk. One wait per
                // publish: the broker's in-flight window (Mosquitto: 20)
                // shares each group commit.
                if !ticket.durable().await {
                    return ControlFlow::Break(());
                }
            }
            Ok(_) => {}
            // Acked anyway: it can never fit, and left un-acked it would come
            // back on every connection and occupy a slot of the broker's
            // in-flight window for good. Counted as refused by the handle.
            Err(error @ EnqueueError::Oversized { .. }) => tracing::warn!(
                topic = %String::from_utf8_lossy(&topic),
                %error,
                "record refused"
            ),
            Err(EnqueueError::ShuttingDown) => return ControlFlow::Break(()),
            // `enqueue` without a deadline only returns `Full` if the handle
            // changes; not acking leaves the record with the broker.
            Err(error @ EnqueueError::Full { .. }) => {
                tracing::warn!(topic = %String::from_utf8_lossy(&topic), %error, "record not queued");
                return ControlFlow::Continue(());
            }
        }
        if let Some(ack) = ack {
            self.outbox.acks.push_back(ack);
            self.outbox.flush(&self.client, &self.filters);
        }
        ControlFlow::Continue(())
    }

    /// Logs a failed connection or poll with what to do about it.
    fn on_error(&self, error: &ConnectionError, retry_in: Duration) {
        let ConnectionError::MqttState(StateError::Deserialization(packet)) = error else {
            match error {
                ConnectionError::ConnectionRefused(code) => tracing::error!(
                    ?code,
                    ?retry_in,
                    "the MQTT broker refused the connection; check ingress.mqtt.client_id and the broker's access rules"
                ),
                _ => tracing::warn!(%error, ?retry_in, "MQTT broker connection failed; reconnecting"),
            }
            return;
        };
        // The broker sent something weir cannot read; rumqttc has dropped
        // the connection. A QoS 1 publish will be redelivered, so say how to
        // stop it rather than just that it happened.
        self.ingress.metrics().protocol_errors.inc();
        match packet {
            PacketError::TopicNotUtf8 => tracing::error!(
                ?retry_in,
                "the MQTT broker sent a publish whose topic is not UTF-8 (MQTT 3.1.1 section 1.5.3 forbids it); reconnecting. If the broker redelivers it, remove it at the broker"
            ),
            PacketError::PayloadSizeLimitExceeded(size) => tracing::error!(
                size,
                limit = self.max_packet_size,
                ?retry_in,
                "the MQTT broker sent a packet larger than ingress.mqtt.max_packet_size; reconnecting. Raise the limit, or cap the broker (Mosquitto: max_packet_size) so it refuses such publishes"
            ),
            other => tracing::error!(
                error = %other,
                ?retry_in,
                "malformed packet from the MQTT broker; reconnecting"
            ),
        }
    }

    /// Sends the acks owed for records already queued (so the broker does not
    /// redeliver them) and a DISCONNECT, then waits for the broker to close
    /// the connection, all within [`DISCONNECT_TIMEOUT`].
    async fn disconnect(mut self) {
        if self.eventloop.network.is_none() {
            return;
        }
        self.outbox.subscribe = false;
        let (mut disconnect_queued, mut disconnect_sent) = (false, false);
        let goodbye = async {
            loop {
                self.outbox.flush(&self.client, &self.filters);
                // The channel is FIFO: once the owed acks are in, the
                // DISCONNECT goes in behind them.
                if !disconnect_queued && self.outbox.acks.is_empty() {
                    disconnect_queued = self.client.try_disconnect().is_ok();
                }
                // Publishes still arriving are read and ignored, not acked:
                // the broker keeps them for the next connection.
                match self.eventloop.poll().await {
                    Ok(Event::Outgoing(Outgoing::Disconnect)) => disconnect_sent = true,
                    Ok(_) => {}
                    // Closing first with unread bytes in the socket would
                    // send a TCP reset, and the broker may then discard the
                    // acks and the DISCONNECT it has not read yet (seen with
                    // Mosquitto: an acked publish redelivered). So read until
                    // the broker closes, as MQTT 3.1.1 section 3.14.4 lets it.
                    Err(_) => return disconnect_sent,
                }
            }
        };
        match tokio::time::timeout(DISCONNECT_TIMEOUT, goodbye).await {
            Ok(true) => tracing::info!("disconnected from the MQTT broker"),
            _ => {
                tracing::warn!("no clean disconnect from the MQTT broker; dropping the connection")
            }
        }
    }
}
