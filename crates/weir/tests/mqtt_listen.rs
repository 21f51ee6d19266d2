//! MQTT listen mode: real clients (the `mosquitto_pub` CLI, rumqttc's 3.1.1
//! and 5 clients) and hand-made bytes against weir listening on
//! 127.0.0.1:0, records checked in the class queues.
//!
//! Nothing here waits for a fixed time: every wait is for an observable
//! event (a PUBACK, a counter, a record in a queue, end of stream), bounded
//! by [`PATIENCE`] only so that a broken build fails instead of hanging.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use rumqttc::QoS;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use weir::config::{MqttIngress, MqttLimits, MqttListen, MqttMode, Qos0WhenFull};
use weir::ingress::mqtt::listen;
use weir::intake::Intake;
use weir_core::queueing::queue::QueueCapacity;
use weir_core::{ClassId, Record};

use common::ingress::{intake, mqtt_rule, roomy, take_all, LS, LT, NM};
use common::mqtt::{mosquitto_pub, mqtt_str, packet, MqttClient};
use common::process::metric;
use common::{eventually, logs_with, PATIENCE};

/// Bytes that are not UTF-8, to show payloads pass through untouched.
const BINARY: &[u8] = &[0x00, 0xFF, 0xC3, 0x28, 0x80, b'\n', 0xFE];

/// weir's MQTT listener over the JANUS classes: `ls/#`, `nm/#` and `lt/#`
/// route to their classes, anything else to `nm`.
struct Weir {
    ingress: Arc<Intake>,
    addr: SocketAddr,
    shutdown: CancellationToken,
    server: JoinHandle<()>,
}

