//! A provider on its own: grants, admissions and refusals, its adverts, and what it acknowledges while it stops.

use super::*;

#[tokio::test]
async fn the_provider_answers_grants_admits_and_refuses() {
    let (mut node, mut client) = lone_provider().await;

    // Refused: a node not configured, and a node with other classes.
    let err = client
        .heartbeat(HeartbeatRequest {
            state: Some(state(9, &["ls", "nm", "lt"], &[0.0; 3], 1)),
            relayed: Vec::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert!(
        err.message()
            .contains("node 9 is not in peering.peers of node 2"),
        "{err}"
    );
    let err = client
        .heartbeat(HeartbeatRequest {
            state: Some(state(1, &["ls", "lt"], &[0.0; 2], 1)),
            relayed: Vec::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert!(
        err.message()
            .contains("node 1 has latency classes [ls, lt] but node 2 has [ls, nm, lt]"),
        "{err}"
    );

    // A heartbeat is answered with this node's state.
    let reply = client
        .heartbeat(HeartbeatRequest {
            state: Some(state(1, &["ls", "nm", "lt"], &[0.0, 0.0, -5000.0], 1)),
            relayed: Vec::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .state
        .unwrap();
    assert_eq!(reply.node, 2);
    // The PBTT tuple's 1,000,000 spare, less the headroom (weir-core
    // `peer::LEND_SHARE`).
    assert_eq!(
        reply.tuple,
        vec![weir_core::peer::LEND_SHARE * 1_000_000.0, 0.0, 0.0]
    );
    assert_eq!(reply.classes, vec!["ls", "nm", "lt"]);
    assert_eq!(node.handle.status().alive, vec![1]);

    // Reserve: granted, and the scheduler is told to shift (Fig. 4).
    let granted = client
        .reserve(ReserveRequest {
            receiver: 1,
            class: "lt".into(),
            bytes_per_sec: 5000.0,
            lease_ms: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(granted.granted_bytes_per_sec, 5000.0);
    assert_eq!(granted.lease_ms, 10_000);
    let shift = node.port.shifts.try_recv().unwrap();
    assert_eq!(
        (shift.provider, shift.receiver, shift.class, shift.amount),
        (2, 1, LT, 5000.0)
    );
    // A second class gets only what is left of the spare.
    let nm = client
        .reserve(ReserveRequest {
            receiver: 1,
            class: "nm".into(),
            bytes_per_sec: 2e6,
            // Shorter than the provider's 10 s: granted as asked. Long
            // enough to outlast the test (rounds, which expire
            // reservations, run at any point of it).
            lease_ms: 8000,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        nm.granted_bytes_per_sec,
        weir_core::peer::LEND_SHARE * 1_000_000.0 - 5000.0
    );
    assert_eq!(nm.lease_ms, 8000);
    let err = client
        .reserve(ReserveRequest {
            receiver: 1,
            class: "bulk".into(),
            bytes_per_sec: 1.0,
            lease_ms: 0,
        })
        .await
        .unwrap_err();
    assert!(err.message().contains("unknown class \"bulk\""), "{err}");

    // Forward: within the bucket (depth 512 KiB) accepted, the rest refused.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut acks = client
        .forward(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    // A receiver from before delivery acknowledgements: queued records
    // are answered as `accepted`, and the provider answers for them.
    tx.send(ForwardRequest {
        receiver: 1,
        records: vec![
            wire(1, 10, "lt"),
            wire(1, 11, "lt"),
            wire(1, 12, "ls"),
            wire(1, 13, "x"),
            // Entered weir at node 3, not at the sender: a second hop.
            wire(3, 14, "lt"),
        ],
        delivery_acks: false,
    })
    .await
    .unwrap();
    let ack = acks.message().await.unwrap().unwrap();
    let accepted: Vec<u64> = ack.accepted.iter().map(|id| id.seq).collect();
    assert_eq!(accepted, vec![10, 11]);
    // What was lent is kept for this node's own uplink: its forwarder
    // cannot take it.
    let lt = node.ingress.queues().class(LT);
    assert_eq!(lt.len(), 2);
    assert!(lt.pop_forwardable().is_none());
    let refused: Vec<(u64, RefusalReason)> = ack
        .refused
        .iter()
        .map(|r| {
            (
                r.id.unwrap().seq,
                RefusalReason::try_from(r.reason).unwrap(),
            )
        })
        .collect();
    assert_eq!(
        refused,
        vec![
            (12, RefusalReason::NoReservation),
            (13, RefusalReason::UnknownClass),
            (14, RefusalReason::HopLimit)
        ]
    );
    // The bucket holds 512 KiB: about 2,000 records of 250 bytes pass, the
    // rest of 3,000 sent at once is over the rate.
    let burst: Vec<pb::Record> = (100..3100).map(|s| wire(1, s, "lt")).collect();
    tx.send(ForwardRequest {
        receiver: 1,
        records: burst,
        delivery_acks: false,
    })
    .await
    .unwrap();
    let ack = acks.message().await.unwrap().unwrap();
    assert!(
        ack.accepted.len() > 1500 && ack.accepted.len() < 2500,
        "{}",
        ack.accepted.len()
    );
    assert_eq!(ack.accepted.len() + ack.refused.len(), 3000);
    assert!(ack
        .refused
        .iter()
        .all(|r| r.reason == RefusalReason::OverRate as i32));
    assert_eq!(node.peer().held.get(), 0, "old-style records are not held");
    drop(tx);
    assert!(
        acks.message().await.unwrap().is_none(),
        "the stream ends cleanly"
    );

    // Accepted records are in the lt queue with their identity intact.
    let queued = node.queued(LT);
    assert_eq!(queued.len(), 2 + ack.accepted.len());
    assert_eq!(queued[0].origin, 1);
    assert_eq!(queued[0].seq, 10);
    assert_eq!(queued[0].ingress_us, 1_010);
    assert_eq!(&queued[0].key[..], b"sensors/a");
    assert_eq!(node.peer().redirected_in_total(), queued.len() as u64);

    // A receiver that wants delivery acknowledgements: its records are
    // answered as `queued`, and acknowledged again once delivered, on the
    // stream that sent them. A half-closed stream stays open until then.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut acks = client
        .forward(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    // The bucket refills at 5 kB/s: wait for room for two records.
    tokio::time::sleep(Duration::from_millis(200)).await;
    tx.send(ForwardRequest {
        receiver: 1,
        records: vec![wire(1, 5000, "lt"), wire(1, 5001, "lt")],
        delivery_acks: true,
    })
    .await
    .unwrap();
    let ack = acks.message().await.unwrap().unwrap();
    let ids = |v: &[pb::RecordId]| v.iter().map(|id| id.seq).collect::<Vec<_>>();
    assert_eq!(ids(&ack.queued), vec![5000, 5001], "{ack:?}");
    assert!(ack.accepted.is_empty() && ack.refused.is_empty() && ack.delivered.is_empty());
    assert_eq!(node.peer().held.get(), 2);
    drop(tx);
    let mut pending = tokio::spawn(async move {
        let next = acks.message().await;
        (next, acks)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !pending.is_finished(),
        "no acknowledgement, and no end, before delivery"
    );
    // This node's egress confirms a batch with one of them and a record of
    // its own; then one with the other.
    let mut first = node.queued(LT);
    assert_eq!(first.len(), 2);
    let second = first.split_off(1);
    let own = node.ingress.grpc_record("bulk", Bytes::from_static(b"own"));
    first.push(own);
    node.deliveries.delivered(&receipts(&first));
    let (next, mut acks) = tokio::time::timeout(PATIENCE, &mut pending)
        .await
        .expect("acknowledged")
        .unwrap();
    let ack = next.unwrap().unwrap();
    assert_eq!(ids(&ack.delivered), vec![5000]);
    assert!(ack.accepted.is_empty() && ack.queued.is_empty() && ack.refused.is_empty());
    node.deliveries.delivered(&receipts(&second));
    node.deliveries.delivered(&receipts(&second));
    let ack = acks.message().await.unwrap().unwrap();
    assert_eq!(ids(&ack.delivered), vec![5001], "acknowledged once");
    assert!(
        acks.message().await.unwrap().is_none(),
        "nothing owed any more: the stream ends cleanly"
    );
    assert_eq!(node.peer().held.get(), 0);

    let text = node.ingress.metrics().render();
    for line in [
        format!(
            "weir_peer_records_redirected_in_total{{class=\"lt\"}} {}",
            queued.len() + 2
        ),
        "weir_peer_records_refused_total{class=\"ls\",reason=\"no_reservation\"} 1".to_owned(),
        "weir_peer_reservations_active 2".to_owned(),
    ] {
        assert!(text.contains(&line), "{line} not in:\n{text}");
    }

    // Killed: calls go unanswered, as after a power cut, until it stops.
    node.handle.kill();
    let mut silent = client.clone();
    let call = tokio::spawn(async move {
        silent
            .heartbeat(HeartbeatRequest {
                state: Some(state(1, &["ls", "nm", "lt"], &[0.0; 3], 2)),
                relayed: Vec::new(),
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!call.is_finished(), "a killed node does not answer");
    node.stop.cancel();
    let err = call.await.unwrap().unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    node.stop.cancel();
    tokio::time::timeout(PATIENCE, node.tracker.wait())
        .await
        .expect("peering stops");
}

/// Every heartbeat and reply of one period carries the same advert, taken
/// at the period's first use, so nodes that match within the period match
/// on the same tuples; the scheduler's newer tuple waits for the next one.
#[tokio::test]
async fn a_period_advertises_one_tuple() {
    let (peering, ingress) = bind(2, CAPACITY).await;
    let addr = peering.local_addr();
    // An hour: the test runs within one period (unless it straddles a
    // boundary, which the loop below retries).
    let hour = Duration::from_secs(3600);
    let node = start(
        peering,
        ingress,
        &[(1, "127.0.0.1:9".parse().unwrap())],
        hour,
    );
    let mut client = PeerClient::connect(format!("http://{addr}")).await.unwrap();
    async fn ask(client: &mut PeerClient<tonic::transport::Channel>, round: u64) -> pb::NodeState {
        client
            .heartbeat(HeartbeatRequest {
                state: Some(state(1, &["ls", "nm", "lt"], &[0.0; 3], round)),
                relayed: Vec::new(),
            })
            .await
            .unwrap()
            .into_inner()
            .state
            .unwrap()
    }
    let period = || weir_core::peer::period_of(unix_micros(), hour);
    for attempt in 1u64.. {
        let started = period();
        node.publish(&[1_000_000.0 * attempt as f64, 0.0, 0.0]);
        let first = ask(&mut client, attempt * 2).await;
        node.publish(&[5.0, 0.0, 0.0]);
        let second = ask(&mut client, attempt * 2 + 1).await;
        if period() != started {
            continue;
        }
        // Whatever the first use of the period saw (this attempt's tuple,
        // or an earlier one if a heartbeat went out before), the second
        // reply says the same, with the same round, and not the newer 5.
        assert_eq!(second.tuple, first.tuple);
        assert_eq!(second.round, first.round);
        assert_ne!(second.tuple, vec![4.5, 0.0, 0.0]);
        break;
    }
}

#[tokio::test]
async fn a_stopping_provider_acknowledges_what_it_holds_before_it_ends_the_stream() {
    let (node, mut client) = lone_provider().await;
    let granted = client
        .reserve(ReserveRequest {
            receiver: 1,
            class: "lt".into(),
            bytes_per_sec: 100_000.0,
            lease_ms: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(granted.granted_bytes_per_sec, 100_000.0);
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut acks = client
        .forward(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let request = |seqs: &[u64]| ForwardRequest {
        receiver: 1,
        records: seqs.iter().map(|&s| wire(1, s, "lt")).collect(),
        delivery_acks: true,
    };
    tx.send(request(&[1, 2])).await.unwrap();
    let ack = acks.message().await.unwrap().unwrap();
    assert_eq!(ack.queued.len(), 2, "{ack:?}");

    // Stopping (in weir, ingress and peering share the token): new records
    // are refused, but the stream stays open for the two it holds.
    node.ingress.shutdown().cancel();
    node.stop.cancel();
    tx.send(request(&[3])).await.unwrap();
    let ack = acks.message().await.unwrap().unwrap();
    assert!(ack.queued.is_empty(), "{ack:?}");
    assert_eq!(
        ack.refused
            .iter()
            .map(|r| (r.id.unwrap().seq, r.reason))
            .collect::<Vec<_>>(),
        vec![(3, RefusalReason::ShuttingDown as i32)]
    );
    let mut pending = tokio::spawn(async move {
        let next = acks.message().await;
        (next, acks)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!pending.is_finished(), "held records are still owed");

    // Its scheduler and egress run on and deliver them: acknowledged, and
    // only then does the stream end, as a shutdown.
    let held = node.queued(LT);
    assert_eq!(held.len(), 2);
    node.deliveries.delivered(&receipts(&held));
    let (next, mut acks) = tokio::time::timeout(PATIENCE, &mut pending)
        .await
        .expect("acknowledged")
        .unwrap();
    let ack = next.unwrap().unwrap();
    let mut delivered: Vec<u64> = ack.delivered.iter().map(|id| id.seq).collect();
    delivered.sort_unstable();
    assert_eq!(delivered, vec![1, 2]);
    let end = acks.message().await.unwrap_err();
    assert_eq!(end.code(), tonic::Code::Unavailable, "{end}");
    drop(tx);
    tokio::time::timeout(PATIENCE, node.tracker.wait())
        .await
        .expect("peering stops");
    assert_eq!(node.peer().held.get(), 0);
}
