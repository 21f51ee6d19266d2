//! The JANUS evaluation with real processes: N `weir run`
//! processes, each in a network namespace of its own, with a shaped uplink
//! to the cloud, peering over real gRPC on a LAN, loaded by separate
//! `weir-load offer` processes over MQTT, delivering into RabbitMQ.
//!
//! # The testbed
//! - **Cloud**: the root namespace. RabbitMQ (`--amqp`, started by
//!   scripts/services.sh) and, per node, a delay line of this process
//!   ([`crate::delay`]) in front of it at `10.251.<k>.1`. The lab's
//!   consumer reads the run's queue there.
//! - **Node k**: namespace `weir-lab-n<k>` with
//!   - `wan0` (10.251.k.2/30), a veth to the cloud whose egress is shaped by
//!     `tc tbf` to the network's Table III rate (18 Mbit/s for 4G): the
//!     uplink. weir's AMQP egress reaches RabbitMQ through it and the
//!     delay line, which holds every byte towards the cloud for the
//!     network's Table III latency (50 ms for 4G) and nothing on the way
//!     back, as `tc netem` on the node's interface would (netem is not
//!     available here).
//!   - `lan0` (10.252.0.k/24) on a bridge with the other nodes, unshaped:
//!     the local network the paper's Pis share (Assumption 2: much faster
//!     than the uplink). Peering (gRPC, `allow_anonymous`) and weir's admin
//!     endpoint (read by the lab from the bridge's 10.252.0.254) listen
//!     there.
//!   - weir's MQTT listener on the namespace's own loopback, where that
//!     node's `weir-load offer` publishes `ls`/`nm`/`lt` at the paper's
//!     rates.
//!
//! # What is measured
//! - **Latency** of a record: when the consumer took it from RabbitMQ
//!   minus weir's `ingress_us` stamp (one machine, one clock). It includes
//!   the shaped link's queue and the 50 ms.
//! - **Throughput**: distinct records consumed by the end of the load, per
//!   second of load; on time: those within their class bound.
//! - **The physical limit**: min(offered, the sum of the shaped rates
//!   divided by the bytes each delivered record took on the uplinks),
//!   where the bytes are counted at the cloud's end of each `wan0` (IP,
//!   TCP and AMQP framing included: what `tbf` charges).
//! - **Lost**: records weir acknowledged to a device (PUBACK) that never
//!   reached RabbitMQ; **duplicates**: deliveries beyond the first.
//! - Every 250 ms each node's uplink estimate and `C_out` from its
//!   `/metrics` (the `cluster-uplink.svg` plot against the shaped rate).

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context};
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions, ExchangeDeleteOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::janus::{self, nan0, Cell, Delivered, Summary, CLASSES};
use crate::netns::{self, in_ns, sh};
use crate::report::{self, round};

/// Namespaces are `weir-lab-n<k>`; links in the root namespace `wlw<k>`
/// (uplink) and `wll<k>` (LAN), the bridge `wlbr0`.
const NS_PREFIX: &str = "weir-lab-n";
const BRIDGE: &str = "wlbr0";
/// The root namespace's address on the LAN bridge (the lab reads each
/// node's `/metrics` from it).
const BRIDGE_ADDR: Ipv4Addr = Ipv4Addr::new(10, 252, 0, 254);
const PEER_PORT: u16 = 7070;
const ADMIN_PORT: u16 = 9464;
const MQTT_PORT: u16 = 1883;
/// The first delay line's port (one per cell, so a cell never meets the
/// last one's listener).
const DELAY_PORT_BASE: u16 = 5700;
/// Most bytes `tbf` queues, as time at the shaped rate (what a cellular
/// modem's buffer holds; beyond it packets drop and TCP retransmits).
const TBF_LATENCY_MS: u64 = 200;
/// How long the nodes may take to start and see each other.
const START_WAIT: Duration = Duration::from_secs(20);
/// How often each node's uplink estimate is sampled.
const UPLINK_SAMPLE: Duration = Duration::from_millis(250);

/// Late `ls` records listed one by one in a row (`late_ls`), the first ones.
const LATE_LS_LISTED: usize = 200;
/// Lines of each node's log listed in a row (`log_events`), the first ones.
const LOG_EVENTS_LISTED: usize = 20;
/// Consumer prefetch and acknowledgement batch.
const PREFETCH: u16 = 2048;
const ACK_EVERY: u32 = 64;
/// How far in the future the generators are told to start: time to
/// connect all of them.
const START_LEAD: Duration = Duration::from_millis(1500);

