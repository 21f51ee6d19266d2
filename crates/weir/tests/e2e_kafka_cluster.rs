//! weir against a three-node Kafka cluster (`scripts/kafka-cluster.sh`
//! starts it beside the single test broker: 127.0.0.1:9191, 9291, 9391),
//! a topic of replication factor 3 with `min.insync.replicas = 2`, under
//! MQTT QoS 1 load: the node leading the topic's partition is killed with
//! SIGKILL mid-stream. weir, given all three as `brokers`, finds the new
//! leader and goes on; every acknowledged record is in the topic, and the
//! time from the kill to weir's first confirm after it is printed.
//!
//! In a binary of its own: three JVMs on the test machine's two cores.

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::kafka::*;
use common::mqtt::MqttClient;
use common::process::{parse_config, run_script};
use rumqttc::QoS;
use weir::app::App;

const CLUSTER: [&str; 3] = ["127.0.0.1:9191", "127.0.0.1:9291", "127.0.0.1:9391"];

fn cluster(args: &[&str]) -> String {
    run_script("kafka-cluster.sh", args)
}

/// Stops the cluster (and deletes its data) even when the test fails: three
/// JVMs are too much to leave beside the other tests.
struct ClusterGuard;

impl Drop for ClusterGuard {
    fn drop(&mut self) {
        let _ = std::panic::catch_unwind(|| cluster(&["stop"]));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_partition_leader_killed_mid_stream_loses_no_acknowledged_record() {
    const RECORDS: usize = 3000;
    tokio::task::spawn_blocking(|| cluster(&["start"]))
        .await
        .unwrap();
    let _guard = ClusterGuard;
    let name = topic_name("kafka-cluster");
    client_at(&CLUSTER)
        .await
        .controller_client()
        .unwrap()
        .create_topic(&name, 1, 3, 10_000)
        .await
        .unwrap_or_else(|e| panic!("creating topic {name}: {e}"));
    // The controller answers before every broker has the topic in its
    // metadata; weir asks one of them at start-up and refuses a topic it
    // does not know. Wait until each broker lists it.
    for broker in CLUSTER {
        let deadline = Instant::now() + common::PATIENCE;
        loop {
            let known = client_at(&[broker])
                .await
                .list_topics()
                .await
                .is_ok_and(|topics| topics.iter().any(|t| t.name == name));
            if known {
                break;
            }
            assert!(Instant::now() < deadline, "{broker} never listed {name}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let brokers = CLUSTER.map(|b| format!("\"{b}\"")).join(", ");
    let text = format!(
        "[node]\nid = 12\n[scheduler]\nmax_batch_records = 50\n[ingress.mqtt]\nlisten = \"127.0.0.1:0\"\n[ingress.grpc]\nenabled = false\n\
         [egress]\nkind = \"kafka\"\n[egress.kafka]\nbrokers = [{brokers}]\ntopic = \"{name}\"\n"
    );
    let app = App::start(parse_config(&text, "kafka-cluster"))
        .await
        .unwrap();
    let port = app.mqtt_addr.unwrap().port();
    let mut client = MqttClient::connect(port, &format!("{name}-pub")).await;
    let metrics = app.ingress.metrics().clone();
    let sent: Vec<String> = (0..RECORDS).map(|i| format!("{name}-r{i}")).collect();
    let mut failover = None;
    let mut killed_node = String::new();
    for (i, p) in sent.iter().enumerate() {
        client
            .publish(&format!("{name}/t"), QoS::AtLeastOnce, p.as_str())
            .await;
        if i == RECORDS / 3 {
            let topic = name.clone();
            killed_node = tokio::task::spawn_blocking(move || cluster(&["leader", &topic]))
                .await
                .unwrap();
            assert!(
                ["1", "2", "3"].contains(&killed_node.as_str()),
                "the partition has a leader: {killed_node:?}"
            );
            let confirmed = metrics.egress_bytes.clone();
            let before = confirmed.get();
            let node = killed_node.clone();
            let target = node.clone();
            tokio::task::spawn_blocking(move || cluster(&["kill-node", &target]))
                .await
                .unwrap();
            let killed = Instant::now();
            // Wall-clock time, to set beside the brokers' logs.
            eprintln!(
                "KILLED node {node} at unix {:.3} s",
                weir::clock::unix_micros() as f64 / 1e6
            );
            failover = Some(tokio::spawn(async move {
                // A batch confirmed just before the kill may still be counted.
                tokio::time::sleep(Duration::from_millis(200)).await;
                let before = confirmed.get().max(before);
                while confirmed.get() == before {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                killed.elapsed()
            }));
        }
        if i % 100 == 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    for _ in 0..RECORDS {
        client.next_ack().await;
    }
    let survivors: Vec<&str> = CLUSTER
        .iter()
        .copied()
        .filter(|b| !b.contains(&format!(":9{killed_node}91")))
        .collect();
    let seen = read_until_at(&survivors, &name, |s| {
        s.iter()
            .map(|s| s.record.payload.to_vec())
            .collect::<HashSet<_>>()
            .len()
            >= RECORDS
    })
    .await;
    let resumed = failover.unwrap().await.unwrap();
    app.shutdown(Duration::from_secs(30)).await;
    let got: HashSet<Vec<u8>> = seen.iter().map(|s| s.record.payload.to_vec()).collect();
    let lost: Vec<&String> = sent
        .iter()
        .filter(|p| !got.contains(p.as_bytes()))
        .collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged records are not in the topic, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(3)]
    );
    let topic = name.clone();
    let leader = tokio::task::spawn_blocking(move || cluster(&["leader", &topic]))
        .await
        .unwrap();
    assert_ne!(leader, killed_node, "another node leads the partition");
    eprintln!(
        "FAILOVER: leader {killed_node} killed, node {leader} leads; first batch confirmed {:.0} ms after the kill; {} records read, {} duplicates",
        resumed.as_secs_f64() * 1e3,
        seen.len(),
        seen.len() - got.len()
    );
}
