//! A QoS 1 PUBLISH resent with DUP=1 is the same record: while its PUBACK
//! is still held (the record is on its way to disk), and after a reconnect
//! in a persistent session (`clean_session = 0`), weir appends it once.

mod common;

use std::process::Stdio;
use std::time::Duration;

use bytes::BufMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use common::mqtt::{connect_packet, connect_packet_session, mqtt_str, packet};
use common::process::{
    file_egress, free_port, metric, scrape, spawn_weir, spool_config, wait_port, write_config,
};
use common::{tmp, PATIENCE};

/// A spooled weir (`sync` as given) with its MQTT and admin addresses.
fn start(dir: &std::path::Path, sync: &str) -> (std::process::Child, u16, std::net::SocketAddr) {
    let (mqtt, admin) = (free_port(), free_port());
    let config = spool_config(
        &dir.join("spool"),
        mqtt,
        admin,
        &file_egress(&dir.join("out")),
        sync,
    );
    let path = write_config(dir, "weir.toml", &config);
    let child = spawn_weir(&path, Stdio::null());
    (child, mqtt, format!("127.0.0.1:{admin}").parse().unwrap())
}

fn publish(byte1: u8, pkid: u16, payload: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    mqtt_str(&mut body, b"plant/press");
    body.put_u16(pkid);
    body.extend_from_slice(payload);
    packet(byte1, &body)
}

#[tokio::test]
async fn a_dup_resend_of_a_held_qos1_publish_is_appended_once() {
    let dir = tmp("spool-dup");
    // `interval` syncs once a second: the first PUBACK is held long enough
    // for the resend to arrive while it waits.
    let (mut child, mqtt, admin_addr) = start(&dir, "sync = \"interval\"\nsync_interval = \"1s\"");
    wait_port(format!("127.0.0.1:{mqtt}").parse().unwrap()).await;
    wait_port(admin_addr).await;

    let mut conn = TcpStream::connect(("127.0.0.1", mqtt)).await.unwrap();
    let bytes = [
        connect_packet(b"dup-test"),
        publish(0x32, 7, b"once"), // QoS 1, packet id 7
        publish(0x3A, 7, b"once"), // the same, DUP
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

/// Reads exactly `n` bytes.
async fn read_n(conn: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut got = vec![0u8; n];
    tokio::time::timeout(PATIENCE, conn.read_exact(&mut got))
        .await
        .expect("an answer from weir")
        .unwrap();
    got
}

#[tokio::test]
async fn a_dup_resend_after_a_reconnect_in_a_persistent_session_is_appended_once() {
    let dir = tmp("spool-dup-session");
    let (mut child, mqtt, admin_addr) = start(&dir, "sync = \"group\"");
    wait_port(format!("127.0.0.1:{mqtt}").parse().unwrap()).await;
    wait_port(admin_addr).await;
    let appended = || async {
        let text = scrape(admin_addr).await.unwrap();
        metric(&text, "weir_spool_appended_records_total")
    };

    // First connection: the publish is accepted and acknowledged, but the
    // client (as if the PUBACK were lost) will send it again.
    let mut first = TcpStream::connect(("127.0.0.1", mqtt)).await.unwrap();
    let hello = [
        connect_packet_session(b"press-7", false),
        publish(0x32, 7, b"once"),
    ]
    .concat();
    first.write_all(&hello).await.unwrap();
    assert_eq!(read_n(&mut first, 8).await, [0x20, 2, 0, 0, 0x40, 2, 0, 7]);

    // Second connection with the same client id while the first is still
    // open: weir takes the session over (closing the first), says the
    // session is present, and acknowledges the resend without a second
    // record.
    let mut second = TcpStream::connect(("127.0.0.1", mqtt)).await.unwrap();
    let again = [
        connect_packet_session(b"press-7", false),
        publish(0x3A, 7, b"once"),
    ]
    .concat();
    second.write_all(&again).await.unwrap();
    assert_eq!(
        read_n(&mut second, 8).await,
        [0x20, 2, 1, 0, 0x40, 2, 0, 7],
        "CONNACK with session present, then the PUBACK"
    );
    let mut rest = [0u8; 16];
    let closed = tokio::time::timeout(PATIENCE, first.read(&mut rest))
        .await
        .expect("the first connection is closed");
    assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
    assert_eq!(appended().await, 1.0, "the resend was appended again");

    // The same packet id with other bytes, or without DUP, is a new
    // record.
    let news = [publish(0x3A, 7, b"other"), publish(0x32, 7, b"once")].concat();
    second.write_all(&news).await.unwrap();
    assert_eq!(read_n(&mut second, 8).await, [0x40, 2, 0, 7, 0x40, 2, 0, 7]);
    assert_eq!(appended().await, 3.0);

    // A clean session forgets: the resend is a new record.
    drop(second);
    let mut clean = TcpStream::connect(("127.0.0.1", mqtt)).await.unwrap();
    let hello = [
        connect_packet_session(b"press-7", true),
        publish(0x3A, 7, b"once"),
    ]
    .concat();
    clean.write_all(&hello).await.unwrap();
    assert_eq!(read_n(&mut clean, 8).await, [0x20, 2, 0, 0, 0x40, 2, 0, 7]);
    assert_eq!(appended().await, 4.0);
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
