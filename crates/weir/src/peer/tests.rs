//! Peering over loopback without brokers: the service's answers and
//! refusals, delivery acknowledgements, and two nodes redirecting to each
//! other, one of them killed mid-stream. A task stands in for the
//! provider's egress: it takes records out of the queue and reports them
//! delivered, as the real egress does after a confirm.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use weir_core::classify::Classifier;
use weir_core::janus::scheme::Scheme;
use weir_core::janus::{BandwidthTuple, Strategy};
use weir_core::peer::BandwidthState;
use weir_core::queueing::queue::{MultiLevelQueue, QueueCapacity};
use weir_core::{ClassId, ClassSet, NodeId, Record};
use weir_proto::pb::peer_client::PeerClient;
use weir_proto::pb::{self, ForwardRequest, HeartbeatRequest, RefusalReason, ReserveRequest};

use super::*;
use crate::config::{BrokerAddr, PeerConfig, PeeringConfig};
use crate::egress::DeliveryObserver;
use crate::metrics::Metrics;
use crate::metrics::PeerMetrics;

const LT: ClassId = ClassId(2);

/// Bounds every wait so that a broken test fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(30);

/// One node's peering, its queues and the scheduler's end of the port.
struct TestNode {
    handle: PeeringHandle,
    ingress: Arc<Intake>,
    deliveries: Arc<Deliveries>,
    port: PeerPort,
    stop: CancellationToken,
    tracker: TaskTracker,
}

impl TestNode {
    fn publish(&self, tuple: &[f64]) {
        self.port
            .state
            .send_replace(BandwidthState::from_tuple(BandwidthTuple(tuple.to_vec())));
    }

    fn queued(&self, class: ClassId) -> Vec<Record> {
        let q = self.ingress.queues().class(class);
        std::iter::from_fn(|| q.pop()).collect()
    }

    fn peer(&self) -> &PeerMetrics {
        &self.ingress.metrics().peer
    }

    /// Plays this node's egress: every few milliseconds takes what is in
    /// its lt queue and reports it delivered, until `done` fires; returns
    /// everything it delivered.
    fn egress(&self, done: CancellationToken) -> tokio::task::JoinHandle<Vec<Record>> {
        self.paced_egress(done, usize::MAX)
    }

    /// An egress that delivers at most `per_tick` records every 5 ms.
    fn paced_egress(
        &self,
        done: CancellationToken,
        per_tick: usize,
    ) -> tokio::task::JoinHandle<Vec<Record>> {
        let (ingress, deliveries) = (Arc::clone(&self.ingress), Arc::clone(&self.deliveries));
        tokio::spawn(async move {
            let mut all = Vec::new();
            loop {
                let q = ingress.queues().class(LT);
                let batch: Vec<Record> = std::iter::from_fn(|| q.pop()).take(per_tick).collect();
                deliveries.delivered(&receipts(&batch));
                all.extend(batch);
                // Cancel safety: both branches only wait.
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(5)) => {}
                    _ = done.cancelled() => return all,
                }
            }
        })
    }
}

fn cfg(peers: &[(NodeId, SocketAddr)], heartbeat: Duration) -> PeeringConfig {
    PeeringConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        peers: peers
            .iter()
            .map(|&(id, addr)| PeerConfig {
                id,
                addr: BrokerAddr {
                    host: addr.ip().to_string(),
                    port: addr.port(),
                },
            })
            .collect(),
        heartbeat,
        heartbeat_jitter: 0.3,
        dead_after: heartbeat * 5,
        adverts: crate::config::Adverts::AllToAll,
        lease: heartbeat * 10,
        tls: None,
    }
}

/// Queue capacity of the test nodes: room for every record of a test.
const CAPACITY: QueueCapacity = QueueCapacity {
    records: 20_000,
    bytes: 64 << 20,
};

async fn bind(id: NodeId, capacity: QueueCapacity) -> (Peering, Arc<Intake>) {
    let classes = ClassSet::janus_default();
    let queues = Arc::new(MultiLevelQueue::uniform(&classes, capacity));
    let metrics = Arc::new(Metrics::new(&classes));
    let ingress = Arc::new(Intake::new(
        id,
        classes,
        Classifier::new(Vec::new(), LT).unwrap(),
        queues,
        id * 1_000_000,
        CancellationToken::new(),
        metrics,
    ));
    let peering = Peering::bind(cfg(&[], Duration::from_secs(1)))
        .await
        .unwrap();
    (peering, ingress)
}

