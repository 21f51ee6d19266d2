//! MQTT subscribe mode against the real Mosquitto on 127.0.0.1:1883 (started
//! by `scripts/services.sh`), plus one test against a scripted broker for
//! the packets Mosquitto never sends (a non-UTF-8 topic, an oversized
//! packet).
//!
//! Each test uses its own topic prefix and client ids (process id + test
//! name), so tests run in parallel and reruns do not meet old sessions.
//! Nothing here waits for a fixed time: every wait is for an observable
//! event, bounded by [`PATIENCE`] only so a broken build fails instead of
//! hanging.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rumqttc::{AsyncClient, Event, MqttOptions, Outgoing, Packet, QoS};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use weir::config::{BrokerAddr, MqttIngress, MqttMode, MqttSubscribe, Qos0WhenFull, SubscribeQos};
use weir::ingress::mqtt::subscribe;
use weir::intake::Intake;
use weir_core::classify::TopicFilter;
use weir_core::queueing::queue::QueueCapacity;
use weir_core::{ClassId, Record};

use common::ingress::{intake, mqtt_rule, roomy, take_all, LS, LT, NM};
use common::mqtt::{
    mosquitto_pub, packet, require_mosquitto, MqttClient, MOSQUITTO_PORT as MOSQUITTO,
};
use common::{eventually, tally, unique, PATIENCE};

/// The JANUS classes with `ls`/`nm` routed by topic under `prefix` and
/// everything else (the probe topic included) in `lt`.
fn ingress(prefix: &str, capacity: QueueCapacity) -> Arc<Intake> {
    let rules = vec![
        mqtt_rule(&format!("{prefix}/ls/#"), LS),
        mqtt_rule(&format!("{prefix}/nm/+"), NM),
    ];
    intake(7, rules, LT, [capacity; 3], CancellationToken::new())
}

/// Subscribe-mode settings for Mosquitto, filters under `prefix`.
fn settings(
    prefix: &str,
    client_id: &str,
    qos0_when_full: Qos0WhenFull,
) -> (MqttIngress, MqttSubscribe) {
    let topics = ["ls/#", "nm/+", "lt/#", "probe"]
        .iter()
        .map(|f| TopicFilter::parse(&format!("{prefix}/{f}")).expect("valid filter"))
        .collect();
    let sub = MqttSubscribe {
        broker: BrokerAddr {
            host: "127.0.0.1".into(),
            port: MOSQUITTO,
        },
        client_id: client_id.into(),
        topics,
        qos: SubscribeQos::AtLeastOnce,
    };
    let cfg = MqttIngress {
        mode: MqttMode::Subscribe(sub.clone()),
        max_packet_size: 1 << 20,
        qos0_when_full,
        limits: weir::config::MqttLimits::default(),
    };
    (cfg, sub)
}

/// A running subscribe-mode ingress.
struct Weir {
    token: CancellationToken,
    task: JoinHandle<()>,
}

impl Weir {
    fn start(cfg: &MqttIngress, sub: &MqttSubscribe, ingress: &Arc<Intake>) -> Weir {
        let stop = CancellationToken::new();
        let task = tokio::spawn(subscribe::run(
            cfg.clone(),
            sub.clone(),
            Arc::clone(ingress),
            stop.clone(),
        ));
        Weir { token: stop, task }
    }

    /// Cancels and waits until the loop has disconnected and returned.
    async fn stop(self) {
        self.token.cancel();
        tokio::time::timeout(PATIENCE, self.task)
            .await
            .expect("subscribe mode did not stop after cancel")
            .expect("subscribe mode panicked");
    }
}

/// A test publisher to Mosquitto (clean session) as `client_id`.
async fn connect_publisher(client_id: &str) -> MqttClient {
    MqttClient::connect(MOSQUITTO, client_id).await
}

/// Moves every queued record into `out`, waking an ingress that waits for
/// room; true if anything moved.
fn drain(ingress: &Intake, out: &mut Vec<Record>) -> bool {
    let before = out.len();
    for (_, queue) in ingress.queues().iter() {
        while let Some(record) = queue.pop() {
            out.push(record);
        }
    }
    ingress.notify_space();
    out.len() > before
}

