//! One cell as it runs: the cloud, the nodes, the loads, the fault and
//! the sampler started and stopped in turn, and the cell's row.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context};
use serde_json::{json, Value};
use tokio::process::{Child, Command};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::args::{Args, Bins};
use super::cloud::{consume, unix_us, Consumed};
use super::config::{config_text, split_amqp, MQTT_PORT};
use super::fault::Fault;
use super::node::{log_events, metric, metric_sum, scrape, Node};
use super::offer::{read_offer, Offered};
use super::row::{advert_rate, input_rows, late_ls, ls_blame, per_node_latency};
use super::sampler::sample_uplinks;
use super::testbed::{lan_bytes, ns, uplink_bytes, wan_addrs, Testbed};
use crate::janus::{self, nan0, Cell, Delivered, Summary};
use crate::report::round;

/// The first delay line's port (one per cell, so a cell never meets the
/// last one's listener).
const DELAY_PORT_BASE: u16 = 5700;

/// How long the nodes may take to start and see each other.
const START_WAIT: Duration = Duration::from_secs(20);

/// How far in the future the generators are told to start: time to
/// connect all of them.
const START_LEAD: Duration = Duration::from_millis(1500);

/// Runs one cell and returns its row.
pub(super) async fn run_cell(
    a: &Args,
    bins: &Bins,
    bed: &Testbed,
    cell: &Cell,
    index: usize,
) -> anyhow::Result<Value> {
    let n = a.grid.nodes;
    let profile = janus::preset(&cell.network)?;
    bed.shape(profile.bytes_per_sec)?;
    let run = CellRun::new(a, bins, cell, index, profile)?;

    let cloud = run.start_cloud().await?;
    let mut nodes = run.start_nodes().await?;
    run.wait_for_peers(&mut nodes).await?;

    // The devices.
    let start_us = unix_us(SystemTime::now() + START_LEAD);
    let uplink_before = uplink_bytes(bed.nodes)?;
    let lan_before = (lan_bytes(bed.nodes)?, Instant::now());
    let loads = run.start_loads(start_us)?;
    let fault = run.spawn_fault(&nodes, start_us);
    let sampler = run.spawn_sampler(&nodes, start_us);

    let offered = run.collect_offers(loads).await?;
    let uplinks = sampler.await.context("the uplink sampler panicked")?;
    let (faults, restarted) = fault.await.context("the fault task panicked")??;
    if let Some(node) = restarted {
        let old = std::mem::replace(&mut nodes[n - 1], node);
        old.stop(Duration::ZERO).await;
    }
    let acked: u64 = offered.iter().flat_map(|o| o.acked).sum();
    let (drained, drain_ms) = drain(&cloud.distinct, acked, a.drain).await;
    let (redirected, queued_at_end) = end_counts(&nodes).await;
    let node_events = run.stop_nodes(nodes).await;
    // After the nodes' own shutdown drain, like the consumer's count.
    let uplink_after = uplink_bytes(bed.nodes)?;
    let lan_after = lan_bytes(bed.nodes)?;
    let lan_bps = lan_after
        .iter()
        .zip(&lan_before.0)
        .map(|(a, b)| a.saturating_sub(*b) as f64)
        .sum::<f64>()
        / n as f64
        / lan_before.1.elapsed().as_secs_f64().max(1e-9);
    let consumed = cloud.stop().await?;
    if !a.keep {
        let _ = std::fs::remove_dir_all(&run.base);
    }
    Ok(run.row(Outcome {
        consumed,
        offered,
        uplinks,
        faults,
        start_us,
        acked,
        drained,
        drain_ms,
        redirected,
        queued_at_end,
        node_events,
        lan_bps,
        uplink_before,
        uplink_after,
    }))
}

/// One cell as it runs: what its stages share.
struct CellRun<'a> {
    a: &'a Args,
    bins: &'a Bins,
    cell: &'a Cell,
    profile: weir::egress::link::LinkProfile,
    /// The cell's directory: `node-<k>` holds node k's config, logs and
    /// load report.
    base: PathBuf,
    /// The RabbitMQ queue the nodes deliver into.
    queue: String,
    /// `--amqp` split around its host and port (see [`split_amqp`]).
    amqp_prefix: String,
    amqp_target: String,
    amqp_vhost: String,
    /// The delay lines' port.
    port: u16,
}

