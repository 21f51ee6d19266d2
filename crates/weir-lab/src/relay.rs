//! A job through weir's own relay path: an [`App`] whose file egress sits
//! behind `[egress.link]` (the same fixed-delay-plus-bandwidth emulation),
//! with records enqueued through `app.ingress` as the gRPC and MQTT front
//! ends do. Everything between enqueue and the file (classes, PBTT, token
//! buckets, the scheduler's batch plans from its online fits, the egress's
//! uplink estimate) is weir's production code with its default priors.
//!
//! The wall-clock of a job runs from its first enqueue until weir's
//! `records_forwarded` counter (bumped when the sink confirms a batch) has
//! counted every record of it; the batch sizes are read back from the batch
//! files.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use tokio::time::Instant;
use weir::app::App;

use crate::link::Link;

/// Stream name the lab's records arrive on; the default classifier puts
/// unrouted streams in the last, least urgent class.
const STREAM: &str = "weir-lab";

/// How often the delivery counter is read: well under the link's timer
/// resolution, and a render of a few metrics costs microseconds.
const POLL: Duration = Duration::from_micros(500);

/// Longest a job may take through the relay before the lab gives up.
const JOB_TIMEOUT: Duration = Duration::from_secs(120);

/// Most bytes of one batch file the lab decodes.
const MAX_BATCH_FILE: usize = 64 << 20;

/// weir's config for the lab: no MQTT, gRPC on a free loopback port (weir
/// wants one ingress; the lab enqueues directly), compression off (the
/// job's bytes are the link's bytes), one file egress in `dir` behind
/// `link`, and the latency-tolerant class bound set to `bound`. Everything
/// else, including the uplink and `T_sc` priors, is weir's default.
pub fn config_text(dir: &Path, link: &Link, bound: Duration) -> String {
    format!(
        r#"
[[class]]
name = "ls"
bound = "100ms"

[[class]]
name = "nm"
bound = "500ms"

[[class]]
name = "lt"
bound = "{bound_us}us"

[ingress.mqtt]
enabled = false

[ingress.grpc]
listen = "127.0.0.1:0"

[compression]
enabled = false

[egress]
kind = "file"

[egress.file]
dir = "{dir}"

[egress.link]
bandwidth = "{bw}B/s"
delay = "{delay_us}us"
"#,
        bound_us = bound.as_micros(),
        dir = dir
            .display()
            .to_string()
            .replace('\\', "\\\\")
            .replace('"', "\\\""),
        bw = link.bytes_per_sec.round() as u64,
        delay_us = link.per_transaction.as_micros(),
    )
}

/// A running relay and where its batches land.
pub struct Relay {
    app: App,
    dir: PathBuf,
}

/// What one job through the relay measured.
#[derive(Debug, Clone, PartialEq)]
pub struct RelayRun {
    /// First enqueue to the confirmation of the last record.
    pub wall: Duration,
    /// Records per batch, in sending order.
    pub batches: Vec<usize>,
}

impl Relay {
    /// Starts weir with [`config_text`], its batches in a fresh directory
    /// under `parent`.
    pub async fn start(parent: &Path, link: &Link, bound: Duration) -> anyhow::Result<Relay> {
        let dir = parent.join(format!("relay-{}", std::process::id()));
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .with_context(|| format!("cannot clear {}", dir.display()))?;
        }
        let text = config_text(&dir, link, bound);
        let cfg = weir::config::parse(&text, "weir-lab relay config")
            .map_err(|e| anyhow::anyhow!("the lab's relay config is invalid: {e}"))?;
        let app = App::start(cfg).await.context("cannot start weir")?;
        Ok(Relay { app, dir })
    }

    /// Records weir has confirmed so far.
    fn forwarded(&self) -> u64 {
        forwarded_total(&self.app.ingress.metrics().render())
    }

    /// Sends `records` records of `record_bytes` bytes, one every
    /// `interval`, and waits until weir has delivered all of them.
    pub async fn run_job(
        &self,
        records: u32,
        record_bytes: u64,
        interval: Duration,
    ) -> anyhow::Result<RelayRun> {
        let before = batch_sizes(&self.dir)?.len();
        let target = self.forwarded() + u64::from(records);
        let payload = Bytes::from(vec![0x5a; record_bytes as usize]);
        let ingress = std::sync::Arc::clone(&self.app.ingress);
        let epoch = Instant::now();
        let producer = tokio::spawn(async move {
            for k in 0..records {
                tokio::time::sleep_until(epoch + interval * k).await;
                let r = ingress.grpc_record(STREAM, payload.clone());
                ingress
                    .enqueue(r, None)
                    .await
                    .map_err(|e| anyhow::anyhow!("weir refused a record: {e}"))?;
            }
            anyhow::Ok(())
        });
        let wall = tokio::time::timeout(JOB_TIMEOUT, async {
            while self.forwarded() < target {
                tokio::time::sleep(POLL).await;
            }
            epoch.elapsed()
        })
        .await
        .context("weir did not deliver the job within two minutes")?;
        producer.await.context("the producer panicked")??;
        let mut batches = batch_sizes(&self.dir)?;
        batches.drain(..before.min(batches.len()));
        Ok(RelayRun { wall, batches })
    }

    /// Drains and stops weir, then removes its segments.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.app.shutdown(Duration::from_secs(10)).await;
        std::fs::remove_dir_all(&self.dir)
            .with_context(|| format!("cannot remove {}", self.dir.display()))
    }
}

/// Sum of `weir_records_forwarded_total` over classes in a metrics text.
pub fn forwarded_total(text: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with("weir_records_forwarded_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Records in each batch in `dir`'s segments, in sending order.
fn batch_sizes(dir: &Path) -> anyhow::Result<Vec<usize>> {
    let batches = weir::egress::file::read_batches(dir, MAX_BATCH_FILE)
        .with_context(|| format!("cannot read the segments in {}", dir.display()))?;
    Ok(batches.iter().map(|b| b.batch.records.len()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_relay_config_is_valid_weir_config() {
        let link = Link {
            per_transaction: Duration::from_millis(148),
            bytes_per_sec: 280_000.0,
        };
        let text = config_text(Path::new("/tmp/x \"y\""), &link, Duration::from_secs(10));
        let cfg = weir::config::parse(&text, "test").unwrap();
        let l = cfg.egress.link.unwrap();
        assert_eq!(l.delay, Duration::from_millis(148));
        assert_eq!(l.bandwidth_bytes_per_sec, 280_000.0);
        assert!(cfg.ingress.mqtt.is_none());
        assert_eq!(cfg.ingress.grpc.unwrap().listen.port(), 0);
    }

    #[test]
    fn forwarded_sums_the_classes() {
        let text = "# HELP x\nweir_records_forwarded_total{class=\"ls\"} 3\n\
                    weir_records_forwarded_total{class=\"lt\"} 47\nweir_other 9\n";
        assert_eq!(forwarded_total(text), 50);
        assert_eq!(forwarded_total(""), 0);
    }
}
