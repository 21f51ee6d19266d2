//! The MQTT egress connection's protocol state, without I/O: which
//! publishes go out next and under which packet id, which batch each
//! PUBACK counts towards, when to ping and when the broker has gone
//! quiet. The driver (`super`) owns the socket: it hands this machine the
//! packets it reads and the time, and writes what [`Publisher::write_to`]
//! encodes, many publishes per write.
//!
//! Packets are encoded and decoded by rumqttc's MQTT 3.1.1 codec
//! (`rumqttc::mqttbytes`); only the session's decisions are here.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use rumqttc::mqttbytes::v4::{
    ConnAck, Connect, ConnectReturnCode, Login, Packet, PingReq, PubAck, Publish,
};
use rumqttc::mqttbytes::QoS;

/// A batch, as the driver names it.
pub type BatchId = u64;

/// What ends a connection: the broker broke the protocol or went quiet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Broken {
    #[error("no PINGRESP within {0:?} of the PINGREQ (egress.mqtt.keep_alive)")]
    Silent(Duration),
    #[error("the broker sent {0}, which a publisher never gets")]
    Unexpected(&'static str),
    #[error("the broker sent a malformed packet: {0}")]
    Malformed(String),
}

/// What weir asks for in CONNECT.
#[derive(Debug, Clone)]
pub struct Hello {
    pub client_id: String,
    pub keep_alive: Duration,
    pub clean_session: bool,
    pub login: Option<(String, String)>,
}

impl Hello {
    /// The CONNECT packet, encoded into `buf`.
    pub fn write_to(&self, buf: &mut BytesMut) {
        let mut connect = Connect::new(self.client_id.clone());
        connect.keep_alive = u16::try_from(self.keep_alive.as_secs()).unwrap_or(u16::MAX);
        connect.clean_session = self.clean_session;
        connect.login = self
            .login
            .as_ref()
            .map(|(user, password)| Login::new(user.clone(), password.clone()));
        // Client ids and credentials are bounded by the config's checks.
        let _ = connect.write(buf);
    }
}

/// Reads the broker's answer to CONNECT from `buf`: `None` while it is
/// incomplete.
pub fn read_connack(buf: &mut BytesMut, max_packet: usize) -> Result<Option<ConnAck>, Broken> {
    match read_packet(buf, max_packet)? {
        None => Ok(None),
        Some(Packet::ConnAck(ack)) => Ok(Some(ack)),
        Some(other) => Err(Broken::Unexpected(packet_name(&other))),
    }
}

/// What a CONNACK's return code means for weir.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Accepted,
    /// The broker refused weir's terms: the config key to fix (start-up
    /// stops on it).
    Refused(&'static str),
    /// The broker cannot serve now: try again later.
    Unavailable,
}

/// The meaning of a CONNACK's return code.
pub fn answer(code: ConnectReturnCode) -> Answer {
    match code {
        ConnectReturnCode::Success => Answer::Accepted,
        ConnectReturnCode::BadUserNamePassword | ConnectReturnCode::NotAuthorized => {
            Answer::Refused("egress.mqtt.username")
        }
        ConnectReturnCode::BadClientId | ConnectReturnCode::RefusedProtocolVersion => {
            Answer::Refused("egress.mqtt.client_id")
        }
        ConnectReturnCode::ServiceUnavailable => Answer::Unavailable,
    }
}

/// Takes the next whole packet off `buf`, if there is one.
pub fn read_packet(buf: &mut BytesMut, max_packet: usize) -> Result<Option<Packet>, Broken> {
    match Packet::read(buf, max_packet) {
        Ok(p) => Ok(Some(p)),
        Err(rumqttc::mqttbytes::Error::InsufficientBytes(_)) => Ok(None),
        Err(e) => Err(Broken::Malformed(e.to_string())),
    }
}

fn packet_name(p: &Packet) -> &'static str {
    match p {
        Packet::Connect(_) => "CONNECT",
        Packet::ConnAck(_) => "CONNACK",
        Packet::Publish(_) => "PUBLISH",
        Packet::PubAck(_) => "PUBACK",
        Packet::PubRec(_) => "PUBREC",
        Packet::PubRel(_) => "PUBREL",
        Packet::PubComp(_) => "PUBCOMP",
        Packet::Subscribe(_) => "SUBSCRIBE",
        Packet::SubAck(_) => "SUBACK",
        Packet::Unsubscribe(_) => "UNSUBSCRIBE",
        Packet::UnsubAck(_) => "UNSUBACK",
        Packet::PingReq => "PINGREQ",
        Packet::PingResp => "PINGRESP",
        Packet::Disconnect => "DISCONNECT",
    }
}

/// One publish waiting for its turn.
struct Waiting {
    batch: BatchId,
    topic: String,
    payload: Bytes,
}

/// A connected publisher's session: QoS 1 publishes with at most
/// `max_in_flight` unacknowledged, batches confirmed when every one of
/// their publishes is.
pub struct Publisher {
    max_in_flight: usize,
    keep_alive: Duration,
    waiting: VecDeque<Waiting>,
    /// Packet id to the batch its publish belongs to.
    in_flight: HashMap<u16, BatchId>,
    /// Publishes of each batch not yet acknowledged.
    remaining: HashMap<BatchId, usize>,
    /// Batches whose every publish is acknowledged, oldest first.
    confirmed: VecDeque<BatchId>,
    /// PUBACKs owed to the broker for QoS 1 publishes it sent (a session
    /// that had subscriptions under the same client id).
    owed: Vec<u16>,
    next_pkid: u16,
    /// When weir last sent a packet: a PINGREQ is due a keep-alive later.
    last_sent: Instant,
    ping_due: bool,
    /// When the unanswered PINGREQ went out.
    ping_sent: Option<Instant>,
}