/// Command line of `weir-lab cluster`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Schemes to compare (the paper's: native, qm-only, pmrfs, random,
    /// fcfs, lrfs, best-fit).
    #[arg(long, value_delimiter = ',', default_values_t = ["native", "qm-only", "pmrfs"].map(String::from))]
    pub schemes: Vec<String>,
    /// Payload bytes per record. The paper gives none (a smart-building
    /// dataset's readings); the sizes the issue names, each reported.
    #[arg(long, value_delimiter = ',', default_values_t = [256usize, 480, 640, 720, 1024])]
    pub record_bytes: Vec<usize>,
    #[command(flatten)]
    pub grid: janus::Grid,
    /// Most seconds to wait for the queues to drain after the load; what
    /// is still queued then is reported (`queued_at_end`), not counted as
    /// lost, and is missing from the latency figures (which flatters the
    /// schemes that fall behind: Native, QM-only).
    #[arg(long, default_value_t = 10.0)]
    pub drain: f64,
    /// Pin `C_out` at the preset's rate (`scheduler.track_uplink = false`)
    /// instead of each node's own online estimate.
    #[arg(long)]
    pub pin_uplink: bool,
    /// RabbitMQ, as the cloud sees it (the nodes reach it through their
    /// delay lines).
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    pub amqp: String,
    /// The weir binary [default: `weir` next to this executable].
    #[arg(long)]
    pub weir: Option<PathBuf>,
    /// The weir-load binary [default: `weir-load` next to this executable].
    #[arg(long)]
    pub weir_load: Option<PathBuf>,
    /// Durability of every class on every node: memory, or spool (an
    /// acknowledgement means on disk, so a node killed with -9 and
    /// restarted still delivers what it acknowledged).
    #[arg(long, default_value = "memory", value_parser = ["memory", "spool"])]
    pub durability: String,
    /// Kill one node with SIGKILL this many seconds into the load (the
    /// last node, an idle one and so a provider), and restart it
    /// `--restart-after` later.
    #[arg(long)]
    pub kill_at: Option<f64>,
    /// Seconds between the kill and the restart.
    #[arg(long, default_value_t = 3.0)]
    pub restart_after: f64,
    /// Cut one node (the last) off the LAN this many seconds into the load
    /// (`ip link set lan0 down`: no heartbeats, no forwarding; its uplink
    /// stays) for `--partition-for` seconds, then measure how long the
    /// cluster takes to see it and match it again.
    #[arg(long)]
    pub partition_at: Option<f64>,
    /// Seconds the partition lasts.
    #[arg(long, default_value_t = 10.0)]
    pub partition_for: f64,
    /// How the nodes' adverts travel (`peering.adverts`): a heartbeat to
    /// every peer every period, or gossip (docs/peering.md).
    #[arg(long, default_value = "all-to-all", value_parser = ["all-to-all", "gossip"])]
    pub adverts: String,
    /// Gossip: peers a node exchanges its table with each gossip period.
    #[arg(long, default_value_t = 2)]
    pub gossip_fanout: usize,
    /// Gossip: the gossip period, milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub gossip_every_ms: u64,
    /// TCP congestion control in the nodes' namespaces
    /// (`net.ipv4.tcp_congestion_control`): cubic, Linux's default and the
    /// JANUS Pis' (Raspbian), whatever this machine's own default is.
    #[arg(long, default_value = "cubic")]
    pub tcp_congestion: String,
    /// Each node's `scheduler.burst` (token bucket depth per class), e.g.
    /// `32KiB` [default: weir's, 64 KiB].
    #[arg(long)]
    pub burst: Option<String>,
    /// Each node's `egress.amqp.urgent_lane` (`true` or `false`): `ls`
    /// batches may go beyond a full window of unconfirmed batches, the
    /// others are paced over the round trip (docs/scheduling.md) [default:
    /// weir's, on; the key is written only when given, so older `--weir`
    /// binaries still run].
    #[arg(long)]
    pub urgent_lane: Option<bool>,
    /// Keep each run's configs and logs (in the system's temp directory).
    #[arg(long)]
    pub keep: bool,
    /// Each node runs weir's default config, changing only its addresses,
    /// the egress endpoint, the routes of the load's topics to the default
    /// classes and the shutdown's drain timeout (5 s): no uplink prior, no
    /// scheme, compression as shipped, no peering. With `--nodes 1 --busy
    /// 1`: the link sweep (docs/lab/link-sweep.md).
    #[arg(long)]
    pub defaults: bool,
    /// A hand-tuned batch cap: `scheduler.max_batch_bytes` and
    /// `scheduler.burst` set to this (e.g. `256KiB`); labelled tuned.
    #[arg(long)]
    pub max_batch_bytes: Option<String>,
    /// A hand-tuned window: `egress.amqp.max_in_flight`; labelled tuned.
    #[arg(long)]
    pub max_in_flight: Option<u32>,
}

/// The binaries the lab runs.
struct Bins {
    weir: PathBuf,
    weir_load: PathBuf,
}

fn bins(a: &Args) -> anyhow::Result<Bins> {
    let next_to_me = |name: &str| -> anyhow::Result<PathBuf> {
        Ok(std::env::current_exe()
            .context("cannot find this executable's path")?
            .with_file_name(name))
    };
    let b = Bins {
        weir: a.weir.clone().map_or_else(|| next_to_me("weir"), Ok)?,
        weir_load: a
            .weir_load
            .clone()
            .map_or_else(|| next_to_me("weir-load"), Ok)?,
    };
    for (p, flag) in [(&b.weir, "--weir"), (&b.weir_load, "--weir-load")] {
        ensure!(
            p.is_file(),
            "no binary at {} (build with `cargo build --release -p weir -p weir-load -p weir-lab`, or pass {flag})",
            p.display()
        );
    }
    Ok(b)
}

/// The root namespace's ends of node k's uplink and LAN veths:
/// `wlw<k>`, `wll<k>`.
const ROOT_UPLINK: &str = "wlw";
const ROOT_LAN: &str = "wll";

fn ns(k: usize) -> String {
    format!("{NS_PREFIX}{k}")
}

/// The node's end of its uplink, and the cloud's.
fn wan_addrs(k: usize) -> (Ipv4Addr, Ipv4Addr) {
    let k = u8::try_from(k).expect("at most 250 nodes");
    (Ipv4Addr::new(10, 251, k, 2), Ipv4Addr::new(10, 251, k, 1))
}

fn lan_addr(k: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 252, 0, u8::try_from(k).expect("at most 250 nodes"))
}

/// A veth pair: `root_end` in the root namespace, `ns_end` in namespace
/// `ns` with address `cidr`, up.
fn veth(ns: &str, root_end: &str, ns_end: &str, cidr: &str) -> anyhow::Result<()> {
    sh(
        "ip",
        &[
            "link", "add", root_end, "type", "veth", "peer", "name", ns_end, "netns", ns,
        ],
    )?;
    sh("ip", &["-n", ns, "addr", "add", cidr, "dev", ns_end])?;
    sh("ip", &["-n", ns, "link", "set", ns_end, "up"])
}

/// The namespaces, veths and bridge of a run; removed when dropped.
struct Testbed {
    nodes: usize,
}

/// Adds `algorithm` to `net.ipv4.tcp_allowed_congestion_control` (a
/// host-wide list; a namespace may only choose from it) if it is not
/// there. Nothing else on the host changes: its own default stays.
fn allow_congestion_control(algorithm: &str) -> anyhow::Result<()> {
    const ALLOWED: &str = "/proc/sys/net/ipv4/tcp_allowed_congestion_control";
    let allowed =
        std::fs::read_to_string(ALLOWED).with_context(|| format!("cannot read {ALLOWED}"))?;
    if allowed.split_whitespace().any(|a| a == algorithm) {
        return Ok(());
    }
    let list = format!("{} {algorithm}", allowed.trim());
    sh(
        "sysctl",
        &["-qw", &format!("net.ipv4.tcp_allowed_congestion_control={list}")],
    )
    .with_context(|| format!("TCP congestion control {algorithm:?} is not available here (net.ipv4.tcp_available_congestion_control)"))
}

