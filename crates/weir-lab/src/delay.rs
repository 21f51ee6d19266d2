//! A delay line for the real-process lab: a TCP proxy that holds every
//! byte for a fixed time in each direction before passing it on, without
//! limiting throughput. It is the propagation delay netem would add (netem
//! is not available on the lab's machines); `tc`'s `tbf` or `htb` shapes
//! the rate on the link in front of it.
//!
//! Each direction of each connection is a [`line`]: a reader stamps every
//! chunk with the time it arrived and queues it, a writer sends it on once
//! `delay` has passed. Chunks read while earlier ones wait are queued
//! behind them, so the line carries as much as the links around it allow
//! (a bandwidth-delay product in flight), up to `window` bytes per
//! direction; beyond that the reader stops reading, and TCP's own flow
//! control holds the sender back, as a full pipe would. An end of stream
//! is passed on after the bytes before it (a half-close stays a
//! half-close).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;
use weir::config::units::HumanDuration;

/// Largest chunk read at once.
const CHUNK: usize = 64 * 1024;

/// Command line of `weir-lab delay`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Where to accept connections, e.g. 10.10.0.1:5673.
    #[arg(long)]
    pub listen: SocketAddr,
    /// Where to connect for each one, e.g. 127.0.0.1:5672.
    #[arg(long)]
    pub to: String,
    /// Delay added towards `--to`, e.g. 25ms (weir's config syntax).
    #[arg(long)]
    pub delay: HumanDuration,
    /// Delay added on the way back [default: --delay]. `0ms` is netem on
    /// the sender's interface only (a round trip takes one delay longer).
    #[arg(long)]
    pub delay_back: Option<HumanDuration>,
    /// Most bytes held per direction of a connection before the line
    /// stops reading (what the line can carry in flight).
    #[arg(long, default_value_t = 16 << 20)]
    pub window_bytes: usize,
}

/// Accepts connections on `a.listen` and relays each to `a.to` through a
/// delay line in both directions, until the process is stopped.
pub async fn serve(a: &Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.window_bytes >= CHUNK,
        "--window-bytes must be at least {CHUNK}"
    );
    let listener = TcpListener::bind(a.listen)
        .await
        .with_context(|| format!("cannot listen on {}", a.listen))?;
    let back = a.delay_back.as_ref().unwrap_or(&a.delay).get();
    eprintln!(
        "weir-lab delay: {} -> {}, {:?} there and {:?} back",
        listener.local_addr()?,
        a.to,
        a.delay.get(),
        back
    );
    serve_on(listener, a.to.clone(), a.delay.get(), back, a.window_bytes).await
}

/// Relays every connection `listener` accepts to `to`, `there` added
/// towards it and `back` on the way back, until the task is dropped (the
/// connections then open go on until either end closes).
pub async fn serve_on(
    listener: TcpListener,
    to: String,
    there: Duration,
    back: Duration,
    window: usize,
) -> anyhow::Result<()> {
    loop {
        let (inbound, peer) = listener.accept().await.context("accept failed")?;
        let to = to.clone();
        tokio::spawn(async move {
            if let Err(e) = relay(inbound, &to, there, back, window).await {
                eprintln!("weir-lab delay: {peer} -> {to}: {e}");
            }
        });
    }
}

/// One connection: `inbound` to a new connection to `to`, both ways.
async fn relay(
    inbound: TcpStream,
    to: &str,
    there: Duration,
    back: Duration,
    window: usize,
) -> io::Result<()> {
    let outbound = TcpStream::connect(to).await?;
    inbound.set_nodelay(true)?;
    outbound.set_nodelay(true)?;
    let (from_client, to_client) = inbound.into_split();
    let (from_server, to_server) = outbound.into_split();
    let up = tokio::spawn(line(from_client, to_server, there, window));
    let down = tokio::spawn(line(from_server, to_client, back, window));
    let (up, down) = tokio::join!(up, down);
    up.map_err(io::Error::other)??;
    down.map_err(io::Error::other)??;
    Ok(())
}

