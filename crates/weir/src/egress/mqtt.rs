//! MQTT egress: batches published at QoS 1 to a broker (AWS IoT Core,
//! HiveMQ, EMQX, Azure IoT Hub, a central Mosquitto) through rumqttc; the
//! broker's PUBACK is the confirm.
//!
//! Two modes (`egress.mqtt.mode`):
//! - `records`: every record of the batch is published on its own topic,
//!   `topic_prefix` followed by the record's key (its MQTT topic or gRPC
//!   stream), with its payload as it came. The batch is confirmed once
//!   every one of its publishes is acknowledged.
//! - `batch`: the batch body (`weir.v1.Batch`, compressed or not; `weir
//!   decode` tells the codec from its first bytes) is one publish on
//!   `topic` (`{node}` and `{class}` filled in).
//!
//! The broker's limits are kept: batches are cut to `max_payload` (the
//! config lowers the batch cap and the default ingress limits to fit),
//! and at most `max_in_flight` publishes await their PUBACK (rumqttc holds
//! the rest back).
//!
//! One task drives the connection's event loop. It learns each publish's
//! packet id as rumqttc sends it (in request order) and, on its PUBACK,
//! counts it off its batch. When the connection fails, every batch not yet
//! confirmed fails with it and the task ends; the next send connects
//! afresh (a new session state in rumqttc, so nothing is resent behind the
//! delivery machine's back), and the delivery machine sends those batches
//! again: a record may then reach the broker twice.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rumqttc::{AsyncClient, ConnectionError, Event, EventLoop, MqttOptions, Outgoing, Packet, QoS};
use tokio::sync::oneshot;
use tokio::time::Instant;
use weir_core::backoff::Backoff;
use weir_core::{ClassSet, NodeId};

use super::batch::EncodedBatch;
use super::sink::{confirmed, Confirm, Sink, SinkError};
use crate::config::{MqttEgress, MqttEgressMode};

/// Requests rumqttc buffers between the sink and its event loop.
const REQUESTS: usize = 1024;

/// Why start-up stops: the broker refused weir (certificate, credentials).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{key}: {message}")]
pub struct RefusedError {
    /// The config key to look at.
    pub key: &'static str,
    pub message: String,
}

/// Publishes batches to an MQTT broker.
pub struct MqttSink {
    cfg: MqttEgress,
    node: NodeId,
    classes: Vec<String>,
    conn: Option<Conn>,
    backoff: Backoff,
    retry_at: Option<Instant>,
}

struct Conn {
    client: AsyncClient,
    track: Arc<Mutex<Track>>,
}

/// What the event loop's task and the sink share: publishes in request
/// order, then by packet id once sent.
#[derive(Default)]
struct Track {
    unsent: VecDeque<Arc<BatchAck>>,
    in_flight: HashMap<u16, Arc<BatchAck>>,
    /// Set when the connection failed: why.
    broken: Option<String>,
}

/// A batch's publishes still awaiting their PUBACK.
struct BatchAck {
    remaining: AtomicUsize,
    done: Mutex<Option<oneshot::Sender<Result<(), SinkError>>>>,
}

impl BatchAck {
    fn acked(&self) {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.finish(Ok(()));
        }
    }

    fn finish(&self, outcome: Result<(), SinkError>) {
        if let Some(tx) = self.done.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = tx.send(outcome);
        }
    }
}

impl std::fmt::Debug for MqttSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MqttSink")
            .field("broker", &self.cfg.broker)
            .field("mode", &self.cfg.mode)
            .field("connected", &self.conn.is_some())
            .finish()
    }
}

/// Why connecting failed.
enum ConnectError {
    Unavailable(String),
    Refused(RefusedError),
}

impl MqttSink {
    pub fn new(cfg: MqttEgress, node: NodeId, classes: &ClassSet) -> MqttSink {
        let backoff = Backoff::new(Duration::from_millis(100), cfg.reconnect_backoff_max);
        MqttSink {
            node,
            classes: classes.iter().map(|(_, c)| c.name.clone()).collect(),
            conn: None,
            backoff,
            retry_at: None,
            cfg,
        }
    }