/// Drains into `out` until `done(out)`; panics naming `what` on timeout.
async fn drain_until(
    ingress: &Intake,
    out: &mut Vec<Record>,
    what: &str,
    done: impl Fn(&[Record]) -> bool,
) {
    eventually(what, || {
        drain(ingress, out);
        done(out)
    })
    .await;
}

fn has(records: &[Record], topic: &str, payload: &[u8]) -> bool {
    records
        .iter()
        .any(|r| r.key == topic.as_bytes() && r.payload == payload)
}

/// Publishes probes on `{prefix}/probe` until one comes through weir, which
/// proves its SUBSCRIBE is in force (it is asynchronous, and a publish
/// before it takes effect reaches nobody). Probes are drained and dropped,
/// with everything else queued meanwhile.
async fn await_subscribed(ingress: &Intake, publisher: &MqttClient, prefix: &str) {
    let topic = format!("{prefix}/probe");
    let deadline = Instant::now() + PATIENCE;
    let mut seen = Vec::new();
    for n in 0u64.. {
        publisher.publish(&topic, QoS::AtMostOnce, b"probe").await;
        let round = Instant::now() + Duration::from_millis(200);
        while Instant::now() < round {
            drain(ingress, &mut seen);
            if seen.iter().any(|r| r.key == topic.as_bytes()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            Instant::now() < deadline,
            "weir never subscribed on Mosquitto ({n} probes on {topic} went unanswered)"
        );
    }
}

/// Drops probe records, which may trail behind [`await_subscribed`].
fn without_probes(records: Vec<Record>, prefix: &str) -> Vec<Record> {
    let probe = format!("{prefix}/probe");
    records
        .into_iter()
        .filter(|r| r.key != probe.as_bytes())
        .collect()
}

/// Publishes a QoS 1 fence on `{prefix}/lt/fence` and drains until it is
/// through. Mosquitto delivers to one subscriber in order, so anything
/// published earlier, redeliveries included, is then in `out`.
async fn fence(ingress: &Intake, publisher: &mut MqttClient, prefix: &str, out: &mut Vec<Record>) {
    let topic = format!("{prefix}/lt/fence");
    publisher
        .publish_confirmed(&[(topic.clone(), b"fence".to_vec())])
        .await;
    drain_until(ingress, out, "the fence", |r| has(r, &topic, b"fence")).await;
}

/// Counts of each (topic, payload) pair.
fn counts(records: &[Record]) -> BTreeMap<(Bytes, Bytes), usize> {
    tally(records.iter().map(|r| (r.key.clone(), r.payload.clone())))
}

/// A payload that is not text: every byte value once, then a tag.
fn binary(tag: &str) -> Vec<u8> {
    let mut payload: Vec<u8> = (0..=255u8).collect();
    payload.extend_from_slice(tag.as_bytes());
    payload
}

#[tokio::test]
async fn three_classes_from_mosquitto_pub_and_rumqttc_arrive_once_with_identical_bytes() {
    require_mosquitto().await;
    let prefix = unique("classes");
    let ingress = ingress(&prefix, roomy());
    let (cfg, sub) = settings(&prefix, &format!("{prefix}-weir"), Qos0WhenFull::Block);
    let weir = Weir::start(&cfg, &sub, &ingress);
    let mut publisher = connect_publisher(&format!("{prefix}-pub")).await;
    await_subscribed(&ingress, &publisher, &prefix).await;

    // (topic, payload, class) of everything published.
    let mut expected: Vec<(String, Vec<u8>, ClassId)> = Vec::new();
    let classes = [("ls/cli", LS), ("nm/cli", NM), ("lt/cli/deep", LT)];
    for (n, (level, class)) in classes.iter().enumerate() {
        let topic = format!("{prefix}/{level}");
        for qos in ["0", "1"] {
            // `-l`: one message per line.
            let lines: Vec<String> = (0..5).map(|i| format!("cli-q{qos}-{n}-{i}")).collect();
            let cli_id = format!("{prefix}-cli-{n}-{qos}");
            mosquitto_pub(
                MOSQUITTO,
                &["-i", &cli_id, "-q", qos, "-t", &topic, "-l"],
                format!("{}\n", lines.join("\n")).as_bytes(),
            )
            .await;
            for line in lines {
                expected.push((topic.clone(), line.into_bytes(), *class));
            }
        }
        // `-s`: the whole of stdin as one binary message.
        let payload = binary(&format!("cli-bin-{n}"));
        let cli_id = format!("{prefix}-cli-{n}-bin");
        mosquitto_pub(
            MOSQUITTO,
            &["-i", &cli_id, "-q", "1", "-t", &topic, "-s"],
            &payload,
        )
        .await;
        expected.push((topic.clone(), payload, *class));
    }
    let classes = [("ls/lib/a/b", LS), ("nm/lib", NM), ("lt/lib", LT)];
    for (n, (level, class)) in classes.iter().enumerate() {
        let topic = format!("{prefix}/{level}");
        for (qos, q) in [(QoS::AtMostOnce, 0), (QoS::AtLeastOnce, 1)] {
            for i in 0..20 {
                let payload = binary(&format!("lib-q{q}-{n}-{i}"));
                publisher.publish(&topic, qos, payload.as_slice()).await;
                expected.push((topic.clone(), payload, *class));
            }
        }
    }

    let mut got = Vec::new();
    drain_until(&ingress, &mut got, "every published record", |records| {
        expected.iter().all(|(t, p, _)| has(records, t, p))
    })
    .await;
    fence(&ingress, &mut publisher, &prefix, &mut got).await;
    weir.stop().await;

    let got = without_probes(got, &prefix);
    let counts = counts(&got);
    // QoS 0 included: the connection never dropped and no queue filled, the
    // only two ways subscribe mode can lose a QoS 0 record.
    for (topic, payload, class) in &expected {
        let key = (Bytes::from(topic.clone()), Bytes::from(payload.clone()));
        assert_eq!(
            counts.get(&key),
            Some(&1),
            "{topic} {:?} must arrive exactly once",
            String::from_utf8_lossy(payload)
        );
        let record = got
            .iter()
            .find(|r| r.key == key.0 && r.payload == key.1)
            .expect("counted above");
        assert_eq!(record.class, *class, "{topic} is in the wrong class");
        assert_eq!(record.origin, 7, "origin is the node id");
    }
    assert_eq!(
        got.len(),
        expected.len() + 1,
        "nothing but the published records and the fence"
    );
}

#[tokio::test]
async fn persistent_session_redelivers_what_was_not_acked_and_what_came_while_offline() {
    require_mosquitto().await;
    let prefix = unique("session");
    // Three records fill a class queue; nothing drains until weir restarts.
    let ingress = ingress(
        &prefix,
        QueueCapacity {
            records: 3,
            bytes: 1 << 20,
        },
    );
    let (cfg, sub) = settings(&prefix, &format!("{prefix}-weir"), Qos0WhenFull::Block);
    let weir = Weir::start(&cfg, &sub, &ingress);
    let mut publisher = connect_publisher(&format!("{prefix}-pub")).await;
    await_subscribed(&ingress, &publisher, &prefix).await;
    let mut got = Vec::new();
    drain(&ingress, &mut got);

    let topic = format!("{prefix}/nm/data");
    let batch = |name: &str| -> Vec<(String, Vec<u8>)> {
        (0..10)
            .map(|i| (topic.clone(), binary(&format!("{name}{i}"))))
            .collect()
    };
    let before = batch("a");
    publisher.publish_confirmed(&before).await;
    // weir queued three, then found the queue full and is now holding the
    // fourth without acking it.
    let nm = ingress.queues().class(NM);
    eventually("weir to fill the nm queue", || {
        nm.len() >= 3 && nm.stats().rejected_full > 0
    })
    .await;
    weir.stop().await;

    let offline = batch("b");
    publisher.publish_confirmed(&offline).await;

    let weir = Weir::start(&cfg, &sub, &ingress);
    drain_until(&ingress, &mut got, "every record after the restart", |r| {
        before.iter().chain(&offline).all(|(t, p)| has(r, t, p))
    })
    .await;
    fence(&ingress, &mut publisher, &prefix, &mut got).await;
    weir.stop().await;

    let got = without_probes(got, &prefix);
    let counts = counts(&got);
    for (i, (topic, payload)) in before.iter().chain(&offline).enumerate() {
        let key = (Bytes::from(topic.clone()), Bytes::from(payload.clone()));
        let n = counts.get(&key).copied().unwrap_or(0);
        assert!(n >= 1, "{topic} record {i} is missing");
        // The first three were queued and acked before the clean
        // disconnect, so the broker must not send them again; the rest were
        // never acked and may come twice.
        if i < 3 {
            assert_eq!(n, 1, "record {i} was acked yet came back");
        }
    }
}

#[tokio::test]
async fn resubscribes_after_a_session_takeover_wipes_the_subscriptions() {
    require_mosquitto().await;
    let prefix = unique("takeover");
    let ingress = ingress(&prefix, roomy());
    let client_id = format!("{prefix}-weir");
    let (cfg, sub) = settings(&prefix, &client_id, Qos0WhenFull::Block);
    let weir = Weir::start(&cfg, &sub, &ingress);
    let mut publisher = connect_publisher(&format!("{prefix}-pub")).await;
    await_subscribed(&ingress, &publisher, &prefix).await;

    // A second client with weir's id: Mosquitto disconnects weir (MQTT 3.1.1
    // section 3.1.4), and as it asks for a clean session the stored session
    // and its subscriptions are discarded. It then leaves.
    let mut options = MqttOptions::new(client_id.clone(), "127.0.0.1", MOSQUITTO);
    options.set_clean_session(true);
    let (intruder, mut eventloop) = AsyncClient::new(options, 10);
    let takeover = async {
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    intruder.try_disconnect().expect("queue DISCONNECT")
                }
                Ok(Event::Outgoing(Outgoing::Disconnect)) => return,
                Ok(_) => {}
                // weir reconnected first and took the id back: also done.
                Err(_) => return,
            }
        }
    };
    tokio::time::timeout(PATIENCE, takeover)
        .await
        .expect("the takeover client never got through");
    drop(eventloop);

    // Only a weir that subscribed again on its new connection gets these.
    await_subscribed(&ingress, &publisher, &prefix).await;
    let after: Vec<(String, Vec<u8>)> = (0..10)
        .map(|i| (format!("{prefix}/ls/after"), binary(&format!("after{i}"))))
        .collect();
    publisher.publish_confirmed(&after).await;
    let mut got = Vec::new();
    drain_until(
        &ingress,
        &mut got,
        "the publishes after the takeover",
        |r| after.iter().all(|(t, p)| has(r, t, p)),
    )
    .await;
    weir.stop().await;
    assert!(got
        .iter()
        .filter(|r| r.key.ends_with(b"/ls/after"))
        .all(|r| r.class == LS));
}