/// Copies `from` to `to`, each chunk written `delay` after it was read, at
/// most `window` bytes waiting at once; returns the bytes copied once
/// `from` ends (and `to` is shut down) or either fails.
pub async fn line<R, W>(mut from: R, mut to: W, delay: Duration, window: usize) -> io::Result<u64>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin,
{
    let room = Arc::new(Semaphore::new(window));
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Bytes)>();
    let reader_room = Arc::clone(&room);
    let reader = tokio::spawn(async move {
        loop {
            let mut buf = BytesMut::with_capacity(CHUNK);
            let n = from.read_buf(&mut buf).await?;
            if n == 0 {
                return Ok::<(), io::Error>(());
            }
            let at = Instant::now() + delay;
            // Room for what was read before reading more: at most one
            // chunk beyond the window.
            let permits = u32::try_from(n).unwrap_or(u32::MAX);
            match reader_room.acquire_many(permits).await {
                Ok(p) => p.forget(),
                Err(_) => return Ok(()),
            }
            if tx.send((at, buf.freeze())).is_err() {
                return Ok(());
            }
        }
    });
    let mut copied = 0u64;
    while let Some((at, chunk)) = rx.recv().await {
        tokio::time::sleep_until(at).await;
        to.write_all(&chunk).await?;
        copied += chunk.len() as u64;
        room.add_permits(chunk.len());
    }
    to.shutdown().await?;
    reader.await.map_err(io::Error::other)??;
    Ok(copied)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[tokio::test(start_paused = true)]
    async fn every_chunk_arrives_one_delay_after_it_was_sent_and_in_flight_together() {
        let (mut client, proxy_in) = tokio::io::duplex(1 << 20);
        let (proxy_out, mut server) = tokio::io::duplex(1 << 20);
        let started = Instant::now();
        let line = tokio::spawn(line(proxy_in, proxy_out, MS * 25, 1 << 20));
        // Two chunks 10 ms apart: each 25 ms after it was sent, so both
        // are on the line at once (no serialisation behind the delay).
        client.write_all(b"first").await.unwrap();
        tokio::time::sleep(MS * 10).await;
        client.write_all(b"second").await.unwrap();
        let mut buf = [0u8; 5];
        server.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"first");
        assert_eq!(started.elapsed(), MS * 25);
        let mut buf = [0u8; 6];
        server.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"second");
        assert_eq!(started.elapsed(), MS * 35);
        // The end of the stream follows the bytes before it.
        drop(client);
        let mut rest = Vec::new();
        server.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
        assert_eq!(line.await.unwrap().unwrap(), 11);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_window_holds_the_sender_back_and_loses_nothing() {
        let (mut client, proxy_in) = tokio::io::duplex(CHUNK);
        let (proxy_out, mut server) = tokio::io::duplex(1 << 22);
        let line = tokio::spawn(line(proxy_in, proxy_out, MS * 50, 2 * CHUNK));
        let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            client.write_all(&sent).await.unwrap();
            Instant::now()
        });
        let started = Instant::now();
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap_or_default();
        // 1 MiB through a window of 128 KiB: at most the window, one chunk
        // of overshoot and the pipe's own 64 KiB (256 KiB) can be ahead of
        // what has left the line, so the writer cannot finish before three
        // delays have passed (without the window: at once).
        let finished = writer.await.unwrap();
        assert!(
            finished - started >= MS * 50 * 3,
            "{:?}",
            finished - started
        );
        assert_eq!(got.len(), data.len());
        assert!(got == data, "bytes differ");
        assert_eq!(line.await.unwrap().unwrap(), data.len() as u64);
    }

    #[tokio::test]
    async fn a_tcp_round_trip_takes_two_delays() {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let echo_addr = echo.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = echo.accept().await.unwrap();
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf).await.unwrap();
            s.write_all(&buf).await.unwrap();
        });
        let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy_addr = proxy.local_addr().unwrap();
        tokio::spawn(async move {
            let (inbound, _) = proxy.accept().await.unwrap();
            relay(inbound, &echo_addr.to_string(), MS * 20, MS * 20, 1 << 20)
                .await
                .unwrap();
        });
        let mut c = TcpStream::connect(proxy_addr).await.unwrap();
        let started = std::time::Instant::now();
        c.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        c.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        // A lower bound only: the line never delivers early.
        assert!(started.elapsed() >= MS * 40, "{:?}", started.elapsed());
    }
}
