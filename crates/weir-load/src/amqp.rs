//! AMQP: the consumer that checks and times every record (weir's batches
//! or the direct baseline's messages), the direct publisher, and the
//! clean-up of a run's queue and exchange.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use anyhow::{bail, Context};
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, ExchangeDeleteOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Confirmation, Connection, ConnectionProperties};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::cli::{Pacing, QueueTypeArg};
use crate::pacer::{Pacer, MAX_BURST};
use crate::report::Integrity;
use crate::shared::{on_thread, Counters};
use crate::stamp::{now_us, read_stamp, stamped};

/// Consumer prefetch: far more messages than are ever unacknowledged, so
/// RabbitMQ never waits on the consumer.
const PREFETCH: u16 = 4096;

/// The consumer acknowledges (with `multiple`) every this many messages.
const ACK_EVERY: u32 = 64;

/// What the consumed messages hold.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// A `weir.v1.Batch` of records.
    WeirBatch,
    /// One record's payload (the direct baseline).
    Raw,
}

/// One consumed record.
#[derive(Clone)]
pub struct Sample {
    /// The record's topic (empty when direct).
    pub key: String,
    pub send_us: u64,
    /// weir's ingress timestamp (0 when direct).
    pub ingress_us: u64,
    /// When weir's egress encoded the record's batch (0 when direct).
    pub created_us: u64,
    pub consumed_us: u64,
}

/// What the consumer saw.
#[derive(Default)]
pub struct Consumed {
    pub samples: Vec<Sample>,
    /// `created_us` of every weir batch, in consumption order.
    pub batches: Vec<u64>,
    /// Bit per load sequence number.
    pub seen: Vec<u64>,
    pub unique: u64,
    pub total: u64,
}

impl Consumed {
    fn mark(&mut self, seq: u64) {
        let (word, bit) = ((seq / 64) as usize, seq % 64);
        if word >= self.seen.len() {
            self.seen.resize(word + 1 + word / 2, 0);
        }
        if self.seen[word] & (1 << bit) == 0 {
            self.seen[word] |= 1 << bit;
            self.unique += 1;
        }
        self.total += 1;
    }

    /// Takes in one weir batch, `data` encoded as `encoding`, consumed at
    /// `consumed_us`.
    pub fn weir_batch(
        &mut self,
        data: &[u8],
        encoding: &str,
        consumed_us: u64,
    ) -> anyhow::Result<()> {
        let batch = weir_proto::decode_batch(data, encoding, 64 << 20)
            .context("a message that is not a weir batch")?;
        self.batches.push(batch.created_us);
        for r in &batch.records {
            let (send_us, seq) =
                read_stamp(&r.payload).context("a record without a weir-load stamp")?;
            self.mark(seq);
            self.samples.push(Sample {
                key: r.key.clone(),
                send_us,
                ingress_us: r.ingress_us,
                created_us: batch.created_us,
                consumed_us,
            });
        }
        Ok(())
    }

    /// Takes in one record published as it is (no weir batch around it).
    pub fn raw(&mut self, payload: &[u8], consumed_us: u64) -> anyhow::Result<()> {
        let (send_us, seq) = read_stamp(payload).context("a message without a weir-load stamp")?;
        self.mark(seq);
        self.samples.push(Sample {
            key: String::new(),
            send_us,
            ingress_us: 0,
            created_us: 0,
            consumed_us,
        });
        Ok(())
    }

    pub fn integrity(&self, acked: u64) -> Integrity {
        Integrity {
            acked,
            consumed: self.total,
            unique: self.unique,
            duplicates: self.total - self.unique,
            lost: acked.saturating_sub(self.unique),
        }
    }
}

/// A consumer on its own thread.
pub struct Consumer {
    pub(crate) stop: CancellationToken,
    pub(crate) done: std::pin::Pin<Box<dyn Future<Output = anyhow::Result<Consumed>> + Send>>,
}

impl Consumer {
    /// Starts consuming `queue` (declaring it durable, as weir does) and
    /// returns once the consumer is registered.
    pub async fn start(
        url: String,
        queue: String,
        queue_type: QueueTypeArg,
        body: Body,
        counters: Arc<Counters>,
    ) -> anyhow::Result<Consumer> {
        let stop = CancellationToken::new();
        let (ready_tx, ready_rx) = oneshot::channel();
        let done = Box::pin(on_thread("load-con", {
            let stop = stop.clone();
            move || async move {
                let out = consume(
                    url,
                    queue,
                    queue_type,
                    body,
                    Arc::clone(&counters),
                    stop,
                    ready_tx,
                )
                .await;
                if let Err(e) = &out {
                    *counters.consumer_failed.lock().expect("not poisoned") =
                        Some(format!("{e:#}"));
                }
                out
            }
        }));
        let mut consumer = Consumer { stop, done };
        // Cancel safety: both branches only wait; the consumer future is
        // polled by reference and kept.
        tokio::select! {
            r = ready_rx => r.context("the consumer could not start")?,
            r = &mut consumer.done => {
                r?;
                bail!("the consumer stopped at once");
            }
        }
        Ok(consumer)
    }

    pub async fn stop(self) -> anyhow::Result<Consumed> {
        self.stop.cancel();
        self.done.await
    }
}

