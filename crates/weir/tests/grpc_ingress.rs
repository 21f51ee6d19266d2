//! gRPC ingress against real tonic clients on loopback: unary and streaming
//! publishes of three classes, back-pressure on a full class queue, size
//! limits, garbage frames, health and reflection, and shutdown.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::codegen::http::{self, HeaderMap};
use tonic::codegen::{Body as _, Service as _};
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1alpha;
use weir::config::{GrpcAuth, GrpcIngress};
use weir::ingress::grpc::{self, GrpcError, STREAM_FULL_WAIT};
use weir::intake::Intake;
use weir_core::queueing::queue::QueueCapacity;
use weir_core::{ClassId, Record};
use weir_proto::pb::ingress_client::IngressClient;
use weir_proto::pb::{PublishAck, PublishRequest};

use common::ingress::{grpc_rule, intake, roomy, take_all, LS, LT, NM};
use common::{eventually, PATIENCE};

const NODE: u64 = 7;
/// Stream name to class, as the classifier is configured.
const STREAMS: [(&str, ClassId); 3] = [("alarms", LS), ("telemetry", NM), ("logs", LT)];
const PUBLISH: &str = "/weir.v1.Ingress/Publish";
const PUBLISH_STREAM: &str = "/weir.v1.Ingress/PublishStream";

struct Weir {
    ingress: Arc<Intake>,
    addr: SocketAddr,
    shutdown: CancellationToken,
    server: JoinHandle<Result<(), GrpcError>>,
}

impl Weir {
    /// weir's gRPC ingress on 127.0.0.1:0 over queues of these capacities
    /// (ls, nm, lt); unrouted streams go to nm.
    async fn start(capacities: [QueueCapacity; 3], max_message_size: usize) -> Weir {
        let rules = STREAMS
            .iter()
            .map(|&(name, class)| grpc_rule(name, class))
            .collect();
        let shutdown = CancellationToken::new();
        let ingress = intake(NODE, rules, NM, capacities, shutdown.clone());
        let cfg = GrpcIngress {
            listen: "127.0.0.1:0".parse().unwrap(),
            max_message_size,
            tls: None,
            auth: GrpcAuth::open(),
        };
        let listener = tokio::net::TcpListener::bind(cfg.listen).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(grpc::serve(
            listener,
            cfg,
            ingress.clone(),
            shutdown.clone(),
        ));
        Weir {
            ingress,
            addr,
            shutdown,
            server,
        }
    }

    async fn channel(&self) -> Channel {
        timeout(
            Channel::from_shared(format!("http://{}", self.addr))
                .unwrap()
                .connect(),
        )
        .await
        .unwrap_or_else(|e| {
            panic!(
                "cannot connect to weir's gRPC ingress at {}: {e}",
                self.addr
            )
        })
    }

    async fn client(&self) -> IngressClient<Channel> {
        IngressClient::new(self.channel().await)
    }

    /// Every record now queued in `class`, oldest first.
    fn drain(&self, class: ClassId) -> Vec<Record> {
        take_all(&self.ingress, class)
    }

    fn protocol_errors(&self) -> u64 {
        self.ingress.metrics().protocol_errors.get()
    }

    /// Cancels shutdown and waits for `serve` to return (once).
    async fn stop(&mut self) {
        self.shutdown.cancel();
        timeout(&mut self.server)
            .await
            .expect("serve panicked")
            .expect("serve failed");
    }
}

/// Turns a hang into a failure; no test depends on how long it takes.
async fn timeout<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(PATIENCE, f)
        .await
        .expect("timed out: weir's gRPC ingress stopped answering")
}

/// Payloads exercising binary content: every byte value, empty, and more.
fn payloads() -> Vec<Bytes> {
    vec![
        Bytes::from((0..=255u8).collect::<Vec<u8>>()),
        Bytes::new(),
        Bytes::from_static(b"\x00\xff\x00\xfe not utf-8 \xc3\x28"),
        Bytes::from((0..=255u8).rev().cycle().take(5000).collect::<Vec<u8>>()),
    ]
}

