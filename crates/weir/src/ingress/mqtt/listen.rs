//! MQTT `listen` mode: devices connect to weir itself with any MQTT 3.1.1
//! or MQTT 5 client, and weir speaks the server side of the protocol.
//!
//! Packets are framed and parsed by the codecs rumqttc exposes
//! (`rumqttc::mqttbytes::v4` for 3.1.1, `rumqttc::v5::mqttbytes::v5` for
//! 5); this module only decides what to do with them. An embedded broker
//! would acknowledge a publish as soon as it arrived; weir must not.
//!
//! # One task per connection, one packet at a time
//! Each connection is served by one task that reads a packet, acts on it
//! and only then reads the next. Replies collect in a buffer while complete
//! packets remain in the read buffer and go out in one write before the task
//! waits on the socket again, so a burst of publishes costs one syscall for
//! all its acknowledgements.
//!
//! # Acknowledgement and back-pressure
//! - QoS 1: the PUBACK is sent only after the record is in its class queue.
//!   While the queue is full the task waits for room and reads nothing more
//!   from that connection, so the client's in-flight window fills and TCP
//!   pushes back on it; nothing is dropped.
//! - QoS 2: accepted. The record is queued before PUBREC; the packet id is
//!   remembered until PUBREL so that a redelivery on the same connection is
//!   not queued twice; PUBREL is answered with PUBCOMP.
//! - QoS 0: there is no acknowledgement to withhold; `qos0_when_full`
//!   chooses between blocking like QoS 1 (`block`) and dropping the newest
//!   record, counted in `weir_records_dropped_total` (`drop`).
//! - Redelivery: a PUBACK is only ever sent for a queued record, so a client
//!   re-sends a publish (DUP set) only when the PUBACK was lost with its
//!   connection. A resend whose PUBACK is still held on the same connection
//!   (its record on its way to disk) is answered by that PUBACK. A client
//!   with a persistent session (`clean_session = 0`, MQTT 5 `clean_start =
//!   0`) resumes it when it reconnects (CONNACK says "session present"), and
//!   a QoS 1 resend of a publish accepted in that session (DUP, same packet
//!   id, same topic and payload) is acknowledged without a second record;
//!   QoS 2 packet ids awaiting PUBREL carry over too (`listen/session.rs`).
//!   With a clean session, or after weir restarts (sessions are kept in
//!   memory only), a resend is a new record with its own sequence number:
//!   QoS 1 is at-least-once.
//!
//! # What closes a connection
//! Bad input closes that connection only, with a `warn` line giving the
//! reason and `weir_protocol_errors_total` incremented: a first packet other
//! than CONNECT, a second CONNECT, a malformed packet, a packet larger than
//! `max_packet_size` (the whole packet, fixed header included), a topic that
//! is not UTF-8, contains U+0000, is empty, or contains a wildcard, an MQTT 5
//! topic alias (weir's CONNACK allows none), and packets only a server sends.
//! A record larger than its class queue's byte capacity also closes the
//! connection (its PUBACK is never sent). An MQTT 5 client is told why in a
//! DISCONNECT with a reason code and reason string; MQTT 3.1.1 has no server
//! DISCONNECT, so the socket is simply closed.
//!
//! SUBSCRIBE is answered with a failure code for every filter: weir relays
//! records upstream and delivers nothing to subscribers. Retained flags and
//! wills are accepted and ignored for the same reason.
//!
//! # Who may connect and publish
//! CONNECT is decided by `weir_core::security::gate` (password file, certificate
//! name, `allow_anonymous`) before any session is touched; a refusal is
//! CONNACK "not authorized". Each PUBLISH is checked against the client's
//! ACL before it is queued: refused, MQTT 5 gets reason 0x87 in its
//! PUBACK/PUBREC, MQTT 3.1.1 an ordinary acknowledgement (it has no way to
//! say no), and the record is dropped and counted. The TLS listener
//! completes the handshake within the CONNECT deadline, in the
//! connection's own task. `docs/security.md` has the whole picture.
//!
//! # Layout
//! - this file: [`bind`], [`serve`] (the accept loop) and [`ListenError`].
//! - `listen/codec.rs`: framing, decoding, the input checks and the replies,
//!   with their unit and property tests.
//! - `listen/connection.rs`: one connection's task, and how it ends.
//! - `listen/session.rs`: persistent sessions between connections.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn, Instrument};

