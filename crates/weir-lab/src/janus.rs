//! The JANUS evaluation (section VII, Tables IV and V, Fig. 6): N weir
//! nodes in this process, each an [`App`] with peering on loopback and a
//! file egress behind an emulated Table III uplink. Busy nodes get `ls` 30, `nm` 300 and `lt` 1k-5k records/s,
//! idle ones 30 records/s per class; each scheme (Native, QM-only and the
//! redirection matchers) is run with the same load.
//!
//! **Latency** of a record = the modification time of the batch file it
//! landed in minus its `ingress_us` (stamped by weir when it was enqueued;
//! redirected records keep it). The file egress writes a batch after the
//! emulated link's sleep, so the write is the arrival "in the cloud"; the
//! kernel's file timestamps come from its coarse clock (one jiffy, at most
//! 4 ms), which is the accuracy of every latency here. Polling the
//! directories instead would add up to the poll interval and cost CPU the
//! generators need on a small machine.
//!
//! **The link.** By default the emulated link is busy for the bytes only
//! (`[egress.link]` with the preset's bandwidth and no delay) and the
//! preset's delay is added to every record's latency: Table III's delay is
//! a network latency, with transactions in flight back to back. weir's
//! `preset` instead holds the link for the delay on every transaction
//! (`--serial-delay`), under which 50 ms per `ls` batch starves the other
//! classes on 4G (docs/lab/janus.md).
//!
//! **Throughput** = distinct records whose batch was written during the
//! load phase, per second of it (Fig. 6 counts records/s out of the
//! system). After the load the queues drain (bounded by `--drain`) so every
//! accepted record's latency is counted.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use bytes::Bytes;
use serde_json::{json, Value};
use tokio::time::Instant;
use weir::app::App;
use weir::intake::Intake;

use crate::report::{self, round};

mod classes;
mod results;

pub(crate) use classes::CLASSES;
pub(crate) use results::{nan0, paper, svg, table};

/// Every scheme of the paper's comparison, in its table's order.
pub(crate) const ALL_SCHEMES: [&str; 7] = [
    "native", "qm-only", "pmrfs", "random", "fcfs", "lrfs", "best-fit",
];

/// Generator tick: 50 records per tick at 5k/s, coarse enough to cost
/// little CPU, fine against every class bound.
const TICK: Duration = Duration::from_millis(10);

/// Most bytes of one batch file the lab decodes.
const MAX_BATCH_FILE: usize = 64 << 20;

/// How long the nodes may take to see each other before a run starts.
const PEER_WAIT: Duration = Duration::from_secs(10);

/// How often each node's uplink estimate and `C_out` are sampled.
const UPLINK_SAMPLE: Duration = Duration::from_millis(250);

/// Command line of `weir-lab janus`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Schemes to compare.
    #[arg(long, value_delimiter = ',', default_values_t = ALL_SCHEMES.map(String::from))]
    pub schemes: Vec<String>,
    #[command(flatten)]
    pub grid: Grid,
    /// Most seconds to wait for the queues to drain after the load.
    #[arg(long, default_value_t = 60.0)]
    pub drain: f64,
    /// Payload bytes per record (a record is about 40 bytes more on the
    /// wire). The paper gives no size; at 640 B a busy node is offered 1.6x
    /// its 4G uplink at lt 5000/s and QM-only carries 56 % of what the
    /// redirection schemes do, the paper's regime (1 / 1.7 = 59 %);
    /// docs/lab/janus.md sweeps it.
    #[arg(long, value_delimiter = ',', default_values_t = [640usize])]
    pub record_bytes: Vec<usize>,
    /// `scheduler.max_batch_bytes` of every node [default: weir's, 64 KiB].
    #[arg(long)]
    pub max_batch_bytes: Option<u64>,
    /// Emulate the Table III delay as weir's `[egress.link] preset` does:
    /// the link is busy for the delay of every transaction. Without it
    /// (default) the link is busy for the bytes only and the delay is
    /// added to every record's latency: a propagation delay with
    /// transactions in flight back to back, which is what a 4G RTT is.
    #[arg(long)]
    pub serial_delay: bool,
    /// `batching.adaptive` of every node [default: weir's, on].
    #[arg(long)]
    pub adaptive_batching: Option<bool>,
    /// `scheduler.track_uplink` of every node: `C_out` follows each node's
    /// own online estimate of its uplink instead of the preset's rate.
    #[arg(long)]
    pub track_uplink: bool,
}

