//! The three-node peering scenario shared by `e2e_peering.rs` (three `App`s
//! in one process) and `e2e_peering_processes.rs` (three `weir`
//! processes): node 1 sits behind an emulated 1 Mbit/s uplink and gets
//! about 2.3 times that in `lt` traffic plus a trickle of `ls`; nodes 2 and
//! 3 have fast uplinks and little traffic of their own. All three publish
//! to one RabbitMQ queue.
//!
//! The `ls` bound (500 ms) is about four times the worst case expected:
//! one 8 KiB `lt` batch on the slow link (~85 ms) plus the `ls`
//! transaction, with room for a loaded 2-core machine. It is the class's
//! own configured promise, and the only timing the tests judge.
//!
//! A peer is declared gone after `dead_after` without a heartbeat (sent
//! every 100 ms). At 2 s, a node starved of CPU for a moment on a loaded
//! machine is not taken for dead (which would make its senders take back
//! and resend what it holds: duplicates the redirection tests forbid),
//! while a partitioned one is still found out well within the load.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::amqp::{amqp_egress, Seen};

/// Records of `lt` per second offered to node 1: 1,000 x ~290 bytes is
/// about 2.3 Mbit/s against its 1 Mbit/s uplink.
pub const LT_RATE: usize = 1000;
/// Records of `ls` per second offered to node 1.
pub const LS_RATE: usize = 20;
/// Records of `lt` per second offered to each idle node.
pub const IDLE_RATE: usize = 50;
/// How long traffic is offered.
pub const LOAD: Duration = Duration::from_secs(5);
/// The `ls` bound (see the module comment).
pub const LS_BOUND_MS: u64 = 500;
/// gRPC stream names: `ls` is routed to the `ls` class, the rest to `lt`.
pub const LS_STREAM: &str = "ls";
/// See [`LS_STREAM`].
pub const LT_STREAM: &str = "bulk";

/// The payload of the `i`-th record of `stream`: ~260 bytes.
pub fn payload(stream: &str, i: usize) -> String {
    format!("{stream}-{i:07}-{}", "x".repeat(240))
}

/// Free loopback ports: each node must know the others' before any starts.
///
/// They are taken below the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`), which the kernel hands out for
/// `bind(:0)` and outgoing connections: a port chosen here and bound a
/// moment later by a weir cannot meanwhile be given to another test's
/// listener on port 0 or to a client's connection, as one picked with
/// `bind(:0)` could. Ports are distinct within the test binary (a counter
/// from a start that depends on the process id) and each is checked
/// bindable, which skips the brokers' ports while they run; the well-known
/// ports of the brokers and of weir's defaults are never chosen.
pub fn free_ports(n: usize) -> Vec<u16> {
    const WELL_KNOWN: [u16; 11] = [
        1883, 4369, 5671, 5672, 8883, 9092, 9093, 9464, 15672, 25672, 50051,
    ];
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let low = ephemeral_low().clamp(2048, 32768);
    let span = low - 1024;
    let start = std::process::id() * 127 % span;
    let mut ports = Vec::with_capacity(n);
    for _ in 0..span {
        if ports.len() == n {
            break;
        }
        let port = (1024 + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span) as u16;
        if !WELL_KNOWN.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            ports.push(port);
        }
    }
    assert_eq!(ports.len(), n, "no {n} free loopback ports below {low}");
    ports
}

/// The first port of the kernel's ephemeral range (32768 if unreadable).
fn ephemeral_low() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768)
}

/// Where one node listens besides its peer port.
pub struct Listen {
    /// `ingress.grpc.listen`.
    pub grpc: String,
    /// `admin.listen`, if any.
    pub admin: Option<String>,
}

