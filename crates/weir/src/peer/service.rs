//! The `weir.v1.Peer` server: answers heartbeats with this node's state,
//! grants reservations from its own spare (the provider is the authority),
//! and admits forwarded records within each reservation's token bucket.
//! Each request is answered at once (every record queued or refused); each
//! queued record is acknowledged again, on the stream that sent it, once
//! this node has delivered it ([`super::Deliveries`]): only then may its
//! sender forget it.

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::task::TaskTracker;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, info, info_span, warn, Instrument};
use weir_core::peer::{Admission, StreamId};
use weir_core::{ClassId, NodeId};
use weir_proto::pb::peer_server::{Peer, PeerServer};
use weir_proto::pb::{
    ForwardAck, ForwardRequest, HeartbeatReply, HeartbeatRequest, RecordId, RefusalReason, Refused,
    ReserveReply, ReserveRequest,
};

use super::node::{from_pb, Node, CUSTODY_GRACE, SHUTDOWN_GRACE};
use crate::intake::EnqueueError;
use crate::security::tls;

/// Acks buffered per Forward stream (answers to requests and delivery
/// acknowledgements): a receiver that stops reading acks stalls its own
/// stream (the stream task stops reading requests) after this many. The
/// delivery acknowledgements pending meanwhile pile up in the custody, not
/// here, and go out together.
const ACK_CHANNEL: usize = 32;

/// Most records one delivery acknowledgement names: ~15 bytes each on the
/// wire, so a message stays near 120 KiB, far below the message limit,
/// while one message still covers a second of a fast reservation.
const DELIVERED_PER_ACK: usize = 8192;

/// Concurrent calls one peer connection may hold open; a peer needs a few
/// (heartbeat, reserve, one Forward stream).
const MAX_CONCURRENT_STREAMS: u32 = 64;

