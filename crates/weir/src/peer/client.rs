//! The calling side of peering: a heartbeat task per peer, the redirection
//! round (JANUS Algorithm 3 over this node's view, then a Reserve per grant
//! in which this node receives), and a forwarder per peer that sends the
//! granted rate of records, forgets each only once the provider
//! acknowledges its delivery, and takes back whatever it does not.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};
use tonic::Streaming;
use tracing::{debug, info, warn};
use weir_core::janus::Grant;
use weir_core::peer::{decide, first_asks, offers_in, InFlight, Refusals, MAX_SPILL_STEPS};
use weir_core::queueing::token_bucket::Take;
use weir_core::{ClassId, NodeId, Receipt, Record};
use weir_proto::pb::peer_client::PeerClient;
use weir_proto::pb::{ForwardAck, ForwardRequest, HeartbeatRequest, RefusalReason, ReserveRequest};

use super::node::{
    to_pb, Node, PeerError, FORWARD_BATCH_BYTES, FORWARD_BATCH_RECORDS, FORWARD_DRAIN_TIMEOUT,
    FORWARD_PIPELINE, FORWARD_POLL, FORWARD_RETRY, MAX_IN_FLIGHT_BYTES, MAX_IN_FLIGHT_RECORDS,
};
use crate::config::{PeerConfig, PeeringConfig};

/// One configured peer and a client for it (the channel connects lazily
/// and reconnects by itself).
#[derive(Debug, Clone)]
pub struct Link {
    pub(super) id: NodeId,
    pub(super) addr: String,
    client: PeerClient<Channel>,
    /// Fired when a reload drops this peer (or changes its address): its
    /// tasks end, taking back what they lent it.
    pub(super) gone: CancellationToken,
}

impl Link {
    /// A client for `peer`; nothing is connected until the first call.
    pub(super) fn new(
        peer: &PeerConfig,
        cfg: &PeeringConfig,
        max_message: usize,
        security: Option<&crate::security::PeerSecurity>,
    ) -> Result<Link, PeerError> {
        let addr = peer.addr.to_string();
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|source| PeerError::Address {
                id: peer.id,
                addr: addr.clone(),
                source,
            })?
            .connect_timeout(cfg.dead_after)
            .tcp_nodelay(true)
            // A peer cut off without a reset (a link down, a partition)
            // leaves the connection open and TCP retransmitting on a
            // backed-off timer: after a 10 s partition the first bytes got
            // through 3.2 s after it healed. An HTTP/2 ping when nothing
            // has been read for half of dead_after, unanswered for the
            // other half, closes it instead, and the next call connects
            // anew. Heartbeat replies arrive every period, so a healthy
            // link sends no pings.
            .http2_keep_alive_interval(cfg.dead_after / 2)
            .keep_alive_timeout(cfg.dead_after / 2)
            .keep_alive_while_idle(true);
        let channel = match security {
            None => endpoint.connect_lazy(),
            Some(security) => endpoint.connect_with_connector_lazy(tls_connector(
                addr.clone(),
                peer.id,
                security.client.clone(),
            )),
        };
        let client = PeerClient::new(channel)
            .max_decoding_message_size(max_message)
            .max_encoding_message_size(max_message);
        Ok(Link {
            id: peer.id,
            addr,
            client,
            gone: CancellationToken::new(),
        })
    }
}

/// Connects to a peer over mutual TLS: this node's certificate presented,
/// the peer's verified against the CA and required to name
/// `<id>.node.weir` (so a node with a valid certificate for another id
/// cannot stand in for it). The client configuration in force at each
/// connection is used, so rotated files apply to the next connection.
fn tls_connector(
    addr: String,
    id: NodeId,
    config: Arc<crate::security::Watched<rustls::ClientConfig>>,
) -> impl tower::Service<
    tonic::codegen::http::Uri,
    Response = hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>,
    Error = std::io::Error,
    Future = impl Send,