/// Requests over all three routed streams, each with a distinct payload
/// (the id is appended so identical payloads cannot mask a mix-up).
fn requests(first_id: u64, n: u64) -> Vec<PublishRequest> {
    let payloads = payloads();
    (first_id..first_id + n)
        .map(|id| {
            let (stream, _) = STREAMS[(id % 3) as usize];
            let mut payload = BytesMut::from(&payloads[(id as usize / 3) % payloads.len()][..]);
            payload.put_u64(id);
            PublishRequest {
                stream: stream.into(),
                payload: payload.freeze(),
                id,
            }
        })
        .collect()
}

fn class_of(stream: &str) -> ClassId {
    STREAMS
        .iter()
        .find(|(name, _)| *name == stream)
        .map_or(NM, |&(_, class)| class)
}

/// Checks that every acknowledged request is queued exactly once, in its
/// class, with identical bytes, and that nothing else is queued.
fn assert_queued_exactly_once(weir: &Weir, sent: &[PublishRequest], acks: &[PublishAck]) {
    let records = [LS, NM, LT]
        .into_iter()
        .flat_map(|c| weir.drain(c))
        .collect();
    assert_exactly_once(weir, records, sent, acks);
}

/// Checks that `records` are exactly the acknowledged requests, each once,
/// in its class, with identical bytes.
fn assert_exactly_once(
    weir: &Weir,
    records: Vec<Record>,
    sent: &[PublishRequest],
    acks: &[PublishAck],
) {
    assert_eq!(sent.len(), acks.len(), "one ack per request");
    let mut queued: HashMap<u64, Record> = HashMap::new();
    for record in records {
        assert_eq!(record.origin, NODE);
        let seq = record.seq;
        assert!(
            queued.insert(seq, record).is_none(),
            "seq {seq} queued twice"
        );
    }
    assert_eq!(queued.len(), sent.len(), "queued records vs requests");
    for (req, ack) in sent.iter().zip(acks) {
        assert_eq!(ack.id, req.id);
        let record = queued.get(&ack.seq).unwrap_or_else(|| {
            panic!("request {} acked as seq {} but not queued", req.id, ack.seq)
        });
        let class = class_of(&req.stream);
        assert_eq!(record.class, class, "request {}", req.id);
        assert_eq!(ack.class, weir.ingress.class_name(class));
        assert_eq!(record.key, req.stream.as_bytes());
        assert_eq!(record.payload, req.payload, "request {}", req.id);
    }
}

#[tokio::test]
async fn unary_and_streaming_publishes_land_in_their_class_queues() {
    let mut weir = Weir::start([roomy(); 3], 4 << 20).await;
    let mut client = weir.client().await;

    let mut sent = requests(0, 30);
    // Unrouted and empty stream names go to the default class.
    for (i, stream) in ["", "no-such-stream"].into_iter().enumerate() {
        sent.push(PublishRequest {
            stream: stream.into(),
            payload: Bytes::from((0..=255u8).collect::<Vec<u8>>()),
            id: 1000 + i as u64,
        });
    }
    let mut acks = Vec::new();
    for req in &sent {
        acks.push(
            timeout(client.publish(req.clone()))
                .await
                .unwrap()
                .into_inner(),
        );
    }

    let streamed = requests(100, 60);
    let mut inbound = timeout(client.publish_stream(futures::stream::iter(streamed.clone())))
        .await
        .unwrap()
        .into_inner();
    while let Some(ack) = timeout(inbound.message()).await.unwrap() {
        acks.push(ack);
    }
    sent.extend(streamed);

    // Acks of each call come in request order; seqs grow with them.
    assert!(acks.windows(2).all(|w| w[0].seq < w[1].seq));
    assert_queued_exactly_once(&weir, &sent, &acks);
    assert_eq!(weir.protocol_errors(), 0);
    weir.stop().await;
}

