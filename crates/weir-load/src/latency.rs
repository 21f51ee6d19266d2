//! The `latency` run: a paced stream of `ls` records through weir, then
//! straight to RabbitMQ, in rounds, with each leg's percentiles.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::amqp::{delete_topology, direct_publisher, Body, Consumed, Consumer, Sample};
use crate::child::Weir;
use crate::cli::{LatencyArgs, Side};
use crate::mqtt::{run_publishers, MqttLoad};
use crate::report::{
    machine_info, Breakdown, CpuReport, LatencyReport, LatencyRound, LatencySide, Percentiles,
};
use crate::run::{egress_cycles, wait_consumed, LINGER, PRIMING_RECORDS, SAMPLE_EVERY};
use crate::sample::{rss_kib, Snapshot};
use crate::shared::{on_thread, unique, Counters, Env, DRAIN_PATIENCE};
use crate::stamp::{payload_kind, unix_us_at, STAMP};

/// The raw measurements of one side within its measured window, kept so
/// that rounds can be pooled.
#[derive(Default)]
struct Raw {
    via_weir: bool,
    samples: Vec<Sample>,
    /// Gaps between consecutive weir batches, microseconds.
    cycles: Vec<u64>,
    /// Publish-to-confirm of direct messages, microseconds.
    confirms: Vec<u64>,
}

impl Raw {
    fn extend(&mut self, other: Raw) {
        self.via_weir |= other.via_weir;
        self.samples.extend(other.samples);
        self.cycles.extend(other.cycles);
        self.confirms.extend(other.confirms);
    }

    fn breakdown(&self) -> Breakdown {
        let pick = |f: fn(&Sample) -> u64| Percentiles::of(self.samples.iter().map(f).collect());
        let weir = self.via_weir;
        Breakdown {
            end_to_end_ms: pick(|s| s.consumed_us.saturating_sub(s.send_us)),
            to_ingress_ms: weir.then(|| pick(|s| s.ingress_us.saturating_sub(s.send_us))),
            ingress_to_consumer_ms: weir
                .then(|| pick(|s| s.consumed_us.saturating_sub(s.ingress_us))),
            queue_wait_ms: weir.then(|| pick(|s| s.created_us.saturating_sub(s.ingress_us))),
            batch_to_consumer_ms: weir
                .then(|| pick(|s| s.consumed_us.saturating_sub(s.created_us))),
            egress_cycle_ms: weir.then(|| Percentiles::of(self.cycles.clone())),
            confirm_ms: (!weir).then(|| Percentiles::of(self.confirms.clone())),
        }
    }
}

pub async fn latency(env: &Env, a: &LatencyArgs) -> anyhow::Result<LatencyReport> {
    ensure!(a.size >= STAMP, "--size must be at least {STAMP} bytes");
    ensure!(a.rate > 0.0, "--rate must be positive");
    ensure!(a.rounds > 0, "--rounds must be at least 1");
    let (mut weir_raw, mut direct_raw) = (Raw::default(), Raw::default());
    let mut rounds = Vec::new();
    for _ in 0..a.rounds {
        let mut round = LatencyRound::default();
        if a.only != Some(Side::Direct) {
            let (side, raw) = latency_via_weir(env, a).await?;
            weir_raw.extend(raw);
            round.weir = Some(side);
        }
        if a.only != Some(Side::Weir) {
            let (side, raw) = latency_direct(env, a).await?;
            direct_raw.extend(raw);
            round.direct = Some(side);
        }
        rounds.push(round);
    }
    let weir = (a.only != Some(Side::Direct)).then(|| weir_raw.breakdown());
    let direct = (a.only != Some(Side::Weir)).then(|| direct_raw.breakdown());
    let added = |f: fn(&Percentiles) -> f64| match (&weir, &direct) {
        (Some(w), Some(d)) => Some(f(&w.end_to_end_ms) - f(&d.end_to_end_ms)),
        _ => None,
    };
    Ok(LatencyReport {
        kind: "latency",
        machine: machine_info(),
        payload: payload_kind(),
        params: a.clone(),
        added_p99_ms: added(|p| p.p99),
        added_p50_ms: added(|p| p.p50),
        weir,
        direct,
        rounds,
    })
}

/// Runs the paced part shared by both latency sides: waits `warmup +
/// seconds` while `publish` runs, snapshotting at the window's edges.
async fn paced_window<F, T>(
    a: &LatencyArgs,
    weir: Option<&Weir>,
    counters: &Arc<Counters>,
    publish: F,
    stop: CancellationToken,
) -> anyhow::Result<(Snapshot, Snapshot, Vec<u64>, T)>
where
    F: Future<Output = anyhow::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    let task = tokio::spawn(publish);
    let started = Instant::now();
    let warmup_end = started + Duration::from_secs(a.warmup);
    let end = warmup_end + Duration::from_secs(a.seconds);
    let mut rss = Vec::new();
    let mut first = None;
    let mut next = started;
    loop {
        next += SAMPLE_EVERY;
        tokio::time::sleep_until(next.min(end)).await;
        counters.check_consumer()?;
        if task.is_finished() {
            task.await??;
            bail!("the publisher stopped before the end of the run");
        }
        if let Some(w) = weir {
            rss.push(rss_kib(w.pid).unwrap_or(0));
        }
        let now = Instant::now();
        if first.is_none() && now >= warmup_end {
            first = Some(Snapshot::take_opt(weir, counters).await?);
        }
        if now >= end {
            break;
        }
    }
    let last = Snapshot::take_opt(weir, counters).await?;
    stop.cancel();
    let out = task.await.context("publisher thread")??;
    Ok((first.context("no warm-up snapshot")?, last, rss, out))
}

