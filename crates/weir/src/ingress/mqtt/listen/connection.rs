//! One MQTT connection in `listen` mode: its task reads a packet, acts on
//! it (enqueue, then acknowledge), and only then reads the next; replies go
//! out in one write per burst. How it ends, and what that is logged as, is
//! [`Ending`].

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use rumqttc::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use weir_core::security::gate::{Admitted, Credentials, Gate, Refused};
use weir_core::Record;

use crate::clock::unix_micros;
use crate::config::Qos0WhenFull;
use crate::intake::{Accepted, EnqueueError, Intake};
use crate::spool::Ticket;

use super::codec::*;
use super::session::{Session, Sessions};
use super::state::{Expiry, Publish, State, Terms};

/// How long writing acknowledgements may block before the client counts as
/// stuck; also bounds how long shutdown can wait on one connection.
pub(super) const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a closing connection keeps reading (and discarding) after its
/// FIN, so that bytes the client had in flight do not turn the close into a
/// reset, which could destroy acknowledgements the client has not read yet.
pub(super) const CLOSE_LINGER: Duration = Duration::from_secs(1);
/// Spare buffer capacity per socket read: many typical publishes per
/// syscall.
pub(super) const READ_CHUNK: usize = 16 * 1024;

/// Below this much room left in the read buffer a new one is made.
pub(super) const MIN_READ_ROOM: usize = 4 * 1024;

/// Largest room made for one read of a busy client.
pub(super) const MAX_READ_CHUNK: usize = 256 * 1024;

/// The room for the next read, after a read of `n` bytes into `room`: a
/// read that filled its room (at least half a chunk of it) asks for more,
/// one that left most of it empty for less. A full small tail of the
/// buffer says nothing either way.
fn next_read_chunk(chunk: usize, n: usize, room: usize) -> usize {
    if n >= room && n >= chunk / 2 {
        (chunk * 2).min(MAX_READ_CHUNK)
    } else if n < room && n < chunk / 4 {
        (chunk / 2).max(READ_CHUNK)
    } else {
        chunk
    }
}

/// The parts of the config a connection needs.
#[derive(Debug, Clone, Copy)]
pub(super) struct Settings {
    pub(super) max_packet_size: usize,
    pub(super) qos0_when_full: Qos0WhenFull,
    /// Unacknowledged QoS 1/2 publishes per client (MQTT 5 receive
    /// maximum): beyond it the client is not read until some go out.
    pub(super) max_inflight: usize,
    pub(super) connect_timeout: Duration,
}

/// Why a connection ended.
#[derive(Debug)]
pub(super) enum Ending {
    /// The client sent DISCONNECT.
    ClientDisconnect,
    /// The client closed the TCP connection without DISCONNECT.
    Eof,
    /// weir is shutting down.
    Shutdown,
    /// The client connected again with the same client id.
    TakenOver,
    /// No CONNECT within `ingress.mqtt.connect_timeout`.
    ConnectTimeout,
    /// Authentication refused the client (CONNACK "not authorized").
    NotAuthorized(Refused),
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
            Ending::TakenOver => {
                info!("closing MQTT connection: the client connected again with the same client id")
            }
            Ending::ConnectTimeout => {
                info!("closing connection: no MQTT CONNECT within ingress.mqtt.connect_timeout")
            }
            Ending::KeepAliveExpired(keep_alive) => info!(
                ?keep_alive,
                "closing MQTT connection: nothing received for 1.5 times its keep alive"
            ),
            Ending::NotAuthorized(reason) => {
                ingress.metrics().security.connect_refused(reason.reason());
                warn!(%reason, "MQTT CONNECT refused: not authorized");
            }
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
            Ending::TakenOver => Some((
                R::SessionTakenOver,
                "another connection with this client id took over".into(),
            )),
            Ending::KeepAliveExpired(_) => Some((
                R::KeepAliveTimeout,
                "nothing received for 1.5 times the keep alive".into(),
            )),
            _ => None,
        }
    }
}

