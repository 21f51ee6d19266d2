//! Peering with three real `weir` processes (`weir run --config <file>`) on
//! loopback, publishing to one real RabbitMQ queue; the scenario (node 1
//! overloaded, nodes 2 and 3 idle) is in `common/peering.rs`. Records are
//! offered over the gRPC ingress, and a record counts as accepted when
//! weir acknowledged it (its `PublishAck` gives its sequence number).
//!
//! - Redirection: node 1's overflow reaches the cloud in batches sent by
//!   nodes 2 and 3, exactly as many as their `/metrics` say they took;
//!   node 1's `ls` records all meet their bound; every accepted record
//!   reaches RabbitMQ exactly once by (origin, seq).
//! - A provider process SIGKILLed while it holds node 1's overflow: every
//!   record node 1 (and the surviving provider) accepted still reaches
//!   RabbitMQ; the only duplicates are node-1 records the killed provider
//!   delivered before it died and whose delivery acknowledgement died with
//!   it, so each has one copy from the killed node and one from elsewhere.
//!
//! No timing thresholds beyond the `ls` bound, which is the class's own
//! configured promise; waits are bounded only to avoid hangs. Every child
//! process is killed when its guard drops, so a failing test leaves none
//! behind.

mod common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::amqp::*;
use common::peering::*;
use common::process::{metric, scrape, sigterm, spawn_weir, wait_port, write_config};
use common::*;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use weir_proto::pb::ingress_client::IngressClient;
use weir_proto::pb::PublishRequest;

/// The scenarios share 2 CPU cores: run them one at a time so that one does
/// not eat the other's latency.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Records a provider must have taken from node 1 before it is killed
/// (while it still holds some unacknowledged): about a third of the way
/// into the load, so it dies mid-stream and the survivor carries on.
const KILL_AFTER: f64 = 500.0;

/// `(origin, seq)`.
type Key = (u64, u64);

/// One `weir` process; SIGKILLed when dropped.
struct Node {
    id: u64,
    child: Option<Child>,
    grpc: SocketAddr,
    admin: SocketAddr,
    log: PathBuf,
}

impl Node {
    fn start(
        dir: &std::path::Path,
        id: u64,
        config: &str,
        grpc: SocketAddr,
        admin: SocketAddr,
    ) -> Node {
        let file = write_config(dir, &format!("node-{id}.toml"), config);
        let log = dir.join(format!("node-{id}.log"));
        let child = spawn_weir(&file, std::fs::File::create(&log).unwrap());
        Node {
            id,
            child: Some(child),
            grpc,
            admin,
            log,
        }
    }

    /// Its `/metrics`; panics (pointing at its log) if it does not answer.
    async fn metrics(&self) -> String {
        scrape(self.admin).await.unwrap_or_else(|e| {
            panic!(
                "node {} does not answer on {} ({e}); see {}",
                self.id,
                self.admin,
                self.log.display()
            )
        })
    }