/// The paper's testbed and load, shared by `janus` and `cluster`.
#[derive(Debug, Clone, clap::Args)]
pub struct Grid {
    /// Uplink presets (JANUS Table III): wifi, 4g, 3g.
    #[arg(long, value_delimiter = ',', default_values_t = ["4g".to_string()])]
    pub networks: Vec<String>,
    /// `lt` input rates of the busy nodes, records/s (paper: 1000..5000).
    #[arg(long, value_delimiter = ',', default_values_t = [5000u32])]
    pub lt_rates: Vec<u32>,
    /// Edge nodes (paper: 4).
    #[arg(long, default_value_t = 4)]
    pub nodes: usize,
    /// How many of them are busy.
    #[arg(long, default_value_t = 2)]
    pub busy: usize,
    /// `ls` and `nm` input rates of a busy node, records/s.
    #[arg(long, value_delimiter = ',', default_values_t = [30u32, 300])]
    pub busy_rates: Vec<u32>,
    /// Input rate per class of an idle node, records/s.
    #[arg(long, default_value_t = 30)]
    pub idle_rate: u32,
    /// Seconds of load per run over which throughput is measured (after
    /// the warm-up).
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Seconds of load before the measured part: longer than the slowest
    /// class bound, so that throughput counts arrivals in a steady window
    /// rather than the first records' trip through the pipeline.
    #[arg(long, default_value_t = 2.0)]
    pub warmup: f64,
}

/// One node's part of the load.
#[derive(Debug, Clone, Copy)]
struct Load {
    /// Records/s per class, in [`CLASSES`] order.
    rates: [u32; 3],
}

/// What one node's generator did.
#[derive(Debug, Clone, Copy, Default)]
struct Offered {
    accepted: [u64; 3],
    refused: [u64; 3],
    elapsed: Duration,
}

impl Offered {
    /// Records/s accepted, and offered (accepted or refused), over the load.
    fn rates(&self) -> (f64, f64) {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        let accepted = self.accepted.iter().sum::<u64>() as f64;
        let refused = self.refused.iter().sum::<u64>() as f64;
        (accepted / secs, (accepted + refused) / secs)
    }
}

/// A scheme x network x rate x record size cell.
#[derive(Debug, Clone)]
pub(crate) struct Cell {
    pub scheme: String,
    pub network: String,
    pub lt_rate: u32,
    pub record_bytes: usize,
}

/// Every scheme x network x rate x record size, sizes outermost and
/// schemes innermost (a size's schemes side by side in the table); an
/// unknown scheme is an error.
pub(crate) fn grid(
    schemes: &[String],
    networks: &[String],
    lt_rates: &[u32],
    record_bytes: &[usize],
) -> anyhow::Result<Vec<Cell>> {
    for s in schemes {
        anyhow::ensure!(
            ALL_SCHEMES.contains(&s.as_str()),
            "unknown scheme {s:?} (known: {})",
            ALL_SCHEMES.join(", ")
        );
    }
    let mut cells = Vec::new();
    for &record_bytes in record_bytes {
        for network in networks {
            for &lt_rate in lt_rates {
                for scheme in schemes {
                    cells.push(Cell {
                        scheme: scheme.clone(),
                        network: network.clone(),
                        lt_rate,
                        record_bytes,
                    });
                }
            }
        }
    }
    Ok(cells)
}

/// A JANUS Table III network by name (`wifi`, `4g`, `3g`), or any link as
/// `RATE@DELAY` (`18Mbit/s@50ms`: the rate, and the delay added towards the
/// cloud, which is the round trip's).
pub(crate) fn preset(network: &str) -> anyhow::Result<weir::egress::link::LinkProfile> {
    if let Some(p) = weir::egress::link::LinkProfile::preset(network) {
        return Ok(p);
    }
    let unknown = || {
        format!("unknown network {network:?} (known: wifi, 4g, 3g, or RATE@DELAY such as 18Mbit/s@50ms)")
    };
    let (rate, delay) = network.split_once('@').with_context(unknown)?;
    let rate: weir::config::units::Rate = rate.parse().with_context(unknown)?;
    let delay: weir::config::units::HumanDuration = delay.parse().with_context(unknown)?;
    anyhow::ensure!(
        rate.bytes_per_sec() > 0.0,
        "{}: the rate must be above zero",
        unknown()
    );
    Ok(weir::egress::link::LinkProfile {
        bytes_per_sec: rate.bytes_per_sec(),
        delay: delay.get(),
    })
}

