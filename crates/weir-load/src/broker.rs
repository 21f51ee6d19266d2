//! The `broker` run: the throughput run's MQTT load (same publishers, same
//! window, same payloads) at another broker, e.g. Mosquitto, with one QoS 1
//! subscriber taking everything: what a user would otherwise run, measured
//! with the same tool (docs/benchmarks.md).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context};
use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cli::BrokerArgs;
use crate::mqtt::{connections, run_publishers};
use crate::report::{machine_info, MachineInfo, Percentiles};
use crate::sample::hwm_kib;
use crate::shared::{on_thread, unique, Counters};
use crate::stamp::{payload_kind, STAMP};

/// What `weir-load broker` reports.
#[derive(Serialize)]
pub struct BrokerReport {
    pub kind: &'static str,
    pub machine: MachineInfo,
    pub payload: &'static str,
    /// The command line (`BrokerArgs` or `GrpcArgs`).
    pub params: serde_json::Value,
    /// PUBACKs the publishers received per second.
    pub acked_per_sec: f64,
    /// Records the subscriber received per second.
    pub delivered_per_sec: f64,
    /// The broker's CPU, in cores, if its process was found.
    pub broker_cores: Option<f64>,
    /// The broker's CPU per acknowledged record, in microseconds.
    pub broker_us_per_record: Option<f64>,
    /// The broker's peak resident memory (VmHWM) at the end, KiB.
    pub broker_peak_rss_kib: Option<u64>,
    /// PUBLISH to PUBACK over the measured part, at the publisher.
    pub ack_latency_ms: Percentiles,
    /// Cores this tool used over the measured part (publishers and
    /// subscriber): well under one means the load generator was not the
    /// limit.
    pub load_cores: f64,
}

pub async fn broker(a: &BrokerArgs, clk_tck: f64) -> anyhow::Result<BrokerReport> {
    ensure!(
        a.shape.size >= STAMP,
        "--size must be at least {STAMP} bytes"
    );
    ensure!(a.connections > 0, "--connections must be at least 1");
    let name = unique("broker");
    let pid = a.pid.or_else(|| only_process("mosquitto"));
    let counters = Arc::new(Counters::default());
    let stop_sub = CancellationToken::new();
    let subscriber = (!a.no_subscriber).then(|| {
        on_thread("load-sub", {
            let (counters, stop, addr, id, filter) = (
                Arc::clone(&counters),
                stop_sub.clone(),
                a.addr,
                format!("{name}-sub"),
                format!("{name}/#"),
            );
            move || {
                crate::mqtt_out::subscriber(
                    addr,
                    id,
                    filter,
                    stop,
                    || {},
                    move |_, _| {
                        counters.consumed.fetch_add(1, Ordering::Relaxed);
                        Ok(())
                    },
                )
            }
        })
    });
    // The subscription is in place before the first publish.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let loads = connections(
        a.addr,
        &name,
        &name,
        a.connections,
        a.shape.size,
        a.shape.window,
        a.shape.rate,
    );
    let stop = CancellationToken::new();
    let publishers = tokio::spawn(run_publishers(loads, Arc::clone(&counters), stop.clone()));
    let m = measure(pid, &counters, a.shape.warmup, a.shape.seconds, clk_tck).await;
    stop.cancel();
    publishers.await.context("publisher thread")??;
    // Let the subscriber catch up, then stop it.
    let sent = counters.sent.load(Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(60);
    if let Some(subscriber) = subscriber {
        while counters.consumed.load(Ordering::Relaxed) < sent && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stop_sub.cancel();
        subscriber.await?;
    }
    Ok(m.report("broker", serde_json::to_value(a)?, &counters))
}

/// The measured part of a run: acknowledgements, deliveries and CPU
/// between its two ends.
pub struct Measured {
    secs: f64,
    acked: f64,
    delivered: f64,
    cores: Option<f64>,
    load_cores: f64,
    peak_rss_kib: Option<u64>,
}

