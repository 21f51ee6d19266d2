//! The `grpc` run: weir's gRPC ingress (`weir.v1.Ingress/PublishStream`,
//! raw payload bytes) under the broker run's load shape: C streams, each
//! with a window of unacknowledged requests, as fast as acknowledged or at
//! `--rate`; acknowledgements per second, PUBLISH-to-ack times, weir's and
//! this tool's CPU, weir's peak memory.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{ensure, Context};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use weir_proto::pb::ingress_client::IngressClient;
use weir_proto::pb::PublishRequest;

use crate::broker::{measure, BrokerReport};
use crate::cli::{GrpcArgs, Pacing};
use crate::mqtt::LATENCY_EVERY;
use crate::pacer::{take_burst, Pacer};
use crate::shared::{on_thread, Counters, DRAIN_PATIENCE};
use crate::stamp::{stamped, STAMP};

pub async fn grpc(a: &GrpcArgs, clk_tck: f64) -> anyhow::Result<BrokerReport> {
    ensure!(
        a.shape.size >= STAMP,
        "--size must be at least {STAMP} bytes"
    );
    ensure!(a.streams > 0, "--streams must be at least 1");
    ensure!(
        (1..65_535).contains(&a.shape.window),
        "--window must be between 1 and 65534"
    );
    let counters = Arc::new(Counters::default());
    let stop = CancellationToken::new();
    let publishers = tokio::spawn(on_thread("load-pub", {
        let (a, counters, stop) = (a.clone(), Arc::clone(&counters), stop.clone());
        move || async move {
            let rate = a.shape.rate.map(|r| r / a.streams as f64);
            let streams = (0..a.streams)
                .map(|_| stream(a.clone(), rate, Arc::clone(&counters), stop.clone()));
            for r in futures::future::join_all(streams).await {
                r?;
            }
            anyhow::Ok(())
        }
    }));
    let m = measure(a.pid, &counters, a.shape.warmup, a.shape.seconds, clk_tck).await;
    stop.cancel();
    publishers.await.context("publisher thread")??;
    Ok(m.report("grpc", serde_json::to_value(a)?, &counters))
}

/// One `PublishStream` call until `stop`, then its in-flight requests'
/// acknowledgements.
async fn stream(
    a: GrpcArgs,
    rate: Option<f64>,
    counters: Arc<Counters>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", a.addr))?
        .tcp_nodelay(true)
        .connect()
        .await
        .with_context(|| format!("connecting to weir's gRPC ingress {}", a.addr))?;
    let mut client = IngressClient::new(channel);
    let window = Arc::new(Semaphore::new(a.shape.window));
    let (tx, rx) = tokio::sync::mpsc::channel::<PublishRequest>(a.shape.window);
    let requests =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let base = std::time::Instant::now();
    let sent_at: Arc<Vec<AtomicU64>> =
        Arc::new((0..=u16::MAX).map(|_| AtomicU64::new(0)).collect());

    let writer = {
        let (window, counters, sent_at) = (
            Arc::clone(&window),
            Arc::clone(&counters),
            Arc::clone(&sent_at),
        );
        async move {
            let mut pacer = rate.map(|r| Pacer::new(r, Pacing::Tick));
            let mut id = 0u64;
            while let Some(n) = take_burst(pacer.as_ref(), &window, &stop, None).await? {
                let now_us = base.elapsed().as_micros() as u64;
                for _ in 0..n {
                    id += 1;
                    sent_at[(id & 0xFFFF) as usize].store(now_us, Ordering::Relaxed);
                    let seq = counters.sent.fetch_add(1, Ordering::Relaxed);
                    let request = PublishRequest {
                        stream: "bench".into(),
                        payload: stamped(a.shape.size, seq),
                        id,
                    };
                    tx.send(request).await.context("weir closed the stream")?;
                }
                if let Some(p) = &mut pacer {
                    p.sent += n;
                }
            }
            tokio::time::timeout(DRAIN_PATIENCE, window.acquire_many(a.shape.window as u32))
                .await
                .context("weir did not acknowledge every request in time")??
                .forget();
            // Dropping the sender ends the request stream; weir then ends
            // the acknowledgements.
            drop(tx);
            anyhow::Ok(())
        }
    };
    let reader = async {
        let mut acks = client
            .publish_stream(requests)
            .await
            .context("PublishStream refused")?
            .into_inner();
        let mut latencies = Vec::new();
        while let Some(ack) = acks.message().await.context("PublishStream failed")? {
            counters.acked.fetch_add(1, Ordering::Relaxed);
            window.add_permits(1);
            if counters.measuring.load(Ordering::Relaxed) && ack.id % u64::from(LATENCY_EVERY) == 0
            {
                let at = sent_at[(ack.id & 0xFFFF) as usize].load(Ordering::Relaxed);
                latencies.push((base.elapsed().as_micros() as u64).saturating_sub(at));
            }
        }
        counters
            .ack_latency_us
            .lock()
            .expect("not poisoned")
            .append(&mut latencies);
        anyhow::Ok(())
    };
    let (w, r) = tokio::join!(writer, reader);
    w.and(r)
}