impl Testbed {
    /// Removes what a killed earlier run left, then builds `nodes` nodes.
    fn build(nodes: usize, tcp_congestion: &str) -> anyhow::Result<Testbed> {
        ensure!(
            (1..=250).contains(&nodes),
            "--nodes must be between 1 and 250"
        );
        Self::remove_leftovers();
        sh("ip", &["link", "add", BRIDGE, "type", "bridge"]).context(
            "weir-lab cluster builds network namespaces, veths and a bridge: it needs root (CAP_NET_ADMIN)",
        )?;
        let bed = Testbed { nodes };
        let bridge_cidr = format!("{BRIDGE_ADDR}/24");
        sh("ip", &["addr", "add", &bridge_cidr, "dev", BRIDGE])?;
        sh("ip", &["link", "set", BRIDGE, "up"])?;
        allow_congestion_control(tcp_congestion)?;
        for k in 1..=nodes {
            let n = ns(k);
            let (node_wan, cloud_wan) = wan_addrs(k);
            let (wlw, wll) = (format!("{ROOT_UPLINK}{k}"), format!("{ROOT_LAN}{k}"));
            sh("ip", &["netns", "add", &n])?;
            sh("ip", &["-n", &n, "link", "set", "lo", "up"])?;
            in_ns(
                &n,
                &[
                    "sysctl",
                    "-qw",
                    &format!("net.ipv4.tcp_congestion_control={tcp_congestion}"),
                ],
            )
            .with_context(|| {
                format!("TCP congestion control {tcp_congestion:?} (see net.ipv4.tcp_available_congestion_control)")
            })?;
            veth(&n, &wlw, "wan0", &format!("{node_wan}/30"))?;
            sh(
                "ip",
                &["addr", "add", &format!("{cloud_wan}/30"), "dev", &wlw],
            )?;
            sh("ip", &["link", "set", &wlw, "up"])?;
            veth(&n, &wll, "lan0", &format!("{}/24", lan_addr(k)))?;
            sh("ip", &["link", "set", &wll, "master", BRIDGE])?;
            sh("ip", &["link", "set", &wll, "up"])?;
        }
        Ok(bed)
    }

    /// Shapes every node's uplink to `bytes_per_sec`.
    fn shape(&self, bytes_per_sec: f64) -> anyhow::Result<()> {
        let bits = (bytes_per_sec * 8.0).round() as u64;
        // A millisecond at the rate, at least two full frames: a larger
        // bucket lets a batch after a pause through at once, faster than
        // the link, which no cellular uplink does and which an estimate of
        // the bandwidth would take as the bandwidth (the kernel's tbf runs
        // on high-resolution timers, so small bursts keep the rate).
        let burst = ((bytes_per_sec / 1000.0) as u64).max(2 * 1514);
        for k in 1..=self.nodes {
            sh(
                "ip",
                &[
                    "netns",
                    "exec",
                    &ns(k),
                    "tc",
                    "qdisc",
                    "replace",
                    "dev",
                    "wan0",
                    "root",
                    "tbf",
                    "rate",
                    &format!("{bits}bit"),
                    "burst",
                    &burst.to_string(),
                    "latency",
                    &format!("{TBF_LATENCY_MS}ms"),
                ],
            )
            .context("tc tbf on a node's uplink")?;
        }
        Ok(())
    }

    fn remove_leftovers() {
        if let Ok(out) = std::process::Command::new("ip")
            .args(["netns", "list"])
            .output()
        {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let name = line.split_whitespace().next().unwrap_or("");
                if name.starts_with(NS_PREFIX) {
                    let _ = sh("ip", &["netns", "del", name]);
                }
            }
        }
        let _ = sh("ip", &["link", "del", BRIDGE]);
        // The kernel removes a deleted namespace's veths asynchronously: a
        // cell started right after another found `wlw1` still there
        // ("File exists"). Delete the root ends (which takes the pair) and
        // wait for them to go, for at most 5 s.
        let ours = || -> Vec<String> {
            std::fs::read_dir("/sys/class/net")
                .map(|d| {
                    d.filter_map(|e| e.ok())
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .filter(|n| n.starts_with(ROOT_UPLINK) || n.starts_with(ROOT_LAN))
                        .collect()
                })
                .unwrap_or_default()
        };
        for link in ours() {
            let _ = sh("ip", &["link", "del", &link]);
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !ours().is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        for k in 1..=self.nodes {
            let _ = sh("ip", &["netns", "del", &ns(k)]);
        }
        let _ = sh("ip", &["link", "del", BRIDGE]);
    }
}

/// Bytes each of `nodes` nodes has sent up its uplink so far: the cloud
/// end's receive counter, what crossed the shaped link (Ethernet, IP and
/// TCP headers and retransmissions included, as tbf charges them).
fn uplink_bytes(nodes: usize) -> anyhow::Result<Vec<u64>> {
    rx_bytes(ROOT_UPLINK, nodes)
}

/// Bytes each node has sent on its LAN so far (heartbeats or gossip,
/// reservations, forwarded records and their acknowledgements), counted
/// where the root namespace receives them, in every header.
fn lan_bytes(nodes: usize) -> anyhow::Result<Vec<u64>> {
    rx_bytes(ROOT_LAN, nodes)
}

fn rx_bytes(prefix: &str, nodes: usize) -> anyhow::Result<Vec<u64>> {
    (1..=nodes)
        .map(|k| {
            let p = format!("/sys/class/net/{prefix}{k}/statistics/rx_bytes");
            let text = std::fs::read_to_string(&p).with_context(|| format!("cannot read {p}"))?;
            text.trim()
                .parse()
                .with_context(|| format!("{p}: not a number"))
        })
        .collect()
}

/// The lines of a node's log that say something went wrong or records
/// were taken back from a peer (warnings, errors, "taking back"), each
/// with whether it came after the first `shutdown_at` bytes (the node's
/// shutdown, where peers going away is a matter of course): how a run's
/// duplicates or stalls can be traced without `--keep`. At most
/// [`LOG_EVENTS_LISTED`], each cut at 300 characters.
fn log_events(path: &std::path::Path, shutdown_at: u64) -> Vec<(String, bool)> {
    let Ok(bytes) = std::fs::read(path) else {
        return Vec::new();
    };
    let at = usize::try_from(shutdown_at)
        .unwrap_or(usize::MAX)
        .min(bytes.len());
    let (before, after) = bytes.split_at(at);
    let pick = |part: &[u8], shutdown: bool| -> Vec<(String, bool)> {
        String::from_utf8_lossy(part)
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR ") || l.contains("taking back"))
            .map(|l| (l.chars().take(300).collect(), shutdown))
            .collect()
    };
    let mut events = pick(before, false);
    events.extend(pick(after, true));
    events.truncate(LOG_EVENTS_LISTED);
    events
}

