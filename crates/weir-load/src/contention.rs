//! The `contention` run: do the class bounds hold on a busy box?
//!
//! weir runs with three classes (JANUS Table I: `ls` 100 ms, `nm` 500 ms,
//! `lt` 1 s) behind an emulated uplink (`--uplink`, `--delay`), and MQTT
//! QoS 1 publishers offer `--overload` times what the uplink carries, split
//! by bytes between the classes (`--mix`). The run is repeated with 0, 1, 2
//! ... busy processes (`--busy`; each `yes > /dev/null` at normal
//! priority, as another program on the box would be), and optionally with
//! `--idle-connections` MQTT connections that connect and say nothing.
//!
//! Per class it reports, over the measured window, end-to-end latency
//! (publish to consumed from RabbitMQ) and weir's share (ingress stamp to
//! consumed), p50/p99/max, and the fraction of records whose weir share
//! passed the class bound; plus weir's CPU and its own diagnostics from
//! `/metrics` (batches, bytes per batch, late records).

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context};
use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::child::Weir;
use crate::cli::{ContentionArgs, Pacing};
use crate::mqtt::{run_publishers, MqttLoad};
use crate::report::{machine_info, Percentiles};
use crate::run::{prime_load, prime_weir, wait_consumed};
use crate::sample::{cpu_ticks, rss_kib, Snapshot};
use crate::shared::{unique, Counters, Env};
use crate::stamp::{unix_us_at, STAMP};

/// JANUS Table I, as the generated config has them.
const CLASSES: [(&str, u64); 3] = [("ls", 100), ("nm", 500), ("lt", 1000)];

/// One class's figures in one scenario.
#[derive(Serialize)]
pub struct ClassFigures {
    pub class: String,
    pub bound_ms: u64,
    /// Records offered per second.
    pub offered_per_sec: f64,
    /// Records weir accepted per second (for a `spool` class, written to
    /// the spool and acknowledged: less than offered when the disk holds
    /// the publishers back).
    pub accepted_per_sec: f64,
    /// Records consumed per second (of those sent in the window).
    pub delivered_per_sec: f64,
    /// Publish to consumed.
    pub end_to_end_ms: Percentiles,
    /// weir's ingress stamp to consumed.
    pub weir_ms: Percentiles,
    /// Share of records whose weir share passed the bound.
    pub late_fraction: f64,
}

/// One scenario: a number of busy processes (and idle connections).
#[derive(Serialize)]
pub struct Scenario {
    pub kind: &'static str,
    pub busy: usize,
    pub idle_connections: usize,
    pub classes: Vec<ClassFigures>,
    /// weir's CPU over the window, cores.
    pub weir_cores: f64,
    /// weir's resident memory at the end of the window.
    pub weir_rss_kib: u64,
    /// weir's resident memory with the idle connections open and no load.
    pub weir_rss_idle_kib: u64,
    /// Spool appends and fdatasync calls per second (0 without a `spool`
    /// class).
    pub spool_appended_per_sec: f64,
    pub spool_syncs_per_sec: f64,
    /// Batches confirmed per second and their mean size.
    pub batches_per_sec: f64,
    pub bytes_per_batch: f64,
    pub machine: crate::report::MachineInfo,
    pub params: ContentionArgs,
}

/// `--mix` as (class, byte share).
fn mix(text: &str) -> anyhow::Result<BTreeMap<String, f64>> {
    let out = class_values(text, "--mix")?;
    let total: f64 = out.values().sum();
    ensure!(total > 0.0, "--mix gives no class a share");
    Ok(out.into_iter().map(|(c, s)| (c, s / total)).collect())
}

/// `class=value,...` (the classes ls, nm and lt, values not negative), as
/// `--mix` and `weir-load offer --rates` take them.
pub fn class_values(text: &str, flag: &str) -> anyhow::Result<BTreeMap<String, f64>> {
    let mut out = BTreeMap::new();
    for part in text.split(',').filter(|p| !p.is_empty()) {
        let (class, value) = part
            .split_once('=')
            .with_context(|| format!("{flag} {part}: expected class=value"))?;
        ensure!(
            CLASSES.iter().any(|(c, _)| *c == class),
            "{flag} {part}: the classes are ls, nm and lt"
        );
        let value: f64 = value.parse().with_context(|| format!("{flag} {part}"))?;
        ensure!(
            value.is_finite() && value >= 0.0,
            "{flag} {part}: a value is a number, not negative"
        );
        out.insert(class.to_owned(), value);
    }
    Ok(out)
}