/// Node 2 with 1,000,000 B/s spare in `ls`, and a client of its peer
/// service. Node 1 is configured but never runs; heartbeats to it just fail.
async fn lone_provider() -> (TestNode, PeerClient<tonic::transport::Channel>) {
    let (peering, ingress) = bind(2, CAPACITY).await;
    let addr = peering.local_addr();
    let node = start(
        peering,
        ingress,
        &[(1, "127.0.0.1:9".parse().unwrap())],
        Duration::from_secs(1),
    );
    node.publish(&[1_000_000.0, 0.0, 0.0]);
    let client = PeerClient::connect(format!("http://{addr}")).await.unwrap();
    (node, client)
}

/// Starts `peering` with `peers` and this heartbeat.
fn start(
    peering: Peering,
    ingress: Arc<Intake>,
    peers: &[(NodeId, SocketAddr)],
    heartbeat: Duration,
) -> TestNode {
    start_cfg(peering, ingress, cfg(peers, heartbeat))
}

/// Starts `peering` with `config` (its listen address and TLS kept).
fn start_cfg(mut peering: Peering, ingress: Arc<Intake>, config: PeeringConfig) -> TestNode {
    let tls = peering.cfg.tls.take();
    peering.cfg = config;
    peering.cfg.listen = peering.addr;
    peering.cfg.tls = tls;
    let port = peering.scheduler_port().unwrap();
    let deliveries = peering.deliveries();
    let stop = CancellationToken::new();
    let tracker = TaskTracker::new();
    let handle = peering
        .start(
            Scheme::Janus(Strategy::Pmrfs),
            Arc::clone(&ingress),
            stop.clone(),
            CancellationToken::new(),
            &tracker,
        )
        .unwrap();
    tracker.close();
    TestNode {
        handle,
        ingress,
        deliveries,
        port,
        stop,
        tracker,
    }
}

fn state(node: NodeId, classes: &[&str], tuple: &[f64], round: u64) -> pb::NodeState {
    pb::NodeState {
        node,
        classes: classes.iter().map(|c| c.to_string()).collect(),
        tuple: tuple.to_vec(),
        round,
        sent_us: 0,
        requesting_since_us: 0,
        scheme: "pmrfs".into(),
    }
}

fn wire(origin: NodeId, seq: u64, class: &str) -> pb::Record {
    pb::Record {
        key: "sensors/a".into(),
        class: class.into(),
        origin,
        seq,
        ingress_us: 1_000 + seq,
        payload: Bytes::from(vec![seq as u8; 200]),
    }
}

/// Fills `node`'s lt queue with `n` records stamped by it.
fn fill(node: &TestNode, n: usize) {
    for i in 0..n {
        let r = node
            .ingress
            .grpc_record("bulk", Bytes::from(format!("{i:06}-{}", "x".repeat(240))));
        node.ingress.try_enqueue(r).unwrap();
    }
}

/// Nodes 1 (A) and 2 (B), each with the other as its only peer.
async fn pair(heartbeat: Duration) -> (TestNode, TestNode) {
    let (pa, ia) = bind(1, CAPACITY).await;
    let (pb_, ib) = bind(2, CAPACITY).await;
    let (addr_a, addr_b) = (pa.local_addr(), pb_.local_addr());
    (
        start(pa, ia, &[(2, addr_b)], heartbeat),
        start(pb_, ib, &[(1, addr_a)], heartbeat),
    )
}

/// Copies of each of the `n` records [`fill`] made (by sequence number)
/// among those `delivered` and those still `queued`, and how many of them
/// are in neither.
fn copies_of(n: usize, delivered: &[Record], queued: &[Record]) -> (HashMap<u64, usize>, usize) {
    let mut copies: HashMap<u64, usize> = HashMap::new();
    for r in delivered.iter().chain(queued) {
        *copies.entry(r.seq).or_default() += 1;
    }
    let missing = (0..n as u64)
        .map(|i| 1_000_000 + i)
        .filter(|s| !copies.contains_key(s))
        .count();
    (copies, missing)
}

