//! The `recovery` run (docs/durability.md's figures): weir with every class spooled
//! and its broker unreachable is filled over MQTT QoS 1 until `--bytes` of
//! segments are on disk, as during a long uplink outage. Resident memory
//! is sampled while it fills and once it is idle with the backlog on disk;
//! then weir is killed with SIGKILL and started again on the same spool,
//! and the restart is timed until its listeners answer (weir replays the
//! spool before it opens them). With `--cold` the page cache is dropped
//! before a second restart, as after a power cut.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::child::Weir;
use crate::cli::{DurabilityArg, RecoveryArgs};
use crate::mqtt::{connections, run_publishers};
use crate::report::{machine_info, MachineInfo};
use crate::run::SAMPLE_EVERY;
use crate::sample::{rss_kib, scrape};
use crate::shared::{unique, Counters, Env};
use crate::stamp::{payload_kind, STAMP};

/// How long weir sits idle with its backlog before its memory is read.
const SETTLE: Duration = Duration::from_secs(3);

/// What `weir-load recovery` reports.
#[derive(Serialize)]
pub struct RecoveryReport {
    pub kind: &'static str,
    pub machine: MachineInfo,
    pub payload: &'static str,
    pub params: RecoveryArgs,
    /// Bytes of segments on disk when weir was killed.
    pub spooled_bytes: u64,
    /// Records on disk and undelivered when weir was killed.
    pub spooled_records: u64,
    /// Seconds the fill took, and its rate in records/s.
    pub fill_secs: f64,
    pub fill_records_per_sec: f64,
    /// Highest RSS sampled while filling, KiB.
    pub fill_peak_rss_kib: u64,
    /// RSS with the backlog on disk, idle, KiB.
    pub spooled_idle_rss_kib: u64,
    /// Restarts after SIGKILL: warm (page cache as left), then cold.
    pub restarts: Vec<Restart>,
}

/// One restart on the spool.
#[derive(Serialize)]
pub struct Restart {
    /// Whether the page cache was dropped first.
    pub cold: bool,
    /// From starting the process to its listeners answering, seconds.
    pub secs: f64,
    /// Records the spool replayed (`weir_spool_recovered_records_total`).
    pub recovered_records: u64,
    /// Damaged stretches and torn bytes found.
    pub corrupt_frames: u64,
    pub torn_bytes: u64,
    /// RSS once idle after the restart, KiB.
    pub idle_rss_kib: u64,
}

/// `1GiB`, `256MiB`, `64KiB` or plain bytes.
fn parse_bytes(text: &str) -> anyhow::Result<u64> {
    let t = text.trim();
    let (num, mult) = [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)]
        .iter()
        .find_map(|(suffix, m)| t.strip_suffix(suffix).map(|n| (n, *m)))
        .unwrap_or((t, 1));
    let n: f64 = num
        .trim()
        .parse()
        .with_context(|| format!("--bytes {text}: expected e.g. 1GiB, 256MiB or a number"))?;
    ensure!(n > 0.0, "--bytes must be positive");
    Ok((n * mult as f64) as u64)
}

