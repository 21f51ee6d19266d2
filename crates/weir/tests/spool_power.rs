//! The spool against power cuts and failing disks, on `weir-faultfs` (a
//! FUSE filesystem that forgets whatever was not synced when the power is
//! cut, and fails chosen calls): weir killed with SIGKILL and, at that
//! instant, everything it had not synced dropped, as a power cut does
//! (`kill -9` alone keeps the page cache). A spooled class's
//! acknowledgement means "on disk": nothing acknowledged may be lost,
//! every restart must succeed, and no `(origin, seq)` may be given to two
//! records.
//!
//! `WEIR_POWER_CUTS` sets how many cuts the long test makes (default 25;
//! docs/durability.md gives the figures of a run of several hundred).

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::process::Child;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::mqtt::{publish_qos1, Pace};
use common::process::{
    file_batch_records, file_egress, free_port, sigterm, spawn_weir, spool_config, wait_port,
    write_config,
};
use common::{tmp, PATIENCE};
use weir_faultfs::{Cut, Mounted};

/// An egress that never connects: what is acknowledged stays spooled.
const UNREACHABLE: &str =
    "[egress]\nkind = \"amqp\"\ndrain_timeout = \"1s\"\n[egress.amqp]\nurl = \"amqp://127.0.0.1:1/%2f\"";

/// A reproducible sequence of choices (seeded from the clock, printed).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n.max(1)
    }
}

fn mount(dir: &std::path::Path) -> Mounted {
    let at = dir.join("fs");
    std::fs::create_dir_all(&at).unwrap();
    weir_faultfs::mount(&at, 512 << 20)
        .expect("this test needs root and /dev/fuse to mount its power-cut filesystem")
}

/// A weir whose spool is on a fresh power-cut filesystem, and its configs:
/// `cfg` delivers to the file egress on the ordinary disk (the cloud, which
/// the cuts do not touch), `cfg_down` to a broker that never answers.
struct OnFaultFs {
    dir: std::path::PathBuf,
    fs: Mounted,
    out: std::path::PathBuf,
    mqtt: u16,
    admin: u16,
    cfg: std::path::PathBuf,
    cfg_down: std::path::PathBuf,
}

fn on_faultfs(name: &str) -> OnFaultFs {
    on_faultfs_with(name, false)
}

/// [`on_faultfs`], with the file egress's segments on the power-cut
/// filesystem too when `out_on_fs`.
fn on_faultfs_with(name: &str, out_on_fs: bool) -> OnFaultFs {
    let dir = tmp(name);
    let fs = mount(&dir);
    let spool = dir.join("fs").join("spool");
    let out = if out_on_fs {
        dir.join("fs").join("out")
    } else {
        dir.join("out")
    };
    let (mqtt, admin) = (free_port(), free_port());
    let cfg = write_config(
        &dir,
        "weir.toml",
        &spool_config(&spool, mqtt, admin, &file_egress(&out), ""),
    );
    let cfg_down = write_config(
        &dir,
        "down.toml",
        &spool_config(&spool, mqtt, admin, UNREACHABLE, ""),
    );
    OnFaultFs {
        dir,
        fs,
        out,
        mqtt,
        admin,
        cfg,
        cfg_down,
    }
}

/// The last start (`cfg`, the cloud reachable): waits until every record
/// of `want` is in `out`, or `PATIENCE` passes, stops weir and returns
/// every record delivered.
async fn deliver_all(
    dir: &std::path::Path,
    cfg: &std::path::Path,
    mqtt: u16,
    out: &std::path::Path,
    want: &BTreeSet<Vec<u8>>,
) -> Vec<weir_proto::pb::Record> {
    let log = std::fs::File::create(dir.join("weir-final.log")).unwrap();
    let mut child = spawn_weir(cfg, log);
    wait_port(SocketAddr::from(([127, 0, 0, 1], mqtt))).await;
    let give_up = tokio::time::Instant::now() + PATIENCE;
    let records = loop {
        // Read back at a slow pace: each look decodes every batch.
        tokio::time::sleep(Duration::from_millis(250)).await;
        let records = file_batch_records(out);
        let got: BTreeSet<&[u8]> = records.iter().map(|r| r.payload.as_ref()).collect();
        if want.iter().all(|p| got.contains(p.as_slice())) || tokio::time::Instant::now() > give_up
        {
            break records;
        }
    };
    sigterm(child.id());
    let _ = child.wait();
    records
}