/// HTTP/2 keepalive, so a receiver that vanished without closing its
/// connection frees its stream task.
const HTTP2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// How long a keepalive ping may go unanswered.
const HTTP2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `weir.v1.Peer` on `listener` until the node stops (then open
/// calls get [`SHUTDOWN_GRACE`]) or aborts.
pub(super) async fn serve(listener: TcpListener, node: Arc<Node>, max_message: usize) {
    let local = listener.local_addr().ok();
    let streams = TaskTracker::new();
    let service = PeerServer::new(PeerService {
        node: Arc::clone(&node),
        streams: streams.clone(),
    })
    .max_decoding_message_size(max_message)
    .max_encoding_message_size(max_message);
    let signal = node.stop.clone().cancelled_owned();
    let router = Server::builder()
        .http2_keepalive_interval(Some(HTTP2_KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(HTTP2_KEEPALIVE_TIMEOUT))
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .add_service(service);
    let server: Pin<Box<dyn std::future::Future<Output = _> + Send>> = match &node.security {
        None => {
            let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
            Box::pin(router.serve_with_incoming_shutdown(incoming, signal))
        }
        Some(security) => {
            let incoming = tls::incoming(
                listener,
                security.server.clone(),
                "peering",
                node.ingress.metrics().clone(),
                node.stop.clone(),
            );
            Box::pin(router.serve_with_incoming_shutdown(incoming, signal))
        }
    };
    info!(addr = ?local, "peer service listening");
    tokio::pin!(server);
    let grace = async {
        node.stop.cancelled().await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    // Cancel safety: `server` is pinned outside and dropped only when the
    // grace period is over or weir aborts, which is the point.
    tokio::select! {
        done = &mut server => {
            if let Err(e) = done {
                warn!(error = %e, "peer service failed");
            }
        }
        _ = grace => warn!(grace = ?SHUTDOWN_GRACE, "peer calls still open after the shutdown grace period; closing anyway"),
        _ = node.abort.cancelled() => {}
    }
    streams.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, streams.wait())
        .await
        .is_err()
    {
        warn!(
            open = streams.len(),
            "peer stream tasks still running at exit"
        );
    }
    info!("peer service stopped");
}

/// The service over the shared node state.
#[derive(Debug)]
struct PeerService {
    node: Arc<Node>,
    streams: TaskTracker,
}

/// Refuses a call whose `claimed` node id is not the one its certificate
/// proves (`proven`; `None` without TLS).
fn check_claim(node: &Node, proven: Option<NodeId>, claimed: NodeId) -> Result<(), Status> {
    match proven {
        Some(proven) if proven != claimed => Err(impostor(
            node,
            format!("the certificate of node {proven} was used to speak as node {claimed}"),
        )),
        _ => Ok(()),
    }
}

/// PERMISSION_DENIED for a peer that is not who it says, logged and
/// counted before anything moves.
fn impostor(node: &Node, why: String) -> Status {
    node.metrics().impostors.inc();
    if crate::telemetry::first_in_a_while(&why) {
        warn!(reason = %why, "peer call refused: identity not proven (repeats counted in weir_peer_identity_refused_total, logged once a minute)");
    }
    Status::permission_denied(why)
}

fn shutting_down() -> Status {
    Status::unavailable("this node is shutting down; redirect elsewhere")
}

/// What a killed node answers: nothing, as after a power cut, until weir
/// stops or aborts.
async fn silence(node: &Node) -> Status {
    // Cancel safety: both branches only wait.
    tokio::select! {
        _ = node.stop.cancelled() => {}
        _ = node.abort.cancelled() => {}
    }
    shutting_down()
}

impl PeerService {
    async fn check_alive(&self) -> Result<(), Status> {
        if self.node.kill.is_cancelled() {
            return Err(silence(&self.node).await);
        }
        Ok(())
    }

    /// The node id the caller's certificate proves (`<id>.node.weir`) when
    /// peering uses mutual TLS; `None` without TLS.
    fn caller<T>(&self, request: &Request<T>) -> Result<Option<NodeId>, Status> {
        if self.node.security.is_none() {
            return Ok(None);
        }
        let id = request
            .peer_certs()
            .and_then(|certs| certs.first().and_then(tls::node_id));
        match id {
            Some(id) => Ok(Some(id)),
            None => Err(impostor(
                &self.node,
                "the peer's certificate names no node: it needs exactly one subjectAltName DNS:<id>.node.weir".into(),
            )),
        }
    }

    fn check_peer(&self, id: NodeId) -> Result<(), Status> {
        if self.node.is_peer(id) {
            Ok(())
        } else {
            Err(Status::failed_precondition(format!(
                "node {id} is not in peering.peers of node {}; add it there with its address",
                self.node.me
            )))
        }
    }
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatReply>, Status> {
        self.check_alive().await?;
        let caller = self.caller(&request)?;
        let request = request.into_inner();
        let state = request
            .state
            .ok_or_else(|| Status::invalid_argument("HeartbeatRequest carries no state"))?;
        check_claim(&self.node, caller, state.node)?;
        let from = state.node;
        self.node.hear(state, None)?;
        // A gossiping caller gets this node's table back (push-pull); so
        // does any caller of a gossiping node.
        let gossip = !request.relayed.is_empty()
            || matches!(self.node.cfg.adverts, crate::config::Adverts::Gossip { .. });
        self.node.hear_relayed(from, request.relayed);
        let reply = HeartbeatReply {
            state: Some(self.node.state()),
            relayed: if gossip {
                self.node.relayed_table(from)
            } else {
                Vec::new()
            },
        };
        self.node
            .metrics()
            .advert_bytes
            .inc_by(prost::Message::encoded_len(&reply) as u64);
        Ok(Response::new(reply))
    }

    async fn reserve(
        &self,
        request: Request<ReserveRequest>,
    ) -> Result<Response<ReserveReply>, Status> {
        self.check_alive().await?;
        let caller = self.caller(&request)?;
        let req = request.into_inner();
        check_claim(&self.node, caller, req.receiver)?;
        self.check_peer(req.receiver)?;
        let class = self.node.class_of(&req.class).ok_or_else(|| {
            Status::invalid_argument(format!(
                "unknown class {:?} (known: {})",
                req.class,
                self.node.class_names.join(", ")
            ))
        })?;
        let now = self.node.now();
        let spare = self.node.spare();
        let reserved = self.node.reservations().grant(
            req.receiver,
            class,
            req.bytes_per_sec,
            Duration::from_millis(req.lease_ms),
            now,
            spare,
        );
        if let Some(shift) = reserved.shift {
            // A full channel only delays the shift to the next PBTT window;
            // the reservation itself stands either way.
            let _ = self.node.shifts.try_send(shift);
        }
        let (count, total) = {
            let r = self.node.reservations();
            (r.len(), r.reserved())
        };
        let m = self.node.metrics();
        m.reservations.set(count as i64);
        m.reserved.set(total);
        debug!(
            receiver = req.receiver,
            class = %req.class,
            asked = req.bytes_per_sec,
            granted = reserved.amount,
            spare,
            "reserve"
        );
        Ok(Response::new(ReserveReply {
            granted_bytes_per_sec: reserved.amount,
            lease_ms: u64::try_from(reserved.lease.as_millis()).unwrap_or(u64::MAX),
        }))
    }

    type ForwardStream = Pin<Box<dyn Stream<Item = Result<ForwardAck, Status>> + Send>>;

    async fn forward(
        &self,
        request: Request<Streaming<ForwardRequest>>,
    ) -> Result<Response<Self::ForwardStream>, Status> {
        self.check_alive().await?;
        let caller = self.caller(&request)?;
        let peer = request.remote_addr();
        let inbound = request.into_inner();
        let (ack_tx, ack_rx) = mpsc::channel(ACK_CHANNEL);
        let (end_tx, end_rx) = oneshot::channel();
        let stream = self.node.next_stream.fetch_add(1, Ordering::Relaxed);
        let task = ForwardTask {
            node: Arc::clone(&self.node),
            acks: ack_tx,
            stream,
            caller,
        };
        self.streams.spawn(
            async move {
                let end = task.run(inbound).await;
                // The receiver is gone only if the caller is.
                let _ = end_tx.send(end);
            }
            .instrument(info_span!("peer_forward", peer = ?peer, stream)),
        );
        // The final status travels apart from the bounded ack channel, as
        // in the gRPC ingress.
        let end = futures::stream::once(end_rx).filter_map(|end| async move {
            match end {
                Ok(Ok(())) => None,
                Ok(Err(status)) => Some(Err(status)),
                Err(_) => Some(Err(Status::internal(
                    "the provider's stream task ended unexpectedly; take back unacknowledged records",
                ))),
            }
        });
        let acks = ReceiverStream::new(ack_rx).map(Ok).chain(end);
        Ok(Response::new(Box::pin(acks)))
    }
}

/// One Forward call: reads requests and answers each (admitted records
/// queued, the rest refused) before reading the next, so answers are in
/// request order; between them, acknowledges the records of this stream
/// that this node has delivered. Ends once the receiver has half-closed and
/// nothing more is owed to it; at shutdown, once nothing is owed (or after
/// [`CUSTODY_GRACE`]).
struct ForwardTask {
    node: Arc<Node>,
    acks: mpsc::Sender<ForwardAck>,
    stream: StreamId,
    /// The node id the caller's certificate proves, with mutual TLS.
    caller: Option<NodeId>,
}

/// Releases a stream's custody when its task ends, however it ends: the
/// receiver takes back whatever was not acknowledged.
struct Release<'a> {
    node: &'a Node,
    stream: StreamId,
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        let owed = self.node.deliveries.custody().release(self.stream);
        if owed > 0 {
            debug!(
                records = owed,
                "forward stream ended with records unacknowledged; their sender takes them back"
            );
        }
        self.node.update_held();
    }
}