fn tiny_lt() -> [QueueCapacity; 3] {
    let tiny = QueueCapacity {
        records: 4,
        bytes: 64 << 10,
    };
    [roomy(), roomy(), tiny]
}

fn logs(id: u64) -> PublishRequest {
    PublishRequest {
        stream: "logs".into(),
        payload: Bytes::from((0..=255u8).collect::<Vec<u8>>()),
        id,
    }
}

#[tokio::test]
async fn unary_publish_to_a_full_queue_is_resource_exhausted() {
    let mut weir = Weir::start(tiny_lt(), 4 << 20).await;
    let mut client = weir.client().await;
    let mut sent = Vec::new();
    let mut acks = Vec::new();
    for id in 0..4 {
        sent.push(logs(id));
        acks.push(
            timeout(client.publish(logs(id)))
                .await
                .unwrap()
                .into_inner(),
        );
    }
    let status = timeout(client.publish(logs(4))).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("class `lt` queue is full"),
        "{status:?}"
    );

    // Other classes are not affected.
    let ls = requests(0, 1).remove(0);
    let ack = timeout(client.publish(ls.clone()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ack.class, "ls");

    // Room again (the scheduler took the oldest record): the retry succeeds.
    let oldest = weir.ingress.queues().class(LT).pop().unwrap();
    assert_eq!(oldest.seq, acks[0].seq);
    let again = timeout(client.publish(logs(4))).await.unwrap().into_inner();
    assert_eq!(again.class, "lt");

    let sent = [vec![ls], sent.split_off(1), vec![logs(4)]].concat();
    let acks = [vec![ack], acks.split_off(1), vec![again]].concat();
    assert_queued_exactly_once(&weir, &sent, &acks);
    weir.stop().await;
}

#[tokio::test]
async fn streaming_publish_waits_for_room_then_continues() {
    let mut weir = Weir::start(tiny_lt(), 4 << 20).await;
    let mut client = weir.client().await;
    let sent: Vec<PublishRequest> = (0..12).map(logs).collect();
    let (tx, rx) = mpsc::channel(16);
    for req in &sent {
        tx.send(req.clone()).await.unwrap();
    }
    let mut inbound = timeout(client.publish_stream(ReceiverStream::new(rx)))
        .await
        .unwrap()
        .into_inner();

    let mut acks = Vec::new();
    while acks.len() < 4 {
        acks.push(timeout(inbound.message()).await.unwrap().unwrap());
    }
    // The fifth record found the queue full: the stream is now waiting.
    eventually("the fifth record to find the lt queue full", || {
        weir.ingress.queues().class(LT).stats().rejected_full > 0
    })
    .await;

    // Play the scheduler: make room whenever the stream has filled it.
    let mut popped = Vec::new();
    while acks.len() < sent.len() {
        popped.extend(weir.drain(LT));
        weir.ingress.notify_space();
        // Cancel safety: `Streaming::message` keeps partial input buffered.
        tokio::select! {
            ack = inbound.message() => acks.push(ack.unwrap().unwrap()),
            _ = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
    }
    drop(tx);
    assert!(timeout(inbound.message()).await.unwrap().is_none());
    popped.extend(weir.drain(LT));
    assert_exactly_once(&weir, popped, &sent, &acks);
    weir.stop().await;
}

#[tokio::test]
async fn streaming_publish_gives_up_after_the_bounded_wait() {
    let mut weir = Weir::start(tiny_lt(), 4 << 20).await;
    let mut client = weir.client().await;
    let sent: Vec<PublishRequest> = (0..6).map(logs).collect();
    let started = tokio::time::Instant::now();
    let mut inbound = timeout(client.publish_stream(futures::stream::iter(sent.clone())))
        .await
        .unwrap()
        .into_inner();
    let mut acks = Vec::new();
    let status = loop {
        match timeout(inbound.message()).await {
            Ok(Some(ack)) => acks.push(ack),
            Ok(None) => panic!("stream ended without RESOURCE_EXHAUSTED"),
            Err(status) => break status,
        }
    };
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("class `lt`"), "{status:?}");
    assert!(status.message().contains("request id 4 "), "{status:?}");
    // Bounded wait, not an immediate refusal (a lower bound only).
    assert!(started.elapsed() >= STREAM_FULL_WAIT);
    assert_queued_exactly_once(&weir, &sent[..4], &acks);
    weir.stop().await;
}

