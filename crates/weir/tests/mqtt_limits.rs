//! Limits against hostile or broken MQTT clients, against the real `weir`
//! process over raw TCP: `max_connections`, `connect_timeout`,
//! `max_inflight` (the MQTT 5 receive maximum) and `max_packet_size` at its
//! exact boundary.

mod common;

use std::net::SocketAddr;
use std::process::Child;

use common::mqtt::{connect_packet, mqtt_str, packet};
use common::process::{free_port, metric, scrape, spawn_weir, wait_port, write_config};
use common::{eventually_async, tmp, PATIENCE};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Weir {
    child: Child,
    mqtt: SocketAddr,
    admin: SocketAddr,
}

impl Drop for Weir {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start(name: &str, mqtt_keys: &str) -> Weir {
    let dir = tmp(name);
    let mqtt: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let config = format!(
        "[ingress.mqtt]\nlisten = \"{mqtt}\"\n{mqtt_keys}\n[ingress.grpc]\nenabled = false\n\
         [egress.file]\ndir = \"{}\"\n[admin]\nlisten = \"{admin}\"\n",
        dir.join("out").display()
    );
    let path = write_config(&dir, "weir.toml", &config);
    let log = std::fs::File::create(dir.join("weir.log")).unwrap();
    let child = spawn_weir(&path, log);
    wait_port(mqtt).await;
    wait_port(admin).await;
    Weir { child, mqtt, admin }
}

/// MQTT 5 CONNECT without properties, clean start, as `client`.
fn connect_v5(client: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    mqtt_str(&mut body, b"MQTT");
    body.extend_from_slice(&[5, 0x02, 0, 60, 0]);
    mqtt_str(&mut body, client);
    packet(0x10, &body)
}

/// A PUBLISH of `qos` (1 or 2) with packet id `pkid`, for MQTT 3.1.1 when
/// `v5` is false; its payload padded so the whole packet is `total` bytes
/// (when given).
fn publish(qos: u8, pkid: u16, v5: bool, total: Option<usize>) -> Vec<u8> {
    let mut head = Vec::new();
    mqtt_str(&mut head, b"t/limit");
    head.extend_from_slice(&pkid.to_be_bytes());
    if v5 {
        head.push(0); // no properties
    }
    let payload = match total {
        None => 4,
        Some(total) => {
            // Fixed header: 1 type byte + the remaining length's bytes.
            let mut n = total - 1 - head.len() - 1;
            while 1 + len_bytes(head.len() + n) + head.len() + n > total {
                n -= 1;
            }
            n
        }
    };
    head.extend(std::iter::repeat_n(b'x', payload));
    let p = packet(0x30 | (qos << 1), &head);
    if let Some(total) = total {
        assert_eq!(p.len(), total);
    }
    p
}

fn len_bytes(remaining: usize) -> usize {
    match remaining {
        0..=127 => 1,
        128..=16_383 => 2,
        _ => 3,
    }
}

async fn read_n(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut buf = vec![0u8; n];
    tokio::time::timeout(PATIENCE, s.read_exact(&mut buf))
        .await
        .expect("answered in time")
        .expect("read");
    buf
}

/// Reads until the server closes; what it sent.
async fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
    let mut all = Vec::new();
    let _ = tokio::time::timeout(PATIENCE, s.read_to_end(&mut all))
        .await
        .expect("closed in time");
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_max_connections_are_told_the_server_is_busy() {
    let weir = start("mqtt-max-connections", "max_connections = 2").await;
    // The readiness probe's connection holds a slot until weir reads its
    // end: wait until it is let go.
    eventually_async("the readiness probe's slot to be free", || async {
        metric(&scrape(weir.admin).await.unwrap(), "weir_mqtt_connections") == 0.0
    })
    .await;
    let mut open = Vec::new();
    for i in 0..2u8 {
        let mut s = TcpStream::connect(weir.mqtt).await.unwrap();
        s.write_all(&connect_packet(&[b'a' + i])).await.unwrap();
        assert_eq!(read_n(&mut s, 4).await, [0x20, 2, 0, 0]);
        open.push(s);
    }
    // 3.1.1: return code 3, "server unavailable".
    let mut third = TcpStream::connect(weir.mqtt).await.unwrap();
    third.write_all(&connect_packet(b"c")).await.unwrap();
    assert_eq!(read_to_close(&mut third).await, [0x20, 2, 0, 3]);
    // MQTT 5: reason 0x89, "server busy".
    let mut fourth = TcpStream::connect(weir.mqtt).await.unwrap();
    fourth.write_all(&connect_v5(b"d")).await.unwrap();
    let answer = read_to_close(&mut fourth).await;
    assert_eq!(&answer[..4], [0x20, 3, 0, 0x89], "{answer:?}");
    let m = scrape(weir.admin).await.unwrap();
    assert!(
        m.contains("weir_mqtt_connections_refused_total{reason=\"max_connections\"} 2"),
        "{m}"
    );
    assert_eq!(metric(&m, "weir_mqtt_connections"), 2.0, "{m}");
    // A slot freed is a slot taken.
    drop(open.pop());
    eventually_async("the closed connection's slot to be free", || async {
        metric(&scrape(weir.admin).await.unwrap(), "weir_mqtt_connections") == 1.0
    })
    .await;
    let mut again = TcpStream::connect(weir.mqtt).await.unwrap();
    again.write_all(&connect_packet(b"e")).await.unwrap();
    assert_eq!(read_n(&mut again, 4).await, [0x20, 2, 0, 0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_closed_at_the_connect_timeout() {
    let weir = start("mqtt-connect-timeout", "connect_timeout = \"1s\"").await;
    let mut silent = TcpStream::connect(weir.mqtt).await.unwrap();
    // Half a CONNECT, then nothing (slowloris).
    silent
        .write_all(&connect_packet(b"slow")[..5])
        .await
        .unwrap();
    assert_eq!(
        read_to_close(&mut silent).await,
        b"",
        "closed without a word"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_receive_maximum_is_announced_and_enforced() {
    let weir = start("mqtt-max-inflight", "max_inflight = 2").await;
    let mut s = TcpStream::connect(weir.mqtt).await.unwrap();
    s.write_all(&connect_v5(b"q2")).await.unwrap();
    let head = read_n(&mut s, 2).await;
    let body = read_n(&mut s, head[1] as usize).await;
    // Receive Maximum (property 0x21) = 2.
    assert!(
        body.windows(3).any(|w| w == [0x21, 0, 2]),
        "CONNACK {body:?}"
    );
    // Three QoS 2 publishes, no PUBREL: two PUBRECs, then DISCONNECT
    // 0x93 (receive maximum exceeded).
    for pkid in 1..=3 {
        s.write_all(&publish(2, pkid, true, None)).await.unwrap();
    }
    let answer = read_to_close(&mut s).await;
    assert_eq!(&answer[..8], [0x50, 2, 0, 1, 0x50, 2, 0, 2], "{answer:?}");
    assert_eq!(&answer[8..9], [0xE0], "{answer:?}");
    assert_eq!(answer[10], 0x93, "{answer:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_packet_size_counts_every_byte_of_the_packet() {
    let weir = start("mqtt-max-packet", "max_packet_size = \"1KiB\"").await;
    for v5 in [false, true] {
        let hello = if v5 {
            connect_v5(b"big")
        } else {
            connect_packet(b"big")
        };
        // Exactly at the limit: acknowledged.
        let mut s = TcpStream::connect(weir.mqtt).await.unwrap();
        s.write_all(&hello).await.unwrap();
        let head = read_n(&mut s, 2).await;
        read_n(&mut s, head[1] as usize).await;
        s.write_all(&publish(1, 7, v5, Some(1024))).await.unwrap();
        let ack = read_n(&mut s, 4).await;
        assert_eq!(&ack[..4], [0x40, 2, 0, 7], "v5={v5}: {ack:?}");
        // One byte over: the connection is closed, the record never
        // acknowledged.
        let mut s = TcpStream::connect(weir.mqtt).await.unwrap();
        s.write_all(&hello).await.unwrap();
        let head = read_n(&mut s, 2).await;
        read_n(&mut s, head[1] as usize).await;
        s.write_all(&publish(1, 8, v5, Some(1025))).await.unwrap();
        let answer = read_to_close(&mut s).await;
        assert!(
            !answer.starts_with(&[0x40]),
            "v5={v5}: no PUBACK: {answer:?}"
        );
        if v5 {
            // DISCONNECT, reason 0x95 (packet too large).
            assert_eq!(&answer[..1], [0xE0], "{answer:?}");
            assert_eq!(answer[2], 0x95, "{answer:?}");
        } else {
            assert_eq!(answer, b"");
        }
    }
    let m = scrape(weir.admin).await.unwrap();
    assert_eq!(metric(&m, "weir_protocol_errors_total"), 2.0, "{m}");
}