impl Weir {
    async fn start(capacity: QueueCapacity, max_packet_size: usize, qos0: Qos0WhenFull) -> Self {
        logs_with("weir=debug");
        let rules = vec![
            mqtt_rule("ls/#", LS),
            mqtt_rule("nm/#", NM),
            mqtt_rule("lt/#", LT),
        ];
        let shutdown = CancellationToken::new();
        let ingress = intake(42, rules, NM, [capacity; 3], shutdown.clone());
        let listener = listen::bind("127.0.0.1:0".parse().unwrap())
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().unwrap();
        let cfg = MqttIngress {
            mode: MqttMode::Listen(MqttListen::plain(addr)),
            max_packet_size,
            qos0_when_full: qos0,
            limits: MqttLimits::default(),
        };
        let server = tokio::spawn(listen::serve(
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

    /// Every record now in `class`'s queue, oldest first.
    fn drain(&self, class: ClassId) -> Vec<Record> {
        take_all(&self.ingress, class)
    }

    /// Waits until `class`'s queue holds `n` records, then takes them.
    async fn take(&self, class: ClassId, n: usize) -> Vec<Record> {
        let queue = self.ingress.queues().class(class);
        eventually(&format!("{n} records in class {class:?}"), || {
            queue.len() >= n
        })
        .await;
        let records = self.drain(class);
        assert_eq!(records.len(), n, "class {class:?}: {records:?}");
        records
    }

    /// A counter from the Prometheus text, e.g.
    /// `weir_records_backpressured_total{class="ls"}`.
    fn counter(&self, series: &str) -> u64 {
        metric(&self.ingress.metrics().render(), series) as u64
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(PATIENCE, self.server)
            .await
            .expect("serve returns after shutdown")
            .expect("serve does not panic");
    }
}

/// A record's (topic, payload).
fn pair(r: &Record) -> (Bytes, Bytes) {
    (r.key.clone(), r.payload.clone())
}

#[tokio::test]
async fn mosquitto_pub_records_reach_their_class_queues() {
    let weir = Weir::start(roomy(), 1 << 20, Qos0WhenFull::Block).await;

    for version in ["mqttv311", "mqttv5"] {
        mosquitto_pub(
            weir.addr.port(),
            &["-V", version, "-q", "1", "-t", "ls/door", "-m", "opened"],
            b"",
        )
        .await;
        mosquitto_pub(
            weir.addr.port(),
            &["-V", version, "-q", "0", "-t", "nm/temp", "-m", "21.5"],
            b"",
        )
        .await;
        mosquitto_pub(
            weir.addr.port(),
            &["-V", version, "-q", "1", "-t", "lt/log", "-l"],
            b"line 1\nline 2\nline 3\n",
        )
        .await;
        mosquitto_pub(
            weir.addr.port(),
            &["-V", version, "-q", "2", "-t", "lt/blob", "-s"],
            BINARY,
        )
        .await;

        let ls = weir.take(LS, 1).await;
        assert_eq!(pair(&ls[0]), ("ls/door".into(), "opened".into()));
        let nm = weir.take(NM, 1).await;
        assert_eq!(pair(&nm[0]), ("nm/temp".into(), "21.5".into()));
        let lt: Vec<_> = weir.take(LT, 4).await.iter().map(pair).collect();
        assert_eq!(
            lt,
            vec![
                ("lt/log".into(), "line 1".into()),
                ("lt/log".into(), "line 2".into()),
                ("lt/log".into(), "line 3".into()),
                ("lt/blob".into(), Bytes::from_static(BINARY)),
            ],
            "{version}"
        );
        for r in ls.iter().chain(&nm) {
            assert_eq!(r.origin, 42);
        }
    }
    assert_eq!(weir.ingress.metrics().protocol_errors.get(), 0);
    weir.stop().await;
}

#[tokio::test]
async fn rumqttc_records_of_three_classes_arrive_intact() {
    let weir = Weir::start(roomy(), 1 << 20, Qos0WhenFull::Block).await;

    // MQTT 3.1.1.
    let mut client = MqttClient::connect(weir.addr.port(), "dev-311").await;
    client.publish("ls/a", QoS::AtLeastOnce, BINARY).await;
    client.publish("nm/b", QoS::AtMostOnce, "zero").await;
    client
        .publish("lt/c/d", QoS::AtLeastOnce, vec![7u8; 5000])
        .await;
    client.publish("other", QoS::AtLeastOnce, "default").await;
    for _ in 0..3 {
        client.next_ack().await;
    }
    assert_eq!(
        weir.take(LS, 1).await.iter().map(pair).collect::<Vec<_>>(),
        vec![("ls/a".into(), Bytes::from_static(BINARY))]
    );
    assert_eq!(
        weir.take(NM, 2).await.iter().map(pair).collect::<Vec<_>>(),
        vec![
            ("nm/b".into(), "zero".into()),
            ("other".into(), "default".into())
        ]
    );
    assert_eq!(
        weir.take(LT, 1).await.iter().map(pair).collect::<Vec<_>>(),
        vec![("lt/c/d".into(), Bytes::from(vec![7u8; 5000]))]
    );

    // MQTT 5.
    use rumqttc::v5::mqttbytes::v5::Packet as Packet5;
    use rumqttc::v5::mqttbytes::QoS as QoS5;
    let options = rumqttc::v5::MqttOptions::new("dev-5", "127.0.0.1", weir.addr.port());
    let (client5, mut events5) = rumqttc::v5::AsyncClient::new(options, 100);
    for (topic, qos) in [
        ("ls/x", QoS5::AtLeastOnce),
        ("nm/y", QoS5::ExactlyOnce),
        ("lt/z", QoS5::AtMostOnce),
    ] {
        client5
            .publish(topic, qos, false, Bytes::from_static(BINARY))
            .await
            .unwrap();
    }
    // Wait for the QoS 1 and QoS 2 handshakes to complete.
    let (mut puback, mut pubcomp) = (false, false);
    tokio::time::timeout(PATIENCE, async {
        while !(puback && pubcomp) {
            match events5.poll().await.expect("MQTT 5 connection") {
                rumqttc::v5::Event::Incoming(Packet5::PubAck(_)) => puback = true,
                rumqttc::v5::Event::Incoming(Packet5::PubComp(_)) => pubcomp = true,
                rumqttc::v5::Event::Incoming(Packet5::Disconnect(d)) => {
                    panic!("weir disconnected the MQTT 5 client: {d:?}")
                }
                _ => {}
            }
        }
    })
    .await
    .expect("PUBACK and PUBCOMP");
    for (class, topic) in [(LS, "ls/x"), (NM, "nm/y"), (LT, "lt/z")] {
        assert_eq!(
            weir.take(class, 1)
                .await
                .iter()
                .map(pair)
                .collect::<Vec<_>>(),
            vec![(Bytes::from(topic), Bytes::from_static(BINARY))]
        );
    }
    assert_eq!(weir.ingress.metrics().protocol_errors.get(), 0);
    weir.stop().await;
}

#[tokio::test]
async fn a_full_queue_withholds_pubacks_until_there_is_room() {
    let two = QueueCapacity {
        records: 2,
        bytes: 1 << 20,
    };
    let weir = Weir::start(two, 1 << 20, Qos0WhenFull::Block).await;
    let mut client = MqttClient::connect(weir.addr.port(), "pressed").await;
    const N: usize = 6;
    for i in 0..N {
        client
            .publish("ls/p", QoS::AtLeastOnce, format!("r{i}"))
            .await;
    }

    // The first two fit and are acknowledged; the third waits for room.
    client.next_ack().await;
    client.next_ack().await;
    eventually("the third publish to wait for room", || {
        weir.counter("weir_records_backpressured_total{class=\"ls\"}") >= 1
    })
    .await;
    // The PUBACK of a waiting record is only written once it is queued, so
    // none can be on its way now.
    assert_eq!(weir.ingress.queues().class(LS).len(), 2);
    assert!(
        client.acks.try_recv().is_err(),
        "a PUBACK for a record not in its queue"
    );

    // Make room repeatedly; the rest are queued and acknowledged.
    let mut records = Vec::new();
    let mut acks = 2;
    let give_up = Instant::now() + PATIENCE;
    while acks < N || records.len() < N {
        assert!(Instant::now() < give_up, "{acks} PUBACKs, {records:?}");
        records.extend(weir.drain(LS));
        weir.ingress.notify_space();
        while client.acks.try_recv().is_ok() {
            acks += 1;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(acks, N);
    let payloads: Vec<_> = records.iter().map(|r| r.payload.clone()).collect();
    let expected: Vec<Bytes> = (0..N).map(|i| format!("r{i}").into()).collect();
    assert_eq!(payloads, expected, "every record exactly once, in order");
    weir.stop().await;
}

#[tokio::test]
async fn qos0_drop_policy_counts_drops_and_keeps_the_connection() {
    let one = QueueCapacity {
        records: 1,
        bytes: 1 << 20,
    };
    let weir = Weir::start(one, 1 << 20, Qos0WhenFull::Drop).await;
    let mut client = MqttClient::connect(weir.addr.port(), "dropper").await;
    for i in 0..3 {
        client
            .publish("ls/q0", QoS::AtMostOnce, format!("d{i}"))
            .await;
    }
    // A QoS 1 publish to another class: its PUBACK proves the connection is
    // up and, since packets are handled in order, that the three QoS 0
    // publishes were handled.
    client.publish("nm/alive", QoS::AtLeastOnce, "yes").await;
    client.next_ack().await;

    assert_eq!(weir.ingress.metrics().dropped_total(LS), 2);
    assert_eq!(
        weir.drain(LS).iter().map(pair).collect::<Vec<_>>(),
        vec![("ls/q0".into(), "d0".into())],
        "the newest records are the ones dropped"
    );
    assert_eq!(weir.drain(NM).len(), 1);
    assert_eq!(weir.ingress.metrics().protocol_errors.get(), 0);

    // And it keeps working after the drops.
    client.publish("ls/q0", QoS::AtLeastOnce, "later").await;
    client.next_ack().await;
    assert_eq!(weir.take(LS, 1).await[0].payload, "later");
    weir.stop().await;
}

/// A CONNECT for protocol `level` (4 is 3.1.1, 5 is MQTT 5).
fn connect(level: u8) -> Vec<u8> {
    let mut body = BytesMut::new();
    mqtt_str(&mut body, b"MQTT");
    body.put_u8(level);
    body.put_u8(0x02); // clean session
    body.put_u16(30); // keep alive
    if level == 5 {
        body.put_u8(0); // no properties
    }
    mqtt_str(&mut body, b"raw");
    packet(0x10, &body)
}

/// A QoS 0 PUBLISH on `topic` (raw bytes, unchecked).
fn publish(level: u8, topic: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut body = BytesMut::new();
    mqtt_str(&mut body, topic);
    if level == 5 {
        body.put_u8(0); // no properties
    }
    body.put_slice(payload);
    packet(0x30, &body)
}

/// Sends `bytes` on a fresh connection and reads until weir closes it;
/// returns what weir sent.
async fn refused(weir: &Weir, bytes: &[u8]) -> Vec<u8> {
    let mut stream = TcpStream::connect(weir.addr).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    let mut received = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(PATIENCE, stream.read(&mut buf))
            .await
            .expect("weir closes the connection")
        {
            Ok(0) => return received,
            Ok(n) => received.extend_from_slice(&buf[..n]),
            // A reset is a close too, if a less polite one.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return received,
            Err(e) => panic!("reading from weir: {e}"),
        }
    }
}

#[tokio::test]
async fn bad_input_closes_only_that_connection() {
    const MAX: usize = 1024;
    let weir = Weir::start(roomy(), MAX, Qos0WhenFull::Block).await;
    let mut good = MqttClient::connect(weir.addr.port(), "good").await;

    let connack = [0x20, 0x02, 0x00, 0x00];
    let big = vec![b'x'; 2000];
    let cases: Vec<(&str, Vec<u8>, Vec<u8>)> = vec![
        ("garbage", vec![0xFF; 8], vec![]),
        ("PUBLISH before CONNECT", publish(4, b"ls/a", b"x"), vec![]),
        (
            "invalid UTF-8 topic",
            [
                connect(4),
                publish(4, &[b'l', b's', b'/', 0xC3, 0x28], b"x"),
            ]
            .concat(),
            connack.to_vec(),
        ),
        (
            "packet over max_packet_size",
            // Only the header: weir refuses before the body arrives.
            [connect(4), vec![0x30, 0xD0, 0x0F]].concat(),
            connack.to_vec(),
        ),
        (
            "wildcard topic",
            [connect(4), publish(4, b"ls/+", b"x")].concat(),
            connack.to_vec(),
        ),
        (
            "empty topic",
            [connect(4), publish(4, b"", b"x")].concat(),
            connack.to_vec(),
        ),
        (
            "second CONNECT",
            [connect(4), connect(4)].concat(),
            connack.to_vec(),
        ),
        (
            "MQTT 3 protocol level",
            connect(3),
            // CONNACK: unacceptable protocol version.
            vec![0x20, 0x02, 0x00, 0x01],
        ),
    ];
    for (i, (name, bytes, expected)) in cases.iter().enumerate() {
        let received = refused(&weir, bytes).await;
        assert_eq!(&received, expected, "{name}: what weir sent before closing");
        assert_eq!(
            weir.ingress.metrics().protocol_errors.get(),
            i as u64 + 1,
            "{name}: counted"
        );
        // The well-behaved client is unaffected.
        good.publish("ls/good", QoS::AtLeastOnce, name.as_bytes().to_vec())
            .await;
        good.next_ack().await;
    }

    // MQTT 5: the reader in rumqttc does not check topics for UTF-8; weir
    // does, and says why in a DISCONNECT.
    use rumqttc::v5::mqttbytes::v5::{DisconnectReasonCode, Packet as Packet5};
    let received = refused(
        &weir,
        &[connect(5), publish(5, &[0xC3, 0x28], b"x")].concat(),
    )
    .await;
    let mut received = BytesMut::from(&received[..]);
    let first = Packet5::read(&mut received, None).expect("CONNACK");
    assert!(matches!(first, Packet5::ConnAck(_)), "{first:?}");
    let Packet5::Disconnect(disconnect) = Packet5::read(&mut received, None).expect("DISCONNECT")
    else {
        panic!("expected DISCONNECT");
    };
    assert_eq!(
        disconnect.reason_code,
        DisconnectReasonCode::MalformedPacket
    );
    let n = cases.len() as u64 + 1;
    assert_eq!(weir.ingress.metrics().protocol_errors.get(), n);

    // An oversized packet whose body does arrive in full.
    let received = refused(
        &weir,
        &[connect(4), {
            let mut body = BytesMut::new();
            mqtt_str(&mut body, b"ls/big");
            body.put_slice(&big);
            let mut p = vec![0x30];
            let len = body.len();
            p.extend_from_slice(&[(len % 128) as u8 | 0x80, (len / 128) as u8]);
            p.extend_from_slice(&body);
            p
        }]
        .concat(),
    )
    .await;
    assert_eq!(received, connack);
    assert_eq!(weir.ingress.metrics().protocol_errors.get(), n + 1);

    good.publish("ls/good", QoS::AtLeastOnce, "still here")
        .await;
    good.next_ack().await;
    let good_records = weir.drain(LS);
    assert_eq!(good_records.len(), cases.len() + 1);
    assert!(good_records.iter().all(|r| r.key == "ls/good"));
    weir.stop().await;
}

#[tokio::test]
async fn a_record_too_big_for_its_queue_closes_the_connection_unacknowledged() {
    let small = QueueCapacity {
        records: 100,
        bytes: 256,
    };
    let weir = Weir::start(small, 1 << 20, Qos0WhenFull::Block).await;
    let mut publish = BytesMut::new();
    mqtt_str(&mut publish, b"ls/huge");
    publish.put_u16(1); // packet id
    publish.put_slice(&[b'h'; 500]);
    let len = publish.len();
    let mut bytes = connect(4);
    bytes.extend_from_slice(&[0x32, (len % 128) as u8 | 0x80, (len / 128) as u8]);
    bytes.extend_from_slice(&publish);
    let received = refused(&weir, &bytes).await;
    assert_eq!(received, [0x20, 0x02, 0x00, 0x00], "CONNACK and no PUBACK");
    assert!(weir.drain(LS).is_empty());
    weir.stop().await;
}

#[tokio::test]
async fn shutdown_closes_connections_and_serve_returns() {
    let weir = Weir::start(roomy(), 1 << 20, Qos0WhenFull::Block).await;
    let mut stream = TcpStream::connect(weir.addr).await.unwrap();
    stream.write_all(&connect(4)).await.unwrap();
    let mut connack = [0u8; 4];
    stream.read_exact(&mut connack).await.unwrap();
    assert_eq!(connack, [0x20, 0x02, 0x00, 0x00]);
    let addr = weir.addr;
    weir.stop().await;
    let mut rest = Vec::new();
    let read = tokio::time::timeout(PATIENCE, stream.read_to_end(&mut rest))
        .await
        .expect("connection closed by shutdown");
    assert!(read.is_ok() && rest.is_empty(), "{read:?} {rest:?}");
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "no longer accepting"
    );
}

#[tokio::test]
async fn qos2_redelivery_on_the_same_connection_is_queued_once() {
    let weir = Weir::start(roomy(), 1 << 20, Qos0WhenFull::Block).await;
    let mut stream = TcpStream::connect(weir.addr).await.unwrap();
    let publish = |byte1: u8| {
        let mut body = BytesMut::new();
        mqtt_str(&mut body, b"ls/q2");
        body.put_u16(5); // packet id
        body.put_slice(b"once");
        packet(byte1, &body)
    };
    let bytes = [
        connect(4),
        publish(0x34),               // QoS 2
        publish(0x3C),               // QoS 2, DUP
        packet(0x62, &[0x00, 0x05]), // PUBREL 5
        packet(0xE0, &[]),           // DISCONNECT
    ]
    .concat();
    stream.write_all(&bytes).await.unwrap();
    let mut received = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut received))
        .await
        .expect("closed after DISCONNECT")
        .unwrap();
    assert_eq!(
        received,
        [
            vec![0x20, 0x02, 0x00, 0x00], // CONNACK
            vec![0x50, 0x02, 0x00, 0x05], // PUBREC 5
            vec![0x50, 0x02, 0x00, 0x05], // PUBREC 5 again, nothing queued
            vec![0x70, 0x02, 0x00, 0x05], // PUBCOMP 5
        ]
        .concat()
    );
    assert_eq!(
        weir.take(LS, 1).await.iter().map(pair).collect::<Vec<_>>(),
        vec![("ls/q2".into(), "once".into())]
    );
    assert!(weir.drain(LS).is_empty());
    weir.stop().await;
}

#[tokio::test]
async fn a_silent_client_is_closed_after_its_keep_alive() {
    let weir = Weir::start(roomy(), 1 << 20, Qos0WhenFull::Block).await;
    let mut stream = TcpStream::connect(weir.addr).await.unwrap();
    let mut hello = connect(4);
    hello[11] = 1; // keep alive: 1 s
    stream.write_all(&hello).await.unwrap();
    let mut received = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut received))
        .await
        .expect("closed for silence")
        .unwrap();
    assert_eq!(received, [0x20, 0x02, 0x00, 0x00], "CONNACK, then close");
    assert_eq!(weir.ingress.metrics().protocol_errors.get(), 0);
    weir.stop().await;
}