#[tokio::test]
async fn oversized_messages_are_refused() {
    let small_ls = QueueCapacity {
        records: 100,
        bytes: 4096,
    };
    let mut weir = Weir::start([small_ls, roomy(), roomy()], 64 << 10).await;
    let mut client = weir.client().await;

    // Over `max_message_size`: tonic refuses it before weir sees it.
    let huge = PublishRequest {
        stream: "logs".into(),
        payload: Bytes::from(vec![0xa5; 100 << 10]),
        id: 1,
    };
    let status = timeout(client.publish(huge.clone())).await.unwrap_err();
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert!(status.message().contains("too large"), "{status:?}");
    assert_eq!(weir.protocol_errors(), 1);

    // On a stream: the records before it are acked, then the stream ends.
    let ok = logs(0);
    let mut inbound = timeout(client.publish_stream(futures::stream::iter([ok.clone(), huge])))
        .await
        .unwrap()
        .into_inner();
    let ack = timeout(inbound.message()).await.unwrap().unwrap();
    let status = timeout(inbound.message()).await.unwrap_err();
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert_eq!(weir.protocol_errors(), 2);

    // Under the message limit but over the class queue's byte capacity: it
    // could never be queued, so INVALID_ARGUMENT rather than "retry later".
    let too_big_for_ls = PublishRequest {
        stream: "alarms".into(),
        payload: Bytes::from(vec![1; 8192]),
        id: 2,
    };
    let status = timeout(client.publish(too_big_for_ls.clone()))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("class `ls`"), "{status:?}");
    let mut inbound = timeout(client.publish_stream(futures::stream::iter([too_big_for_ls])))
        .await
        .unwrap()
        .into_inner();
    let status = timeout(inbound.message()).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");

    // The connection is still good.
    let ack2 = timeout(client.publish(logs(3))).await.unwrap().into_inner();
    assert_queued_exactly_once(&weir, &[ok, logs(3)], &[ack, ack2]);
    weir.stop().await;
}

/// Sends and receives message bodies as they are, so a test can put bytes
/// on the wire that are not a valid `PublishRequest`.
#[derive(Debug, Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// Protobuf bodies that are not a `PublishRequest`.
fn garbage_messages() -> Vec<Bytes> {
    vec![
        // `stream` (a string) holding invalid UTF-8.
        Bytes::from_static(b"\x0a\x02\xc3\x28"),
        // `payload` claims 5 bytes, has 1.
        Bytes::from_static(b"\x12\x05\x01"),
        // A varint that never ends.
        Bytes::from_static(b"\x18\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"),
        // Field number 0 does not exist.
        Bytes::from_static(b"\x00\x01"),
    ]
}

/// A valid `PublishRequest`, encoded by hand (weir's tests need no prost).
fn encode_request(req: &PublishRequest) -> Bytes {
    fn varint(buf: &mut BytesMut, mut v: u64) {
        while v >= 0x80 {
            buf.put_u8(v as u8 | 0x80);
            v >>= 7;
        }
        buf.put_u8(v as u8);
    }
    let mut buf = BytesMut::new();
    for (tag, bytes) in [(0x0a, req.stream.as_bytes()), (0x12, &req.payload[..])] {
        buf.put_u8(tag);
        varint(&mut buf, bytes.len() as u64);
        buf.put_slice(bytes);
    }
    buf.put_u8(0x18);
    varint(&mut buf, req.id);
    buf.freeze()
}

