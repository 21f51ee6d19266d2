//! The MQTT publisher: QoS 1 connections to weir's MQTT listener, lean on
//! purpose (rumqttc's MQTT 3.1.1 codec over a `TcpStream`, a window of
//! unacknowledged publishes, many publishes per write).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{bail, ensure, Context};
use bytes::BytesMut;
use rumqttc::mqttbytes::{self, v4, QoS};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::cli::Pacing;
use crate::pacer::{take_burst, Pacer};
use crate::shared::{on_thread, Counters, DRAIN_PATIENCE};
use crate::stamp::stamped;

/// PUBLISH-to-PUBACK times are kept for one packet id in this many.
pub const LATENCY_EVERY: u16 = 8;

/// One publishing connection.
pub struct MqttLoad {
    pub addr: SocketAddr,
    pub client_id: String,
    pub topic: String,
    pub size: usize,
    /// Unacknowledged publishes allowed.
    pub window: usize,
    /// Records per second, or as fast as the window allows.
    pub rate: Option<f64>,
    /// How sends are spread when paced.
    pub pacing: Pacing,
    /// Stop after this many records.
    pub limit: Option<u64>,
    /// Connect over TLS with this configuration (server name 127.0.0.1).
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

/// `n` connections to `addr` as `<name>-<i>`, each publishing `size`-byte
/// records to `<topic_base>/c<i>` with `window` in flight, sharing
/// `total_rate` (records/s) or as fast as acknowledged. They share the
/// publisher thread, so paced ones send per timer tick instead of
/// blocking it with sleeps.
pub fn connections(
    addr: SocketAddr,
    name: &str,
    topic_base: &str,
    n: usize,
    size: usize,
    window: usize,
    total_rate: Option<f64>,
) -> Vec<MqttLoad> {
    (0..n)
        .map(|i| MqttLoad {
            addr,
            client_id: format!("{name}-{i}"),
            topic: format!("{topic_base}/c{i}"),
            size,
            window,
            rate: total_rate.map(|r| r / n as f64),
            pacing: Pacing::Tick,
            limit: None,
            tls: None,
        })
        .collect()
}

/// Runs every connection on the `load-pub` thread until `stop` fires (or
/// each has sent its `limit`), then waits for their in-flight PUBACKs.
pub fn run_publishers(
    loads: Vec<MqttLoad>,
    counters: Arc<Counters>,
    stop: CancellationToken,
) -> impl Future<Output = anyhow::Result<()>> + Send {
    on_thread("load-pub", move || async move {
        let tasks: Vec<_> = loads
            .into_iter()
            .map(|l| mqtt_publisher(l, Arc::clone(&counters), stop.clone()))
            .collect();
        for r in futures::future::join_all(tasks).await {
            r?;
        }
        Ok(())
    })
}

async fn mqtt_publisher(
    load: MqttLoad,
    counters: Arc<Counters>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let mut stream = TcpStream::connect(load.addr)
        .await
        .with_context(|| format!("connecting to weir's MQTT listener {}", load.addr))?;
    stream.set_nodelay(true)?;
    if let Some(config) = load.tls.clone() {
        let mut tls = tls_handshake(stream, config).await?;
        let inbuf = mqtt_connect(&mut tls, &load.client_id).await?;
        let (rd, wr) = tokio::io::split(tls);
        return pump(rd, wr, inbuf, load, counters, stop).await;
    }
    let inbuf = mqtt_connect(&mut stream, &load.client_id).await?;
    let (rd, wr) = stream.into_split();
    pump(rd, wr, inbuf, load, counters, stop).await
}

/// A TLS session over `tcp` to weir, verified as 127.0.0.1.
pub async fn tls_handshake(
    tcp: TcpStream,
    config: Arc<rustls::ClientConfig>,
) -> anyhow::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let name = rustls_pki_types::ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
    tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .context("TLS handshake with weir")
}

/// Keep-alive of every load connection, in seconds.
pub const KEEP_ALIVE_SECS: u16 = 600;

/// CONNECT as `client_id`, and wait for a successful CONNACK; what was read
/// past it.
pub async fn mqtt_connect<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    client_id: &str,
) -> anyhow::Result<BytesMut> {
    let mut out = BytesMut::with_capacity(1024);
    let mut connect = v4::Connect::new(client_id.to_owned());
    // Long, not 0 (rumqttd refuses 0): the drain at the end may be silent
    // for a while, and no PINGREQ is sent.
    connect.keep_alive = KEEP_ALIVE_SECS;
    v4::Packet::Connect(connect).write(&mut out, usize::MAX)?;
    stream.write_all(&out).await?;
    out.clear();
    let mut inbuf = BytesMut::with_capacity(64 * 1024);
    loop {
        match v4::Packet::read(&mut inbuf, usize::MAX) {
            Ok(v4::Packet::ConnAck(ack)) => {
                ensure!(
                    ack.code == v4::ConnectReturnCode::Success,
                    "weir refused the MQTT connection: {:?}",
                    ack.code
                );
                break;
            }
            Ok(other) => bail!("expected CONNACK, got {other:?}"),
            Err(mqttbytes::Error::InsufficientBytes(_)) => {
                ensure!(
                    stream.read_buf(&mut inbuf).await? > 0,
                    "weir closed the connection before CONNACK"
                );
            }
            Err(e) => bail!("bad CONNACK: {e}"),
        }
    }
    Ok(inbuf)
}

