//! SIGTERM while RabbitMQ is unreachable: weir waits `egress.drain_timeout`
//! for the egress, then says what it could not deliver. Records of a
//! `memory` class are lost, so weir exits non-zero and names the count per
//! class; records of a `spool` class stay on disk and the exit is clean.

mod common;

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::mqtt::MqttClient;
use common::process::{free_port, sigterm, spawn_weir, wait_port, write_config};
use common::{tmp, PATIENCE};

/// Runs weir with `durability` for every class and an unreachable
/// RabbitMQ, publishes 40 records, sends SIGTERM; returns the exit code
/// and the log.
async fn sigterm_with_broker_down(durability: &str) -> (Option<i32>, String) {
    let dir = tmp(&format!("drain-{durability}"));
    let (mqtt, admin, dead) = (free_port(), free_port(), free_port());
    let config = format!(
        "[[class]]\nname = \"ls\"\nbound = \"100ms\"\ndurability = \"{durability}\"\n\
         [[class]]\nname = \"lt\"\nbound = \"1s\"\ndurability = \"{durability}\"\n\
         [classify]\ndefault_class = \"lt\"\n\
         [spool]\ndir = \"{spool}\"\n\
         [ingress.mqtt]\nlisten = \"127.0.0.1:{mqtt}\"\n[ingress.grpc]\nenabled = false\n\
         [admin]\nlisten = \"127.0.0.1:{admin}\"\n\
         [egress]\nkind = \"amqp\"\ndrain_timeout = \"1s\"\n\
         [egress.amqp]\nurl = \"amqp://guest:guest@127.0.0.1:{dead}/%2f\"\nconnect_timeout = \"200ms\"\n",
        spool = dir.join("spool").display()
    );
    let path = write_config(&dir, "weir.toml", &config);
    let mut child = spawn_weir(&path, Stdio::piped());
    wait_port(format!("127.0.0.1:{mqtt}").parse().unwrap()).await;
    common::process::wait_until_catching_sigterm(&mut child);
    let records: Vec<(String, Vec<u8>)> = (1..=40)
        .map(|i| ("plant/cooling".to_owned(), format!("r{i}").into_bytes()))
        .collect();
    MqttClient::connect(mqtt, "drain-test")
        .await
        .publish_confirmed(&records)
        .await;
    sigterm(child.id());
    let give_up = Instant::now() + PATIENCE;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < give_up, "weir did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut log = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    (status.code(), log)
}

#[tokio::test]
async fn memory_records_left_at_the_drain_deadline_fail_the_exit_and_are_counted() {
    let (code, log) = sigterm_with_broker_down("memory").await;
    assert_eq!(
        code,
        Some(1),
        "lost records must fail the exit; log:\n{log}"
    );
    assert!(
        log.contains("lt: 40"),
        "the 40 acknowledged lt records are named as lost; log:\n{log}"
    );
    assert!(log.contains("egress.drain_timeout"), "{log}");
}

#[tokio::test]
async fn spool_records_left_at_the_drain_deadline_stay_on_disk_and_exit_cleanly() {
    let (code, log) = sigterm_with_broker_down("spool").await;
    assert_eq!(code, Some(0), "nothing lost; log:\n{log}");
    assert!(
        log.contains("kept in the spool") && log.contains("records=40"),
        "the 40 records are reported kept; log:\n{log}"
    );
}
