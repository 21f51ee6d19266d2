//! The protocol state of one MQTT connection, without I/O: what a publish
//! means given the packet ids seen before (a new record, a resend to
//! answer, a QoS 2 id already queued), which replies may go out now (in
//! publish order, each behind the durability of its record), the receive
//! maximum, and when the connection expires (connect timeout, then 1.5
//! times the client's keep alive).
//!
//! The connection task ([`super::connection`]) drives it: it decodes a
//! packet, asks [`State::handle_publish`] what to do, queues the record if
//! told to, reports the outcome with [`State::handle_queued`], and writes
//! what [`State::poll_reply`] hands out. Waiting is the task's: for bytes
//! while [`State::can_read`], for [`State::poll_durable`]'s ticket, for
//! [`State::poll_timeout`]. Nothing here reads a clock or a socket, so the
//! rules are tested on a made-up clock with made-up tickets.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rumqttc::mqttbytes::QoS;

use super::codec::{Hello, ProtocolError, Refusal, Reply, Version};

/// What an acknowledgement may wait for: a record handed to the spool,
/// which is acknowledged only once it is on disk.
pub(super) trait Durable: Clone {
    fn is_durable(&self) -> bool;
}

impl Durable for crate::spool::Ticket {
    fn is_durable(&self) -> bool {
        crate::spool::Ticket::is_durable(self)
    }
}

/// One client's packet-id state, kept between connections for persistent
/// sessions (see [`super::session`]).
#[derive(Debug)]
pub(super) struct Session<T> {
    /// QoS 1 packet id -> fingerprint of the last publish accepted with
    /// it, and the ticket its acknowledgement waits for (a resend is
    /// acknowledged no sooner than the original would have been). Kept
    /// for persistent sessions only.
    qos1: HashMap<u16, (u64, Option<T>)>,
    /// QoS 2 packet ids whose record is queued and PUBREC sent, awaiting
    /// PUBREL: a resend of one of these is not queued again.
    awaiting_rel: HashSet<u16>,
}

impl<T> Default for Session<T> {
    fn default() -> Self {
        Session {
            qos1: HashMap::new(),
            awaiting_rel: HashSet::new(),
        }
    }
}

/// The fingerprint of a publish: topic and payload.
pub(super) fn fingerprint(topic: &[u8], payload: &[u8]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    topic.hash(&mut h);
    payload.hash(&mut h);
    h.finish()
}

impl<T: Clone> Session<T> {
    /// `Some(ticket)` when a QoS 1 publish is a resend of one already
    /// accepted: acknowledge it once `ticket` (if any) is durable.
    pub(super) fn resend(&self, dup: bool, pkid: u16, fingerprint: u64) -> Option<Option<T>> {
        match self.qos1.get(&pkid) {
            Some((f, ticket)) if dup && *f == fingerprint => Some(ticket.clone()),
            _ => None,
        }
    }

    /// A QoS 1 publish was accepted (queued, or handed to the spool).
    pub(super) fn accepted(&mut self, pkid: u16, fingerprint: u64, ticket: Option<T>) {
        self.qos1.insert(pkid, (fingerprint, ticket));
    }
}

/// What to do with a publish that passed the topic and ACL checks.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Publish {
    /// A new record: queue it, then report with [`State::handle_queued`].
    Queue(Queued),
    /// A resend: its reply is queued (or already held); nothing to queue.
    Answered,
}

/// A publish being queued: what [`State::handle_queued`] needs back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Queued {
    qos: QoS,
    pkid: u16,
    /// Set in persistent sessions, for QoS 1.
    fingerprint: Option<u64>,
}

/// Why [`State::poll_timeout`]'s deadline ends the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expiry {
    /// No CONNECT in time.
    Connect,
    /// Nothing heard for 1.5 times this keep alive.
    KeepAlive(Duration),
}

/// What a CONNECT asks for, once weir's rules are applied to it.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Terms {
    pub(super) version: Version,
    pub(super) client_id: String,
    /// The id weir chose, for an MQTT 5 client that sent none (its
    /// CONNACK says so).
    pub(super) assigned: Option<String>,
    /// `None` when the client asked for none.
    pub(super) keep_alive: Option<Duration>,
    /// Discard a stored session.
    pub(super) clean: bool,
    /// Keep the session after this connection (MQTT 3.1.1: not clean;
    /// MQTT 5: a session expiry interval above zero).
    pub(super) persistent: bool,
    /// Username and password.
    pub(super) login: Option<(String, String)>,
}

