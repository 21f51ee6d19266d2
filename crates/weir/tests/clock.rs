//! weir against the wall clock, from outside: started twice at the same
//! restored time (a box without a real-time clock boots at the last saved
//! time), and stepped an hour forward and two back while records flow. The
//! clock is faked for the weir process only, with libfaketime
//! (`faketime`; scripts/services.sh installs it), the monotonic clock left
//! alone as the kernel leaves it on a real step.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::mqtt::{publish_qos1, Pace};
use common::process::{file_batch_records, file_egress, free_port, sigterm, wait_port, WEIR};
use common::{tmp, PATIENCE};

/// libfaketime's library (Debian package `faketime`), preloaded into weir
/// itself: the `faketime` wrapper forks, and a signal to it would not
/// reach weir.
fn libfaketime() -> std::path::PathBuf {
    let found = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("faketime/libfaketime.so.1"))
        .find(|p| p.exists());
    found.unwrap_or_else(|| {
        panic!("libfaketime not found under /usr/lib/*/faketime: install it (Debian package faketime; scripts/services.sh does)")
    })
}

/// `weir run` with its wall clock faked: `clock` are libfaketime's
/// variables (`FAKETIME`, or `FAKETIME_TIMESTAMP_FILE` for an offset that
/// changes while it runs).
fn spawn_faked(config: &Path, log: &Path, clock: &[(&str, &str)]) -> Child {
    let mut cmd = Command::new(WEIR);
    cmd.args(["run", "--config", config.to_str().unwrap()])
        .env("LD_PRELOAD", libfaketime())
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    for (k, v) in clock {
        cmd.env(k, v);
    }
    cmd.spawn()
        .unwrap_or_else(|e| panic!("cannot start {WEIR}: {e}"))
}

fn config(dir: &Path, mqtt: u16) -> std::path::PathBuf {
    // The embedded defaults (every class in memory), with the spool's
    // directory (which holds the sequence-number lease) in the test's.
    let text = format!(
        "[spool]\ndir = \"{}\"\n[ingress.mqtt]\nlisten = \"127.0.0.1:{mqtt}\"\n[ingress.grpc]\nenabled = false\n{}\n",
        dir.join("state").display(),
        file_egress(&dir.join("out"))
    );
    common::process::write_config(dir, "weir.toml", &text)
}

async fn publish(
    mqtt: u16,
    client: &str,
    n: u64,
    rate: Option<f64>,
    acks: Option<Arc<AtomicU64>>,
) -> Vec<Vec<u8>> {
    let pace = Pace {
        rate,
        acks,
        silence: Duration::from_secs(10),
        ..Pace::unpaced(64, tokio::time::Instant::now() + PATIENCE)
    };
    let prefix = client.to_owned();
    publish_qos1(mqtt, client, pace, move |i| {
        (i < n).then(|| {
            (
                b"sensors/clock".to_vec(),
                format!("{prefix}-{i}").into_bytes(),
            )
        })
    })
    .await
}

