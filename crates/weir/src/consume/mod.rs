//! `weir consume`: reads weir's batches from a RabbitMQ queue or stream,
//! or from a Kafka topic (`kafka.rs`), hands each record on once (JSON
//! lines on stdout or into a file), and acknowledges the batches only
//! after that.
//!
//! # Once, across restarts
//! Records are deduplicated by `(origin, seq)` ([`weir_core::dedupe`]).
//! With `--state`, a commit (every `prefetch / 2` messages, or when no
//! message is waiting) writes the output and, with `--output`, syncs it;
//! then writes the state file (the deduplication ranges, the output's
//! length, a stream's offset) by rename; then acknowledges the messages.
//! A restart truncates the output to the length the state names (lines
//! after it were never committed: their messages come again), resumes a
//! stream after the stored offset, and drops what the stored ranges have
//! seen. From Kafka, the state holds each partition's next offset, and a
//! restart reads on from there: no consumer group is involved, so the
//! offsets and the output are committed together, by one rename. So, into a file, every record is handed on exactly once even
//! across `kill -9`; to stdout, lines written after the last commit may
//! repeat after a crash.
//!
//! The format of a line is in `docs/consuming.md`.
//!
//! Layout: `commits.rs` (options, output, state, commits), this file
//! (RabbitMQ), `kafka.rs` (Kafka).

use std::time::Duration;

use anyhow::{bail, Context};
use futures::StreamExt;
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties};
use tokio_util::sync::CancellationToken;

use commits::Commits;
pub use commits::{ConsumeOptions, ConsumeReport, PayloadFormat, StartOffset};

mod commits;
mod kafka;

/// Consumes until `stop` fires, `idle_exit` passes with nothing to read, or
/// `max_records` are handed on; commits what it read, and returns what it
/// did in this run.
pub async fn run(opts: ConsumeOptions, stop: CancellationToken) -> anyhow::Result<ConsumeReport> {
    if let Some(kafka) = &opts.kafka {
        return kafka::run(&opts, kafka, stop).await;
    }
    let mut c = Commits::restore(&opts)?;
    let shown = crate::egress::amqp::redacted_url(&opts.url);
    let conn = Connection::connect(&opts.url, ConnectionProperties::default())
        .await
        .with_context(|| format!("connecting to {shown}"))?;
    let channel = conn.create_channel().await?;
    let mut consumer = subscribe(&channel, &opts, c.stream_offset, &shown).await?;
    let commit_every = usize::from(opts.prefetch.max(2) / 2);
    let mut idle_since = tokio::time::Instant::now();
    let mut line = Vec::with_capacity(512);
    loop {
        if opts.max_records.is_some_and(|m| c.run.records >= m) {
            break;
        }
        let next = tokio::select! {
            () = stop.cancelled() => break,
            d = tokio::time::timeout(Duration::from_millis(100), consumer.next()) => d,
        };
        let delivery = match next {
            Err(_) => {
                // Nothing waiting: commit what was read.
                c.commit(&channel).await?;
                if opts
                    .idle_exit
                    .is_some_and(|idle| idle_since.elapsed() >= idle)
                {
                    break;
                }
                continue;
            }
            Ok(None) => bail!("the broker closed the consumer"),
            Ok(Some(d)) => d.context("receiving")?,
        };
        idle_since = tokio::time::Instant::now();
        c.take(&channel, &delivery, &opts, &mut line).await?;
        if c.pending_count >= commit_every {
            c.commit(&channel).await?;
        }
    }
    c.commit(&channel).await?;
    let _ = conn.close(200, "weir consume done".into()).await;
    Ok(c.run)
}

/// Consumes `opts.queue` on `channel` (a stream from just past
/// `stream_offset` when resuming, else from `opts.offset`), at most
/// `opts.prefetch` messages unacknowledged.
async fn subscribe(
    channel: &lapin::Channel,
    opts: &ConsumeOptions,
    stream_offset: Option<u64>,
    shown: &str,
) -> anyhow::Result<lapin::Consumer> {
    channel
        .basic_qos(opts.prefetch.max(1), BasicQosOptions::default())
        .await?;
    let mut args = FieldTable::default();
    if opts.stream {
        let start = match (stream_offset, opts.offset) {
            (Some(o), _) => AMQPValue::LongLongInt(o.saturating_add(1) as i64),
            (None, StartOffset::First) => AMQPValue::LongString("first".into()),
            (None, StartOffset::Last) => AMQPValue::LongString("last".into()),
            (None, StartOffset::Next) => AMQPValue::LongString("next".into()),
            (None, StartOffset::At(o)) => AMQPValue::LongLongInt(o as i64),
        };
        args.insert("x-stream-offset".into(), start);
    }
    channel
        .basic_consume(
            opts.queue.as_str().into(),
            format!("weir consume {}", std::process::id()).into(),
            BasicConsumeOptions::default(),
            args,
        )
        .await
        .with_context(|| {
            format!(
                "consuming from `{}` on {shown}{}",
                opts.queue,
                if opts.stream {
                    " (a stream)"
                } else {
                    " (for a stream, pass --stream)"
                }
            )
        })
}