#[allow(clippy::too_many_arguments)]
pub async fn consume(
    url: String,
    queue: String,
    queue_type: QueueTypeArg,
    body: Body,
    counters: Arc<Counters>,
    stop: CancellationToken,
    ready: oneshot::Sender<()>,
) -> anyhow::Result<Consumed> {
    let conn = Connection::connect(&url, ConnectionProperties::default())
        .await
        .with_context(|| format!("RabbitMQ at {url} (run scripts/services.sh)"))?;
    let ch = conn.create_channel().await?;
    ch.basic_qos(PREFETCH, BasicQosOptions::default()).await?;
    // Declared as weir declares it (equivalent, so either may go first).
    let mut declared = FieldTable::default();
    let mut consume_args = FieldTable::default();
    if queue_type != QueueTypeArg::Classic {
        declared.insert(
            "x-queue-type".into(),
            AMQPValue::LongString(queue_type.name().into()),
        );
    }
    if queue_type == QueueTypeArg::Stream {
        consume_args.insert(
            "x-stream-offset".into(),
            AMQPValue::LongString("first".into()),
        );
    }
    ch.queue_declare(
        queue.as_str().into(),
        QueueDeclareOptions::durable(),
        declared,
    )
    .await
    .with_context(|| format!("declaring {} queue {queue}", queue_type.name()))?;
    let mut consumer = ch
        .basic_consume(
            queue.as_str().into(),
            "weir-load".into(),
            BasicConsumeOptions::default(),
            consume_args,
        )
        .await?;
    let _ = ready.send(());
    let mut seen = Consumed::default();
    let mut unacked = None;
    let mut pending = 0u32;
    loop {
        // Cancel safety: `next` on lapin's consumer is cancel safe (a
        // delivery not returned stays queued in it); `cancelled` only waits.
        let next = tokio::select! {
            d = consumer.next() => d,
            _ = stop.cancelled() => break,
        };
        let delivery = next.context("the consumer was cancelled by RabbitMQ")??;
        let consumed_us = now_us();
        let before = seen.total;
        match body {
            Body::WeirBatch => {
                let encoding = delivery
                    .properties
                    .content_encoding()
                    .as_ref()
                    .map_or("identity", |s| s.as_str())
                    .to_string();
                seen.weir_batch(&delivery.data, &encoding, consumed_us)?;
            }
            Body::Raw => seen.raw(&delivery.data, consumed_us)?,
        }
        counters
            .consumed
            .fetch_add(seen.total - before, Ordering::Relaxed);
        counters.messages.fetch_add(1, Ordering::Relaxed);
        pending += 1;
        if pending >= ACK_EVERY {
            delivery.ack(BasicAckOptions { multiple: true }).await?;
            pending = 0;
            unacked = None;
        } else {
            unacked = Some(delivery);
        }
    }
    if let Some(d) = unacked {
        d.ack(BasicAckOptions { multiple: true }).await?;
    }
    let _ = conn.close(200, "done".into()).await;
    Ok(seen)
}

/// The baseline: one persistent message per record straight to `queue`
/// (default exchange) with publisher confirms, paced at `rate`. Confirms
/// are awaited in order alongside the publishing, never one at a time.
/// Returns each message's (send time, publish-to-confirm) in microseconds.
pub async fn direct_publisher(
    url: String,
    queue: String,
    rate: f64,
    pacing: Pacing,
    size: usize,
    counters: Arc<Counters>,
    stop: CancellationToken,
) -> anyhow::Result<Vec<(u64, u64)>> {
    let conn = Connection::connect(&url, ConnectionProperties::default())
        .await
        .with_context(|| format!("RabbitMQ at {url}"))?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(u64, lapin::PublisherConfirm)>(1 << 16);
    let confirmer = async {
        let mut took = Vec::new();
        while let Some((sent_us, c)) = rx.recv().await {
            match c.await? {
                Confirmation::Ack(None) => {
                    took.push((sent_us, now_us().saturating_sub(sent_us)));
                    counters.acked.fetch_add(1, Ordering::Relaxed);
                }
                other => bail!("RabbitMQ did not confirm a direct publish: {other:?}"),
            }
        }
        anyhow::Ok(took)
    };
    let publisher = async {
        let mut pacer = Pacer::new(rate, pacing);
        let props = BasicProperties::default().with_delivery_mode(2);
        while !stop.is_cancelled() {
            let due = pacer.due();
            if due == 0 {
                pacer.wait(&stop).await;
                continue;
            }
            for _ in 0..due.min(MAX_BURST as u64) {
                let seq = counters.sent.fetch_add(1, Ordering::Relaxed);
                let payload = stamped(size, seq);
                let sent_us = read_stamp(&payload).map_or(0, |(t, _)| t);
                let confirm = ch
                    .basic_publish(
                        "".into(),
                        queue.as_str().into(),
                        BasicPublishOptions::default(),
                        &payload,
                        props.clone(),
                    )
                    .await?;
                tx.send((sent_us, confirm)).await?;
                pacer.sent += 1;
            }
        }
        drop(tx);
        anyhow::Ok(())
    };
    let (p, c) = tokio::join!(publisher, confirmer);
    p?;
    let took = c?;
    let _ = conn.close(200, "done".into()).await;
    Ok(took)
}

pub async fn delete_topology(url: &str, queue: &str, exchange: Option<&str>) {
    let Ok(conn) = Connection::connect(url, ConnectionProperties::default()).await else {
        return;
    };
    if let Ok(ch) = conn.create_channel().await {
        let _ = ch
            .queue_delete(queue.into(), QueueDeleteOptions::default())
            .await;
        if let Some(x) = exchange {
            let _ = ch
                .exchange_delete(x.into(), ExchangeDeleteOptions::default())
                .await;
        }
    }
    let _ = conn.close(200, "done".into()).await;
}