impl Publisher {
    /// A session just connected at `now`.
    pub fn new(max_in_flight: usize, keep_alive: Duration, now: Instant) -> Publisher {
        Publisher {
            max_in_flight: max_in_flight.clamp(1, usize::from(u16::MAX)),
            keep_alive,
            waiting: VecDeque::new(),
            in_flight: HashMap::new(),
            remaining: HashMap::new(),
            confirmed: VecDeque::new(),
            owed: Vec::new(),
            next_pkid: 0,
            last_sent: now,
            ping_due: false,
            ping_sent: None,
        }
    }

    /// Queues a batch's publishes `(topic, payload)`, sent in this order.
    /// A batch without any is confirmed at once.
    pub fn queue(&mut self, batch: BatchId, publishes: Vec<(String, Bytes)>) {
        if publishes.is_empty() {
            self.confirmed.push_back(batch);
            return;
        }
        self.remaining.insert(batch, publishes.len());
        self.waiting
            .extend(publishes.into_iter().map(|(topic, payload)| Waiting {
                batch,
                topic,
                payload,
            }));
    }

    /// Encodes into `buf` what may go now: PUBACKs owed, a PINGREQ if due,
    /// and waiting publishes while fewer than `max_in_flight` are
    /// unacknowledged and `buf` holds under `limit` bytes. Returns whether
    /// anything was written.
    ///
    /// Publishes go out once a quarter of the window is free (or nothing is
    /// in flight), not one per PUBACK: a broker acknowledging one publish at
    /// a time would otherwise have weir write one publish per system call.
    pub fn write_to(&mut self, buf: &mut BytesMut, limit: usize, now: Instant) -> bool {
        let before = buf.len();
        for pkid in self.owed.drain(..) {
            let _ = PubAck::new(pkid).write(buf);
        }
        if self.ping_due && self.ping_sent.is_none() {
            let _ = PingReq.write(buf);
            self.ping_due = false;
            self.ping_sent = Some(now);
        }
        let free = self.max_in_flight - self.in_flight.len();
        if free < (self.max_in_flight / 4).max(1) && !self.in_flight.is_empty() {
            return self.wrote(buf.len() > before, now);
        }
        while self.in_flight.len() < self.max_in_flight && buf.len() < limit {
            let Some(next) = self.waiting.pop_front() else {
                break;
            };
            let pkid = self.take_pkid();
            let mut publish = Publish::from_bytes(next.topic, QoS::AtLeastOnce, next.payload);
            publish.pkid = pkid;
            // Topics and payloads are bounded by the config's checks
            // (`max_payload`, topics of at most 65,535 bytes).
            let _ = publish.write(buf);
            self.in_flight.insert(pkid, next.batch);
        }
        self.wrote(buf.len() > before, now)
    }

    fn wrote(&mut self, wrote: bool, now: Instant) -> bool {
        if wrote {
            self.last_sent = now;
        }
        wrote
    }

    /// The next free packet id (1 to 65,535).
    fn take_pkid(&mut self) -> u16 {
        loop {
            self.next_pkid = self.next_pkid.checked_add(1).unwrap_or(1);
            if !self.in_flight.contains_key(&self.next_pkid) {
                return self.next_pkid;
            }
        }
    }

    /// A packet from the broker.
    pub fn handle_packet(&mut self, packet: Packet) -> Result<(), Broken> {
        match packet {
            Packet::PubAck(ack) => {
                // An id weir has no publish under (acknowledged twice) is
                // ignored: nothing waits on it.
                if let Some(batch) = self.in_flight.remove(&ack.pkid) {
                    self.count_off(batch);
                }
                Ok(())
            }
            Packet::PingResp => {
                self.ping_sent = None;
                Ok(())
            }
            // Messages for subscriptions an earlier client left under the
            // same client id: acknowledged and dropped.
            Packet::Publish(p) => match p.qos {
                QoS::AtMostOnce => Ok(()),
                QoS::AtLeastOnce => {
                    self.owed.push(p.pkid);
                    Ok(())
                }
                QoS::ExactlyOnce => Err(Broken::Unexpected("PUBLISH at QoS 2")),
            },
            other => Err(Broken::Unexpected(packet_name(&other))),
        }
    }

    fn count_off(&mut self, batch: BatchId) {
        if let Some(left) = self.remaining.get_mut(&batch) {
            *left -= 1;
            if *left == 0 {
                self.remaining.remove(&batch);
                self.confirmed.push_back(batch);
            }
        }
    }

    /// A batch whose publishes are all acknowledged.
    pub fn poll_confirmed(&mut self) -> Option<BatchId> {
        self.confirmed.pop_front()
    }

    /// When [`Publisher::handle_timeout`] has something to do.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.keep_alive.is_zero() {
            return None;
        }
        Some(match self.ping_sent {
            Some(sent) => sent + self.keep_alive,
            None => self.last_sent + self.keep_alive,
        })
    }

    /// Time passed: a PINGREQ falls due after a keep-alive without
    /// sending, and a broker that does not answer it within another
    /// keep-alive has gone.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), Broken> {
        if self.keep_alive.is_zero() {
            return Ok(());
        }
        match self.ping_sent {
            Some(sent) if now >= sent + self.keep_alive => Err(Broken::Silent(self.keep_alive)),
            Some(_) => Ok(()),
            None => {
                if now >= self.last_sent + self.keep_alive {
                    self.ping_due = true;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests;