/// TCP segments retransmitted so far in the namespace of process `pid`
/// (`RetransSegs` of its `/proc/<pid>/net/snmp`).
fn tcp_retransmits(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/snmp")).ok()?;
    snmp_value(&text, "Tcp:", "RetransSegs")
}

/// One counter of a `/proc/net/snmp` table: a header line of names and a
/// line of values, both starting with `table`.
fn snmp_value(text: &str, table: &str, name: &str) -> Option<u64> {
    let mut lines = text.lines().filter(|l| l.starts_with(table));
    let names = lines.next()?.split_whitespace();
    let values = lines.next()?.split_whitespace();
    names
        .zip(values)
        .find(|(n, _)| *n == name)
        .and_then(|(_, v)| v.parse().ok())
}

/// `amqp://user:pass@host:port/vhost` as (`amqp://user:pass@`, `host:port`,
/// `/vhost`).
fn split_amqp(url: &str) -> anyhow::Result<(String, String, String)> {
    let (scheme, rest) = url
        .split_once("://")
        .with_context(|| format!("--amqp {url}: not an amqp:// URL"))?;
    ensure!(
        scheme == "amqp",
        "--amqp {url}: only amqp:// (the delay line relays TCP)"
    );
    let (creds, rest) = match rest.rsplit_once('@') {
        Some((c, r)) => (format!("{c}@"), r),
        None => (String::new(), rest),
    };
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let host = if host.contains(':') {
        host.to_string()
    } else {
        format!("{host}:5672")
    };
    Ok((format!("{scheme}://{creds}"), host, path.to_string()))
}

/// weir's config for node `k` of the cluster in `cell`, whose uplink
/// carries `uplink_bps` (the prior of `scheduler.uplink`).
fn config_text(
    k: usize,
    dir: &Path,
    cell: &Cell,
    uplink_bps: f64,
    a: &Args,
    amqp: &str,
    queue: &str,
) -> String {
    if a.defaults {
        return default_config_text(k, dir, a, amqp, queue);
    }
    let n = a.grid.nodes;
    let peers: Vec<String> = (1..=n)
        .filter(|&p| p != k)
        .map(|p| format!("{{ id = {p}, addr = \"{}:{PEER_PORT}\" }}", lan_addr(p)))
        .collect();
    let classes: String = CLASSES
        .iter()
        .map(|(c, b)| {
            format!(
                "[[class]]\nname = \"{c}\"\nbound = \"{b}ms\"\ndurability = \"{}\"\n",
                a.durability
            )
        })
        .collect();
    let routes = load_routes();
    let dir = toml_string(dir);
    let mut tuned = tuned_keys(a);
    if a.burst.is_some() {
        // `--burst` sets the bucket; the batch cap alone here.
        tuned.0 = a
            .max_batch_bytes
            .as_ref()
            .map(|b| format!("max_batch_bytes = \"{b}\"\n"))
            .unwrap_or_default();
    }
    let adverts = if a.adverts == "gossip" {
        format!(
            "adverts = \"gossip\"\ngossip_fanout = {}\ngossip_every = \"{}ms\"\n",
            a.gossip_fanout, a.gossip_every_ms
        )
    } else {
        "adverts = \"all-to-all\"\n".to_string()
    };
    format!(
        r#"# weir-lab cluster: node {k} of {n}, {scheme} on {network}.
[node]
id = {k}
name = "cluster-{k}"
{classes}
[classify]
default_class = "lt"
{routes}
[spool]
dir = "{dir}/spool"
[ingress.mqtt]
listen = "127.0.0.1:{MQTT_PORT}"
[ingress.grpc]
enabled = false
# JANUS sends records as they are; so does the in-process lab.
[compression]
enabled = false
[egress]
kind = "amqp"
drain_timeout = "5s"
[egress.amqp]
url = "{amqp}"
exchange = "{queue}"
queue = "{queue}"
routing_key = "{queue}"
{urgent_lane}{amqp_tuned}[admin]
listen = "{lan}:{ADMIN_PORT}"
[peering]
listen = "{lan}:{PEER_PORT}"
peers = [{peers}]
{adverts}# The lab's LAN has only the lab's nodes on it (docs/security.md: a real
# deployment proves peers with [peering.tls]).
allow_anonymous = true
[scheduler]
scheme = "{scheme}"
uplink = "{bw}B/s"
track_uplink = {track}
{burst}{scheduler_tuned}"#,
        scheme = cell.scheme,
        network = cell.network,
        lan = lan_addr(k),
        peers = peers.join(", "),
        bw = uplink_bps.round() as u64,
        track = !a.pin_uplink,
        // Only when asked, so older weir binaries still run (`--weir`).
        urgent_lane = a
            .urgent_lane
            .map(|on| format!("urgent_lane = {on}\n"))
            .unwrap_or_default(),
        burst = a
            .burst
            .as_ref()
            .map(|b| format!("burst = \"{b}\"\n"))
            .unwrap_or_default(),
        amqp_tuned = tuned.1,
        scheduler_tuned = tuned.0,
    )
}

/// Routes of the load's topics (`+/<class>/#`) to the lab's classes.
fn load_routes() -> String {
    CLASSES
        .iter()
        .map(|(c, _)| format!("[[classify.route]]\nmqtt = \"+/{c}/#\"\nclass = \"{c}\"\n"))
        .collect()
}

/// The hand-tuned keys `--max-batch-bytes` and `--max-in-flight` give, as
/// (scheduler lines, egress.amqp lines).
fn tuned_keys(a: &Args) -> (String, String) {
    let scheduler = a
        .max_batch_bytes
        .as_ref()
        .map(|b| format!("max_batch_bytes = \"{b}\"\nburst = \"{b}\"\n"))
        .unwrap_or_default();
    let amqp = a
        .max_in_flight
        .map(|w| format!("max_in_flight = {w}\n"))
        .unwrap_or_default();
    (scheduler, amqp)
}

