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
//!   connection. weir keeps no session state across connections (CONNACK
//!   always says "no session present"), so such a redelivery is accepted as a
//!   new record with its own sequence number: QoS 1 is at-least-once, and a
//!   consumer that cannot tolerate the rare duplicate must recognise it by
//!   its payload.
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
//! wills are accepted and ignored for the same reason, and so are user names
//! and passwords: weir does no authentication, so expose the port only to
//! the devices meant to use it.

use std::collections::HashSet;
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use rumqttc::mqttbytes::{self, v4, PacketType, QoS};
use rumqttc::v5::mqttbytes::{v5, Error as Error5, QoS as QoS5};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn, Instrument};
use weir_core::Record;

use crate::config::{MqttIngress, Qos0WhenFull};
use crate::intake::{EnqueueError, Intake};

/// How long a new connection may take to send CONNECT: generous for a slow
/// cellular link, short enough that idle sockets do not pile up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long writing acknowledgements may block before the client counts as
/// stuck; also bounds how long shutdown can wait on one connection.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a closing connection keeps reading (and discarding) after its
/// FIN, so that bytes the client had in flight do not turn the close into a
/// reset, which could destroy acknowledgements the client has not read yet.
const CLOSE_LINGER: Duration = Duration::from_secs(1);

/// Spare buffer capacity per socket read: many typical publishes per
/// syscall.
const READ_CHUNK: usize = 16 * 1024;

/// Pause after a failed accept (e.g. out of file descriptors), so that the
/// loop does not spin while the condition lasts.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The MQTT 5 reason string in a refusing SUBACK.
const SUBSCRIBE_REFUSED: &str = "weir relays records upstream; it delivers nothing to subscribers";

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

/// Serves device connections on `listener` until `shutdown` is cancelled,
/// then stops accepting and returns once every connection has finished the
/// packet in hand and closed.
pub async fn serve(
    listener: TcpListener,
    cfg: MqttIngress,
    ingress: Arc<Intake>,
    shutdown: CancellationToken,
) {
    let settings = Settings {
        max_packet_size: cfg.max_packet_size,
        qos0_when_full: cfg.qos0_when_full,
    };
    match listener.local_addr() {
        Ok(addr) => info!(%addr, "MQTT ingress accepting device connections"),
        Err(error) => info!(%error, "MQTT ingress accepting device connections"),
    }
    let connections = TaskTracker::new();
    loop {
        // Cancel safety: `accept` is cancel safe (a connection it has not
        // returned stays in the backlog); `cancelled` only waits.
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                let span = tracing::info_span!(
                    "mqtt",
                    peer = %peer,
                    client_id = tracing::field::Empty
                );
                let connection =
                    Connection::new(stream, peer, settings, ingress.clone(), shutdown.clone());
                connections.spawn(connection.run().instrument(span));
            }
            Err(error) => {
                warn!(%error, "accepting an MQTT connection failed; retrying");
                // Cancel safety: both branches only wait.
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(ACCEPT_BACKOFF) => {}
                }
            }
        }
    }
    drop(listener);
    connections.close();
    debug!(
        open = connections.len(),
        "MQTT ingress stopped accepting; waiting for connections to close"
    );
    connections.wait().await;
}

/// The parts of the config a connection needs.
#[derive(Debug, Clone, Copy)]
struct Settings {
    max_packet_size: usize,
    qos0_when_full: Qos0WhenFull,
}

