//! Sampling: memory and CPU from `/proc` (weir, RabbitMQ, this tool, the
//! machine), weir's admin `/metrics`, and the CPU report between two
//! snapshots.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::child::Weir;
use crate::report::CpuReport;
use crate::shared::Counters;

/// Clock ticks per second of `/proc/<pid>/stat` times.
pub fn clk_tck() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

fn status_kib(pid: u32, key: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Resident memory (VmRSS), KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmRSS:")
}

/// Peak resident memory (VmHWM), KiB.
pub fn hwm_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmHWM:")
}

/// utime + stime from a `stat` file, in clock ticks.
fn stat_ticks(path: &str) -> Option<u64> {
    let s = std::fs::read_to_string(path).ok()?;
    // Fields after the parenthesised command name, which may hold spaces:
    // state is field 3, utime 14 and stime 15.
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// utime + stime of process `pid`, in clock ticks.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    stat_ticks(&format!("/proc/{pid}/stat"))
}

/// CPU ticks of a process's threads, summed by thread name.
fn thread_ticks(pid: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let dir = t.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if let Some(ticks) = stat_ticks(&dir.join("stat").to_string_lossy()) {
            *out.entry(comm.trim().to_string()).or_insert(0) += ticks;
        }
    }
    out
}

/// CPU ticks of every RabbitMQ node running here (each a `beam.smp`
/// process): a cluster on one machine (scripts/rabbitmq-cluster.sh) counts
/// whole, and an idle node beside it adds next to nothing.
fn beam_ticks() -> u64 {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return 0;
    };
    procs
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            if comm.trim() != "beam.smp" {
                return None;
            }
            stat_ticks(&format!("/proc/{pid}/stat"))
        })
        .sum()
}

/// The unit of `/proc/stat`, fixed by the kernel ABI.
const USER_HZ: f64 = 100.0;

/// (busy, total) jiffies of the whole machine.
fn machine_ticks() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = s.lines().next() else {
        return (0, 0);
    };
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().sum();
    // idle and iowait
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// weir's Prometheus metrics, by series (name plus labels).
#[derive(Default)]
pub struct Scrape(HashMap<String, f64>);

impl Scrape {
    /// The sum of every series of metric `name` (all classes).
    pub fn sum(&self, name: &str) -> f64 {
        self.0
            .iter()
            .filter(|(k, _)| k.split('{').next() == Some(name))
            .map(|(_, v)| v)
            .sum()
    }

    /// One series (`name{labels}` as weir writes it), 0 when absent.
    pub fn series(&self, series: &str) -> f64 {
        self.0.get(series).copied().unwrap_or(0.0)
    }
}

/// Reads `/metrics` from weir's admin listener (plain HTTP/1.1 GET).
pub async fn scrape(addr: SocketAddr) -> anyhow::Result<Scrape> {
    let mut s = TcpStream::connect(addr)
        .await
        .with_context(|| format!("weir's admin listener {addr}"))?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: weir\r\nConnection: close\r\n\r\n")
        .await?;
    let mut body = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut body))
        .await
        .context("weir's /metrics did not answer")??;
    let text = String::from_utf8_lossy(&body);
    let (_, body) = text
        .split_once("\r\n\r\n")
        .context("weir's /metrics answer has no body")?;
    let mut m = HashMap::new();
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        if let Some((k, v)) = line.rsplit_once(' ') {
            if let Ok(v) = v.parse::<f64>() {
                m.insert(k.to_string(), v);
            }
        }
    }
    Ok(Scrape(m))
}

/// Bytes a process has sent toward storage: `write_bytes` of
/// `/proc/<pid>/io` (counted when a page is dirtied, so a page synced and
/// dirtied again counts again) less `cancelled_write_bytes` (dirty pages
/// dropped before writeback, such as a checkpoint file replaced before the
/// kernel wrote it out).
pub fn disk_written(pid: u32) -> Option<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    let field = |name: &str| -> Option<u64> {
        io.lines()
            .find_map(|l| l.strip_prefix(name))?
            .trim()
            .parse()
            .ok()
    };
    let written = field("write_bytes:")?;
    Some(written.saturating_sub(field("cancelled_write_bytes:").unwrap_or(0)))
}

/// Everything sampled at one instant.
pub struct Snapshot {
    pub at: Instant,
    pub acked: u64,
    pub consumed: u64,
    pub messages: u64,
    pub weir_threads: BTreeMap<String, u64>,
    pub beam: u64,
    pub tool_threads: BTreeMap<String, u64>,
    pub machine: (u64, u64),
    pub metrics: Scrape,
    /// Bytes weir has caused to be written to storage (`write_bytes` of
    /// `/proc/<pid>/io`: what reached the block layer, not what went
    /// through the page cache and was overwritten there).
    pub weir_disk_written: u64,
}

impl Snapshot {
    pub async fn take(weir: &Weir, counters: &Counters) -> anyhow::Result<Snapshot> {
        Snapshot::take_opt(Some(weir), counters).await
    }

    pub async fn take_opt(weir: Option<&Weir>, counters: &Counters) -> anyhow::Result<Snapshot> {
        let metrics = match weir {
            Some(w) => scrape(w.admin).await?,
            None => Scrape::default(),
        };
        let (acked, consumed, messages) = counters.get();
        Ok(Snapshot {
            at: Instant::now(),
            acked,
            consumed,
            messages,
            weir_threads: weir.map_or_else(BTreeMap::new, |w| thread_ticks(&w.pid.to_string())),
            beam: beam_ticks(),
            tool_threads: thread_ticks("self"),
            machine: machine_ticks(),
            metrics,
            weir_disk_written: weir.and_then(|w| disk_written(w.pid)).unwrap_or(0),
        })
    }
}

impl CpuReport {
    pub fn between(first: &Snapshot, last: &Snapshot, records: f64, clk_tck: f64) -> CpuReport {
        let secs = last.at.duration_since(first.at).as_secs_f64().max(1e-9);
        let cores = |ticks: u64| ticks as f64 / clk_tck / secs;
        let per_record = |ticks: u64| {
            if records > 0.0 {
                ticks as f64 / clk_tck / records * 1e6
            } else {
                0.0
            }
        };
        let delta = |a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>| {
            b.iter()
                .map(|(k, v)| (k.clone(), cores(v.saturating_sub(*a.get(k).unwrap_or(&0)))))
                .filter(|(_, c)| *c > 0.0)
                .collect::<BTreeMap<_, _>>()
        };
        // Threads that exited in between make the sum shrink; never negative.
        let weir_ticks = last
            .weir_threads
            .values()
            .sum::<u64>()
            .saturating_sub(first.weir_threads.values().sum());
        let beam = last.beam.saturating_sub(first.beam);
        let (busy, total) = (
            last.machine.0.saturating_sub(first.machine.0),
            last.machine.1.saturating_sub(first.machine.1),
        );
        let busy_cores = cores(busy) * clk_tck / USER_HZ;
        let tool = delta(&first.tool_threads, &last.tool_threads);
        let ours = cores(weir_ticks) + cores(beam) + tool.values().sum::<f64>();
        CpuReport {
            other_cores: (busy_cores - ours).max(0.0),
            weir_cores: cores(weir_ticks),
            weir_us_per_record: per_record(weir_ticks),
            weir_threads: delta(&first.weir_threads, &last.weir_threads),
            rabbitmq_cores: cores(beam),
            rabbitmq_us_per_record: per_record(beam),
            tool_threads: tool,
            machine_busy: if total > 0 {
                busy as f64 / total as f64
            } else {
                0.0
            },
        }
    }
}