> + Clone
       + Send
       + 'static {
    tower::service_fn(move |_: tonic::codegen::http::Uri| {
        let (addr, config) = (addr.clone(), config.clone());
        async move {
            let name = rustls_pki_types::ServerName::try_from(crate::security::tls::node_name(id))
                .map_err(std::io::Error::other)?;
            let tcp = tokio::net::TcpStream::connect(&addr).await?;
            tcp.set_nodelay(true)?;
            let tls = tokio_rustls::TlsConnector::from(config.get())
                .connect(name, tcp)
                .await?;
            Ok(hyper_util::rt::TokioIo::new(tls))
        }
    })
}

/// Sleeps until `offset` into the next heartbeat period of the Unix clock
/// (periods are aligned on it, so nodes with synchronised clocks tick
/// together: heartbeats spread over the first `heartbeat_jitter` of the
/// period, rounds half a period in, when every peer's advert of the period
/// has arrived).
async fn until_period(period: Duration, offset: Duration) {
    let wait = weir_core::peer::until_period(crate::clock::unix_micros(), period, offset);
    tokio::time::sleep(wait).await;
}

/// Sends this node's state to `link` every heartbeat and takes in the
/// state of its reply, until weir stops or peering is killed
/// (`peering.adverts = "all-to-all"`).
pub(super) async fn heartbeats(node: Arc<Node>, link: Link) {
    let mut failing = false;
    loop {
        // Cancel safety: every branch only waits.
        let wait = weir_core::peer::until_heartbeat(
            crate::clock::unix_micros(),
            node.cfg.heartbeat,
            node.me,
            link.id,
            node.cfg.heartbeat_jitter,
        );
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = node.stop.cancelled() => return,
            _ = node.kill.cancelled() => return,
            _ = link.gone.cancelled() => return,
        }
        failing = exchange(&node, &link, false, failing).await;
    }
}

/// Gossip (`peering.adverts = "gossip"`): every `every`, at a point in the
/// period a hash of this node picks, exchanges tables with `fanout` of the
/// configured peers ([`weir_core::peer::gossip::partners`]), concurrently,
/// until weir stops or peering is killed.
pub(super) async fn gossip(
    node: Arc<Node>,
    mut links: watch::Receiver<Vec<Link>>,
    fanout: usize,
    every: Duration,
) {
    let mut failing: BTreeSet<NodeId> = BTreeSet::new();
    loop {
        let now_us = crate::clock::unix_micros();
        let wait =
            weir_core::peer::until_heartbeat(now_us, every, node.me, 0, node.cfg.heartbeat_jitter);
        // Cancel safety: every branch only waits.
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = node.stop.cancelled() => return,
            _ = node.kill.cancelled() => return,
        }
        let period = weir_core::peer::period_of(crate::clock::unix_micros(), every);
        let current: Vec<Link> = links.borrow_and_update().clone();
        let ids: Vec<NodeId> = current.iter().map(|l| l.id).collect();
        let chosen = weir_core::peer::gossip::partners(node.me, period, &ids, fanout);
        let calls = current
            .into_iter()
            .filter(|l| chosen.contains(&l.id))
            .map(|link| {
                let node = Arc::clone(&node);
                let was = failing.contains(&link.id);
                async move {
                    let now_failing = exchange(&node, &link, true, was).await;
                    (link.id, now_failing)
                }
            });
        for (id, now_failing) in futures::future::join_all(calls).await {
            if now_failing {
                failing.insert(id);
            } else {
                failing.remove(&id);
            }
        }
    }
}