/// One device connection, over plain TCP or TLS.
pub(super) struct Connection<S> {
    pub(super) stream: S,
    pub(super) peer: SocketAddr,
    pub(super) settings: Settings,
    pub(super) ingress: Arc<Intake>,
    pub(super) shutdown: CancellationToken,
    /// Fires on shutdown, or when a new connection takes this one's
    /// client id over.
    pub(super) kicked: CancellationToken,
    /// Tells this connection from others with the same client id.
    pub(super) id: u64,
    /// Bytes read and not yet decoded.
    pub(super) inbuf: BytesMut,
    /// Room made in `inbuf` before each read: [`READ_CHUNK`], doubled
    /// (up to [`MAX_READ_CHUNK`]) while reads fill it, halved back while
    /// they do not, so a busy client costs few reads and an idle one
    /// holds little memory.
    pub(super) read_chunk: usize,
    /// When the last read returned bytes: every packet completed by it
    /// arrived then (its records' ingress time, the keep-alive clock), one
    /// clock read per read rather than per packet.
    pub(super) read_at: Instant,
    /// `read_at` in microseconds since the Unix epoch.
    pub(super) read_at_us: u64,
    /// Replies not yet written.
    pub(super) out: BytesMut,
    /// `None` until CONNECT.
    pub(super) version: Option<Version>,
    /// The protocol state: packet ids, replies in order behind their
    /// records' durability, receive maximum, keep-alive deadline.
    pub(super) state: State<Ticket>,
    /// Sessions of clients not connected now.
    pub(super) sessions: Arc<Sessions>,
    /// The client id, once connected.
    pub(super) client_id: Option<String>,
    /// Who may connect: the gate in force when the connection arrived.
    pub(super) gate: Arc<Gate>,
    /// The client certificate's CN when the TLS listener takes the
    /// username from it.
    pub(super) certificate_name: Option<String>,
    /// Who the client is and what it may publish, once connected.
    pub(super) admitted: Admitted,
}

/// The receive maximum MQTT 5 clients are told.
fn receive_max(settings: &Settings) -> u16 {
    u16::try_from(settings.max_inflight).unwrap_or(u16::MAX)
}

/// Answers the CONNECT of a connection that cannot stay (the server is
/// full) with a refusal in the client's version, then closes.
pub(super) async fn refuse_busy<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, max: usize) {
    let mut inbuf = BytesMut::with_capacity(1024);
    let version = loop {
        match decode_connect(&mut inbuf, max) {
            Ok(Some(Hello::V311(_))) => break Version::V311,
            Ok(Some(Hello::V5(..))) => break Version::V5,
            Ok(None) => match stream.read_buf(&mut inbuf).await {
                Ok(n) if n > 0 => {}
                _ => return,
            },
            Err(_) => return,
        }
    };
    let mut out = BytesMut::new();
    encode(&mut out, version, Reply::ConnRefused(Refusal::ServerBusy));
    let _ = stream.write_all(&out).await;
    let _ = stream.shutdown().await;
}

/// What a wait on the socket ended with.
pub(super) enum Wake {
    Shutdown,
    /// A held acknowledgement's record became durable.
    Durable,
    Expired,
    Read(io::Result<usize>),
}

impl<S: AsyncRead + AsyncWrite + Unpin> Connection<S> {
    pub(super) fn new(
        stream: S,
        peer: SocketAddr,
        settings: Settings,
        ingress: Arc<Intake>,
        sessions: Arc<Sessions>,
        shutdown: CancellationToken,
    ) -> Self {
        Connection {
            stream,
            peer,
            settings,
            ingress,
            sessions: sessions.clone(),
            state: State::new(
                settings.max_inflight,
                std::time::Instant::now() + settings.connect_timeout,
            ),
            kicked: shutdown.child_token(),
            id: sessions.next_id(),
            client_id: None,
            shutdown,
            inbuf: BytesMut::with_capacity(READ_CHUNK),
            read_chunk: READ_CHUNK,
            read_at: Instant::now(),
            read_at_us: unix_micros(),
            out: BytesMut::new(),
            version: None,
            gate: Arc::new(Gate::open()),
            certificate_name: None,
            admitted: Admitted {
                username: None,
                acl: None,
            },
        }
    }

    pub(super) async fn run(mut self) {
        let ending = match self.session().await {
            Ok(never) => match never {},
            Err(ending) => ending,
        };
        ending.report(&self.ingress);
        if ending.can_write() {
            // Acknowledgements of records being made durable are still
            // owed: wait for them (the spool syncs within milliseconds),
            // but not past the write timeout.
            let _ = tokio::time::timeout(WRITE_TIMEOUT, self.settle_held()).await;
            if let (Some(version), Some((code, reason))) = (self.version, ending.v5_disconnect()) {
                encode(&mut self.out, version, Reply::Disconnect(code, reason));
            }
            // Replies already earned (acknowledgements of queued records)
            // go out even when the connection ends on an error.
            if let Err(ending) = self.flush().await {
                debug!(?ending, "final replies not delivered");
            }
        }
        // The session is handed back before lingering: a client taking it
        // over waits for it.
        if let Some(client_id) = self.client_id.take() {
            let session = self.state.take_session();
            self.sessions.end(client_id, self.id, session);
        }
        self.linger().await;
    }

