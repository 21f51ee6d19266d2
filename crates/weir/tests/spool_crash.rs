//! The spool against real crashes: weir killed with SIGKILL while devices
//! publish QoS 1 through it to RabbitMQ, and segments damaged on disk
//! between runs. An acknowledgement from a spooled class means "on disk":
//! nothing acknowledged may be lost.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::process::Child;
use std::time::Duration;

use common::amqp::{amqp_egress, consume_until, delete_queue};
use common::mqtt::{publish_qos1, Pace};
use common::process::{
    file_batch_payloads, file_egress, free_port, metric, scrape, sigterm, spawn_weir, spool_config,
    wait_port, write_config,
};
use common::{tmp, unique, PATIENCE};

/// Publishes QoS 1 as fast as weir acknowledges, `window` in flight,
/// a third of them `ls`, until weir is killed or `stop`; the payloads
/// acknowledged are added to `acked`.
async fn publish_until_broken(
    port: u16,
    client: &str,
    prefix: &str,
    window: usize,
    stop: tokio::time::Instant,
    acked: &mut Vec<Vec<u8>>,
) {
    let pace = Pace::unpaced(window, stop);
    acked.extend(
        publish_qos1(port, client, pace, |i| {
            let topic: &[u8] = if i.is_multiple_of(3) {
                b"ls/crash"
            } else {
                b"lt/crash"
            };
            (i < MAX_PER_CONNECTION).then(|| (topic.to_vec(), format!("{prefix}-{i}").into_bytes()))
        })
        .await,
    );
}

/// Publishes per connection at most: keeps the test's volume (and the
/// final consume) small enough for CI.
const MAX_PER_CONNECTION: u64 = 3000;

