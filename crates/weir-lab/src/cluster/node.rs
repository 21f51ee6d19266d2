//! One `weir run` process in its namespace: start, stop, its
//! `/metrics`, its log and its TCP retransmits.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use super::args::Bins;
use super::config::ADMIN_PORT;
use super::testbed::{lan_addr, ns};
use crate::report::round;

/// Lines of each node's log listed in a row (`log_events`), the first ones.
const LOG_EVENTS_LISTED: usize = 20;

/// The lines of a node's log that say something went wrong or records
/// were taken back from a peer (warnings, errors, "taking back"), each
/// with whether it came after the first `shutdown_at` bytes (the node's
/// shutdown, where peers going away is a matter of course): how a run's
/// duplicates or stalls can be traced without `--keep`. At most
/// [`LOG_EVENTS_LISTED`], each cut at 300 characters.
pub(super) fn log_events(path: &std::path::Path, shutdown_at: u64) -> Vec<(String, bool)> {
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
pub(super) fn tcp_retransmits(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/snmp")).ok()?;
    snmp_value(&text, "Tcp:", "RetransSegs")
}

/// One counter of a `/proc/net/snmp` table: a header line of names and a
/// line of values, both starting with `table`.
pub(super) fn snmp_value(text: &str, table: &str, name: &str) -> Option<u64> {
    let mut lines = text.lines().filter(|l| l.starts_with(table));
    let names = lines.next()?.split_whitespace();
    let values = lines.next()?.split_whitespace();
    names
        .zip(values)
        .find(|(n, _)| *n == name)
        .and_then(|(_, v)| v.parse().ok())
}

/// One weir node of a cell.
pub(super) struct Node {
    pub(super) k: usize,
    pub(super) child: Child,
}

impl Node {
    pub(super) async fn start(
        bins: &Bins,
        k: usize,
        config: &Path,
        dir: &Path,
    ) -> anyhow::Result<Node> {
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

    pub(super) fn admin(&self) -> SocketAddr {
        SocketAddr::from((lan_addr(self.k), ADMIN_PORT))
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub(super) async fn stop(mut self, grace: Duration) {
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
pub(super) fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (s, v) = l.rsplit_once(' ')?;
        (s == series).then(|| v.parse().ok()).flatten()
    })
}

/// The sum of every series of a metric (all label sets).
pub(super) fn metric_sum(text: &str, name: &str) -> f64 {
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
pub(super) async fn until_metric(
    admin: SocketAddr,
    since: Instant,
    ok: impl Fn(&str) -> bool,
) -> Option<f64> {
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
pub(super) async fn scrape(addr: SocketAddr) -> anyhow::Result<String> {
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
