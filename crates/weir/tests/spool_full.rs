//! The spool's limits against the real process: a disk that fills up
//! (a 32 MiB tmpfs filled by another writer; weir's next write fails with
//! ENOSPC, or its free-space check sees it first), per-class quotas with
//! each `on_full` policy, and `ttl`.
//! Every record is either delivered or counted as dropped, by reason; an
//! acknowledged record of a `block` class is never dropped.

mod common;

use std::collections::BTreeSet;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::mqtt::{publish_qos1, Pace};
use common::process::{
    file_batch_payloads, file_egress, free_port, metric, scrape, sigterm, spawn_weir, wait_port,
    write_config,
};
use common::{eventually_async, tmp, PATIENCE};

/// The broker is unreachable: whatever is acknowledged stays spooled.
const UNREACHABLE: &str = "[egress]\nkind = \"amqp\"\ndrain_timeout = \"1s\"\n[egress.amqp]\nurl = \"amqp://127.0.0.1:1/%2f\"";

fn config(classes: &str, spool: &Path, extra: &str, mqtt: u16, admin: u16, egress: &str) -> String {
    format!(
        "{classes}\n[spool]\ndir = \"{}\"\n{extra}\n\
         [ingress.mqtt]\nlisten = \"127.0.0.1:{mqtt}\"\n[ingress.grpc]\nenabled = false\n\
         [admin]\nlisten = \"127.0.0.1:{admin}\"\n{egress}\n",
        spool.display()
    )
}

struct Weir {
    child: Child,
    admin: SocketAddr,
}

impl Weir {
    async fn start(dir: &Path, file: &str, text: &str, mqtt: u16, admin: u16) -> Weir {
        let cfg = write_config(dir, file, text);
        let log = std::fs::File::create(dir.join(format!("{file}.log"))).unwrap();
        let child = spawn_weir(&cfg, log);
        let admin = SocketAddr::from(([127, 0, 0, 1], admin));
        wait_port(SocketAddr::from(([127, 0, 0, 1], mqtt))).await;
        wait_port(admin).await;
        Weir { child, admin }
    }

