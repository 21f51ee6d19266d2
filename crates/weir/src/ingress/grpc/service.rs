//! The `weir.v1.Ingress` implementation: unary `Publish` and bidi
//! `PublishStream`, each acknowledging a record only after it is queued.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::{Code, Request, Response, Status, Streaming};
use tracing::{debug, debug_span, field, info_span, warn, Instrument, Span};
use weir_proto::pb::ingress_server::Ingress;
use weir_proto::pb::{PublishAck, PublishRequest};

use weir_core::security::gate::StreamGate;

use crate::intake::{EnqueueError, Intake};
use crate::security::{tls, Watched};
use crate::spool::Ticket;

/// Acks a stream holds while their records are made durable: the client's
/// window of unacknowledged requests beyond this waits (HTTP/2 flow
/// control), bounding memory per stream.
const HELD_ACKS: usize = 4096;

/// How long a `PublishStream` waits for room in a full class queue before it
/// ends with `RESOURCE_EXHAUSTED`: long enough to ride out a scheduler window
/// or a short egress stall (the scheduler runs every ~100 ms), short enough
/// that a client stuck behind a dead uplink learns it within seconds and can
/// go elsewhere.
pub const STREAM_FULL_WAIT: Duration = Duration::from_secs(5);

/// Acks buffered per stream between the enqueue task and tonic's encoder: a
/// client that stops reading acks stalls its own stream after this many,
/// instead of growing weir's memory.
pub const ACK_CHANNEL_CAPACITY: usize = 64;

/// Serves `weir.v1.Ingress` over one shared [`Intake`].
#[derive(Debug, Clone)]
pub(crate) struct IngressService {
    ingress: Arc<Intake>,
    shutdown: CancellationToken,
    streams: TaskTracker,
    gate: Arc<Watched<StreamGate>>,
}

impl IngressService {
    /// A service enqueuing through `ingress`; stream tasks are spawned on
    /// `streams` and end when `shutdown` is cancelled.
    pub(crate) fn new(
        ingress: Arc<Intake>,
        shutdown: CancellationToken,
        streams: TaskTracker,
        gate: Arc<Watched<StreamGate>>,
    ) -> Self {
        IngressService {
            ingress,
            shutdown,
            streams,
            gate,
        }
    }

    /// Who is calling (`None`: anonymous), or UNAUTHENTICATED: a bearer
    /// token, else the verified client certificate's CN.
    fn admit<T>(&self, gate: &StreamGate, request: &Request<T>) -> Result<Option<String>, Status> {
        let bearer = match request.metadata().get("authorization") {
            None => None,
            Some(value) => {
                let token = value
                    .to_str()
                    .ok()
                    .and_then(|v| v.strip_prefix("Bearer "))
                    .map(str::trim);
                match token {
                    Some(t) => Some(t),
                    None => {
                        self.ingress
                            .metrics()
                            .security
                            .grpc_refused("bad_authorization");
                        return Err(Status::unauthenticated(
                            "the authorization header must be `Bearer <token>`",
                        ));
                    }
                }
            }
        };
        let certificate_name = request
            .peer_certs()
            .and_then(|certs| certs.first().and_then(tls::common_name));
        gate.admit(certificate_name.as_deref(), bearer)
            .map_err(|refused| {
                self.ingress
                    .metrics()
                    .security
                    .grpc_refused(refused.reason());
                debug!(reason = %refused, "gRPC call refused");
                Status::unauthenticated(refused.to_string())
            })
    }

    /// The unary call's work, without waiting: a unary client retries on
    /// RESOURCE_EXHAUSTED, and holding its call open would only pin memory.
    fn publish_now(
        &self,
        req: PublishRequest,
    ) -> Result<(Option<Ticket>, Response<PublishAck>), Status> {
        let record = self.ingress.grpc_record(&req.stream, req.payload);
        let (class, seq) = (record.class, record.seq);
        match self.ingress.try_accept(record) {
            Ok(accepted) => Ok((
                accepted.ticket(),
                Response::new(PublishAck {
                    id: req.id,
                    seq,
                    class: self.ingress.class_name(class).to_owned(),
                }),
            )),
            Err(err) => {
                if matches!(err, EnqueueError::Full { .. }) {
                    self.ingress.metrics().backpressured(class);
                }
                debug!(id = req.id, stream = %req.stream, error = %err, "publish refused");
                Err(unary_refusal(err))
            }
        }
    }
}

/// Records the peer in `span` when tonic knows it (it always does over TCP).
fn with_peer<T>(span: Span, request: &Request<T>) -> Span {
    if let Some(peer) = request.remote_addr() {
        span.record("peer", field::display(peer));
    }
    span
}