/// Free loopback ports for the peer listeners: each node must know the
/// others' before any starts.
pub(crate) fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .context("cannot bind a loopback port")?;
    listeners
        .iter()
        .map(|l| Ok(l.local_addr()?.port()))
        .collect()
}

/// weir's config for node `id` (1-based) of `ports.len()` in `cell`.
fn config_text(
    id: usize,
    ports: &[u16],
    dir: &Path,
    cell: &Cell,
    a: &Args,
) -> anyhow::Result<String> {
    let (scheme, network) = (&cell.scheme, &cell.network);
    let (max_batch_bytes, adaptive, serial_delay) =
        (a.max_batch_bytes, a.adaptive_batching, a.serial_delay);
    let profile = preset(network)?;
    let peers: Vec<String> = (1..=ports.len())
        .filter(|&p| p != id)
        .map(|p| format!("{{ id = {p}, addr = \"127.0.0.1:{}\" }}", ports[p - 1]))
        .collect();
    let classes: String = CLASSES
        .iter()
        .map(|(c, b)| format!("[[class]]\nname = \"{c}\"\nbound = \"{b}ms\"\n"))
        .collect();
    let routes: String = CLASSES
        .iter()
        .map(|(c, _)| format!("[[classify.route]]\ngrpc = \"{c}\"\nclass = \"{c}\"\n"))
        .collect();
    let batch = max_batch_bytes
        .map(|b| format!("max_batch_bytes = \"{b}B\"\n"))
        .unwrap_or_default();
    Ok(format!(
        r#"
[node]
id = {id}
name = "janus-{id}"
{classes}
[classify]
default_class = "lt"
{routes}
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
{link}
[peering]
listen = "127.0.0.1:{port}"
peers = [{peers}]
heartbeat = "100ms"
dead_after = "500ms"
lease = "1s"
[scheduler]
scheme = "{scheme}"
uplink = "{bw}B/s"
track_uplink = {track}
{batch}{adaptive}"#,
        track = a.track_uplink,
        link = if serial_delay {
            format!("preset = \"{network}\"")
        } else {
            format!(
                "bandwidth = \"{bw}B/s\"\ndelay = \"0ms\"",
                bw = profile.bytes_per_sec.round() as u64
            )
        },
        adaptive = adaptive
            .map(|a| format!("[batching]\nadaptive = {a}\n"))
            .unwrap_or_default(),
        dir = dir
            .display()
            .to_string()
            .replace('\\', "\\\\")
            .replace('"', "\\\""),
        port = ports[id - 1],
        peers = peers.join(", "),
        bw = profile.bytes_per_sec.round() as u64,
    ))
}

/// Offers `load` to `ingress` for `secs` from `epoch`, without waiting for
/// room: a full queue refuses, as a sensor's forwarder would see.
async fn generate(
    ingress: Arc<Intake>,
    load: Load,
    epoch: Instant,
    secs: f64,
    payload: Bytes,
) -> Offered {
    let mut off = Offered::default();
    let mut due = [0.0f64; 3];
    let ticks = (secs / TICK.as_secs_f64()).round() as u32;
    for k in 1..=ticks {
        tokio::time::sleep_until(epoch + TICK * k).await;
        for (c, (name, _)) in CLASSES.iter().enumerate() {
            due[c] += f64::from(load.rates[c]) * TICK.as_secs_f64();
            while due[c] >= 1.0 {
                due[c] -= 1.0;
                let r = ingress.grpc_record(name, payload.clone());
                match ingress.try_enqueue(r) {
                    Ok(()) => off.accepted[c] += 1,
                    Err(_) => off.refused[c] += 1,
                }
            }
        }
    }
    off.elapsed = epoch.elapsed();
    off
}

/// Records weir has confirmed so far (sum over classes).
fn forwarded(app: &App) -> u64 {
    crate::relay::forwarded_total(&app.ingress.metrics().render())
}

