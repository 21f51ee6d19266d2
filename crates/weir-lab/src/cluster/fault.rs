//! The fault a cell injects on one node: a SIGKILL and a restart, a cut
//! off the LAN and a heal, or both.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};
use tokio::time::Instant;

use super::args::Bins;
use super::config::ADMIN_PORT;
use super::node::{metric, until_metric, Node};
use super::testbed::{lan_addr, ns};
use crate::netns::sh;

/// The fault a cell injects on one node, timed from the load's start: a
/// SIGKILL and a restart, a cut off the LAN and a heal, or both.
pub(super) struct Fault {
    /// The node.
    pub(super) k: usize,
    /// Nodes in the cell.
    pub(super) n: usize,
    /// When the load starts.
    pub(super) start: SystemTime,
    pub(super) victim_pid: Option<u32>,
    /// The weir binary, the node's config and its directory (to restart it).
    pub(super) weir: PathBuf,
    pub(super) config: PathBuf,
    pub(super) dir: PathBuf,
    pub(super) kill_at: Option<f64>,
    pub(super) restart_after: f64,
    pub(super) partition_at: Option<f64>,
    pub(super) partition_for: f64,
}

impl Fault {
    /// Runs the faults asked for: their report, and the restarted node if
    /// one was killed.
    pub(super) async fn run(self) -> anyhow::Result<(Value, Option<Node>)> {
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