    /// Connects once: a broker that refuses weir (its certificate, its
    /// credentials) stops start-up; one out of reach does not (logged;
    /// sending retries).
    pub async fn start(&mut self) -> Result<(), RefusedError> {
        match self.connect().await {
            Ok(()) => Ok(()),
            Err(ConnectError::Refused(e)) => Err(e),
            Err(ConnectError::Unavailable(why)) => {
                tracing::warn!(error = %why, "MQTT broker not reachable at start-up; batches wait (spooled classes keep acknowledging) and delivery retries");
                Ok(())
            }
        }
    }

    fn options(&self) -> Result<MqttOptions, ConnectError> {
        let cfg = &self.cfg;
        // rumqttc joins host and port as `host:port`.
        let host = if cfg.broker.host.contains(':') {
            format!("[{}]", cfg.broker.host)
        } else {
            cfg.broker.host.clone()
        };
        let mut o = MqttOptions::new(cfg.client_id.clone(), host, cfg.broker.port);
        let max_topic = self.max_topic_len();
        let packet = cfg.max_payload as usize + max_topic + 64;
        o.set_keep_alive(cfg.keep_alive)
            .set_clean_session(cfg.clean_session)
            .set_inflight(u16::try_from(cfg.max_in_flight).unwrap_or(u16::MAX))
            .set_max_packet_size(packet, packet)
            .set_request_channel_capacity(REQUESTS);
        if let Some(user) = &cfg.username {
            o.set_credentials(user.clone(), cfg.password.clone().unwrap_or_default());
        }
        if cfg.tls {
            let tls = tls_config(cfg).map_err(ConnectError::Refused)?;
            o.set_transport(rumqttc::Transport::tls_with_config(
                rumqttc::TlsConfiguration::Rustls(Arc::new(tls)),
            ));
        }
        Ok(o)
    }

    /// The longest topic a publish can have: batch mode's rendered topic,
    /// or the prefix with the longest MQTT topic (65,535 bytes).
    fn max_topic_len(&self) -> usize {
        match self.cfg.mode {
            MqttEgressMode::Batch => {
                self.cfg.topic.len() + 64 + self.classes.iter().map(String::len).max().unwrap_or(0)
            }
            MqttEgressMode::Records => self.cfg.topic_prefix.len() + 65_535,
        }
    }

    async fn connect(&mut self) -> Result<(), ConnectError> {
        let options = self.options()?;
        let (client, eventloop) = AsyncClient::new(options, REQUESTS);
        let track = Arc::new(Mutex::new(Track::default()));
        let (connected_tx, connected) = oneshot::channel();
        tokio::spawn(drive(eventloop, Arc::clone(&track), connected_tx));
        let limit = self.cfg.connect_timeout;
        let broker = self.cfg.broker.to_string();
        match tokio::time::timeout(limit, connected).await {
            Ok(Ok(Ok(()))) => {
                tracing::info!(%broker, "connected to the MQTT broker");
                self.conn = Some(Conn { client, track });
                Ok(())
            }
            Ok(Ok(Err(e))) => Err(classify(&broker, e)),
            Ok(Err(_)) => Err(ConnectError::Unavailable(format!(
                "{broker}: the connection task ended"
            ))),
            Err(_) => {
                let _ = client.try_disconnect();
                Err(ConnectError::Unavailable(format!(
                    "{broker}: no CONNACK within {limit:?} (egress.mqtt.connect_timeout)"
                )))
            }
        }
    }

