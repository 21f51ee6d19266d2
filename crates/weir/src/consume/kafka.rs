//! `weir consume` from a Kafka topic: every partition read in turn from
//! the offset the state names (or `--offset` on a first run), each Kafka
//! record a weir batch (its `weir-encoding` header says how the value is
//! compressed). A commit writes the output, then the state with each
//! partition's next offset; nothing is committed to Kafka, so no consumer
//! group is needed and the offsets can never run ahead of the output.

use std::time::Duration;

use anyhow::Context;
use rskafka::client::partition::{OffsetAt, PartitionClient, UnknownTopicHandling};
use tokio_util::sync::CancellationToken;

use super::commits::{Commits, ConsumeOptions, ConsumeReport, StartOffset};
use crate::config::KafkaEgress;

/// How long one fetch waits for records when a partition has none.
const FETCH_WAIT: Duration = Duration::from_millis(100);
/// Most bytes one fetch returns.
const FETCH_BYTES: i32 = 16 << 20;

pub(super) async fn run(
    opts: &ConsumeOptions,
    kafka: &KafkaEgress,
    stop: CancellationToken,
) -> anyhow::Result<ConsumeReport> {
    let topic = &kafka.topic;
    let mut c = Commits::restore(opts)?;
    let brokers = kafka.brokers.join(",");
    let client = crate::egress::kafka::client_builder(kafka, "weir-consume".into())
        .map_err(|e| anyhow::anyhow!("{}: {}", e.key, e.message))?
        .build()
        .await
        .with_context(|| format!("connecting to Kafka at {brokers}"))?;
    let partitions = client
        .list_topics()
        .await
        .with_context(|| format!("listing the topics on {brokers}"))?
        .into_iter()
        .find(|t| &t.name == topic)
        .with_context(|| format!("no topic {topic:?} on {brokers}"))?
        .partitions;
    let mut readers = Vec::new();
    for p in partitions {
        let pc = client
            .partition_client(topic.as_str(), p, UnknownTopicHandling::Error)
            .await
            .with_context(|| format!("partition {p} of {topic}"))?;
        let next = start_offset(&pc, c.kafka_offsets.get(&p).copied(), opts.offset).await?;
        c.kafka_offsets.insert(p, next);
        readers.push((p, pc));
    }
    // Where each partition starts is part of the state from now on.
    c.commit_local()?;
    let commit_every = usize::from(opts.prefetch.max(2) / 2);
    let mut idle_since = tokio::time::Instant::now();
    let mut line = Vec::with_capacity(512);
    let wait = FETCH_WAIT / readers.len().max(1) as u32;
    'reading: loop {
        let mut got = 0;
        for (p, pc) in &readers {
            if opts.max_records.is_some_and(|m| c.run.records >= m) {
                break 'reading;
            }
            let next = c.kafka_offsets[p];
            // Cancel safety: a fetch cut off is asked again from the same
            // offset on the next run (nothing of it was taken).
            let fetched = tokio::select! {
                () = stop.cancelled() => break 'reading,
                f = pc.fetch_records(next, 1..FETCH_BYTES, wait.as_millis() as i32) => f,
            };
            let (records, _high) = fetched.with_context(|| format!("reading {topic}/{p}"))?;
            for r in records {
                got += 1;
                let encoding = r
                    .record
                    .headers
                    .get(crate::egress::kafka::HEADER_ENCODING)
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .unwrap_or_else(|| "identity".into());
                let value = r.record.value.unwrap_or_default();
                c.run.messages += 1;
                match weir_proto::decode_batch(&value, &encoding, opts.max_size) {
                    Ok(batch) => c.write_records(&batch, opts.payload, &mut line)?,
                    Err(e) => {
                        c.run.undecodable += 1;
                        eprintln!(
                            "weir consume: {topic}/{p} offset {} is not a weir batch ({e}); skipped",
                            r.offset
                        );
                    }
                }
                c.kafka_offsets.insert(*p, r.offset + 1);
                c.pending_count += 1;
                if c.pending_count >= commit_every {
                    c.commit_local()?;
                }
            }
        }
        if got == 0 {
            // Nothing waiting: commit what was read.
            if c.pending_count > 0 {
                c.commit_local()?;
            }
            if opts
                .idle_exit
                .is_some_and(|idle| idle_since.elapsed() >= idle)
            {
                break;
            }
        } else {
            idle_since = tokio::time::Instant::now();
        }
    }
    if c.pending_count > 0 {
        c.commit_local()?;
    }
    Ok(c.run)
}

/// Where a partition is read from: after what the state committed, else
/// as `--offset` says.
async fn start_offset(
    pc: &PartitionClient,
    stored: Option<i64>,
    offset: StartOffset,
) -> anyhow::Result<i64> {
    if let Some(next) = stored {
        return Ok(next);
    }
    Ok(match offset {
        StartOffset::First => pc.get_offset(OffsetAt::Earliest).await?,
        StartOffset::Next => pc.get_offset(OffsetAt::Latest).await?,
        StartOffset::Last => (pc.get_offset(OffsetAt::Latest).await? - 1).max(0),
        StartOffset::At(n) => i64::try_from(n).context("--offset is too large")?,
    })
}
