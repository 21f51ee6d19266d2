//! weir delivering to a real Kafka broker (scripts/kafka.sh): records in
//! the topic as weir batches; the broker killed with SIGKILL and started
//! again mid-stream with nothing acknowledged lost; spooled classes
//! acknowledging while it is down; a missing topic stopping start-up.
//! The tests that stop the broker take turns (one lock), and no other
//! test binary uses Kafka.

mod common;

use std::collections::HashSet;
use std::process::Stdio;
use std::time::Duration;

use common::kafka::*;
use common::mqtt::MqttClient;
use common::process::*;
use common::*;
use rumqttc::QoS;
use weir::app::App;

/// The broker is stopped by one test at a time.
static BROKER_DOWN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn payloads(seen: &[common::amqp::Seen]) -> HashSet<Vec<u8>> {
    seen.iter().map(|s| s.record.payload.to_vec()).collect()
}

fn assert_all_there(seen: &[common::amqp::Seen], sent: &[String]) {
    let got = payloads(seen);
    for p in sent {
        assert!(
            got.contains(p.as_bytes()),
            "acknowledged record {p} is not in the topic"
        );
    }
    eprintln!(
        "{} records read, {} of them duplicates",
        seen.len(),
        seen.len() - got.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_reach_the_topic_and_survive_a_broker_killed_mid_stream() {
    const RECORDS: usize = 3000;
    let _turn = BROKER_DOWN.lock().await;
    let name = unique("kafka-kill");
    // Three partitions: the node's batches go to one of them (11 mod 3).
    create_topic(&name, 3).await;
    let text = format!(
        "[node]\nid = 11\n[scheduler]\nmax_batch_records = 50\n[ingress.mqtt]\nlisten = \"127.0.0.1:0\"\n[ingress.grpc]\nenabled = false\n{}\nrequest_timeout = \"3s\"\nreconnect_backoff_max = \"1s\"\n",
        kafka_egress(&name)
    );
    let app = App::start(parse_config(&text, "kafka-kill")).await.unwrap();
    let port = app.mqtt_addr.unwrap().port();
    let mut client = MqttClient::connect(port, &format!("{name}-pub")).await;
    let _guard = StartGuard;
    let sent: Vec<String> = (0..RECORDS).map(|i| format!("{name}-r{i}")).collect();
    for (i, p) in sent.iter().enumerate() {
        client
            .publish(&format!("{name}/t"), QoS::AtLeastOnce, p.as_str())
            .await;
        if i == RECORDS / 3 {
            kill_broker();
        }
        if i == RECORDS / 2 {
            // Down for a while with records arriving: weir holds them.
            tokio::time::sleep(DOWN).await;
            tokio::task::spawn_blocking(start_broker).await.unwrap();
        }
        if i % 100 == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    for _ in 0..RECORDS {
        client.next_ack().await;
    }
    let seen = read_until(&name, |s| payloads(s).len() >= RECORDS).await;
    app.shutdown(Duration::from_secs(30)).await;
    assert_all_there(&seen, &sent);
    assert!(
        seen.iter().all(|s| s.batch_node == 11),
        "every batch names its node"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spooled_classes_acknowledge_while_kafka_is_down_and_deliver_after() {
    const RECORDS: usize = 2000;
    let _turn = BROKER_DOWN.lock().await;
    let name = unique("kafka-spool");
    create_topic(&name, 1).await;
    let dir = tmp(&name);
    let (mqtt, admin) = (free_port(), free_port());
    let egress = format!(
        "{}\nrequest_timeout = \"2s\"\nreconnect_backoff_max = \"1s\"",
        kafka_egress(&name)
    );
    let text = spool_config(&dir.join("spool"), mqtt, admin, &egress, "");
    let app = App::start(parse_config(&text, "kafka-spool"))
        .await
        .unwrap();
    let _guard = StartGuard;
    kill_broker();
    // Every record is acknowledged (on disk) with the broker down.
    let mut client = MqttClient::connect(mqtt, &format!("{name}-pub")).await;
    let sent: Vec<String> = (0..RECORDS).map(|i| format!("{name}-r{i}")).collect();
    for (i, p) in sent.iter().enumerate() {
        let topic = if i % 2 == 0 { "ls/a" } else { "lt/b" };
        client.publish(topic, QoS::AtLeastOnce, p.as_str()).await;
    }
    for _ in 0..RECORDS {
        client.next_ack().await;
    }
    tokio::task::spawn_blocking(start_broker).await.unwrap();
    let seen = read_until(&name, |s| payloads(s).len() >= RECORDS).await;
    app.shutdown(Duration::from_secs(30)).await;
    assert_all_there(&seen, &sent);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_topic_stops_start_up_naming_the_key_and_the_topic() {
    let name = unique("kafka-missing");
    let dir = tmp(&name);
    let config = write_config(
        &dir,
        "weir.toml",
        &format!(
            "[ingress.mqtt]\nlisten = \"127.0.0.1:0\"\n[ingress.grpc]\nenabled = false\n{}\n",
            kafka_egress(&name)
        ),
    );
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(WEIR)
            .args(["run", "--config", config.to_str().unwrap()])
            .stdout(Stdio::null())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "exit status; weir said:\n{said}"
    );
    assert!(
        said.contains("egress.kafka.topic"),
        "names the key:\n{said}"
    );
    assert!(said.contains(&name), "names the topic:\n{said}");
    assert!(said.contains("does not exist"), "says why:\n{said}");
    let _ = std::fs::remove_dir_all(&dir);
}