use crate::config::MqttIngress;
use crate::intake::Intake;
use crate::security::{tls, MqttSecurity};

use connection::{Connection, Settings};
use state::State;

mod codec;
mod connection;
mod session;
mod state;

/// Pause after a failed accept (e.g. out of file descriptors), so that the
/// loop does not spin while the condition lasts.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Why the listener could not start.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// The address could not be bound.
    #[error(
        "cannot accept MQTT connections on {addr}: {source} (is another broker using the port? \
         change ingress.mqtt.listen)"
    )]
    Bind {
        /// The address in the config.
        addr: SocketAddr,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
}

/// Binds the MQTT listener on `addr` (port 0 picks a free port; read it back
/// with `local_addr`).
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ListenError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ListenError::Bind { addr, source })
}

/// Fuzzing entry (`weir::fuzzing`): `data` as a client's bytes, framed and
/// parsed as a connection does (CONNECT, then packets in its version, with
/// the topic checks), and also as packets of an established connection of
/// either version.
#[doc(hidden)]
pub fn fuzz(data: &[u8]) {
    use codec::{check_topic, decode, decode_connect, Hello, Inbound, Version};
    const MAX: usize = 64 * 1024;
    let run = |buf: &mut bytes::BytesMut, version: Version| {
        while let Ok(Some(packet)) = decode(buf, version, MAX) {
            if let Inbound::Publish(p) = packet {
                let _ = check_topic(&p);
            }
        }
    };
    let mut buf = bytes::BytesMut::from(data);
    match decode_connect(&mut buf, MAX) {
        Ok(Some(Hello::V311(_))) => run(&mut buf, Version::V311),
        Ok(Some(Hello::V5(..))) => run(&mut buf, Version::V5),
        _ => {}
    }
    for version in [Version::V311, Version::V5] {
        run(&mut bytes::BytesMut::from(data), version);
    }
}

/// Benchmark entry (`benches/ingest.rs`): decodes every packet of an
/// established MQTT 3.1.1 connection in `buf` as the listener does, with
/// the topic checks, and returns the PUBLISH packets' payload bytes.
#[doc(hidden)]
pub fn decode_publishes(buf: &mut bytes::BytesMut) -> usize {
    use codec::{check_topic, decode, Inbound, Version};
    let mut bytes = 0;
    while let Ok(Some(packet)) = decode(buf, Version::V311, usize::MAX) {
        if let Inbound::Publish(p) = packet {
            if check_topic(&p).is_ok() {
                bytes += p.payload.len();
            }
        }
    }
    bytes
}

/// The bound MQTT listeners: plain TCP, TLS, or both.
#[derive(Debug, Default)]
pub struct Listeners {
    /// Plain TCP.
    pub plain: Option<TcpListener>,
    /// TLS (`[ingress.mqtt.tls]`).
    pub tls: Option<TcpListener>,
    /// Whether the TLS listener takes the username from the client
    /// certificate's CN.
    pub use_identity_as_username: bool,
}

/// Serves device connections on a plain `listener`, anyone allowed, until
/// `shutdown` is cancelled (see [`serve_secured`]).
pub async fn serve(
    listener: TcpListener,
    cfg: MqttIngress,
    ingress: Arc<Intake>,
    shutdown: CancellationToken,
) {
    let listeners = Listeners {
        plain: Some(listener),
        ..Listeners::default()
    };
    serve_secured(listeners, cfg, MqttSecurity::open(), ingress, shutdown).await
}

/// Connections turned away at `max_connections` that are still being
/// told so; beyond this they are closed without a CONNACK, so refusing
/// costs a bounded amount too.
const REFUSING_AT_ONCE: usize = 64;