/// `--defaults`: weir's default config for node `k`, with only what a user
/// must change: addresses, the egress endpoint and the routes of the
/// load's topics (`+/<class>/#`) to the default classes (JANUS Table I,
/// the lab's [`CLASSES`]); plus a 5 s drain timeout so a cell stops
/// quickly, and the tuned keys when given.
fn default_config_text(k: usize, dir: &Path, a: &Args, amqp: &str, queue: &str) -> String {
    let routes = load_routes();
    let (scheduler, amqp_tuned) = tuned_keys(a);
    let scheduler = if scheduler.is_empty() {
        String::new()
    } else {
        format!("[scheduler]\n{scheduler}")
    };
    format!(
        r#"# weir-lab cluster --defaults: node {k}, weir's default config but for
# addresses, the egress endpoint and the load's routes.
[node]
id = {k}
name = "cluster-{k}"
[classify]
default_class = "lt"
{routes}
[spool]
dir = "{dir}/spool"
[ingress.mqtt]
listen = "127.0.0.1:{MQTT_PORT}"
[ingress.grpc]
enabled = false
[egress]
kind = "amqp"
drain_timeout = "5s"
[egress.amqp]
url = "{amqp}"
exchange = "{queue}"
queue = "{queue}"
routing_key = "{queue}"
{amqp_tuned}[admin]
listen = "{lan}:{ADMIN_PORT}"
{scheduler}"#,
        dir = toml_string(dir),
        lan = lan_addr(k),
    )
}

pub(crate) fn toml_string(p: &Path) -> String {
    p.display()
        .to_string()
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
}

/// One weir node of a cell.
struct Node {
    k: usize,
    child: Child,
}

impl Node {
    async fn start(bins: &Bins, k: usize, config: &Path, dir: &Path) -> anyhow::Result<Node> {
        let log = std::fs::File::create(dir.join("weir.log"))?;
        let child = Command::new("ip")
            .args(["netns", "exec", &ns(k)])
            .arg(&bins.weir)
            .arg("run")
            .arg("--config")
            .arg(config)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start weir on node {k}"))?;
        Ok(Node { k, child })
    }

    fn admin(&self) -> SocketAddr {
        SocketAddr::from((lan_addr(self.k), ADMIN_PORT))
    }

    /// SIGTERM, then SIGKILL after `grace`.
    async fn stop(mut self, grace: Duration) {
        if let Some(pid) = self.child.id() {
            // SAFETY: kill(2) with a pid this process started and has not
            // reaped; no memory is involved.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGTERM);
            }
        }
        if tokio::time::timeout(grace, self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// One Prometheus sample: `name` or `name{labels}`.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (s, v) = l.rsplit_once(' ')?;
        (s == series).then(|| v.parse().ok()).flatten()
    })
}