    /// Why the connection stops when `kicked` fired.
    fn stopped(&self) -> Ending {
        if self.shutdown.is_cancelled() {
            Ending::Shutdown
        } else {
            Ending::TakenOver
        }
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
        let version = self.accept(hello).await?;
        loop {
            // Packets still buffered when shutdown began are left
            // unacknowledged: their senders keep them and send them again.
            if self.kicked.is_cancelled() {
                return Err(self.stopped());
            }
            let packet = match decode(&mut self.inbuf, version, max)? {
                Some(packet) => packet,
                None => {
                    self.fill().await?;
                    continue;
                }
            };
            self.state.heard(self.read_at.into_std());
            self.handle(packet).await?;
        }
    }

    /// Answers CONNECT: fixes the version and keep alive, queues CONNACK.
    async fn accept(&mut self, hello: Hello) -> Result<Version, Ending> {
        let terms = match Terms::of(hello, self.peer) {
            Ok(terms) => terms,
            Err((version, refusal, error)) => {
                encode(&mut self.out, version, Reply::ConnRefused(refusal));
                return Err(error.into());
            }
        };
        let version = terms.version;
        self.admit(version, &terms.client_id, terms.login).await?;
        let (session, session_present) = self.resume(&terms.client_id, terms.clean).await;
        encode(
            &mut self.out,
            version,
            Reply::ConnAck {
                assigned_client_id: terms.assigned,
                max_packet_size: self.settings.max_packet_size,
                receive_max: receive_max(&self.settings),
                session_present,
            },
        );
        tracing::Span::current().record("client_id", terms.client_id.as_str());
        self.version = Some(version);
        self.state.handle_connect(
            terms.keep_alive,
            session,
            terms.persistent,
            self.read_at.into_std(),
        );
        info!(
            ?version,
            keep_alive = ?terms.keep_alive,
            clean = terms.clean,
            "MQTT client connected"
        );
        Ok(version)
    }

    /// Lets the client in or refuses it (CONNACK "not authorized"), before
    /// anything of a session is touched: an unauthenticated client cannot
    /// take a session over. A password hash is checked off the runtime.
    async fn admit(
        &mut self,
        version: Version,
        client_id: &str,
        login: Option<(String, String)>,
    ) -> Result<(), Ending> {
        // Whether a password hash is to be computed: decided on the same
        // credentials the check will see.
        let costly = self.gate.costly(&Credentials {
            username: login
                .as_ref()
                .map(|(u, _)| u.as_str())
                .filter(|u| !u.is_empty()),
            certificate_name: self.certificate_name.as_deref(),
            ..Credentials::default()
        });
        let gate = self.gate.clone();
        let certificate_name = self.certificate_name.clone();
        let client_id = client_id.to_owned();
        let decide = move || {
            let (username, password) = match &login {
                Some((u, p)) => (
                    Some(u.as_str()).filter(|u| !u.is_empty()),
                    Some(p.as_bytes()),
                ),
                None => (None, None),
            };
            let credentials = Credentials {
                username,
                password,
                client_id: &client_id,
                certificate_name: certificate_name.as_deref(),
            };
            gate.admit(&credentials)
        };
        let outcome = if costly {
            tokio::task::spawn_blocking(decide)
                .await
                .map_err(|e| Ending::Io(io::Error::other(e)))?
        } else {
            decide()
        };
        match outcome {
            Ok(admitted) => {
                if let Some(user) = &admitted.username {
                    tracing::Span::current().record("user", user.as_str());
                }
                self.admitted = admitted;
                Ok(())
            }
            Err(refused) => {
                encode(
                    &mut self.out,
                    version,
                    Reply::ConnRefused(Refusal::NotAuthorized),
                );
                Err(Ending::NotAuthorized(refused))
            }
        }
    }