/// How long a turned-away connection may take to send its CONNECT.
const REFUSAL_DEADLINE: Duration = Duration::from_secs(2);

/// What every connection of the MQTT ingress shares.
#[derive(Clone)]
struct Shared {
    settings: Settings,
    /// One permit per connection allowed open (`max_connections`).
    slots: Arc<tokio::sync::Semaphore>,
    /// One permit per turned-away connection being told so.
    refusing: Arc<tokio::sync::Semaphore>,
    ingress: Arc<Intake>,
    security: MqttSecurity,
    sessions: Arc<session::Sessions>,
    connections: TaskTracker,
    shutdown: CancellationToken,
}

/// Serves device connections on `listeners` until `shutdown` is cancelled,
/// then stops accepting and returns once every connection has finished the
/// packet in hand and closed. Clients are admitted by `security`'s gate;
/// the TLS listener uses its TLS configuration as it is when each
/// connection arrives, so a rotated certificate serves new connections
/// while old ones go on.
pub async fn serve_secured(
    listeners: Listeners,
    cfg: MqttIngress,
    security: MqttSecurity,
    ingress: Arc<Intake>,
    shutdown: CancellationToken,
) {
    let shared = Shared {
        settings: Settings {
            max_packet_size: cfg.max_packet_size,
            qos0_when_full: cfg.qos0_when_full,
            max_inflight: cfg.limits.max_inflight,
            connect_timeout: cfg.limits.connect_timeout,
        },
        slots: Arc::new(tokio::sync::Semaphore::new(cfg.limits.max_connections)),
        refusing: Arc::new(tokio::sync::Semaphore::new(REFUSING_AT_ONCE)),
        ingress,
        security,
        sessions: Arc::new(session::Sessions::default()),
        connections: TaskTracker::new(),
        shutdown,
    };
    let identity = listeners.use_identity_as_username;
    let plain = async {
        if let Some(l) = listeners.plain {
            accept_loop(l, None, &shared).await;
        }
    };
    let tls = async {
        if let Some(l) = listeners.tls {
            accept_loop(l, Some(identity), &shared).await;
        }
    };
    tokio::join!(plain, tls);
    shared.connections.close();
    debug!(
        open = shared.connections.len(),
        "MQTT ingress stopped accepting; waiting for connections to close"
    );
    shared.connections.wait().await;
}

/// Accepts connections on `listener` until shutdown; `tls`: `None` for
/// plain TCP, else whether the certificate's CN is the username.
async fn accept_loop(listener: TcpListener, tls: Option<bool>, shared: &Shared) {
    let what = if tls.is_some() {
        "MQTT over TLS"
    } else {
        "MQTT"
    };
    match listener.local_addr() {
        Ok(addr) => info!(%addr, "{what} ingress accepting device connections"),
        Err(error) => info!(%error, "{what} ingress accepting device connections"),
    }
    loop {
        // Cancel safety: `accept` is cancel safe (a connection it has not
        // returned stays in the backlog); `cancelled` only waits.
        let accepted = tokio::select! {
            _ = shared.shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                let Ok(slot) = shared.slots.clone().try_acquire_owned() else {
                    turn_away(stream, peer, tls.is_some(), shared);
                    continue;
                };
                let span = tracing::info_span!(
                    "mqtt",
                    peer = %peer,
                    tls = tls.is_some(),
                    client_id = tracing::field::Empty,
                    user = tracing::field::Empty
                );
                let shared2 = shared.clone();
                let metrics = shared.ingress.metrics().clone();
                metrics.security.connection_opened();
                shared.connections.spawn(
                    async move {
                        connection(stream, peer, tls, shared2).await;
                        // The slot first: a gauge that reads one fewer
                        // means a slot is free.
                        drop(slot);
                        metrics.security.connection_closed();
                    }
                    .instrument(span),
                );
            }
            Err(error) => {
                warn!(%error, "accepting an MQTT connection failed; retrying");
                // Cancel safety: both branches only wait.
                tokio::select! {
                    _ = shared.shutdown.cancelled() => break,
                    _ = tokio::time::sleep(ACCEPT_BACKOFF) => {}
                }
            }
        }
    }
}

