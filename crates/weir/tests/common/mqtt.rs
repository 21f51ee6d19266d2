//! MQTT: the test Mosquitto (scripts/services.sh starts it),
//! `mosquitto_pub`, a rumqttc client that reports PUBACKs, and raw packets
//! for what no well-behaved client sends.

use std::process::Stdio;
use std::time::Duration;

use bytes::BufMut;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::PATIENCE;

/// The test Mosquitto's address.
pub const MOSQUITTO: &str = "127.0.0.1:1883";
/// Its port.
pub const MOSQUITTO_PORT: u16 = 1883;

/// Fails with a clear message when Mosquitto is not there.
pub async fn require_mosquitto() {
    if let Err(e) = TcpStream::connect(MOSQUITTO).await {
        panic!(
            "Mosquitto is not listening on {MOSQUITTO} ({e}); start it with `bash scripts/services.sh`"
        );
    }
}

/// Runs `mosquitto_pub -h 127.0.0.1 -p <port>` with `args`, feeding
/// `stdin`; asserts that it succeeds.
pub async fn mosquitto_pub(port: u16, args: &[&str], stdin: &[u8]) {
    let port = port.to_string();
    let mut child = tokio::process::Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &port])
        .args(args)
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run mosquitto_pub ({e}); install mosquitto-clients (scripts/services.sh)"
            )
        });
    let mut input = child.stdin.take().expect("piped stdin");
    input
        .write_all(stdin)
        .await
        .expect("write to mosquitto_pub");
    drop(input);
    let out = tokio::time::timeout(PATIENCE, child.wait_with_output())
        .await
        .expect("mosquitto_pub finishes")
        .expect("wait for mosquitto_pub");
    assert!(
        out.status.success(),
        "mosquitto_pub {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A rumqttc MQTT 3.1.1 client (clean session) whose event loop runs in a
/// task, reporting each PUBACK's packet id; the task ends (and so does
/// [`MqttClient::next_ack`]) when the connection does.
pub struct MqttClient {
    /// The client, for anything not wrapped here.
    pub client: AsyncClient,
    /// Packet ids of PUBACKs, in arrival order.
    pub acks: mpsc::UnboundedReceiver<u16>,
    task: JoinHandle<()>,
}

impl MqttClient {
    /// Connects as `id` to the broker on 127.0.0.1:`port` and waits for the
    /// CONNACK.
    pub async fn connect(port: u16, id: &str) -> MqttClient {
        let mut options = MqttOptions::new(id, "127.0.0.1", port);
        options.set_keep_alive(Duration::from_secs(30));
        options.set_max_packet_size(1 << 20, 1 << 20);
        let (client, mut events) = AsyncClient::new(options, 100);
        let (tx, acks) = mpsc::unbounded_channel();
        let (connected_tx, connected) = tokio::sync::oneshot::channel();
        let mut connected_tx = Some(connected_tx);
        let who = id.to_owned();
        let task = tokio::spawn(async move {
            loop {
                match events.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        if let Some(c) = connected_tx.take() {
                            let _ = c.send(());
                        }
                    }
                    Ok(Event::Incoming(Packet::PubAck(ack))) => {
                        let _ = tx.send(ack.pkid);
                    }
                    Ok(_) => {}
                    // Ends the task, so `next_ack` fails with a clear message
                    // (shutdown at the end of a test ends it too).
                    Err(e) => {
                        eprintln!("MQTT client {who} connection ended: {e}");
                        break;
                    }
                }
            }
        });
        tokio::time::timeout(PATIENCE, connected)
            .await
            .unwrap_or_else(|_| panic!("no CONNACK for {id} from 127.0.0.1:{port}"))
            .unwrap_or_else(|_| panic!("{id} could not connect to 127.0.0.1:{port}"));
        MqttClient { client, acks, task }
    }

    /// Queues a publish (not retained).
    pub async fn publish(&self, topic: &str, qos: QoS, payload: impl Into<Vec<u8>>) {
        self.client
            .publish(topic, qos, false, payload)
            .await
            .expect("request queued");
    }

    /// The next PUBACK's packet id.
    pub async fn next_ack(&mut self) -> u16 {
        tokio::time::timeout(PATIENCE, self.acks.recv())
            .await
            .expect("a PUBACK")
            .expect("the client's connection is up (see its error above)")
    }

    /// Publishes every message at QoS 1 and waits until the broker has
    /// acknowledged all of them.
    pub async fn publish_confirmed(&mut self, messages: &[(String, Vec<u8>)]) {
        for (topic, payload) in messages {
            self.publish(topic, QoS::AtLeastOnce, payload.as_slice())
                .await;
        }
        for _ in messages {
            self.next_ack().await;
        }
    }
}

