//! The `throughput` run: sustained MQTT QoS 1 through weir to RabbitMQ,
//! measured over its steady part (records/s, memory, CPU, latency under
//! load).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::child::Weir;
use crate::cli::ThroughputArgs;
use crate::mqtt::{connections, run_publishers, MqttLoad};
use crate::pki::Pki;
use crate::report::{machine_info, CpuReport, Percentiles, ThroughputReport, TimelinePoint};
use crate::run::{egress_cycles, prime_load, prime_weir, wait_consumed, LINGER, SAMPLE_EVERY};
use crate::sample::{hwm_kib, rss_kib, Snapshot};
use crate::shared::{unique, Counters, Env};
use crate::stamp::{payload_kind, unix_us_at, STAMP};

/// Runs weir under sustained load and reports its steady part.
pub async fn throughput(env: &Env, a: &ThroughputArgs) -> anyhow::Result<ThroughputReport> {
    ensure!(a.size >= STAMP, "--size must be at least {STAMP} bytes");
    ensure!(
        (1..65_535).contains(&a.window),
        "--window must be between 1 and 65534 (MQTT packet ids)"
    );
    ensure!(a.connections > 0, "--connections must be at least 1");
    let name = unique("tput");
    let topic_base = format!("{name}/{}", a.class.name());
    let tls = tls_listener(a, &name)?;
    let mut weir_config = a.weir_config.clone();
    if let Some((pki, port)) = &tls {
        weir_config.set.extend(pki.weir_settings(*port));
    }
    let mut weir = Weir::start(env, &name, &weir_config).await?;
    let (addr, client_tls) = match &tls {
        Some((pki, port)) => (
            std::net::SocketAddr::from(([127, 0, 0, 1], *port)),
            Some(pki.client_config()?),
        ),
        None => (weir.mqtt, None),
    };
    let counters = Arc::new(Counters::default());
    let consumer = crate::run::consume_weir(env, &weir, &counters).await?;
    let rss_start = rss_kib(weir.pid).unwrap_or(0);

    // Prime: weir connects to RabbitMQ on its first batch.
    let prime = MqttLoad {
        tls: client_tls.clone(),
        ..prime_load(addr, &name, &format!("{topic_base}/prime"), a.size)
    };
    prime_weir(&mut weir, &counters, prime).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_idle = rss_kib(weir.pid).unwrap_or(0);

    let mut loads = connections(
        addr,
        &name,
        &topic_base,
        a.connections,
        a.size,
        a.window,
        a.rate,
    );
    for load in &mut loads {
        load.tls = client_tls.clone();
    }
    let stop = CancellationToken::new();
    let started = Instant::now();
    let mut publishers = tokio::spawn(run_publishers(loads, Arc::clone(&counters), stop.clone()));
    let warmup_end = started + Duration::from_secs(a.warmup);
    let end = warmup_end + Duration::from_secs(a.seconds);
    let (samples, first) = sample_load(
        &mut weir,
        &counters,
        &mut publishers,
        started,
        warmup_end,
        end,
    )
    .await?;
    let last = Snapshot::take(&weir, &counters).await?;
    counters.measure(false);
    stop.cancel();
    publishers.await.context("publisher thread")??;
    wait_consumed(&counters, &mut weir).await?;
    tokio::time::sleep(LINGER).await;
    let consumed = consumer.stop().await?;
    let hwm = hwm_kib(weir.pid).unwrap_or(0);
    weir.stop(env.keep).await?;
    if let Some((pki, _)) = &tls {
        if let Some(dir) = pki.ca.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    let first = first.context("the run ended before the warm-up did")?;
    let m = Measured {
        first,
        last,
        samples,
        started,
        consumed,
        rss_start,
        rss_idle,
        hwm,
    };
    Ok(report(env, a, &counters, &m))
}

/// Over TLS (`--tls`): a PKI for the run and the port of a TLS listener
/// beside the plain one.
fn tls_listener(a: &ThroughputArgs, name: &str) -> anyhow::Result<Option<(Pki, u16)>> {
    if a.tls {
        let pki = Pki::create(&std::env::temp_dir().join(format!("{name}-pki")))?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        Ok(Some((pki, port)))
    } else {
        Ok(None)
    }
}

/// One sample of the load: when, records acknowledged and consumed so
/// far, weir's RSS (KiB).
type Sample = (Instant, u64, u64, u64);

/// Samples the load every [`SAMPLE_EVERY`] from `started` until `end`,
/// checking that weir, the consumer and the publishers are still running;
/// the samples, and the snapshot taken at `warmup_end` (from which on the
/// counters measure).
async fn sample_load(
    weir: &mut Weir,
    counters: &Counters,
    publishers: &mut tokio::task::JoinHandle<anyhow::Result<()>>,
    started: Instant,
    warmup_end: Instant,
    end: Instant,
) -> anyhow::Result<(Vec<Sample>, Option<Snapshot>)> {
    let mut samples = Vec::new();
    let mut first: Option<Snapshot> = None;
    let mut next = started;
    loop {
        next += SAMPLE_EVERY;
        tokio::time::sleep_until(next.min(end)).await;
        weir.check_alive()?;
        counters.check_consumer()?;
        if publishers.is_finished() {
            publishers.await??;
            bail!("the publishers stopped before the end of the run");
        }
        let now = Instant::now();
        let (acked, consumed, _) = counters.get();
        samples.push((now, acked, consumed, rss_kib(weir.pid).unwrap_or(0)));
        if first.is_none() && now >= warmup_end {
            first = Some(Snapshot::take(weir, counters).await?);
            counters.measure(true);
        }
        if now >= end {
            return Ok((samples, first));
        }
    }
}

/// What a run measured: the snapshots at the steady part's ends, the
/// samples, what the consumer took and weir's memory.
struct Measured {
    first: Snapshot,
    last: Snapshot,
    samples: Vec<Sample>,
    /// When the load started.
    started: Instant,
    consumed: crate::amqp::Consumed,
    rss_start: u64,
    rss_idle: u64,
    hwm: u64,
}

/// The run's report, over its steady part.
fn report(env: &Env, a: &ThroughputArgs, counters: &Counters, m: &Measured) -> ThroughputReport {
    let (first, last, consumed) = (&m.first, &m.last, &m.consumed);
    let secs = last.at.duration_since(first.at).as_secs_f64();
    let d = |f: fn(&Snapshot) -> u64| (f(last) - f(first)) as f64;
    let records = d(|s| s.consumed);
    let batches = last.metrics.sum("weir_batches_confirmed_total")
        - first.metrics.sum("weir_batches_confirmed_total");
    let forwarded = last.metrics.sum("weir_records_forwarded_total")
        - first.metrics.sum("weir_records_forwarded_total");
    let egress_bytes =
        last.metrics.sum("weir_egress_bytes_total") - first.metrics.sum("weir_egress_bytes_total");
    let steady: Vec<u64> = m
        .samples
        .iter()
        .filter(|s| s.0 >= first.at && s.0 <= last.at)
        .map(|s| s.3)
        .collect();
    let from_us = unix_us_at(first.at);
    let to_us = unix_us_at(last.at);
    let latencies = consumed
        .samples
        .iter()
        .filter(|s| s.send_us >= from_us && s.send_us < to_us)
        .map(|s| s.consumed_us.saturating_sub(s.send_us))
        .collect();
    ThroughputReport {
        kind: "throughput",
        machine: machine_info(),
        payload: payload_kind(),
        params: a.clone(),
        consumed_per_sec: records / secs,
        acked_per_sec: d(|s| s.acked) / secs,
        batches_per_sec: batches / secs,
        records_per_batch: if batches > 0.0 {
            forwarded / batches
        } else {
            0.0
        },
        bytes_per_batch: if batches > 0.0 {
            egress_bytes / batches
        } else {
            0.0
        },
        disk_bytes_per_payload_byte: {
            let payload = d(|s| s.acked) * a.size as f64;
            if payload > 0.0 {
                d(|s| s.weir_disk_written) / payload
            } else {
                0.0
            }
        },
        segment_bytes_per_payload_byte: {
            let payload = d(|s| s.acked) * a.size as f64;
            let written = last.metrics.sum("weir_spool_written_bytes_total")
                - first.metrics.sum("weir_spool_written_bytes_total");
            if payload > 0.0 {
                written / payload
            } else {
                0.0
            }
        },
        spool_syncs_per_sec: (last.metrics.sum("weir_spool_syncs_total")
            - first.metrics.sum("weir_spool_syncs_total"))
            / secs,
        backpressured: (last.metrics.sum("weir_records_backpressured_total")
            - first.metrics.sum("weir_records_backpressured_total")) as u64,
        weir_rss_start_kib: m.rss_start,
        weir_rss_idle_kib: m.rss_idle,
        weir_rss_load_mean_kib: if steady.is_empty() {
            0
        } else {
            steady.iter().sum::<u64>() / steady.len() as u64
        },
        weir_rss_load_peak_kib: steady.iter().copied().max().unwrap_or(0),
        weir_rss_hwm_kib: m.hwm,
        cpu: CpuReport::between(first, last, records, env.clk_tck),
        latency_under_load_ms: Percentiles::of(latencies),
        ack_latency_ms: Percentiles::of(counters.take_ack_latencies()),
        egress_cycle_ms: Percentiles::of(egress_cycles(&consumed.batches, from_us, to_us)),
        integrity: consumed.integrity(counters.acked.load(Ordering::Relaxed)),
        timeline: timeline(&m.samples, m.started),
    }
}

/// Acknowledged and consumed records per second, and weir's RSS, between
/// each sample and the one before.
fn timeline(samples: &[Sample], started: Instant) -> Vec<TimelinePoint> {
    samples
        .windows(2)
        .map(|w| {
            let dt = w[1].0.duration_since(w[0].0).as_secs_f64().max(1e-9);
            TimelinePoint {
                t: w[1].0.duration_since(started).as_secs_f64(),
                consumed_per_sec: (w[1].2 - w[0].2) as f64 / dt,
                acked_per_sec: (w[1].1 - w[0].1) as f64 / dt,
                weir_rss_kib: w[1].3,
            }
        })
        .collect()
}