/// One delivered record: class index, latency and when it arrived.
pub(crate) struct Delivered {
    pub class: usize,
    pub latency_ms: f64,
    pub at_us: u64,
    /// Of `latency_ms`, the part before weir published the record's batch
    /// (AMQP's `weir-sent-us` header less `ingress_us`); the rest was on
    /// the way (the shaped link, the delay, RabbitMQ). `None` where the
    /// sink does not say (batch files).
    pub in_weir_ms: Option<f64>,
}

/// What the batch files under the nodes' directories hold.
struct Collected {
    /// Every distinct (origin, seq), first delivery.
    records: Vec<Delivered>,
    /// Deliveries beyond the first.
    duplicates: u64,
    /// Bytes of every batch body and records in them (duplicates too): the
    /// wire cost of a record, framing included.
    wire_bytes: u64,
    wire_records: u64,
}

/// Every distinct (origin, seq) in the segments under `dirs`, the
/// number of duplicates and the bytes on the wire.
fn collect(dirs: &[PathBuf], extra_us: u64) -> anyhow::Result<Collected> {
    let mut seen: HashMap<(u64, u64), Delivered> = HashMap::new();
    let mut dups = 0;
    let (mut wire_bytes, mut wire_records) = (0u64, 0u64);
    for dir in dirs {
        let batches = match weir::egress::file::read_batches(dir, MAX_BATCH_FILE) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e.into()),
        };
        for weir::egress::file::ReadBatch { frame, batch, .. } in batches {
            // Delivered when its frame was written (after the emulated
            // link carried it, before the segment's sync).
            let at = frame.written_us + extra_us;
            wire_bytes += frame.len as u64;
            wire_records += batch.records.len() as u64;
            for r in batch.records {
                let Some(class) = CLASSES.iter().position(|(c, _)| *c == r.class) else {
                    continue;
                };
                let d = Delivered {
                    class,
                    latency_ms: at.saturating_sub(r.ingress_us) as f64 / 1e3,
                    at_us: at,
                    in_weir_ms: None,
                };
                match seen.get_mut(&(r.origin, r.seq)) {
                    Some(old) => {
                        dups += 1;
                        if d.at_us < old.at_us {
                            *old = d;
                        }
                    }
                    None => {
                        seen.insert((r.origin, r.seq), d);
                    }
                }
            }
        }
    }
    Ok(Collected {
        records: seen.into_values().collect(),
        duplicates: dups,
        wire_bytes,
        wire_records,
    })
}

fn unix_us(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_micros() as u64
}

