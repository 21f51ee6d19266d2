//! A one-off link probe: the two-transfer method of the piping paper
//! (Dzhagaryan and Milenkovic, Eq. 5-6). Two batches of different sizes go
//! through the configured egress (and emulated link, if any); from their
//! times, `Th_up` and `T_sc` follow. Probe batches carry no records, only
//! `padding`, so consumers see empty batches and ignore them.

use std::time::{Duration, Instant};

use weir_core::link_estimate::{two_transfer_probe, LinkEstimate};
use weir_core::{ClassId, NodeId};
use weir_proto::{pb, Encoding};

use super::batch::EncodedBatch;
use super::file::FileSink;
use super::link::{EmulatedLink, LinkProfile};
use super::sink::Sink;
use crate::config::{Config, EgressSink};

/// Transfers per size; the median time is used, so one hiccup does not
/// skew the result.
pub const REPEATS: usize = 3;

/// What the probe measured.
#[derive(Debug, Clone, Copy)]
pub struct ProbeReport {
    /// The smaller transfer: bytes and median time.
    pub small: (u64, Duration),
    /// The larger transfer: bytes and median time.
    pub large: (u64, Duration),
    /// `Th_up` and `T_sc` solved from the two.
    pub estimate: LinkEstimate,
}

fn probe_batch(node: NodeId, seq: u64, bytes: u64) -> EncodedBatch {
    let body = weir_proto::encode_batch(&pb::Batch {
        padding: vec![0x5a; bytes as usize].into(),
        node,
        batch_seq: seq,
        created_us: crate::clock::unix_micros(),
        records: Vec::new(),
    });
    EncodedBatch {
        seq,
        class: ClassId(0),
        records: 0,
        node,
        body,
        encoding: Encoding::Identity,
    }
}

/// Why a probe gave no estimate.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The sizes asked for cannot separate `T_sc` from bandwidth.
    #[error("the large transfer must be larger than the small one")]
    Sizes,
    /// The file egress could not start in its directory (not creatable,
    /// or weir is writing this node's segments there now).
    #[error("cannot write segments in egress.file.dir: {0}")]
    Dir(#[source] std::io::Error),
    /// A transfer was not confirmed.
    #[error("probe transfer failed: {0}")]
    Transfer(#[source] super::sink::SinkError),
    /// The two transfers do not determine the link.
    #[error("the two transfers do not determine the link: {0}")]
    Fit(String),
}

/// Delivers `REPEATS` probe batches of `size` padding bytes; their body
/// size and the median transfer time.
async fn measure<S: Sink>(
    sink: &mut S,
    node: NodeId,
    first_seq: u64,
    size: u64,
) -> Result<(u64, Duration), ProbeError> {
    let mut times = Vec::with_capacity(REPEATS);
    let mut body = 0;
    for i in 0..REPEATS as u64 {
        let batch = probe_batch(node, first_seq + i, size);
        body = batch.body.len() as u64;
        let started = Instant::now();
        sink.deliver(&batch).await.map_err(ProbeError::Transfer)?;
        times.push(started.elapsed());
    }
    times.sort();
    Ok((body, times[times.len() / 2]))
}

async fn probe_with<S: Sink>(
    mut sink: S,
    node: NodeId,
    small: u64,
    large: u64,
) -> Result<ProbeReport, ProbeError> {
    // Sequence numbers from the clock, like every batch of this node.
    let seed = crate::clock::unix_micros();
    let small = measure(&mut sink, node, seed, small).await?;
    let large = measure(&mut sink, node, seed + REPEATS as u64, large).await?;
    let estimate = two_transfer_probe(small.0, small.1, large.0, large.1)
        .map_err(|e| ProbeError::Fit(e.to_string()))?;
    Ok(ProbeReport {
        small,
        large,
        estimate,
    })
}

/// Probes the uplink of `cfg`'s egress with transfers of about `small` and
/// `large` bytes.
pub async fn probe_link(cfg: &Config, small: u64, large: u64) -> Result<ProbeReport, ProbeError> {
    if large <= small {
        return Err(ProbeError::Sizes);
    }
    let link = cfg.egress.link.as_ref().map(|l| LinkProfile {
        bytes_per_sec: l.bandwidth_bytes_per_sec,
        delay: l.delay,
    });
    let node = cfg.node.id;
    match (&cfg.egress.sink, link) {
        (EgressSink::File(f), None) => {
            probe_with(
                FileSink::new(f, node).map_err(ProbeError::Dir)?,
                node,
                small,
                large,
            )
            .await
        }
        (EgressSink::File(f), Some(p)) => {
            probe_with(
                EmulatedLink::new(p, FileSink::new(f, node).map_err(ProbeError::Dir)?),
                node,
                small,
                large,
            )
            .await
        }
        (EgressSink::Amqp(a), None) => {
            probe_with(
                super::amqp::AmqpSink::new(a.clone(), node).with_classes(&cfg.classes),
                node,
                small,
                large,
            )
            .await
        }
        (EgressSink::Mqtt(m), None) => {
            probe_with(
                super::mqtt::MqttSink::new(m.clone(), node, &cfg.classes),
                node,
                small,
                large,
            )
            .await
        }
        (EgressSink::Mqtt(m), Some(p)) => {
            probe_with(
                EmulatedLink::new(p, super::mqtt::MqttSink::new(m.clone(), node, &cfg.classes)),
                node,
                small,
                large,
            )
            .await
        }
        (EgressSink::Kafka(k), None) => {
            probe_with(
                super::kafka::KafkaSink::new(k.clone(), node, &cfg.classes),
                node,
                small,
                large,
            )
            .await
        }
        (EgressSink::Kafka(k), Some(p)) => {
            probe_with(
                EmulatedLink::new(
                    p,
                    super::kafka::KafkaSink::new(k.clone(), node, &cfg.classes),
                ),
                node,
                small,
                large,
            )
            .await
        }
        (EgressSink::Amqp(a), Some(p)) => {
            probe_with(
                EmulatedLink::new(
                    p,
                    super::amqp::AmqpSink::new(a.clone(), node).with_classes(&cfg.classes),
                ),
                node,
                small,
                large,
            )
            .await
        }
    }
}