impl Drop for MqttClient {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An MQTT packet with this first byte and body (remaining length encoded
/// as a variable byte integer).
pub fn packet(first: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![first];
    let mut len = body.len();
    loop {
        let mut byte = (len % 128) as u8;
        len /= 128;
        if len > 0 {
            byte |= 0x80;
        }
        out.push(byte);
        if len == 0 {
            break;
        }
    }
    out.extend_from_slice(body);
    out
}

/// A raw MQTT 3.1.1 CONNECT: clean session, keep alive 60 s, as `client`.
pub fn connect_packet(client: &[u8]) -> Vec<u8> {
    connect_packet_session(client, true)
}

/// A raw MQTT 3.1.1 CONNECT with `clean_session` as given.
pub fn connect_packet_session(client: &[u8], clean: bool) -> Vec<u8> {
    let mut body = Vec::new();
    mqtt_str(&mut body, b"MQTT");
    body.put_u8(4);
    body.put_u8(if clean { 0x02 } else { 0x00 });
    body.put_u16(60);
    mqtt_str(&mut body, client);
    packet(0x10, &body)
}

/// Appends an MQTT string: length prefix and bytes (unchecked).
pub fn mqtt_str(buf: &mut impl BufMut, s: &[u8]) {
    buf.put_u16(s.len() as u16);
    buf.put_slice(s);
}

/// How [`publish_qos1`] sends.
#[derive(Debug, Clone)]
pub struct Pace {
    /// Unacknowledged publishes allowed at once.
    pub window: usize,
    /// Publishes per second; `None`: as fast as they are acknowledged.
    pub rate: Option<f64>,
    /// No publish starts after this.
    pub until: tokio::time::Instant,
    /// With publishes unacknowledged, a silence this long means the
    /// connection is broken.
    pub silence: Duration,
    /// Counts PUBACKs as they arrive, for a test watching progress.
    pub acks: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>,
}

impl Pace {
    /// `window` in flight, as fast as acknowledged, until `until`; 5 s of
    /// silence is a broken connection.
    pub fn unpaced(window: usize, until: tokio::time::Instant) -> Pace {
        Pace {
            window,
            rate: None,
            until,
            silence: Duration::from_secs(5),
            acks: None,
        }
    }
}

/// Publishes QoS 1 over one raw MQTT 3.1.1 connection (client id
/// `client`): publish `i` is `next(i)` as `(topic, payload)`, until `next`
/// says `None`, `pace.until` passes or the connection breaks (weir was
/// killed; see [`Pace::silence`]). Returns the payloads whose
/// PUBACK arrived, in arrival order.
pub async fn publish_qos1(
    port: u16,
    client: &str,
    pace: Pace,
    mut next: impl FnMut(u64) -> Option<(Vec<u8>, Vec<u8>)>,
) -> Vec<Vec<u8>> {
    let mut acked = Vec::new();
    let Ok(mut conn) = TcpStream::connect(("127.0.0.1", port)).await else {
        return acked;
    };
    if conn
        .write_all(&connect_packet(client.as_bytes()))
        .await
        .is_err()
    {
        return acked;
    }
    let mut connack = [0u8; 4];
    if conn.read_exact(&mut connack).await.is_err() {
        return acked;
    }
    let start = tokio::time::Instant::now();
    let due = |i: u64| match pace.rate {
        Some(r) => start + Duration::from_secs_f64(i as f64 / r),
        None => start,
    };
    let mut in_flight: std::collections::HashMap<u16, Vec<u8>> = Default::default();
    let mut i: u64 = 0;
    let mut ended = false;
    let mut buf = Vec::new();
    loop {
        let mut out = Vec::new();
        while !ended && in_flight.len() < pace.window {
            let now = tokio::time::Instant::now();
            if now >= pace.until {
                ended = true;
                break;
            }
            if due(i) > now {
                break;
            }
            let Some((topic, payload)) = next(i) else {
                ended = true;
                break;
            };
            let pkid = (i % 60_000) as u16 + 1;
            let mut body = Vec::new();
            mqtt_str(&mut body, &topic);
            body.put_u16(pkid);
            body.extend_from_slice(&payload);
            out.extend_from_slice(&packet(0x32, &body));
            in_flight.insert(pkid, payload);
            i += 1;
        }
        if !out.is_empty() && conn.write_all(&out).await.is_err() {
            return acked;
        }
        if ended && in_flight.is_empty() {
            return acked;
        }
        // Wait for acks, or for the next publish to be due.
        let wake = if ended || in_flight.len() >= pace.window {
            tokio::time::Instant::now() + pace.silence
        } else {
            due(i).min(tokio::time::Instant::now() + pace.silence)
        };
        let mut chunk = [0u8; 4096];
        let n = match tokio::time::timeout_at(wake, conn.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => n,
            Ok(_) => return acked,
            Err(_) if !ended && in_flight.len() < pace.window => continue,
            Err(_) => return acked,
        };
        buf.extend_from_slice(&chunk[..n]);
        while buf.len() >= 4 {
            assert_eq!(buf[0], 0x40, "only PUBACKs are expected");
            let pkid = u16::from_be_bytes([buf[2], buf[3]]);
            if let Some(p) = in_flight.remove(&pkid) {
                acked.push(p);
                if let Some(n) = &pace.acks {
                    n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
            buf.drain(..4);
        }
    }
}

/// Subscribes (QoS 1) to `filter` on the test Mosquitto and reads weir
/// batches published there (the MQTT egress's batch mode) until `done`
/// says the records seen are enough, or `PATIENCE` passes. `subscribed`
/// fires once the subscription is in place.
pub async fn read_batches_until(
    filter: &str,
    subscribed: tokio::sync::oneshot::Sender<()>,
    mut done: impl FnMut(&[super::amqp::Seen]) -> bool,
) -> Vec<super::amqp::Seen> {
    let mut o = MqttOptions::new(
        format!("{filter}-reader").replace(['#', '+', '/'], "-"),
        "127.0.0.1",
        MOSQUITTO_PORT,
    );
    o.set_keep_alive(Duration::from_secs(30))
        .set_max_packet_size(1 << 20, 1 << 20);
    let (client, mut events) = AsyncClient::new(o, 100);
    client.subscribe(filter, QoS::AtLeastOnce).await.unwrap();
    let mut subscribed = Some(subscribed);
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !done(&seen) {
        let event = tokio::time::timeout_at(deadline, events.poll())
            .await
            .expect("every record before the patience ran out")
            .expect("the subscriber's connection");
        match event {
            Event::Incoming(Packet::SubAck(_)) => {
                if let Some(s) = subscribed.take() {
                    let _ = s.send(());
                }
            }
            Event::Incoming(Packet::Publish(p)) => {
                let consumed_us = weir::clock::unix_micros();
                let body = &p.payload;
                let encoding = weir_proto::Encoding::sniff(body).as_str();
                let batch =
                    weir_proto::decode_batch(body, encoding, 64 << 20).expect("a weir batch");
                for record in batch.records {
                    seen.push(super::amqp::Seen {
                        record,
                        consumed_us,
                        encoding: encoding.to_owned(),
                        batch_node: batch.node,
                    });
                }
            }
            _ => {}
        }
    }
    seen
}