fn kill9(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Publishes QoS 1 at `rate` records/s (64 in flight), a third `ls`, until
/// weir dies; returns the payloads acknowledged.
async fn publish(mqtt: u16, round: usize, rate: f64) -> Vec<Vec<u8>> {
    publish_counting(mqtt, round, rate, None).await
}

/// [`publish`], counting PUBACKs into `acks` as they arrive.
async fn publish_counting(
    mqtt: u16,
    round: usize,
    rate: f64,
    acks: Option<Arc<AtomicU64>>,
) -> Vec<Vec<u8>> {
    let pace = Pace {
        rate: Some(rate),
        silence: Duration::from_secs(10),
        acks,
        ..Pace::unpaced(64, tokio::time::Instant::now() + PATIENCE)
    };
    publish_qos1(mqtt, &format!("cut-{round}"), pace, move |i| {
        let topic: &[u8] = if i.is_multiple_of(3) {
            b"ls/cut"
        } else {
            b"lt/cut"
        };
        Some((topic.to_vec(), format!("r{round}-{i}").into_bytes()))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cuts_lose_nothing_acknowledged_and_every_restart_recovers() {
    let cuts: usize = std::env::var("WEIR_POWER_CUTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(25);
    let OnFaultFs {
        dir,
        fs,
        out,
        mqtt,
        cfg,
        cfg_down,
        ..
    } = on_faultfs("spool-power");
    // Some rounds with the cloud unreachable: every acknowledged record
    // then lives in the spool alone when the power goes.
    let seed = weir::clock::unix_micros();
    eprintln!("power cuts: {cuts}, seed {seed}");
    let mut rng = Rng(seed);
    let mut acked: Vec<Vec<u8>> = Vec::new();
    let mut torn = 0;
    for round in 0..cuts {
        let log = std::fs::File::create(dir.join(format!("weir-{round}.log"))).unwrap();
        let up = rng.below(2) == 0;
        let mut child = spawn_weir(if up { &cfg } else { &cfg_down }, log);
        // Every restart recovers and listens.
        wait_port(SocketAddr::from(([127, 0, 0, 1], mqtt))).await;
        assert!(
            child.try_wait().unwrap().is_none(),
            "weir exited after cut {round}: see weir-{round}.log"
        );
        let rate = (1_000 + rng.below(4_001)) as f64;
        let run_for = Duration::from_millis(50 + rng.below(1_450));
        let how = match rng.below(2) {
            0 => Cut::Clean,
            _ => Cut::Torn(rng.below(u64::MAX)),
        };
        let publishing = publish(mqtt, round, rate);
        let cutter = async {
            tokio::time::sleep(run_for).await;
            // The power goes: the process and what it had not synced.
            kill9(&mut child);
            fs.power_cut(how);
        };
        let (mine, ()) = tokio::join!(publishing, cutter);
        torn += usize::from(matches!(how, Cut::Torn(_)));
        acked.extend(mine);
    }
    // The last start: everything acknowledged must be delivered.
    let want: BTreeSet<Vec<u8>> = acked.iter().cloned().collect();
    let records = deliver_all(&dir, &cfg, mqtt, &out, &want).await;
    let stats = fs.stats();
    drop(fs);

    let got: BTreeMap<Vec<u8>, usize> = common::tally(records.iter().map(|r| r.payload.to_vec()));
    let lost = want.iter().filter(|p| !got.contains_key(*p)).count();
    // No (origin, seq) names two different records: the sequence lease
    // survives the cuts.
    let mut ids: HashMap<(u64, u64), &[u8]> = HashMap::new();
    let mut reused = 0;
    for r in &records {
        let first = ids.entry((r.origin, r.seq)).or_insert(r.payload.as_ref());
        if *first != r.payload.as_ref() {
            reused += 1;
        }
    }
    let duplicates: usize = got.values().map(|n| n - 1).sum();
    eprintln!(
        "{cuts} power cuts ({torn} torn), {} fsyncs, {} unsynced bytes forgotten: acknowledged {}, delivered {} distinct, {duplicates} delivered again, {lost} lost, {reused} reused ids",
        stats.fsyncs,
        stats.lost_bytes,
        want.len(),
        got.len()
    );
    assert!(acked.len() > 100, "only {} acknowledged", acked.len());
    assert!(stats.lost_bytes > 0, "no cut ever caught unsynced data");
    assert_eq!(lost, 0, "acknowledged records lost to a power cut");
    assert_eq!(reused, 0, "(origin, seq) reused after a power cut");
    let _ = std::fs::remove_dir_all(dir);
}

/// The file egress on the power-cut filesystem too: a batch it confirmed
/// lets the spool forget its records, so a confirmation that came before
/// the batch was on disk loses them at the next cut. Every acknowledged
/// record must be in the segments at the end, every segment a crash left
/// open must be sealed by the next start, and every frame read back must be
/// intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cuts_lose_no_batch_the_file_egress_confirmed() {
    let cuts: usize = std::env::var("WEIR_POWER_CUTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(10, |n: usize| n.div_ceil(2));
    let OnFaultFs {
        dir,
        fs,
        out,
        mqtt,
        cfg,
        ..
    } = on_faultfs_with("egress-power", true);
    let seed = weir::clock::unix_micros();
    eprintln!("power cuts: {cuts}, seed {seed}");
    let mut rng = Rng(seed);
    let mut acked: Vec<Vec<u8>> = Vec::new();
    let mut open_after_cut = 0;
    for round in 0..cuts {
        let log = std::fs::File::create(dir.join(format!("weir-{round}.log"))).unwrap();
        let mut child = spawn_weir(&cfg, log);
        wait_port(SocketAddr::from(([127, 0, 0, 1], mqtt))).await;
        assert!(
            child.try_wait().unwrap().is_none(),
            "weir exited after cut {round}: see weir-{round}.log"
        );
        // The last start sealed what the cut before it left open.
        let names: Vec<String> = std::fs::read_dir(&out)
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        assert!(
            names
                .iter()
                .filter(|n| n.ends_with(".weirseg.open"))
                .count()
                <= 1,
            "{names:?}"
        );
        let rate = (2_000 + rng.below(6_001)) as f64;
        let run_for = Duration::from_millis(300 + rng.below(1_200));
        let how = match rng.below(2) {
            0 => Cut::Clean,
            _ => Cut::Torn(rng.below(u64::MAX)),
        };
        let publishing = publish(mqtt, round, rate);
        let cutter = async {
            tokio::time::sleep(run_for).await;
            kill9(&mut child);
            let open = std::fs::read_dir(&out)
                .map(|rd| {
                    rd.flatten()
                        .filter(|e| e.file_name().to_string_lossy().ends_with(".open"))
                        .count()
                })
                .unwrap_or(0);
            fs.power_cut(how);
            open
        };
        let (mine, open) = tokio::join!(publishing, cutter);
        open_after_cut += open;
        acked.extend(mine);
    }
    let want: BTreeSet<Vec<u8>> = acked.iter().cloned().collect();
    let records = deliver_all(&dir, &cfg, mqtt, &out, &want).await;
    let stats = fs.stats();
    // Stopped cleanly: nothing left open; every frame intact or skipped as
    // torn, none unreadable.
    let segments = weir::egress::file::read_batches(&out, 64 << 20).unwrap();
    let still_open = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".open"))
        .count();
    drop(fs);
    let got: BTreeSet<&[u8]> = records.iter().map(|r| r.payload.as_ref()).collect();
    let lost = want.iter().filter(|p| !got.contains(p.as_slice())).count();
    eprintln!(
        "{cuts} power cuts, {open_after_cut} segments open at a cut, {} fsyncs, {} unsynced bytes forgotten: acknowledged {}, delivered {} distinct in {} batches, {lost} lost",
        stats.fsyncs,
        stats.lost_bytes,
        want.len(),
        got.len(),
        segments.len()
    );
    assert!(acked.len() > 100, "only {} acknowledged", acked.len());
    assert!(open_after_cut > 0, "no cut caught a segment open");
    assert_eq!(still_open, 0, "a segment left open after a clean stop");
    assert_eq!(lost, 0, "acknowledged records lost to a power cut");
    let _ = std::fs::remove_dir_all(dir);
}

/// A failing disk: a segment's `fdatasync` or `write` fails with EIO or
/// ENOSPC while QoS 1 records arrive. weir must not acknowledge a record
/// whose write or sync failed: the filesystem (as Linux does) drops what a
/// failed sync covered and lets the next sync of the file "succeed", so a
/// writer that retried the sync and trusted it would lose acknowledged
/// records at the power cut that follows each injected failure here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_write_or_sync_is_never_acknowledged() {
    use common::process::{metric, scrape};
    use weir_faultfs::Op;

    let OnFaultFs {
        dir,
        fs,
        out,
        mqtt,
        admin,
        cfg,
        cfg_down,
    } = on_faultfs("spool-eio");
    // The cloud is unreachable while the disk fails (`cfg_down`): every
    // acknowledged record is in the spool alone when the power goes.
    // The fast rounds fail syncs while the next group is being encoded
    // (the writer encodes a group while the one before is synced).
    let cases = [
        (Op::Fsync, libc::EIO, 1, 2_000.0),
        (Op::Fsync, libc::EIO, 3, 2_000.0),
        (Op::Write, libc::EIO, 1, 2_000.0),
        (Op::Write, libc::ENOSPC, 2, 2_000.0),
        (Op::Fsync, libc::ENOSPC, 1, 2_000.0),
        (Op::Fsync, libc::EIO, 1, 20_000.0),
        (Op::Fsync, libc::EIO, 4, 20_000.0),
    ];
    let mut acked: Vec<Vec<u8>> = Vec::new();
    let mut abandoned = 0.0;
    for (round, (op, errno, count, rate)) in cases.into_iter().enumerate() {
        let log = std::fs::File::create(dir.join(format!("weir-{round}.log"))).unwrap();
        let mut child = spawn_weir(&cfg_down, log);
        wait_port(SocketAddr::from(([127, 0, 0, 1], mqtt))).await;
        let injected = fs.stats().injected;
        let acks = Arc::new(AtomicU64::new(0));
        let publishing = publish_counting(mqtt, round, rate, Some(Arc::clone(&acks)));
        let admin = SocketAddr::from(([127, 0, 0, 1], admin));
        let injector = async {
            // The disk fails under records already acknowledged from it.
            common::eventually("records acknowledged before the failure", || {
                acks.load(Ordering::Relaxed) > 0
            })
            .await;
            fs.fail(op, errno, count, Some(".seg"));
            // Until every failure happened, the segment was abandoned, and
            // records after it are acknowledged (from a new segment).
            common::eventually("the injected failures happen", || {
                fs.stats().injected >= injected + u64::from(count)
            })
            .await;
            common::eventually_async("the failed segment to be abandoned", || async {
                let m = scrape(admin).await.unwrap_or_default();
                metric(&m, "weir_spool_abandoned_segments_total") >= 1.0
            })
            .await;
            let before = acks.load(Ordering::Relaxed);
            common::eventually("records acknowledged after the failure", || {
                acks.load(Ordering::Relaxed) > before
            })
            .await;
            let m = scrape(admin).await.unwrap_or_default();
            // The power goes right after.
            kill9(&mut child);
            fs.power_cut(Cut::Clean);
            m
        };
        let (mine, m) = tokio::join!(publishing, injector);
        let n = metric(&m, "weir_spool_abandoned_segments_total");
        eprintln!(
            "{op:?} failing with errno {errno} x{count} at {rate} records/s: {} acknowledged, {n} segments abandoned",
            mine.len()
        );
        assert!(n >= 1.0, "the failure abandoned a segment: {m}");
        abandoned += n;
        acked.extend(mine);
    }
    let want: BTreeSet<Vec<u8>> = acked.iter().cloned().collect();
    let got: BTreeSet<Vec<u8>> = deliver_all(&dir, &cfg, mqtt, &out, &want)
        .await
        .into_iter()
        .map(|r| r.payload.to_vec())
        .collect();
    drop(fs);
    let lost = want.difference(&got).count();
    eprintln!(
        "failing disk: {} acknowledged, {lost} lost, {abandoned} segments abandoned in all",
        want.len()
    );
    assert_eq!(
        lost, 0,
        "a record acknowledged after a failed write or sync was lost"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// `weir consume --output --state` on the power-cut filesystem: killed and
/// the power cut at random moments while it reads a queue, restarted each
/// time. Every restart must succeed and, in the end, the output must hold
/// every record exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weir_consume_across_power_cuts_hands_each_record_on_once() {
    use common::amqp::{amqp_egress, delete_queue, AMQP_URL};
    use common::process::WEIR;
    use std::process::{Command, Stdio};

    let dir = tmp("consume-power");
    let name = common::unique("consume-power");
    let queue = format!("{name}.q");
    delete_queue(&queue).await;
    // The queue, filled by a weir in memory mode with small batches.
    let mqtt = free_port();
    let cfg = write_config(
        &dir,
        "relay.toml",
        &format!(
            "[spool]\ndir = \"{}\"\n[scheduler]\nmax_batch_records = 8\n[ingress.mqtt]\nlisten = \"127.0.0.1:{mqtt}\"\n[ingress.grpc]\nenabled = false\n{}\n",
            dir.join("state").display(),
            amqp_egress(&name)
        ),
    );
    let log = std::fs::File::create(dir.join("relay.log")).unwrap();
    let mut relay = spawn_weir(&cfg, log);
    wait_port(SocketAddr::from(([127, 0, 0, 1], mqtt))).await;
    const N: u64 = 8_000;
    let pace = Pace::unpaced(64, tokio::time::Instant::now() + PATIENCE);
    let acked = publish_qos1(mqtt, "consume-power", pace, |i| {
        (i < N).then(|| (b"lt/consume".to_vec(), format!("c-{i}").into_bytes()))
    })
    .await;
    assert_eq!(acked.len() as u64, N);
    sigterm(relay.id());
    assert!(
        relay.wait().unwrap().success(),
        "the relay drained to RabbitMQ"
    );

    let fs = mount(&dir);
    // Output and state in directories of their own (made durably here):
    // each name must be synced in its own directory.
    let root = dir.join("fs");
    for d in ["out", "state"] {
        std::fs::create_dir(root.join(d)).unwrap();
    }
    std::fs::File::open(&root).unwrap().sync_all().unwrap();
    let out = root.join("out").join("out.jsonl");
    let state = root.join("state").join("state.json");
    let args = |idle: Option<&str>| {
        let mut a = vec![
            "consume".to_owned(),
            "--url".into(),
            AMQP_URL.into(),
            "--queue".into(),
            queue.clone(),
            "--prefetch".into(),
            "4".into(),
            "--output".into(),
            out.display().to_string(),
            "--state".into(),
            state.display().to_string(),
        ];
        if let Some(idle) = idle {
            a.extend(["--idle-exit".into(), idle.into()]);
        }
        a
    };
    let mut rng = Rng(weir::clock::unix_micros());
    let mut failed_restarts = Vec::new();
    const CUTS: usize = 15;
    for round in 0..CUTS {
        let mut child = Command::new(WEIR)
            .args(args(None))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("consume-{round}.log"))).unwrap())
            .spawn()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(30 + rng.below(300))).await;
        if let Some(status) = child.try_wait().unwrap() {
            failed_restarts.push((round, status));
        }
        kill9(&mut child);
        fs.power_cut(match rng.below(2) {
            0 => Cut::Clean,
            _ => Cut::Torn(rng.below(u64::MAX)),
        });
    }
    let last = Command::new(WEIR)
        .args(args(Some("3s")))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&last.stderr).into_owned();
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    drop(fs);
    let mut counts: BTreeMap<(u64, u64), usize> = BTreeMap::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}"));
        *counts
            .entry((v["origin"].as_u64().unwrap(), v["seq"].as_u64().unwrap()))
            .or_insert(0) += 1;
    }
    let twice = counts.values().filter(|&&n| n > 1).count();
    eprintln!(
        "weir consume, {CUTS} power cuts: {} records in the output ({twice} twice), {} failed restarts",
        counts.len(),
        failed_restarts.len()
    );
    assert!(last.status.success(), "the last run: {err}");
    assert!(
        failed_restarts.is_empty(),
        "restarts failed: {failed_restarts:?} (see consume-N.log)"
    );
    assert_eq!(counts.len() as u64, N, "every record handed on: {err}");
    assert_eq!(twice, 0, "records handed on twice");
    delete_queue(&queue).await;
    let _ = std::fs::remove_dir_all(dir);
}