/// Stops A and B (A asking for nothing first), waits for their peering to
/// end, then B's `egress`: what B delivered, and what is still queued at
/// either.
async fn stop_pair(
    a: &TestNode,
    b: &TestNode,
    egress_done: CancellationToken,
    egress: tokio::task::JoinHandle<Vec<Record>>,
) -> (Vec<Record>, Vec<Record>) {
    a.publish(&[0.0, 0.0, 0.0]);
    a.stop.cancel();
    b.stop.cancel();
    for node in [a, b] {
        tokio::time::timeout(PATIENCE, node.tracker.wait())
            .await
            .expect("peering stops");
    }
    egress_done.cancel();
    let delivered = egress.await.unwrap();
    let mut queued = a.queued(LT);
    queued.extend(b.queued(LT));
    (delivered, queued)
}

/// What [`redirect_between_two`] leaves behind.
struct Outcome {
    a: TestNode,
    b: TestNode,
    /// Records B's egress delivered.
    delivered: Vec<Record>,
    /// Records left in either node's lt queue at the end.
    queued: Vec<Record>,
}

/// Two nodes, A short in lt and B with spare: A's view matches it with B,
/// B grants, A forwards, B's egress delivers; then (`kill` set) B's peering
/// dies mid-stream while its egress runs on.
async fn redirect_between_two(n: usize, rate: f64, kill: bool) -> Outcome {
    let (a, b) = pair(Duration::from_millis(50)).await;
    let egress_done = CancellationToken::new();
    let egress = b.egress(egress_done.clone());
    a.publish(&[0.0, 0.0, -rate]);
    b.publish(&[rate * 10.0, 0.0, 0.0]);
    fill(&a, n);

    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut killed = false;
    loop {
        let moved = b.peer().redirected_in_total();
        if kill && !killed && moved > (n / 4) as u64 {
            b.handle.kill();
            killed = true;
        }
        let done = if kill {
            // A has taken back what B never acknowledged, and B's egress
            // has delivered what B had queued.
            killed
                && a.handle.status().leases.is_empty()
                && b.ingress.queues().class(LT).is_empty()
                && a.ingress.queues().class(LT).len() as u64 + a.peer().redirected_out_total()
                    >= n as u64
        } else {
            a.ingress.queues().class(LT).is_empty() && a.peer().redirected_out_total() == n as u64
        };
        if done {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "stuck: {moved} moved, status {:?}",
            a.handle.status()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Stop both; A's forwarder hands back what B did not acknowledge.
    let (delivered, queued) = stop_pair(&a, &b, egress_done, egress).await;
    Outcome {
        a,
        b,
        delivered,
        queued,
    }
}

/// The integration tests' PKI helpers (`openssl`, as an operator runs it).
#[allow(dead_code)]
#[path = "../../tests/common/pki.rs"]
mod pki;

/// A fleet CA and certificates for nodes 1 and 2 (`DNS:<id>.node.weir`) in
/// a fresh directory: the `[peering.tls]` files of each node.
fn node_pki() -> [crate::config::TlsFiles; 2] {
    let dir = std::env::temp_dir().join(format!("weir-peer-pki-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let ca = pki::Ca::new(&dir, "fleet");
    [1u64, 2].map(|id| {
        let pair = ca.issue(
            &format!("n{id}"),
            &format!("node-{id}"),
            &format!("subjectAltName=DNS:{id}.node.weir\nextendedKeyUsage=serverAuth,clientAuth\n"),
        );
        crate::config::TlsFiles {
            certfile: pair.cert,
            keyfile: pair.key,
            cafile: Some(ca.pair.cert.clone()),
            require_certificate: true,
        }
    })
}

/// Records of 256 B per second forwarded from node 1 to node 2 until node 2
/// has delivered and acknowledged them all, over plain HTTP/2 or with
/// `tls` (each node's `[peering.tls]` files).
async fn forward_rate(tls: Option<&[crate::config::TlsFiles; 2]>) -> f64 {
    const N: usize = 300_000;
    let capacity = QueueCapacity {
        records: N,
        bytes: 256 << 20,
    };
    let heartbeat = Duration::from_millis(50);
    let (mut pa, ia) = bind(1, capacity).await;
    let (mut pb_, ib) = bind(2, capacity).await;
    if let Some([ta, tb]) = tls {
        for (p, files) in [(&mut pa, ta), (&mut pb_, tb)] {
            p.security = Some(crate::security::PeerSecurity::load(files).unwrap());
            p.cfg.tls = Some(files.clone());
        }
    }
    let (addr_a, addr_b) = (pa.local_addr(), pb_.local_addr());
    let a = start(pa, ia, &[(2, addr_b)], heartbeat);
    let b = start(pb_, ib, &[(1, addr_a)], heartbeat);
    b.publish(&[1e9, 0.0, 0.0]);
    let egress_done = CancellationToken::new();
    let _egress = b.egress(egress_done.clone());
    // 256-byte payloads, as the goal says.
    for i in 0..N {
        let mut payload = format!("{i:08}").into_bytes();
        payload.resize(256, b'x');
        let r = a.ingress.grpc_record("bulk", Bytes::from(payload));
        a.ingress.try_enqueue(r).unwrap();
    }
    // Wait until B is known, then ask for far more than a loopback carries.
    while a.handle.status().alive.is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let start = tokio::time::Instant::now();
    a.publish(&[0.0, 0.0, -1e9]);
    let deadline = start + Duration::from_secs(120);
    while b.peer().redirected_in_total() < N as u64 {
        assert!(tokio::time::Instant::now() < deadline, "stuck");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let queued = start.elapsed();
    // Until A forgot them all: B delivered each and acknowledged it.
    while a.peer().redirected_out_total() < N as u64 {
        assert!(tokio::time::Instant::now() < deadline, "stuck");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let took = start.elapsed();
    let rate = N as f64 / took.as_secs_f64();
    let bytes = N as f64 * (256.0 + 4.0 + 32.0);
    eprintln!(
        "{}: forwarded {N} records of 256 B in {took:.2?} (all queued at B after {queued:.2?}): {rate:.0} records/s, {:.1} MB/s (record sizes), first round included, delivery acknowledged",
        if tls.is_some() { "mutual TLS" } else { "plain" },
        bytes / took.as_secs_f64() / 1e6
    );
    egress_done.cancel();
    a.stop.cancel();
    b.stop.cancel();
    rate
}

/// Polls until `done` holds (5 s at most).
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Three nodes, 1 and 3 unable to reach each other (each has a dead
/// address for the other), 2 reaching both. Returns what node 1 sees alive
/// once node 2 sees both (and more, with gossip), and the nodes.
async fn three_in_a_line(adverts: crate::config::Adverts) -> (Vec<NodeId>, [TestNode; 3]) {
    let heartbeat = Duration::from_millis(50);
    let dead: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let (p1, i1) = bind(1, CAPACITY).await;
    let (p2, i2) = bind(2, CAPACITY).await;
    let (p3, i3) = bind(3, CAPACITY).await;
    let (a1, a2, a3) = (p1.local_addr(), p2.local_addr(), p3.local_addr());
    let config = |peers: &[(NodeId, SocketAddr)]| PeeringConfig {
        adverts,
        dead_after: Duration::from_millis(600),
        ..cfg(peers, heartbeat)
    };
    let n1 = start_cfg(p1, i1, config(&[(2, a2), (3, dead)]));
    let n2 = start_cfg(p2, i2, config(&[(1, a1), (3, a3)]));
    let n3 = start_cfg(p3, i3, config(&[(1, dead), (2, a2)]));
    until("node 2 hears 1 and 3", || {
        n2.handle.status().alive == vec![1, 3]
    })
    .await;
    // Every node has gossiped a few times (with all-to-all, heartbeated).
    tokio::time::sleep(Duration::from_millis(800)).await;
    (n1.handle.status().alive, [n1, n2, n3])
}

async fn stop_all(nodes: [TestNode; 3]) {
    for n in &nodes {
        n.stop.cancel();
    }
    for n in &nodes {
        n.tracker.wait().await;
    }
}

/// What the egress tells its observers of `records` once confirmed.
fn receipts(records: &[Record]) -> Vec<weir_core::Receipt> {
    records.iter().map(weir_core::Receipt::from).collect()
}

mod mesh;
mod provider;
mod redirect;