/// `n` processes burning a core each, as `yes > /dev/null` does, each in a
/// session of its own at normal priority (as another program on the box).
fn busy(n: usize) -> anyhow::Result<Vec<Child>> {
    (0..n)
        .map(|_| {
            let mut cmd = Command::new("yes");
            crate::priority::own_session(&mut cmd);
            cmd.stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("cannot run yes(1)")
        })
        .collect()
}

/// Connections that connect and then say nothing (kept alive by the
/// server's keep-alive grace; weir does not require PINGREQ within it).
async fn idle_connections(
    addr: std::net::SocketAddr,
    n: usize,
    name: &str,
) -> anyhow::Result<Vec<tokio::net::TcpStream>> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let mut s = tokio::net::TcpStream::connect(addr)
            .await
            .with_context(|| format!("idle connection {i}"))?;
        crate::mqtt::mqtt_connect(&mut s, &format!("{name}-idle-{i}")).await?;
        out.push(s);
    }
    Ok(out)
}

pub async fn contention(env: &Env, a: &ContentionArgs) -> anyhow::Result<Vec<Scenario>> {
    ensure!(a.size >= STAMP, "--size must be at least {STAMP} bytes");
    let shares = mix(&a.mix)?;
    let link = a
        .uplink
        .parse::<weir::config::Rate>()
        .with_context(|| format!("--uplink {}", a.uplink))?
        .bytes_per_sec();
    // The devices, the consumer and RabbitMQ are not on the box: raised,
    // they behave as if they ran elsewhere (crate::priority).
    let _outside = (a.outside_nice != 0).then(|| crate::priority::Outside::raise(a.outside_nice));
    let mut out = Vec::new();
    for &n in &a.busy {
        let s = scenario(env, a, &shares, link, n).await?;
        print(&s);
        out.push(s);
    }
    Ok(out)
}

/// Runs one scenario: weir offered `--overload` times its uplink with
/// `busy_n` busy processes beside it; its figures over the measured part.
async fn scenario(
    env: &Env,
    a: &ContentionArgs,
    shares: &BTreeMap<String, f64>,
    link_bytes_per_sec: f64,
    busy_n: usize,
) -> anyhow::Result<Scenario> {
    let name = unique("busy");
    let mut weir = start_weir(env, a, &name).await?;
    let counters = Arc::new(Counters::default());
    let consumer = crate::run::consume_weir(env, &weir, &counters).await?;
    let (idle, rss_idle) = prime_and_idle(a, &mut weir, &counters, &name).await?;

    let mut hogs = busy(busy_n)?;
    let offered = a.overload * link_bytes_per_sec;
    let loads = class_loads(a, shares, offered, weir.mqtt, &name);
    let offered_rates: BTreeMap<String, f64> = shares
        .iter()
        .map(|(c, s)| (c.clone(), offered * s / a.size as f64))
        .collect();
    let stop = CancellationToken::new();
    let started = Instant::now();
    let publishers = tokio::spawn(run_publishers(loads, Arc::clone(&counters), stop.clone()));
    let warmup_end = started + Duration::from_secs(a.warmup);
    tokio::time::sleep_until(warmup_end).await;
    let first = Snapshot::take(&weir, &counters).await?;
    let ticks0 = cpu_ticks(weir.pid).unwrap_or(0);
    tokio::time::sleep(Duration::from_secs(a.seconds)).await;
    let last = Snapshot::take(&weir, &counters).await?;
    let ticks1 = cpu_ticks(weir.pid).unwrap_or(0);
    let rss = rss_kib(weir.pid).unwrap_or(0);
    stop.cancel();
    for h in &mut hogs {
        let _ = h.kill();
        let _ = h.wait();
    }
    publishers.await.context("publisher thread")??;
    wait_consumed(&counters, &mut weir).await?;
    let consumed = consumer.stop().await?;
    drop(idle);
    weir.stop(env.keep).await?;

    let secs = last.at.duration_since(first.at).as_secs_f64();
    let (from_us, to_us) = (unix_us_at(first.at), unix_us_at(last.at));
    if let Some(path) = &a.samples {
        write_samples(path, busy_n, &name, &consumed.samples, from_us, to_us)?;
    }
    let classes = class_figures(
        &name,
        &consumed.samples,
        &offered_rates,
        (&first, &last),
        (from_us, to_us),
        secs,
    );
    let d = |name: &str| last.metrics.sum(name) - first.metrics.sum(name);
    let batches = d("weir_batches_confirmed_total");
    let spool_appended_per_sec = d("weir_spool_appended_records_total") / secs;
    let spool_syncs_per_sec = d("weir_spool_syncs_total") / secs;
    Ok(Scenario {
        kind: "contention",
        busy: busy_n,
        idle_connections: a.idle_connections,
        classes,
        weir_cores: (ticks1 - ticks0) as f64 / env.clk_tck / secs,
        weir_rss_kib: rss,
        weir_rss_idle_kib: rss_idle,
        spool_appended_per_sec,
        spool_syncs_per_sec,
        batches_per_sec: batches / secs,
        bytes_per_batch: if batches > 0.0 {
            d("weir_egress_bytes_total") / batches
        } else {
            0.0
        },
        machine: machine_info(),
        params: a.clone(),
    })
}