    /// Takes the client id over from a connection still holding it, then
    /// takes up its stored session unless `clean`; returns the session and
    /// whether there was one ("session present").
    async fn resume(&mut self, client_id: &str, clean: bool) -> (Session, bool) {
        let resumed = self
            .sessions
            .resume(client_id, clean, self.id, &self.kicked)
            .await;
        self.client_id = Some(client_id.to_owned());
        resumed
    }

    /// Acts on one packet of an established connection.
    async fn handle(&mut self, packet: Inbound) -> Result<(), Ending> {
        match packet {
            Inbound::Publish(publish) => self.publish(publish).await,
            Inbound::PubRel(pkid) => {
                self.state.handle_pubrel(pkid);
                Ok(())
            }
            Inbound::Subscribe { pkid, filters } => {
                debug!(
                    ?filters,
                    "SUBSCRIBE refused: weir does not deliver to subscribers"
                );
                self.state.reply(Reply::SubAck {
                    pkid,
                    filters: filters.len(),
                });
                Ok(())
            }
            Inbound::Unsubscribe { pkid, filters } => {
                self.state.reply(Reply::UnsubAck { pkid, filters });
                Ok(())
            }
            Inbound::PingReq => {
                self.state.reply(Reply::PingResp);
                Ok(())
            }
            Inbound::Disconnect => Err(Ending::ClientDisconnect),
            Inbound::Connect => Err(ProtocolError::SecondConnect.into()),
            Inbound::Unexpected(what) => Err(ProtocolError::Unexpected(what).into()),
        }
    }

    async fn publish(&mut self, publish: InPublish) -> Result<(), Ending> {
        check_topic(&publish)?;
        // Only with an ACL file is there anything to check (the topic was
        // checked as UTF-8 above).
        let denied = self.admitted.acl.as_ref().is_some_and(|acl| {
            !acl.may_publish(std::str::from_utf8(&publish.topic).unwrap_or_default())
        });
        if denied {
            self.ingress
                .metrics()
                .security
                .publish_denied(self.admitted.username.as_deref());
            debug!(topic = ?publish.topic, "PUBLISH refused by the ACL: not queued");
            // MQTT 5 says so in the acknowledgement; MQTT 3.1.1 cannot, so
            // the publish is acknowledged and dropped, as Mosquitto does.
            match publish.qos {
                QoS::AtMostOnce => {}
                QoS::AtLeastOnce => self.state.reply(Reply::Denied(publish.pkid, false)),
                QoS::ExactlyOnce => self.state.reply(Reply::Denied(publish.pkid, true)),
            }
            return Ok(());
        }
        let InPublish {
            qos,
            dup,
            pkid,
            topic,
            payload,
            ..
        } = publish;
        let queued = match self
            .state
            .handle_publish(qos, dup, pkid, &topic, &payload)?
        {
            Publish::Queue(queued) => queued,
            Publish::Answered => {
                debug!(
                    pkid,
                    ?qos,
                    "resend of a record already accepted: acknowledged, not queued again"
                );
                return Ok(());
            }
        };
        let record = self.ingress.mqtt_record_at(topic, payload, self.read_at_us);
        let ticket = match (qos, self.settings.qos0_when_full) {
            (QoS::AtMostOnce, Qos0WhenFull::Drop) => match self.ingress.try_accept(record) {
                Ok(accepted) => accepted.ticket(),
                Err(EnqueueError::Full { record, class }) => {
                    self.ingress.metrics().dropped(record.class);
                    debug!(%class, "class queue full: QoS 0 record dropped");
                    None
                }
                Err(e) => return Err(e.into()),
            },
            _ => self.enqueue(record).await?,
        };
        // QoS 0 has no acknowledgement to hold: a spooled record's ticket
        // is simply dropped there.
        self.state.handle_queued(queued, ticket);
        Ok(())
    }