/// The status a refused enqueue is answered with on a unary call.
fn unary_refusal(err: EnqueueError) -> Status {
    match err {
        EnqueueError::Full { class, .. } => {
            Status::resource_exhausted(format!("class `{class}` queue is full; retry later"))
        }
        oversized @ EnqueueError::Oversized { .. } => oversized_status(&oversized),
        EnqueueError::ShuttingDown => shutting_down(),
    }
}

/// INVALID_ARGUMENT rather than RESOURCE_EXHAUSTED: the record can never fit,
/// so retrying it is pointless.
fn oversized_status(err: &EnqueueError) -> Status {
    Status::invalid_argument(format!(
        "{err}; send smaller payloads or raise that class's queue capacity"
    ))
}

/// PERMISSION_DENIED for a stream the caller may not publish to, counted.
fn denied(ingress: &Intake, identity: Option<&str>, req: &PublishRequest) -> Status {
    ingress.metrics().security.grpc_denied(identity);
    debug!(id = req.id, stream = %req.stream, ?identity, "publish refused by the allow list");
    Status::permission_denied(format!(
        "{} may not publish to stream {:?} (ingress.grpc.allow); request id {} and later were not queued",
        identity.map_or("an anonymous caller".to_owned(), |i| format!("{i:?}")),
        req.stream,
        req.id
    ))
}

fn shutting_down() -> Status {
    Status::unavailable("weir is shutting down; retry later or on another node")
}

#[tonic::async_trait]
impl Ingress for IngressService {
    async fn publish(
        &self,
        request: Request<PublishRequest>,
    ) -> Result<Response<PublishAck>, Status> {
        // Debug level: one span per unary call is on the hot path.
        let span = with_peer(debug_span!("grpc_publish", peer = field::Empty), &request);
        let gate = self.gate.get();
        let identity = self.admit(&gate, &request)?;
        let req = request.into_inner();
        if !gate.may_publish(identity.as_deref(), &req.stream) {
            return Err(denied(&self.ingress, identity.as_deref(), &req));
        }
        let (ticket, response) = span.in_scope(|| self.publish_now(req))?;
        if let Some(ticket) = ticket {
            // OK means on disk: wait for the group commit.
            if !ticket.durable().await {
                return Err(shutting_down());
            }
        }
        Ok(response)
    }

    type PublishStreamStream = Pin<Box<dyn Stream<Item = Result<PublishAck, Status>> + Send>>;

    async fn publish_stream(
        &self,
        request: Request<Streaming<PublishRequest>>,
    ) -> Result<Response<Self::PublishStreamStream>, Status> {
        let span = with_peer(info_span!("grpc_stream", peer = field::Empty), &request);
        let gate = self.gate.get();
        let identity = self.admit(&gate, &request)?;
        let inbound = request.into_inner();
        let (ack_tx, ack_rx) = mpsc::channel(ACK_CHANNEL_CAPACITY);
        let (end_tx, end_rx) = oneshot::channel();
        let stream = StreamTask {
            ingress: self.ingress.clone(),
            shutdown: self.shutdown.clone(),
            acks: ack_tx,
            gate,
            identity,
        };
        self.streams.spawn(
            async move {
                let end = stream.run(inbound).await;
                // The receiver is gone only if the client is; nobody to tell.
                let _ = end_tx.send(end);
            }
            .instrument(span),
        );
        // The final status travels apart from the bounded ack channel, so the
        // task can always deliver it, even to a client that stopped reading.
        let end = futures::stream::once(end_rx).filter_map(|end| async move {
            match end {
                Ok(Ok(())) => None,
                Ok(Err(status)) => Some(Err(status)),
                Err(_) => Some(Err(Status::internal(
                    "weir's stream task ended unexpectedly; resend unacknowledged records",
                ))),
            }
        });
        let acks = ReceiverStream::new(ack_rx).map(Ok).chain(end);
        Ok(Response::new(Box::pin(acks)))
    }
}

/// One `PublishStream` call: reads a request, enqueues it, sends its ack,
/// and only then reads the next, so acks are in request order and a full
/// queue stops the reading (HTTP/2 flow control then stalls the client).
struct StreamTask {
    ingress: Arc<Intake>,
    shutdown: CancellationToken,
    acks: mpsc::Sender<PublishAck>,
    /// The gate in force when the stream opened, and who opened it.
    gate: Arc<StreamGate>,
    identity: Option<String>,
}

