//! An MQTT broker as weir's destination (`--mqtt-egress`): a QoS 1
//! subscriber to the run's prefix that reads each record weir published
//! (the records mode puts every record's payload, with its weir-load
//! stamp, on a topic of its own).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use anyhow::{bail, ensure, Context};
use bytes::BytesMut;
use rumqttc::mqttbytes::{self, v4, QoS};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::amqp::{Consumed, Consumer};
use crate::shared::{on_thread, unique, Counters};

/// Subscribes to `filter` on a thread of its own; returns once the
/// subscription is acknowledged.
pub async fn start(
    addr: SocketAddr,
    filter: String,
    counters: Arc<Counters>,
) -> anyhow::Result<Consumer> {
    let stop = CancellationToken::new();
    let (ready_tx, ready) = oneshot::channel();
    let done = Box::pin(on_thread("load-con", {
        let stop = stop.clone();
        move || async move {
            let out = consume(addr, filter, &counters, stop, ready_tx).await;
            if let Err(e) = &out {
                *counters.consumer_failed.lock().expect("not poisoned") = Some(format!("{e:#}"));
            }
            out
        }
    }));
    ready.await.context("the MQTT subscriber could not start")?;
    Ok(Consumer { stop, done })
}

async fn consume(
    addr: SocketAddr,
    filter: String,
    counters: &Counters,
    stop: CancellationToken,
    ready: oneshot::Sender<()>,
) -> anyhow::Result<Consumed> {
    let mut ready = Some(ready);
    let mut seen = Consumed::default();
    subscriber(
        addr,
        unique("sub"),
        filter,
        stop,
        || {
            if let Some(r) = ready.take() {
                let _ = r.send(());
            }
        },
        |payload, consumed_us| {
            seen.raw(payload, consumed_us)?;
            counters.consumed.fetch_add(1, Ordering::Relaxed);
            counters.messages.fetch_add(1, Ordering::Relaxed);
            Ok(())
        },
    )
    .await?;
    Ok(seen)
}

/// One QoS 1 subscriber until `stop`: connects as `client_id`,
/// subscribes to `filter` (`subscribed` is called on its SUBACK), hands
/// every publish's payload to `publish` with the time its read came in,
/// and acknowledges it, many PUBACKs per write.
pub async fn subscriber(
    addr: SocketAddr,
    client_id: String,
    filter: String,
    stop: CancellationToken,
    mut subscribed: impl FnMut(),
    mut publish: impl FnMut(&[u8], u64) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut stream = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to the MQTT broker at {addr}"))?;
    stream.set_nodelay(true)?;
    let mut out = BytesMut::with_capacity(64 * 1024);
    let mut connect = v4::Connect::new(client_id);
    // Long, not 0 (rumqttd refuses 0): the drain at the end may be silent
    // for a while, and no PINGREQ is sent.
    connect.keep_alive = crate::mqtt::KEEP_ALIVE_SECS;
    v4::Packet::Connect(connect).write(&mut out, usize::MAX)?;
    let mut sub = v4::Subscribe::new(filter, QoS::AtLeastOnce);
    // Packet id 0 is a protocol error for SUBSCRIBE.
    sub.pkid = 1;
    v4::Packet::Subscribe(sub).write(&mut out, usize::MAX)?;
    stream.write_all(&out).await?;
    out.clear();
    let mut inbuf = BytesMut::with_capacity(256 * 1024);
    loop {
        let consumed_us = crate::stamp::now_us();
        loop {
            match v4::Packet::read(&mut inbuf, usize::MAX) {
                Ok(v4::Packet::Publish(p)) => {
                    publish(&p.payload, consumed_us)?;
                    if p.qos != QoS::AtMostOnce {
                        v4::Packet::PubAck(v4::PubAck::new(p.pkid)).write(&mut out, usize::MAX)?;
                    }
                }
                Ok(v4::Packet::ConnAck(ack)) => ensure!(
                    ack.code == v4::ConnectReturnCode::Success,
                    "the broker refused the subscriber: {:?}",
                    ack.code
                ),
                Ok(v4::Packet::SubAck(_)) => subscribed(),
                Ok(_) => {}
                Err(mqttbytes::Error::InsufficientBytes(_)) => break,
                Err(e) => bail!("bad packet from the broker: {e}"),
            }
        }
        if !out.is_empty() {
            stream.write_all(&out).await?;
            out.clear();
        }
        // Cancel safety: `read_buf` is cancel safe; `stop` only waits.
        tokio::select! {
            n = stream.read_buf(&mut inbuf) => {
                if n? == 0 {
                    bail!("the broker closed the subscriber's connection");
                }
            }
            _ = stop.cancelled() => return Ok(()),
        }
    }
}