    async fn send_batch(&mut self, batch: &EncodedBatch) -> Result<Confirm, SinkError> {
        if self
            .conn
            .as_ref()
            .is_some_and(|c| lock(&c.track).broken.is_some())
        {
            self.drop_connection();
        }
        if self.conn.is_none() {
            if let Some(at) = self.retry_at {
                tokio::time::sleep_until(at).await;
            }
            if let Err(e) = self.connect().await {
                self.retry_at = Some(Instant::now() + self.backoff.failed());
                return Err(match e {
                    ConnectError::Unavailable(why) => SinkError::Unavailable(why),
                    ConnectError::Refused(e) => SinkError::Unavailable(e.to_string()),
                });
            }
        }
        let publishes = self.publishes(batch)?;
        if publishes.is_empty() {
            return Ok(confirmed());
        }
        let (tx, rx) = oneshot::channel();
        let ack = Arc::new(BatchAck {
            remaining: AtomicUsize::new(publishes.len()),
            done: Mutex::new(Some(tx)),
        });
        let conn = self.conn.as_ref().expect("connected above");
        for (topic, payload) in publishes {
            // Registered before the request goes: the event loop sees the
            // publishes in this order.
            lock(&conn.track).unsent.push_back(Arc::clone(&ack));
            if let Err(e) = conn
                .client
                .publish_bytes(topic, QoS::AtLeastOnce, false, payload)
                .await
            {
                ack.finish(Err(SinkError::Unavailable(format!(
                    "MQTT client stopped: {e}"
                ))));
                self.drop_connection();
                return Err(SinkError::Unavailable(format!("MQTT client stopped: {e}")));
            }
        }
        self.backoff.reset();
        self.retry_at = None;
        let limit = self.cfg.confirm_timeout;
        Ok(Box::pin(async move {
            match tokio::time::timeout(limit, rx).await {
                Ok(Ok(outcome)) => outcome,
                Ok(Err(_)) => Err(SinkError::Unavailable(
                    "the MQTT connection task ended".into(),
                )),
                Err(_) => Err(SinkError::Unavailable(format!(
                    "no PUBACK within {limit:?} (egress.mqtt.confirm_timeout)"
                ))),
            }
        }))
    }

    /// The publishes of `batch`: `(topic, payload)`.
    fn publishes(&self, batch: &EncodedBatch) -> Result<Vec<(String, bytes::Bytes)>, SinkError> {
        match self.cfg.mode {
            MqttEgressMode::Batch => {
                let class = self
                    .classes
                    .get(usize::from(batch.class.0))
                    .map_or("", String::as_str);
                Ok(vec![(
                    self.cfg.topic_for(self.node, class),
                    batch.body.clone(),
                )])
            }
            MqttEgressMode::Records => {
                let decoded =
                    weir_proto::decode_batch(&batch.body, batch.encoding.as_str(), usize::MAX)
                        .map_err(|e| {
                            SinkError::Refused(format!("batch {} does not decode: {e}", batch.seq))
                        })?;
                Ok(decoded
                    .records
                    .into_iter()
                    .map(|r| (format!("{}{}", self.cfg.topic_prefix, r.key), r.payload))
                    .collect())
            }
        }
    }

    fn drop_connection(&mut self) {
        if let Some(conn) = self.conn.take() {
            let _ = conn.client.try_disconnect();
            self.retry_at = Some(Instant::now() + self.backoff.failed());
        }
    }
}

impl Sink for MqttSink {
    async fn send(&mut self, batch: &EncodedBatch) -> Result<Confirm, SinkError> {
        self.send_batch(batch).await
    }

    fn window(&self) -> usize {
        // Batches, not publishes: rumqttc keeps max_in_flight publishes
        // unacknowledged and holds the rest back.
        self.cfg.max_in_flight.clamp(1, 64)
    }

    fn name(&self) -> &'static str {
        "mqtt"
    }
}

fn lock(track: &Mutex<Track>) -> std::sync::MutexGuard<'_, Track> {
    track.lock().unwrap_or_else(|e| e.into_inner())
}