    /// Sends `signal` (`STOP`, `CONT`) with kill(1).
    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id();
        let sent = std::process::Command::new("kill")
            .args([format!("-{signal}"), pid.to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -{signal} {pid} failed");
    }

    /// SIGKILL, as a crash or the OOM killer would.
    fn kill(&mut self) {
        let mut child = self.child.take().expect("running");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// SIGTERM, then waits for the exit (weir drains its queues first).
    async fn terminate(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        sigterm(child.id());
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if tokio::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!(
                    "node {} did not exit after SIGTERM; see {}",
                    self.id,
                    self.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops it cleanly and checks that it said so.
    async fn shut_down(&mut self) {
        let status = self.terminate().await;
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        assert!(
            status.success() && log.contains("shut down cleanly"),
            "node {} exited with {status}; see {}",
            self.id,
            self.log.display()
        );
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

struct Cluster {
    nodes: Vec<Node>,
    queue: String,
    dir: PathBuf,
}

/// Starts the three processes and waits until each sees the other two.
async fn cluster(test: &str) -> Cluster {
    cluster_with(test, None).await
}

/// As [`cluster`], with `peering` lines added to each node's `[peering]`.
async fn cluster_with(test: &str, peering: Option<&str>) -> Cluster {
    let name = unique(&format!("proc-{test}"));
    let queue = format!("{name}.q");
    delete_queue(&queue).await;
    let dir = tmp(&format!("proc-{test}"));
    let ports = free_ports(9);
    let (peer, grpc, admin) = (&ports[0..3], &ports[3..6], &ports[6..9]);
    let addr = |port: u16| -> SocketAddr { format!("127.0.0.1:{port}").parse().unwrap() };
    let mut nodes = Vec::new();
    for id in 1..=3u64 {
        let i = id as usize - 1;
        let listen = Listen {
            grpc: addr(grpc[i]).to_string(),
            admin: Some(addr(admin[i]).to_string()),
        };
        let mut config = node_config(&name, id, peer, &listen);
        if let Some(extra) = peering {
            config = config.replacen("[peering]\n", &format!("[peering]\n{extra}\n"), 1);
        }
        nodes.push(Node::start(
            &dir,
            id,
            &config,
            addr(grpc[i]),
            addr(admin[i]),
        ));
    }
    for node in &mut nodes {
        wait_port(node.grpc).await;
        wait_port(node.admin).await;
    }
    for node in &nodes {
        eventually_async(
            &format!(
                "node {} to see its peers (see {})",
                node.id,
                node.log.display()
            ),
            move || async move { metric(&node.metrics().await, "weir_peers_alive") >= 2.0 },
        )
        .await;
    }
    Cluster { nodes, queue, dir }
}

/// Offers `rate` records/s of `stream` to the gRPC ingress at `addr` for
/// [`LOAD`] on one `PublishStream`; returns the sequence numbers weir
/// acknowledged (all of them, unless the node died).
async fn offer(addr: SocketAddr, stream: &'static str, rate: usize) -> Vec<u64> {
    const TICK: Duration = Duration::from_millis(10);
    let mut client = IngressClient::connect(format!("http://{addr}"))
        .await
        .unwrap_or_else(|e| panic!("gRPC ingress at {addr}: {e}"));
    let (tx, rx) = mpsc::channel(1024);
    let sender = tokio::spawn(async move {
        let ticks = (LOAD.as_millis() / TICK.as_millis()) as usize;
        let mut tick = tokio::time::interval(TICK);
        let (mut due, mut i) = (0.0f64, 0usize);
        for _ in 0..ticks {
            tick.tick().await;
            due += rate as f64 * TICK.as_secs_f64();
            while due >= 1.0 {
                due -= 1.0;
                let request = PublishRequest {
                    stream: stream.into(),
                    payload: Bytes::from(payload(stream, i)),
                    id: i as u64,
                };
                if tx.send(request).await.is_err() {
                    return; // the call ended (the node died)
                }
                i += 1;
            }
        }
    });
    let mut acked = Vec::new();
    if let Ok(response) = client.publish_stream(ReceiverStream::new(rx)).await {
        let mut acks = response.into_inner();
        while let Ok(Some(ack)) = acks.message().await {
            acked.push(ack.seq);
        }
    }
    sender.await.unwrap();
    acked
}

/// Offers the scenario's traffic to every node at once; returns, per node,
/// the keys of the records it accepted and (for node 1) the `ls` ones.
async fn offer_all(grpc: [SocketAddr; 3]) -> (Vec<HashSet<Key>>, usize) {
    let (ls, lt, two, three) = tokio::join!(
        offer(grpc[0], LS_STREAM, LS_RATE),
        offer(grpc[0], LT_STREAM, LT_RATE),
        offer(grpc[1], LT_STREAM, IDLE_RATE),
        offer(grpc[2], LT_STREAM, IDLE_RATE),
    );
    let keys =
        |id: u64, seqs: Vec<u64>| -> HashSet<Key> { seqs.into_iter().map(|s| (id, s)).collect() };
    let ls_count = ls.len();
    let mut one = keys(1, ls);
    one.extend(keys(1, lt));
    (vec![one, keys(2, two), keys(3, three)], ls_count)
}

/// Consumes the test queue until `finished` is set (every node has exited,
/// so the queue holds all there will be) and the queue is quiet.
fn consumer(queue: &str) -> (Arc<AtomicBool>, tokio::task::JoinHandle<Vec<Seen>>) {
    let finished = Arc::new(AtomicBool::new(false));
    let (queue, done) = (queue.to_owned(), Arc::clone(&finished));
    let task =
        tokio::spawn(async move { consume_until(&queue, |_| done.load(Ordering::Acquire)).await });
    (finished, task)
}

fn addrs(c: &Cluster) -> [SocketAddr; 3] {
    [c.nodes[0].grpc, c.nodes[1].grpc, c.nodes[2].grpc]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_redirect_overflow_and_every_record_arrives_once() {
    let _serial = SERIAL.lock().await;
    let c = cluster("redirect").await;
    redirect_and_check(c).await;
}

/// The same with adverts by gossip, each node calling one of its two peers
/// every 200 ms: redirection still happens, and every record arrives once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_with_gossip_redirect_and_every_record_arrives_once() {
    let _serial = SERIAL.lock().await;
    let c = cluster_with(
        "gossip",
        Some("adverts = \"gossip\"\ngossip_fanout = 1\ngossip_every = \"200ms\""),
    )
    .await;
    for node in &c.nodes {
        let text = node.metrics().await;
        assert!(metric(&text, "weir_peer_advert_bytes_sent_total") > 0.0);
    }
    // A relayed advert is taken only when newer than what its receiver
    // heard first-hand; among three nodes that talk to each other directly
    // most periods, that takes a few periods.
    let nodes = &c.nodes;
    eventually_async("a node to take a relayed advert", move || async move {
        let mut taken = 0.0;
        for node in nodes {
            let text = node.metrics().await;
            taken += metric(&text, "weir_peer_adverts_relayed_total{outcome=\"taken\"}");
        }
        taken > 0.0
    })
    .await;
    redirect_and_check(c).await;
}

/// Offers the scenario's load to `c`, shuts it down node 1 first, and
/// checks that node 1 lent records, that every accepted record arrived
/// exactly once, and that `ls` kept its bound.
async fn redirect_and_check(mut c: Cluster) {
    let (finished, consumer) = consumer(&c.queue);
    let (accepted, ls_accepted) = offer_all(addrs(&c)).await;
    let node1 = c.nodes[0].metrics().await;
    let out_so_far = metric(&node1, "weir_peer_records_redirected_out_total");

    // Node 1 first: it stops once its peers acknowledged delivery of all it
    // lent them, so their counters are final afterwards.
    c.nodes[0].shut_down().await;
    let mut carried = Vec::new();
    for node in &c.nodes[1..] {
        let text = node.metrics().await;
        carried.push(metric(&text, "weir_peer_records_redirected_in_total") as usize);
        assert_eq!(
            metric(&text, "weir_peer_records_held"),
            0.0,
            "node {} still holds records for node 1",
            node.id
        );
    }
    for node in &mut c.nodes[1..] {
        node.shut_down().await;
    }
    finished.store(true, Ordering::Release);
    let seen = tokio::time::timeout(PATIENCE * 2, consumer)
        .await
        .expect("consumer ends")
        .unwrap();
    delete_queue(&c.queue).await;

    let expected: HashSet<Key> = accepted.iter().flatten().copied().collect();
    let counts = counts(&seen);
    let lent = lent_by_node_1(&seen);
    eprintln!(
        "accepted {} (node 1: {}), seen {} ({} distinct); node 1 lent {} (acknowledged while running: {out_so_far}), carried by nodes 2 and 3: {carried:?}",
        expected.len(),
        accepted[0].len(),
        seen.len(),
        counts.len(),
        lent.len()
    );
    let dup = duplicates(&seen);
    assert!(dup.is_empty(), "duplicates: {dup:?}");
    let got: HashSet<Key> = counts.keys().copied().collect();
    assert_eq!(
        got.difference(&expected).count(),
        0,
        "records nobody accepted"
    );
    assert_eq!(
        expected.difference(&got).count(),
        0,
        "accepted records that never arrived"
    );

    // Redirection happened, and the cloud can tell: what the providers
    // took from node 1 is what they delivered, and nobody lent for them.
    assert!(
        carried.iter().sum::<usize>() > 0,
        "node 1 redirected nothing"
    );
    assert_eq!(lent.len(), carried.iter().sum::<usize>());
    assert!(seen
        .iter()
        .all(|s| s.batch_node == s.record.origin || s.record.origin == 1));

    let ls = ls_latencies_ms(&seen, 1);
    assert_eq!(ls.len(), ls_accepted);
    assert_ls_within_bound(&ls);
    let _ = std::fs::remove_dir_all(&c.dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_process_killed_mid_stream_loses_nothing_and_duplicates_are_counted() {
    let _serial = SERIAL.lock().await;
    let mut c = cluster("crash").await;
    let (finished, consumer) = consumer(&c.queue);
    let grpc = addrs(&c);

    // SIGKILL whichever provider first carries node 1's overflow, while it
    // holds some of it unacknowledged. "While the load lasts" is until the
    // offers have ended, not `LOAD` after they began: on a loaded machine
    // they take longer.
    let load_over = AtomicBool::new(false);
    let load = async {
        let offered = offer_all(grpc).await;
        load_over.store(true, Ordering::Release);
        offered
    };
    let killer = async {
        loop {
            // Read before looking, so that the last look starts after the
            // load ended.
            let over = load_over.load(Ordering::Acquire);
            for i in 1..=2 {
                let text = c.nodes[i].metrics().await;
                let took = metric(&text, "weir_peer_records_redirected_in_total");
                let held = metric(&text, "weir_peer_records_held");
                if took >= KILL_AFTER && held > 0.0 {
                    // Frozen, it can no longer acknowledge; node 1 says
                    // whether it still has records there (a provider
                    // delivers a batch in milliseconds, so what it held at
                    // the scrape may be settled by now).
                    c.nodes[i].signal("STOP");
                    // Acknowledgements it sent just before are read first.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let lent = metric(
                        &c.nodes[0].metrics().await,
                        &format!("weir_peer_records_lent{{peer=\"{}\"}}", i + 1),
                    );
                    if lent > 0.0 {
                        c.nodes[i].kill();
                        return (i, took, held);
                    }
                    c.nodes[i].signal("CONT");
                }
            }
            assert!(
                !over,
                "no provider took {KILL_AFTER} of node 1's records and held some while the load lasted"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let ((accepted, _), (victim, took, held)) = tokio::join!(load, killer);
    let survivor = 3 - victim;
    let victim_id = victim as u64 + 1;
    // Node 1 takes back what the killed node held once it sees the stream
    // break, which on a loaded machine may be after the offers ended.
    let node1 = &c.nodes[0];
    eventually_async(
        "node 1 to take back what the killed provider held",
        move || async move {
            metric(&node1.metrics().await, "weir_peer_records_requeued_total") > 0.0
        },
    )
    .await;
    let node1 = c.nodes[0].metrics().await;
    let taken_back = metric(&node1, "weir_peer_records_requeued_total") as usize;
    c.nodes[0].shut_down().await;
    // And says so where an operator looks, with the provider and count.
    let log = std::fs::read_to_string(&c.nodes[0].log).unwrap_or_default();
    let provider = format!("provider={victim_id}");
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains("forward stream lost; taking back unacknowledged records")
            && l.contains(&provider)
            && l.contains("records=")),
        "node 1 warns that it took records back from node {victim_id}: {}",
        c.nodes[0].log.display()
    );
    c.nodes[survivor].shut_down().await;
    finished.store(true, Ordering::Release);
    let seen = tokio::time::timeout(PATIENCE * 2, consumer)
        .await
        .expect("consumer ends")
        .unwrap();
    delete_queue(&c.queue).await;

    let counts = counts(&seen);
    let got: HashSet<Key> = counts.keys().copied().collect();
    let twice = duplicates(&seen);
    let victims_own_lost = accepted[victim].difference(&got).count();
    eprintln!(
        "node {victim_id} SIGKILLed holding {held} records (after taking {took}); node 1 took back {taken_back}; \
         seen {} ({} distinct), {} duplicates; node {victim_id}'s own records lost with it: {victims_own_lost} of {}",
        seen.len(),
        counts.len(),
        twice.len(),
        accepted[victim].len(),
    );

    // Nothing node 1 or the survivor accepted is lost; nothing appears that
    // nobody accepted. (The killed node's own queue died with it: that is
    // the loss of an in-memory queue, not of peering.)
    for i in [0, survivor] {
        let lost = accepted[i].difference(&got).count();
        assert_eq!(
            lost,
            0,
            "node {} accepted {} records and lost {lost}",
            i + 1,
            accepted[i].len()
        );
    }
    let all: HashSet<Key> = accepted.iter().flatten().copied().collect();
    assert_eq!(got.difference(&all).count(), 0, "records nobody accepted");

    // Node 1 took back what the killed node had not acknowledged as
    // delivered; the copies twice are exactly those it had delivered
    // anyway: one copy from the killed node, one from node 1 or the
    // survivor.
    assert!(taken_back > 0, "node 1 took nothing back");
    assert!(twice.len() <= taken_back);
    for (key, senders) in &twice {
        assert_eq!(key.0, 1, "{key:?} sent by {senders:?}");
        assert_eq!(senders.len(), 2, "{key:?} sent by {senders:?}");
        assert_eq!(
            senders.iter().filter(|&&n| n == victim_id).count(),
            1,
            "{key:?} sent by {senders:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&c.dir);
}
