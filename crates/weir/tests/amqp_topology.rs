//! The cloud side against the real RabbitMQ on 127.0.0.1:5672: queue types
//! (quorum, stream), a queue declared with another type (start-up stops,
//! exit 2), the routing key template, and `weir consume` (deduplication,
//! a stream resumed from its stored offset after `kill -9`, no record
//! handed on twice).

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, ExchangeDeleteOptions,
    QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::BasicProperties;
use weir::app::App;
use weir_core::scheduler::OutBatch;
use weir_core::{ClassId, ClassSet, Record};

use common::amqp::{connect_test_client, delete_queue, AMQP_URL};
use common::mqtt::MqttClient;
use common::process::{parse_config, write_config, WEIR};
use common::{logs, tmp, unique, PATIENCE};

/// Declares `queue` with `x-queue-type` = `kind` (none for `None`).
async fn declare(queue: &str, kind: Option<&str>) {
    let conn = connect_test_client().await;
    let ch = conn.create_channel().await.unwrap();
    let mut args = FieldTable::default();
    if let Some(kind) = kind {
        args.insert("x-queue-type".into(), AMQPValue::LongString(kind.into()));
    }
    ch.queue_declare(queue.into(), QueueDeclareOptions::durable(), args)
        .await
        .unwrap_or_else(|e| panic!("declaring {queue} as {kind:?}: {e}"));
    let _ = conn.close(200, "done".into()).await;
}

/// The `[egress]` of a test: exchange `<name>.x`, queue `<name>.q`.
fn egress(name: &str, extra: &str) -> String {
    format!(
        "[egress]\nkind = \"amqp\"\n[egress.amqp]\nurl = \"{AMQP_URL}\"\nexchange = \"{name}.x\"\nqueue = \"{name}.q\"\nrouting_key = \"{name}\"\n{extra}\n"
    )
}

/// A weir with MQTT on a free port, classes `ls` (topics `ls/#`) and `lt`.
fn relay_config(node: u64, egress: &str) -> String {
    format!(
        "[node]\nid = {node}\n[scheduler]\nuplink = \"1Gbit/s\"\n\
         [[class]]\nname = \"ls\"\nbound = \"100ms\"\n[[class]]\nname = \"lt\"\nbound = \"1s\"\n\
         [classify]\ndefault_class = \"lt\"\n[[classify.route]]\nmqtt = \"ls/#\"\nclass = \"ls\"\n\
         [ingress.mqtt]\nlisten = \"127.0.0.1:0\"\n[ingress.grpc]\nenabled = false\n{egress}"
    )
}