/// The sum of every series of a metric (all label sets).
fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (s, v) = l.rsplit_once(' ')?;
            let labels = s.strip_prefix(name)?;
            (labels.is_empty() || labels.starts_with('{'))
                .then(|| v.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// Milliseconds from `since` until a node's `/metrics` satisfies `ok`,
/// polled every 10 ms for at most 20 s (`None`: never).
async fn until_metric(admin: SocketAddr, since: Instant, ok: impl Fn(&str) -> bool) -> Option<f64> {
    let deadline = since + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(text) = scrape(admin).await {
            if ok(&text) {
                return Some(round(since.elapsed().as_secs_f64() * 1e3, 0));
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

/// `GET /metrics` from a node's admin endpoint (HTTP/1.0: the body ends
/// with the connection).
async fn scrape(addr: SocketAddr) -> anyhow::Result<String> {
    let mut s = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
        .await
        .context("timed out")??;
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut buf))
        .await
        .context("timed out")??;
    let text = String::from_utf8_lossy(&buf);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .context("no HTTP body")?;
    Ok(body.to_string())
}

/// What the consumer has seen.
#[derive(Default)]
struct Consumed {
    /// First delivery of every (origin, seq).
    seen: HashMap<(u64, u64), Delivered>,
    /// Distinct records per origin (node id).
    per_origin: HashMap<u64, u64>,
    duplicates: u64,
    /// Batch bodies and the records in them (duplicates too).
    body_bytes: u64,
    records: u64,
}

/// Consumes `queue` until `stop`, keeping what it saw in `state` and the
/// distinct count in `distinct`.
async fn consume(
    url: String,
    queue: String,
    state: Arc<Mutex<Consumed>>,
    distinct: Arc<AtomicU64>,
    stop: CancellationToken,
    ready: tokio::sync::oneshot::Sender<()>,
) -> anyhow::Result<()> {
    let conn = Connection::connect(&url, ConnectionProperties::default())
        .await
        .with_context(|| format!("RabbitMQ at {url} (run scripts/services.sh)"))?;
    let ch = conn.create_channel().await?;
    ch.basic_qos(PREFETCH, BasicQosOptions::default()).await?;
    // Declared as weir declares it, so either may go first.
    ch.queue_declare(
        queue.as_str().into(),
        QueueDeclareOptions::durable(),
        FieldTable::default(),
    )
    .await
    .with_context(|| format!("declaring queue {queue}"))?;
    let mut consumer = ch
        .basic_consume(
            queue.as_str().into(),
            "weir-lab".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let _ = ready.send(());
    let mut pending = 0u32;
    let mut unacked = None;
    loop {
        // Cancel safety: lapin's consumer keeps a delivery not returned.
        let next = tokio::select! {
            d = consumer.next() => d,
            _ = stop.cancelled() => break,
        };
        let delivery = next.context("RabbitMQ cancelled the consumer")??;
        let consumed_us = unix_us(SystemTime::now());
        let batch = batch_of(&delivery)?;
        let sent_us = weir::egress::amqp::header_u64(
            &delivery.properties,
            weir::egress::amqp::HEADER_SENT_US,
        );
        {
            let mut st = state.lock().expect("not poisoned");
            st.body_bytes += delivery.data.len() as u64;
            st.records += batch.records.len() as u64;
            for r in &batch.records {
                let Some(class) = CLASSES.iter().position(|(c, _)| *c == r.class) else {
                    continue;
                };
                let d = Delivered {
                    class,
                    latency_ms: consumed_us.saturating_sub(r.ingress_us) as f64 / 1e3,
                    at_us: consumed_us,
                    in_weir_ms: sent_us.map(|s| s.saturating_sub(r.ingress_us) as f64 / 1e3),
                };
                match st.seen.entry((r.origin, r.seq)) {
                    std::collections::hash_map::Entry::Occupied(_) => st.duplicates += 1,
                    std::collections::hash_map::Entry::Vacant(v) => {
                        v.insert(d);
                        *st.per_origin.entry(r.origin).or_default() += 1;
                        distinct.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        pending += 1;
        if pending >= ACK_EVERY {
            delivery.ack(BasicAckOptions { multiple: true }).await?;
            pending = 0;
            unacked = None;
        } else {
            unacked = Some(delivery);
        }
    }
    if let Some(d) = unacked {
        d.ack(BasicAckOptions { multiple: true }).await?;
    }
    let _ = ch
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await;
    let _ = ch
        .exchange_delete(queue.as_str().into(), ExchangeDeleteOptions::default())
        .await;
    let _ = conn.close(200, "done".into()).await;
    Ok(())
}

/// The weir batch an AMQP message carries, decoded by its content
/// encoding.
pub(crate) fn batch_of(
    delivery: &lapin::message::Delivery,
) -> anyhow::Result<weir_proto::pb::Batch> {
    let encoding = delivery
        .properties
        .content_encoding()
        .as_ref()
        .map_or("identity", |s| s.as_str());
    weir_proto::decode_batch(&delivery.data, encoding, 64 << 20)
        .context("a message that is not a weir batch")
}

fn unix_us(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_micros() as u64
}

/// What one node's `weir-load offer` reported: per class (in [`CLASSES`]
/// order) offered, sent and acknowledged.
#[derive(Debug, Default, Clone)]
struct Offered {
    offered: [u64; 3],
    sent: [u64; 3],
    acked: [u64; 3],
    seconds: f64,
    errors: Vec<String>,
}

fn read_offer(path: &Path) -> anyhow::Result<Offered> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("weir-load wrote no report at {}", path.display()))?;
    let v: Value = serde_json::from_str(&text)?;
    let mut o = Offered {
        seconds: v["seconds"].as_f64().unwrap_or(0.0),
        ..Offered::default()
    };
    for c in v["classes"].as_array().into_iter().flatten() {
        let Some(i) = CLASSES.iter().position(|(n, _)| c["class"] == *n) else {
            continue;
        };
        o.offered[i] = c["offered"].as_u64().unwrap_or(0);
        o.sent[i] = c["sent"].as_u64().unwrap_or(0);
        o.acked[i] = c["acked"].as_u64().unwrap_or(0);
        if let Some(e) = c["error"].as_str() {
            o.errors.push(format!("{}: {e}", CLASSES[i].0));
        }
    }
    Ok(o)
}

/// Runs one cell and returns its row.
async fn run_cell(
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

/// The fault a cell injects on one node, timed from the load's start: a
/// SIGKILL and a restart, a cut off the LAN and a heal, or both.
struct Fault {
    /// The node.
    k: usize,
    /// Nodes in the cell.
    n: usize,
    /// When the load starts.
    start: SystemTime,
    victim_pid: Option<u32>,
    /// The weir binary, the node's config and its directory (to restart it).
    weir: PathBuf,
    config: PathBuf,
    dir: PathBuf,
    kill_at: Option<f64>,
    restart_after: f64,
    partition_at: Option<f64>,
    partition_for: f64,
}

impl Fault {
    /// Runs the faults asked for: their report, and the restarted node if
    /// one was killed.
    async fn run(self) -> anyhow::Result<(Value, Option<Node>)> {
        let mut report = serde_json::Map::new();
        let mut restarted = None;
        if let Some(at) = self.kill_at {
            restarted = Some(self.kill(at, &mut report).await?);
        }
        if let Some(at) = self.partition_at {
            self.partition(at, &mut report).await?;
        }
        anyhow::Ok((Value::Object(report), restarted))
    }

    /// How long from now until `secs` into the load.
    fn until(&self, secs: f64) -> Duration {
        (self.start + Duration::from_secs_f64(secs))
            .duration_since(SystemTime::now())
            .unwrap_or_default()
    }

    /// Kills the node at `at`, restarts it `restart_after` later and
    /// reports how long it took to see its peers again.
    async fn kill(
        &self,
        at: f64,
        report: &mut serde_json::Map<String, Value>,
    ) -> anyhow::Result<Node> {
        let (k, n) = (self.k, self.n);
        tokio::time::sleep(self.until(at)).await;
        if let Some(pid) = self.victim_pid {
            // SAFETY: kill(2) on a child this process started and
            // has not reaped; no memory is involved.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
        }
        tokio::time::sleep(Duration::from_secs_f64(self.restart_after)).await;
        let bins = Bins {
            weir: self.weir.clone(),
            weir_load: PathBuf::new(),
        };
        let node = Node::start(&bins, k, &self.config, &self.dir).await?;
        let back = Instant::now();
        let seen = until_metric(node.admin(), back, |t| {
            metric(t, "weir_peers_alive").is_some_and(|v| v as usize + 1 >= n)
        })
        .await;
        report.insert(
            "kill".into(),
            json!({"node": k, "at_s": at, "restart_after_s": self.restart_after,
                   "peers_seen_after_restart_ms": seen}),
        );
        Ok(node)
    }

    /// Cuts the node off the LAN at `at` for `partition_for`, and reports
    /// how long after the heal it saw its peers and was matched again.
    async fn partition(
        &self,
        at: f64,
        report: &mut serde_json::Map<String, Value>,
    ) -> anyhow::Result<()> {
        let (k, n) = (self.k, self.n);
        tokio::time::sleep(self.until(at)).await;
        sh("ip", &["-n", &ns(k), "link", "set", "lan0", "down"])?;
        tokio::time::sleep(Duration::from_secs_f64(self.partition_for)).await;
        sh("ip", &["-n", &ns(k), "link", "set", "lan0", "up"])?;
        let healed = Instant::now();
        let admin = SocketAddr::from((lan_addr(k), ADMIN_PORT));
        let seen = until_metric(admin, healed, |t| {
            metric(t, "weir_peers_alive").is_some_and(|v| v as usize + 1 >= n)
        })
        .await;
        let matched = until_metric(admin, healed, |t| {
            metric(t, "weir_peer_reservations_active").is_some_and(|v| v > 0.0)
        })
        .await;
        report.insert(
            "partition".into(),
            json!({"node": k, "at_s": at, "for_s": self.partition_for,
                   "peers_seen_after_heal_ms": seen,
                   "rematched_after_heal_ms": matched}),
        );
        Ok(())
    }
}

/// Each node's uplink as it sees it, sampled every [`UPLINK_SAMPLE`] from
/// `start_us` until `seconds` into the load: a series per node.
async fn sample_uplinks(
    admins: Vec<SocketAddr>,
    pids: Vec<Option<u32>>,
    start_us: u64,
    seconds: f64,
) -> Vec<Vec<Value>> {
    let mut series = vec![Vec::new(); admins.len()];
    let mut tick = tokio::time::interval(UPLINK_SAMPLE);
    let start = UNIX_EPOCH + Duration::from_micros(start_us);
    let mut last: Option<(Instant, Vec<u64>)> = None;
    loop {
        tick.tick().await;
        // What each uplink carried since the last sample (wire bytes).
        let counted = uplink_bytes(admins.len()).ok().map(|b| (Instant::now(), b));
        let carried: Vec<f64> = match (&last, &counted) {
            (Some((t0, b0)), Some((t1, b1))) => b1
                .iter()
                .zip(b0)
                .map(|(b1, b0)| (b1 - b0) as f64 / (*t1 - *t0).as_secs_f64())
                .collect(),
            _ => vec![f64::NAN; admins.len()],
        };
        last = counted;
        let t = SystemTime::now()
            .duration_since(start)
            .map(|d| d.as_secs_f64())
            .unwrap_or_else(|e| -e.duration().as_secs_f64());
        if t >= 0.0 {
            let links = link_counters(pids.clone()).await;
            for (k, ((addr, s), carried)) in admins
                .iter()
                .zip(series.iter_mut())
                .zip(&carried)
                .enumerate()
            {
                let Ok(text) = scrape(*addr).await else {
                    continue;
                };
                let (tbf, retrans) = links.get(k).copied().unwrap_or((None, None));
                s.push(uplink_sample(t, &text, *carried, tbf, retrans));
            }
        }
        if t >= seconds {
            return series;
        }
    }
}

/// Per node, its uplink's shaped queue and its weir's TCP retransmissions:
/// whether the link or the sender set the pace (`None` where unreadable).
async fn link_counters(pids: Vec<Option<u32>>) -> Vec<(Option<netns::TbfCounters>, Option<u64>)> {
    // `tc` is a process per node: run off the runtime's threads.
    tokio::task::spawn_blocking(move || {
        pids.iter()
            .enumerate()
            .map(|(k, pid)| {
                (
                    netns::tbf_counters(Some(&ns(k + 1)), "wan0").ok(),
                    pid.and_then(tcp_retransmits),
                )
            })
            .collect()
    })
    .await
    .unwrap_or_default()
}

/// One sample of a node's uplink at `t` seconds into the load, from its
/// `/metrics` text, what its uplink carried (wire bytes per second) and
/// its link counters.
fn uplink_sample(
    t: f64,
    text: &str,
    carried: f64,
    tbf: Option<netns::TbfCounters>,
    retrans: Option<u64>,
) -> Value {
    let m = |name: &str| metric(text, name).unwrap_or(f64::NAN);
    let rates: Vec<f64> = CLASSES
        .iter()
        .map(|(c, _)| {
            m(&format!(
                "weir_class_allocated_bytes_per_second{{class=\"{c}\"}}"
            ))
        })
        .collect();
    json!({
        "t": round(t, 2),
        "estimate_bps": round(nan0(m("weir_link_bandwidth_bytes_per_second")), 0),
        "t_sc_ms": round(nan0(m("weir_link_transaction_seconds") * 1e3), 2),
        "queue_ms": round(nan0(m("weir_link_queue_seconds") * 1e3), 2),
        "c_out_bps": round(nan0(rates.iter().sum()), 0),
        "carried_wire_bps": round(nan0(carried), 0),
        "batches": metric_sum(text, "weir_batches_confirmed_total"),
        "batch_bytes": metric_sum(text, "weir_egress_bytes_total"),
        "rates_bps": rates.iter().map(|r| round(nan0(*r), 0)).collect::<Vec<_>>(),
        "queued_records": metric_sum(text, "weir_class_queued_records"),
        "advert_bytes": metric_sum(text, "weir_peer_advert_bytes_sent_total"),
        "confirm_s_sum": m("weir_egress_stage_seconds_sum{stage=\"confirm\"}"),
        "confirm_count": m("weir_egress_stage_seconds_count{stage=\"confirm\"}"),
        "tbf_backlog_bytes": tbf.map(|t| t.backlog),
        "tbf_drops": tbf.map(|t| t.drops),
        "tcp_retransmits": retrans,
    })
}

/// Per node (origin) and class: the latencies' sum, the records and those
/// past the class's bound.
fn per_node_latency(st: &Consumed, n: usize) -> Vec<[(f64, u64, u64); 3]> {
    let mut per_node: Vec<[(f64, u64, u64); 3]> = vec![[(0.0, 0, 0); 3]; n];
    for (&(origin, _), d) in &st.seen {
        if let Some(slot) = per_node.get_mut((origin as usize).wrapping_sub(1)) {
            let (sum, count, late) = &mut slot[d.class];
            *sum += d.latency_ms;
            *count += 1;
            *late += u64::from(d.latency_ms > CLASSES[d.class].1 as f64);
        }
    }
    per_node
}

/// Every late `ls` record, in order of arrival (the first
/// [`LATE_LS_LISTED`]): when, from where, and how its time split (a burst
/// of them at one moment is a stall, spread ones a standing queue).
fn late_ls(st: &Consumed, start_us: u64) -> Vec<Value> {
    let mut late_ls: Vec<(u64, u64, f64, Option<f64>)> = st
        .seen
        .iter()
        .filter(|(_, d)| d.class == 0 && d.latency_ms > CLASSES[0].1 as f64)
        .map(|(&(origin, _), d)| (d.at_us, origin, d.latency_ms, d.in_weir_ms))
        .collect();
    late_ls.sort_by_key(|l| l.0);
    late_ls
        .iter()
        .take(LATE_LS_LISTED)
        .map(|&(at, origin, ms, in_weir)| {
            json!({
                "t": round(at.saturating_sub(start_us) as f64 / 1e6, 3),
                "origin": origin,
                "latency_ms": round(ms, 1),
                "in_weir_ms": in_weir.map(|w| round(w, 1)),
            })
        })
        .collect()
}

/// The row's `input`: per node, what it was offered and accepted, its
/// records' latency per class and its uplink samples.
fn input_rows(
    a: &Args,
    offered: &[Offered],
    per_node: &[[(f64, u64, u64); 3]],
    uplinks: Vec<Vec<Value>>,
) -> Vec<Value> {
    offered
        .iter()
        .enumerate()
        .zip(uplinks)
        .map(|((i, o), uplink)| {
            let secs = o.seconds.max(1e-9);
            let classes: serde_json::Map<String, Value> = CLASSES
                .iter()
                .zip(per_node[i])
                .map(|((name, _), (sum, count, late))| {
                    let count_f = count.max(1) as f64;
                    (
                        name.to_string(),
                        json!({
                            "delivered": count,
                            "latency_ms_mean": round(sum / count_f, 1),
                            "violation_pct": round(100.0 * late as f64 / count_f, 2),
                        }),
                    )
                })
                .collect();
            json!({
                "node": i + 1,
                "busy": i < a.grid.busy,
                "offered": o.offered,
                "sent": o.sent,
                "acked": o.acked,
                "accepted_rps": round(o.acked.iter().sum::<u64>() as f64 / secs, 1),
                "offered_rps": round(o.offered.iter().sum::<u64>() as f64 / secs, 1),
                "load_secs": round(o.seconds, 3),
                "errors": o.errors,
                "classes": classes,
                "uplink": uplink,
            })
        })
        .collect()
}

/// Heartbeat (or gossip) bytes a node sent per second over the load, the
/// mean over nodes: from the first and last samples of
/// `weir_peer_advert_bytes_sent_total` in each node's `uplink` series.
fn advert_rate(input: &[Value]) -> f64 {
    let rates: Vec<f64> = input
        .iter()
        .filter_map(|node| {
            let s = node["uplink"].as_array()?;
            let (first, last) = (s.first()?, s.last()?);
            let dt = last["t"].as_f64()? - first["t"].as_f64()?;
            let db = last["advert_bytes"].as_f64()? - first["advert_bytes"].as_f64()?;
            (dt > 0.0).then_some(db / dt)
        })
        .collect();
    rates.iter().sum::<f64>() / rates.len() as f64
}

/// Runs the grid; returns the table, the rows and the SVG, and writes
/// `cluster-uplink.svg` (each node's estimate against the shaped rate)
/// into `out`.
pub async fn run(a: &Args, out: &Path) -> anyhow::Result<(String, Value, String)> {
    for n in &a.grid.networks {
        janus::preset(n)?;
    }
    ensure!(
        a.grid.busy <= a.grid.nodes,
        "--busy {} > --nodes {}",
        a.grid.busy,
        a.grid.nodes
    );
    ensure!(
        a.grid.seconds.is_finite() && a.grid.seconds > 0.0,
        "--seconds must be positive"
    );
    for &b in &a.record_bytes {
        ensure!(
            b >= 16,
            "--record-bytes {b}: at least 16 (weir-load's stamp)"
        );
    }
    let bins = bins(a)?;
    let cells = janus::grid(
        &a.schemes,
        &a.grid.networks,
        &a.grid.lt_rates,
        &a.record_bytes,
    )?;
    let bed = Testbed::build(a.grid.nodes, &a.tcp_congestion)?;
    let bar = report::progress(cells.len() as u64, "cluster");
    let mut runs = Vec::new();
    for (k, cell) in cells.iter().enumerate() {
        bar.set_message(format!(
            "{} {} lt {}/s {} B",
            cell.scheme, cell.network, cell.lt_rate, cell.record_bytes
        ));
        runs.push(run_cell(a, &bins, &bed, cell, k).await?);
        bar.inc(1);
    }
    bar.finish_and_clear();
    drop(bed);
    let uplink_svg = uplink_svg(&runs)?;
    std::fs::create_dir_all(out)?;
    let path = out.join("cluster-uplink.svg");
    std::fs::write(&path, uplink_svg)
        .with_context(|| format!("cannot write {}", path.display()))?;
    let table = janus::table(&runs);
    let svg = janus::svg(&runs)?;
    Ok((table, Value::Array(runs), svg))
}

/// Each node's uplink estimate, `C_out` and what its uplink carried over
/// the load of one run, against the shaped rate: PMRFS at 640 B (the
/// in-process lab's size) if it ran, else the first PMRFS run, else the
/// first run.
fn uplink_svg(runs: &[Value]) -> anyhow::Result<String> {
    let pmrfs = |r: &&Value| r["scheme"] == "pmrfs";
    let Some(first) = runs
        .iter()
        .filter(pmrfs)
        .find(|r| r["record_bytes"] == 640)
        .or_else(|| runs.iter().find(pmrfs))
        .or_else(|| runs.first())
    else {
        return Ok(String::new());
    };
    let mut series = Vec::new();
    for node in first["input"].as_array().into_iter().flatten() {
        let pts = |key: &str| -> Vec<(f64, f64)> {
            node["uplink"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| {
                    (
                        s["t"].as_f64().unwrap_or(0.0),
                        s[key].as_f64().unwrap_or(0.0) / 1e6,
                    )
                })
                .collect()
        };
        let label = format!("node {}", node["node"]);
        series.push(report::Series {
            name: format!("estimate, {label}"),
            points: pts("estimate_bps"),
        });
        series.push(report::Series {
            name: format!("C_out, {label}"),
            points: pts("c_out_bps"),
        });
        series.push(report::Series {
            name: format!("carried (wire), {label}"),
            points: pts("carried_wire_bps"),
        });
    }
    report::line_chart_svg(&report::LineChart {
        title: format!(
            "Uplink estimate, C_out and carried per node ({}, {}, {} B, track_uplink = {})",
            first["scheme"].as_str().unwrap_or(""),
            first["network"].as_str().unwrap_or(""),
            first["record_bytes"],
            first["track_uplink"]
        ),
        x_label: "seconds into the load".into(),
        y_label: "MB/s".into(),
        series,
        hlines: vec![report::HLine {
            name: "shaped rate (tbf)".into(),
            y: first["uplink_bps"].as_f64().unwrap_or(0.0) / 1e6,
            paper: true,
        }],
        marks: Vec::new(),
    })
}

#[cfg(test)]
mod tests;