/// One heartbeat call to `link`, with this node's table when `table`
/// (gossip), and the reply taken in; returns whether it failed (`failing`:
/// whether the last one did, so a failure is logged once).
async fn exchange(node: &Node, link: &Link, table: bool, failing: bool) -> bool {
    let request = HeartbeatRequest {
        state: Some(node.state()),
        relayed: if table {
            node.relayed_table(link.id)
        } else {
            Vec::new()
        },
    };
    node.metrics()
        .advert_bytes
        .inc_by(prost::Message::encoded_len(&request) as u64);
    let mut client = link.client.clone();
    let reply = tokio::time::timeout(node.rpc_timeout(), client.heartbeat(request)).await;
    let problem = match reply {
        Ok(Ok(reply)) => {
            let reply = reply.into_inner();
            match reply.state {
                Some(state) => match node.hear(state, Some(link.id)) {
                    Ok(_) => {
                        node.hear_relayed(link.id, reply.relayed);
                        None
                    }
                    Err(status) => Some(status),
                },
                None => Some(tonic::Status::invalid_argument("reply without a state")),
            }
        }
        Ok(Err(status)) => Some(status),
        Err(_) => Some(tonic::Status::deadline_exceeded("no reply in time")),
    };
    match problem {
        None => false,
        // A misconfiguration does not fix itself: say so every time,
        // at error level, so the operator sees it.
        Some(status) if status.code() == tonic::Code::FailedPrecondition => {
            tracing::error!(peer = link.id, addr = %link.addr, reason = status.message(), "peer refused");
            true
        }
        Some(status) => {
            if !failing {
                debug!(peer = link.id, addr = %link.addr, code = ?status.code(), reason = status.message(), "heartbeat failed");
            }
            true
        }
    }
}

/// The redirection round, half a period after every heartbeat: upkeep of
/// reservations, leases and liveness, then (when the scheme redirects) the
/// matcher over this period's adverts (this node's as published, its
/// peers' as heard), Reserves for what the matching gives this node
/// (leases it holds renewed first: `first_asks`), and up to
/// `MAX_SPILL_STEPS` more Reserves per provider with room for what was
/// refused, past every provider that refused this round, asking last those
/// that gave nothing lately (`Spill`).
pub(super) async fn rounds(node: Arc<Node>, links: watch::Receiver<Vec<Link>>) {
    let mut alive: BTreeSet<NodeId> = BTreeSet::new();
    // Providers that gave this node nothing lately: asked last.
    let mut refusals = Refusals::default();
    loop {
        // Cancel safety: every branch only waits.
        tokio::select! {
            _ = until_period(node.cfg.heartbeat, node.cfg.heartbeat / 2) => {}
            _ = node.stop.cancelled() => return,
            _ = node.kill.cancelled() => return,
        }
        let now = node.now();
        let now_alive: BTreeSet<NodeId> = node.view().alive(now).map(|(id, _)| id).collect();
        for gone in alive.difference(&now_alive) {
            info!(peer = gone, "peer gone");
            node.leases().end_all(*gone);
            node.reservations().release_all(*gone);
        }
        alive = now_alive;
        upkeep(&node, now, alive.len());

        let Some(strategy) = node.scheme.redirects() else {
            continue;
        };
        let own = node.published();
        let grants = decide(strategy, node.me, &own, &node.view(), now);
        // Fields are evaluated only when debug logging is on.
        debug!(
            me = node.me,
            tuple = ?own.tuple.0,
            backlog = node.ingress.queues().iter().map(|(_, q)| q.bytes()).sum::<usize>(),
            ?grants,
            "round"
        );
        if grants.is_empty() {
            continue;
        }
        // The peers in force this round (a reload may change them).
        let links = links.borrow().clone();
        let held: Vec<_> = node.leases().iter(now).collect();
        let answered = ask_all(&node, &links, first_asks(&grants, &held)).await;
        let offers = offers_in(&node.view(), node.me, now);
        let mut spill = refusals.spill(&answered, now);
        for _ in 0..MAX_SPILL_STEPS {
            let asks = spill.asks(&offers);
            if asks.is_empty() {
                break;
            }
            debug!(me = node.me, ?asks, "spill");
            spill.answered(&ask_all(&node, &links, asks).await);
        }
        refusals.remember(&spill, now, node.cfg.heartbeat);
    }
}

/// Sends every ask at once; returns each with the amount granted (0 when
/// refused, unanswered, or to a provider this node has no link to).
async fn ask_all(node: &Node, links: &[Link], asks: Vec<Grant>) -> Vec<(Grant, f64)> {
    let replies = asks.iter().map(|a| async move {
        match links.iter().find(|l| l.id == a.provider) {
            Some(link) => reserve(node, link, *a).await,
            None => 0.0,
        }
    });
    let granted = futures::future::join_all(replies).await;
    asks.into_iter().zip(granted).collect()
}