#[tokio::test]
async fn qos0_when_full_drop_counts_drops_and_keeps_reading() {
    require_mosquitto().await;
    let prefix = unique("drop");
    let ingress = ingress(
        &prefix,
        QueueCapacity {
            records: 2,
            bytes: 1 << 20,
        },
    );
    let (cfg, sub) = settings(&prefix, &format!("{prefix}-weir"), Qos0WhenFull::Drop);
    let weir = Weir::start(&cfg, &sub, &ingress);
    let mut publisher = connect_publisher(&format!("{prefix}-pub")).await;
    await_subscribed(&ingress, &publisher, &prefix).await;
    drain(&ingress, &mut Vec::new());

    // Nothing drains ls: two fit, eight are dropped, and weir goes on to
    // the fence in another class instead of blocking.
    for i in 0..10 {
        let payload = format!("q0-{i}");
        publisher
            .publish(
                &format!("{prefix}/ls/x"),
                QoS::AtMostOnce,
                payload.as_bytes(),
            )
            .await;
    }
    let topic = format!("{prefix}/lt/fence");
    publisher
        .publish_confirmed(&[(topic.clone(), b"fence".to_vec())])
        .await;
    let mut fenced = Vec::new();
    eventually("the fence", || {
        fenced.extend(take_all(&ingress, LT));
        has(&fenced, &topic, b"fence")
    })
    .await;
    weir.stop().await;

    let ls = take_all(&ingress, LS);
    let payloads: Vec<&[u8]> = ls.iter().map(|r| &r.payload[..]).collect();
    assert_eq!(payloads, [&b"q0-0"[..], b"q0-1"], "the first two are kept");
    assert_eq!(ingress.metrics().dropped_total(LS), 8);
}