/// Starts weir for a scenario behind the emulated `--uplink` (under
/// `--blkio-cgroup`, if given). Its scheduler is left at weir's defaults:
/// it starts from the default 18 Mbit/s prior and finds the link itself.
async fn start_weir(env: &Env, a: &ContentionArgs, name: &str) -> anyhow::Result<Weir> {
    let mut weir_args = a.weir_config.clone();
    let mut set = vec![
        format!("egress.link.bandwidth=\"{}\"", a.uplink),
        format!("egress.link.delay=\"{}\"", a.delay),
    ];
    set.append(&mut weir_args.set);
    weir_args.set = set;
    let weir = Weir::start(env, name, &weir_args).await?;
    if let Some(cg) = &a.blkio_cgroup {
        let procs = cg.join("cgroup.procs");
        std::fs::write(&procs, weir.pid.to_string()).with_context(|| {
            format!("--blkio-cgroup: cannot move weir into {}", procs.display())
        })?;
    }
    Ok(weir)
}

/// Primes weir (it connects to RabbitMQ on its first batch), then opens
/// the idle connections and measures memory before the load: the
/// connections, and weir's RSS with them (KiB).
async fn prime_and_idle(
    a: &ContentionArgs,
    weir: &mut Weir,
    counters: &Arc<Counters>,
    name: &str,
) -> anyhow::Result<(Vec<tokio::net::TcpStream>, u64)> {
    let prime = prime_load(weir.mqtt, name, &format!("{name}/lt/prime"), a.size);
    prime_weir(weir, counters, prime).await?;
    let rss_before_idle = rss_kib(weir.pid).unwrap_or(0);
    let idle = idle_connections(weir.mqtt, a.idle_connections, name).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_idle = rss_kib(weir.pid).unwrap_or(0);
    if a.idle_connections > 0 {
        println!(
            "contention: {} idle connections: weir RSS {} -> {} KiB ({:.1} KiB each)",
            a.idle_connections,
            rss_before_idle,
            rss_idle,
            rss_idle.saturating_sub(rss_before_idle) as f64 / a.idle_connections as f64
        );
    }
    Ok((idle, rss_idle))
}

/// A publisher per class with a share of the load: `offered` bytes/s
/// split by `shares`, to weir's MQTT listener at `addr`.
fn class_loads(
    a: &ContentionArgs,
    shares: &BTreeMap<String, f64>,
    offered: f64,
    addr: std::net::SocketAddr,
    name: &str,
) -> Vec<MqttLoad> {
    shares
        .iter()
        .filter(|(_, s)| **s > 0.0)
        .map(|(class, share)| MqttLoad {
            addr,
            client_id: format!("{name}-{class}"),
            topic: format!("{name}/{class}/t"),
            size: a.size,
            window: a.window,
            rate: Some(offered * share / a.size as f64),
            pacing: Pacing::Tick,
            limit: None,
            tls: None,
        })
        .collect()
}