    /// Puts `record` in its class queue or the spool, waiting for room
    /// while it is full; meanwhile nothing more is read from this client
    /// (back-pressure). A spooled record comes back as the ticket its
    /// acknowledgement must wait for.
    async fn enqueue(&mut self, record: Record) -> Result<Option<Ticket>, Ending> {
        let mut record = match self.ingress.try_accept(record) {
            Ok(accepted) => return Ok(accepted.ticket()),
            Err(EnqueueError::Full { record, .. }) => record,
            Err(e) => return Err(e.into()),
        };
        // Acknowledge what is already queued before waiting, so that those
        // acknowledgements do not wait on this record's queue.
        self.release_replies();
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
                outcome = self.ingress.accept(record, None) => outcome,
                _ = self.kicked.cancelled() => return Err(self.stopped()),
            };
            match outcome {
                // Without a deadline `enqueue` waits for room; if it ever
                // hands the record back, wait again.
                Err(EnqueueError::Full { record: back, .. }) => record = back,
                other => break other,
            }
        };
        // The client could not be heard while weir was not reading it.
        self.state.heard(std::time::Instant::now());
        queued.map(Accepted::ticket).map_err(Ending::from)
    }

    /// Moves the replies that may go out to the output, in order.
    fn release_replies(&mut self) {
        while let Some(reply) = self.state.poll_reply() {
            if let Some(version) = self.version {
                encode(&mut self.out, version, reply);
            }
        }
    }

    /// Waits until every held reply can go out (or the spool stopped).
    async fn settle_held(&mut self) {
        loop {
            self.release_replies();
            let Some(ticket) = self.state.poll_durable().cloned() else {
                return;
            };
            if !ticket.durable().await {
                // The spool stopped first: those records are not durable
                // and must not be acknowledged.
                self.state.abandon_replies();
                return;
            }
        }
    }

    /// Sends the queued replies, then reads more bytes from the client (or
    /// returns when a held reply can go out).
    async fn fill(&mut self) -> Result<(), Ending> {
        // Replies collect while complete packets are buffered; send them
        // before waiting on the client, which may be waiting on them.
        self.release_replies();
        self.flush().await?;
        // Read into what is left of the buffer until little is: records
        // keep slices of it, so a fresh buffer per read would hold every
        // unfilled tail in memory for as long as those records are queued.
        if self.inbuf.capacity() - self.inbuf.len() < MIN_READ_ROOM {
            self.inbuf.reserve(self.read_chunk);
        }
        let room = self.inbuf.capacity() - self.inbuf.len();
        let timeout = self.state.poll_timeout();
        let wake = {
            let expiry = async {
                match timeout {
                    Some((at, _)) => tokio::time::sleep_until(Instant::from_std(at)).await,
                    None => std::future::pending().await,
                }
            };
            let durable = async {
                match self.state.poll_durable() {
                    Some(t) => {
                        t.durable().await;
                    }
                    None => std::future::pending().await,
                }
            };
            // A client with max_inflight acknowledgements owed is not read
            // until some go out (its receive maximum, enforced by
            // back-pressure).
            let can_read = self.state.can_read();
            // Cancel safety: `read_buf` is cancel safe (when another branch
            // wins, no bytes were consumed); the other branches only wait.
            tokio::select! {
                _ = self.kicked.cancelled() => Wake::Shutdown,
                _ = expiry => Wake::Expired,
                _ = durable => Wake::Durable,
                read = self.stream.read_buf(&mut self.inbuf), if can_read => Wake::Read(read),
            }
        };
        match wake {
            Wake::Durable => Ok(()),
            Wake::Shutdown => Err(self.stopped()),
            Wake::Expired => Err(match timeout.map(|(_, why)| why) {
                Some(Expiry::KeepAlive(keep_alive)) => Ending::KeepAliveExpired(keep_alive),
                _ => Ending::ConnectTimeout,
            }),
            Wake::Read(Ok(0)) if self.inbuf.is_empty() => Err(Ending::Eof),
            Wake::Read(Ok(0)) => Err(ProtocolError::Truncated.into()),
            Wake::Read(Ok(n)) => {
                self.read_at = Instant::now();
                self.read_at_us = unix_micros();
                self.read_chunk = next_read_chunk(self.read_chunk, n, room);
                Ok(())
            }
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

    #[test]
    fn the_read_room_grows_while_reads_fill_it_and_shrinks_back() {
        let mut chunk = READ_CHUNK;
        // A busy client fills every read: the room doubles to the cap.
        for _ in 0..10 {
            chunk = next_read_chunk(chunk, chunk, chunk);
        }
        assert_eq!(chunk, MAX_READ_CHUNK);
        // Half-full reads keep it, and so does a filled small tail.
        assert_eq!(next_read_chunk(chunk, chunk / 2, chunk), chunk);
        assert_eq!(next_read_chunk(chunk, 5000, 5000), chunk);
        // Small reads halve it, never below the first size.
        for _ in 0..10 {
            chunk = next_read_chunk(chunk, 100, chunk);
        }
        assert_eq!(chunk, READ_CHUNK);
    }
}
