//! The MQTT wire for `listen` mode: packets framed and parsed by rumqttc's
//! codecs (3.1.1 and 5) into what a connection acts on ([`Inbound`]), the
//! checks that refuse bad input ([`ProtocolError`]), and the replies
//! encoded back ([`Reply`]). No sockets, no queues: the connection
//! (`connection.rs`) drives it.

use bytes::{Buf, Bytes, BytesMut};
use rumqttc::mqttbytes::{self, v4, PacketType, QoS};
use rumqttc::v5::mqttbytes::{v5, Error as Error5, QoS as QoS5};

/// The MQTT 5 reason string in a refusing SUBACK.
pub(super) const SUBSCRIBE_REFUSED: &str =
    "weir relays records upstream; it delivers nothing to subscribers";

/// Bad input from a client; closes its connection.
#[derive(Debug, thiserror::Error)]
pub(super) enum ProtocolError {
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
    #[error("more than {0} QoS 2 publishes awaiting PUBREL (ingress.mqtt.max_inflight, the receive maximum)")]
    ReceiveMaximum(usize),
}

impl ProtocolError {
    /// The MQTT 5 DISCONNECT reason code that tells the client about it.
    pub(super) fn v5_reason(&self) -> v5::DisconnectReasonCode {
        use v5::DisconnectReasonCode as R;
        match self {
            ProtocolError::TooLarge { .. } => R::PacketTooLarge,
            ProtocolError::EmptyTopic | ProtocolError::TopicWildcard(_) => R::TopicNameInvalid,
            ProtocolError::TopicAlias(_) => R::TopicAliasInvalid,
            ProtocolError::ReceiveMaximum(_) => R::ReceiveMaximumExceeded,
            ProtocolError::SecondConnect
            | ProtocolError::Unexpected(_)
            | ProtocolError::NotConnect(_) => R::ProtocolError,
            _ => R::MalformedPacket,
        }
    }
}

/// The protocol version of a connection, fixed by its CONNECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Version {
    V311,
    V5,
}

/// A CONNECT packet.
#[derive(Debug)]
pub(super) enum Hello {
    V311(v4::Connect),
    V5(v5::Connect, Option<v5::Login>),
}

/// A PUBLISH, whichever the version.
#[derive(Debug)]
pub(super) struct InPublish {
    pub(super) qos: QoS,
    /// DUP: the client may have sent this packet id's PUBLISH before.
    pub(super) dup: bool,
    pub(super) pkid: u16,
    pub(super) topic: Bytes,
    pub(super) payload: Bytes,
    pub(super) topic_alias: Option<u16>,
}