#[tokio::test]
async fn clients_without_a_client_id_do_not_take_each_other_over() {
    let weir = Weir::start(roomy(), 1 << 20, Qos0WhenFull::Block).await;
    // MQTT 3.1.1 CONNECT, clean session, empty client id (what
    // mosquitto_pub sends): the server assigns each its own id.
    let mut body = BytesMut::new();
    mqtt_str(&mut body, b"MQTT");
    body.put_u8(4);
    body.put_u8(0x02);
    body.put_u16(30);
    mqtt_str(&mut body, b"");
    let hello = packet(0x10, &body);
    let mut first = TcpStream::connect(weir.addr).await.unwrap();
    first.write_all(&hello).await.unwrap();
    let mut connack = [0u8; 4];
    first.read_exact(&mut connack).await.unwrap();
    assert_eq!(connack, [0x20, 0x02, 0x00, 0x00]);
    let mut second = TcpStream::connect(weir.addr).await.unwrap();
    second.write_all(&hello).await.unwrap();
    second.read_exact(&mut connack).await.unwrap();
    assert_eq!(connack, [0x20, 0x02, 0x00, 0x00]);
    // The first is still connected: PINGREQ is answered.
    first.write_all(&packet(0xC0, &[])).await.unwrap();
    let mut pong = [0u8; 2];
    tokio::time::timeout(PATIENCE, first.read_exact(&mut pong))
        .await
        .expect("answered")
        .expect("the first connection was not closed");
    assert_eq!(pong, [0xD0, 0x00]);
    weir.stop().await;
}