/// Sends a raw HTTP/2 request with `body` as the whole gRPC request body and
/// returns the status weir answered with.
async fn raw_call(channel: &mut Channel, path: &str, body: &'static str) -> Status {
    let request = http::Request::builder()
        .method("POST")
        .uri(path)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(tonic::body::Body::new(body.to_owned()))
        .unwrap();
    futures::future::poll_fn(|cx| channel.poll_ready(cx))
        .await
        .unwrap();
    let response = timeout(channel.call(request)).await.unwrap();
    assert_eq!(response.status(), http::StatusCode::OK);
    if let Some(status) = Status::from_header_map(response.headers()) {
        return status;
    }
    let mut body = pin!(response.into_body());
    let mut trailers = HeaderMap::new();
    while let Some(frame) =
        timeout(futures::future::poll_fn(|cx| body.as_mut().poll_frame(cx))).await
    {
        if let Ok(t) = frame.unwrap().into_trailers() {
            trailers = t;
        }
    }
    Status::from_header_map(&trailers).expect("a grpc-status in headers or trailers")
}

#[tokio::test]
async fn garbage_frames_get_an_error_and_leave_other_clients_alone() {
    let mut weir = Weir::start([roomy(); 3], 4 << 20).await;

    // A well-behaved client publishing all along, on its own connection.
    let good = {
        let mut client = weir.client().await;
        tokio::spawn(async move {
            let sent = requests(0, 300);
            let mut acks = Vec::new();
            for req in &sent[..150] {
                acks.push(client.publish(req.clone()).await.unwrap().into_inner());
            }
            let mut inbound = client
                .publish_stream(futures::stream::iter(sent[150..].to_vec()))
                .await
                .unwrap()
                .into_inner();
            while let Some(ack) = inbound.message().await.unwrap() {
                acks.push(ack);
            }
            (sent, acks)
        })
    };

    let mut errors = 0;
    let mut streamed_before_garbage = Vec::new();
    let channel = weir.channel().await;
    let mut raw = tonic::client::Grpc::new(channel.clone());
    for garbage in garbage_messages() {
        timeout(raw.ready()).await.unwrap();
        let status = timeout(raw.unary(
            tonic::Request::new(garbage.clone()),
            PathAndQuery::from_static(PUBLISH),
            RawCodec,
        ))
        .await
        .unwrap_err();
        assert_eq!(status.code(), Code::Internal, "{garbage:?}: {status:?}");
        errors += 1;
        assert_eq!(weir.protocol_errors(), errors);

        // On a stream: a good request is acked, then the garbage ends it.
        let good_req = requests(500 + errors, 1).remove(0);
        timeout(raw.ready()).await.unwrap();
        let mut inbound = timeout(raw.streaming(
            tonic::Request::new(futures::stream::iter([
                encode_request(&good_req),
                garbage.clone(),
            ])),
            PathAndQuery::from_static(PUBLISH_STREAM),
            RawCodec,
        ))
        .await
        .unwrap()
        .into_inner();
        assert!(timeout(inbound.message()).await.unwrap().is_some());
        let status = timeout(inbound.message()).await.unwrap_err();
        assert_eq!(status.code(), Code::Internal, "{garbage:?}: {status:?}");
        errors += 1;
        assert_eq!(weir.protocol_errors(), errors);
        streamed_before_garbage.push(good_req);
    }

    // Broken gRPC framing on a unary call.
    let mut channel = channel;
    for frame in [
        // Compression flag 7 does not exist.
        "\x07\x00\x00\x00\x00",
        // Compressed, but no grpc-encoding was negotiated.
        "\x01\x00\x00\x00\x00",
        // Announces 16 bytes, sends 1.
        "\x00\x00\x00\x00\x10\x0a",
        // No message at all.
        "",
    ] {
        let status = raw_call(&mut channel, PUBLISH, frame).await;
        assert_eq!(status.code(), Code::Internal, "{frame:?}: {status:?}");
        errors += 1;
        assert_eq!(weir.protocol_errors(), errors);
    }
    let status = raw_call(&mut channel, PUBLISH_STREAM, "\x07\x00\x00\x00\x00").await;
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    errors += 1;
    assert_eq!(weir.protocol_errors(), errors);

    // Not HTTP/2 at all: weir closes that connection and nothing else.
    let mut tcp = tokio::net::TcpStream::connect(weir.addr).await.unwrap();
    tcp.write_all(b"\x16\x03\x01 this is not an HTTP/2 preface\r\n\r\n")
        .await
        .unwrap();
    let mut sink = Vec::new();
    let _ = timeout(tcp.read_to_end(&mut sink)).await;

    let (sent, acks) = timeout(good).await.unwrap();
    let mut client = weir.client().await;
    let last = timeout(client.publish(logs(9999)))
        .await
        .unwrap()
        .into_inner();
    let (before_garbage, rest): (Vec<Record>, Vec<Record>) = [LS, NM, LT]
        .into_iter()
        .flat_map(|c| weir.drain(c))
        .partition(|r| {
            streamed_before_garbage
                .iter()
                .any(|g| g.payload == r.payload)
        });
    // Their acks were read raw, so check them by content.
    assert_eq!(before_garbage.len(), streamed_before_garbage.len());
    for req in &streamed_before_garbage {
        let record = before_garbage.iter().find(|r| r.payload == req.payload);
        assert!(
            record.is_some_and(|r| r.class == class_of(&req.stream)),
            "request {}",
            req.id
        );
    }
    assert_exactly_once(
        &weir,
        rest,
        &[sent, vec![logs(9999)]].concat(),
        &[acks, vec![last]].concat(),
    );
    weir.stop().await;
}