/// A packet after CONNECT, whichever the version.
#[derive(Debug)]
pub(super) enum Inbound {
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
pub(super) enum Refusal {
    ProtocolVersion,
    ClientId,
    AuthMethod,
    /// Authentication refused the client.
    NotAuthorized,
    /// `ingress.mqtt.max_connections` are open.
    ServerBusy,
}

/// A packet weir sends.
#[derive(Debug)]
pub(super) enum Reply {
    ConnAck {
        assigned_client_id: Option<String>,
        max_packet_size: usize,
        /// MQTT 5 receive maximum.
        receive_max: u16,
        /// A stored session was resumed.
        session_present: bool,
    },
    ConnRefused(Refusal),
    PubAck(u16),
    PubRec(u16),
    /// A publish the ACL refused: its packet id, and whether it was QoS 2
    /// (PUBREC) rather than QoS 1 (PUBACK).
    Denied(u16, bool),
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
pub(super) fn frame(
    buf: &BytesMut,
    max: usize,
) -> Result<Option<mqttbytes::FixedHeader>, ProtocolError> {
    // Refused as soon as its fixed header says so: a packet over the limit
    // is never read in (the codec waits for the body when only the header
    // pushes it over).
    if let Some(size) = declared_size(buf) {
        if size > max {
            return Err(ProtocolError::TooLarge { size, max });
        }
    }
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

/// The whole size of the packet at the head of `buf` as its fixed header
/// states it, once the header is complete; `None` before that, or for a
/// malformed length (the codec reports it).
fn declared_size(buf: &[u8]) -> Option<usize> {
    let mut remaining = 0usize;
    for (i, &b) in buf.iter().skip(1).take(4).enumerate() {
        remaining |= usize::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some(2 + i + remaining);
        }
    }
    None
}

/// The length of the fixed header before `remaining` bytes: the type byte
/// and the remaining length as a variable byte integer (for log lines).
pub(super) fn fixed_header_len(remaining: usize) -> usize {
    1 + match remaining {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}

/// The CONNECT at the head of `buf`, or `None` if more bytes are needed.
pub(super) fn decode_connect(
    buf: &mut BytesMut,
    max: usize,
) -> Result<Option<Hello>, ProtocolError> {
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
        Ok((connect, _will, login)) => Ok(Some(Hello::V5(connect, login))),
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
pub(super) fn decode(
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

pub(super) fn from_v4(packet: v4::Packet) -> Inbound {
    match packet {
        v4::Packet::Connect(_) => Inbound::Connect,
        v4::Packet::Publish(p) => Inbound::Publish(InPublish {
            qos: p.qos,
            dup: p.dup,
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

pub(super) fn from_v5(packet: v5::Packet) -> Inbound {
    match packet {
        v5::Packet::Connect(..) => Inbound::Connect,
        v5::Packet::Publish(p) => Inbound::Publish(InPublish {
            dup: p.dup,
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
pub(super) fn check_topic(publish: &InPublish) -> Result<(), ProtocolError> {
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
pub(super) fn encode(out: &mut BytesMut, version: Version, reply: Reply) {
    // Neither codec can fail on these: every reply is far below MQTT's
    // 256 MiB packet limit and no packet id is 0 (the readers refuse 0).
    match version {
        Version::V311 => {
            let packet = match reply {
                Reply::ConnAck {
                    session_present, ..
                } => v4::Packet::ConnAck(v4::ConnAck::new(
                    v4::ConnectReturnCode::Success,
                    session_present,
                )),
                Reply::ConnRefused(refusal) => {
                    let code = match refusal {
                        Refusal::ProtocolVersion => v4::ConnectReturnCode::RefusedProtocolVersion,
                        Refusal::ClientId => v4::ConnectReturnCode::BadClientId,
                        Refusal::AuthMethod | Refusal::NotAuthorized => {
                            v4::ConnectReturnCode::NotAuthorized
                        }
                        Refusal::ServerBusy => v4::ConnectReturnCode::ServiceUnavailable,
                    };
                    v4::Packet::ConnAck(v4::ConnAck::new(code, false))
                }
                Reply::PubAck(pkid) | Reply::Denied(pkid, false) => {
                    v4::Packet::PubAck(v4::PubAck::new(pkid))
                }
                Reply::PubRec(pkid) | Reply::Denied(pkid, true) => {
                    v4::Packet::PubRec(v4::PubRec::new(pkid))
                }
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
                    receive_max,
                    session_present,
                } => v5::Packet::ConnAck(v5::ConnAck {
                    session_present,
                    code: v5::ConnectReturnCode::Success,
                    properties: Some(connack_properties(
                        assigned_client_id,
                        max_packet_size,
                        receive_max,
                    )),
                }),
                Reply::ConnRefused(refusal) => {
                    let code = match refusal {
                        Refusal::ProtocolVersion => {
                            v5::ConnectReturnCode::UnsupportedProtocolVersion
                        }
                        Refusal::ClientId => v5::ConnectReturnCode::ClientIdentifierNotValid,
                        Refusal::AuthMethod => v5::ConnectReturnCode::BadAuthenticationMethod,
                        Refusal::NotAuthorized => v5::ConnectReturnCode::NotAuthorized,
                        Refusal::ServerBusy => v5::ConnectReturnCode::ServerBusy,
                    };
                    v5::Packet::ConnAck(v5::ConnAck {
                        session_present: false,
                        code,
                        properties: None,
                    })
                }
                Reply::PubAck(pkid) => v5::Packet::PubAck(v5::PubAck::new(pkid, None)),
                Reply::PubRec(pkid) => v5::Packet::PubRec(v5::PubRec::new(pkid, None)),
                Reply::Denied(pkid, false) => v5::Packet::PubAck(v5::PubAck {
                    pkid,
                    reason: v5::PubAckReason::NotAuthorized,
                    properties: None,
                }),
                Reply::Denied(pkid, true) => v5::Packet::PubRec(v5::PubRec {
                    pkid,
                    reason: v5::PubRecReason::NotAuthorized,
                    properties: None,
                }),
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
pub(super) fn connack_properties(
    assigned_client_id: Option<String>,
    max_packet_size: usize,
    receive_max: u16,
) -> v5::ConnAckProperties {
    v5::ConnAckProperties {
        session_expiry_interval: None,
        receive_max: Some(receive_max),
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
            Ok(Some(Hello::V5(c, _))) if c.client_id == "dev"
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
        // Payloads that put the remaining length on each side of the 1-,
        // 2- and 3-byte length encodings: the fixed header is 2 to 4
        // bytes, and every one of them counts, in both versions.
        for payload in [
            0, 100, 118, 119, 120, 125, 126, 16_370, 16_380, 16_390, 70_000,
        ] {
            let mut p4 = v4::Publish::new("t/x", QoS::AtLeastOnce, vec![7u8; payload]);
            p4.pkid = 1;
            let mut p5 = v5::Publish::new("t/x", QoS5::AtLeastOnce, vec![7u8; payload], None);
            p5.pkid = 1;
            for (version, buf) in [
                (Version::V311, v4_bytes(v4::Packet::Publish(p4.clone()))),
                (Version::V5, v5_bytes(v5::Packet::Publish(p5.clone()))),
            ] {
                let len = buf.len();
                assert!(
                    matches!(
                        decode(&mut buf.clone(), version, len),
                        Ok(Some(Inbound::Publish(_)))
                    ),
                    "{version:?} packet of {len} bytes at a limit of {len}"
                );
                let header = 2 + buf[1..].iter().take_while(|b| **b & 0x80 != 0).count();
                for over in 1..=4 {
                    let limit = len - over;
                    match decode(&mut buf.clone(), version, limit) {
                        Err(ProtocolError::TooLarge { size, max }) => {
                            assert_eq!((size, max), (len, limit));
                        }
                        other => panic!(
                            "{version:?} packet of {len} bytes at a limit of {limit}: {other:?}"
                        ),
                    }
                    // Refused at its fixed header, before its body.
                    let mut head = BytesMut::from(&buf[..header]);
                    match decode(&mut head, version, limit) {
                        Err(ProtocolError::TooLarge { size, max }) => {
                            assert_eq!((size, max), (len, limit));
                        }
                        other => panic!(
                            "{version:?} fixed header of a {len}-byte packet at a limit of {limit}: {other:?}"
                        ),
                    }
                    let mut short = BytesMut::from(&buf[..header - 1]);
                    assert!(
                        matches!(decode(&mut short, version, limit), Ok(None)),
                        "an incomplete fixed header waits"
                    );
                }
            }
        }
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
            dup: false,
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
                    receive_max: 1024,
                    session_present: true,
                },
                Reply::ConnRefused(Refusal::ProtocolVersion),
                Reply::ConnRefused(Refusal::NotAuthorized),
                Reply::ConnRefused(Refusal::ServerBusy),
                Reply::Denied(7, false),
                Reply::Denied(8, true),
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
        assert_eq!(seen.len(), 12, "no DISCONNECT in 3.1.1: {seen:?}");
        let codes: Vec<_> = seen[2..4]
            .iter()
            .map(|p| match p {
                v4::Packet::ConnAck(c) => c.code,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            codes,
            [
                v4::ConnectReturnCode::NotAuthorized,
                v4::ConnectReturnCode::ServiceUnavailable
            ]
        );
        // Denied publishes: ordinary acknowledgements in 3.1.1.
        assert_eq!(seen[4], v4::Packet::PubAck(v4::PubAck::new(7)));
        assert_eq!(seen[5], v4::Packet::PubRec(v4::PubRec::new(8)));
        assert_eq!(
            seen[9],
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
        assert_eq!(seen.len(), 13, "{seen:?}");
        let v5::Packet::ConnAck(connack) = &seen[0] else {
            panic!("{seen:?}")
        };
        let props = connack.properties.as_ref().unwrap();
        assert_eq!(props.max_packet_size, Some(MAX as u32));
        assert_eq!(props.receive_max, Some(1024));
        assert_eq!(props.assigned_client_identifier.as_deref(), Some("weir-x"));
        let codes: Vec<_> = seen[2..4]
            .iter()
            .map(|p| match p {
                v5::Packet::ConnAck(c) => c.code,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            codes,
            [
                v5::ConnectReturnCode::NotAuthorized,
                v5::ConnectReturnCode::ServerBusy
            ]
        );
        let (v5::Packet::PubAck(ack), v5::Packet::PubRec(rec)) = (&seen[4], &seen[5]) else {
            panic!("{seen:?}")
        };
        assert_eq!((ack.pkid, ack.reason), (7, v5::PubAckReason::NotAuthorized));
        assert_eq!((rec.pkid, rec.reason), (8, v5::PubRecReason::NotAuthorized));
        let v5::Packet::Disconnect(disconnect) = &seen[12] else {
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
