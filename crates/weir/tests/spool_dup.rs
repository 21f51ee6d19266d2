//! A QoS 1 PUBLISH resent with DUP=1 while its PUBACK is still held (the
//! record is on its way to disk) is the same record: weir appends it once
//! and answers with one PUBACK.

mod common;

use std::process::Stdio;
use std::time::Duration;

use bytes::BufMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use common::mqtt::{connect_packet, mqtt_str, packet};
use common::process::{free_port, metric, scrape, spawn_weir, wait_port, write_config};
use common::{tmp, PATIENCE};

#[tokio::test]
async fn a_dup_resend_of_a_held_qos1_publish_is_appended_once() {
    let dir = tmp("spool-dup");
    let (mqtt, admin) = (free_port(), free_port());
    // `interval` syncs once a second: the first PUBACK is held long enough
    // for the resend to arrive while it waits.
    let config = format!(
        "[[class]]\nname = \"ls\"\nbound = \"100ms\"\ndurability = \"spool\"\n\
         [[class]]\nname = \"lt\"\nbound = \"1s\"\ndurability = \"spool\"\n\
         [classify]\ndefault_class = \"lt\"\n\
         [spool]\ndir = \"{spool}\"\nsync = \"interval\"\nsync_interval = \"1s\"\n\
         [ingress.mqtt]\nlisten = \"127.0.0.1:{mqtt}\"\n[ingress.grpc]\nenabled = false\n\
         [admin]\nlisten = \"127.0.0.1:{admin}\"\n\
         [egress]\nkind = \"file\"\n[egress.file]\ndir = \"{out}\"\n",
        spool = dir.join("spool").display(),
        out = dir.join("out").display(),
    );
    let path = write_config(&dir, "weir.toml", &config);
    let mut child = spawn_weir(&path, Stdio::null());
    let admin_addr = format!("127.0.0.1:{admin}").parse().unwrap();
    wait_port(format!("127.0.0.1:{mqtt}").parse().unwrap()).await;
    wait_port(admin_addr).await;

    let mut conn = TcpStream::connect(("127.0.0.1", mqtt)).await.unwrap();
    let publish = |byte1: u8| {
        let mut body = Vec::new();
        mqtt_str(&mut body, b"plant/press");
        body.put_u16(7);
        body.extend_from_slice(b"once");
        packet(byte1, &body)
    };
    let bytes = [
        connect_packet(b"dup-test"),
        publish(0x32), // QoS 1, packet id 7
        publish(0x3A), // the same, DUP
    ]
    .concat();
    conn.write_all(&bytes).await.unwrap();
    let mut got = [0u8; 8];
    tokio::time::timeout(PATIENCE, conn.read_exact(&mut got))
        .await
        .expect("CONNACK and a PUBACK")
        .unwrap();
    assert_eq!(got, [0x20, 2, 0, 0, 0x40, 2, 0, 7]);
    // No second PUBACK follows.
    let mut more = [0u8; 4];
    let extra = tokio::time::timeout(Duration::from_millis(1500), conn.read(&mut more)).await;
    assert!(extra.is_err(), "a second PUBACK arrived: {more:?}");
    let text = scrape(admin_addr).await.unwrap();
    assert_eq!(
        metric(&text, "weir_spool_appended_records_total"),
        1.0,
        "the resend was appended again:\n{text}"
    );
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
