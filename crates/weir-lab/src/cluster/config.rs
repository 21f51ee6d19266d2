//! The nodes' config text: the grid's, or the operator's tuned or
//! default one, with the addresses of the testbed.

use std::path::Path;

use anyhow::{ensure, Context};

use super::args::Args;
use super::testbed::lan_addr;
use crate::janus::{Cell, CLASSES};

const PEER_PORT: u16 = 7070;
pub(super) const ADMIN_PORT: u16 = 9464;
pub(super) const MQTT_PORT: u16 = 1883;

/// `amqp://user:pass@host:port/vhost` as (`amqp://user:pass@`, `host:port`,
/// `/vhost`).
pub(super) fn split_amqp(url: &str) -> anyhow::Result<(String, String, String)> {
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
pub(super) fn config_text(
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