#[tokio::test]
async fn qos0_when_full_block_waits_and_loses_nothing() {
    require_mosquitto().await;
    let prefix = unique("block");
    let ingress = ingress(
        &prefix,
        QueueCapacity {
            records: 2,
            bytes: 1 << 20,
        },
    );
    let (cfg, sub) = settings(&prefix, &format!("{prefix}-weir"), Qos0WhenFull::Block);
    let weir = Weir::start(&cfg, &sub, &ingress);
    let publisher = connect_publisher(&format!("{prefix}-pub")).await;
    await_subscribed(&ingress, &publisher, &prefix).await;
    let mut got = Vec::new();
    drain(&ingress, &mut got);

    let topic = format!("{prefix}/ls/x");
    for i in 0..10 {
        let payload = format!("q0-{i}");
        publisher
            .publish(&topic, QoS::AtMostOnce, payload.as_bytes())
            .await;
    }
    // Let weir hit the full queue before anything drains.
    let ls = ingress.queues().class(LS);
    eventually("weir to find the ls queue full", || {
        ls.stats().rejected_full > 0
    })
    .await;
    drain_until(&ingress, &mut got, "all ten QoS 0 records", |r| {
        (0..10).all(|i| has(r, &topic, format!("q0-{i}").as_bytes()))
    })
    .await;
    weir.stop().await;
    assert_eq!(ingress.metrics().dropped_total(LS), 0);
}