fn kill9(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_acknowledged_is_lost_across_twenty_sigkills() {
    let dir = tmp("spool-kill9");
    let name = unique("spool-kill9");
    let queue = format!("{name}.q");
    delete_queue(&queue).await;
    let (mqtt, admin) = (free_port(), free_port());
    let cfg = write_config(
        &dir,
        "weir.toml",
        &spool_config(&dir.join("spool"), mqtt, admin, &amqp_egress(&name), ""),
    );
    let mut acked = Vec::new();
    // A varied moment to kill at, without a random-number dependency.
    let mut lcg: u64 = 0x9E37_79B9_7F4A_7C15;
    for round in 0..20 {
        let log = std::fs::File::create(dir.join(format!("weir-{round}.log"))).unwrap();
        let mut child = spawn_weir(&cfg, log);
        wait_port(SocketAddr::from(([127, 0, 0, 1], mqtt))).await;
        lcg = lcg
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let run_for = Duration::from_millis(50 + (lcg >> 33) % 350);
        let publishing = async {
            let mut mine = Vec::new();
            publish_until_broken(
                mqtt,
                &format!("crash-{round}"),
                &format!("r{round}"),
                64,
                tokio::time::Instant::now() + PATIENCE,
                &mut mine,
            )
            .await;
            mine
        };
        let killer = async {
            tokio::time::sleep(run_for).await;
            kill9(&mut child);
        };
        let (mine, ()) = tokio::join!(publishing, killer);
        acked.extend(mine);
    }
    assert!(
        acked.len() > 1000,
        "only {} publishes acknowledged",
        acked.len()
    );
    // The last start: everything acknowledged must reach RabbitMQ.
    let log = std::fs::File::create(dir.join("weir-final.log")).unwrap();
    let mut child = spawn_weir(&cfg, log);
    let want: BTreeSet<Vec<u8>> = acked.iter().cloned().collect();
    let seen = consume_until(&queue, |seen| {
        let got: BTreeSet<&[u8]> = seen.iter().map(|s| s.record.payload.as_ref()).collect();
        want.iter().all(|p| got.contains(p.as_slice()))
    })
    .await;
    sigterm(child.id());
    let _ = child.wait();
    let got: BTreeMap<Vec<u8>, usize> =
        common::tally(seen.iter().map(|s| s.record.payload.to_vec()));
    let lost: Vec<String> = want
        .iter()
        .filter(|p| !got.contains_key(*p))
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    // Each record comes back with its own topic: the spool's key table
    // (a topic written once per segment, then an id) survives the crashes.
    let wrong_topic: Vec<String> = seen
        .iter()
        .filter(|s| {
            let payload = String::from_utf8_lossy(&s.record.payload).into_owned();
            let i: u64 = payload.rsplit('-').next().unwrap().parse().unwrap();
            let want = if i.is_multiple_of(3) {
                "ls/crash"
            } else {
                "lt/crash"
            };
            s.record.key != want
        })
        .take(10)
        .map(|s| String::from_utf8_lossy(&s.record.payload).into_owned())
        .collect();
    assert!(
        wrong_topic.is_empty(),
        "records delivered with another topic: {wrong_topic:?}"
    );
    let by_id = common::amqp::counts(&seen);
    let duplicates: usize = by_id.values().map(|n| n - 1).sum();
    let resent: usize = got.values().map(|n| n - 1).sum();
    eprintln!(
        "acknowledged {}, delivered {} distinct payloads, {} duplicate (origin, seq), {} payloads delivered more than once",
        want.len(),
        got.len(),
        duplicates,
        resent
    );
    assert!(
        lost.is_empty(),
        "{} acknowledged records lost: {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    delete_queue(&queue).await;
    let _ = std::fs::remove_dir_all(dir);
}

/// Records spooled while the broker is unreachable, weir killed, then a
/// segment damaged in the middle and the last one cut mid-frame: weir
/// starts, delivers every intact record, counts the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_segments_lose_only_the_damaged_records() {
    let dir = tmp("spool-corrupt");
    let spool = dir.join("spool");
    let out = dir.join("out");
    let (mqtt, admin) = (free_port(), free_port());
    // The broker is unreachable: everything stays in the spool.
    let unreachable = "[egress]\nkind = \"amqp\"\n[egress.amqp]\nurl = \"amqp://127.0.0.1:1/%2f\"";
    let small = "segment_bytes = \"4KiB\"";
    let cfg = write_config(
        &dir,
        "down.toml",
        &spool_config(&spool, mqtt, admin, unreachable, small),
    );
    let log = std::fs::File::create(dir.join("weir-down.log")).unwrap();
    let mut child = spawn_weir(&cfg, log);
    wait_port(SocketAddr::from(([127, 0, 0, 1], mqtt))).await;
    let mut acked = Vec::new();
    // 300 records of ~60 bytes: several 4 KiB segments of class lt.
    let mut conn_acked = Vec::new();
    let stop = tokio::time::Instant::now() + Duration::from_secs(1);
    publish_until_broken(mqtt, "corrupt", "c", 16, stop, &mut conn_acked).await;
    acked.extend(conn_acked);
    kill9(&mut child);
    assert!(acked.len() > 100, "only {} acknowledged", acked.len());

    let mut segs: Vec<_> = std::fs::read_dir(spool.join("lt"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    segs.sort();
    assert!(segs.len() >= 3, "want several segments, got {}", segs.len());
    // Flip bytes in the middle of the first segment.
    let mut first = std::fs::read(&segs[0]).unwrap();
    let mid = first.len() / 2;
    first[mid] ^= 0xff;
    first[mid + 1] ^= 0x55;
    std::fs::write(&segs[0], &first).unwrap();
    // Cut the last one mid-frame.
    let last = segs.last().unwrap();
    let len = std::fs::metadata(last).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(last).unwrap();
    f.set_len(len - 7).unwrap();
    drop(f);

    let cfg = write_config(
        &dir,
        "up.toml",
        &spool_config(&spool, mqtt, admin, &file_egress(&out), small),
    );
    let log = std::fs::File::create(dir.join("weir-up.log")).unwrap();
    let mut child = spawn_weir(&cfg, log);
    let admin_addr = SocketAddr::from(([127, 0, 0, 1], admin));
    wait_port(admin_addr).await;
    // About one frame damaged and one cut; a few more allowed for a flip
    // that spans two frames.
    let want = acked.len();
    let mut delivered = BTreeSet::new();
    common::eventually_async("intact records delivered from the damaged spool", || {
        delivered = file_batch_payloads(&out);
        let n = delivered.len();
        async move { n + 4 >= want }
    })
    .await;
    // Then every intact record has gone out once the spool holds none
    // undelivered: nothing more can arrive.
    common::eventually_async("the spool to hold no undelivered record", || async {
        scrape(admin_addr).await.is_ok_and(|m| {
            m.lines().any(|l| l.starts_with("weir_spool_records{"))
                && metric(&m, "weir_spool_records") == 0.0
        })
    })
    .await;
    delivered = file_batch_payloads(&out);
    let metrics = scrape(admin_addr).await.unwrap();
    sigterm(child.id());
    let _ = child.wait();
    let lost: Vec<&Vec<u8>> = acked.iter().filter(|p| !delivered.contains(*p)).collect();
    eprintln!(
        "acknowledged {}, delivered {}, lost to damage {}",
        acked.len(),
        delivered.len(),
        lost.len()
    );
    // One damaged stretch, counted once: by start-up's scan, not again
    // when the reader meets it.
    assert_eq!(
        metric(&metrics, "weir_spool_corrupt_frames_total"),
        1.0,
        "{metrics}"
    );
    assert!(
        metric(&metrics, "weir_spool_torn_tail_bytes_total") > 0.0,
        "{metrics}"
    );
    assert!(
        !lost.is_empty() && lost.len() <= 4,
        "lost {} records: {lost:?}",
        lost.len()
    );
    let _ = std::fs::remove_dir_all(dir);
}
