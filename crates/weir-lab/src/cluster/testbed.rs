//! The testbed: the nodes' namespaces, their shaped uplinks and the LAN
//! bridge, and the byte counters of their links.

use std::net::Ipv4Addr;
use std::time::Duration;

use anyhow::{ensure, Context};

use crate::netns::{in_ns, sh};

/// Namespaces are `weir-lab-n<k>`; links in the root namespace `wlw<k>`
/// (uplink) and `wll<k>` (LAN), the bridge `wlbr0`.
const NS_PREFIX: &str = "weir-lab-n";
const BRIDGE: &str = "wlbr0";
/// The root namespace's address on the LAN bridge (the lab reads each
/// node's `/metrics` from it).
const BRIDGE_ADDR: Ipv4Addr = Ipv4Addr::new(10, 252, 0, 254);

/// Most bytes `tbf` queues, as time at the shaped rate (what a cellular
/// modem's buffer holds; beyond it packets drop and TCP retransmits).
const TBF_LATENCY_MS: u64 = 200;

/// The root namespace's ends of node k's uplink and LAN veths:
/// `wlw<k>`, `wll<k>`.
const ROOT_UPLINK: &str = "wlw";
const ROOT_LAN: &str = "wll";

pub(super) fn ns(k: usize) -> String {
    format!("{NS_PREFIX}{k}")
}

/// The node's end of its uplink, and the cloud's.
pub(super) fn wan_addrs(k: usize) -> (Ipv4Addr, Ipv4Addr) {
    let k = u8::try_from(k).expect("at most 250 nodes");
    (Ipv4Addr::new(10, 251, k, 2), Ipv4Addr::new(10, 251, k, 1))
}

pub(super) fn lan_addr(k: usize) -> Ipv4Addr {
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
pub(super) struct Testbed {
    pub(super) nodes: usize,
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
    pub(super) fn build(nodes: usize, tcp_congestion: &str) -> anyhow::Result<Testbed> {
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
    pub(super) fn shape(&self, bytes_per_sec: f64) -> anyhow::Result<()> {
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
pub(super) fn uplink_bytes(nodes: usize) -> anyhow::Result<Vec<u64>> {
    rx_bytes(ROOT_UPLINK, nodes)
}

/// Bytes each node has sent on its LAN so far (heartbeats or gossip,
/// reservations, forwarded records and their acknowledgements), counted
/// where the root namespace receives them, in every header.
pub(super) fn lan_bytes(nodes: usize) -> anyhow::Result<Vec<u64>> {
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