/// Runs `weir run` on `config` to its exit; the exit code and stderr.
fn run_to_exit(config: &Path) -> (Option<i32>, String) {
    let mut child = Command::new(WEIR)
        .args(["run", "--config", config.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start weir");
    let give_up = std::time::Instant::now() + PATIENCE;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (status.code(), err);
        }
        if std::time::Instant::now() > give_up {
            let _ = child.kill();
            panic!("weir kept running with a queue RabbitMQ refuses");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test]
async fn a_queue_of_another_type_stops_start_up_with_both_settings_named() {
    // A queue declared without a type is classic; RabbitMQ calls its type
    // "none", and weir's error says "classic".
    for (declared, configured) in [
        (Some("quorum"), "classic"),
        (Some("classic"), "quorum"),
        (None, "quorum"),
    ] {
        let existing = declared.unwrap_or("classic");
        let name = unique(&format!("mismatch-{}", declared.unwrap_or("untyped")));
        let queue = format!("{name}.q");
        delete_queue(&queue).await;
        declare(&queue, declared).await;
        let dir = tmp(&name);
        let config = write_config(
            &dir,
            "weir.toml",
            &relay_config(
                31,
                &egress(&name, &format!("queue_type = \"{configured}\"")),
            ),
        );
        let (code, err) = tokio::task::spawn_blocking(move || run_to_exit(&config))
            .await
            .unwrap();
        assert_eq!(code, Some(2), "a config problem: exit 2\n{err}");
        assert!(
            err.contains("egress.amqp.queue_type")
                && err.contains(&format!("`{queue}`"))
                && err.contains(&format!("queue_type = \"{configured}\""))
                && err.contains(existing)
                && err.contains("PRECONDITION_FAILED"),
            "the error names the key, the queue and both settings:\n{err}"
        );
        delete_queue(&queue).await;
    }
}

/// Publishes `n` records over MQTT QoS 1 (half `ls`, half `lt`) and waits
/// for every PUBACK.
async fn publish(app: &App, name: &str, n: usize) {
    let port = app.mqtt_addr.unwrap().port();
    let mut client = MqttClient::connect(port, &format!("{name}-dev")).await;
    let messages: Vec<(String, Vec<u8>)> = (0..n)
        .map(|i| {
            let topic = if i % 2 == 0 { "ls/a" } else { "lt/b" };
            (topic.to_owned(), format!("{name}-{i}").into_bytes())
        })
        .collect();
    for chunk in messages.chunks(50) {
        client.publish_confirmed(chunk).await;
    }
}

/// `weir consume` with `args`, to its exit; stderr.
fn consume(args: &[&str]) -> String {
    let out = Command::new(WEIR)
        .arg("consume")
        .args(args)
        .output()
        .expect("run weir consume");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "weir consume {args:?} failed:\n{err}");
    err
}

/// `weir consume` of `queue` on the test broker into `out` until idle for
/// `idle`; stderr.
fn consume_queue(queue: &str, out: &Path, idle: &str) -> String {
    consume(&[
        "--url",
        AMQP_URL,
        "--queue",
        queue,
        "--output",
        out.to_str().unwrap(),
        "--idle-exit",
        idle,
    ])
}

/// The `(origin, seq)` of every line of a `weir consume` output, counted;
/// a last line without its newline (being written while the test looks)
/// is not one yet.
fn lines(path: &Path) -> BTreeMap<(u64, u64), usize> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut counts = BTreeMap::new();
    for line in text
        .split_inclusive('\n')
        .filter_map(|l| l.strip_suffix('\n'))
    {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}"));
        *counts
            .entry((v["origin"].as_u64().unwrap(), v["seq"].as_u64().unwrap()))
            .or_insert(0) += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_queue_takes_every_record() {
    logs();
    let name = unique("quorum");
    let queue = format!("{name}.q");
    delete_queue(&queue).await;
    let cfg = parse_config(
        &relay_config(32, &egress(&name, "queue_type = \"quorum\"")),
        "quorum",
    );
    let app = App::start(cfg).await.expect("weir starts");
    publish(&app, &name, 200).await;
    let _ = app.shutdown(PATIENCE).await;

    let out = tmp(&name).join("out.jsonl");
    let err = consume_queue(&queue, &out, "2s");
    let seen = lines(&out);
    assert_eq!(seen.len(), 200, "every record: {err}");
    assert!(seen.values().all(|&c| c == 1));
    assert!(err.contains("200 records handed on"), "{err}");
    delete_queue(&queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_consumer_killed_resumes_from_its_offset_handing_nothing_on_twice() {
    logs();
    let name = unique("stream");
    let queue = format!("{name}.q");
    delete_queue(&queue).await;
    let cfg = parse_config(
        &relay_config(
            33,
            &egress(
                &name,
                "queue_type = \"stream\"\nqueue_arguments = { x-max-length-bytes = 100000000 }",
            ),
        ),
        "stream",
    );
    let app = App::start(cfg).await.expect("weir starts");
    const N: usize = 3000;
    publish(&app, &name, N).await;
    let _ = app.shutdown(PATIENCE).await;

    let dir = tmp(&name);
    let out = dir.join("out.jsonl");
    let state = dir.join("state.json");
    let args = |extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = [
            "consume",
            "--url",
            AMQP_URL,
            "--queue",
            &queue,
            "--stream",
            "--prefetch",
            "4",
            "--output",
            out.to_str().unwrap(),
            "--state",
            state.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    // Killed once part of the stream is out, wherever it is.
    let mut child = Command::new(WEIR)
        .args(args(&[]))
        .stderr(Stdio::null())
        .spawn()
        .expect("run weir consume");
    let give_up = std::time::Instant::now() + PATIENCE;
    while std::fs::metadata(&state).is_err() || lines(&out).len() < N / 4 {
        assert!(
            std::time::Instant::now() < give_up,
            "consume made no progress"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let before = lines(&out).len();
    assert!(before < N, "killed before the end ({before} of {N})");

    let err = consume(
        &args(&["--idle-exit", "2s"])
            .iter()
            .skip(1)
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    let seen = lines(&out);
    assert_eq!(
        seen.len(),
        N,
        "every record once the second run ends: {err}"
    );
    let twice: Vec<_> = seen.iter().filter(|(_, &c)| c > 1).collect();
    assert!(twice.is_empty(), "handed on twice: {twice:?}");
    // The second run read from the stored offset, not from the start.
    let read: u64 = err
        .split(" records handed on")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a summary line: {err}"));
    assert!(
        (read as usize) < N,
        "the restart resumed ({read} records in the second run)"
    );
    delete_queue(&queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_are_dropped_and_reported() {
    let name = unique("dupes");
    let queue = format!("{name}.q");
    delete_queue(&queue).await;
    declare(&queue, None).await;
    let classes = ClassSet::janus_default();
    let batch = OutBatch {
        seq: 1,
        class: ClassId(0),
        records: (0..10)
            .map(|i| Record {
                key: "k".into(),
                class: ClassId(0),
                origin: 77,
                seq: i,
                ingress_us: 1,
                payload: vec![0xff, i as u8].into(),
                spool: None,
            })
            .collect(),
    };
    let body = weir::egress::encode(77, &classes, &batch).body;
    let conn = connect_test_client().await;
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    // The same batch twice (a lost confirm), then not a batch at all.
    for body in [&body[..], &body[..], b"not a batch"] {
        ch.basic_publish(
            "".into(),
            queue.as_str().into(),
            BasicPublishOptions::default(),
            body,
            BasicProperties::default().with_content_encoding("identity".into()),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    }
    let out = tmp(&name).join("out.jsonl");
    let err = consume_queue(&queue, &out, "1s");
    assert_eq!(lines(&out).len(), 10);
    assert!(
        err.contains("10 records handed on, 10 duplicates dropped, 0 unverified, 1 undecodable"),
        "{err}"
    );
    let _ = conn.close(200, "done".into()).await;
    delete_queue(&queue).await;
}

/// Declares a durable exchange of `kind`, as an operator's topology would.
async fn declare_exchange(ch: &lapin::Channel, exchange: &str, kind: lapin::ExchangeKind) {
    ch.exchange_declare(
        exchange.into(),
        kind,
        ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_routing_key_template_spreads_classes_over_queues() {
    logs();
    let name = unique("template");
    let exchange = format!("{name}.x");
    let node = 34;
    // The operator's topology: one queue per class, bound by pattern.
    let conn = connect_test_client().await;
    let ch = conn.create_channel().await.unwrap();
    declare_exchange(&ch, &exchange, lapin::ExchangeKind::Topic).await;
    for class in ["ls", "lt"] {
        let q = format!("{name}.{class}");
        delete_queue(&q).await;
        declare(&q, None).await;
        ch.queue_bind(
            q.as_str().into(),
            exchange.as_str().into(),
            format!("weir.*.{class}").into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    }
    let text = relay_config(
        node,
        &format!(
            "[egress]\nkind = \"amqp\"\n[egress.amqp]\nurl = \"{AMQP_URL}\"\nexchange = \"{exchange}\"\nexchange_type = \"topic\"\nqueue = \"\"\nrouting_key = \"weir.{{node}}.{{class}}\"\n"
        ),
    );
    let mut cfg = parse_config(&text, "template");
    // One class per batch, so each batch has one routing key.
    cfg.scheduler.mix_classes = false;
    let app = App::start(cfg).await.expect("weir starts");
    publish(&app, &name, 100).await;
    let _ = app.shutdown(PATIENCE).await;
    for class in ["ls", "lt"] {
        let q = format!("{name}.{class}");
        let out = tmp(&name).join(format!("{class}.jsonl"));
        consume_queue(&q, &out, "1s");
        let text = std::fs::read_to_string(&out).unwrap();
        assert_eq!(text.lines().count(), 50, "{class}: half the records");
        assert!(
            text.lines()
                .all(|l| l.contains(&format!("\"class\":\"{class}\""))),
            "only {class} in its queue"
        );
        delete_queue(&q).await;
    }
    ch.exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
        .await
        .unwrap();
    let _ = conn.close(200, "done".into()).await;
}

#[tokio::test]
async fn an_exchange_of_another_type_stops_start_up_naming_exchange_type() {
    let name = unique("mismatch-exchange");
    let exchange = format!("{name}.x");
    let conn = connect_test_client().await;
    let ch = conn.create_channel().await.unwrap();
    declare_exchange(&ch, &exchange, lapin::ExchangeKind::Fanout).await;
    let dir = tmp(&name);
    let config = write_config(&dir, "weir.toml", &relay_config(35, &egress(&name, "")));
    let (code, err) = tokio::task::spawn_blocking(move || run_to_exit(&config))
        .await
        .unwrap();
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("egress.amqp.exchange_type:") && err.contains(&format!("`{exchange}`")),
        "{err}"
    );
    ch.exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
        .await
        .unwrap();
    let _ = conn.close(200, "done".into()).await;
}
