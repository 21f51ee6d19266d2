//! Test support shared by every integration test (each test binary
//! declares `mod common;` and uses the part it needs):
//!
//! - this file: the one bound on every wait ([`PATIENCE`]), polling until
//!   a condition holds ([`eventually`]), names and directories unique to
//!   the process and test, logs, counting;
//! - `amqp`: the test RabbitMQ, weir's `[egress.amqp]` section pointing at
//!   it, and a consumer that decodes weir batches;
//! - `kafka`: the test Kafka broker, weir's `[egress.kafka]` section, a
//!   reader that decodes weir batches from a topic, killing the broker;
//! - `mqtt`: the test Mosquitto, `mosquitto_pub`, a rumqttc client that
//!   reports PUBACKs, raw MQTT packets;
//! - `ingress`: the JANUS class ids, queue capacities, and an [`Intake`]
//!   (`weir::intake::Intake`) over the default classes for the tests that
//!   drive one ingress without an `App`;
//! - `process`: the `weir` binary, config snippets, starting weir and
//!   signalling it, the admin endpoint's metrics;
//! - `peering`: the three-node peering scenario;
//! - `pki`: CAs and certificates made with `openssl`;
//! - `proxy`: a TCP proxy in front of RabbitMQ that a test can cut,
//!   stall, or use to hold replies and inject frames.
//!
//! Timing: nothing here judges how fast the machine is. Waits are for
//! observable events, bounded by [`PATIENCE`] only so that a broken build
//! fails instead of hanging; CI runs on a busy 2-core machine.
#![allow(dead_code)]

pub mod amqp;
pub mod ingress;
pub mod kafka;
pub mod mqtt;
pub mod peering;
pub mod pki;
pub mod process;
pub mod proxy;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;

/// Bounds every wait so that a broken test fails instead of hanging. Only
/// its expiry fails a test, so it is generous: it must never be what a
/// loaded machine runs into.
pub const PATIENCE: Duration = Duration::from_secs(90);

/// How often [`eventually`] looks again.
pub const POLL: Duration = Duration::from_millis(10);

/// A name unique to this process and `test`: AMQP exchanges and queues,
/// MQTT topic prefixes and client ids, directories.
pub fn unique(test: &str) -> String {
    format!("weir-test-{}-{test}", std::process::id())
}

/// A fresh, empty directory unique to this process and `name`. The first
/// call of a process removes what earlier test processes, no longer
/// running, left in the temporary directory (kept until then, so a failed
/// run's files can be read).
pub fn tmp(name: &str) -> PathBuf {
    static SWEEP: std::sync::Once = std::sync::Once::new();
    SWEEP.call_once(sweep_stale);
    let dir = std::env::temp_dir().join(unique(name));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Removes `weir-test-<pid>-*` entries of the temporary directory whose
/// process has gone.
fn sweep_stale() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("weir-test-"))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = match e.file_type().is_ok_and(|t| t.is_dir()) {
                true => std::fs::remove_dir_all(e.path()),
                false => std::fs::remove_file(e.path()),
            };
        }
    }
}

/// Polls `done` until it holds; panics naming `what` once [`PATIENCE`]
/// has passed.
pub async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let give_up = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < give_up, "gave up waiting for {what}");
        tokio::time::sleep(POLL).await;
    }
}

/// [`eventually`] for a condition that has to wait itself (a scrape, a
/// request).
pub async fn eventually_async<F, Fut>(what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let give_up = Instant::now() + PATIENCE;
    while !done().await {
        assert!(Instant::now() < give_up, "gave up waiting for {what}");
        tokio::time::sleep(POLL).await;
    }
}

/// Shows weir's logs in a failing test's output: `RUST_LOG` if set, else
/// `info,lapin=warn`.
pub fn logs() {
    logs_with("info,lapin=warn");
}

/// Like [`logs`], with `filter` when `RUST_LOG` is not set.
pub fn logs_with(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// How many times each key occurs.
pub fn tally<K: Ord>(keys: impl IntoIterator<Item = K>) -> BTreeMap<K, usize> {
    let mut counts = BTreeMap::new();
    for key in keys {
        *counts.entry(key).or_insert(0) += 1;
    }
    counts
}
