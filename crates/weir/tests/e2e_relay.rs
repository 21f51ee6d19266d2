//! End to end against the real brokers: records of three classes over MQTT
//! (listen mode and subscribe mode through Mosquitto) and gRPC go through a
//! real weir into RabbitMQ, and a consumer checks that every record arrives
//! exactly once with identical bytes and its origin and sequence intact.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::amqp::*;
use common::mqtt::{require_mosquitto, MqttClient, MOSQUITTO, MOSQUITTO_PORT};
use common::process::parse_config;
use common::*;
use rumqttc::QoS;
use weir::app::App;
use weir_proto::pb::ingress_client::IngressClient;
use weir_proto::pb::PublishRequest;

const PER_SOURCE: usize = 100;

fn payload(tag: &str, i: usize) -> Bytes {
    // Every byte value appears, and the tag makes each payload unique.
    let mut p = format!("{tag}#{i}#").into_bytes();
    p.extend((0..=255u8).map(|b| b.wrapping_add(i as u8)));
    Bytes::from(p)
}

fn config(test: &str, mqtt: &str) -> weir::config::Config {
    let name = unique(test);
    let amqp = amqp_egress(&name);
    let text = format!(
        r#"
[node]
id = 7
[classify]
default_class = "lt"
[[classify.route]]
mqtt = "{name}/ls/#"
class = "ls"
[[classify.route]]
mqtt = "{name}/nm/+"
class = "nm"
[[classify.route]]
grpc = "ls-stream"
class = "ls"
[[classify.route]]
grpc = "nm-stream"
class = "nm"
[scheduler]
uplink = "1Gbit/s"
{mqtt}
[ingress.grpc]
listen = "127.0.0.1:0"
{amqp}
"#
    );
    parse_config(&text, test)
}

/// Publishes `PER_SOURCE` QoS 1 records on each of `topics` (topic,
/// payload tag); returns how many PUBACKs came back.
async fn mqtt_publish(port: u16, client_id: &str, topics: &[(String, String)]) -> usize {
    let mut client = MqttClient::connect(port, client_id).await;
    for i in 0..PER_SOURCE {
        for (topic, tag) in topics {
            client
                .publish(topic, QoS::AtLeastOnce, payload(tag, i))
                .await;
        }
    }
    let mut acks = 0;
    while acks < topics.len() * PER_SOURCE {
        client.next_ack().await;
        acks += 1;
    }
    let _ = client.client.disconnect().await;
    acks
}

/// Publishes `PER_SOURCE` QoS 1 records on a topic of each class (routed
/// by `config`) to the broker on `port`, checks every one was acknowledged,
/// and returns the (payload tag, class) pairs to expect.
async fn mqtt_publish_three_classes(port: u16, name: &str, prefix: &str) -> Vec<(String, String)> {
    let topics = [
        (format!("{name}/ls/a"), "ls"),
        (format!("{name}/nm/b"), "nm"),
        (format!("{name}/other"), "lt"),
    ];
    let tagged: Vec<(String, String)> = topics
        .iter()
        .map(|(t, _)| (t.clone(), format!("{prefix}-{t}")))
        .collect();
    let acks = mqtt_publish(port, &format!("{name}-pub"), &tagged).await;
    assert_eq!(acks, topics.len() * PER_SOURCE);
    tagged
        .into_iter()
        .zip(topics)
        .map(|((_, tag), (_, class))| (tag, class.to_string()))
        .collect()
}

