//! Peering end to end with three `App`s in this process (the scenario is
//! in `common/peering.rs`), all publishing to one real RabbitMQ queue.
//!
//! - Redirection: node 1's overflow is carried by its peers (their metrics
//!   say so, and the cloud sees node-1 records in batches sent by 2 or 3);
//!   node 1's `ls` records all meet their bound; every record reaches
//!   RabbitMQ exactly once by (origin, seq).
//! - A provider cut off mid-stream (its peering silenced while it carries
//!   node 1's overflow, as by a partition, its egress running on): every
//!   record acknowledged at ingress still arrives; the records it held for
//!   node 1 arrive twice (node 1 took them back, and the provider delivered
//!   them), and only those. `e2e_peering_processes.rs` covers the crash of
//!   a whole provider process.
//!
//! No timing thresholds beyond the `ls` bound, which is the class's own
//! configured promise; waits are bounded only to avoid hangs.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::amqp::*;
use common::peering::*;
use common::process::parse_config;
use common::*;
use weir::app::App;
use weir::intake::Intake;

/// The three-instance scenarios share 2 CPU cores: run them one at a time
/// so that one does not eat the other's latency.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn config(name: &str, id: u64, ports: &[u16]) -> weir::config::Config {
    let listen = Listen {
        grpc: "127.0.0.1:0".into(),
        admin: None,
    };
    let text = node_config(name, id, ports, &listen);
    parse_config(&text, "peering")
}

/// Offers `lt_rate` lt records/s (and `ls_rate` ls) to `ingress` for
/// `LOAD`; returns how many of each were acknowledged at ingress.
async fn offer(ingress: &Intake, lt_rate: usize, ls_rate: usize) -> usize {
    const TICK: Duration = Duration::from_millis(10);
    let ticks = (LOAD.as_millis() / TICK.as_millis()) as usize;
    let mut tick = tokio::time::interval(TICK);
    let mut sent = 0;
    let (mut lt_due, mut ls_due) = (0.0f64, 0.0f64);
    for _ in 0..ticks {
        tick.tick().await;
        lt_due += lt_rate as f64 * TICK.as_secs_f64();
        ls_due += ls_rate as f64 * TICK.as_secs_f64();
        while ls_due >= 1.0 {
            ls_due -= 1.0;
            put(ingress, LS_STREAM, sent).await;
            sent += 1;
        }
        while lt_due >= 1.0 {
            lt_due -= 1.0;
            put(ingress, LT_STREAM, sent).await;
            sent += 1;
        }
    }
    sent
}

async fn put(ingress: &Intake, stream: &str, i: usize) {
    let record = ingress.grpc_record(stream, Bytes::from(payload(stream, i)));
    ingress
        .enqueue(record, Some(PATIENCE))
        .await
        .expect("queue has room");
}

struct Cluster {
    apps: Vec<App>,
    queue: String,
}

impl Cluster {
    /// Shuts every node down in order (node 1 first: its forwarders wait
    /// for the delivery acknowledgements of what its peers still hold);
    /// returns their metrics for reading afterwards.
    async fn shutdown(&mut self) -> Vec<Arc<weir::metrics::Metrics>> {
        let metrics = self
            .apps
            .iter()
            .map(|a| Arc::clone(a.ingress.metrics()))
            .collect();
        // A deadline that passed would abandon records the tests count.
        for app in self.apps.drain(..) {
            app.shutdown(PATIENCE).await;
        }
        metrics
    }
}

async fn cluster(test: &str) -> Cluster {
    // Shown when a test fails: what each node's rounds decided.
    logs_with("weir::peer=debug");
    let name = unique(test);
    let queue = format!("{name}.q");
    delete_queue(&queue).await;
    let ports = free_ports(3);
    let mut apps = Vec::new();
    for id in 1..=3 {
        apps.push(
            App::start(config(&name, id, &ports))
                .await
                .unwrap_or_else(|e| panic!("node {id}: {e:#}")),
        );
    }
    // Let heartbeats go round before traffic starts.
    eventually("the peers to see each other", || {
        apps.iter()
            .all(|a| a.peering.as_ref().unwrap().status().alive.len() >= 2)
    })
    .await;
    Cluster { apps, queue }
}

/// Consumes `queue` from now on until as many distinct (origin, seq) as
/// `expected` (set once the load is over) have arrived.
fn consumer(queue: &str) -> (Arc<AtomicUsize>, tokio::task::JoinHandle<Vec<Seen>>) {
    let expected = Arc::new(AtomicUsize::new(0));
    let (queue, target) = (queue.to_owned(), Arc::clone(&expected));
    let task = tokio::spawn(async move {
        consume_until(&queue, |seen| {
            let want = target.load(Ordering::Acquire);
            want > 0 && seen.len() >= want && counts(seen).len() >= want
        })
        .await
    });
    (expected, task)
}

fn redirected_in(app: &App) -> u64 {
    app.ingress.metrics().peer.redirected_in_total()
}

