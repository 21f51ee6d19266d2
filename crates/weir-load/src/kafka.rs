//! Kafka as weir's destination (`--kafka`): the run's topic, made before
//! weir starts and deleted after, and a consumer that reads weir's batches
//! from it as the AMQP consumer does from the queue.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use anyhow::Context;
use rskafka::client::partition::{OffsetAt, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};
use tokio_util::sync::CancellationToken;

use crate::amqp::{Consumed, Consumer};
use crate::shared::{on_thread, Counters};

async fn client(broker: &str) -> anyhow::Result<Client> {
    ClientBuilder::new(vec![broker.to_owned()])
        .build()
        .await
        .with_context(|| format!("Kafka at {broker} (run scripts/services.sh)"))
}

/// Creates the run's topic (one partition: one weir node writes it).
pub async fn create_topic(broker: &str, topic: &str) -> anyhow::Result<()> {
    client(broker)
        .await?
        .controller_client()?
        .create_topic(topic, 1, 1, 10_000)
        .await
        .with_context(|| format!("creating topic {topic}"))
}

/// Deletes the run's topic; failures are only logged.
pub async fn delete_topic(broker: &str, topic: &str) {
    let deleted = async {
        client(broker)
            .await?
            .controller_client()?
            .delete_topic(topic, 10_000)
            .await
            .map_err(anyhow::Error::from)
    };
    if let Err(e) = deleted.await {
        eprintln!("weir-load: could not delete topic {topic}: {e:#}");
    }
}

/// Starts reading `topic` from its start on a thread of its own.
pub async fn start(
    broker: String,
    topic: String,
    counters: Arc<Counters>,
) -> anyhow::Result<Consumer> {
    let stop = CancellationToken::new();
    let c = client(&broker).await?;
    drop(c);
    let done = Box::pin(on_thread("load-con", {
        let stop = stop.clone();
        move || async move {
            let out = consume(&broker, &topic, &counters, stop).await;
            if let Err(e) = &out {
                *counters.consumer_failed.lock().expect("not poisoned") = Some(format!("{e:#}"));
            }
            out
        }
    }));
    Ok(Consumer { stop, done })
}

async fn consume(
    broker: &str,
    topic: &str,
    counters: &Counters,
    stop: CancellationToken,
) -> anyhow::Result<Consumed> {
    let c = client(broker).await?;
    let partition = c
        .partition_client(topic, 0, UnknownTopicHandling::Retry)
        .await?;
    let mut next = partition.get_offset(OffsetAt::Earliest).await?;
    let mut seen = Consumed::default();
    loop {
        // Cancel safety: a fetch cut off is asked again from the same
        // offset (or not at all, once stopped).
        let fetched = tokio::select! {
            f = partition.fetch_records(next, 1..(64 << 20), 100) => f?,
            _ = stop.cancelled() => break,
        };
        let consumed_us = crate::stamp::now_us();
        for r in fetched.0 {
            next = r.offset + 1;
            let encoding = r
                .record
                .headers
                .get("weir-encoding")
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_else(|| "identity".into());
            let before = seen.total;
            seen.weir_batch(
                r.record.value.as_deref().unwrap_or_default(),
                &encoding,
                consumed_us,
            )?;
            counters
                .consumed
                .fetch_add(seen.total - before, Ordering::Relaxed);
            counters.messages.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(seen)
}
