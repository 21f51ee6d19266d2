//! The steps the throughput and latency runs share: how often they sample,
//! priming weir, waiting for the consumer to catch up, and the egress
//! cycles of the batches consumed.

use std::time::Duration;

use anyhow::ensure;
use tokio::time::Instant;

use crate::child::Weir;
use crate::shared::{Counters, DRAIN_PATIENCE};

/// How often `/proc` is sampled for the memory timeline.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// After the consumer has caught up, how long it keeps listening so that a
/// re-published batch (a duplicate) can show up.
pub const LINGER: Duration = Duration::from_secs(1);

/// Records sent before measuring idle memory, so that weir has connected
/// to RabbitMQ (it connects on its first batch).
pub const PRIMING_RECORDS: u64 = 100;

/// A consumer of `weir`'s batches from its RabbitMQ queue, counting into
/// `counters`.
pub async fn consume_weir(
    env: &crate::shared::Env,
    weir: &Weir,
    counters: &std::sync::Arc<Counters>,
) -> anyhow::Result<crate::amqp::Consumer> {
    if let Some(addr) = env.mqtt_egress {
        return crate::mqtt_out::start(
            addr,
            format!("{}/#", weir.queue),
            std::sync::Arc::clone(counters),
        )
        .await;
    }
    if let Some(broker) = &env.kafka {
        return crate::kafka::start(
            broker.clone(),
            weir.queue.clone(),
            std::sync::Arc::clone(counters),
        )
        .await;
    }
    crate::amqp::Consumer::start(
        env.amqp.clone(),
        weir.queue.clone(),
        env.queue_type,
        crate::amqp::Body::WeirBatch,
        std::sync::Arc::clone(counters),
    )
    .await
}

/// The priming load: [`PRIMING_RECORDS`] records to `topic` as fast as
/// acknowledged, as `<name>-prime`.
pub fn prime_load(
    addr: std::net::SocketAddr,
    name: &str,
    topic: &str,
    size: usize,
) -> crate::mqtt::MqttLoad {
    crate::mqtt::MqttLoad {
        addr,
        client_id: format!("{name}-prime"),
        topic: topic.to_owned(),
        size,
        window: 100,
        rate: None,
        pacing: crate::cli::Pacing::Tick,
        limit: Some(PRIMING_RECORDS),
        tls: None,
    }
}

/// Primes `weir` with `load` (it connects to RabbitMQ on its first batch)
/// and waits until the consumer has every primed record.
pub async fn prime_weir(
    weir: &mut Weir,
    counters: &std::sync::Arc<Counters>,
    load: crate::mqtt::MqttLoad,
) -> anyhow::Result<()> {
    crate::mqtt::run_publishers(
        vec![load],
        std::sync::Arc::clone(counters),
        tokio_util::sync::CancellationToken::new(),
    )
    .await?;
    wait_consumed(counters, weir).await
}

/// Waits until the consumer has seen every acknowledged record.
pub async fn wait_consumed(counters: &Counters, weir: &mut Weir) -> anyhow::Result<()> {
    let deadline = Instant::now() + DRAIN_PATIENCE;
    loop {
        let (acked, consumed, _) = counters.get();
        if consumed >= acked {
            return Ok(());
        }
        weir.check_alive()?;
        counters.check_consumer()?;
        ensure!(
            Instant::now() < deadline,
            "after {DRAIN_PATIENCE:?} the consumer has {consumed} of {acked} acknowledged records (weir log: {})",
            weir.log.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Gaps between consecutive weir batches created in `[from_us, to_us)`.
/// weir's egress is serial and the queue has one consumer, so consumption
/// order is creation order.
pub fn egress_cycles(batches: &[u64], from_us: u64, to_us: u64) -> Vec<u64> {
    batches
        .windows(2)
        .filter(|w| w[0] >= from_us && w[1] < to_us)
        .map(|w| w[1].saturating_sub(w[0]))
        .collect()
}
