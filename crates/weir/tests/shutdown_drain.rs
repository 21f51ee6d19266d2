//! SIGTERM while RabbitMQ is unreachable: weir waits `egress.drain_timeout`
//! for the egress, then says what it could not deliver. Records of a
//! `memory` class are lost, so weir exits non-zero and names the count per
//! class; records of a `spool` class stay on disk and the exit is clean.

mod common;

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use bytes::BufMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use common::mqtt::{mqtt_str, packet};
use common::process::{sigterm, spawn_weir, wait_port, write_config};
use common::{tmp, PATIENCE};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Publishes `n` QoS 1 records on `topic` and waits for every PUBACK.
async fn publish_acked(port: u16, topic: &[u8], n: u16) {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut body = Vec::new();
    mqtt_str(&mut body, b"MQTT");
    body.put_u8(4);
    body.put_u8(0x02);
    body.put_u16(60);
    mqtt_str(&mut body, b"drain-test");
    conn.write_all(&packet(0x10, &body)).await.unwrap();
    let mut connack = [0u8; 4];
    conn.read_exact(&mut connack).await.unwrap();
    assert_eq!(connack, [0x20, 2, 0, 0], "CONNACK accepted");
    for pkid in 1..=n {
        let mut body = Vec::new();
        mqtt_str(&mut body, topic);
        body.put_u16(pkid);
        body.extend_from_slice(format!("r{pkid}").as_bytes());
        conn.write_all(&packet(0x32, &body)).await.unwrap();
    }
    let mut acks = vec![0u8; 4 * n as usize];
    tokio::time::timeout(PATIENCE, conn.read_exact(&mut acks))
        .await
        .expect("every record acknowledged")
        .unwrap();
}

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
    publish_acked(mqtt, b"plant/cooling", 40).await;
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