pub async fn recovery(env: &Env, a: &RecoveryArgs) -> anyhow::Result<RecoveryReport> {
    ensure!(a.size >= STAMP, "--size must be at least {STAMP} bytes");
    ensure!(a.connections > 0, "--connections must be at least 1");
    let target = parse_bytes(&a.bytes)?;
    let name = unique("recovery");
    let mut cfg = a.weir_config.clone();
    cfg.durability = DurabilityArg::Spool;
    // The broker is unreachable (nothing listens on port 1), the spool's
    // quota has room for the target, and a SIGTERM does not wait for a
    // broker that never comes. The user's own --set come last and win.
    let mut settings = vec![
        "egress.amqp.url=amqp://127.0.0.1:1/%2f".to_string(),
        format!("spool.max_bytes={}", target + (target / 4).max(64 << 20)),
        "egress.drain_timeout=1s".to_string(),
    ];
    settings.append(&mut cfg.set);
    cfg.set = settings;

    let weir = Weir::start(env, &name, &cfg).await?;
    let counters = Arc::new(Counters::default());
    let loads = connections(
        weir.mqtt,
        &name,
        &format!("{name}/lt"),
        a.connections,
        a.size,
        a.window,
        None,
    );
    let stop = CancellationToken::new();
    let started = Instant::now();
    let publishers = tokio::spawn(run_publishers(loads, Arc::clone(&counters), stop.clone()));
    let mut weir = weir;
    let mut fill_peak = 0;
    loop {
        tokio::time::sleep(SAMPLE_EVERY).await;
        weir.check_alive()?;
        if publishers.is_finished() {
            publishers.await??;
            bail!("the publishers stopped before the spool was full");
        }
        fill_peak = fill_peak.max(rss_kib(weir.pid).unwrap_or(0));
        let m = scrape(weir.admin).await?;
        if m.sum("weir_spool_bytes") >= target as f64 {
            break;
        }
    }
    stop.cancel();
    publishers.await.context("publisher thread")??;
    let fill_secs = started.elapsed().as_secs_f64();
    let (acked, _, _) = counters.get();
    tokio::time::sleep(SETTLE).await;
    let spooled_idle_rss_kib = rss_kib(weir.pid).unwrap_or(0);
    let m = scrape(weir.admin).await?;
    let spooled_bytes = m.sum("weir_spool_bytes") as u64;
    let spooled_records = m.sum("weir_spool_records") as u64;
    ensure!(
        spooled_records >= acked,
        "{acked} records acknowledged but only {spooled_records} on disk"
    );
    weir.kill()?;

    let mut restarts = Vec::new();
    for cold in [false, true] {
        if cold {
            if !a.cold {
                break;
            }
            drop_page_cache()?;
        }
        let t0 = Instant::now();
        let weir = Weir::start(env, &name, &cfg).await?;
        let secs = t0.elapsed().as_secs_f64();
        tokio::time::sleep(SETTLE).await;
        let idle_rss_kib = rss_kib(weir.pid).unwrap_or(0);
        let m = scrape(weir.admin).await?;
        restarts.push(Restart {
            cold,
            secs,
            recovered_records: m.sum("weir_spool_recovered_records_total") as u64,
            corrupt_frames: m.sum("weir_spool_corrupt_frames_total") as u64,
            torn_bytes: m.sum("weir_spool_torn_tail_bytes_total") as u64,
            idle_rss_kib,
        });
        if cold || !a.cold {
            // The last restart: a clean stop removes the run's directory.
            weir.stop(env.keep).await?;
        } else {
            weir.kill()?;
        }
    }
    Ok(RecoveryReport {
        kind: "recovery",
        machine: machine_info(),
        payload: payload_kind(),
        params: a.clone(),
        spooled_bytes,
        spooled_records,
        fill_secs,
        fill_records_per_sec: acked as f64 / fill_secs,
        fill_peak_rss_kib: fill_peak,
        spooled_idle_rss_kib,
        restarts,
    })
}

fn drop_page_cache() -> anyhow::Result<()> {
    // Dirty pages first, or they stay cached.
    let _ = std::process::Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3\n")
        .context("--cold: cannot drop the page cache (needs root)")
}

pub fn print_recovery(r: &RecoveryReport) {
    let mib = |kib: u64| kib as f64 / 1024.0;
    println!(
        "recovery: {}-byte records over {} MQTT connection(s), every class spooled, broker unreachable",
        r.params.size, r.params.connections
    );
    println!(
        "  spooled                     {:>10.1} MiB, {} records, filled in {:.1} s ({:.0} records/s)",
        r.spooled_bytes as f64 / (1 << 20) as f64,
        r.spooled_records,
        r.fill_secs,
        r.fill_records_per_sec
    );
    println!(
        "  RSS while filling (peak)    {:>10.1} MiB",
        mib(r.fill_peak_rss_kib)
    );
    println!(
        "  RSS idle, backlog on disk   {:>10.1} MiB",
        mib(r.spooled_idle_rss_kib)
    );
    for s in &r.restarts {
        println!(
            "  restart after SIGKILL ({})  {:>9.2} s to listening, {} records replayed, {} corrupt, {} torn bytes, RSS idle {:.1} MiB",
            if s.cold { "cold" } else { "warm" },
            s.secs,
            s.recovered_records,
            s.corrupt_frames,
            s.torn_bytes,
            mib(s.idle_rss_kib)
        );
    }
}