impl StreamTask {
    /// Runs until the client half-closes (`Ok`), or the stream must end with
    /// a status (`Err`). A client that went away ends it with `Ok`: there is
    /// nobody left to read a status.
    async fn run(self, mut inbound: Streaming<PublishRequest>) -> Result<(), Status> {
        let mut acked: u64 = 0;
        // Acks in request order; a spooled record's waits for its ticket.
        let mut held: VecDeque<(Option<Ticket>, PublishAck)> = VecDeque::new();
        let mut reading = true;
        loop {
            if let Err(end) = self.send_ready(&mut held, &mut acked).await {
                return end;
            }
            if !reading && held.is_empty() {
                debug!(acked, "stream closed by client");
                return Ok(());
            }
            let front = held.front().and_then(|(t, _)| t.clone());
            let durable = async {
                match front {
                    Some(t) => t.durable().await,
                    None => std::future::pending().await,
                }
            };
            let can_read = reading && held.len() < HELD_ACKS;
            // Cancel safety: `Streaming::message` keeps a partly received
            // message buffered inside `inbound`, so losing the race loses
            // nothing; the other branches only wait.
            let next = tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => return Err(shutting_down()),
                _ = self.acks.closed() => return self.gone(acked),
                ok = durable => {
                    if !ok {
                        return Err(shutting_down());
                    }
                    continue;
                }
                next = inbound.message(), if can_read => next,
            };
            let req = match next {
                Ok(Some(req)) => req,
                Ok(None) => {
                    reading = false;
                    continue;
                }
                Err(status) => {
                    // INTERNAL and OUT_OF_RANGE are tonic's decoder refusing
                    // the bytes (garbage, broken framing, over the size
                    // limit); other codes are the transport breaking off.
                    let (code, message) = (status.code(), status.message());
                    if matches!(code, Code::Internal | Code::OutOfRange) {
                        self.ingress.metrics().protocol_errors.inc();
                        warn!(acked, ?code, message, "bad message on stream");
                    } else {
                        debug!(acked, ?code, message, "stream broken off");
                    }
                    self.settle(&mut held, &mut acked).await;
                    return Err(status);
                }
            };
            if !self.gate.may_publish(self.identity.as_deref(), &req.stream) {
                let status = denied(&self.ingress, self.identity.as_deref(), &req);
                self.settle(&mut held, &mut acked).await;
                return Err(status);
            }
            let record = self.ingress.grpc_record(&req.stream, req.payload);
            let (class, seq) = (record.class, record.seq);
            // Cancel safety: `accept` either has taken the record and
            // returns ready in the same poll, or holds it; dropping it while
            // waiting loses a record that was never acknowledged.
            let queued = tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => return Err(shutting_down()),
                _ = self.acks.closed() => return self.gone(acked),
                queued = self.ingress.accept(record, Some(STREAM_FULL_WAIT)) => queued,
            };
            let end = match queued {
                Ok(accepted) => {
                    let ack = PublishAck {
                        id: req.id,
                        seq,
                        class: self.ingress.class_name(class).to_owned(),
                    };
                    held.push_back((accepted.ticket(), ack));
                    continue;
                }
                Err(EnqueueError::Full { class, .. }) => {
                    warn!(acked, class = %class, "class queue stayed full; ending stream");
                    Status::resource_exhausted(format!(
                        "class `{class}` queue stayed full for {}s; request id {} and later \
                         were not queued, resend them later",
                        STREAM_FULL_WAIT.as_secs(),
                        req.id
                    ))
                }
                Err(EnqueueError::ShuttingDown) => return Err(shutting_down()),
                Err(err @ EnqueueError::Oversized { .. }) => {
                    debug!(id = req.id, error = %err, "oversized record; ending stream");
                    oversized_status(&err)
                }
            };
            // Acks already earned go out before the status.
            self.settle(&mut held, &mut acked).await;
            return Err(end);
        }
    }

    /// Sends every held ack whose record is durable, in order.
    async fn send_ready(
        &self,
        held: &mut VecDeque<(Option<Ticket>, PublishAck)>,
        acked: &mut u64,
    ) -> Result<(), Result<(), Status>> {
        while let Some((ticket, _)) = held.front() {
            if ticket.as_ref().is_some_and(|t| !t.is_durable()) {
                break;
            }
            let (_, ack) = held.pop_front().expect("front exists");
            // Cancel safety: a send cancelled by shutdown drops only this
            // ack and the stream ends with UNAVAILABLE, so the client
            // resends.
            tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => return Err(Err(shutting_down())),
                sent = self.acks.send(ack) => {
                    if sent.is_err() {
                        return Err(self.gone(*acked));
                    }
                }
            }
            *acked += 1;
        }
        Ok(())
    }

    /// Waits for the held acks' records to be durable (bounded) and sends
    /// their acks, before the stream ends with a status.
    async fn settle(&self, held: &mut VecDeque<(Option<Ticket>, PublishAck)>, acked: &mut u64) {
        let all = async {
            loop {
                if self.send_ready(held, acked).await.is_err() {
                    return;
                }
                match held.front().and_then(|(t, _)| t.clone()) {
                    Some(t) if t.durable().await => {}
                    _ => return,
                }
            }
        };
        let _ = tokio::time::timeout(STREAM_FULL_WAIT, all).await;
    }

    /// The client cancelled: nobody is left to read a status.
    fn gone(&self, acked: u64) -> Result<(), Status> {
        debug!(acked, "client cancelled the stream");
        Ok(())
    }
}
