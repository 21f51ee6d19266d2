//! Peering over mutual TLS between real `weir` processes: two nodes with
//! certificates from the fleet CA redirect overflow to each other; a node
//! with a certificate from another CA, and one whose valid certificate
//! names another node id, are refused before anything moves and receive no
//! records.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Child;
use std::time::Duration;

use common::peering::free_ports;
use common::pki::{Ca, Pair};
use common::process::{metric, scrape, spawn_weir, wait_port, write_config};
use common::{eventually_async, tmp};
use tokio_stream::wrappers::ReceiverStream;
use weir_proto::pb::ingress_client::IngressClient;
use weir_proto::pb::PublishRequest;

/// A node certificate: `<id>.node.weir` as a DNS subjectAltName, for both
/// ends of a connection.
fn node_cert(ca: &Ca, file: &str, id: u64) -> Pair {
    ca.issue(
        file,
        &format!("node-{id}"),
        &format!("subjectAltName=DNS:{id}.node.weir\nextendedKeyUsage=serverAuth,clientAuth\n"),
    )
}

struct Node {
    child: Child,
    admin: SocketAddr,
    grpc: SocketAddr,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Node {
    async fn metric(&self, name: &str) -> f64 {
        metric(&scrape(self.admin).await.unwrap_or_default(), name)
    }
}

/// Starts node `id` on `ports[id - 1]` (peer), with `peers` (ids), its
/// certificate `pair` and the CA `ca` it trusts.
fn start(dir: &Path, id: u64, ports: &[u16], peers: &[u64], pair: &Pair, ca: &Path) -> Node {
    let extra = free_ports(2);
    let admin: SocketAddr = format!("127.0.0.1:{}", extra[0]).parse().unwrap();
    let grpc: SocketAddr = format!("127.0.0.1:{}", extra[1]).parse().unwrap();
    let peers: Vec<String> = peers
        .iter()
        .map(|p| {
            format!(
                "{{ id = {p}, addr = \"127.0.0.1:{}\" }}",
                ports[*p as usize - 1]
            )
        })
        .collect();
    let link = if id == 1 {
        "uplink = \"1Mbit/s\"\n[egress.link]\nbandwidth = \"1Mbit/s\"\ndelay = \"20ms\""
    } else {
        "uplink = \"100Mbit/s\""
    };
    let out = dir.join(format!("out-{id}"));
    let config = format!(
        r#"[node]
id = {id}
[ingress.mqtt]
enabled = false
[ingress.grpc]
listen = "{grpc}"
[admin]
listen = "{admin}"
[egress.file]
dir = "{out}"
[peering]
listen = "127.0.0.1:{port}"
peers = [{peers}]
dead_after = "2s"
[peering.tls]
certfile = "{cert}"
keyfile = "{key}"
cafile = "{ca}"
[scheduler]
track_uplink = false
{link}
"#,
        out = out.display(),
        port = ports[id as usize - 1],
        peers = peers.join(", "),
        cert = pair.cert.display(),
        key = pair.key.display(),
        ca = ca.display(),
    );
    let path = write_config(dir, &format!("node-{id}.toml"), &config);
    let log = std::fs::File::create(dir.join(format!("node-{id}.log"))).unwrap();
    Node {
        child: spawn_weir(&path, log),
        admin,
        grpc,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_nodes_proven_by_the_fleet_ca_peer_and_receive_records() {
    let dir = tmp("peering-tls");
    let fleet = Ca::new(&dir, "fleet-ca");
    let other = Ca::new(&dir, "other-ca");
    let ports = free_ports(4);
    let nodes = [
        // 1 (overloaded) and 2 (idle): the fleet.
        start(
            &dir,
            1,
            &ports,
            &[2, 3, 4],
            &node_cert(&fleet, "n1", 1),
            &fleet.pair.cert,
        ),
        start(
            &dir,
            2,
            &ports,
            &[1],
            &node_cert(&fleet, "n2", 2),
            &fleet.pair.cert,
        ),
        // 3: a certificate for its own id, from another CA.
        start(
            &dir,
            3,
            &ports,
            &[1],
            &node_cert(&other, "n3", 3),
            &fleet.pair.cert,
        ),
        // 4: a valid fleet certificate, but node 2's.
        start(
            &dir,
            4,
            &ports,
            &[1],
            &node_cert(&fleet, "n4", 2),
            &fleet.pair.cert,
        ),
    ];
    for n in &nodes {
        wait_port(n.admin).await;
        wait_port(n.grpc).await;
    }
    eventually_async(
        "nodes 1 and 2 to see each other over mutual TLS",
        || async {
            nodes[0].metric("weir_peers_alive").await == 1.0
                && nodes[1].metric("weir_peers_alive").await == 1.0
        },
    )
    .await;

    // Overload node 1 (about 2.5 Mbit/s against its 1 Mbit/s uplink) for
    // a few seconds, so that it redirects to whoever it may.
    let mut client = IngressClient::connect(format!("http://{}", nodes[0].grpc))
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(256);
    let feeder = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        for i in 0..400u64 {
            tick.tick().await;
            for j in 0..12u64 {
                let req = PublishRequest {
                    stream: "bulk".into(),
                    payload: format!("{i:05}-{j:02}-{}", "x".repeat(240))
                        .into_bytes()
                        .into(),
                    id: i * 100 + j,
                };
                if tx.send(req).await.is_err() {
                    return;
                }
            }
        }
    });
    let mut acks = client
        .publish_stream(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let mut acked = 0;
    while let Ok(Some(_)) = acks.message().await {
        acked += 1;
    }
    feeder.await.unwrap();
    assert_eq!(acked, 4800, "every record offered to node 1 was accepted");

    eventually_async("node 1 to have redirected records to node 2", || async {
        nodes[0]
            .metric("weir_peer_records_redirected_out_total")
            .await
            > 0.0
    })
    .await;
    assert!(
        nodes[1]
            .metric("weir_peer_records_redirected_in_total")
            .await
            > 0.0
    );
    for (n, who) in [
        (&nodes[2], "node 3 (other CA)"),
        (&nodes[3], "node 4 (node 2's certificate)"),
    ] {
        assert_eq!(
            n.metric("weir_peer_records_redirected_in_total").await,
            0.0,
            "{who} received records"
        );
        assert_eq!(
            n.metric("weir_peers_alive").await,
            0.0,
            "{who} was never heard by node 1"
        );
    }
    let m1 = scrape(nodes[0].admin).await.unwrap();
    assert_eq!(metric(&m1, "weir_peers_alive"), 1.0, "{m1}");
    assert!(
        metric(&m1, "weir_peer_identity_refused_total") >= 1.0,
        "node 4 speaking as node 4 with node 2's certificate: {m1}"
    );
    assert!(
        m1.lines()
            .any(|l| l.starts_with("weir_tls_handshake_failures_total{listener=\"peering\"}")),
        "node 3's handshakes fail: {m1}"
    );
}