/// Bad input from a client; closes its connection.
#[derive(Debug, thiserror::Error)]
enum ProtocolError {
    #[error("malformed MQTT 3.1.1 packet: {0}")]
    Malformed(#[source] mqttbytes::Error),
    #[error("malformed MQTT 5 packet: {0}")]
    Malformed5(#[source] Error5),
    #[error("packet of {size} bytes exceeds max_packet_size ({max} bytes)")]
    TooLarge { size: usize, max: usize },
    #[error("first packet is {0:?}, not CONNECT")]
    NotConnect(PacketType),
    #[error("CONNECT protocol level {0} is not supported (weir speaks MQTT 3.1.1 and 5)")]
    UnsupportedLevel(u8),
    #[error("CONNECT protocol name is not \"MQTT\" (MQTT 3.1 and older are not supported)")]
    UnsupportedName,
    #[error(
        "empty client id with clean session off (MQTT 3.1.1 requires an id to keep a session)"
    )]
    EmptyClientId,
    #[error("MQTT 5 enhanced authentication (method {0:?}) is not supported")]
    AuthMethod(String),
    #[error("second CONNECT on an established connection")]
    SecondConnect,
    #[error("{0} from a client (only a server sends it, or it answers a publish weir never sent)")]
    Unexpected(&'static str),
    #[error("PUBLISH topic is not valid UTF-8")]
    TopicNotUtf8,
    #[error("PUBLISH topic {0:?} contains U+0000, which MQTT forbids")]
    TopicNul(String),
    #[error("PUBLISH topic is empty")]
    EmptyTopic,
    #[error("PUBLISH topic {0:?} contains a wildcard (+ or #), which is only valid in filters")]
    TopicWildcard(String),
    #[error("PUBLISH uses topic alias {0}, but weir's CONNACK allows no topic aliases")]
    TopicAlias(u16),
    #[error("connection closed in the middle of a packet")]
    Truncated,
}

impl ProtocolError {
    /// The MQTT 5 DISCONNECT reason code that tells the client about it.
    fn v5_reason(&self) -> v5::DisconnectReasonCode {
        use v5::DisconnectReasonCode as R;
        match self {
            ProtocolError::TooLarge { .. } => R::PacketTooLarge,
            ProtocolError::EmptyTopic | ProtocolError::TopicWildcard(_) => R::TopicNameInvalid,
            ProtocolError::TopicAlias(_) => R::TopicAliasInvalid,
            ProtocolError::SecondConnect
            | ProtocolError::Unexpected(_)
            | ProtocolError::NotConnect(_) => R::ProtocolError,
            _ => R::MalformedPacket,
        }
    }
}

/// Why a connection ended.
#[derive(Debug)]
enum Ending {
    /// The client sent DISCONNECT.
    ClientDisconnect,
    /// The client closed the TCP connection without DISCONNECT.
    Eof,
    /// weir is shutting down.
    Shutdown,
    /// No CONNECT within [`CONNECT_TIMEOUT`].
    ConnectTimeout,
    /// Nothing received for 1.5 times the keep alive the client chose.
    KeepAliveExpired(Duration),
    /// Bad input.
    Protocol(ProtocolError),
    /// A record the class queue can never hold.
    Refused(EnqueueError),
    /// The socket failed.
    Io(io::Error),
    /// The client did not read its acknowledgements for [`WRITE_TIMEOUT`].
    WriteTimeout,
}

impl From<ProtocolError> for Ending {
    fn from(e: ProtocolError) -> Self {
        Ending::Protocol(e)
    }
}

impl From<EnqueueError> for Ending {
    fn from(e: EnqueueError) -> Self {
        match e {
            EnqueueError::ShuttingDown => Ending::Shutdown,
            other => Ending::Refused(other),
        }
    }
}

impl Ending {
    /// Logs the ending at the level it deserves and counts protocol errors.
    fn report(&self, ingress: &Intake) {
        match self {
            Ending::ClientDisconnect => debug!("MQTT client disconnected"),
            Ending::Eof => debug!("MQTT client closed the connection without DISCONNECT"),
            Ending::Shutdown => debug!("closing MQTT connection: weir is shutting down"),
            Ending::ConnectTimeout => info!(
                timeout = ?CONNECT_TIMEOUT,
                "closing connection: no MQTT CONNECT in time"
            ),
            Ending::KeepAliveExpired(keep_alive) => info!(
                ?keep_alive,
                "closing MQTT connection: nothing received for 1.5 times its keep alive"
            ),
            Ending::Protocol(reason) => {
                ingress.metrics().protocol_errors.inc();
                warn!(%reason, "closing MQTT connection: bad input");
            }
            Ending::Refused(reason) => warn!(
                %reason,
                "closing MQTT connection: record refused and not acknowledged"
            ),
            Ending::Io(error) => info!(%error, "MQTT connection failed"),
            Ending::WriteTimeout => warn!(
                timeout = ?WRITE_TIMEOUT,
                "closing MQTT connection: the client is not reading its acknowledgements"
            ),
        }
    }

    /// Whether the socket can still take the final acknowledgements.
    fn can_write(&self) -> bool {
        !matches!(self, Ending::Io(_) | Ending::WriteTimeout | Ending::Eof)
    }

    /// The DISCONNECT an MQTT 5 client gets, if any.
    fn v5_disconnect(&self) -> Option<(v5::DisconnectReasonCode, String)> {
        use v5::DisconnectReasonCode as R;
        match self {
            Ending::Protocol(e) => Some((e.v5_reason(), e.to_string())),
            Ending::Refused(e) => Some((R::QuotaExceeded, e.to_string())),
            Ending::Shutdown => Some((R::ServerShuttingDown, "weir is shutting down".into())),
            Ending::KeepAliveExpired(_) => Some((
                R::KeepAliveTimeout,
                "nothing received for 1.5 times the keep alive".into(),
            )),
            _ => None,
        }
    }
}

/// The protocol version of a connection, fixed by its CONNECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    V311,
    V5,
}

/// A CONNECT packet.
#[derive(Debug)]
enum Hello {
    V311(v4::Connect),
    V5(v5::Connect),
}

/// A PUBLISH, whichever the version.
#[derive(Debug)]
struct InPublish {
    qos: QoS,
    pkid: u16,
    topic: Bytes,
    payload: Bytes,
    topic_alias: Option<u16>,
}

/// A packet after CONNECT, whichever the version.
#[derive(Debug)]
enum Inbound {
    Connect,
    Publish(InPublish),
    PubRel(u16),
    Subscribe { pkid: u16, filters: Vec<String> },
    Unsubscribe { pkid: u16, filters: usize },
    PingReq,
    Disconnect,
    Unexpected(&'static str),
}

/// How a CONNECT is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    ProtocolVersion,
    ClientId,
    AuthMethod,
}

/// A packet weir sends.
#[derive(Debug)]
enum Reply {
    ConnAck {
        assigned_client_id: Option<String>,
        max_packet_size: usize,
    },
    ConnRefused(Refusal),
    PubAck(u16),
    PubRec(u16),
    PubComp(u16),
    SubAck {
        pkid: u16,
        filters: usize,
    },
    UnsubAck {
        pkid: u16,
        filters: usize,
    },
    PingResp,
    Disconnect(v5::DisconnectReasonCode, String),
}

/// Frames the packet at the head of `buf` under the size limit: its fixed
/// header, or `None` if more bytes are needed. MQTT 3.1.1 and 5 share the
/// fixed header, so the 3.1.1 parser frames both.
fn frame(buf: &BytesMut, max: usize) -> Result<Option<mqttbytes::FixedHeader>, ProtocolError> {
    match mqttbytes::check(buf.iter(), max) {
        // The codec limits only the remaining length; the config means the
        // whole packet, as MQTT 5's Maximum Packet Size does.
        Ok(header) if header.frame_length() > max => Err(ProtocolError::TooLarge {
            size: header.frame_length(),
            max,
        }),
        Ok(header) => Ok(Some(header)),
        Err(mqttbytes::Error::InsufficientBytes(_)) => Ok(None),
        Err(mqttbytes::Error::PayloadSizeLimitExceeded(remaining)) => {
            Err(ProtocolError::TooLarge {
                size: fixed_header_len(remaining) + remaining,
                max,
            })
        }
        Err(e) => Err(ProtocolError::Malformed(e)),
    }
}