/// Expires reservations and leases and refreshes the gauges.
fn upkeep(node: &Node, now: Duration, alive: usize) {
    let (reservations, reserved) = {
        let mut r = node.reservations();
        r.expire(now);
        (r.len(), r.reserved())
    };
    let (leases, leased) = {
        let mut l = node.leases();
        if l.expire(now) > 0 {
            node.leases_changed();
        }
        (l.len(), l.total())
    };
    let m = node.metrics();
    m.reservations.set(reservations as i64);
    m.reserved.set(reserved);
    m.leases.set(leases as i64);
    m.leased.set(leased);
    m.peers_alive.set(alive as i64);
}

/// Asks `link`'s node to reserve `grant` for this node and records what it
/// granted as a lease, counted from when the request left (so it ends no
/// later than the provider's reservation); returns the amount granted.
async fn reserve(node: &Node, link: &Link, grant: Grant) -> f64 {
    let sent = node.now();
    let request = ReserveRequest {
        receiver: node.me,
        class: node.class_name(grant.class).to_owned(),
        bytes_per_sec: grant.amount,
        lease_ms: u64::try_from(node.cfg.lease.as_millis()).unwrap_or(u64::MAX),
    };
    let mut client = link.client.clone();
    match tokio::time::timeout(node.rpc_timeout(), client.reserve(request)).await {
        Ok(Ok(reply)) => {
            let reply = reply.into_inner();
            let expires = sent + Duration::from_millis(reply.lease_ms);
            debug!(
                me = node.me,
                provider = link.id,
                class = node.class_name(grant.class),
                asked = grant.amount,
                granted = reply.granted_bytes_per_sec,
                "reserved"
            );
            node.leases().set(
                link.id,
                grant.class,
                reply.granted_bytes_per_sec,
                expires,
                node.now(),
            );
            // At once, not after the round's slowest provider answers.
            node.leases_changed();
            reply.granted_bytes_per_sec
        }
        Ok(Err(status)) => {
            debug!(provider = link.id, code = ?status.code(), reason = status.message(), "reserve refused");
            0.0
        }
        Err(_) => {
            debug!(provider = link.id, "reserve timed out");
            0.0
        }
    }
}

/// How a Forward session ended.
enum End {
    /// Nothing granted and nothing in flight: wait for a lease.
    Idle,
    /// The stream broke or the provider went away.
    Broken,
    /// Weir is stopping, or peering was killed.
    Stopped,
}

/// Sends `link`'s node the records it granted room for, one Forward stream
/// at a time, while it grants any.
pub(super) async fn forwarder(node: Arc<Node>, link: Link) {
    let mut changed = node.leases_changed.subscribe();
    loop {
        while !node.leases().has_active(link.id, node.now()) {
            // Cancel safety: every branch only waits.
            tokio::select! {
                r = changed.changed() => {
                    if r.is_err() {
                        return;
                    }
                }
                _ = node.stop.cancelled() => return,
                _ = node.kill.cancelled() => return,
                _ = link.gone.cancelled() => return,
            }
        }
        match session(&node, &link, &mut changed).await {
            _ if link.gone.is_cancelled() => {
                node.leases().end_all(link.id);
                return;
            }
            End::Idle => {}
            End::Stopped => return,
            End::Broken => {
                node.leases().end_all(link.id);
                // Cancel safety: every branch only waits.
                tokio::select! {
                    _ = tokio::time::sleep(FORWARD_RETRY) => {}
                    _ = node.stop.cancelled() => return,
                    _ = node.kill.cancelled() => return,
                }
            }
        }
    }
}

/// Records taken out of the queues for one provider and not yet settled
/// (not yet answered, or queued at the provider and not yet delivered).
struct Pump {
    in_flight: InFlight,
    /// Per class, a record popped that waits for tokens.
    held: Vec<Option<Record>>,
    /// Requests sent and not yet answered.
    unacked: usize,
}

impl Pump {
    fn new(classes: usize) -> Self {
        Pump {
            in_flight: InFlight::new(),
            held: vec![None; classes],
            unacked: 0,
        }
    }