/// Offers the scenario's traffic to all three nodes at once; returns the
/// number of records acknowledged at ingress.
async fn offer_all(c: &Cluster) -> usize {
    let (a, b, cc) = tokio::join!(
        offer(&c.apps[0].ingress, LT_RATE, LS_RATE),
        offer(&c.apps[1].ingress, IDLE_RATE, 0),
        offer(&c.apps[2].ingress, IDLE_RATE, 0),
    );
    a + b + cc
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overflow_is_redirected_ls_meets_its_bound_and_every_record_arrives_once() {
    let _serial = SERIAL.lock().await;
    let mut c = cluster("redirect").await;
    let (expected, consumer) = consumer(&c.queue);
    let offered = offer_all(&c).await;
    expected.store(offered, Ordering::Release);
    let metrics = c.shutdown().await;
    let carried: Vec<u64> = metrics
        .iter()
        .map(|m| m.peer.redirected_in_total())
        .collect();
    let out = metrics[0].peer.redirected_out_total();
    // Everything is confirmed by RabbitMQ once shutdown returns; the
    // consumer lingers until the queue is quiet.
    let seen = tokio::time::timeout(PATIENCE * 2, consumer)
        .await
        .expect("consumer ends")
        .unwrap();
    delete_queue(&c.queue).await;

    eprintln!(
        "offered {offered}, seen {}; node 1 redirected {out}, carried by peers {carried:?}",
        seen.len()
    );
    let counts = counts(&seen);
    let dup: Vec<_> = counts.iter().filter(|(_, &n)| n > 1).collect();
    assert!(dup.is_empty(), "duplicates: {dup:?}");
    assert_eq!(
        seen.len(),
        offered,
        "every record acknowledged at ingress arrived once"
    );

    // Redirection happened, and the cloud can tell.
    assert!(out > 0, "node 1 redirected nothing");
    assert_eq!(carried[0], 0, "node 1 carried nobody's overflow");
    // Every record a peer queued for node 1 was delivered by that peer and
    // acknowledged to node 1 before node 1 stopped.
    assert_eq!(
        carried[1] + carried[2],
        out,
        "what node 1 lent is what its peers took and delivered"
    );
    let lent = lent_by_node_1(&seen).len();
    assert_eq!(
        lent as u64, out,
        "node-1 records the cloud got from a peer, against those peers acknowledged as delivered"
    );
    assert!(seen
        .iter()
        .all(|s| s.batch_node == s.record.origin || s.record.origin == 1));

    // Node 1's ls met its bound.
    let ls = ls_latencies_ms(&seen, 1);
    assert_eq!(ls.len(), LS_RATE * LOAD.as_secs() as usize);
    assert_ls_within_bound(&ls);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_cut_off_mid_stream_loses_nothing_and_its_records_arrive_twice() {
    let _serial = SERIAL.lock().await;
    let mut c = cluster("partition").await;
    let (expected, consumer) = consumer(&c.queue);

    // Silence whichever provider carries node 1's overflow first,
    // mid-stream.
    let killer = async {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            for i in 1..=2 {
                if redirected_in(&c.apps[i]) >= 200 {
                    c.apps[i].peering.as_ref().unwrap().kill();
                    return i as u64 + 1;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no provider ever carried node 1's overflow"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let (offered, victim) = tokio::join!(offer_all(&c), killer);
    expected.store(offered, Ordering::Release);
    let metrics = c.shutdown().await;
    let seen = tokio::time::timeout(PATIENCE * 2, consumer)
        .await
        .expect("consumer ends")
        .unwrap();
    delete_queue(&c.queue).await;

    let taken_back = metrics[0].peer.requeued_total();
    let carried: Vec<u64> = metrics
        .iter()
        .map(|m| m.peer.redirected_in_total())
        .collect();
    let counts = counts(&seen);
    let twice = duplicates(&seen);
    eprintln!(
        "provider {victim} cut off mid-stream: offered {offered}, seen {} ({} distinct), {} duplicates; \
         node 1 took back {taken_back}; carried by peers {carried:?}",
        seen.len(),
        counts.len(),
        twice.len()
    );
    assert_eq!(
        counts.len(),
        offered,
        "every record acknowledged at ingress arrived"
    );
    let origins: HashSet<u64> = seen.iter().map(|s| s.record.origin).collect();
    assert_eq!(origins, HashSet::from([1, 2, 3]));
    // The only copies twice are node-1 records the silenced provider held
    // and delivered after node 1 had taken them back: one copy from it, one
    // from node 1 or the other provider.
    assert!(twice.len() as u64 <= taken_back);
    for (key, senders) in &twice {
        assert_eq!(key.0, 1, "{key:?} sent by {senders:?}");
        assert_eq!(senders.len(), 2, "{key:?} sent by {senders:?}");
        assert_eq!(
            senders.iter().filter(|&&n| n == victim).count(),
            1,
            "{key:?} sent by {senders:?}"
        );
    }
}