impl ForwardTask {
    async fn run(self, mut inbound: Streaming<ForwardRequest>) -> Result<(), Status> {
        let node = &self.node;
        let _release = Release {
            node,
            stream: self.stream,
        };
        let mut delivered = node.deliveries.changed.subscribe();
        let mut sender = None;
        let mut reading = true;
        let grace = async {
            node.stop.cancelled().await;
            tokio::time::sleep(CUSTODY_GRACE).await;
        };
        tokio::pin!(grace);
        loop {
            let stopping = node.stop.is_cancelled();
            if (!reading || stopping) && !node.deliveries.custody().owes(self.stream) {
                if reading {
                    // Stopping: nothing is owed to this receiver any more;
                    // what it sends from now on goes back to it.
                    return Err(shutting_down());
                }
                debug!(receiver = ?sender, "forward stream closed by the receiver");
                return Ok(());
            }
            let ack = match self.delivered_ack() {
                Some(ack) => ack,
                None => {
                    // Cancel safety: `Streaming::message` keeps a partly
                    // received message buffered, and `changed` only marks
                    // the version seen, so losing a race loses nothing; the
                    // other branches only wait.
                    tokio::select! {
                        biased;
                        _ = node.kill.cancelled() => return Err(silence(node).await),
                        _ = node.abort.cancelled() => return Err(shutting_down()),
                        _ = self.acks.closed() => return Ok(()),
                        _ = &mut grace => return Err(self.gave_up()),
                        _ = node.stop.cancelled(), if !stopping => continue,
                        changed = delivered.changed() => {
                            if changed.is_err() {
                                return Err(shutting_down());
                            }
                            continue;
                        }
                        next = inbound.message(), if reading => match next {
                            Ok(Some(req)) => {
                                check_claim(node, self.caller, req.receiver)?;
                                if !node.is_peer(req.receiver) {
                                    return Err(Status::failed_precondition(format!(
                                        "node {} is not in peering.peers of node {}",
                                        req.receiver, node.me
                                    )));
                                }
                                sender = Some(req.receiver);
                                admit(node, req, self.stream)
                            }
                            Ok(None) => {
                                // Half-closed: no more requests, but the
                                // records held for it are still owed.
                                reading = false;
                                continue;
                            }
                            Err(status) => {
                                debug!(receiver = ?sender, code = ?status.code(), message = status.message(), "forward stream broken off");
                                return Err(status);
                            }
                        },
                    }
                }
            };
            if node.kill.is_cancelled() {
                // Enqueued or delivered, never acknowledged: what a crash
                // here would do.
                return Err(silence(node).await);
            }
            // Cancel safety: the send is tried first; an abort, a kill or
            // the end of the grace while the receiver does not read acks
            // drops this one, and the receiver takes those records back
            // (they may then arrive twice).
            tokio::select! {
                biased;
                sent = self.acks.send(ack) => {
                    if sent.is_err() {
                        return Ok(());
                    }
                }
                _ = node.kill.cancelled() => return Err(silence(node).await),
                _ = node.abort.cancelled() => return Err(shutting_down()),
                _ = &mut grace => return Err(self.gave_up()),
            }
        }
    }

