//! Three nodes: peers added and dropped by a reload, adverts by gossip, heartbeats that do not relay.

use super::*;

#[tokio::test]
async fn a_reload_adds_and_drops_peers_in_place() {
    let heartbeat = Duration::from_millis(50);
    let (pa, ia) = bind(1, CAPACITY).await;
    let (pb_, ib) = bind(2, CAPACITY).await;
    let (addr_a, addr_b) = (pa.local_addr(), pb_.local_addr());
    let a = start(pa, ia, &[], heartbeat);
    let b = start(pb_, ib, &[(1, addr_a)], heartbeat);
    // A does not know B: it refuses B's heartbeats and sends none.
    tokio::time::sleep(heartbeat * 6).await;
    assert!(a.handle.status().alive.is_empty());
    assert!(b.handle.status().alive.is_empty());

    let (added, dropped) = a
        .handle
        .set_peers(cfg(&[(2, addr_b)], heartbeat).peers)
        .unwrap();
    assert_eq!((added, dropped), (vec![2], vec![]));
    until("A and B hear each other", || {
        a.handle.status().alive == vec![2] && b.handle.status().alive == vec![1]
    })
    .await;

    let (added, dropped) = a.handle.set_peers(Vec::new()).unwrap();
    assert_eq!((added, dropped), (vec![], vec![2]));
    assert!(a.handle.status().alive.is_empty(), "forgotten at once");
    // A refuses B again and stops heartbeating it: B sees A gone.
    until("B sees A gone", || b.handle.status().alive.is_empty()).await;
    tokio::time::sleep(heartbeat * 4).await;
    assert!(
        a.handle.status().alive.is_empty(),
        "B is refused, not heard"
    );
    a.stop.cancel();
    b.stop.cancel();
    a.tracker.wait().await;
    b.tracker.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gossip_carries_adverts_past_a_missing_link_and_lets_the_dead_go() {
    let gossip = crate::config::Adverts::Gossip {
        fanout: 1,
        every: Duration::from_millis(100),
    };
    let (seen, nodes) = three_in_a_line(gossip).await;
    let [n1, n2, n3] = &nodes;
    until("node 1 hears 3 through 2", || {
        n1.handle.status().alive == vec![2, 3]
    })
    .await;
    until("node 3 hears 1 through 2", || {
        n3.handle.status().alive == vec![1, 2]
    })
    .await;
    assert!(seen.contains(&2), "{seen:?}");
    assert!(n1.peer().advert_bytes.get() > 0);
    // Node 3 goes silent: gone from 1 and 2 once its last advert is
    // dead_after old, however often it was relayed since; and not brought
    // back by a relayed copy after that.
    n3.handle.kill();
    until("node 1 and 2 see 3 gone", || {
        n1.handle.status().alive == vec![2] && n2.handle.status().alive == vec![1]
    })
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(n1.handle.status().alive, vec![2]);
    assert_eq!(n2.handle.status().alive, vec![1]);
    stop_all(nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_to_every_peer_do_not_relay() {
    let (seen, nodes) = three_in_a_line(crate::config::Adverts::AllToAll).await;
    assert_eq!(seen, vec![2], "node 1 heard 3 without gossip");
    assert_eq!(nodes[2].handle.status().alive, vec![2]);
    stop_all(nodes).await;
}