/// Per class: what was offered, accepted and delivered over the measured
/// part (the snapshots at its ends, `window` in Unix microseconds,
/// `secs` long) and the records' latencies.
fn class_figures(
    name: &str,
    samples: &[crate::amqp::Sample],
    offered_rates: &BTreeMap<String, f64>,
    (first, last): (&Snapshot, &Snapshot),
    (from_us, to_us): (u64, u64),
    secs: f64,
) -> Vec<ClassFigures> {
    CLASSES
        .iter()
        .map(|&(class, bound_ms)| {
            let prefix = format!("{name}/{class}/");
            let mine: Vec<_> = samples
                .iter()
                .filter(|s| s.send_us >= from_us && s.send_us < to_us)
                .filter(|s| s.key.starts_with(&prefix))
                .collect();
            let weir_us: Vec<u64> = mine
                .iter()
                .map(|s| s.consumed_us.saturating_sub(s.ingress_us))
                .collect();
            let late = weir_us.iter().filter(|&&us| us > bound_ms * 1000).count();
            ClassFigures {
                class: class.to_owned(),
                bound_ms,
                offered_per_sec: offered_rates.get(class).copied().unwrap_or(0.0),
                accepted_per_sec: {
                    let series = format!("weir_records_accepted_total{{class=\"{class}\"}}");
                    (last.metrics.series(&series) - first.metrics.series(&series)) / secs
                },
                delivered_per_sec: mine.len() as f64 / secs,
                end_to_end_ms: Percentiles::of(
                    mine.iter()
                        .map(|s| s.consumed_us.saturating_sub(s.send_us))
                        .collect(),
                ),
                late_fraction: if weir_us.is_empty() {
                    0.0
                } else {
                    late as f64 / weir_us.len() as f64
                },
                weir_ms: Percentiles::of(weir_us),
            }
        })
        .collect()
}

/// The measured records of one scenario as CSV (`--samples`).
fn write_samples(
    path: &std::path::Path,
    busy: usize,
    name: &str,
    samples: &[crate::amqp::Sample],
    from_us: u64,
    to_us: u64,
) -> anyhow::Result<()> {
    use std::io::Write;
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("samples");
    let file = match path.extension().and_then(|e| e.to_str()) {
        Some(ext) => path.with_file_name(format!("{stem}-{busy}.{ext}")),
        None => path.with_file_name(format!("{stem}-{busy}")),
    };
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(&file).with_context(|| format!("--samples {}", file.display()))?,
    );
    writeln!(out, "class,send_us,ingress_us,encoded_us,consumed_us")?;
    for s in samples
        .iter()
        .filter(|s| s.send_us >= from_us && s.send_us < to_us)
    {
        let class = s
            .key
            .strip_prefix(name)
            .and_then(|k| k.split('/').nth(1))
            .unwrap_or("");
        writeln!(
            out,
            "{class},{},{},{},{}",
            s.send_us, s.ingress_us, s.created_us, s.consumed_us
        )?;
    }
    out.flush()?;
    Ok(())
}

fn print(s: &Scenario) {
    println!(
        "contention: {} busy, {} idle connections: weir {:.2} cores, {:.0} batches/s of {:.0} B",
        s.busy, s.idle_connections, s.weir_cores, s.batches_per_sec, s.bytes_per_batch
    );
    if s.spool_appended_per_sec > 0.0 {
        println!(
            "  spool: {:.0} records/s appended, {:.1} fdatasync/s",
            s.spool_appended_per_sec, s.spool_syncs_per_sec
        );
    }
    for c in &s.classes {
        println!(
            "  {:<3} bound {:>4} ms  offered {:>6.0}/s accepted {:>6.0}/s delivered {:>6.0}/s  weir p50 {:>7.1} p99 {:>7.1} max {:>7.1} ms  late {:>6.2} %  (end to end p99 {:.1} ms)",
            c.class,
            c.bound_ms,
            c.offered_per_sec,
            c.accepted_per_sec,
            c.delivered_per_sec,
            c.weir_ms.p50,
            c.weir_ms.p99,
            c.weir_ms.max,
            c.late_fraction * 100.0,
            c.end_to_end_ms.p99
        );
    }
}