/// Runs one cell and returns its JSON object.
async fn run_cell(a: &Args, cell: &Cell, base: &Path) -> anyhow::Result<Value> {
    let n = a.grid.nodes.max(1);
    let ports = free_ports(n)?;
    let dirs: Vec<PathBuf> = (1..=n).map(|i| base.join(format!("node-{i}"))).collect();
    let apps = start_nodes(a, cell, &ports, &dirs).await?;
    let busy_rates = busy_rates(a, cell);
    let payload = Bytes::from(vec![0x5a; cell.record_bytes]);
    let a_seconds = a.grid.warmup + a.grid.seconds;
    let start_wall = unix_us(SystemTime::now());
    let epoch = Instant::now();
    let gens = spawn_generators(a, &apps, busy_rates, epoch, &payload);
    // Each node's uplink as it sees it, every 250 ms through the load:
    // the egress's latest estimate and C_out in force.
    let metrics: Vec<_> = apps
        .iter()
        .map(|app| Arc::clone(app.ingress.metrics()))
        .collect();
    let sampler = tokio::spawn(sample_uplinks(metrics, epoch, a_seconds));
    let mut offered = Vec::new();
    for g in gens {
        offered.push(g.await.context("a generator panicked")?);
    }
    let uplinks = sampler.await.context("the uplink sampler panicked")?;
    let window = (
        start_wall + (a.grid.warmup * 1e6) as u64,
        start_wall + ((a.grid.warmup + a.grid.seconds) * 1e6) as u64,
    );
    let accepted: u64 = offered.iter().flat_map(|o| o.accepted).sum();
    let (drained, drain_ms) = drain(&apps, accepted, a.drain).await;
    let redirected: u64 = apps
        .iter()
        .map(|app| app.ingress.metrics().peer.redirected_in_total())
        .sum();
    for app in apps {
        app.shutdown(Duration::from_secs(5)).await;
    }
    let profile = weir::egress::link::LinkProfile::preset(&cell.network);
    let extra = if a.serial_delay {
        Duration::ZERO
    } else {
        profile.map(|p| p.delay).unwrap_or_default()
    };
    let Collected {
        records,
        duplicates,
        wire_bytes,
        wire_records,
    } = collect(&dirs, extra.as_micros() as u64)?;
    let _ = std::fs::remove_dir_all(base);

    let accepted_per_class: [u64; 3] =
        std::array::from_fn(|c| offered.iter().map(|o| o.accepted[c]).sum());
    let refused_per_class: [u64; 3] =
        std::array::from_fn(|c| offered.iter().map(|o| o.refused[c]).sum());
    let Summary {
        classes,
        in_load,
        on_time,
    } = summarise(&records, accepted_per_class, refused_per_class, window);
    // The physical limit: what was offered, or what the uplinks can carry
    // at the records' own wire size, whichever is less.
    let uplink_bps = profile.map(|p| p.bytes_per_sec).unwrap_or_default();
    let wire_per_record = if wire_records > 0 {
        wire_bytes as f64 / wire_records as f64
    } else {
        f64::NAN
    };
    let capacity_rps = n as f64 * uplink_bps / wire_per_record;
    let offered_rps: f64 = offered.iter().map(|o| o.rates().1).sum();
    let own_links_rps = own_links_limit(
        offered.iter().map(|o| o.rates().1),
        uplink_bps / wire_per_record,
    );
    let input = input_rows(a, busy_rates, &offered, uplinks);
    Ok(json!({
        "scheme": cell.scheme,
        "network": cell.network,
        "lt_rate": cell.lt_rate,
        "classes": classes,
        "throughput_rps": round(in_load as f64 / a.grid.seconds, 1),
        "record_bytes": cell.record_bytes,
        "wire_bytes_per_record": round(nan0(wire_per_record), 1),
        "offered_rps": round(offered_rps, 1),
        "capacity_limit_rps": round(nan0(offered_rps.min(capacity_rps)), 1),
        "own_links_limit_rps": round(nan0(own_links_rps), 1),
        "delivered_rps": round(in_load as f64 / a.grid.seconds, 1),
        "delivered_on_time_rps": round(on_time as f64 / a.grid.seconds, 1),
        "lost": accepted.saturating_sub(records.len() as u64),
        "accepted": accepted,
        "delivered": records.len(),
        "duplicates": duplicates,
        "redirected": redirected,
        "drained": drained,
        "drain_ms": round(drain_ms, 0),
        "input": input,
        "paper": paper(&cell.scheme, &cell.network),
        "link": if a.serial_delay { "serial-delay" } else { "propagation-delay" },
        "track_uplink": a.track_uplink,
        "uplink_bps": round(uplink_bps, 0),
    }))
}

