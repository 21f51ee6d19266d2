//! The cloud's consumer: the cell's queue read from RabbitMQ, and what
//! it saw.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions, ExchangeDeleteOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use tokio_util::sync::CancellationToken;

use crate::janus::{Delivered, CLASSES};

/// Consumer prefetch and acknowledgement batch.
const PREFETCH: u16 = 2048;
const ACK_EVERY: u32 = 64;

/// What the consumer has seen.
#[derive(Default)]
pub(super) struct Consumed {
    /// First delivery of every (origin, seq).
    pub(super) seen: HashMap<(u64, u64), Delivered>,
    /// Distinct records per origin (node id).
    pub(super) per_origin: HashMap<u64, u64>,
    pub(super) duplicates: u64,
    /// Batch bodies and the records in them (duplicates too).
    pub(super) body_bytes: u64,
    pub(super) records: u64,
}

/// Consumes `queue` until `stop`, keeping what it saw in `state` and the
/// distinct count in `distinct`.
pub(super) async fn consume(
    url: String,
    queue: String,
    state: Arc<Mutex<Consumed>>,
    distinct: Arc<AtomicU64>,
    stop: CancellationToken,
    ready: tokio::sync::oneshot::Sender<()>,
) -> anyhow::Result<()> {
    let conn = Connection::connect(&url, ConnectionProperties::default())
        .await
        .with_context(|| format!("RabbitMQ at {url} (run scripts/services.sh)"))?;
    let ch = conn.create_channel().await?;
    ch.basic_qos(PREFETCH, BasicQosOptions::default()).await?;
    // Declared as weir declares it, so either may go first.
    ch.queue_declare(
        queue.as_str().into(),
        QueueDeclareOptions::durable(),
        FieldTable::default(),
    )
    .await
    .with_context(|| format!("declaring queue {queue}"))?;
    let mut consumer = ch
        .basic_consume(
            queue.as_str().into(),
            "weir-lab".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let _ = ready.send(());
    let mut pending = 0u32;
    let mut unacked = None;
    loop {
        // Cancel safety: lapin's consumer keeps a delivery not returned.
        let next = tokio::select! {
            d = consumer.next() => d,
            _ = stop.cancelled() => break,
        };
        let delivery = next.context("RabbitMQ cancelled the consumer")??;
        let consumed_us = unix_us(SystemTime::now());
        let batch = batch_of(&delivery)?;
        let sent_us = weir::egress::amqp::header_u64(
            &delivery.properties,
            weir::egress::amqp::HEADER_SENT_US,
        );
        {
            let mut st = state.lock().expect("not poisoned");
            st.body_bytes += delivery.data.len() as u64;
            st.records += batch.records.len() as u64;
            for r in &batch.records {
                let Some(class) = CLASSES.iter().position(|(c, _)| *c == r.class) else {
                    continue;
                };
                let d = Delivered {
                    class,
                    latency_ms: consumed_us.saturating_sub(r.ingress_us) as f64 / 1e3,
                    at_us: consumed_us,
                    in_weir_ms: sent_us.map(|s| s.saturating_sub(r.ingress_us) as f64 / 1e3),
                };
                match st.seen.entry((r.origin, r.seq)) {
                    std::collections::hash_map::Entry::Occupied(_) => st.duplicates += 1,
                    std::collections::hash_map::Entry::Vacant(v) => {
                        v.insert(d);
                        *st.per_origin.entry(r.origin).or_default() += 1;
                        distinct.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
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
    let _ = ch
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await;
    let _ = ch
        .exchange_delete(queue.as_str().into(), ExchangeDeleteOptions::default())
        .await;
    let _ = conn.close(200, "done".into()).await;
    Ok(())
}

/// The weir batch an AMQP message carries, decoded by its content
/// encoding.
pub(crate) fn batch_of(
    delivery: &lapin::message::Delivery,
) -> anyhow::Result<weir_proto::pb::Batch> {
    let encoding = delivery
        .properties
        .content_encoding()
        .as_ref()
        .map_or("identity", |s| s.as_str());
    weir_proto::decode_batch(&delivery.data, encoding, 64 << 20)
        .context("a message that is not a weir batch")
}

pub(super) fn unix_us(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_micros() as u64
}
