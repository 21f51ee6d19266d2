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
//! and at most `max_in_flight` publishes await their PUBACK (the rest wait
//! in the session).
//!
//! The session's decisions (packet ids, the in-flight limit, which batch a
//! PUBACK counts towards, keep-alive) are the pure machine in
//! [`session`]; packets are rumqttc's MQTT 3.1.1 codec. One task per
//! connection drives it: it reads PUBACKs in bulk and writes as many
//! publishes as the window allows in one write, so a batch of records
//! costs a few system calls, not one per record. When the connection
//! fails, every batch not yet confirmed fails with it and the task ends;
//! the next send connects afresh (nothing is resent behind the delivery
//! machine's back), and the delivery machine sends those batches again: a
//! record may then reach the broker twice.

mod session;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use weir_core::backoff::Retry;
use weir_core::{ClassSet, NodeId};

use self::session::{BatchId, Broken, Hello, Publisher};
use super::batch::EncodedBatch;
use super::sink::{confirmed, Confirm, Sink, SinkError};
use crate::config::{MqttEgress, MqttEgressMode};

/// Bytes of publishes encoded ahead of the socket: enough for a full
/// write of small records, small beside a batch.
const WRITE_AHEAD: usize = 256 << 10;

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
    conn: Option<mpsc::Sender<Request>>,
    retry: Retry<Instant>,
    next_batch: BatchId,
}