async fn latency_via_weir(env: &Env, a: &LatencyArgs) -> anyhow::Result<(LatencySide, Raw)> {
    let name = unique("lat");
    let mut weir = Weir::start(env, &name, &a.weir_config).await?;
    let counters = Arc::new(Counters::default());
    let consumer = crate::run::consume_weir(env, &weir, &counters).await?;
    let mqtt = weir.mqtt;
    let load = |client: &str, rate: Option<f64>, limit: Option<u64>| MqttLoad {
        addr: mqtt,
        client_id: format!("{name}-{client}"),
        topic: format!("{name}/ls/sensor"),
        size: a.size,
        window: 1000,
        rate,
        pacing: a.pacing,
        limit,
        tls: None,
    };
    let prime = load("prime", None, Some(PRIMING_RECORDS));
    run_publishers(vec![prime], Arc::clone(&counters), CancellationToken::new()).await?;
    wait_consumed(&counters, &mut weir).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;

    let stop = CancellationToken::new();
    let paced = load("paced", Some(a.rate), None);
    let publish = run_publishers(vec![paced], Arc::clone(&counters), stop.clone());
    let (first, last, rss, ()) = paced_window(a, Some(&weir), &counters, publish, stop).await?;
    wait_consumed(&counters, &mut weir).await?;
    tokio::time::sleep(LINGER).await;
    let consumed = consumer.stop().await?;
    weir.stop(env.keep).await?;
    Ok(side_report(
        consumed,
        &counters,
        &first,
        &last,
        env,
        true,
        Some(if rss.is_empty() {
            0
        } else {
            rss.iter().sum::<u64>() / rss.len() as u64
        }),
        Vec::new(),
    ))
}

async fn latency_direct(env: &Env, a: &LatencyArgs) -> anyhow::Result<(LatencySide, Raw)> {
    let queue = unique("direct.q");
    let out = latency_direct_on(env, a, &queue).await;
    // Also after a failure, so that no queue is left filling up.
    delete_topology(&env.amqp, &queue, None).await;
    out
}

async fn latency_direct_on(
    env: &Env,
    a: &LatencyArgs,
    queue: &str,
) -> anyhow::Result<(LatencySide, Raw)> {
    let queue = queue.to_string();
    let counters = Arc::new(Counters::default());
    let consumer = Consumer::start(
        env.amqp.clone(),
        queue.clone(),
        crate::cli::QueueTypeArg::Classic,
        Body::Raw,
        Arc::clone(&counters),
    )
    .await?;
    let stop = CancellationToken::new();
    let publish = on_thread("load-pub", {
        let (url, queue, counters, stop) = (
            env.amqp.clone(),
            queue.clone(),
            Arc::clone(&counters),
            stop.clone(),
        );
        let (rate, pacing, size) = (a.rate, a.pacing, a.size);
        move || direct_publisher(url, queue, rate, pacing, size, counters, stop)
    });
    let (first, last, _, confirms) = paced_window(a, None, &counters, publish, stop).await?;
    let deadline = Instant::now() + DRAIN_PATIENCE;
    while counters.consumed.load(Ordering::Relaxed) < counters.acked.load(Ordering::Relaxed) {
        counters.check_consumer()?;
        ensure!(
            Instant::now() < deadline,
            "the consumer did not catch up with the direct publisher"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(LINGER).await;
    let consumed = consumer.stop().await?;
    Ok(side_report(
        consumed, &counters, &first, &last, env, false, None, confirms,
    ))
}

/// One side's report and its raw samples, all within the measured window.
#[allow(clippy::too_many_arguments)]
fn side_report(
    consumed: Consumed,
    counters: &Counters,
    first: &Snapshot,
    last: &Snapshot,
    env: &Env,
    via_weir: bool,
    weir_rss_mean_kib: Option<u64>,
    confirms: Vec<(u64, u64)>,
) -> (LatencySide, Raw) {
    let (from_us, to_us) = (unix_us_at(first.at), unix_us_at(last.at));
    let inside = |sent_us: u64| sent_us >= from_us && sent_us < to_us;
    let integrity = consumed.integrity(counters.acked.load(Ordering::Relaxed));
    let raw = Raw {
        via_weir,
        cycles: egress_cycles(&consumed.batches, from_us, to_us),
        samples: consumed
            .samples
            .into_iter()
            .filter(|s| inside(s.send_us))
            .collect(),
        confirms: confirms
            .into_iter()
            .filter(|(sent, _)| inside(*sent))
            .map(|(_, took)| took)
            .collect(),
    };
    let records = (last.consumed - first.consumed) as f64;
    let messages = (last.messages - first.messages) as f64;
    let side = LatencySide {
        latency: raw.breakdown(),
        sent_per_sec: raw.samples.len() as f64 / last.at.duration_since(first.at).as_secs_f64(),
        records_per_message: if messages > 0.0 {
            records / messages
        } else {
            0.0
        },
        weir_rss_mean_kib,
        cpu: CpuReport::between(first, last, records, env.clk_tck),
        integrity,
    };
    (side, raw)
}