/// The length of the fixed header before `remaining` bytes: the type byte
/// and the remaining length as a variable byte integer (for log lines).
fn fixed_header_len(remaining: usize) -> usize {
    1 + match remaining {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}

/// The CONNECT at the head of `buf`, or `None` if more bytes are needed.
fn decode_connect(buf: &mut BytesMut, max: usize) -> Result<Option<Hello>, ProtocolError> {
    let Some(header) = frame(buf, max)? else {
        return Ok(None);
    };
    match header.packet_type() {
        Ok(PacketType::Connect) => {}
        Ok(other) => return Err(ProtocolError::NotConnect(other)),
        Err(e) => return Err(ProtocolError::Malformed(e)),
    }
    let packet = buf.split_to(header.frame_length()).freeze();
    // The MQTT 5 reader refuses any protocol level but 5 before it parses
    // anything level-specific, which tells the versions apart without
    // parsing by hand.
    let header5 = v5::check(packet.iter(), None).map_err(ProtocolError::Malformed5)?;
    match v5::Connect::read(header5, packet.clone()) {
        Ok((connect, _will, _login)) => Ok(Some(Hello::V5(connect))),
        Err(Error5::InvalidProtocolLevel(4)) => v4::Connect::read(header, packet)
            .map(|connect| Some(Hello::V311(connect)))
            .map_err(ProtocolError::Malformed),
        Err(Error5::InvalidProtocolLevel(level)) => Err(ProtocolError::UnsupportedLevel(level)),
        Err(Error5::InvalidProtocol) => Err(ProtocolError::UnsupportedName),
        Err(e) => Err(ProtocolError::Malformed5(e)),
    }
}

/// The packet at the head of `buf` on an established connection, or `None`
/// if more bytes are needed.
fn decode(
    buf: &mut BytesMut,
    version: Version,
    max: usize,
) -> Result<Option<Inbound>, ProtocolError> {
    let Some(header) = frame(buf, max)? else {
        return Ok(None);
    };
    let kind = header.packet_type();
    match kind {
        Ok(PacketType::Connect) => return Err(ProtocolError::SecondConnect),
        // rumqttc's MQTT 5 reader refuses a DISCONNECT without a reason
        // code, which MQTT 5 allows (and mosquitto_pub sends).
        Ok(PacketType::Disconnect) if version == Version::V5 && header.frame_length() == 2 => {
            buf.advance(2);
            return Ok(Some(Inbound::Disconnect));
        }
        Ok(_) => {}
        Err(e) => return Err(ProtocolError::Malformed(e)),
    }
    // Framing succeeded above, so any error now is in the packet's body.
    match version {
        Version::V311 => v4::Packet::read(buf, max)
            .map(|p| Some(from_v4(p)))
            .map_err(|e| match (kind, e) {
                // The reader says this of any string; in a PUBLISH it is
                // the topic, the one case worth naming.
                (Ok(PacketType::Publish), mqttbytes::Error::TopicNotUtf8) => {
                    ProtocolError::TopicNotUtf8
                }
                (_, e) => ProtocolError::Malformed(e),
            }),
        Version::V5 => v5::Packet::read(buf, None)
            .map(|p| Some(from_v5(p)))
            .map_err(ProtocolError::Malformed5),
    }
}

fn from_v4(packet: v4::Packet) -> Inbound {
    match packet {
        v4::Packet::Connect(_) => Inbound::Connect,
        v4::Packet::Publish(p) => Inbound::Publish(InPublish {
            qos: p.qos,
            pkid: p.pkid,
            topic: Bytes::from(p.topic),
            payload: p.payload,
            topic_alias: None,
        }),
        v4::Packet::PubRel(r) => Inbound::PubRel(r.pkid),
        v4::Packet::Subscribe(s) => Inbound::Subscribe {
            pkid: s.pkid,
            filters: s.filters.into_iter().map(|f| f.path).collect(),
        },
        v4::Packet::Unsubscribe(u) => Inbound::Unsubscribe {
            pkid: u.pkid,
            filters: u.topics.len(),
        },
        v4::Packet::PingReq => Inbound::PingReq,
        v4::Packet::Disconnect => Inbound::Disconnect,
        v4::Packet::ConnAck(_) => Inbound::Unexpected("CONNACK"),
        v4::Packet::PubAck(_) => Inbound::Unexpected("PUBACK"),
        v4::Packet::PubRec(_) => Inbound::Unexpected("PUBREC"),
        v4::Packet::PubComp(_) => Inbound::Unexpected("PUBCOMP"),
        v4::Packet::SubAck(_) => Inbound::Unexpected("SUBACK"),
        v4::Packet::UnsubAck(_) => Inbound::Unexpected("UNSUBACK"),
        v4::Packet::PingResp => Inbound::Unexpected("PINGRESP"),
    }
}

fn from_v5(packet: v5::Packet) -> Inbound {
    match packet {
        v5::Packet::Connect(..) => Inbound::Connect,
        v5::Packet::Publish(p) => Inbound::Publish(InPublish {
            qos: match p.qos {
                QoS5::AtMostOnce => QoS::AtMostOnce,
                QoS5::AtLeastOnce => QoS::AtLeastOnce,
                QoS5::ExactlyOnce => QoS::ExactlyOnce,
            },
            pkid: p.pkid,
            topic_alias: p.properties.as_ref().and_then(|props| props.topic_alias),
            topic: p.topic,
            payload: p.payload,
        }),
        v5::Packet::PubRel(r) => Inbound::PubRel(r.pkid),
        v5::Packet::Subscribe(s) => Inbound::Subscribe {
            pkid: s.pkid,
            filters: s.filters.into_iter().map(|f| f.path).collect(),
        },
        v5::Packet::Unsubscribe(u) => Inbound::Unsubscribe {
            pkid: u.pkid,
            filters: u.filters.len(),
        },
        v5::Packet::PingReq(_) => Inbound::PingReq,
        v5::Packet::Disconnect(_) => Inbound::Disconnect,
        v5::Packet::Auth(_) => Inbound::Unexpected("AUTH"),
        v5::Packet::ConnAck(_) => Inbound::Unexpected("CONNACK"),
        v5::Packet::PubAck(_) => Inbound::Unexpected("PUBACK"),
        v5::Packet::PubRec(_) => Inbound::Unexpected("PUBREC"),
        v5::Packet::PubComp(_) => Inbound::Unexpected("PUBCOMP"),
        v5::Packet::SubAck(_) => Inbound::Unexpected("SUBACK"),
        v5::Packet::UnsubAck(_) => Inbound::Unexpected("UNSUBACK"),
        v5::Packet::PingResp(_) => Inbound::Unexpected("PINGRESP"),
    }
}

/// Refuses topics MQTT does not allow in a PUBLISH. rumqttc's 3.1.1 reader
/// already refuses ill-formed UTF-8 but its MQTT 5 reader does not, so this
/// checks for both.
fn check_topic(publish: &InPublish) -> Result<(), ProtocolError> {
    if let Some(alias) = publish.topic_alias {
        return Err(ProtocolError::TopicAlias(alias));
    }
    let topic = std::str::from_utf8(&publish.topic).map_err(|_| ProtocolError::TopicNotUtf8)?;
    if topic.is_empty() {
        return Err(ProtocolError::EmptyTopic);
    }
    if topic.contains('\0') {
        return Err(ProtocolError::TopicNul(topic.to_owned()));
    }
    if topic.contains(['+', '#']) {
        return Err(ProtocolError::TopicWildcard(topic.to_owned()));
    }
    Ok(())
}

/// Appends `reply` to `out` in the connection's version.
fn encode(out: &mut BytesMut, version: Version, reply: Reply) {
    // Neither codec can fail on these: every reply is far below MQTT's
    // 256 MiB packet limit and no packet id is 0 (the readers refuse 0).
    match version {
        Version::V311 => {
            let packet = match reply {
                Reply::ConnAck { .. } => {
                    v4::Packet::ConnAck(v4::ConnAck::new(v4::ConnectReturnCode::Success, false))
                }
                Reply::ConnRefused(refusal) => {
                    let code = match refusal {
                        Refusal::ProtocolVersion => v4::ConnectReturnCode::RefusedProtocolVersion,
                        Refusal::ClientId => v4::ConnectReturnCode::BadClientId,
                        Refusal::AuthMethod => v4::ConnectReturnCode::NotAuthorized,
                    };
                    v4::Packet::ConnAck(v4::ConnAck::new(code, false))
                }
                Reply::PubAck(pkid) => v4::Packet::PubAck(v4::PubAck::new(pkid)),
                Reply::PubRec(pkid) => v4::Packet::PubRec(v4::PubRec::new(pkid)),
                Reply::PubComp(pkid) => v4::Packet::PubComp(v4::PubComp::new(pkid)),
                Reply::SubAck { pkid, filters } => v4::Packet::SubAck(v4::SubAck::new(
                    pkid,
                    vec![v4::SubscribeReasonCode::Failure; filters],
                )),
                Reply::UnsubAck { pkid, .. } => v4::Packet::UnsubAck(v4::UnsubAck::new(pkid)),
                Reply::PingResp => v4::Packet::PingResp,
                // MQTT 3.1.1 has no DISCONNECT from the server: closing the
                // socket is the whole message.
                Reply::Disconnect(..) => return,
            };
            let _ = packet.write(out, usize::MAX);
        }
        Version::V5 => {
            let packet = match reply {
                Reply::ConnAck {
                    assigned_client_id,
                    max_packet_size,
                } => v5::Packet::ConnAck(v5::ConnAck {
                    session_present: false,
                    code: v5::ConnectReturnCode::Success,
                    properties: Some(connack_properties(assigned_client_id, max_packet_size)),
                }),
                Reply::ConnRefused(refusal) => {
                    let code = match refusal {
                        Refusal::ProtocolVersion => {
                            v5::ConnectReturnCode::UnsupportedProtocolVersion
                        }
                        Refusal::ClientId => v5::ConnectReturnCode::ClientIdentifierNotValid,
                        Refusal::AuthMethod => v5::ConnectReturnCode::BadAuthenticationMethod,
                    };
                    v5::Packet::ConnAck(v5::ConnAck {
                        session_present: false,
                        code,
                        properties: None,
                    })
                }
                Reply::PubAck(pkid) => v5::Packet::PubAck(v5::PubAck::new(pkid, None)),
                Reply::PubRec(pkid) => v5::Packet::PubRec(v5::PubRec::new(pkid, None)),
                Reply::PubComp(pkid) => v5::Packet::PubComp(v5::PubComp::new(pkid, None)),
                Reply::SubAck { pkid, filters } => v5::Packet::SubAck(v5::SubAck {
                    pkid,
                    return_codes: vec![v5::SubscribeReasonCode::ImplementationSpecific; filters],
                    properties: Some(v5::SubAckProperties {
                        reason_string: Some(SUBSCRIBE_REFUSED.into()),
                        user_properties: Vec::new(),
                    }),
                }),
                Reply::UnsubAck { pkid, filters } => v5::Packet::UnsubAck(v5::UnsubAck {
                    pkid,
                    reasons: vec![v5::UnsubAckReason::NoSubscriptionExisted; filters],
                    properties: None,
                }),
                Reply::PingResp => v5::Packet::PingResp(v5::PingResp),
                // Always with properties: rumqttc writes a wrong remaining
                // length for a reason code without them.
                Reply::Disconnect(reason_code, reason) => v5::Packet::Disconnect(v5::Disconnect {
                    reason_code,
                    properties: Some(v5::DisconnectProperties {
                        session_expiry_interval: None,
                        reason_string: Some(reason),
                        user_properties: Vec::new(),
                        server_reference: None,
                    }),
                }),
            };
            let _ = packet.write(out, None);
        }
    }
}

/// What weir's MQTT 5 CONNACK announces: the size limit, and that it takes
/// no subscriptions of any kind (topic aliases stay at the default, none).
fn connack_properties(
    assigned_client_id: Option<String>,
    max_packet_size: usize,
) -> v5::ConnAckProperties {
    v5::ConnAckProperties {
        session_expiry_interval: None,
        receive_max: None,
        max_qos: None,
        retain_available: None,
        max_packet_size: Some(u32::try_from(max_packet_size).unwrap_or(u32::MAX)),
        assigned_client_identifier: assigned_client_id,
        topic_alias_max: None,
        reason_string: None,
        user_properties: Vec::new(),
        wildcard_subscription_available: Some(0),
        subscription_identifiers_available: Some(0),
        shared_subscription_available: Some(0),
        server_keep_alive: None,
        response_information: None,
        server_reference: None,
        authentication_method: None,
        authentication_data: None,
    }
}

/// One device connection.
struct Connection {
    stream: TcpStream,
    peer: SocketAddr,
    settings: Settings,
    ingress: Arc<Intake>,
    shutdown: CancellationToken,
    /// Bytes read and not yet decoded.
    inbuf: BytesMut,
    /// Replies not yet written.
    out: BytesMut,
    /// `None` until CONNECT.
    version: Option<Version>,
    /// The client's keep alive; `None` when it asked for none.
    keep_alive: Option<Duration>,
    /// When the connection expires unless a packet arrives.
    deadline: Option<Instant>,
    /// QoS 2 packet ids whose record is queued and PUBREC sent, awaiting
    /// PUBREL: a redelivery of one of these is not queued again.
    awaiting_rel: HashSet<u16>,
}

/// What a wait on the socket ended with.
enum Wake {
    Shutdown,
    Expired,
    Read(io::Result<usize>),
}

impl Connection {
    fn new(
        stream: TcpStream,
        peer: SocketAddr,
        settings: Settings,
        ingress: Arc<Intake>,
        shutdown: CancellationToken,
    ) -> Self {
        Connection {
            stream,
            peer,
            settings,
            ingress,
            shutdown,
            inbuf: BytesMut::with_capacity(READ_CHUNK),
            out: BytesMut::new(),
            version: None,
            keep_alive: None,
            deadline: Some(Instant::now() + CONNECT_TIMEOUT),
            awaiting_rel: HashSet::new(),
        }
    }

    async fn run(mut self) {
        // Acknowledgements are latency: do not let Nagle hold them back.
        if let Err(error) = self.stream.set_nodelay(true) {
            debug!(%error, "cannot disable Nagle's algorithm");
        }
        let ending = match self.session().await {
            Ok(never) => match never {},
            Err(ending) => ending,
        };
        ending.report(&self.ingress);
        if ending.can_write() {
            if let (Some(version), Some((code, reason))) = (self.version, ending.v5_disconnect()) {
                encode(&mut self.out, version, Reply::Disconnect(code, reason));
            }
            // Replies already earned (acknowledgements of queued records)
            // go out even when the connection ends on an error.
            if let Err(ending) = self.flush().await {
                debug!(?ending, "final replies not delivered");
            }
        }
        self.linger().await;
    }

    /// CONNECT, then packets until the connection ends.
    async fn session(&mut self) -> Result<Infallible, Ending> {
        let max = self.settings.max_packet_size;
        let hello = loop {
            match decode_connect(&mut self.inbuf, max) {
                Ok(Some(hello)) => break hello,
                Ok(None) => self.fill().await?,
                Err(e) => {
                    if matches!(
                        e,
                        ProtocolError::UnsupportedLevel(_) | ProtocolError::UnsupportedName
                    ) {
                        // In the 3.1.1 format, which every version before 5
                        // understands.
                        encode(
                            &mut self.out,
                            Version::V311,
                            Reply::ConnRefused(Refusal::ProtocolVersion),
                        );
                    }
                    return Err(e.into());
                }
            }
        };
        let version = self.accept(hello)?;
        loop {
            // Packets still buffered when shutdown began are left
            // unacknowledged: their senders keep them and send them again.
            if self.shutdown.is_cancelled() {
                return Err(Ending::Shutdown);
            }
            let packet = match decode(&mut self.inbuf, version, max)? {
                Some(packet) => packet,
                None => {
                    self.fill().await?;
                    continue;
                }
            };
            self.heard();
            self.handle(packet).await?;
        }
    }

    /// Answers CONNECT: fixes the version and keep alive, queues CONNACK.
    fn accept(&mut self, hello: Hello) -> Result<Version, Ending> {
        let (version, client_id, keep_alive, clean) = match hello {
            Hello::V311(connect) => {
                if connect.client_id.is_empty() && !connect.clean_session {
                    encode(
                        &mut self.out,
                        Version::V311,
                        Reply::ConnRefused(Refusal::ClientId),
                    );
                    return Err(ProtocolError::EmptyClientId.into());
                }
                encode(
                    &mut self.out,
                    Version::V311,
                    Reply::ConnAck {
                        assigned_client_id: None,
                        max_packet_size: self.settings.max_packet_size,
                    },
                );
                (
                    Version::V311,
                    connect.client_id,
                    connect.keep_alive,
                    connect.clean_session,
                )
            }
            Hello::V5(connect) => {
                let method = connect
                    .properties
                    .as_ref()
                    .and_then(|p| p.authentication_method.clone());
                if let Some(method) = method {
                    encode(
                        &mut self.out,
                        Version::V5,
                        Reply::ConnRefused(Refusal::AuthMethod),
                    );
                    return Err(ProtocolError::AuthMethod(method).into());
                }
                // MQTT 5 lets the server name a client that sent no id.
                let (client_id, assigned) = if connect.client_id.is_empty() {
                    let id = format!("weir-{}", self.peer);
                    (id.clone(), Some(id))
                } else {
                    (connect.client_id, None)
                };
                encode(
                    &mut self.out,
                    Version::V5,
                    Reply::ConnAck {
                        assigned_client_id: assigned,
                        max_packet_size: self.settings.max_packet_size,
                    },
                );
                (
                    Version::V5,
                    client_id,
                    connect.keep_alive,
                    connect.clean_start,
                )
            }
        };
        tracing::Span::current().record("client_id", client_id.as_str());
        self.version = Some(version);
        self.keep_alive = (keep_alive > 0).then(|| Duration::from_secs(keep_alive.into()));
        self.heard();
        info!(
            ?version,
            keep_alive_s = keep_alive,
            clean,
            "MQTT client connected"
        );
        Ok(version)
    }

    /// Acts on one packet of an established connection.
    async fn handle(&mut self, packet: Inbound) -> Result<(), Ending> {
        match packet {
            Inbound::Publish(publish) => self.publish(publish).await,
            Inbound::PubRel(pkid) => {
                // An unknown id is answered too: the client may be resending
                // a PUBREL whose PUBCOMP was lost with an earlier connection.
                self.awaiting_rel.remove(&pkid);
                self.reply(Reply::PubComp(pkid));
                Ok(())
            }
            Inbound::Subscribe { pkid, filters } => {
                debug!(
                    ?filters,
                    "SUBSCRIBE refused: weir does not deliver to subscribers"
                );
                self.reply(Reply::SubAck {
                    pkid,
                    filters: filters.len(),
                });
                Ok(())
            }
            Inbound::Unsubscribe { pkid, filters } => {
                self.reply(Reply::UnsubAck { pkid, filters });
                Ok(())
            }
            Inbound::PingReq => {
                self.reply(Reply::PingResp);
                Ok(())
            }
            Inbound::Disconnect => Err(Ending::ClientDisconnect),
            Inbound::Connect => Err(ProtocolError::SecondConnect.into()),
            Inbound::Unexpected(what) => Err(ProtocolError::Unexpected(what).into()),
        }
    }

    async fn publish(&mut self, publish: InPublish) -> Result<(), Ending> {
        check_topic(&publish)?;
        let InPublish {
            qos,
            pkid,
            topic,
            payload,
            ..
        } = publish;
        match qos {
            QoS::AtMostOnce => {
                let record = self.ingress.mqtt_record(topic, payload);
                match self.settings.qos0_when_full {
                    Qos0WhenFull::Block => self.enqueue(record).await,
                    Qos0WhenFull::Drop => match self.ingress.try_enqueue(record) {
                        Ok(()) => Ok(()),
                        Err(EnqueueError::Full { record, class }) => {
                            self.ingress.metrics().dropped(record.class);
                            debug!(%class, "class queue full: QoS 0 record dropped");
                            Ok(())
                        }
                        Err(e) => Err(e.into()),
                    },
                }
            }
            QoS::AtLeastOnce => {
                let record = self.ingress.mqtt_record(topic, payload);
                self.enqueue(record).await?;
                self.reply(Reply::PubAck(pkid));
                Ok(())
            }
            QoS::ExactlyOnce => {
                if !self.awaiting_rel.contains(&pkid) {
                    let record = self.ingress.mqtt_record(topic, payload);
                    self.enqueue(record).await?;
                    self.awaiting_rel.insert(pkid);
                }
                self.reply(Reply::PubRec(pkid));
                Ok(())
            }
        }
    }

    /// Puts `record` in its class queue, waiting for room while it is full;
    /// meanwhile nothing more is read from this client (back-pressure).
    async fn enqueue(&mut self, record: Record) -> Result<(), Ending> {
        let mut record = match self.ingress.try_enqueue(record) {
            Ok(()) => return Ok(()),
            Err(EnqueueError::Full { record, .. }) => record,
            Err(e) => return Err(e.into()),
        };
        // Acknowledge what is already queued before waiting, so that those
        // acknowledgements do not wait on this record's queue.
        self.flush().await?;
        debug!(
            class = self.ingress.class_name(record.class),
            "class queue full: acknowledgement withheld, reads paused"
        );
        let queued = loop {
            // Cancel safety: if shutdown wins, the dropped `enqueue` future
            // drops the record it holds. It was never acknowledged, so a
            // QoS 1 or 2 client still owns it, and QoS 0 promised at most
            // once.
            let outcome = tokio::select! {
                outcome = self.ingress.enqueue(record, None) => outcome,
                _ = self.shutdown.cancelled() => return Err(Ending::Shutdown),
            };
            match outcome {
                // Without a deadline `enqueue` waits for room; if it ever
                // hands the record back, wait again.
                Err(EnqueueError::Full { record: back, .. }) => record = back,
                other => break other,
            }
        };
        // The client could not be heard while weir was not reading it.
        self.heard();
        queued.map_err(Ending::from)
    }

    fn reply(&mut self, reply: Reply) {
        if let Some(version) = self.version {
            encode(&mut self.out, version, reply);
        }
    }

    /// A packet arrived: restart the keep-alive clock (MQTT allows 1.5
    /// times the keep alive between packets).
    fn heard(&mut self) {
        self.deadline = self.keep_alive.map(|k| Instant::now() + k * 3 / 2);
    }

    /// Sends the queued replies, then reads more bytes from the client.
    async fn fill(&mut self) -> Result<(), Ending> {
        // Replies collect while complete packets are buffered; send them
        // before waiting on the client, which may be waiting on them.
        self.flush().await?;
        self.inbuf.reserve(READ_CHUNK);
        let deadline = self.deadline;
        let wake = {
            let expiry = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            // Cancel safety: `read_buf` is cancel safe (when another branch
            // wins, no bytes were consumed); the other branches only wait.
            tokio::select! {
                _ = self.shutdown.cancelled() => Wake::Shutdown,
                _ = expiry => Wake::Expired,
                read = self.stream.read_buf(&mut self.inbuf) => Wake::Read(read),
            }
        };
        match wake {
            Wake::Shutdown => Err(Ending::Shutdown),
            Wake::Expired => Err(match self.keep_alive {
                Some(keep_alive) if self.version.is_some() => Ending::KeepAliveExpired(keep_alive),
                _ => Ending::ConnectTimeout,
            }),
            Wake::Read(Ok(0)) if self.inbuf.is_empty() => Err(Ending::Eof),
            Wake::Read(Ok(0)) => Err(ProtocolError::Truncated.into()),
            Wake::Read(Ok(_)) => Ok(()),
            Wake::Read(Err(e)) => Err(Ending::Io(e)),
        }
    }

    /// Writes the queued replies.
    async fn flush(&mut self) -> Result<(), Ending> {
        if self.out.is_empty() {
            return Ok(());
        }
        match tokio::time::timeout(WRITE_TIMEOUT, self.stream.write_all(&self.out)).await {
            Ok(Ok(())) => {
                self.out.clear();
                Ok(())
            }
            Ok(Err(e)) => Err(Ending::Io(e)),
            Err(_) => Err(Ending::WriteTimeout),
        }
    }

    /// Closes the connection in an orderly way: FIN, then discard what the
    /// client still sends for a moment (see [`CLOSE_LINGER`]).
    async fn linger(&mut self) {
        let until = Instant::now() + CLOSE_LINGER;
        if tokio::time::timeout_at(until, self.stream.shutdown())
            .await
            .is_err()
        {
            return;
        }
        let mut discard = [0u8; 4096];
        // Cancel safety: a read cut off by the timeout only loses bytes that
        // are being discarded anyway.
        while let Ok(Ok(n)) = tokio::time::timeout_at(until, self.stream.read(&mut discard)).await {
            if n == 0 {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MAX: usize = 1024;

    fn v4_bytes(packet: v4::Packet) -> BytesMut {
        let mut buf = BytesMut::new();
        packet.write(&mut buf, usize::MAX).unwrap();
        buf
    }

    fn v5_bytes(packet: v5::Packet) -> BytesMut {
        let mut buf = BytesMut::new();
        packet.write(&mut buf, None).unwrap();
        buf
    }

    fn v5_connect() -> v5::Connect {
        v5::Connect {
            keep_alive: 30,
            client_id: "dev".into(),
            clean_start: true,
            properties: None,
        }
    }

    #[test]
    fn connect_versions_are_told_apart() {
        let mut buf = v4_bytes(v4::Packet::Connect(v4::Connect::new("dev")));
        assert!(matches!(
            decode_connect(&mut buf, MAX),
            Ok(Some(Hello::V311(c))) if c.client_id == "dev"
        ));
        assert!(buf.is_empty());

        let mut buf = v5_bytes(v5::Packet::Connect(v5_connect(), None, None));
        assert!(matches!(
            decode_connect(&mut buf, MAX),
            Ok(Some(Hello::V5(c))) if c.client_id == "dev"
        ));
        assert!(buf.is_empty());
    }

    #[test]
    fn other_protocol_levels_are_refused() {
        let mut buf = v4_bytes(v4::Packet::Connect(v4::Connect::new("dev")));
        // The protocol level follows the fixed header (2 bytes) and "MQTT".
        buf[2 + 6] = 3;
        assert!(matches!(
            decode_connect(&mut buf, MAX),
            Err(ProtocolError::UnsupportedLevel(3))
        ));
    }

    #[test]
    fn a_partial_packet_waits_for_more() {
        let full = v4_bytes(v4::Packet::Connect(v4::Connect::new("dev")));
        for cut in 0..full.len() {
            let mut buf = BytesMut::from(&full[..cut]);
            assert!(
                matches!(decode_connect(&mut buf, MAX), Ok(None)),
                "cut {cut}"
            );
            assert_eq!(buf.len(), cut, "nothing consumed");
        }
    }

    #[test]
    fn the_whole_packet_counts_against_the_limit() {
        let mut publish = v4::Publish::new("t", QoS::AtMostOnce, vec![0u8; 100]);
        publish.pkid = 0;
        let mut buf = v4_bytes(v4::Packet::Publish(publish));
        let len = buf.len();
        assert!(matches!(
            decode(&mut buf.clone(), Version::V311, len),
            Ok(Some(Inbound::Publish(_)))
        ));
        assert!(matches!(
            decode(&mut buf, Version::V311, len - 1),
            Err(ProtocolError::TooLarge { .. })
        ));
    }

    #[test]
    fn a_bare_v5_disconnect_is_accepted() {
        let mut buf = BytesMut::from(&[0xE0u8, 0x00][..]);
        assert!(matches!(
            decode(&mut buf, Version::V5, MAX),
            Ok(Some(Inbound::Disconnect))
        ));
        assert!(buf.is_empty());
    }

    #[test]
    fn v5_topics_are_checked_for_utf8() {
        let mut publish = v5::Publish::new("x", QoS5::AtLeastOnce, vec![1u8], None);
        publish.pkid = 7;
        publish.topic = Bytes::from_static(&[0xC3, 0x28]);
        let mut buf = v5_bytes(v5::Packet::Publish(publish));
        let Ok(Some(Inbound::Publish(p))) = decode(&mut buf, Version::V5, MAX) else {
            panic!("the v5 reader should accept the bytes");
        };
        assert!(matches!(check_topic(&p), Err(ProtocolError::TopicNotUtf8)));
    }

    #[test]
    fn topics_with_wildcards_nul_or_nothing_are_refused() {
        let publish = |topic: &'static str| InPublish {
            qos: QoS::AtMostOnce,
            pkid: 0,
            topic: Bytes::from_static(topic.as_bytes()),
            payload: Bytes::new(),
            topic_alias: None,
        };
        assert!(check_topic(&publish("a/b")).is_ok());
        assert!(matches!(
            check_topic(&publish("a/+")),
            Err(ProtocolError::TopicWildcard(_))
        ));
        assert!(matches!(
            check_topic(&publish("#")),
            Err(ProtocolError::TopicWildcard(_))
        ));
        assert!(matches!(
            check_topic(&publish("a\0b")),
            Err(ProtocolError::TopicNul(_))
        ));
        assert!(matches!(
            check_topic(&publish("")),
            Err(ProtocolError::EmptyTopic)
        ));
    }

    /// Every reply decodes, with rumqttc's client-side readers, to what was
    /// meant; in particular the MQTT 5 DISCONNECT with a reason.
    #[test]
    fn replies_round_trip() {
        let replies = || {
            vec![
                Reply::ConnAck {
                    assigned_client_id: Some("weir-x".into()),
                    max_packet_size: MAX,
                },
                Reply::ConnRefused(Refusal::ProtocolVersion),
                Reply::PubAck(1),
                Reply::PubRec(2),
                Reply::PubComp(3),
                Reply::SubAck {
                    pkid: 4,
                    filters: 2,
                },
                Reply::UnsubAck {
                    pkid: 5,
                    filters: 2,
                },
                Reply::PingResp,
                Reply::Disconnect(v5::DisconnectReasonCode::PacketTooLarge, "too big".into()),
            ]
        };
        let mut out = BytesMut::new();
        for reply in replies() {
            encode(&mut out, Version::V311, reply);
        }
        let mut seen = Vec::new();
        while !out.is_empty() {
            seen.push(v4::Packet::read(&mut out, usize::MAX).unwrap());
        }
        assert_eq!(seen.len(), 8, "no DISCONNECT in 3.1.1: {seen:?}");
        assert_eq!(
            seen[5],
            v4::Packet::SubAck(v4::SubAck::new(
                4,
                vec![v4::SubscribeReasonCode::Failure; 2]
            ))
        );

        let mut out = BytesMut::new();
        for reply in replies() {
            encode(&mut out, Version::V5, reply);
        }
        let mut seen = Vec::new();
        while !out.is_empty() {
            seen.push(v5::Packet::read(&mut out, None).unwrap());
        }
        assert_eq!(seen.len(), 9, "{seen:?}");
        let v5::Packet::ConnAck(connack) = &seen[0] else {
            panic!("{seen:?}")
        };
        let props = connack.properties.as_ref().unwrap();
        assert_eq!(props.max_packet_size, Some(MAX as u32));
        assert_eq!(props.assigned_client_identifier.as_deref(), Some("weir-x"));
        let v5::Packet::Disconnect(disconnect) = &seen[8] else {
            panic!("{seen:?}")
        };
        assert_eq!(
            disconnect.reason_code,
            v5::DisconnectReasonCode::PacketTooLarge
        );
        assert_eq!(
            disconnect
                .properties
                .as_ref()
                .unwrap()
                .reason_string
                .as_deref(),
            Some("too big")
        );
    }

    proptest! {
        /// No byte sequence panics the decoders, and every call either
        /// waits without consuming, consumes a packet, or refuses.
        #[test]
        fn arbitrary_bytes_never_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..300),
            max in 2usize..400,
        ) {
            let mut buf = BytesMut::from(&bytes[..]);
            let _ = decode_connect(&mut buf, max);
            for version in [Version::V311, Version::V5] {
                let mut buf = BytesMut::from(&bytes[..]);
                // Decode until the decoder waits or refuses.
                while let Ok(Some(_)) = decode(&mut buf, version, max) {}
            }
        }

        /// Arbitrary bytes after a valid fixed header (the likelier attack:
        /// well-framed, garbage inside) never panic either.
        #[test]
        fn arbitrary_bodies_never_panic(
            byte1 in any::<u8>(),
            body in proptest::collection::vec(any::<u8>(), 0..127),
        ) {
            let mut bytes = vec![byte1, body.len() as u8];
            bytes.extend_from_slice(&body);
            let mut buf = BytesMut::from(&bytes[..]);
            let _ = decode_connect(&mut buf, MAX);
            for version in [Version::V311, Version::V5] {
                let mut buf = BytesMut::from(&bytes[..]);
                let _ = decode(&mut buf, version, MAX);
            }
        }
    }
}