/// A batch handed to the connection's task.
struct Request {
    batch: BatchId,
    publishes: Vec<(String, Bytes)>,
    done: oneshot::Sender<Result<(), SinkError>>,
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
        MqttSink {
            node,
            classes: classes.iter().map(|(_, c)| c.name.clone()).collect(),
            conn: None,
            retry: Retry::new(Duration::from_millis(100), cfg.reconnect_backoff_max),
            next_batch: 0,
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

    /// The largest packet weir reads from the broker (PUBACKs, PINGRESP,
    /// a stray PUBLISH of an earlier session) and writes.
    fn max_packet(&self) -> usize {
        self.cfg.max_payload as usize + self.max_topic_len() + 64
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

    /// Connects (TCP, TLS, CONNECT and CONNACK within `connect_timeout`)
    /// and starts the connection's task.
    async fn connect(&mut self) -> Result<(), ConnectError> {
        let broker = self.cfg.broker.to_string();
        let limit = self.cfg.connect_timeout;
        let hello = Hello {
            client_id: self.cfg.client_id.clone(),
            keep_alive: self.cfg.keep_alive,
            clean_session: self.cfg.clean_session,
            login: self
                .cfg
                .username
                .clone()
                .map(|u| (u, self.cfg.password.clone().unwrap_or_default())),
        };
        let tls = match self.cfg.tls {
            true => Some(Arc::new(
                tls_config(&self.cfg).map_err(ConnectError::Refused)?,
            )),
            false => None,
        };
        let host = self.cfg.broker.host.clone();
        let port = self.cfg.broker.port;
        let (max_packet, in_flight) = (self.max_packet(), self.cfg.max_in_flight);
        let (tx, rx) = mpsc::channel(64);
        let opened = async move {
            let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
                .await
                .map_err(|e| ConnectError::Unavailable(format!("{broker}: {e}")))?;
            let _ = tcp.set_nodelay(true);
            match tls {
                None => handshake(tcp, &hello, &broker, max_packet, in_flight, rx).await,
                Some(config) => {
                    let name =
                        rustls_pki_types::ServerName::try_from(host.clone()).map_err(|e| {
                            ConnectError::Refused(RefusedError {
                                key: "egress.mqtt.broker",
                                message: format!("{host} is not a TLS server name: {e}"),
                            })
                        })?;
                    let stream = tokio_rustls::TlsConnector::from(config)
                        .connect(name, tcp)
                        .await
                        .map_err(|e| tls_failure(&broker, &e))?;
                    handshake(stream, &hello, &broker, max_packet, in_flight, rx).await
                }
            }
        };
        let broker = self.cfg.broker.to_string();
        match tokio::time::timeout(limit, opened).await {
            Ok(Ok(())) => {
                tracing::info!(%broker, "connected to the MQTT broker");
                self.conn = Some(tx);
                Ok(())
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(ConnectError::Unavailable(format!(
                "{broker}: no CONNACK within {limit:?} (egress.mqtt.connect_timeout)"
            ))),
        }
    }

    async fn send_batch(&mut self, batch: &EncodedBatch) -> Result<Confirm, SinkError> {
        if self.conn.as_ref().is_some_and(mpsc::Sender::is_closed) {
            self.drop_connection();
        }
        if self.conn.is_none() {
            if let Some(at) = self.retry.not_before() {
                tokio::time::sleep_until(at).await;
            }
            if let Err(e) = self.connect().await {
                self.retry.failed(Instant::now());
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
        let (done, rx) = oneshot::channel();
        self.next_batch += 1;
        let request = Request {
            batch: self.next_batch,
            publishes,
            done,
        };
        let conn = self.conn.as_ref().expect("connected above");
        if conn.send(request).await.is_err() {
            self.drop_connection();
            return Err(SinkError::Unavailable(
                "the MQTT connection ended".to_string(),
            ));
        }
        self.retry.succeeded();
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
        if self.conn.take().is_some() {
            self.retry.failed(Instant::now());
        }
    }
}

impl Sink for MqttSink {
    async fn send(&mut self, batch: &EncodedBatch) -> Result<Confirm, SinkError> {
        self.send_batch(batch).await
    }

    fn window(&self) -> usize {
        // Batches, not publishes: the session keeps max_in_flight
        // publishes unacknowledged and holds the rest back.
        self.cfg.max_in_flight.clamp(1, 64)
    }

    fn name(&self) -> &'static str {
        "mqtt"
    }
}

/// Sends CONNECT on a fresh stream and waits for the CONNACK; on success
/// spawns the task that drives the session with requests from `rx`.
async fn handshake<S>(
    mut stream: S,
    hello: &Hello,
    broker: &str,
    max_packet: usize,
    in_flight: usize,
    rx: mpsc::Receiver<Request>,
) -> Result<(), ConnectError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let lost = |e: std::io::Error| connection_failure(broker, &e);
    let mut buf = BytesMut::new();
    hello.write_to(&mut buf);
    stream.write_all(&buf).await.map_err(lost)?;
    stream.flush().await.map_err(lost)?;
    buf.clear();
    let ack = loop {
        if stream.read_buf(&mut buf).await.map_err(lost)? == 0 {
            return Err(ConnectError::Unavailable(format!(
                "{broker} closed the connection before its CONNACK"
            )));
        }
        match session::read_connack(&mut buf, max_packet) {
            Ok(Some(ack)) => break ack,
            Ok(None) => {}
            Err(e) => return Err(ConnectError::Unavailable(format!("{broker}: {e}"))),
        }
    };
    match session::answer(ack.code) {
        session::Answer::Accepted => {}
        session::Answer::Refused(key) => {
            return Err(ConnectError::Refused(RefusedError {
                key,
                message: format!("the broker {broker} refused weir's CONNECT: {:?}", ack.code),
            }))
        }
        session::Answer::Unavailable => {
            return Err(ConnectError::Unavailable(format!(
                "{broker}: the broker is unavailable (CONNACK)"
            )))
        }
    }
    let publisher = Publisher::new(in_flight, hello.keep_alive, std::time::Instant::now());
    tokio::spawn(drive(stream, buf, publisher, rx, max_packet));
    Ok(())
}

/// Drives one connection until it fails or the sink lets it go: requests
/// queued into the session, what it may send written, the broker's
/// packets handed to it, confirmations passed on.
async fn drive<S>(
    stream: S,
    mut rbuf: BytesMut,
    mut session: Publisher,
    mut requests: mpsc::Receiver<Request>,
    max_packet: usize,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut rd, mut wr) = tokio::io::split(stream);
    let mut wbuf = BytesMut::with_capacity(WRITE_AHEAD + max_packet);
    let mut waiting: HashMap<BatchId, oneshot::Sender<Result<(), SinkError>>> = HashMap::new();
    // Written since the last flush: a TLS stream may hold the tail of a
    // write until it is flushed.
    let mut unflushed = false;
    let why = loop {
        if let Err(e) = take_packets(&mut rbuf, &mut session, max_packet) {
            break e.to_string();
        }
        while let Some(batch) = session.poll_confirmed() {
            if let Some(done) = waiting.remove(&batch) {
                let _ = done.send(Ok(()));
            }
        }
        session.write_to(&mut wbuf, WRITE_AHEAD, std::time::Instant::now());
        let deadline = session.poll_timeout();
        rbuf.reserve(16 << 10);
        let flush_now = wbuf.is_empty() && unflushed;
        tokio::select! {
            read = rd.read_buf(&mut rbuf) => match read {
                Ok(0) => break "the broker closed the connection".to_string(),
                Ok(_) => {}
                Err(e) => break e.to_string(),
            },
            written = write_or_flush(&mut wr, &mut wbuf, flush_now), if !wbuf.is_empty() || unflushed => {
                if let Err(e) = written {
                    break e.to_string();
                }
                unflushed = !flush_now;
            }
            request = requests.recv() => match request {
                Some(r) => {
                    waiting.insert(r.batch, r.done);
                    session.queue(r.batch, r.publishes);
                }
                // The sink let the connection go.
                None => return,
            },
            () = sleep_until(deadline), if deadline.is_some() => {
                if let Err(e) = session.handle_timeout(std::time::Instant::now()) {
                    break e.to_string();
                }
            }
        }
    };
    tracing::warn!(error = %why, "MQTT egress connection lost; reconnecting");
    for (_, done) in waiting.drain() {
        let _ = done.send(Err(SinkError::Unavailable(format!(
            "MQTT connection lost: {why}"
        ))));
    }
}

/// Writes what `wbuf` holds (once), or with `flush` flushes what the stream
/// holds back.
async fn write_or_flush<W: AsyncWrite + Unpin>(
    wr: &mut W,
    wbuf: &mut BytesMut,
    flush: bool,
) -> std::io::Result<()> {
    if flush {
        wr.flush().await
    } else {
        wr.write_buf(wbuf).await.map(drop)
    }
}

/// Hands every whole packet in `rbuf` to the session.
fn take_packets(rbuf: &mut BytesMut, session: &mut Publisher, max: usize) -> Result<(), Broken> {
    while let Some(packet) = session::read_packet(rbuf, max)? {
        session.handle_packet(packet)?;
    }
    Ok(())
}

async fn sleep_until(deadline: Option<std::time::Instant>) {
    if let Some(at) = deadline {
        tokio::time::sleep_until(Instant::from_std(at)).await;
    }
}

/// A failed TLS handshake: the broker's certificate not trusted, or the
/// broker refusing weir's (a TLS 1.2 server says so in the handshake), is a
/// refusal; anything else (a reset, a timeout) is the broker out of reach.
fn tls_failure(broker: &str, e: &std::io::Error) -> ConnectError {
    match tls_error(e) {
        Some(rustls::Error::InvalidCertificate(why)) => ConnectError::Refused(RefusedError {
            key: "egress.mqtt.ca_file",
            message: format!("{broker}'s certificate is not trusted ({why:?}): check ca_file"),
        }),
        Some(other) => ConnectError::Refused(RefusedError {
            key: "egress.mqtt.cert_file",
            message: format!(
                "TLS with {broker} failed: {other} (check ca_file, cert_file and key_file)"
            ),
        }),
        None => ConnectError::Unavailable(format!("{broker}: {e}")),
    }
}

/// A connection failing before its CONNACK. A TLS 1.3 server checks the
/// client's certificate after the handshake, so its refusal arrives as an
/// alert on the first read: a refusal of `cert_file`.
fn connection_failure(broker: &str, e: &std::io::Error) -> ConnectError {
    match tls_error(e) {
        Some(alert @ rustls::Error::AlertReceived(_)) => ConnectError::Refused(RefusedError {
            key: "egress.mqtt.cert_file",
            message: format!("{broker} refused weir's TLS connection ({alert}): is cert_file signed by a CA the broker trusts?"),
        }),
        _ => ConnectError::Unavailable(format!("{broker}: {e}")),
    }
}

/// The TLS error inside an I/O error from tokio-rustls, if it is one.
fn tls_error(e: &std::io::Error) -> Option<&rustls::Error> {
    e.get_ref()?.downcast_ref::<rustls::Error>()
}

/// The TLS client config: the broker checked against `ca_file` or the
/// system's CAs; the client certificate presented when configured.
fn tls_config(cfg: &MqttEgress) -> Result<rustls::ClientConfig, RefusedError> {
    const KEYS: crate::security::tls::SinkKeys = [
        "egress.mqtt.ca_file",
        "egress.mqtt.cert_file",
        "egress.mqtt.key_file",
    ];
    crate::security::tls::sink_client_config(KEYS, &cfg.files)
        .map_err(|(key, message)| RefusedError { key, message })
}