/// Drives one connection's event loop until it fails: packet ids to
/// batches, PUBACKs counted off.
async fn drive(
    mut eventloop: EventLoop,
    track: Arc<Mutex<Track>>,
    connected: oneshot::Sender<Result<(), ConnectionError>>,
) {
    let mut connected = Some(connected);
    loop {
        match eventloop.poll().await {
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                if let Some(c) = connected.take() {
                    let _ = c.send(Ok(()));
                }
            }
            Ok(Event::Outgoing(Outgoing::Publish(pkid))) => {
                let mut t = lock(&track);
                if let Some(ack) = t.unsent.pop_front() {
                    t.in_flight.insert(pkid, ack);
                }
            }
            Ok(Event::Incoming(Packet::PubAck(ack))) => {
                let done = lock(&track).in_flight.remove(&ack.pkid);
                if let Some(batch) = done {
                    batch.acked();
                }
            }
            Ok(_) => {}
            Err(e) => {
                let why = e.to_string();
                let failed: Vec<Arc<BatchAck>> = {
                    let mut t = lock(&track);
                    t.broken = Some(why.clone());
                    let mut all: Vec<_> = t.in_flight.drain().map(|(_, a)| a).collect();
                    all.extend(t.unsent.drain(..));
                    all
                };
                for batch in failed {
                    batch.finish(Err(SinkError::Unavailable(format!(
                        "MQTT connection lost: {why}"
                    ))));
                }
                match connected.take() {
                    Some(c) => {
                        let _ = c.send(Err(e));
                    }
                    None => {
                        tracing::warn!(error = %why, "MQTT egress connection lost; reconnecting")
                    }
                }
                return;
            }
        }
    }
}

/// A failed connect: refused by the broker (fatal at start-up) or out of
/// reach.
fn classify(broker: &str, e: ConnectionError) -> ConnectError {
    match e {
        ConnectionError::ConnectionRefused(code) => ConnectError::Refused(RefusedError {
            key: "egress.mqtt.username",
            message: format!("the broker {broker} refused weir's CONNECT: {code:?}"),
        }),
        ConnectionError::Tls(e) => ConnectError::Refused(RefusedError {
            key: "egress.mqtt.cert_file",
            message: format!(
                "TLS with {broker} failed: {e} (check ca_file, cert_file and key_file)"
            ),
        }),
        // A TLS 1.3 server checks the client's certificate after the
        // handshake: its refusal arrives as an alert on the first read,
        // deep inside rumqttc's error.
        other if tls_alert(&other) => ConnectError::Refused(RefusedError {
            key: "egress.mqtt.cert_file",
            message: format!("{broker} refused weir's TLS connection ({other:?}): is cert_file signed by a CA the broker trusts?"),
        }),
        other => ConnectError::Unavailable(format!("{broker}: {other}")),
    }
}

/// Whether `e` is a TLS alert from the broker or a certificate rustls
/// refused: the connection was reached and said no.
fn tls_alert(e: &ConnectionError) -> bool {
    let shown = format!("{e:?}");
    shown.contains("AlertReceived") || shown.contains("InvalidCertificate")
}

/// The TLS client config: the broker checked against `ca_file` or the
/// system's CAs; the client certificate presented when configured.
fn tls_config(cfg: &MqttEgress) -> Result<rustls::ClientConfig, RefusedError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let bad = |key: &'static str, message: String| RefusedError { key, message };
    let mut roots = rustls::RootCertStore::empty();
    match &cfg.ca_file {
        Some(path) => {
            let certs =
                crate::security::tls::certificates("egress.mqtt.ca_file", path).map_err(|p| {
                    bad(
                        "egress.mqtt.ca_file",
                        p.into_iter()
                            .map(|p| p.message)
                            .collect::<Vec<_>>()
                            .join("; "),
                    )
                })?;
            for cert in certs {
                roots
                    .add(cert)
                    .map_err(|e| bad("egress.mqtt.ca_file", format!("{}: {e}", path.display())))?;
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    let builder = rustls::ClientConfig::builder_with_provider(crate::security::tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("egress.mqtt.broker", e.to_string()))?
        .with_root_certificates(roots);
    match &cfg.client_cert {
        None => Ok(builder.with_no_client_auth()),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| bad("egress.mqtt.cert_file", format!("{}: {e}", cert.display())))?;
            let key_der = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| bad("egress.mqtt.key_file", format!("{}: {e}", key.display())))?;
            builder.with_client_auth_cert(chain, key_der).map_err(|e| {
                bad(
                    "egress.mqtt.key_file",
                    format!("{} does not go with {}: {e}", key.display(), cert.display()),
                )
            })
        }
    }
}