    fn is_empty(&self) -> bool {
        self.in_flight.is_empty() && self.held.iter().all(Option::is_none)
    }

    /// Everything not settled, to go back to the queues.
    fn take_all(&mut self) -> Vec<Record> {
        let mut all = self.in_flight.take_all();
        all.extend(self.held.iter_mut().filter_map(Option::take));
        self.unacked = 0;
        all
    }

    /// Held records of classes no longer granted.
    fn take_ungranted(&mut self, granted: &[ClassId]) -> Vec<Record> {
        self.held
            .iter_mut()
            .enumerate()
            .filter(|(c, _)| !granted.iter().any(|g| g.index() == *c))
            .filter_map(|(_, h)| h.take())
            .collect()
    }

    /// Sends requests while the pipeline, the in-flight caps and the
    /// leases allow; returns when to look again (tokens, or an empty queue).
    fn fill(
        &mut self,
        node: &Node,
        link: &Link,
        granted: &[ClassId],
        tx: &mpsc::Sender<ForwardRequest>,
        now: Duration,
    ) -> (Option<Duration>, Vec<Record>) {
        let mut wake: Option<Duration> = None;
        let mut early = |d: Duration| wake = Some(wake.map_or(d, |w: Duration| w.min(d)));
        let mut twice = Vec::new();
        let mut popped = false;
        let queues = node.ingress.queues();
        while self.unacked < FORWARD_PIPELINE
            && self.in_flight.len() < MAX_IN_FLIGHT_RECORDS
            && self.in_flight.bytes() < MAX_IN_FLIGHT_BYTES
        {
            let mut records = Vec::new();
            let mut bytes = 0;
            {
                let mut leases = node.leases();
                'classes: for &class in granted {
                    let c = class.index();
                    let queue = queues.class(class);
                    loop {
                        if records.len() >= FORWARD_BATCH_RECORDS || bytes >= FORWARD_BATCH_BYTES {
                            break 'classes;
                        }
                        let Some(record) = self.held[c].take().or_else(|| {
                            // Never a record a peer redirected here: it
                            // has taken its one hop.
                            let r = queue.pop_forwardable();
                            popped |= r.is_some();
                            r
                        }) else {
                            early(FORWARD_POLL);
                            break;
                        };
                        match leases.take(link.id, class, record.size(), now) {
                            Take::Granted => {
                                bytes += record.size();
                                let wire = to_pb(&record, node.class_name(class));
                                match self.in_flight.sent(record) {
                                    Ok(()) => records.push(wire),
                                    Err(same) => twice.push(same),
                                }
                            }
                            Take::Wait(d) => {
                                self.held[c] = Some(record);
                                if d != Duration::MAX {
                                    early(d);
                                }
                                break;
                            }
                        }
                    }
                }
            }
            if records.is_empty() {
                break;
            }
            self.unacked += 1;
            let request = ForwardRequest {
                receiver: node.me,
                records,
                delivery_acks: true,
            };
            // Room is certain (at most FORWARD_PIPELINE requests are
            // unacknowledged); a closed channel means the stream is ending,
            // and its records go back when the ack stream says so.
            if tx.try_send(request).is_err() {
                break;
            }
        }
        if popped {
            node.ingress.notify_space();
        }
        (wake, twice)
    }

    /// Settles one ack. An answer to a request (it names every record of
    /// the request) frees a pipeline slot: `queued` records stay in flight
    /// until their delivery is acknowledged, refused ones are returned, to
    /// go back to the queues, and a refusal for anything but a momentary
    /// excess of rate ends the lease of its class. `delivered` records (and
    /// `accepted` ones, from a provider that answers for records once
    /// queued) are forgotten; if this node holds any of them for a sender
    /// of its own (it passed them on), their delivery is that sender's too.
    fn settle(&mut self, node: &Node, link: &Link, ack: ForwardAck) -> Vec<Record> {
        let answer = !(ack.accepted.is_empty() && ack.queued.is_empty() && ack.refused.is_empty());
        if answer {
            self.unacked = self.unacked.saturating_sub(1);
        }
        // Counted per class once per ack, as on the provider.
        let mut done = vec![0u64; self.held.len()];
        let mut forgotten = Vec::with_capacity(ack.accepted.len() + ack.delivered.len());
        for id in ack.accepted.iter().chain(&ack.delivered) {
            let key = (id.origin, id.seq);
            if let Some(r) = self.in_flight.acked(key) {
                if let Some(n) = done.get_mut(r.class.index()) {
                    *n += 1;
                }
                forgotten.push(key);
                // Delivered by the peer: this node's spool copy may go.
                node.ingress.release(&[Receipt::from(&r)]);
            }
        }
        let mut via = 0;
        for (c, n) in done.into_iter().enumerate() {
            if n > 0 {
                node.metrics().redirected_out(ClassId(c as u8), n);
                via += n;
            }
        }
        if via > 0 {
            node.metrics().delivered_via(link.id, via);
        }
        if !forgotten.is_empty() {
            node.deliveries.delivered_keys(forgotten);
        }
        let mut back = Vec::new();
        for refused in ack.refused {
            let Some(id) = refused.id else { continue };
            let Some(r) = self.in_flight.refused((id.origin, id.seq)) else {
                continue;
            };
            let reason =
                RefusalReason::try_from(refused.reason).unwrap_or(RefusalReason::Unspecified);
            // Over the rate or past the hop limit is about these records,
            // not the lease.
            if !matches!(reason, RefusalReason::OverRate | RefusalReason::HopLimit) {
                debug!(provider = link.id, ?reason, "records refused; lease ended");
                node.leases().end(link.id, r.class);
            }
            back.push(r);
        }
        back
    }
}