/// Waits out `warmup`, then measures `seconds` of the running load: the
/// counters, the CPU of process `pid` and of this tool, and `pid`'s peak
/// memory; PUBACK times are kept over exactly that part.
pub async fn measure(
    pid: Option<u32>,
    counters: &Counters,
    warmup: u64,
    seconds: u64,
    clk_tck: f64,
) -> Measured {
    let me = std::process::id();
    tokio::time::sleep(Duration::from_secs(warmup)).await;
    counters.measure(true);
    let first = (
        Instant::now(),
        counters.get(),
        pid.and_then(cpu_ticks),
        cpu_ticks(me),
    );
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let last = (
        Instant::now(),
        counters.get(),
        pid.and_then(cpu_ticks),
        cpu_ticks(me),
    );
    counters.measure(false);
    let secs = last.0.duration_since(first.0).as_secs_f64();
    let per_sec = |f: Option<u64>, l: Option<u64>| match (f, l) {
        (Some(f), Some(l)) => Some((l - f) as f64 / clk_tck / secs),
        _ => None,
    };
    Measured {
        secs,
        acked: (last.1 .0 - first.1 .0) as f64,
        delivered: (last.1 .1 - first.1 .1) as f64,
        cores: per_sec(first.2, last.2),
        load_cores: per_sec(first.3, last.3).unwrap_or(0.0),
        peak_rss_kib: pid.and_then(hwm_kib),
    }
}

impl Measured {
    /// The report, once the publishers have stopped (their PUBACK times
    /// are in `counters`).
    pub fn report(
        &self,
        kind: &'static str,
        params: serde_json::Value,
        counters: &Counters,
    ) -> BrokerReport {
        BrokerReport {
            kind,
            machine: machine_info(),
            payload: payload_kind(),
            params,
            acked_per_sec: self.acked / self.secs,
            delivered_per_sec: self.delivered / self.secs,
            broker_cores: self.cores,
            broker_us_per_record: self
                .cores
                .map(|c| c * self.secs / self.acked.max(1.0) * 1e6),
            broker_peak_rss_kib: self.peak_rss_kib,
            ack_latency_ms: Percentiles::of(counters.take_ack_latencies()),
            load_cores: self.load_cores,
        }
    }
}

pub fn print_broker(r: &BrokerReport) {
    let p = &r.params;
    println!(
        "{} {}: {} connection(s) x window {}, {}-byte records; {} s measured after {} s warm-up",
        r.kind,
        p["addr"],
        p.get("connections")
            .or(p.get("streams"))
            .unwrap_or(&serde_json::Value::Null),
        p["window"],
        p["size"],
        p["seconds"],
        p["warmup"]
    );
    println!("  PUBACKs/s at publisher      {:>10.0}", r.acked_per_sec);
    println!(
        "  records/s at subscriber     {:>10.0}",
        r.delivered_per_sec
    );
    match (r.broker_cores, r.broker_us_per_record) {
        (Some(c), Some(us)) => {
            println!("  broker CPU                  {c:>10.2} cores, {us:.1} us/record")
        }
        _ => println!("  broker CPU                  (process not found; pass --pid)"),
    }
    if let Some(kib) = r.broker_peak_rss_kib {
        println!(
            "  broker peak RSS             {:>10.1} MiB",
            kib as f64 / 1024.0
        );
    }
    let l = &r.ack_latency_ms;
    println!(
        "  PUBLISH to PUBACK (ms)      p50 {:.2}  p99 {:.2}  max {:.2}  ({} samples)",
        l.p50, l.p99, l.max, l.n
    );
    println!("  load generator CPU          {:>10.2} cores", r.load_cores);
}

/// The pid of the one process named `name`, if exactly one runs.
fn only_process(name: &str) -> Option<u32> {
    let found: Vec<u32> = std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|pid: &u32| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == name)
        })
        .collect();
    (found.len() == 1).then(|| found[0])
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}
