//! weir delivering to a real Kafka broker (scripts/kafka.sh): records in
//! the topic as weir batches; the broker killed with SIGKILL and started
//! again mid-stream with nothing acknowledged lost; spooled classes
//! acknowledging while it is down; a missing topic stopping start-up;
//! SASL (PLAIN, SCRAM-SHA-512) over TLS, and a wrong password or an
//! untrusted certificate stopping start-up.
//! The tests take turns (one lock): two of them stop the broker, which
//! would fail what the others ask of it meanwhile.

mod common;

use std::collections::HashSet;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::kafka::*;
use common::mqtt::MqttClient;
use common::process::*;
use common::*;
use rumqttc::QoS;
use weir::app::App;

/// One test at a time: two of them stop the broker.
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
    let name = topic_name("kafka-kill");
    // Three partitions: the node's batches go to one of them (11 mod 3).
    create_topic(&name, 3).await;
    // The egress at its defaults (request timeout, reconnect backoff).
    let text = format!(
        "[node]\nid = 11\n[scheduler]\nmax_batch_records = 50\n[ingress.mqtt]\nlisten = \"127.0.0.1:0\"\n[ingress.grpc]\nenabled = false\n{}\n",
        kafka_egress(&name)
    );
    let app = App::start(parse_config(&text, "kafka-kill")).await.unwrap();
    let port = app.mqtt_addr.unwrap().port();
    let mut client = MqttClient::connect(port, &format!("{name}-pub")).await;
    let _guard = StartGuard;
    let sent: Vec<String> = (0..RECORDS).map(|i| format!("{name}-r{i}")).collect();
    let metrics = app.ingress.metrics().clone();
    let mut failover = None;
    for (i, p) in sent.iter().enumerate() {
        client
            .publish(&format!("{name}/t"), QoS::AtLeastOnce, p.as_str())
            .await;
        if i == RECORDS / 3 {
            kill_broker();
            // From when the broker listens again, as a client sees it, to
            // weir's first confirmed batch after that.
            let confirmed = metrics.egress_bytes.clone();
            let killed = Instant::now();
            failover = Some(tokio::spawn(async move {
                // SIGKILL takes a moment: gone, then back.
                while tokio::net::TcpStream::connect(BROKER).await.is_ok() {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                while tokio::net::TcpStream::connect(BROKER).await.is_err() {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                let (up, before) = (Instant::now(), confirmed.get());
                while confirmed.get() == before {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                (up - killed, up.elapsed())
            }));
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
    let (down, resumed) = failover.unwrap().await.unwrap();
    eprintln!(
        "FAILOVER: broker killed, listening again after {:.1} s; first batch confirmed {:.0} ms after that",
        down.as_secs_f64(),
        resumed.as_secs_f64() * 1e3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spooled_classes_acknowledge_while_kafka_is_down_and_deliver_after() {
    const RECORDS: usize = 2000;
    let _turn = BROKER_DOWN.lock().await;
    let name = topic_name("kafka-spool");
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
    let _turn = BROKER_DOWN.lock().await;
    let name = topic_name("kafka-missing");
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

/// `weir consume --kafka` killed with SIGKILL again and again while it
/// reads a topic into a file: every record is in the file once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weir_consume_reads_a_topic_once_across_sigkills() {
    use common::mqtt::{publish_qos1, Pace};
    const N: u64 = 6_000;
    const KILLS: u64 = 12;
    let _turn = BROKER_DOWN.lock().await;
    let name = topic_name("kafka-consume");
    create_topic(&name, 2).await;
    let dir = tmp(&name);
    // The topic, filled by a weir in memory mode with small batches.
    let mqtt = free_port();
    let cfg = write_config(
        &dir,
        "relay.toml",
        &format!(
            "[spool]\ndir = \"{}\"\n[scheduler]\nmax_batch_records = 8\n[ingress.mqtt]\nlisten = \"127.0.0.1:{mqtt}\"\n[ingress.grpc]\nenabled = false\n{}\n",
            dir.join("spool").display(),
            kafka_egress(&name)
        ),
    );
    let mut relay = spawn_weir(&cfg, std::fs::File::create(dir.join("relay.log")).unwrap());
    wait_port(std::net::SocketAddr::from(([127, 0, 0, 1], mqtt))).await;
    let pace = Pace::unpaced(64, tokio::time::Instant::now() + PATIENCE);
    let acked = publish_qos1(mqtt, &name, pace, |i| {
        (i < N).then(|| (b"lt/consume".to_vec(), format!("c-{i}").into_bytes()))
    })
    .await;
    assert_eq!(acked.len() as u64, N);
    sigterm(relay.id());
    assert!(
        relay.wait().unwrap().success(),
        "the relay drained to Kafka"
    );

    let out = dir.join("out.jsonl");
    let state = dir.join("state.json");
    let args = |idle: Option<&str>| {
        let mut a: Vec<String> = [
            "consume",
            "--kafka",
            BROKER,
            "--topic",
            &name,
            "--prefetch",
            "4",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.extend(["--output".into(), out.display().to_string()]);
        a.extend(["--state".into(), state.display().to_string()]);
        if let Some(idle) = idle {
            a.extend(["--idle-exit".into(), idle.into()]);
        }
        a
    };
    let lines = || std::fs::read_to_string(&out).map_or(0, |t| t.lines().count() as u64);
    let mut kills = 0;
    for round in 0..KILLS {
        let before = lines();
        if before == N {
            break;
        }
        let mut child = std::process::Command::new(WEIR)
            .args(args(None))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("consume-{round}.log"))).unwrap())
            .spawn()
            .unwrap();
        // Killed once it is reading (its output grew), at a different
        // point of its reading each round.
        eventually("weir consume reads on", || lines() > before).await;
        tokio::time::sleep(Duration::from_millis(3 * round)).await;
        assert!(
            child.try_wait().unwrap().is_none(),
            "round {round}: weir consume exited early (see consume-{round}.log)"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        kills += 1;
        eprintln!("round {round}: {} lines", lines());
    }
    let before = std::fs::read_to_string(&out).map_or(0, |t| t.lines().count());
    eprintln!("{before} lines in the output before the last run");
    let last = std::process::Command::new(WEIR)
        .args(args(Some("3s")))
        .stdout(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&last.stderr).into_owned();
    assert!(last.status.success(), "the last run: {err}");
    let text = std::fs::read_to_string(&out).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l:?}")))
        .collect();
    let keys = tally(
        lines
            .iter()
            .map(|v| (v["origin"].as_u64().unwrap(), v["seq"].as_u64().unwrap())),
    );
    let twice = keys.values().filter(|&&n| n > 1).count();
    eprintln!(
        "weir consume, {kills} kills: {} records in the output ({twice} twice)",
        keys.len()
    );
    assert!(kills >= 2, "killed while reading at least twice");
    assert_eq!(keys.len() as u64, N, "every record handed on: {err}");
    assert_eq!(twice, 0, "records handed on twice");
    let _ = std::fs::remove_dir_all(&dir);
}

/// weir with `egress` (a whole `[egress]` section) started as a process:
/// its exit status and what it said, once it stopped by itself (or 124
/// from `timeout` if it was still running after a minute).
async fn run_until_it_stops(name: &str, egress: &str) -> (Option<i32>, String) {
    let dir = tmp(name);
    let config = write_config(
        &dir,
        "weir.toml",
        &format!(
            "[ingress.mqtt]\nlisten = \"127.0.0.1:0\"\n[ingress.grpc]\nenabled = false\n{egress}\n"
        ),
    );
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("timeout")
            .args(["60", WEIR, "run", "--config", config.to_str().unwrap()])
            .stdout(Stdio::null())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// SASL over TLS, as Azure Event Hubs (PLAIN) and Amazon MSK or Confluent
/// (SCRAM) are reached: records delivered with each mechanism; a wrong
/// password, or a broker certificate from a CA weir was not given, stops
/// start-up with exit status 2 naming the key to fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sasl_over_tls_delivers_and_a_wrong_password_or_an_untrusted_ca_stops_start_up() {
    let _turn = BROKER_DOWN.lock().await;
    let topic = topic_name("kafka-sasl");
    create_topic(&topic, 1).await;
    let ca = tls_file("ca.pem");
    assert!(ca.exists(), "{} (run scripts/services.sh)", ca.display());
    let egress = |mechanism: &str, password: &str, ca_line: &str| {
        format!(
            "[egress]\nkind = \"kafka\"\n[egress.kafka]\nbrokers = [\"{SASL_BROKER}\"]\ntopic = \"{topic}\"\ntls = true\n{ca_line}sasl_mechanism = \"{mechanism}\"\nusername = \"weir\"\npassword = \"{password}\"\n"
        )
    };
    let with_ca = format!("ca_file = \"{}\"\n", ca.display());

    let (status, said) =
        run_until_it_stops(&topic, &egress("scram-sha-512", "wrong", &with_ca)).await;
    assert_eq!(status, Some(2), "a wrong password; weir said:\n{said}");
    assert!(
        said.contains("egress.kafka.username"),
        "names the key:\n{said}"
    );
    let (status, said) = run_until_it_stops(&topic, &egress("plain", "weir-secret", "")).await;
    assert_eq!(status, Some(2), "an untrusted CA; weir said:\n{said}");
    assert!(
        said.contains("egress.kafka.ca_file"),
        "names the key:\n{said}"
    );

    let mut sent = Vec::new();
    for mechanism in ["scram-sha-256", "scram-sha-512", "plain"] {
        let text = format!(
            "[ingress.mqtt]\nlisten = \"127.0.0.1:0\"\n[ingress.grpc]\nenabled = false\n{}",
            egress(mechanism, "weir-secret", &with_ca)
        );
        let app = App::start(parse_config(&text, "kafka-sasl")).await.unwrap();
        let mut client = MqttClient::connect(
            app.mqtt_addr.unwrap().port(),
            &format!("{topic}-{mechanism}"),
        )
        .await;
        let mine: Vec<(String, Vec<u8>)> = (0..300)
            .map(|i| (format!("dev/{i}"), format!("{mechanism}-{i}").into_bytes()))
            .collect();
        client.publish_confirmed(&mine).await;
        app.shutdown(Duration::from_secs(30)).await;
        sent.extend(mine.into_iter().map(|(_, p)| String::from_utf8(p).unwrap()));
    }
    let seen = read_until(&topic, |seen| payloads(seen).len() >= sent.len()).await;
    assert_all_there(&seen, &sent);
}

/// TLS with a client certificate, as Amazon MSK's TLS authentication takes
/// it: records delivered; a certificate from a CA the brokers do not
/// trust, or none where they ask for one, stops start-up with exit status
/// 2 naming `egress.kafka.cert_file`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_delivers_and_one_from_another_ca_stops_start_up() {
    let _turn = BROKER_DOWN.lock().await;
    let topic = topic_name("kafka-mtls");
    create_topic(&topic, 1).await;
    let file = |name: &str| {
        let f = tls_file(name);
        assert!(f.exists(), "{} (run scripts/services.sh)", f.display());
        f.display().to_string()
    };
    let egress = |client: Option<&str>| {
        let identity = client.map_or(String::new(), |c| {
            format!(
                "cert_file = \"{}\"\nkey_file = \"{}\"\n",
                file(&format!("{c}.pem")),
                file(&format!("{c}.key"))
            )
        });
        format!(
            "[egress]\nkind = \"kafka\"\n[egress.kafka]\nbrokers = [\"{TLS_BROKER}\"]\ntopic = \"{topic}\"\nca_file = \"{}\"\n{identity}",
            file("ca.pem")
        )
    };

    for (client, why) in [
        (Some("other-client"), "a certificate from another CA"),
        (None, "no certificate"),
    ] {
        let (status, said) = run_until_it_stops(&topic, &egress(client)).await;
        assert_eq!(status, Some(2), "{why}; weir said:\n{said}");
        assert!(
            said.contains("egress.kafka.cert_file"),
            "{why}: names the key:\n{said}"
        );
    }

    let text = format!(
        "[ingress.mqtt]\nlisten = \"127.0.0.1:0\"\n[ingress.grpc]\nenabled = false\n{}",
        egress(Some("client"))
    );
    let app = App::start(parse_config(&text, "kafka-mtls")).await.unwrap();
    let mut client = MqttClient::connect(app.mqtt_addr.unwrap().port(), &topic).await;
    let mine: Vec<(String, Vec<u8>)> = (0..300)
        .map(|i| (format!("dev/{i}"), format!("mtls-{i}").into_bytes()))
        .collect();
    client.publish_confirmed(&mine).await;
    app.shutdown(Duration::from_secs(30)).await;
    let sent: Vec<String> = mine
        .into_iter()
        .map(|(_, p)| String::from_utf8(p).unwrap())
        .collect();
    let seen = read_until(&topic, |seen| payloads(seen).len() >= sent.len()).await;
    assert_all_there(&seen, &sent);
}
