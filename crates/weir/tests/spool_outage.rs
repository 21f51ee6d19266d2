//! RabbitMQ stopped for 60 s while devices keep publishing QoS 1 through
//! weir with both classes spooled: the backlog goes to disk while weir's
//! memory stays within a stated bound, nothing acknowledged is lost, and
//! once the broker is back the `ls` backlog is delivered before most of
//! the `lt` one. The broker's application is stopped with `rabbitmqctl`
//! (this test has its own binary, so no other test runs meanwhile).

mod common;

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::amqp::{amqp_egress, consume_until, delete_queue, rabbitmqctl, RestartGuard};
use common::mqtt::{publish_qos1, Pace};
use common::process::{
    free_port, metric, scrape, sigterm, spawn_weir, spool_config, wait_port, write_config,
};
use common::{tmp, unique};

/// How long the broker is down, as the issue asks.
const OUTAGE: Duration = Duration::from_secs(60);
/// Publishes per second, all through the outage.
const RATE: f64 = 1000.0;
/// Payload bytes: at `RATE`, the outage's backlog is about 240 MB, far
/// more than the memory bound.
const SIZE: usize = 4096;
/// The stated bound on weir's anonymous resident memory (heap and
/// stacks) through the outage, with the default settings: the class
/// queues hold `spool.window_bytes` each (8 MiB, two classes, in rings of
/// 16,384 slots), the spool writer at most 16 MiB of appends not yet
/// written, the egress its window of batches (8 of at most 64 KiB, and as
/// many waiting for a slot), the reader a 1 MiB chunk. The program's own
/// pages are left out: this is a debug build, whose code alone is about
/// 22 MiB resident (a release build's is under 10 MiB; docs/durability.md
/// gives the release figures).
const RSS_BOUND: u64 = 48 << 20;

/// Anonymous resident memory (`RssAnon`: heap, stacks) and all of it
/// (`VmRSS`), in bytes.
fn rss_bytes(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |key: &str| -> Option<u64> {
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix(key))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(kb * 1024)
    };
    Some((field("RssAnon:")?, field("VmRSS:")?))
}