/// One Forward stream to `link`: runs until nothing is granted or in
/// flight (every record sent is acknowledged as delivered), the stream
/// breaks, the provider is seen gone, or weir stops. Whatever was not
/// acknowledged goes back to the queues before it returns.
async fn session(node: &Arc<Node>, link: &Link, changed: &mut watch::Receiver<()>) -> End {
    let (tx, mut acks) = match open(node, link).await {
        Ok(stream) => stream,
        Err(end) => return end,
    };
    let mut pump = Pump::new(node.class_names.len());
    let mut tx = Some(tx);
    let mut drain_until: Option<Instant> = None;
    let mut heard_on_stream: Option<std::time::Duration> = None;
    let end = loop {
        let now = node.now();
        let mut wake = None;
        if let Some(sender) = &tx {
            match round(node, link, &mut pump, sender, heard_on_stream, now).await {
                Round::End(end) => break end,
                Round::HalfClose => {
                    // The provider answers what it has read, acknowledges
                    // each queued record once delivered, then ends the
                    // stream.
                    tx = None;
                    drain_until = Some(Instant::now() + FORWARD_DRAIN_TIMEOUT);
                    continue;
                }
                Round::Wait(next) => wake = next,
            }
        } else if pump.in_flight.is_empty() {
            break End::Stopped;
        }
        node.metrics().set_lent(link.id, pump.in_flight.len());
        // With nothing to wait for but acks, look again at the next round.
        let sleep = tokio::time::sleep(wake.unwrap_or(node.cfg.heartbeat));
        let drain = async {
            match drain_until {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        // Cancel safety: `Streaming::message` buffers a partial message
        // inside `acks`; every other branch only waits.
        tokio::select! {
            biased;
            _ = node.abort.cancelled() => {
                let lost = pump.take_all().len();
                node.metrics().set_lent(link.id, 0);
                if lost > 0 {
                    node.metrics().abandoned.inc_by(lost as u64);
                    warn!(provider = link.id, records = lost, "aborting with records lent to a peer unacknowledged");
                }
                return End::Stopped;
            }
            ack = acks.message() => match ack {
                Ok(Some(ack)) => {
                    heard_on_stream = Some(node.now());
                    let back = pump.settle(node, link, ack);
                    node.requeue(back).await;
                }
                Ok(None) => break if tx.is_none() { End::Stopped } else { End::Broken },
                Err(status) => {
                    debug!(provider = link.id, code = ?status.code(), reason = status.message(), "forward stream broke");
                    break if tx.is_none() { End::Stopped } else { End::Broken };
                }
            },
            _ = drain => break End::Stopped,
            _ = sleep, if tx.is_some() => {}
            _ = changed.changed(), if tx.is_some() => {}
            _ = node.stop.cancelled(), if tx.is_some() => {}
            _ = node.kill.cancelled(), if tx.is_some() => {}
            _ = link.gone.cancelled(), if tx.is_some() => {}
        }
    };
    take_back(node, link, &mut pump, &end).await;
    if node.kill.is_cancelled() {
        End::Stopped
    } else {
        end
    }
}

/// Opens the Forward stream to `link`: its sender and the provider's
/// acknowledgements, or how the session ends.
async fn open(
    node: &Arc<Node>,
    link: &Link,
) -> Result<(mpsc::Sender<ForwardRequest>, Streaming<ForwardAck>), End> {
    let (tx, rx) = mpsc::channel::<ForwardRequest>(FORWARD_PIPELINE);
    let mut client = link.client.clone();
    let call = tokio::time::timeout(node.rpc_timeout(), client.forward(ReceiverStream::new(rx)));
    // Cancel safety: dropping the call abandons a stream that has carried
    // no record yet.
    let acks = tokio::select! {
        r = call => match r {
            Ok(Ok(response)) => response.into_inner(),
            Ok(Err(status)) => {
                debug!(provider = link.id, code = ?status.code(), reason = status.message(), "forward refused");
                return Err(End::Broken);
            }
            Err(_) => return Err(End::Broken),
        },
        _ = node.stop.cancelled() => return Err(End::Stopped),
        _ = node.kill.cancelled() => return Err(End::Stopped),
    };
    debug!(provider = link.id, "forward stream open");
    Ok((tx, acks))
}

/// What one round of an open session decided.
enum Round {
    /// Records sent as granted; look again at this time (or the next
    /// heartbeat), or when an ack comes.
    Wait(Option<Duration>),
    /// weir is stopping: send nothing more.
    HalfClose,
    End(End),
}

/// One round of an open session: the provider still there, the records
/// no longer granted taken back, the granted ones sent.
async fn round(
    node: &Arc<Node>,
    link: &Link,
    pump: &mut Pump,
    sender: &mpsc::Sender<ForwardRequest>,
    heard_on_stream: Option<Duration>,
    now: Duration,
) -> Round {
    if link.gone.is_cancelled() {
        info!(
            provider = link.id,
            "peer dropped from peering.peers; taking back its unacknowledged records"
        );
        return Round::End(End::Broken);
    }
    // Acknowledgements on this stream count as word from the provider
    // beside its heartbeats (`provider_lost`).
    let heard = node.view().is_alive(link.id, now);
    if weir_core::peer::provider_lost(heard, heard_on_stream, now, node.cfg.dead_after) {
        info!(
            provider = link.id,
            "provider gone; taking back its unacknowledged records"
        );
        return Round::End(End::Broken);
    }
    if !node.active() {
        return Round::HalfClose;
    }
    let granted = node.leases().active(link.id, now);
    let ungranted = pump.take_ungranted(&granted);
    node.requeue(ungranted).await;
    if granted.is_empty() && pump.is_empty() {
        return Round::End(End::Idle);
    }
    let (next, twice) = pump.fill(node, link, &granted, sender, now);
    node.requeue(twice).await;
    Round::Wait(next)
}

/// Puts what the provider did not acknowledge back in the queues.
async fn take_back(node: &Arc<Node>, link: &Link, pump: &mut Pump, end: &End) {
    let back = pump.take_all();
    node.metrics().set_lent(link.id, 0);
    if !back.is_empty() {
        // A peer lost mid-stream is worth an operator's notice: these
        // records go out again from here, and any the provider did deliver
        // reach the cloud twice (counted by `(origin, seq)`).
        if matches!(end, End::Broken) {
            warn!(
                provider = link.id,
                records = back.len(),
                "forward stream lost; taking back unacknowledged records (some may reach the cloud twice)"
            );
        } else {
            info!(
                provider = link.id,
                records = back.len(),
                "taking back unacknowledged records"
            );
        }
    }
    node.requeue(back).await;
}