impl Terms {
    /// The terms of `hello` from `peer`, or the refusal to send (in the
    /// client's version) and why.
    pub(super) fn of(
        hello: Hello,
        peer: SocketAddr,
    ) -> Result<Terms, (Version, Refusal, ProtocolError)> {
        // The id weir gives a client that sent none: MQTT 3.1.1 section
        // 3.1.3.1 (clean sessions only) and MQTT 5. Without a unique one,
        // two such clients would take each other's session over.
        let assign = |id: String| {
            if id.is_empty() {
                format!("weir-{peer}")
            } else {
                id
            }
        };
        match hello {
            Hello::V311(connect) => {
                if connect.client_id.is_empty() && !connect.clean_session {
                    return Err((
                        Version::V311,
                        Refusal::ClientId,
                        ProtocolError::EmptyClientId,
                    ));
                }
                Ok(Terms {
                    version: Version::V311,
                    client_id: assign(connect.client_id),
                    assigned: None,
                    keep_alive: keep_alive(connect.keep_alive),
                    clean: connect.clean_session,
                    persistent: !connect.clean_session,
                    login: connect.login.map(|l| (l.username, l.password)),
                })
            }
            Hello::V5(connect, login) => {
                let properties = connect.properties.as_ref();
                if let Some(method) = properties.and_then(|p| p.authentication_method.clone()) {
                    return Err((
                        Version::V5,
                        Refusal::AuthMethod,
                        ProtocolError::AuthMethod(method),
                    ));
                }
                // MQTT 5 keeps a session after the connection only for its
                // session expiry interval (absent: 0, none). weir keeps it
                // until the client returns or the session cap pushes it out.
                let expiry = properties
                    .and_then(|p| p.session_expiry_interval)
                    .unwrap_or(0);
                let assigned = connect.client_id.is_empty().then(|| assign(String::new()));
                Ok(Terms {
                    version: Version::V5,
                    client_id: assigned.clone().unwrap_or(connect.client_id),
                    assigned,
                    keep_alive: keep_alive(connect.keep_alive),
                    clean: connect.clean_start,
                    persistent: expiry > 0,
                    login: login.map(|l| (l.username, l.password)),
                })
            }
        }
    }
}

fn keep_alive(seconds: u16) -> Option<Duration> {
    (seconds > 0).then(|| Duration::from_secs(seconds.into()))
}

/// One connection's protocol state; `T` is what a reply waits on.
#[derive(Debug)]
pub(super) struct State<T> {
    session: Session<T>,
    /// Whether the session outlives the connection (QoS 1 fingerprints
    /// are kept only then).
    persistent: bool,
    /// Replies not yet handed out, in order, each with the ticket (if
    /// any) it waits for. A reply with no ticket waits only for those
    /// before it: MQTT wants acknowledgements in the order of the
    /// publishes.
    replies: VecDeque<(Option<T>, Reply)>,
    /// Unacknowledged QoS 1/2 publishes a client may have (its receive
    /// maximum): beyond it the client is not read.
    max_inflight: usize,
    connected: bool,
    /// The client's keep alive; `None` when it asked for none.
    keep_alive: Option<Duration>,
    deadline: Option<Instant>,
}

impl<T: Durable> State<T> {
    /// A new connection: it must CONNECT by `connect_by`.
    pub(super) fn new(max_inflight: usize, connect_by: Instant) -> Self {
        State {
            session: Session::default(),
            persistent: false,
            replies: VecDeque::new(),
            max_inflight,
            connected: false,
            keep_alive: None,
            deadline: Some(connect_by),
        }
    }

    /// CONNECT accepted at `now`, with `session` taken up (a new one, or
    /// a stored one resumed); `persistent`: whether it outlives this
    /// connection.
    pub(super) fn handle_connect(
        &mut self,
        keep_alive: Option<Duration>,
        session: Session<T>,
        persistent: bool,
        now: Instant,
    ) {
        self.session = session;
        self.persistent = persistent;
        self.connected = true;
        self.keep_alive = keep_alive;
        self.heard(now);
    }

    /// A packet arrived at `now` (or the client could not be heard until
    /// then): MQTT allows 1.5 times the keep alive between packets.
    pub(super) fn heard(&mut self, now: Instant) {
        if self.connected {
            self.deadline = self.keep_alive.map(|k| now + k * 3 / 2);
        }
    }

    /// When the connection expires unless a packet arrives, and why.
    pub(super) fn poll_timeout(&self) -> Option<(Instant, Expiry)> {
        let why = match self.keep_alive {
            Some(k) if self.connected => Expiry::KeepAlive(k),
            _ => Expiry::Connect,
        };
        self.deadline.map(|at| (at, why))
    }

