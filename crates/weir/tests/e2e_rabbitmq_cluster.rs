//! weir against a three-node RabbitMQ cluster (`scripts/rabbitmq-cluster.sh`
//! starts it beside the test broker: AMQP on 127.0.0.1:5701-5703) with a
//! quorum queue, under MQTT QoS 1 load:
//!
//! 1. the node weir is connected to is stopped: weir fails over to another
//!    endpoint of `egress.amqp.urls`, every acknowledged record arrives
//!    (`weir consume` deduplicates), and the time from the stop to the
//!    first confirm on another node is printed;
//! 2. a memory alarm (`rabbitmqctl set_vm_memory_high_watermark`): weir
//!    stops publishing, the devices feel back-pressure (PUBACKs stop),
//!    `/metrics` shows the block and the broker's reason, nothing is lost,
//!    and publishing resumes when the alarm clears;
//! 3. the same alarm with `durability = "spool"` classes: the spool takes
//!    the records (PUBACKs go on while RabbitMQ blocks), nothing is lost.
//!
//! One test, in a binary of its own: the alarm blocks the whole cluster.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir::app::App;

use common::mqtt::MqttClient;
use common::process::{metric, parse_config, run_script, scrape, WEIR};
use common::{logs, tmp, unique, PATIENCE};

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../scripts/rabbitmq-cluster.sh"
);

const NODES: [(&str, u16); 3] = [("a", 5701), ("b", 5702), ("c", 5703)];

fn url(port: u16) -> String {
    format!("amqp://guest:guest@127.0.0.1:{port}/%2f")
}

fn cluster(args: &[&str]) {
    run_script("rabbitmq-cluster.sh", args);
}

/// Clears the alarm and stops the cluster, even when the test fails.
struct ClusterGuard;

impl Drop for ClusterGuard {
    fn drop(&mut self) {
        // WEIR_KEEP_CLUSTER=1 leaves it running, to look at after a failure.
        if std::env::var_os("WEIR_KEEP_CLUSTER").is_some() {
            return;
        }
        let _ = Command::new("bash").arg(SCRIPT).arg("stop").status();
    }
}

/// weir with the three nodes as endpoints, a quorum queue, MQTT and the
/// admin listener on free ports; `classes` holds extra class keys.
fn config(name: &str, node: u64, classes: &str, extra: &str) -> weir::config::Config {
    let urls: Vec<String> = NODES
        .iter()
        .map(|(_, p)| format!("\"{}\"", url(*p)))
        .collect();
    let text = format!(
        "[node]\nid = {node}\n[scheduler]\nuplink = \"1Gbit/s\"\nmax_batch_records = 100\n\
         [[class]]\nname = \"ls\"\nbound = \"100ms\"\n{classes}\n[[class]]\nname = \"lt\"\nbound = \"1s\"\n{classes}\n\
         [classify]\ndefault_class = \"lt\"\n[[classify.route]]\nmqtt = \"ls/#\"\nclass = \"ls\"\n\
         [ingress.mqtt]\nlisten = \"127.0.0.1:0\"\n[ingress.grpc]\nenabled = false\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n{extra}\n\
         [egress]\nkind = \"amqp\"\n[egress.amqp]\nurls = [{}]\nexchange = \"{name}.x\"\nqueue = \"{name}.q\"\nrouting_key = \"{name}\"\nqueue_type = \"quorum\"\nconfirm_timeout = \"3s\"\nconnect_timeout = \"3s\"\nreconnect_backoff_max = \"1s\"\n",
        urls.join(", ")
    );
    parse_config(&text, name)
}

/// A device publishing `n` records at QoS 1, 50 at a time about every
/// `pause`, counting PUBACKs into `acked`.
fn load(
    port: u16,
    name: &str,
    n: usize,
    pause: Duration,
    acked: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    let name = name.to_owned();
    tokio::spawn(async move {
        let mut client = MqttClient::connect(port, &format!("{name}-dev")).await;
        for start in (0..n).step_by(50) {
            let end = (start + 50).min(n);
            for i in start..end {
                let topic = if i % 10 == 0 { "ls/x" } else { "lt/y" };
                client
                    .publish(topic, rumqttc::QoS::AtLeastOnce, format!("{name}-{i}"))
                    .await;
            }
            for _ in start..end {
                // No timeout here: under the alarm PUBACKs wait.
                if client.acks.recv().await.is_none() {
                    panic!("the device's connection ended");
                }
                acked.fetch_add(1, Ordering::Relaxed);
            }
            tokio::time::sleep(pause).await;
        }
    })
}

async fn metrics(admin: SocketAddr) -> String {
    scrape(admin).await.expect("scrape /metrics")
}