/// Records delivered: payload -> (origin, seq) of each copy.
fn delivered(out: &Path) -> HashMap<Vec<u8>, Vec<(u64, u64)>> {
    let mut by_payload: HashMap<Vec<u8>, Vec<(u64, u64)>> = HashMap::new();
    for r in file_batch_records(out) {
        by_payload
            .entry(r.payload.to_vec())
            .or_default()
            .push((r.origin, r.seq));
    }
    by_payload
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_starts_at_the_same_restored_clock_reuse_no_record_id() {
    let dir = tmp("clock-restored");
    let mqtt = free_port();
    let cfg = config(&dir, mqtt);
    let mut acked = Vec::new();
    for boot in 0..2 {
        let mut weir = spawn_faked(
            &cfg,
            &dir.join(format!("weir-{boot}.log")),
            &[("FAKETIME", "@2026-01-01 00:00:00")],
        );
        wait_port(SocketAddr::from(([127, 0, 0, 1], mqtt))).await;
        let mine = publish(mqtt, &format!("boot{boot}"), 5_000, None, None).await;
        assert_eq!(mine.len(), 5_000);
        acked.extend(mine);
        sigterm(weir.id());
        let _ = weir.wait();
    }
    let by_payload = delivered(&dir.join("out"));
    let want: BTreeSet<Vec<u8>> = acked.into_iter().collect();
    let lost = want.iter().filter(|p| !by_payload.contains_key(*p)).count();
    let mut owner: HashMap<(u64, u64), &[u8]> = HashMap::new();
    let mut reused = 0;
    for (payload, ids) in &by_payload {
        for id in ids {
            if *owner.entry(*id).or_insert(payload) != payload.as_slice() {
                reused += 1;
            }
        }
    }
    eprintln!(
        "two boots at 2026-01-01T00:00:00: {} records, {lost} lost, {reused} (origin, seq) reused",
        want.len()
    );
    assert_eq!(lost, 0);
    assert_eq!(reused, 0, "(origin, seq) repeated across the restarts");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_steps_lose_and_repeat_nothing() {
    let dir = tmp("clock-steps");
    let mqtt = free_port();
    let cfg = config(&dir, mqtt);
    let offset = dir.join("faketime");
    std::fs::write(&offset, "+0\n").unwrap();
    let mut weir = spawn_faked(
        &cfg,
        &dir.join("weir.log"),
        &[
            ("FAKETIME_TIMESTAMP_FILE", offset.to_str().unwrap()),
            ("FAKETIME_CACHE_DURATION", "1"),
        ],
    );
    wait_port(SocketAddr::from(([127, 0, 0, 1], mqtt))).await;
    let acks = Arc::new(AtomicU64::new(0));
    const N: u64 = 7_000;
    let publishing = publish(mqtt, "steps", N, Some(1_000.0), Some(acks.clone()));
    // +1 h after 2 s, then 2 h back after 4 s; the longest time without a
    // new acknowledgement is printed (a figure, not a test).
    let stepping = async {
        let mut longest = Duration::ZERO;
        let (mut last_n, mut last_at) = (0, tokio::time::Instant::now());
        let start = last_at;
        let mut stepped = 0;
        while acks.load(Ordering::Relaxed) < N && start.elapsed() < PATIENCE {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let n = acks.load(Ordering::Relaxed);
            if n != last_n {
                longest = longest.max(last_at.elapsed());
                (last_n, last_at) = (n, tokio::time::Instant::now());
            }
            if stepped == 0 && start.elapsed() > Duration::from_secs(2) {
                std::fs::write(&offset, "+1h\n").unwrap();
                stepped = 1;
            } else if stepped == 1 && start.elapsed() > Duration::from_secs(4) {
                std::fs::write(&offset, "-1h\n").unwrap();
                stepped = 2;
            }
        }
        longest
    };
    let (acked, longest) = tokio::join!(publishing, stepping);
    sigterm(weir.id());
    let _ = weir.wait();
    let log = std::fs::read_to_string(dir.join("weir.log")).unwrap();
    let by_payload = delivered(&dir.join("out"));
    let lost = acked
        .iter()
        .filter(|p| !by_payload.contains_key(*p))
        .count();
    let repeated = by_payload.values().filter(|ids| ids.len() > 1).count();
    eprintln!(
        "clock +1 h then -2 h at 1,000 records/s: {} acknowledged, {lost} lost, {repeated} delivered twice, longest PUBACK gap {longest:?}",
        acked.len()
    );
    assert!(
        log.lines()
            .any(|l| l.starts_with("2026-") || l.starts_with("20")),
        "weir logged: {log}"
    );
    assert_eq!(acked.len() as u64, N, "every record acknowledged");
    assert_eq!(lost, 0);
    assert_eq!(repeated, 0);
    let _ = std::fs::remove_dir_all(dir);
}