    /// A PUBLISH of `qos` with packet id `pkid`, `dup` set or not, on
    /// `topic` with `payload`, allowed by the ACL.
    pub(super) fn handle_publish(
        &mut self,
        qos: QoS,
        dup: bool,
        pkid: u16,
        topic: &[u8],
        payload: &[u8],
    ) -> Result<Publish, ProtocolError> {
        let queue = |fingerprint| {
            Ok(Publish::Queue(Queued {
                qos,
                pkid,
                fingerprint,
            }))
        };
        match qos {
            QoS::AtMostOnce => queue(None),
            QoS::AtLeastOnce => {
                // A resend of a PUBLISH whose PUBACK is still held (its
                // record on its way to disk) is the same record: the held
                // PUBACK answers both.
                if dup && self.holds(&Reply::PubAck(pkid)) {
                    return Ok(Publish::Answered);
                }
                // A resend after a reconnect, in a persistent session.
                let print = self.persistent.then(|| fingerprint(topic, payload));
                if let Some(ticket) = print.and_then(|f| self.session.resend(dup, pkid, f)) {
                    self.reply_after(ticket, Reply::PubAck(pkid));
                    return Ok(Publish::Answered);
                }
                queue(print)
            }
            QoS::ExactlyOnce => {
                if self.session.awaiting_rel.contains(&pkid) {
                    self.reply(Reply::PubRec(pkid));
                    return Ok(Publish::Answered);
                }
                if self.session.awaiting_rel.len() >= self.max_inflight {
                    return Err(ProtocolError::ReceiveMaximum(self.max_inflight));
                }
                queue(None)
            }
        }
    }

    /// The publish `queued` was queued; its acknowledgement waits for
    /// `ticket` when the record went to the spool.
    pub(super) fn handle_queued(&mut self, queued: Queued, ticket: Option<T>) {
        let Queued {
            qos,
            pkid,
            fingerprint,
        } = queued;
        match qos {
            QoS::AtMostOnce => {}
            QoS::AtLeastOnce => {
                if let Some(f) = fingerprint {
                    self.session.accepted(pkid, f, ticket.clone());
                }
                self.reply_after(ticket, Reply::PubAck(pkid));
            }
            QoS::ExactlyOnce => {
                self.session.awaiting_rel.insert(pkid);
                self.reply_after(ticket, Reply::PubRec(pkid));
            }
        }
    }

    /// PUBREL: the QoS 2 exchange of `pkid` is complete. An unknown id is
    /// answered too: the client may be resending a PUBREL whose PUBCOMP
    /// was lost with an earlier connection.
    pub(super) fn handle_pubrel(&mut self, pkid: u16) {
        self.session.awaiting_rel.remove(&pkid);
        self.reply(Reply::PubComp(pkid));
    }

    /// Queues a reply that waits only for those before it.
    pub(super) fn reply(&mut self, reply: Reply) {
        self.replies.push_back((None, reply));
    }

    fn reply_after(&mut self, ticket: Option<T>, reply: Reply) {
        self.replies.push_back((ticket, reply));
    }

    fn holds(&self, reply: &Reply) -> bool {
        self.replies.iter().any(|(_, r)| match (r, reply) {
            (Reply::PubAck(a), Reply::PubAck(b)) => a == b,
            _ => false,
        })
    }

    /// The next reply that may go out: every one before it has, and its
    /// record (if spooled) is durable.
    pub(super) fn poll_reply(&mut self) -> Option<Reply> {
        match self.replies.front() {
            Some((Some(ticket), _)) if !ticket.is_durable() => None,
            Some(_) => self.replies.pop_front().map(|(_, reply)| reply),
            None => None,
        }
    }

    /// The ticket the next reply waits for, if it waits for one. It may
    /// have become durable since [`State::poll_reply`] last looked: a wait
    /// on it then ends at once, and the next `poll_reply` hands the reply
    /// out. (Leaving such a ticket out would leave the driver waiting on
    /// nothing while the reply sits ready.)
    pub(super) fn poll_durable(&self) -> Option<&T> {
        match self.replies.front() {
            Some((Some(ticket), _)) => Some(ticket),
            _ => None,
        }
    }

    /// The spool stopped before the held replies' records were durable:
    /// they must not be acknowledged.
    pub(super) fn abandon_replies(&mut self) {
        self.replies.clear();
    }

    /// Whether the client may be read: it has fewer than its receive
    /// maximum of acknowledgements owed (enforced by back-pressure).
    pub(super) fn can_read(&self) -> bool {
        self.replies.len() < self.max_inflight
    }

    /// The session to keep when the connection ends, if it is persistent.
    pub(super) fn take_session(&mut self) -> Option<Session<T>> {
        self.persistent.then(|| std::mem::take(&mut self.session))
    }
}

#[cfg(test)]
mod tests;
