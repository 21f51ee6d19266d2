//! weir on a small box: alone in a memory cgroup, the default
//! configuration (every class in memory, 64 MiB class queues that do not
//! fit), the broker unreachable while QoS 1 records arrive until weir's
//! back-pressure holds them, then the drain. weir reads the cgroup's limit
//! and sizes its queues to fit: no OOM kill, nothing acknowledged lost.
//! (The debug binary tested here is larger than a release build: the
//! limit is 96 MiB where docs/durability.md's figures use 64 MiB with the
//! release build, `scripts/small-box.sh`.)

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use common::amqp::{consume_until, delete_queue};
use common::mqtt::{publish_qos1, Pace};
use common::process::{free_port, metric, scrape, write_config, WEIR};
use common::proxy::{Mode, Proxy};
use common::{eventually_async, tmp, unique, PATIENCE};

const LIMIT: u64 = 96 << 20;
/// Records published: more than the queues hold under the limit (about
/// 16,000 of 1 KiB) and more than the configured queues hold (3 x 8 MiB).
const TOTAL: u64 = 70_000;

/// A memory cgroup (v1 or v2) limited to `bytes`, removed on drop.
struct Cgroup {
    dir: PathBuf,
    v1: bool,
}

impl Cgroup {
    fn new(name: &str, bytes: u64) -> Cgroup {
        let v1 = std::path::Path::new("/sys/fs/cgroup/memory").is_dir();
        let dir = if v1 {
            PathBuf::from("/sys/fs/cgroup/memory").join(name)
        } else {
            let _ = std::fs::write("/sys/fs/cgroup/cgroup.subtree_control", "+memory");
            PathBuf::from("/sys/fs/cgroup").join(name)
        };
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| {
            panic!(
                "this test needs root to make a memory cgroup at {}: {e}",
                dir.display()
            )
        });
        let file = if v1 {
            "memory.limit_in_bytes"
        } else {
            "memory.max"
        };
        std::fs::write(dir.join(file), bytes.to_string()).unwrap();
        Cgroup { dir, v1 }
    }

    fn oom_kills(&self) -> u64 {
        let (file, key) = if self.v1 {
            ("memory.oom_control", "oom_kill ")
        } else {
            ("memory.events", "oom_kill ")
        };
        std::fs::read_to_string(self.dir.join(file))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
            .unwrap_or(0)
    }

    fn peak(&self) -> u64 {
        let file = if self.v1 {
            "memory.max_usage_in_bytes"
        } else {
            "memory.peak"
        };
        std::fs::read_to_string(self.dir.join(file))
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_box_applies_back_pressure_instead_of_being_oom_killed() {
    let dir = tmp("memory-budget");
    let name = unique("memory-budget");
    let queue = format!("{name}.q");
    delete_queue(&queue).await;
    let proxy = Proxy::start().await;
    proxy.set(Mode::Down);
    let (mqtt, admin) = (free_port(), free_port());
    // The embedded defaults: three memory classes of 8 MiB queues each (and
    // the admin listener, whose metrics show when the queues are full).
    let cfg = write_config(
        &dir,
        "weir.toml",
        &format!(
            "[spool]\ndir = \"{}\"\n[ingress.mqtt]\nlisten = \"127.0.0.1:{mqtt}\"\n[ingress.grpc]\nenabled = false\n\
             [admin]\nlisten = \"127.0.0.1:{admin}\"\n\
             [egress]\nkind = \"amqp\"\n[egress.amqp]\nurl = \"{}\"\nexchange = \"{name}.x\"\nqueue = \"{queue}\"\nrouting_key = \"{name}\"\n",
            dir.join("state").display(),
            proxy.url()
        ),
    );
    let cgroup = Cgroup::new(&name, LIMIT);
    let procs = cgroup.dir.join("cgroup.procs");
    let log = dir.join("weir.log");
    // weir alone in the cgroup: the shell moves itself in, then becomes weir.
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {} && exec {WEIR} run --config {}",
            procs.display(),
            cfg.display()
        ))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    common::process::wait_port(SocketAddr::from(([127, 0, 0, 1], mqtt))).await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains(&format!(
            "memory limit {:.1} MiB",
            LIMIT as f64 / (1 << 20) as f64
        )),
        "weir read its cgroup's limit: {text}"
    );
    assert!(
        text.contains("ingress.mqtt.max_connections = 4096"),
        "the default connection limit does not fit in 96 MiB, and weir says so: {text}"
    );

    // 1 KiB records until weir holds them back (its queues are full).
    let acks = Arc::new(AtomicU64::new(0));
    let publisher = {
        let acks = acks.clone();
        tokio::spawn(async move {
            let pace = Pace {
                rate: Some(4_000.0),
                silence: PATIENCE,
                acks: Some(acks),
                ..Pace::unpaced(1_000, tokio::time::Instant::now() + PATIENCE * 2)
            };
            publish_qos1(mqtt, "small-box", pace, |i| {
                let mut p = format!("small-{i:08}-").into_bytes();
                p.resize(1024, b'.');
                (i < TOTAL).then(|| (b"sensors/box".to_vec(), p))
            })
            .await
        })
    };
    // The queues are full: a push waits for room, holding the publisher's
    // acknowledgements back.
    let admin = SocketAddr::from(([127, 0, 0, 1], admin));
    eventually_async("weir's queues to fill and hold records back", || {
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "weir exited with {status} during the outage: {}",
                std::fs::read_to_string(&log).unwrap()
            );
        }
        async move {
            let text = scrape(admin).await.unwrap_or_default();
            metric(&text, "weir_records_backpressured_total") > 0.0
        }
    })
    .await;
    let stalled = acks.load(Ordering::Relaxed);
    assert!(
        stalled < TOTAL / 2,
        "back-pressure held the records at the budgeted queue ({stalled} acknowledged)"
    );
    assert!(
        child.try_wait().unwrap().is_none(),
        "weir died during the outage: {}",
        std::fs::read_to_string(&log).unwrap()
    );
    // The broker is back: the drain.
    proxy.set(Mode::Pass);
    let acked = tokio::time::timeout(PATIENCE * 2, publisher)
        .await
        .expect("publishing ends")
        .unwrap();
    let alive = child.try_wait().unwrap().is_none();
    let (ooms, peak) = (cgroup.oom_kills(), cgroup.peak());
    eprintln!(
        "limit {} MiB: {stalled} acknowledged when the queues filled, {} in all; peak {:.1} MiB, {ooms} OOM kills, alive {alive}",
        LIMIT >> 20,
        acked.len(),
        peak as f64 / (1 << 20) as f64
    );
    assert_eq!(ooms, 0, "weir was OOM-killed");
    assert!(
        alive,
        "weir died: {}",
        std::fs::read_to_string(&log).unwrap()
    );
    assert_eq!(
        acked.len() as u64,
        TOTAL,
        "every record acknowledged in the end"
    );
    let want: BTreeSet<Vec<u8>> = acked.into_iter().collect();
    let seen = consume_until(&queue, |seen| seen.len() >= want.len()).await;
    let got: BTreeSet<Vec<u8>> = seen.iter().map(|s| s.record.payload.to_vec()).collect();
    let lost = want.difference(&got).count();
    common::process::sigterm(child.id());
    let _ = child.wait();
    assert_eq!(lost, 0, "acknowledged records lost");
    delete_queue(&queue).await;
    let _ = std::fs::remove_dir_all(dir);
}