/// Every record in `queue` via `weir consume` from the node on `port`:
/// the payloads, and the summary line.
fn consume_all(port: u16, queue: &str, name: &str) -> (BTreeSet<String>, usize, String) {
    let out = tmp(&format!("{name}-out")).join("out.jsonl");
    let run = Command::new(WEIR)
        .args([
            "consume",
            "--url",
            &url(port),
            "--queue",
            queue,
            "--output",
            out.to_str().unwrap(),
            "--payload",
            "text",
            "--idle-exit",
            "3s",
        ])
        .output()
        .expect("run weir consume");
    let err = String::from_utf8_lossy(&run.stderr).into_owned();
    assert!(run.status.success(), "weir consume: {err}");
    let text = std::fs::read_to_string(&out).unwrap();
    let mut payloads = BTreeSet::new();
    let mut lines = 0;
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        payloads.insert(v["payload"].as_str().unwrap().to_owned());
        lines += 1;
    }
    (payloads, lines, err)
}

fn expected(name: &str, n: usize) -> BTreeSet<String> {
    (0..n).map(|i| format!("{name}-{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_node_lost_and_a_memory_alarm_lose_nothing() {
    logs();
    cluster(&["start"]);
    let _guard = ClusterGuard;

    // ---- 1. The node in use stops. ----
    let name = unique("cluster-failover");
    let app = App::start(config(&name, 41, "", ""))
        .await
        .expect("weir starts");
    let admin = app.admin_addr.unwrap();
    const N: usize = 6000;
    let acked = Arc::new(AtomicUsize::new(0));
    let device = load(
        app.mqtt_addr.unwrap().port(),
        &name,
        N,
        Duration::from_millis(40),
        Arc::clone(&acked),
    );
    let give_up = Instant::now() + PATIENCE;
    while acked.load(Ordering::Relaxed) < N / 4 {
        assert!(Instant::now() < give_up, "no progress before the stop");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let text = metrics(admin).await;
    let (in_use, port) = NODES
        .iter()
        .find(|(_, p)| {
            text.contains(&format!(
                "weir_egress_amqp_endpoint{{endpoint=\"amqp://guest@127.0.0.1:{p}/%2f\"}} 1"
            ))
        })
        .copied()
        .expect("one endpoint in use");
    let stopped_at = Instant::now();
    cluster(&["stop-node", in_use]);
    let stop_took = stopped_at.elapsed();
    // The node is down once `rabbitmqctl stop` returns: any confirm after
    // this is another node's.
    let confirmed_before = metric(&metrics(admin).await, "weir_batches_confirmed_total");
    let failover = loop {
        let text = metrics(admin).await;
        if metric(&text, "weir_egress_amqp_failovers_total") >= 1.0
            && metric(&text, "weir_batches_confirmed_total") > confirmed_before
        {
            break stopped_at.elapsed();
        }
        assert!(
            Instant::now() < give_up,
            "no failover after stopping {in_use}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    tokio::time::timeout(PATIENCE, device)
        .await
        .expect("every record acknowledged after the failover")
        .expect("the device did not panic");
    let text = metrics(admin).await;
    let republished = metric(&text, "weir_batches_republished_total");
    let _ = app.shutdown(PATIENCE).await;
    let survivor = NODES.iter().find(|(n, _)| *n != in_use).unwrap().1;
    let (payloads, lines, summary) = consume_all(survivor, &format!("{name}.q"), &name);
    assert_eq!(
        payloads,
        expected(&name, N),
        "every acknowledged record arrived (node {in_use} on {port} stopped)"
    );
    assert_eq!(lines, N, "handed on once each: {summary}");
    eprintln!(
        "FAILOVER: node weir-{in_use} stopped (rabbitmqctl stop took {stop_took:?}); first confirm on another node {failover:?} after the stop began; {republished} batches re-published; lost 0; {summary}"
    );
    cluster(&["start-node", in_use]);

    // ---- 2. A memory alarm under load. ----
    let name = unique("cluster-alarm");
    let app = App::start(config(&name, 42, "capacity_records = 400", ""))
        .await
        .expect("weir starts");
    let admin = app.admin_addr.unwrap();
    const M: usize = 4000;
    let acked = Arc::new(AtomicUsize::new(0));
    let device = load(
        app.mqtt_addr.unwrap().port(),
        &name,
        M,
        Duration::from_millis(25),
        Arc::clone(&acked),
    );
    while acked.load(Ordering::Relaxed) < M / 5 {
        assert!(
            Instant::now() < give_up + PATIENCE,
            "no progress before the alarm"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cluster(&["ctl", "a", "set_vm_memory_high_watermark", "0.000001"]);
    let alarm_at = Instant::now();
    loop {
        let text = metrics(admin).await;
        if metric(&text, "weir_egress_amqp_blocked") == 1.0 {
            break;
        }
        assert!(
            alarm_at.elapsed() < PATIENCE,
            "RabbitMQ never blocked weir's connection"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The queues fill and the device stops getting PUBACKs: a push finds
    // its class queue full and waits, holding the device's connection.
    while metric(&metrics(admin).await, "weir_records_backpressured_total") == 0.0 {
        assert!(
            alarm_at.elapsed() < PATIENCE,
            "the queues never filled under the alarm"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stalled = acked.load(Ordering::Relaxed);
    assert!(stalled < M, "the device was held back before the end");
    let text = metrics(admin).await;
    assert!(
        text.contains("weir_egress_amqp_blocks_total{reason=\"low on memory\"} 1"),
        "the broker's reason: {}",
        text.lines()
            .filter(|l| l.contains("amqp_block"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let held = alarm_at.elapsed();
    cluster(&["ctl", "a", "set_vm_memory_high_watermark", "0.4"]);
    tokio::time::timeout(PATIENCE, device)
        .await
        .expect("every record acknowledged once the alarm cleared")
        .expect("the device did not panic");
    let text = metrics(admin).await;
    assert_eq!(metric(&text, "weir_egress_amqp_blocked"), 0.0);
    let blocked_for = metric(&text, "weir_egress_amqp_blocked_seconds");
    assert!(
        blocked_for > 0.0,
        "the time blocked is counted: {blocked_for} s"
    );
    assert_eq!(
        metric(&text, "weir_egress_amqp_failovers_total"),
        0.0,
        "a short alarm is waited out where it is"
    );
    let _ = app.shutdown(PATIENCE).await;
    let (payloads, _, summary) = consume_all(5701, &format!("{name}.q"), &name);
    assert_eq!(payloads, expected(&name, M), "nothing lost: {summary}");
    eprintln!(
        "ALARM: device held at {stalled} of {M} PUBACKs; alarm held {held:?}; weir blocked {blocked_for:.1} s; lost 0; {summary}"
    );

    // ---- 3. The same alarm with spooled classes: the spool absorbs it. ----
    let name = unique("cluster-alarm-spool");
    let spool = tmp(&format!("{name}-spool"));
    let app = App::start(config(
        &name,
        43,
        "capacity_records = 400\ndurability = \"spool\"",
        &format!("[spool]\ndir = \"{}\"", spool.display()),
    ))
    .await
    .expect("weir starts");
    let admin = app.admin_addr.unwrap();
    let acked = Arc::new(AtomicUsize::new(0));
    let device = load(
        app.mqtt_addr.unwrap().port(),
        &name,
        M,
        Duration::from_millis(25),
        Arc::clone(&acked),
    );
    while acked.load(Ordering::Relaxed) < M / 5 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cluster(&["ctl", "a", "set_vm_memory_high_watermark", "0.000001"]);
    let alarm_at = Instant::now();
    while metric(&metrics(admin).await, "weir_egress_amqp_blocked") != 1.0 {
        assert!(alarm_at.elapsed() < PATIENCE, "never blocked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Blocked, and the device is still acknowledged: the records go to
    // disk, not into the full queues. Every one of them, while the broker
    // still blocks.
    let at_block = acked.load(Ordering::Relaxed);
    while acked.load(Ordering::Relaxed) < M {
        assert!(
            alarm_at.elapsed() < PATIENCE,
            "the spool stopped acknowledging while RabbitMQ blocked ({} of {M})",
            acked.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let text = metrics(admin).await;
    assert_eq!(
        metric(&text, "weir_egress_amqp_blocked"),
        1.0,
        "still blocked"
    );
    let during = M - at_block;
    assert!(
        during > 0,
        "the device was done before RabbitMQ blocked: nothing shown"
    );
    cluster(&["ctl", "a", "set_vm_memory_high_watermark", "0.4"]);
    tokio::time::timeout(PATIENCE, device)
        .await
        .expect("every record acknowledged")
        .expect("the device did not panic");
    // The spool still holds what it took during the alarm; a shutdown now
    // would keep it on disk for the next start (by design), so wait until
    // it has gone out.
    let drain_from = Instant::now();
    while metric(&metrics(admin).await, "weir_spool_records") > 0.0 {
        assert!(
            drain_from.elapsed() < PATIENCE,
            "the spool never drained after the alarm cleared"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = app.shutdown(PATIENCE).await;
    let (payloads, _, summary) = consume_all(5701, &format!("{name}.q"), &name);
    assert_eq!(payloads, expected(&name, M), "nothing lost: {summary}");
    eprintln!("ALARM WITH SPOOL: {during} PUBACKs while blocked; lost 0; {summary}");
}