/// One connection: the TLS handshake if any (within the CONNECT
/// deadline), then the MQTT session.
async fn connection(stream: TcpStream, peer: SocketAddr, tls: Option<bool>, shared: Shared) {
    // Acknowledgements are latency: do not let Nagle hold them back.
    if let Err(error) = stream.set_nodelay(true) {
        debug!(%error, "cannot disable Nagle's algorithm");
    }
    let Some(identity) = tls else {
        return session(stream, peer, None, &shared).run().await;
    };
    let Some(config) = shared.security.tls.as_ref().map(|t| t.get()) else {
        warn!("MQTT TLS listener without a TLS configuration; closing");
        return;
    };
    let metrics = shared.ingress.metrics();
    // The CONNECT deadline covers the handshake too.
    let deadline = tokio::time::Instant::now() + shared.settings.connect_timeout;
    // Cancel safety: a handshake cut off by the deadline or shutdown only
    // drops a connection that has sent nothing yet.
    let handshake = tokio::select! {
        _ = shared.shutdown.cancelled() => return,
        h = tokio::time::timeout_at(deadline, TlsAcceptor::from(config).accept(stream)) => h,
    };
    let stream = match handshake {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) => {
            metrics.security.handshake("mqtt-tls", false);
            info!(%error, "TLS handshake failed; connection closed");
            return;
        }
        Err(_) => {
            metrics.security.handshake("mqtt-tls", false);
            info!(timeout = ?shared.settings.connect_timeout, "no TLS handshake in time; connection closed");
            return;
        }
    };
    metrics.security.handshake("mqtt-tls", true);
    let certificate_name = identity
        .then(|| {
            let certs = stream.get_ref().1.peer_certificates()?;
            Some(certs.first().and_then(tls::common_name).unwrap_or_default())
        })
        .flatten()
        // Required by the configuration, so rustls refused a client
        // without one; should it not have, the empty name is refused.
        .or_else(|| identity.then(String::new));
    let mut session = session(stream, peer, certificate_name, &shared);
    // The connect timeout counts from the TCP accept, handshake included.
    session.state = State::new(shared.settings.max_inflight, deadline.into_std());
    session.run().await
}

/// A connection beyond `max_connections`: told so in a CONNACK ("server
/// unavailable" in 3.1.1, "server busy" in MQTT 5) once its CONNECT
/// arrives, then closed; counted. Over TLS, or when too many are being
/// turned away already, it is closed at once.
fn turn_away(stream: TcpStream, peer: SocketAddr, tls: bool, shared: &Shared) {
    let metrics = shared.ingress.metrics().clone();
    metrics.security.connection_refused("max_connections");
    if crate::telemetry::first_in_a_while("mqtt max_connections") {
        warn!(%peer, "MQTT connection refused: ingress.mqtt.max_connections are open (counted in weir_mqtt_connections_refused_total, logged once a minute)");
    }
    let Ok(permit) = shared.refusing.clone().try_acquire_owned() else {
        return;
    };
    if tls {
        // Telling a TLS client needs a handshake: not worth it for a
        // connection that cannot stay.
        return;
    }
    let max = shared.settings.max_packet_size;
    tokio::spawn(async move {
        let _ = tokio::time::timeout(REFUSAL_DEADLINE, connection::refuse_busy(stream, max)).await;
        drop(permit);
    });
}

/// The MQTT side of a connection over `stream`.
fn session<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    stream: S,
    peer: SocketAddr,
    certificate_name: Option<String>,
    shared: &Shared,
) -> Connection<S> {
    let mut c = Connection::new(
        stream,
        peer,
        shared.settings,
        shared.ingress.clone(),
        shared.sessions.clone(),
        shared.shutdown.clone(),
    );
    c.gate = shared.security.gate.get();
    c.certificate_name = certificate_name;
    c
}