/// Starts a node per directory in `dirs` (node i+1's ports from `ports`),
/// and waits until they see each other: heartbeats go round before the
/// load starts, as on a running testbed.
async fn start_nodes(
    a: &Args,
    cell: &Cell,
    ports: &[u16],
    dirs: &[PathBuf],
) -> anyhow::Result<Vec<App>> {
    let n = dirs.len();
    let mut apps = Vec::new();
    for (i, dir) in dirs.iter().enumerate() {
        let text = config_text(i + 1, ports, dir, cell, a)?;
        let cfg = weir::config::parse(&text, "weir-lab janus config")
            .map_err(|e| anyhow::anyhow!("the lab's janus config is invalid: {e}"))?;
        apps.push(
            App::start(cfg)
                .await
                .with_context(|| format!("cannot start node {}", i + 1))?,
        );
    }
    let deadline = Instant::now() + PEER_WAIT;
    while apps.iter().any(|app| {
        app.peering
            .as_ref()
            .is_some_and(|p| p.status().alive.len() + 1 < n)
    }) {
        anyhow::ensure!(Instant::now() < deadline, "the nodes never saw each other");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(apps)
}

/// A busy node's rates per class, in [`CLASSES`] order.
fn busy_rates(a: &Args, cell: &Cell) -> [u32; 3] {
    [
        a.grid.busy_rates.first().copied().unwrap_or(30),
        a.grid.busy_rates.get(1).copied().unwrap_or(300),
        cell.lt_rate,
    ]
}

/// Starts each node's load from `epoch`: the busy ones at `busy_rates`,
/// the others at the idle rate, records of `payload`.
fn spawn_generators(
    a: &Args,
    apps: &[App],
    busy_rates: [u32; 3],
    epoch: Instant,
    payload: &Bytes,
) -> Vec<tokio::task::JoinHandle<Offered>> {
    apps.iter()
        .enumerate()
        .map(|(i, app)| {
            let rates = if i < a.grid.busy {
                busy_rates
            } else {
                [a.grid.idle_rate; 3]
            };
            tokio::spawn(generate(
                Arc::clone(&app.ingress),
                Load { rates },
                epoch,
                a.grid.warmup + a.grid.seconds,
                payload.clone(),
            ))
        })
        .collect()
}

/// Samples each node's uplink every [`UPLINK_SAMPLE`] until `seconds`
/// after `epoch`: a series per node.
async fn sample_uplinks(
    metrics: Vec<Arc<weir::metrics::Metrics>>,
    epoch: Instant,
    seconds: f64,
) -> Vec<Vec<Value>> {
    let mut series = vec![Vec::new(); metrics.len()];
    let mut tick = tokio::time::interval(UPLINK_SAMPLE);
    loop {
        tick.tick().await;
        let t = epoch.elapsed().as_secs_f64();
        for (m, s) in metrics.iter().zip(series.iter_mut()) {
            let u = m.uplink();
            s.push(json!({
                "t": round(t, 2),
                "estimate_bps": round(u.estimate.bytes_per_sec, 0),
                "t_sc_ms": round(u.estimate.per_transaction.as_secs_f64() * 1e3, 2),
                "c_out_bps": round(u.c_out(), 0),
                "rates_bps": u.rates.iter().map(|r| round(*r, 0)).collect::<Vec<_>>(),
            }));
        }
        if t >= seconds {
            return series;
        }
    }
}

/// Waits, for at most `drain` seconds, until the nodes have forwarded
/// `accepted` records: whether they did, and the milliseconds waited.
async fn drain(apps: &[App], accepted: u64, drain: f64) -> (bool, f64) {
    let drain_start = Instant::now();
    let drain_deadline = drain_start + Duration::from_secs_f64(drain);
    let mut drained = false;
    while Instant::now() < drain_deadline {
        if apps.iter().map(forwarded).sum::<u64>() >= accepted {
            drained = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (drained, drain_start.elapsed().as_secs_f64() * 1e3)
}

/// The row's `input`: per node, its target, accepted and offered rates
/// and its uplink samples.
fn input_rows(
    a: &Args,
    busy_rates: [u32; 3],
    offered: &[Offered],
    uplinks: Vec<Vec<Value>>,
) -> Vec<Value> {
    offered
        .iter()
        .enumerate()
        .zip(uplinks)
        .map(|((i, o), uplink)| {
            let target: u32 = if i < a.grid.busy {
                busy_rates.iter().sum()
            } else {
                a.grid.idle_rate * 3
            };
            let (accepted_rps, offered_rps) = o.rates();
            json!({
                "node": i + 1,
                "busy": i < a.grid.busy,
                "target_rps": target,
                "accepted_rps": round(accepted_rps, 1),
                "offered_rps": round(offered_rps, 1),
                "load_secs": round(o.elapsed.as_secs_f64(), 3),
                "uplink": uplink,
            })
        })
        .collect()
}

/// Per class figures of a run, and its records delivered in the measured
/// window and on time.
pub(crate) struct Summary {
    /// `{ls: {bound_ms, latency_ms_mean, latency_ms_sd, violation_pct,
    /// accepted, refused, delivered}, nm: .., lt: ..}`.
    pub classes: Value,
    /// Records that arrived within the measured window.
    pub in_load: usize,
    /// Of those, the ones within their class bound.
    pub on_time: usize,
}

/// Latency mean and spread and the share past the bound per class over
/// `records`, with what the generators had `accepted` and `refused`;
/// records that arrived within `window` (Unix microseconds, from and to:
/// the load after its warm-up) count towards throughput.
pub(crate) fn summarise(
    records: &[Delivered],
    accepted: [u64; 3],
    refused: [u64; 3],
    window: (u64, u64),
) -> Summary {
    let mut classes = serde_json::Map::new();
    for (c, (name, bound)) in CLASSES.iter().enumerate() {
        let lat: Vec<f64> = records
            .iter()
            .filter(|r| r.class == c)
            .map(|r| r.latency_ms)
            .collect();
        let mean = report::mean(&lat);
        let sd = (lat.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / lat.len() as f64).sqrt();
        let late = lat.iter().filter(|&&x| x > *bound as f64).count();
        let mut sorted = lat.clone();
        sorted.sort_by(f64::total_cmp);
        let p99 = report::percentile(&sorted, 0.99);
        // Where the time went, for all and for the late ones: in weir
        // (queued, batched, paced) or on the way (link, delay, broker).
        let split = |late_only: bool| {
            let parts: Vec<(f64, f64)> = records
                .iter()
                .filter(|r| r.class == c && (!late_only || r.latency_ms > *bound as f64))
                .filter_map(|r| r.in_weir_ms.map(|w| (w, r.latency_ms - w)))
                .collect();
            let weir: Vec<f64> = parts.iter().map(|p| p.0).collect();
            let way: Vec<f64> = parts.iter().map(|p| p.1).collect();
            (
                round(nan0(report::mean(&weir)), 1),
                round(nan0(report::mean(&way)), 1),
            )
        };
        let (in_weir, on_way) = split(false);
        let (late_in_weir, late_on_way) = split(true);
        classes.insert(
            name.to_string(),
            json!({
                "in_weir_ms_mean": in_weir,
                "on_way_ms_mean": on_way,
                "late_in_weir_ms_mean": late_in_weir,
                "late_on_way_ms_mean": late_on_way,
                "bound_ms": bound,
                "latency_ms_mean": round(nan0(mean), 1),
                "latency_ms_sd": round(nan0(sd), 1),
                "latency_ms_p99": round(nan0(p99.unwrap_or(f64::NAN)), 1),
                "latency_ms_max": round(nan0(sorted.last().copied().unwrap_or(f64::NAN)), 1),
                "violation_pct": round(nan0(100.0 * late as f64 / lat.len() as f64), 2),
                "accepted": accepted[c],
                "refused": refused[c],
                "delivered": lat.len(),
            }),
        );
    }
    let within = |r: &&Delivered| r.at_us >= window.0 && r.at_us < window.1;
    let in_load = records.iter().filter(within).count();
    let on_time = records
        .iter()
        .filter(within)
        .filter(|r| r.latency_ms <= CLASSES[r.class].1 as f64)
        .count();
    Summary {
        classes: Value::Object(classes),
        in_load,
        on_time,
    }
}

/// Runs the grid and returns the table, the JSON array and the SVG.
pub async fn run(a: &Args) -> anyhow::Result<(String, Value, String)> {
    anyhow::ensure!(
        a.grid.busy <= a.grid.nodes,
        "--busy {} > --nodes {}",
        a.grid.busy,
        a.grid.nodes
    );
    let cells = grid(
        &a.schemes,
        &a.grid.networks,
        &a.grid.lt_rates,
        &a.record_bytes,
    )?;
    let bar = report::progress(cells.len() as u64, "janus");
    let mut runs = Vec::new();
    for (k, cell) in cells.iter().enumerate() {
        bar.set_message(format!(
            "{} {} lt {}/s {} B",
            cell.scheme, cell.network, cell.lt_rate, cell.record_bytes
        ));
        let base = std::env::temp_dir().join(format!("weir-lab-janus-{}-{k}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        runs.push(run_cell(a, cell, &base).await?);
        bar.inc(1);
    }
    bar.finish_and_clear();
    let table = table(&runs);
    let svg = svg(&runs)?;
    Ok((table, Value::Array(runs), svg))
}

/// What the nodes' own uplinks can carry with no redirection (QM-only's
/// physical limit): per node, what it was offered or what its uplink
/// carries at `uplink_records_per_sec`, whichever is less, summed.
pub(crate) fn own_links_limit(
    offered_rps: impl IntoIterator<Item = f64>,
    uplink_records_per_sec: f64,
) -> f64 {
    offered_rps
        .into_iter()
        .map(|o| o.min(uplink_records_per_sec))
        .sum()
}

#[cfg(test)]
mod tests;