    async fn metrics(&self) -> String {
        scrape(self.admin).await.unwrap()
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    fn stop(mut self) {
        sigterm(self.child.id());
        let _ = self.child.wait();
    }
}

impl Drop for Weir {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A tmpfs of `size` mounted at `at`, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "this test needs root to mount a small tmpfs (a filesystem it can fill): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Writes `path` until the filesystem is full; returns the bytes written.
fn fill(path: &Path) -> u64 {
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![0xa5u8; 64 << 10];
    let mut written = 0;
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            // ENOSPC
            Err(e) if e.raw_os_error() == Some(28) => break,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
    let _ = f.sync_all();
    written
}

fn payload(class: &str, i: u64, size: usize) -> Vec<u8> {
    let mut p = format!("{class}-{i:08}-").into_bytes();
    p.resize(size, b'.');
    p
}

/// Delivered record indices by class.
fn by_class_index(delivered: &BTreeSet<Vec<u8>>) -> std::collections::BTreeMap<String, Vec<u64>> {
    let mut out: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
    for p in delivered {
        let (class, i) = index_of(p);
        out.entry(class).or_default().push(i);
    }
    out
}

/// `weir_spool_dropped_records_total` for a class and reason, summed over
/// every scrape in `metrics`.
fn dropped(metrics: &str, class: &str, reason: &str) -> f64 {
    let key = format!("weir_spool_dropped_records_total{{class=\"{class}\",reason=\"{reason}\"}}");
    metrics
        .lines()
        .filter(|l| l.starts_with(&key))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

fn index_of(p: &[u8]) -> (String, u64) {
    let text = String::from_utf8_lossy(&p[..p.len().min(24)]).into_owned();
    let mut parts = text.split('-');
    let class = parts.next().unwrap().to_owned();
    (class, parts.next().unwrap().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_holds_acknowledgements_back_and_resumes_without_loss() {
    let dir = tmp("spool-enospc");
    let fs = Tmpfs::mount(&dir.join("fs"), "32m");
    let spool = fs.0.join("spool");
    let (mqtt, admin) = (free_port(), free_port());
    let classes = "[[class]]\nname = \"lt\"\nbound = \"1s\"\ndurability = \"spool\"\n[classify]\ndefault_class = \"lt\"";
    // No reserve: weir writes until the filesystem itself refuses.
    let extra = "segment_bytes = \"1MiB\"\nmin_free_bytes = \"0B\"";
    let down = config(classes, &spool, extra, mqtt, admin, UNREACHABLE);
    let mut weir = Weir::start(&dir, "down.toml", &down, mqtt, admin).await;

    let acks = Arc::new(AtomicU64::new(0));
    let publisher = {
        let acks = acks.clone();
        tokio::spawn(async move {
            let pace = Pace {
                silence: PATIENCE,
                acks: Some(acks),
                ..Pace::unpaced(32, tokio::time::Instant::now() + PATIENCE)
            };
            publish_qos1(mqtt, "enospc", pace, |i| {
                (i < 20_000).then(|| (b"lt/full".to_vec(), payload("lt", i, 1024)))
            })
            .await
        })
    };
    eventually_async("a few records spooled", || {
        let n = acks.load(Ordering::Relaxed);
        async move { n >= 2000 }
    })
    .await;
    // Another program takes every free byte: weir's next write fails.
    let filler = fs.0.join("filler");
    let taken = fill(&filler);
    // Acknowledgements stop: weir meets the full disk, as a failed write
    // (ENOSPC) or as its free-space check refusing appends (see below).
    eventually_async("weir to meet the full disk", || {
        assert!(weir.alive(), "weir exited on a full disk");
        let admin = weir.admin;
        async move {
            let m = scrape(admin).await.unwrap_or_default();
            metric(&m, "weir_spool_write_errors_total") >= 1.0
                || (blocked(&m, "lt", "min_free_bytes") == 1.0
                    && metric(&m, "weir_records_backpressured_total") >= 1.0)
        }
    })
    .await;
    let last = acks.load(Ordering::Relaxed);
    assert!(weir.alive(), "weir exited on a full disk");
    let full = weir.metrics().await;
    assert!(
        last < 20_000,
        "every record was acknowledged although the disk was full"
    );
    // Either a write failed with ENOSPC (retried, acknowledgements held)
    // or the free-space check, refreshed every 100 ms, saw the disk full
    // first and held the append like a full quota: which one depends on
    // whether an append fell between the filler and the next check.
    let enospc = metric(&full, "weir_spool_write_errors_total");
    let held = metric(&full, "weir_records_backpressured_total");
    eprintln!("full disk met as: {enospc} failed writes, {held} appends held at the quota check");
    assert!(
        enospc >= 1.0 || held >= 1.0,
        "neither a failed write nor a held append counted: {full}"
    );
    assert_eq!(
        metric(&full, "weir_spool_dropped_records_total"),
        0.0,
        "on_full = block must never drop"
    );
    // Space returns: acknowledgements resume, all the way.
    std::fs::remove_file(&filler).unwrap();
    let acked = tokio::time::timeout(PATIENCE, publisher)
        .await
        .expect("publishing finishes once space returns")
        .unwrap();
    assert_eq!(acked.len(), 20_000, "acknowledgements resumed");
    assert!(weir.alive());
    weir.stop();

    // Up again with an egress that works: everything acknowledged is
    // delivered.
    let out = dir.join("out");
    let up = config(classes, &spool, extra, mqtt, admin, &file_egress(&out));
    let weir = Weir::start(&dir, "up.toml", &up, mqtt, admin).await;
    let want: BTreeSet<Vec<u8>> = acked.into_iter().collect();
    let mut delivered = BTreeSet::new();
    eventually_async("every acknowledged record delivered", || {
        delivered = file_batch_payloads(&out);
        let done = want.is_subset(&delivered);
        async move { done }
    })
    .await;
    eprintln!(
        "disk full after {last} acknowledgements ({taken} bytes taken by the filler); {} delivered after the restart",
        delivered.len()
    );
    weir.stop();
    drop(fs);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_on_full_policy_does_what_it_says_and_ttl_expires_old_records() {
    let dir = tmp("spool-quota");
    let spool = dir.join("spool");
    let (mqtt, admin) = (free_port(), free_port());
    // Three classes with a 256 KiB quota each, and one with a time to
    // live; 64 KiB segments, so that drop-oldest has whole segments to
    // delete.
    let classes = "[[class]]\nname = \"old\"\nbound = \"1s\"\ndurability = \"spool\"\non_full = \"drop-oldest\"\nspool_max_bytes = \"256KiB\"\n\
         [[class]]\nname = \"new\"\nbound = \"1s\"\ndurability = \"spool\"\non_full = \"drop-newest\"\nspool_max_bytes = \"256KiB\"\n\
         [[class]]\nname = \"blk\"\nbound = \"1s\"\ndurability = \"spool\"\nspool_max_bytes = \"256KiB\"\n\
         [[class]]\nname = \"ttl\"\nbound = \"1s\"\ndurability = \"spool\"\nttl = \"2s\"\n\
         [classify]\ndefault_class = \"blk\"\n\
         [[classify.route]]\nmqtt = \"old/#\"\nclass = \"old\"\n\
         [[classify.route]]\nmqtt = \"new/#\"\nclass = \"new\"\n\
         [[classify.route]]\nmqtt = \"ttl/#\"\nclass = \"ttl\"";
    let extra = "segment_bytes = \"64KiB\"";
    let down = config(classes, &spool, extra, mqtt, admin, UNREACHABLE);
    let mut weir = Weir::start(&dir, "down.toml", &down, mqtt, admin).await;
    const N: u64 = 1000;
    const SIZE: usize = 1024;
    let publish = |class: &'static str, window: usize, silence: Duration| {
        let pace = Pace {
            silence,
            ..Pace::unpaced(window, tokio::time::Instant::now() + PATIENCE)
        };
        publish_qos1(mqtt, class, pace, move |i| {
            (i < N).then(|| (format!("{class}/q").into_bytes(), payload(class, i, SIZE)))
        })
    };
    // 1000 records of 1 KiB: four times each quota. The drop policies
    // acknowledge every record (and count what they drop); block stops
    // acknowledging at its quota.
    let old = publish("old", 1, Duration::from_secs(10)).await;
    let new = publish("new", 1, Duration::from_secs(10)).await;
    let ttl = publish("ttl", 1, Duration::from_secs(10)).await;
    // Every ttl record was acknowledged before this.
    let ttl_acked = tokio::time::Instant::now();
    let blk = publish("blk", 1, Duration::from_secs(3)).await;
    assert_eq!(old.len() as u64, N);
    assert_eq!(new.len() as u64, N);
    assert_eq!(ttl.len() as u64, N);
    assert!(
        (blk.len() as u64) < N / 2,
        "block acknowledged {} records past its quota",
        blk.len()
    );
    assert!(weir.alive());
    let down_metrics = weir.metrics().await;
    weir.stop();
    // Past the ttl (2 s, in `classes`): every ttl record is older than
    // that from then on (already so: blk's publish ends with 3 s of
    // silence).
    tokio::time::sleep_until(ttl_acked + Duration::from_secs(2)).await;

    let out = dir.join("out");
    let up = config(classes, &spool, extra, mqtt, admin, &file_egress(&out));
    let weir = Weir::start(&dir, "up.toml", &up, mqtt, admin).await;
    // Every record of the quota and ttl classes is accounted for:
    // delivered, or dropped and counted (by the first run or this one).
    let mut by_class = Default::default();
    let mut metrics = String::new();
    eventually_async("every record delivered or counted as dropped", || {
        by_class = by_class_index(&file_batch_payloads(&out));
        let admin = weir.admin;
        let done_so_far = by_class.clone();
        let down_metrics = down_metrics.clone();
        async move {
            let up = scrape(admin).await.unwrap();
            let both = format!("{down_metrics}{up}");
            let n = |c: &str| done_so_far.get(c).map_or(0, Vec::len) as f64;
            // And the spool holds nothing undelivered (blk's records
            // included): nothing more can arrive.
            let spool_empty = up.lines().any(|l| l.starts_with("weir_spool_records{"))
                && metric(&up, "weir_spool_records") == 0.0;
            n("old") + dropped(&both, "old", "evicted") >= N as f64
                && n("new") + dropped(&both, "new", "full") >= N as f64
                && n("ttl") + dropped(&both, "ttl", "ttl") >= N as f64
                && spool_empty
        }
    })
    .await;
    // Read once more: what was delivered before the spool was seen empty.
    by_class = by_class_index(&file_batch_payloads(&out));
    metrics.push_str(&down_metrics);
    metrics.push_str(&weir.metrics().await);
    weir.stop();

    let got = |c: &str| by_class.get(c).cloned().unwrap_or_default();
    let (old_got, new_got, blk_got, ttl_got) = (got("old"), got("new"), got("blk"), got("ttl"));
    let evicted = dropped(&metrics, "old", "evicted");
    let refused = dropped(&metrics, "new", "full");
    let expired = dropped(&metrics, "ttl", "ttl");
    eprintln!(
        "old: {} delivered, {evicted} evicted; new: {} delivered, {refused} dropped; blk: {} acknowledged, {} delivered; ttl: {} delivered, {expired} expired",
        old_got.len(),
        new_got.len(),
        blk.len(),
        blk_got.len(),
        ttl_got.len()
    );
    // drop-oldest keeps the newest records; drop-newest the oldest; each
    // counts every record it dropped.
    assert!(
        old_got.contains(&(N - 1)) && !old_got.contains(&0),
        "{old_got:?}"
    );
    assert_eq!(old_got.len() as f64 + evicted, N as f64);
    assert!(
        new_got.contains(&0) && !new_got.contains(&(N - 1)),
        "{new_got:?}"
    );
    assert_eq!(new_got.len() as f64 + refused, N as f64);
    // block drops nothing it acknowledged.
    let blk_want: BTreeSet<u64> = blk.iter().map(|p| index_of(p).1).collect();
    let blk_seen: BTreeSet<u64> = blk_got.iter().copied().collect();
    assert!(
        blk_want.is_subset(&blk_seen),
        "block lost acknowledged records"
    );
    // ttl: older than 2 s when read back, so dropped and counted.
    assert!(
        ttl_got.is_empty(),
        "{} expired records delivered",
        ttl_got.len()
    );
    assert_eq!(expired, N as f64);
    let _ = std::fs::remove_dir_all(dir);
}

/// `weir_spool_blocked` of `class` for `reason`.
fn blocked(metrics: &str, class: &str, reason: &str) -> f64 {
    metric(
        metrics,
        &format!("weir_spool_blocked{{class=\"{class}\",reason=\"{reason}\"}}"),
    )
}

/// The spool fills its filesystem to the disk's reserve during a broker
/// outage, with the default `segment_bytes` and `min_free_bytes` (so the
/// class's one segment is all the room there is): acknowledgements stop,
/// and once the broker is back and the backlog delivered, the delivered
/// segment is reclaimed and acknowledgements resume by themselves, for the
/// publishes held since the outage and for a new client; nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spool_that_filled_its_disk_resumes_by_itself_once_delivered() {
    use common::amqp::{consume_until, delete_queue};
    use common::process::spool_config;
    use common::proxy::{Mode, Proxy};
    use common::unique;

    let dir = tmp("spool-refill");
    // The default reserve (64 MiB) plus one default segment (16 MiB).
    let fs = Tmpfs::mount(&dir.join("fs"), "80m");
    let spool = fs.0.join("spool");
    let (mqtt, admin) = (free_port(), free_port());
    let proxy = Proxy::start().await;
    proxy.set(Mode::Down);
    let name = unique("spool-refill");
    let egress = format!(
        "[egress]\nkind = \"amqp\"\n[egress.amqp]\nurl = \"{}\"\nexchange = \"{name}.x\"\nqueue = \"{name}.q\"\nrouting_key = \"{name}\"",
        proxy.url()
    );
    let text = spool_config(&spool, mqtt, admin, &egress, "");
    let mut weir = Weir::start(&dir, "refill.toml", &text, mqtt, admin).await;
    let log = || std::fs::read_to_string(dir.join("refill.toml.log")).unwrap();

    // More 256 B records than the 16 MiB hold, 64 in flight, from one
    // client that keeps waiting for its acknowledgements.
    const HELD: u64 = 70_000;
    let acks = Arc::new(AtomicU64::new(0));
    let publisher = {
        let acks = acks.clone();
        tokio::spawn(async move {
            let pace = Pace {
                silence: PATIENCE,
                acks: Some(acks),
                ..Pace::unpaced(64, tokio::time::Instant::now() + PATIENCE * 3)
            };
            publish_qos1(mqtt, "refill-a", pace, |i| {
                (i < HELD).then(|| (b"lt/refill".to_vec(), payload("lt", i, 256)))
            })
            .await
        })
    };
    // Acknowledgements stop at the reserve: the gauge and the log say why,
    // and every record the spool took before it refused more is
    // acknowledged (none can follow).
    eventually_async("the spool to refuse appends at the reserve", || {
        let logged = log().contains("spool full for this class");
        let (admin, acked) = (weir.admin, acks.load(Ordering::Relaxed));
        async move {
            let m = scrape(admin).await.unwrap_or_default();
            logged
                && blocked(&m, "lt", "min_free_bytes") == 1.0
                && metric(&m, "weir_spool_appended_records_total") == acked as f64
        }
    })
    .await;
    let stalled = acks.load(Ordering::Relaxed);
    assert!(
        stalled < HELD,
        "every record was acknowledged on a full disk"
    );
    let full = weir.metrics().await;
    assert_eq!(
        blocked(&full, "lt", "min_free_bytes"),
        1.0,
        "the class shows what blocks it: {full}"
    );
    assert_eq!(blocked(&full, "lt", "max_bytes"), 0.0);
    assert!(
        log().contains("spool full for this class") && log().contains("min_free_bytes"),
        "the log says why acknowledgements wait: {}",
        log()
    );

    // The broker is back: the backlog drains, the held publishes are
    // acknowledged, all the way.
    proxy.set(Mode::Pass);
    let back_us = weir::clock::unix_micros();
    // Consumed from now on, so that the consumer's clock shows when the
    // backlog drained; it stops once every acknowledged record is in.
    let want: Arc<std::sync::Mutex<Option<BTreeSet<Vec<u8>>>>> = Arc::default();
    let consumer = {
        let want = want.clone();
        let queue = format!("{name}.q");
        tokio::spawn(async move {
            consume_until(&queue, move |seen| {
                let want = want.lock().unwrap();
                let Some(want) = want.as_ref() else {
                    return false;
                };
                let got: BTreeSet<&[u8]> = seen.iter().map(|s| &s.record.payload[..]).collect();
                want.iter().all(|p| got.contains(p.as_slice()))
            })
            .await
        })
    };
    let mut resumed_us = None;
    eventually_async("acknowledgements resume after the backlog drains", || {
        let n = acks.load(Ordering::Relaxed);
        if resumed_us.is_none() && n > stalled {
            resumed_us = Some(weir::clock::unix_micros());
        }
        async move { n >= HELD }
    })
    .await;
    let held = tokio::time::timeout(PATIENCE, publisher)
        .await
        .expect("the held publisher finishes")
        .unwrap();
    assert_eq!(held.len() as u64, HELD, "every held publish acknowledged");

    // A new client after the drain: acknowledged.
    let fresh_start = tokio::time::Instant::now();
    let fresh = publish_qos1(
        mqtt,
        "refill-b",
        Pace {
            silence: PATIENCE,
            ..Pace::unpaced(64, tokio::time::Instant::now() + PATIENCE)
        },
        |i| (i < 500).then(|| (b"lt/refill".to_vec(), payload("lb", i, 256))),
    )
    .await;
    let fresh_took = fresh_start.elapsed();
    assert_eq!(fresh.len(), 500, "a new client's records are acknowledged");
    let after = weir.metrics().await;
    assert_eq!(
        blocked(&after, "lt", "min_free_bytes"),
        0.0,
        "no longer blocked: {after}"
    );
    assert!(weir.alive());

    // Nothing acknowledged is lost.
    let want_backlog: Vec<Vec<u8>> = held[..stalled as usize].to_vec();
    let all: BTreeSet<Vec<u8>> = held.into_iter().chain(fresh).collect();
    *want.lock().unwrap() = Some(all.clone());
    let seen = consumer.await.unwrap();
    let want = all;
    let got: BTreeSet<Vec<u8>> = seen.iter().map(|s| s.record.payload.to_vec()).collect();
    let lost = want.difference(&got).count();
    // The backlog is what was acknowledged before the stall; it drained
    // when the last of it reached the consumer (an upper bound: the
    // consumer sees a record after weir's confirm for it).
    let backlog: BTreeSet<&[u8]> = want_backlog.iter().map(Vec::as_slice).collect();
    let drained_us = seen
        .iter()
        .filter(|s| backlog.contains(&s.record.payload[..]))
        .map(|s| s.consumed_us)
        .max()
        .unwrap_or_default();
    let resumed_ms = resumed_us.map(|r| (r as f64 - drained_us as f64) / 1e3);
    let drain_took = Duration::from_micros(drained_us.saturating_sub(back_us));
    eprintln!(
        "full at {stalled} acknowledged; first held publish acknowledged {resumed_ms:?} ms after the backlog's last record was consumed (the broker returned {:?} before that); 500 new records acknowledged in {fresh_took:?}; {} delivered, {lost} lost",
        drain_took,
        got.len()
    );
    assert_eq!(lost, 0, "acknowledged records lost");
    assert!(log().contains("reclaimed"), "{}", log());
    weir.stop();
    delete_queue(&format!("{name}.q")).await;
    drop(fs);
    let _ = std::fs::remove_dir_all(dir);
}

/// A filesystem smaller than the reserve: `check-config` and start-up say
/// so, and a blocked publish is explained by the gauge and the log rather
/// than waiting in silence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filesystem_under_the_reserve_is_reported_not_blocked_in_silence() {
    use common::process::{spool_config, WEIR};

    let dir = tmp("spool-small");
    let fs = Tmpfs::mount(&dir.join("fs"), "16m");
    let spool = fs.0.join("spool");
    let (mqtt, admin) = (free_port(), free_port());
    let text = spool_config(&spool, mqtt, admin, UNREACHABLE, "");
    let cfg = write_config(&dir, "small.toml", &text);
    let check = Command::new(WEIR)
        .args(["check-config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&check.stderr);
    assert!(
        check.status.success(),
        "a warning, not a config error: {err}"
    );
    assert!(
        err.contains("warning")
            && err.contains(&spool.display().to_string())
            && err.contains("min_free_bytes is 67108864"),
        "check-config names spool.dir, its free bytes and the reserve: {err}"
    );

    let mut weir = Weir::start(&dir, "small.toml", &text, mqtt, admin).await;
    let log = || std::fs::read_to_string(dir.join("small.toml.log")).unwrap();
    assert!(log().contains("less than one segment"), "{}", log());
    let acked = publish_qos1(
        mqtt,
        "small",
        Pace {
            silence: Duration::from_secs(2),
            ..Pace::unpaced(8, tokio::time::Instant::now() + PATIENCE)
        },
        |i| (i < 8).then(|| (b"lt/small".to_vec(), payload("lt", i, 256))),
    )
    .await;
    assert!(acked.is_empty(), "acknowledged with no room for them");
    let m = weir.metrics().await;
    assert_eq!(blocked(&m, "lt", "min_free_bytes"), 1.0, "{m}");
    assert!(
        log().contains("spool full for this class") && log().contains("free_bytes"),
        "{}",
        log()
    );
    assert!(weir.alive());
    weir.stop();
    drop(fs);
    let _ = std::fs::remove_dir_all(dir);
}