    /// The next delivery acknowledgement due on this stream, if any.
    fn delivered_ack(&self) -> Option<ForwardAck> {
        let keys = self
            .node
            .deliveries
            .custody()
            .take_delivered(self.stream, DELIVERED_PER_ACK);
        if keys.is_empty() {
            return None;
        }
        self.node.update_held();
        Some(ForwardAck {
            delivered: keys
                .into_iter()
                .map(|(origin, seq)| RecordId { origin, seq })
                .collect(),
            ..ForwardAck::default()
        })
    }

    /// The shutdown grace is over with records still owed to this stream.
    fn gave_up(&self) -> Status {
        let held = self.node.deliveries.custody().held_by(self.stream);
        warn!(
            records = held,
            grace = ?CUSTODY_GRACE,
            "shutting down with records forwarded here not yet delivered; their sender takes them back (the cloud may see them twice)"
        );
        shutting_down()
    }
}

/// Admits one request's records: each within its reservation's bucket goes
/// into its class queue, with origin and sequence number intact; the rest
/// are refused with a reason. With `delivery_acks` set, each queued record
/// is held for `stream` until delivered (and answered as `queued`);
/// without it (an older receiver), answered as `accepted`.
fn admit(node: &Node, req: ForwardRequest, stream: StreamId) -> ForwardAck {
    let now = node.now();
    let receiver = req.receiver;
    let mut ack = ForwardAck::default();
    let m = node.metrics();
    let refuse = |ack: &mut ForwardAck, origin, seq, class: &str, reason: RefusalReason| {
        m.refused(class, reason_label(reason));
        ack.refused.push(Refused {
            id: Some(RecordId { origin, seq }),
            reason: reason as i32,
        });
    };
    let mut admitted = Vec::with_capacity(req.records.len());
    {
        let mut reservations = node.reservations();
        for r in req.records {
            let Some(class) = node.class_of(&r.class) else {
                refuse(&mut ack, r.origin, r.seq, "?", RefusalReason::UnknownClass);
                continue;
            };
            // One peer hop per record: a sender passes on only what entered
            // weir there, so a record cannot bounce between providers.
            if r.origin != receiver {
                let class = node.class_name(class);
                refuse(&mut ack, r.origin, r.seq, class, RefusalReason::HopLimit);
                continue;
            }
            let record = from_pb(r, class);
            match reservations.admit(receiver, class, record.size(), now) {
                Admission::Accepted => admitted.push(record),
                Admission::NoReservation => refuse(
                    &mut ack,
                    record.origin,
                    record.seq,
                    node.class_name(class),
                    RefusalReason::NoReservation,
                ),
                Admission::OverRate => refuse(
                    &mut ack,
                    record.origin,
                    record.seq,
                    node.class_name(class),
                    RefusalReason::OverRate,
                ),
            }
        }
    }
    // Counted per class once per request: the metrics families lock and
    // hash their labels, which per record would show at 50k records/s.
    let mut accepted = vec![0u64; node.class_names.len()];
    {
        // Held before it is enqueued, under the custody lock: the egress
        // may deliver it the moment it is in the queue, and must find it.
        let mut custody = node.deliveries.custody();
        for record in admitted {
            let (origin, seq, class) = (record.origin, record.seq, record.class);
            if req.delivery_acks {
                custody.hold((origin, seq), stream);
            }
            let reason = match node.ingress.try_enqueue_foreign(record) {
                Ok(()) => {
                    accepted[class.index()] += 1;
                    let id = RecordId { origin, seq };
                    if req.delivery_acks {
                        ack.queued.push(id);
                    } else {
                        ack.accepted.push(id);
                    }
                    continue;
                }
                Err(EnqueueError::Full { .. }) => RefusalReason::QueueFull,
                Err(EnqueueError::Oversized { .. }) => RefusalReason::Oversized,
                Err(EnqueueError::ShuttingDown) => RefusalReason::ShuttingDown,
            };
            if req.delivery_acks {
                custody.unhold((origin, seq), stream);
            }
            refuse(&mut ack, origin, seq, node.class_name(class), reason);
        }
    }
    node.update_held();
    for (c, n) in accepted.into_iter().enumerate() {
        if n > 0 {
            m.redirected_in(ClassId(c as u8), n);
        }
    }
    ack
}

/// The metrics label of a refusal reason.
fn reason_label(reason: RefusalReason) -> &'static str {
    match reason {
        RefusalReason::Unspecified => "unspecified",
        RefusalReason::NoReservation => "no_reservation",
        RefusalReason::OverRate => "over_rate",
        RefusalReason::QueueFull => "queue_full",
        RefusalReason::UnknownClass => "unknown_class",
        RefusalReason::Oversized => "oversized",
        RefusalReason::ShuttingDown => "shutting_down",
        RefusalReason::HopLimit => "hop_limit",
    }
}