// ---- A scripted broker, for packets Mosquitto itself refuses to send ----

/// Reads one MQTT packet: (first header byte, body).
async fn read_packet(stream: &mut TcpStream) -> (u8, Vec<u8>) {
    let first = stream.read_u8().await.expect("packet header");
    let (mut len, mut shift) = (0usize, 0);
    loop {
        let byte = stream.read_u8().await.expect("remaining length");
        len |= usize::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            break;
        }
        shift += 7;
    }
    let mut body = vec![0; len];
    stream.read_exact(&mut body).await.expect("packet body");
    (first, body)
}

/// A PUBLISH with raw topic bytes (QoS 0 when `pkid` is `None`).
fn publish_packet(topic: &[u8], pkid: Option<u16>, payload: &[u8]) -> Vec<u8> {
    let mut body = (topic.len() as u16).to_be_bytes().to_vec();
    body.extend_from_slice(topic);
    if let Some(id) = pkid {
        body.extend_from_slice(&id.to_be_bytes());
    }
    body.extend_from_slice(payload);
    packet(if pkid.is_some() { 0x32 } else { 0x30 }, &body)
}

/// Accepts weir's next connection: checks its CONNECT (fixed client id,
/// persistent session), answers CONNACK with `session_present`, and waits
/// for the SUBSCRIBE weir must send on every connection.
async fn accept_session(
    listener: &TcpListener,
    client_id: &str,
    session_present: bool,
) -> TcpStream {
    let (mut stream, _) = tokio::time::timeout(PATIENCE, listener.accept())
        .await
        .expect("weir did not reconnect")
        .expect("accept");
    let (first, connect) = read_packet(&mut stream).await;
    assert_eq!(first >> 4, 1, "CONNECT first");
    assert_eq!(&connect[2..6], b"MQTT");
    assert_eq!(connect[7] & 0b10, 0, "clean_session must be false");
    let id_len = usize::from(u16::from_be_bytes([connect[10], connect[11]]));
    assert_eq!(
        &connect[12..12 + id_len],
        client_id.as_bytes(),
        "fixed client id"
    );
    let flags = u8::from(session_present);
    stream
        .write_all(&packet(0x20, &[flags, 0]))
        .await
        .expect("CONNACK");
    let (first, subscribe) = tokio::time::timeout(PATIENCE, read_packet(&mut stream))
        .await
        .unwrap_or_else(|_| {
            panic!("no SUBSCRIBE after a CONNACK with session_present = {session_present}")
        });
    assert_eq!(first, 0x82, "SUBSCRIBE");
    stream
        .write_all(&packet(0x90, &[subscribe[0], subscribe[1], 1]))
        .await
        .expect("SUBACK");
    stream
}