#[tokio::test]
async fn a_client_cancelling_a_waiting_stream_leaves_weir_healthy() {
    let mut weir = Weir::start(tiny_lt(), 4 << 20).await;
    let mut client = weir.client().await;
    let sent: Vec<PublishRequest> = (0..8).map(logs).collect();
    let (tx, rx) = mpsc::channel(16);
    for req in &sent {
        tx.send(req.clone()).await.unwrap();
    }
    let mut inbound = timeout(client.publish_stream(ReceiverStream::new(rx)))
        .await
        .unwrap()
        .into_inner();
    let mut acks = Vec::new();
    while acks.len() < 4 {
        acks.push(timeout(inbound.message()).await.unwrap().unwrap());
    }
    // The stream now waits for room; the client gives up on it.
    drop(inbound);
    drop(tx);
    drop(client);

    // Others are served, and the waiting task does not hold up shutdown.
    let mut other = weir.client().await;
    let ls = requests(0, 1).remove(0);
    let ack = timeout(other.publish(ls.clone()))
        .await
        .unwrap()
        .into_inner();
    weir.stop().await;

    // Whether the record the task was holding got in before it saw the
    // cancellation is a race; either way it was never acknowledged.
    let (acked, unacked): (Vec<Record>, Vec<Record>) = weir
        .drain(LT)
        .into_iter()
        .partition(|r| acks.iter().any(|a| a.seq == r.seq));
    assert!(
        unacked.len() <= 1,
        "{} unacknowledged records",
        unacked.len()
    );
    assert!(unacked.iter().all(|r| r.payload == sent[4].payload));
    assert_exactly_once(&weir, acked, &sent[..4], &acks);
    assert_queued_exactly_once(&weir, &[ls], &[ack]);
}