/// What the cloud runs for a cell: a delay line per node in front of
/// RabbitMQ, and the consumer of the cell's queue.
struct Cloud {
    lines: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
    state: Arc<Mutex<Consumed>>,
    distinct: Arc<AtomicU64>,
    stop: CancellationToken,
    consumer: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Cloud {
    /// Stops the consumer and the delay lines, and returns what the
    /// consumer saw.
    async fn stop(self) -> anyhow::Result<Consumed> {
        self.stop.cancel();
        self.consumer.await.context("the consumer panicked")??;
        for l in self.lines {
            l.abort();
        }
        let consumed = std::mem::take(&mut *self.state.lock().expect("not poisoned"));
        Ok(consumed)
    }
}

/// What a cell measured, from the load's start to the nodes' shutdown.
struct Outcome {
    consumed: Consumed,
    /// Per node, what its `weir-load offer` reported.
    offered: Vec<Offered>,
    /// Per node, its uplink samples.
    uplinks: Vec<Vec<Value>>,
    faults: Value,
    start_us: u64,
    acked: u64,
    drained: bool,
    drain_ms: f64,
    redirected: f64,
    queued_at_end: f64,
    node_events: Vec<Value>,
    lan_bps: f64,
    /// Each uplink's byte counter before the load and after the shutdown.
    uplink_before: Vec<u64>,
    uplink_after: Vec<u64>,
}

impl<'a> CellRun<'a> {
    /// The cell's directory (emptied), queue and RabbitMQ address.
    fn new(
        a: &'a Args,
        bins: &'a Bins,
        cell: &'a Cell,
        index: usize,
        profile: weir::egress::link::LinkProfile,
    ) -> anyhow::Result<CellRun<'a>> {
        let base =
            std::env::temp_dir().join(format!("weir-lab-cluster-{}-{index}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let queue = format!("weir-lab.cluster.{}.{index}", std::process::id());
        let (amqp_prefix, amqp_target, amqp_vhost) = split_amqp(&a.amqp)?;
        Ok(CellRun {
            a,
            bins,
            cell,
            profile,
            base,
            queue,
            amqp_prefix,
            amqp_target,
            amqp_vhost,
            port: DELAY_PORT_BASE + index as u16,
        })
    }

    /// Nodes in the cell.
    fn n(&self) -> usize {
        self.a.grid.nodes
    }

    /// The cloud: a delay line per node, then the consumer; returns once
    /// the consumer is reading.
    async fn start_cloud(&self) -> anyhow::Result<Cloud> {
        let mut lines = Vec::new();
        for k in 1..=self.n() {
            let listen = SocketAddr::from((wan_addrs(k).1, self.port));
            let listener = tokio::net::TcpListener::bind(listen)
                .await
                .with_context(|| format!("cannot listen on {listen} for node {k}'s delay line"))?;
            lines.push(tokio::spawn(crate::delay::serve_on(
                listener,
                self.amqp_target.clone(),
                self.profile.delay,
                Duration::ZERO,
                16 << 20,
            )));
        }
        let state = Arc::new(Mutex::new(Consumed::default()));
        let distinct = Arc::new(AtomicU64::new(0));
        let stop = CancellationToken::new();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let consumer = tokio::spawn(consume(
            self.a.amqp.clone(),
            self.queue.clone(),
            Arc::clone(&state),
            Arc::clone(&distinct),
            stop.clone(),
            ready_tx,
        ));
        if ready_rx.await.is_err() {
            let e = consumer.await?.err();
            bail!("the consumer did not start: {e:?}");
        }
        Ok(Cloud {
            lines,
            state,
            distinct,
            stop,
            consumer,
        })
    }

    /// Writes each node's config and starts its weir, one after another.
    async fn start_nodes(&self) -> anyhow::Result<Vec<Node>> {
        let mut nodes = Vec::new();
        for k in 1..=self.n() {
            let dir = self.base.join(format!("node-{k}"));
            std::fs::create_dir_all(&dir)?;
            let amqp = format!(
                "{}{}:{}{}",
                self.amqp_prefix,
                wan_addrs(k).1,
                self.port,
                self.amqp_vhost
            );
            let text = config_text(
                k,
                &dir,
                self.cell,
                self.profile.bytes_per_sec,
                self.a,
                &amqp,
                &self.queue,
            );
            weir::config::parse(&text, "weir-lab cluster config")
                .map_err(|e| anyhow::anyhow!("the lab's cluster config is invalid: {e}"))?;
            let path = dir.join("weir.toml");
            std::fs::write(&path, text)?;
            nodes.push(Node::start(self.bins, k, &path, &dir).await?);
        }
        Ok(nodes)
    }

    /// Waits until every node is up and sees the others, as on a running
    /// testbed, for at most [`START_WAIT`].
    async fn wait_for_peers(&self, nodes: &mut [Node]) -> anyhow::Result<()> {
        let n = self.n();
        let deadline = Instant::now() + START_WAIT;
        for node in nodes {
            loop {
                if let Some(status) = node.child.try_wait()? {
                    bail!(
                        "weir on node {} exited ({status}); its log: {}",
                        node.k,
                        self.base
                            .join(format!("node-{}/weir.log", node.k))
                            .display()
                    );
                }
                let alive = scrape(node.admin())
                    .await
                    .ok()
                    .and_then(|t| metric(&t, "weir_peers_alive"));
                if alive.is_some_and(|v| v as usize + 1 >= n) {
                    break;
                }
                ensure!(
                    Instant::now() < deadline,
                    "node {} did not see its peers within {START_WAIT:?} (log: {})",
                    node.k,
                    self.base
                        .join(format!("node-{}/weir.log", node.k))
                        .display()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    /// Starts each node's `weir-load offer`, told to begin at `start_us`:
    /// the process and where it writes its report.
    fn start_loads(&self, start_us: u64) -> anyhow::Result<Vec<(Child, PathBuf)>> {
        let (a, cell, base) = (self.a, self.cell, &self.base);
        let busy_rates = [
            a.grid.busy_rates.first().copied().unwrap_or(30),
            a.grid.busy_rates.get(1).copied().unwrap_or(300),
            cell.lt_rate,
        ];
        let mut loads = Vec::new();
        for k in 1..=self.n() {
            let rates = if k <= a.grid.busy {
                busy_rates
            } else {
                [a.grid.idle_rate; 3]
            };
            let json = base.join(format!("node-{k}/offer.json"));
            let log = std::fs::File::create(base.join(format!("node-{k}/offer.log")))?;
            let child = Command::new("ip")
                .args(["netns", "exec", &ns(k)])
                .arg(&self.bins.weir_load)
                .arg("--json")
                .arg(&json)
                .args([
                    "offer",
                    "--addr",
                    &format!("127.0.0.1:{MQTT_PORT}"),
                    "--rates",
                    &format!("ls={},nm={},lt={}", rates[0], rates[1], rates[2]),
                    "--topic-prefix",
                    &format!("n{k}"),
                    "--size",
                    &cell.record_bytes.to_string(),
                    "--seconds",
                    &(a.grid.warmup + a.grid.seconds).to_string(),
                    "--start-at-ms",
                    &(start_us / 1000).to_string(),
                ])
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("cannot start weir-load on node {k}"))?;
            loads.push((child, json));
        }
        Ok(loads)
    }

    /// Starts the fault, if asked for, on the last node.
    fn spawn_fault(
        &self,
        nodes: &[Node],
        start_us: u64,
    ) -> tokio::task::JoinHandle<anyhow::Result<(Value, Option<Node>)>> {
        let k = self.n();
        let fault = Fault {
            k,
            n: self.n(),
            start: UNIX_EPOCH + Duration::from_micros(start_us),
            victim_pid: nodes[k - 1].child.id(),
            weir: self.bins.weir.clone(),
            config: self.base.join(format!("node-{k}/weir.toml")),
            dir: self.base.join(format!("node-{k}")),
            kill_at: self.a.kill_at,
            restart_after: self.a.restart_after,
            partition_at: self.a.partition_at,
            partition_for: self.a.partition_for,
        };
        tokio::spawn(fault.run())
    }

    /// Starts sampling each node's uplink as it sees it, through the load.
    fn spawn_sampler(
        &self,
        nodes: &[Node],
        start_us: u64,
    ) -> tokio::task::JoinHandle<Vec<Vec<Value>>> {
        let admins: Vec<SocketAddr> = nodes.iter().map(Node::admin).collect();
        let pids: Vec<Option<u32>> = nodes.iter().map(|n| n.child.id()).collect();
        let seconds = self.a.grid.warmup + self.a.grid.seconds;
        tokio::spawn(sample_uplinks(admins, pids, start_us, seconds))
    }

    /// Waits for each node's load to end and reads its report.
    async fn collect_offers(&self, loads: Vec<(Child, PathBuf)>) -> anyhow::Result<Vec<Offered>> {
        let mut offered = Vec::new();
        for (k, (mut child, json)) in loads.into_iter().enumerate() {
            let status = child.wait().await?;
            ensure!(
                status.success() || json.is_file(),
                "weir-load on node {} failed ({status}); its log: {}",
                k + 1,
                self.base
                    .join(format!("node-{}/offer.log", k + 1))
                    .display()
            );
            offered.push(read_offer(&json)?);
        }
        Ok(offered)
    }

    /// Stops the nodes and returns what each had logged before its
    /// shutdown (which says peers are gone as a matter of course).
    async fn stop_nodes(&self, nodes: Vec<Node>) -> Vec<Value> {
        let log_of = |k: usize| self.base.join(format!("node-{k}/weir.log"));
        let log_ends: Vec<(usize, u64)> = nodes
            .iter()
            .map(|node| {
                let end = std::fs::metadata(log_of(node.k)).map_or(0, |m| m.len());
                (node.k, end)
            })
            .collect();
        for node in nodes {
            node.stop(Duration::from_secs(5)).await;
        }
        log_ends
            .iter()
            .flat_map(|&(k, end)| {
                log_events(&log_of(k), end).into_iter().map(
                    move |(line, shutdown)| json!({"node": k, "shutdown": shutdown, "line": line}),
                )
            })
            .collect()
    }

    /// The cell's row.
    fn row(&self, out: Outcome) -> Value {
        let (a, cell, profile, n) = (self.a, self.cell, self.profile, self.n());
        let Outcome {
            consumed: st,
            offered,
            uplinks,
            start_us,
            acked,
            ..
        } = out;
        let per_node = per_node_latency(&st, n);
        let late_ls = late_ls(&st, start_us);
        let ls_late_blame = ls_blame(&st);
        let records: Vec<Delivered> = st.seen.into_values().collect();
        let window = (
            start_us + (a.grid.warmup * 1e6) as u64,
            start_us + ((a.grid.warmup + a.grid.seconds) * 1e6) as u64,
        );
        let accepted: [u64; 3] = std::array::from_fn(|c| offered.iter().map(|o| o.acked[c]).sum());
        let refused: [u64; 3] = std::array::from_fn(|c| {
            offered
                .iter()
                .map(|o| o.offered[c].saturating_sub(o.acked[c]))
                .sum()
        });
        let Summary {
            classes,
            in_load,
            on_time,
        } = janus::summarise(&records, accepted, refused, window);
        // Acknowledged to a device and never delivered. Once drained, per
        // origin (a node's records may reach the cloud through any node);
        // otherwise what the nodes still held at the end is not lost.
        let lost: u64 = if out.drained {
            offered
                .iter()
                .enumerate()
                .map(|(i, o)| {
                    let got = st.per_origin.get(&(i as u64 + 1)).copied().unwrap_or(0);
                    o.acked.iter().sum::<u64>().saturating_sub(got)
                })
                .sum()
        } else {
            acked.saturating_sub(records.len() as u64 + out.queued_at_end as u64)
        };
        let uplink_bytes: u64 = out
            .uplink_after
            .iter()
            .zip(&out.uplink_before)
            .map(|(a, b)| a - b)
            .sum();
        let carried = st.records.max(1) as f64;
        let wire_per_record = uplink_bytes as f64 / carried;
        let capacity_rps = n as f64 * profile.bytes_per_sec / wire_per_record;
        let own_links_rps = janus::own_links_limit(
            offered
                .iter()
                .map(|o| o.offered.iter().sum::<u64>() as f64 / o.seconds.max(1e-9)),
            profile.bytes_per_sec / wire_per_record,
        );
        let offered_rps: f64 = offered
            .iter()
            .map(|o| o.offered.iter().sum::<u64>() as f64 / o.seconds.max(1e-9))
            .sum();
        let input = input_rows(a, &offered, &per_node, uplinks);
        let delivered = in_load as f64 / a.grid.seconds;
        json!({
            "scheme": cell.scheme,
            "network": cell.network,
            "lt_rate": cell.lt_rate,
            "record_bytes": cell.record_bytes,
            "track_uplink": !a.pin_uplink,
            "adverts": a.adverts,
            "advert_bytes_per_node_s": round(nan0(advert_rate(&input)), 1),
            "lan_bytes_per_node_s": round(out.lan_bps, 0),
            "offered_rps": round(offered_rps, 1),
            "capacity_limit_rps": round(nan0(offered_rps.min(capacity_rps)), 1),
            "own_links_limit_rps": round(nan0(own_links_rps), 1),
            "delivered_rps": round(delivered, 1),
            "delivered_on_time_rps": round(on_time as f64 / a.grid.seconds, 1),
            "lost": lost,
            "duplicates": st.duplicates,
            "classes": classes,
            "throughput_rps": round(delivered, 1),
            "wire_bytes_per_record": round(nan0(wire_per_record), 1),
            "batch_bytes_per_record": round(st.body_bytes as f64 / carried, 1),
            "uplink_bps": round(profile.bytes_per_sec, 0),
            "acked": acked,
            "delivered": records.len(),
            "redirected": out.redirected as u64,
            "drained": out.drained,
            "drain_ms": round(out.drain_ms, 0),
            "queued_at_end": out.queued_at_end as u64,
            "late_ls": late_ls,
            "ls_late_blame": ls_late_blame,
            "log_events": out.node_events,
            "durability": a.durability,
            "faults": out.faults,
            "input": input,
            "paper": janus::paper(&cell.scheme, &cell.network),
            "link": format!("tbf {} bit/s, {} ms towards the cloud", (profile.bytes_per_sec * 8.0).round(), profile.delay.as_millis()),
            "tcp_congestion": a.tcp_congestion,
            "urgent_lane": a.urgent_lane.unwrap_or(weir::config::AMQP_URGENT_LANE),
            "defaults": a.defaults,
            "max_batch_bytes": a.max_batch_bytes,
            "max_in_flight": a.max_in_flight,
        })
    }
}

/// Waits, for at most `drain` seconds, until the consumer has seen
/// `acked` distinct records: whether it did, and the milliseconds waited.
async fn drain(distinct: &AtomicU64, acked: u64, drain: f64) -> (bool, f64) {
    let drain_start = Instant::now();
    let drain_deadline = drain_start + Duration::from_secs_f64(drain);
    let mut drained = false;
    while Instant::now() < drain_deadline {
        if distinct.load(Ordering::Relaxed) >= acked {
            drained = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (drained, drain_start.elapsed().as_secs_f64() * 1e3)
}

/// Records the nodes took in from peers, and records still queued, summed
/// over the nodes that answered.
async fn end_counts(nodes: &[Node]) -> (f64, f64) {
    let (mut redirected, mut queued_at_end) = (0.0, 0.0);
    for node in nodes {
        if let Ok(text) = scrape(node.admin()).await {
            redirected += metric_sum(&text, "weir_peer_records_redirected_in_total");
            queued_at_end += metric_sum(&text, "weir_class_queued_records");
        }
    }
    (redirected, queued_at_end)
}