async fn grpc_publish(addr: std::net::SocketAddr) -> Vec<(String, String)> {
    let mut client = IngressClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let streams = [("ls-stream", "ls"), ("nm-stream", "nm"), ("other", "lt")];
    for i in 0..PER_SOURCE {
        for (stream, class) in streams {
            let ack = client
                .publish(PublishRequest {
                    stream: stream.into(),
                    payload: payload(&format!("grpc-{stream}"), i),
                    id: i as u64,
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(ack.id, i as u64);
            assert_eq!(ack.class, class);
        }
    }
    streams
        .iter()
        .map(|(s, c)| (format!("grpc-{s}"), c.to_string()))
        .collect()
}

/// Checks that every expected (tag, i) payload arrived exactly once in its
/// class with origin 7 and a unique sequence number.
fn check(seen: &[Seen], expected: &[(String, String)]) {
    let mut by_payload: HashMap<Bytes, Vec<&Seen>> = HashMap::new();
    for s in seen {
        by_payload
            .entry(s.record.payload.clone())
            .or_default()
            .push(s);
    }
    for (tag, class) in expected {
        for i in 0..PER_SOURCE {
            let p = payload(tag, i);
            let hits = by_payload.get(&p).map(Vec::as_slice).unwrap_or(&[]);
            assert_eq!(hits.len(), 1, "{tag}#{i} arrived {} times", hits.len());
            assert_eq!(&hits[0].record.class, class, "{tag}#{i} class");
            assert_eq!(hits[0].record.origin, 7);
        }
    }
    let seqs: HashSet<u64> = seen.iter().map(|s| s.record.seq).collect();
    assert_eq!(seqs.len(), seen.len(), "sequence numbers are unique");
    assert_eq!(seen.len(), expected.len() * PER_SOURCE, "no extra records");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_listen_and_grpc_three_classes_reach_rabbitmq_exactly_once() {
    let test = "listen";
    let name = unique(test);
    delete_queue(&format!("{name}.q")).await;
    let app = App::start(config(
        test,
        "[ingress.mqtt]\nmode = \"listen\"\nlisten = \"127.0.0.1:0\"",
    ))
    .await
    .unwrap();
    let mqtt = app.mqtt_addr.unwrap();
    let grpc = app.grpc_addr.unwrap();

    let mut expected = mqtt_publish_three_classes(mqtt.port(), &name, "mqtt").await;
    expected.extend(grpc_publish(grpc).await);

    let total = expected.len() * PER_SOURCE;
    let all = consume_until(&format!("{name}.q"), |s| s.len() >= total).await;
    app.shutdown(Duration::from_secs(30)).await;
    check(&all, &expected);
    for s in &all {
        assert!(
            ["identity", "gzip", "zstd"].contains(&s.encoding.as_str()),
            "unknown content encoding {}",
            s.encoding
        );
    }
    delete_queue(&format!("{name}.q")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_subscribe_mode_through_mosquitto_reaches_rabbitmq_exactly_once() {
    require_mosquitto().await;
    let test = "subscribe";
    let name = unique(test);
    let queue = format!("{name}.q");
    delete_queue(&queue).await;
    let app = App::start(config(
        test,
        &format!(
            "[ingress.mqtt]\nmode = \"subscribe\"\nbroker = \"{MOSQUITTO}\"\nclient_id = \"{name}-weir\"\ntopics = [\"{name}/#\"]\nqos = 1"
        ),
    ))
    .await
    .unwrap();

    // weir's SUBSCRIBE takes effect some time after it starts, and a
    // publish before that reaches nobody: probe (QoS 0, on a topic of its
    // own, relayed to `lt` like any other) until one reaches RabbitMQ.
    let probe = format!("{name}/probe");
    let is_probe = {
        let probe = probe.clone();
        move |s: &Seen| s.record.key == probe
    };
    let total = 3 * PER_SOURCE;
    let subscribed = Arc::new(AtomicBool::new(false));
    let consumer = tokio::spawn({
        let (queue, subscribed, is_probe) =
            (queue.clone(), Arc::clone(&subscribed), is_probe.clone());
        async move {
            consume_until(&queue, |s| {
                let probes = s.iter().filter(|s| is_probe(s)).count();
                if probes > 0 {
                    subscribed.store(true, Ordering::Release);
                }
                s.len() - probes >= total
            })
            .await
        }
    });
    let prober = MqttClient::connect(MOSQUITTO_PORT, &format!("{name}-probe")).await;
    let (prober, subscribed, probe) = (&prober, &subscribed, &probe);
    eventually_async("weir's subscription to relay a probe", move || async move {
        if !subscribed.load(Ordering::Acquire) {
            prober.publish(probe, QoS::AtMostOnce, "probe").await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        subscribed.load(Ordering::Acquire)
    })
    .await;

    let expected = mqtt_publish_three_classes(MOSQUITTO_PORT, &name, "sub").await;
    assert_eq!(expected.len() * PER_SOURCE, total);
    let all = consumer.await.unwrap();
    app.shutdown(Duration::from_secs(30)).await;
    // Probes are not the test's records (late ones may trail in).
    let all: Vec<Seen> = all.into_iter().filter(|s| !is_probe(s)).collect();
    check(&all, &expected);
    delete_queue(&queue).await;
}