/// Publishes on an established session until `stop` (or the limit), then
/// drains the acknowledgements and disconnects.
async fn pump<R, W>(
    rd: R,
    wr: W,
    inbuf: BytesMut,
    load: MqttLoad,
    counters: Arc<Counters>,
    stop: CancellationToken,
) -> anyhow::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let session = Session {
        window: Semaphore::new(load.window),
        done: CancellationToken::new(),
        base: std::time::Instant::now(),
        sent_at: (0..=u16::MAX).map(|_| AtomicU64::new(0)).collect(),
        counters,
    };
    let (r, w) = tokio::join!(session.read(rd, inbuf), session.write(wr, &load, &stop));
    // The writer's failure is the cause; the reader's is usually its echo.
    w.and(r)
}

/// What a session's reader and writer share.
struct Session {
    /// Publishes not yet acknowledged may take a permit each.
    window: Semaphore,
    /// Set by the writer before its DISCONNECT: the connection's close is
    /// then the end, not an error.
    done: CancellationToken,
    /// When each packet id was last written, microseconds since `base`: one
    /// clock read per write and per read, not per record.
    base: std::time::Instant,
    sent_at: Vec<AtomicU64>,
    counters: Arc<Counters>,
}

impl Session {
    /// Reads PUBACKs until the session is done, giving their permits back;
    /// the acknowledgement latencies it sampled go to the counters however
    /// it ends.
    async fn read<R: AsyncRead + Unpin>(
        &self,
        mut rd: R,
        mut inbuf: BytesMut,
    ) -> anyhow::Result<()> {
        let mut latencies = Vec::new();
        let result = self.read_acks(&mut rd, &mut inbuf, &mut latencies).await;
        self.counters
            .ack_latency_us
            .lock()
            .expect("not poisoned")
            .append(&mut latencies);
        result
    }

    /// The reading loop of [`Session::read`].
    async fn read_acks<R: AsyncRead + Unpin>(
        &self,
        rd: &mut R,
        inbuf: &mut BytesMut,
        latencies: &mut Vec<u64>,
    ) -> anyhow::Result<()> {
        loop {
            let acks = self.take_acks(inbuf, latencies)?;
            if acks > 0 {
                self.counters
                    .acked
                    .fetch_add(acks as u64, Ordering::Relaxed);
                self.window.add_permits(acks);
            }
            // Cancel safety: `read_buf` is cancel safe (nothing is
            // read unless it returns); `done` only waits.
            tokio::select! {
                n = rd.read_buf(inbuf) => {
                    if n? == 0 {
                        // After our DISCONNECT weir closes: expected.
                        if self.done.is_cancelled() {
                            return Ok(());
                        }
                        bail!("weir closed the MQTT connection");
                    }
                }
                _ = self.done.cancelled() => return Ok(()),
            }
        }
    }

    /// Takes every whole packet in `inbuf`, all PUBACKs: how many, with a
    /// sample of their latencies added to `latencies` while measuring.
    fn take_acks(&self, inbuf: &mut BytesMut, latencies: &mut Vec<u64>) -> anyhow::Result<usize> {
        let mut acks = 0;
        let measuring = self.counters.measuring.load(Ordering::Relaxed);
        let now_us = self.base.elapsed().as_micros() as u64;
        loop {
            match v4::Packet::read(inbuf, usize::MAX) {
                Ok(v4::Packet::PubAck(ack)) => {
                    acks += 1;
                    // One PUBACK in LATENCY_EVERY (by packet id,
                    // so unbiased): long full-rate runs stay small.
                    if measuring && ack.pkid % LATENCY_EVERY == 0 {
                        let at = self.sent_at[usize::from(ack.pkid)].load(Ordering::Relaxed);
                        latencies.push(now_us.saturating_sub(at));
                    }
                }
                Ok(other) => bail!("unexpected packet from weir: {other:?}"),
                Err(mqttbytes::Error::InsufficientBytes(_)) => return Ok(acks),
                Err(e) => bail!("bad packet from weir: {e}"),
            }
        }
    }

    /// Publishes `load` in bursts as the pacer and the window allow until
    /// `stop` (or the limit), waits for every acknowledgement, then
    /// disconnects.
    async fn write<W: AsyncWrite + Unpin>(
        &self,
        mut wr: W,
        load: &MqttLoad,
        stop: &CancellationToken,
    ) -> anyhow::Result<()> {
        let mut out = BytesMut::with_capacity(64 * 1024);
        let window = &self.window;
        let mut pacer = load.rate.map(|rate| Pacer::new(rate, load.pacing));
        let mut pkid: u16 = 0;
        let mut sent_here = 0u64;
        while let Some(n) = take_burst(
            pacer.as_ref(),
            window,
            stop,
            load.limit.map(|l| l - sent_here),
        )
        .await?
        {
            let now_us = self.base.elapsed().as_micros() as u64;
            for _ in 0..n {
                pkid = if pkid == u16::MAX { 1 } else { pkid + 1 };
                self.sent_at[usize::from(pkid)].store(now_us, Ordering::Relaxed);
                let seq = self.counters.sent.fetch_add(1, Ordering::Relaxed);
                let publish = v4::Publish {
                    dup: false,
                    qos: QoS::AtLeastOnce,
                    retain: false,
                    topic: load.topic.clone(),
                    pkid,
                    payload: stamped(load.size, seq),
                };
                publish.write(&mut out)?;
            }
            wr.write_all(&out).await?;
            out.clear();
            sent_here += n;
            if let Some(p) = &mut pacer {
                p.sent += n;
            }
        }
        // Every permit back means every publish acknowledged.
        tokio::time::timeout(DRAIN_PATIENCE, window.acquire_many(load.window as u32))
            .await
            .context("weir did not acknowledge every publish in time")??
            .forget();
        // Before DISCONNECT, so that the reader takes the close it causes
        // as the end, not as an error.
        self.done.cancel();
        v4::Packet::Disconnect.write(&mut out, usize::MAX)?;
        wr.write_all(&out).await?;
        wr.shutdown().await?;
        anyhow::Ok(())
    }
}