/// Waits until weir closes the connection (it drops it after a bad packet).
async fn await_close(mut stream: TcpStream) {
    let mut buf = [0u8; 1024];
    let closed = async {
        // Errors (a reset) count as closed too.
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    };
    tokio::time::timeout(PATIENCE, closed)
        .await
        .expect("weir kept a connection that sent it a bad packet");
}

#[tokio::test]
async fn bad_packets_from_the_broker_cost_a_reconnect_not_the_loop() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("bound").port();
    let prefix = unique("scripted");
    let client_id = format!("{prefix}-weir");
    let ingress = ingress(&prefix, roomy());
    let (mut cfg, mut sub) = settings(&prefix, &client_id, Qos0WhenFull::Block);
    sub.broker.port = port;
    cfg.max_packet_size = 1024;
    let weir = Weir::start(&cfg, &sub, &ingress);

    // 1: a topic that is not UTF-8.
    let mut stream = accept_session(&listener, &client_id, false).await;
    stream
        .write_all(&publish_packet(b"bad/\xff\xfe", None, b"never"))
        .await
        .expect("write");
    await_close(stream).await;

    // 2: a packet over max_packet_size. weir may hang up mid-write.
    let mut stream = accept_session(&listener, &client_id, true).await;
    let _ = stream
        .write_all(&publish_packet(b"big", Some(1), &[0; 4096]))
        .await;
    await_close(stream).await;

    // 3: a good QoS 1 publish, acknowledged only once it is queued.
    let mut stream = accept_session(&listener, &client_id, true).await;
    let topic = format!("{prefix}/ls/ok");
    stream
        .write_all(&publish_packet(topic.as_bytes(), Some(7), b"good"))
        .await
        .expect("write");
    let (first, puback) = tokio::time::timeout(PATIENCE, read_packet(&mut stream))
        .await
        .expect("no PUBACK for a queued record");
    assert_eq!(
        (first, &puback[..]),
        (0x40, &[0u8, 7][..]),
        "PUBACK for id 7"
    );
    let ls = ingress.queues().class(LS);
    assert_eq!(ls.len(), 1, "the record is queued before its PUBACK");
    let record = ls.pop().expect("queued");
    assert_eq!(
        (&record.key[..], &record.payload[..]),
        (topic.as_bytes(), &b"good"[..])
    );
    assert_eq!(ingress.metrics().protocol_errors.get(), 2);
    assert!(
        ingress.queues().is_empty_all(),
        "nothing from the bad packets"
    );

    // Shutdown: weir says DISCONNECT rather than vanishing.
    weir.token.cancel();
    let (first, _) = tokio::time::timeout(PATIENCE, read_packet(&mut stream))
        .await
        .expect("no DISCONNECT on shutdown");
    assert_eq!(first, 0xe0, "DISCONNECT");
    // A broker closes after DISCONNECT; weir waits for that (see
    // `Subscriber::disconnect`).
    drop(stream);
    tokio::time::timeout(PATIENCE, weir.task)
        .await
        .expect("subscribe mode did not stop")
        .expect("subscribe mode panicked");
}