/// The TOML of node `id` (1, 2 or 3) of the scenario: peer ports of all
/// three in `peer_ports`, publishing to `<name>.q`; node 1 is the
/// overloaded one.
pub fn node_config(name: &str, id: u64, peer_ports: &[u16], listen: &Listen) -> String {
    let peers: Vec<String> = (1..=3u64)
        .filter(|&p| p != id)
        .map(|p| {
            format!(
                "{{ id = {p}, addr = \"127.0.0.1:{}\" }}",
                peer_ports[p as usize - 1]
            )
        })
        .collect();
    let link = if id == 1 {
        "uplink = \"1Mbit/s\"\n[egress.link]\nbandwidth = \"1Mbit/s\"\ndelay = \"20ms\""
    } else {
        "uplink = \"100Mbit/s\""
    };
    let admin = listen
        .admin
        .as_ref()
        .map(|a| format!("[admin]\nlisten = \"{a}\""))
        .unwrap_or_default();
    let amqp = amqp_egress(name);
    format!(
        r#"
[node]
id = {id}
name = "peer-{id}"
[[class]]
name = "ls"
bound = "{LS_BOUND_MS}ms"
[[class]]
name = "nm"
bound = "1s"
[[class]]
name = "lt"
bound = "2s"
[classify]
default_class = "lt"
[[classify.route]]
grpc = "{LS_STREAM}"
class = "ls"
[ingress.mqtt]
enabled = false
[ingress.grpc]
listen = "{grpc}"
{admin}
{amqp}
[peering]
listen = "127.0.0.1:{port}"
peers = [{peers}]
heartbeat = "100ms"
dead_after = "2s"
lease = "1s"
[scheduler]
window = "100ms"
burst = "8KiB"
max_batch_bytes = "8KiB"
# The uplinks are facts of the experiment: an idle node's online estimate
# only sees its own small transactions and would understate its spare.
track_uplink = false
{link}
"#,
        grpc = listen.grpc,
        port = peer_ports[id as usize - 1],
        peers = peers.join(", "),
    )
}

/// Latencies (ingress to consumer, ms) of the `ls` records that entered
/// weir at `origin`.
pub fn ls_latencies_ms(seen: &[Seen], origin: u64) -> Vec<f64> {
    latencies_ms(seen, origin, "ls")
}

/// Latencies (ingress to consumer, ms) of the `class` records that entered
/// weir at `origin`.
pub fn latencies_ms(seen: &[Seen], origin: u64, class: &str) -> Vec<f64> {
    seen.iter()
        .filter(|s| s.record.origin == origin && s.record.class == class)
        .map(|s| s.consumed_us.saturating_sub(s.record.ingress_us) as f64 / 1e3)
        .collect()
}

/// Asserts that the `ls` records keep their bound: the median within half
/// of it, and no more than one in a hundred past it (a stall of the whole
/// shared machine, which every process on it sees, may catch one; a
/// scheduler that let `ls` wait behind the overload would put most of
/// them past it). Prints mean, median and worst.
pub fn assert_ls_within_bound(ls: &[f64]) {
    let mut sorted = ls.to_vec();
    sorted.sort_by(f64::total_cmp);
    let worst = sorted.last().copied().unwrap_or(0.0);
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
    let mean = ls.iter().sum::<f64>() / ls.len().max(1) as f64;
    eprintln!(
        "node 1 ls latency over {} records: mean {mean:.1} ms, median {median:.1} ms, worst {worst:.1} ms (bound {LS_BOUND_MS} ms)",
        ls.len()
    );
    let bound = LS_BOUND_MS as f64;
    assert!(median <= bound / 2.0, "ls median {median:.1} ms at node 1");
    let late = ls.iter().filter(|&&l| l > bound).count();
    assert!(
        late * 100 <= ls.len(),
        "ls violations at node 1: {late} of {}",
        ls.len()
    );
}

/// Records that reached the cloud more than once, with the nodes whose
/// batches carried each copy.
pub fn duplicates(seen: &[Seen]) -> HashMap<(u64, u64), Vec<u64>> {
    let mut senders: HashMap<(u64, u64), Vec<u64>> = HashMap::new();
    for s in seen {
        senders
            .entry((s.record.origin, s.record.seq))
            .or_default()
            .push(s.batch_node);
    }
    senders.retain(|_, nodes| nodes.len() > 1);
    senders
}

/// Node-1 records the cloud got in batches sent by another node.
pub fn lent_by_node_1(seen: &[Seen]) -> HashSet<(u64, u64)> {
    seen.iter()
        .filter(|s| s.record.origin == 1 && s.batch_node != 1)
        .map(|s| (s.record.origin, s.record.seq))
        .collect()
}