/// The record index and class carried in a payload.
fn parse(payload: &[u8]) -> (u64, bool) {
    let head = std::str::from_utf8(&payload[..12]).expect("ascii head");
    (head[1..].trim().parse().unwrap(), head.starts_with('s'))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sixty_second_broker_outage_is_spooled_with_bounded_memory_and_ls_drains_first() {
    let dir = tmp("spool-outage");
    let name = unique("spool-outage");
    let queue = format!("{name}.q");
    delete_queue(&queue).await;
    let (mqtt, admin) = (free_port(), free_port());
    let config = spool_config(
        &dir.join("spool"),
        mqtt,
        admin,
        &format!("{}\nreconnect_backoff_max = \"1s\"", amqp_egress(&name)),
        "max_bytes = \"2GiB\"\n[scheduler]\nuplink = \"10Gbit/s\"\n[compression]\nenabled = false",
    );
    let cfg = write_config(&dir, "weir.toml", &config);
    let log = std::fs::File::create(dir.join("weir.log")).unwrap();
    let mut child = spawn_weir(&cfg, log);
    let pid = child.id();
    let admin_addr = SocketAddr::from(([127, 0, 0, 1], admin));
    wait_port(SocketAddr::from(([127, 0, 0, 1], mqtt))).await;
    wait_port(admin_addr).await;

    // Publishing runs through the whole outage and a little after it.
    let published = Arc::new(AtomicU64::new(0));
    let total = OUTAGE + Duration::from_secs(15);
    let publisher = {
        let published = published.clone();
        tokio::spawn(async move {
            let pace = Pace {
                rate: Some(RATE),
                ..Pace::unpaced(256, tokio::time::Instant::now() + total)
            };
            publish_qos1(mqtt, "outage", pace, move |i| {
                published.store(i + 1, Ordering::Relaxed);
                // One record in three is ls.
                let ls = i.is_multiple_of(3);
                let mut payload = format!("{}{:011}", if ls { 's' } else { 't' }, i).into_bytes();
                payload.resize(SIZE, b'.');
                let topic: &[u8] = if ls { b"ls/outage" } else { b"lt/outage" };
                Some((topic.to_vec(), payload))
            })
            .await
        })
    };

    // The broker goes in the middle of a stream: once weir delivers to it.
    common::eventually_async("weir to deliver before the outage", || async {
        let m = scrape(admin_addr).await.unwrap_or_default();
        metric(&m, "weir_batches_confirmed_total") >= 1.0
    })
    .await;
    let guard = RestartGuard;
    rabbitmqctl(&["stop_app"]);
    let down_from = published.load(Ordering::Relaxed);
    let (mut peak_rss, mut peak_total) = (0, 0);
    let outage_end = tokio::time::Instant::now() + OUTAGE;
    while tokio::time::Instant::now() < outage_end {
        let (anon, total) = rss_bytes(pid).expect("weir is running");
        peak_rss = peak_rss.max(anon);
        peak_total = peak_total.max(total);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let metrics = scrape(admin_addr).await.unwrap();
    let spooled = metric(&metrics, "weir_spool_bytes");
    // The backlog ends where the broker is started: what is published
    // while it starts up goes out as soon as weir reconnects, `ls` on time.
    let down_to = published.load(Ordering::Relaxed);
    rabbitmqctl(&["start_app"]);
    drop(guard);

    let acked = publisher.await.unwrap();
    let want: BTreeSet<Vec<u8>> = acked.iter().cloned().collect();
    // Checked as records arrive: the acknowledged payloads not seen yet.
    let mut missing: std::collections::HashSet<&[u8]> = want.iter().map(|p| p.as_slice()).collect();
    let mut checked = 0;
    let seen = consume_until(&queue, |seen| {
        for s in &seen[checked..] {
            missing.remove(s.record.payload.as_ref());
        }
        checked = seen.len();
        missing.is_empty()
    })
    .await;
    let after = scrape(admin_addr).await.unwrap();
    sigterm(child.id());
    let _ = child.wait();

    // Nothing acknowledged is lost.
    let got: HashMap<&[u8], usize> = common::tally(seen.iter().map(|s| s.record.payload.as_ref()))
        .into_iter()
        .collect();
    let lost = want
        .iter()
        .filter(|p| !got.contains_key(p.as_slice()))
        .count();
    // The backlog: records published while the broker was down, in the
    // order RabbitMQ got them (first delivery of each).
    let mut first = BTreeSet::new();
    let backlog: Vec<bool> = seen
        .iter()
        .filter_map(|s| {
            let (i, ls) = parse(&s.record.payload);
            ((down_from..down_to).contains(&i) && first.insert(i)).then_some(ls)
        })
        .collect();
    let last_ls = backlog.iter().rposition(|&ls| ls).expect("ls backlog");
    let lt_total = backlog.iter().filter(|&&ls| !ls).count();
    let lt_before_ls_done = backlog[..last_ls].iter().filter(|&&ls| !ls).count();
    eprintln!(
        "acknowledged {}, lost {lost}, delivered {} ({} more than once); \
         peak RSS over the outage {:.1} MiB anonymous, {:.1} MiB in all; {:.1} MiB spooled at its end; \
         backlog {} records, {} of {lt_total} lt delivered before the last ls; \
         dropped by policy {}",
        want.len(),
        seen.len(),
        got.values().filter(|&&n| n > 1).count(),
        peak_rss as f64 / (1 << 20) as f64,
        peak_total as f64 / (1 << 20) as f64,
        spooled / (1 << 20) as f64,
        backlog.len(),
        lt_before_ls_done,
        metric(&after, "weir_spool_dropped_records_total"),
    );
    assert_eq!(lost, 0, "acknowledged records lost");
    assert!(
        spooled > (2 * RSS_BOUND) as f64,
        "the outage must spool more than twice the memory bound to show anything; spooled {spooled} bytes"
    );
    assert!(
        peak_rss <= RSS_BOUND,
        "weir's anonymous RSS reached {peak_rss} bytes during the outage, above the bound of {RSS_BOUND}"
    );
    assert!(
        lt_before_ls_done * 2 < lt_total,
        "ls did not drain first: {lt_before_ls_done} of {lt_total} lt backlog records went before the last ls one"
    );
    delete_queue(&queue).await;
    let _ = std::fs::remove_dir_all(dir);
}