#[tokio::test]
async fn health_and_reflection_answer() {
    let mut weir = Weir::start([roomy(); 3], 4 << 20).await;
    let channel = weir.channel().await;

    let mut health = HealthClient::new(channel.clone());
    for service in ["weir.v1.Ingress", ""] {
        let status = timeout(health.check(HealthCheckRequest {
            service: service.into(),
        }))
        .await
        .unwrap()
        .into_inner()
        .status;
        assert_eq!(status, ServingStatus::Serving as i32, "{service:?}");
    }
    assert_eq!(grpc::SERVICE_NAME, "weir.v1.Ingress");

    let mut reflection = ServerReflectionClient::new(channel.clone());
    let requests = [
        MessageRequest::ListServices(String::new()),
        MessageRequest::FileContainingSymbol("weir.v1.Ingress".into()),
    ]
    .map(|m| ServerReflectionRequest {
        host: String::new(),
        message_request: Some(m),
    });
    let mut answers = timeout(reflection.server_reflection_info(futures::stream::iter(requests)))
        .await
        .unwrap()
        .into_inner();
    match timeout(answers.message())
        .await
        .unwrap()
        .unwrap()
        .message_response
    {
        Some(MessageResponse::ListServicesResponse(list)) => {
            let names: Vec<&str> = list.service.iter().map(|s| s.name.as_str()).collect();
            for want in ["weir.v1.Ingress", "grpc.health.v1.Health"] {
                assert!(names.contains(&want), "{want} missing from {names:?}");
            }
        }
        other => panic!("expected a service list, got {other:?}"),
    }
    match timeout(answers.message())
        .await
        .unwrap()
        .unwrap()
        .message_response
    {
        Some(MessageResponse::FileDescriptorResponse(files)) => {
            assert!(!files.file_descriptor_proto.is_empty());
        }
        other => panic!("expected the descriptor of weir.v1.Ingress, got {other:?}"),
    }

    // The older v1alpha, which grpcurl still tries first.
    let mut alpha = v1alpha::server_reflection_client::ServerReflectionClient::new(channel);
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut answers = timeout(alpha.server_reflection_info(futures::stream::iter([request])))
        .await
        .unwrap()
        .into_inner();
    match timeout(answers.message())
        .await
        .unwrap()
        .unwrap()
        .message_response
    {
        Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(list)) => {
            assert!(list.service.iter().any(|s| s.name == "weir.v1.Ingress"));
        }
        other => panic!("expected a service list, got {other:?}"),
    }
    weir.stop().await;
}

#[tokio::test]
async fn shutdown_reports_not_serving_and_ends_open_streams() {
    let weir = Weir::start([roomy(); 3], 4 << 20).await;
    let channel = weir.channel().await;
    let mut health = HealthClient::new(channel.clone());
    let mut watch = timeout(health.watch(HealthCheckRequest {
        service: "weir.v1.Ingress".into(),
    }))
    .await
    .unwrap()
    .into_inner();
    let first = timeout(watch.message()).await.unwrap().unwrap();
    assert_eq!(first.status, ServingStatus::Serving as i32);

    // A stream with one record acked and the client still sending.
    let (tx, rx) = mpsc::channel(4);
    tx.send(logs(0)).await.unwrap();
    let mut client = IngressClient::new(channel);
    let mut inbound = timeout(client.publish_stream(ReceiverStream::new(rx)))
        .await
        .unwrap()
        .into_inner();
    let ack = timeout(inbound.message()).await.unwrap().unwrap();

    weir.shutdown.cancel();
    let next = timeout(watch.message()).await.unwrap().unwrap();
    assert_eq!(next.status, ServingStatus::NotServing as i32);
    let status = timeout(inbound.message()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    drop(tx);
    timeout(weir.server)
        .await
        .expect("serve panicked")
        .expect("serve failed");
    // What was acked stays queued for the scheduler to drain.
    let queued = weir.ingress.queues().class(LT).pop().unwrap();
    assert_eq!(queued.seq, ack.seq);
}
