//! Peering's decisions on a virtual clock: views, rounds, reservations,
//! leases, in-flight records and custody, with property tests.

use super::*;
use std::collections::HashMap;
use std::time::Duration;

use crate::class::ClassId;
use crate::janus::{Allocation, BandwidthTuple, Grant, Offer, Strategy};
use crate::queueing::token_bucket::Take;
use crate::record::{NodeId, Record};
// Our `Strategy` enum, not proptest's trait.
use crate::janus::apply_grant;
use bytes::Bytes;
use proptest::prelude::*;

const E1: NodeId = 1;
const E2: NodeId = 2;
const LT: ClassId = ClassId(2);
const MS: Duration = Duration::from_millis(1);

fn at(ms: u64) -> Duration {
    MS * ms as u32
}

fn tuple(v: &[f64]) -> BandwidthTuple {
    BandwidthTuple(v.to_vec())
}

/// A node at `v`, late (so it lends no more than its tuple shows), with
/// `C_out` 100 and own traffic 20.
fn late(v: &[f64]) -> BandwidthState {
    BandwidthState {
        tuple: tuple(v),
        capacity: 100.0,
        own_rate: 20.0,
        late: true,
        ..BandwidthState::default()
    }
}

fn advert(round: u64, v: &[f64], since: u64) -> Advert {
    Advert {
        round,
        tuple: tuple(v),
        requesting_since_us: since,
    }
}

fn config() -> ReservationConfig {
    ReservationConfig {
        lease: Duration::from_secs(1),
        pacing: Pacing {
            burst: Duration::from_secs(1),
            min_burst: 1.0,
        },
    }
}

fn record(origin: NodeId, seq: u64) -> Record {
    Record {
        key: Bytes::from_static(b"k"),
        class: LT,
        origin,
        seq,
        ingress_us: seq,
        payload: Bytes::from(vec![0u8; 7]),
        spool: None,
    }
}

#[test]
fn fig_4_end_to_end() {
    // E1 at [10, 10, 10] bursts in lt and asks [0, 0, -5]; E2 at
    // [18, 10, 2] advertises [8, 0, 0].
    let e1 = advert(1, &[0.0, 0.0, -5.0], 1_000);
    let e2 = advert(1, &[8.0, 0.0, 0.0], 0);
    let mut e2_alloc = Allocation {
        rates: vec![18.0, 10.0, 2.0],
    };
    let mut e2_tuple = e2.tuple.clone();

    // Each node decides on its own view; both reach the same matching.
    let mut e1_view = PeerView::new(Duration::from_millis(500));
    assert_eq!(e1_view.observe(E2, e2.clone(), at(0)), Observed::Joined);
    let mut e2_view = PeerView::new(Duration::from_millis(500));
    e2_view.observe(E1, e1.clone(), at(0));
    let want = Grant {
        provider: E2,
        receiver: E1,
        class: LT,
        amount: 5.0,
    };
    assert_eq!(
        decide(Strategy::Pmrfs, E1, &e1, &e1_view, at(10)),
        vec![want]
    );
    assert!(decide(Strategy::Pmrfs, E2, &e2, &e2_view, at(10)).is_empty());
    assert_eq!(
        match_nodes(
            Strategy::Pmrfs,
            [(E2, &e2.tuple, 0), (E1, &e1.tuple, 1_000)]
        ),
        vec![want]
    );

    // E1 asks E2 to reserve [0, 0, 5]; E2 has 8 spare and grants it all.
    let mut e2_res = Reservations::new(E2, config());
    let r = e2_res.grant(E1, LT, 5.0, Duration::ZERO, at(10), e2_tuple.spare_total());
    assert_eq!(r.amount, 5.0);
    assert_eq!(r.lease, Duration::from_secs(1));
    assert_eq!(r.shift, Some(want));
    // The shift [5 down, 0, 5 up]: [18, 10, 2] -> [13, 10, 7].
    assert_eq!(
        apply_grant(&mut e2_alloc, &mut e2_tuple, &r.shift.unwrap()),
        5.0
    );
    assert_eq!(e2_alloc.rates, vec![13.0, 10.0, 7.0]);
    assert_eq!(e2_tuple, tuple(&[3.0, 0.0, 0.0]));

    // E1 sends 5 units/s of lt; E2 admits that and refuses more.
    let mut e1_leases = Leases::new(config().pacing);
    e1_leases.set(E2, LT, r.amount, at(10) + r.lease, at(10));
    assert_eq!(e1_leases.active(E2, at(10)), vec![LT]);
    for _ in 0..5 {
        assert_eq!(e1_leases.take(E2, LT, 1, at(10)), Take::Granted);
        assert_eq!(e2_res.admit(E1, LT, 1, at(10)), Admission::Accepted);
    }
    assert!(matches!(e1_leases.take(E2, LT, 1, at(10)), Take::Wait(_)));
    assert_eq!(e2_res.admit(E1, LT, 1, at(10)), Admission::OverRate);
    // A fifth of a second later, one more unit has accrued.
    assert_eq!(e2_res.admit(E1, LT, 1, at(210)), Admission::Accepted);
    assert_eq!(
        e2_res.admit(E1, ClassId(0), 1, at(210)),
        Admission::NoReservation
    );
}

#[test]
fn a_renewal_replaces_the_reservation_instead_of_adding_to_it() {
    let mut res = Reservations::new(E2, config());
    assert_eq!(
        res.grant(E1, LT, 6.0, Duration::ZERO, at(0), 10.0).amount,
        6.0
    );
    let again = res.grant(E1, LT, 6.0, Duration::ZERO, at(100), 10.0);
    assert_eq!(again.amount, 6.0);
    assert_eq!(again.shift, None, "nothing grew");
    assert_eq!(res.reserved(), 6.0);
    // Another receiver gets only what is left.
    assert_eq!(
        res.grant(3, LT, 6.0, Duration::ZERO, at(100), 10.0).amount,
        4.0
    );
    // A smaller renewal frees room, and needs no shift.
    let smaller = res.grant(E1, LT, 2.0, Duration::ZERO, at(200), 10.0);
    assert_eq!((smaller.amount, smaller.shift), (2.0, None));
    let grown = res.grant(3, LT, 9.0, Duration::ZERO, at(200), 10.0);
    assert_eq!(grown.amount, 8.0);
    assert_eq!(grown.shift.map(|g| g.amount), Some(4.0));
    // Asking for nothing releases.
    assert_eq!(
        res.grant(3, LT, 0.0, Duration::ZERO, at(200), 10.0).amount,
        0.0
    );
    assert_eq!(res.reserved_for(3, LT), 0.0);
    assert_eq!(res.len(), 1);
    assert_eq!(res.release_all(E1), 2.0);
    assert!(res.is_empty());
}

#[test]
fn divergent_views_never_overload_the_provider() {
    // Three receivers each short 6 of lt; one provider with 10 spare.
    let p: NodeId = 10;
    let short = [0.0, 0.0, -6.0];
    let provider = advert(1, &[10.0, 0.0, 0.0], 0);
    let receivers: [NodeId; 3] = [1, 2, 3];
    let own = |id: NodeId| advert(1, &short, 100 + id);
    // R1 hears only the provider; R2 hears everyone; R3 has lost R1
    // and R2 (their heartbeats are late).
    let mut views = Vec::new();
    for (i, &r) in receivers.iter().enumerate() {
        let mut v = PeerView::new(Duration::from_millis(500));
        v.observe(p, provider.clone(), at(1000));
        for &other in &receivers {
            if other != r && i == 1 {
                v.observe(other, own(other), at(1000));
            }
            if other != r && i == 2 {
                v.observe(other, own(other), at(0));
            }
        }
        views.push(v);
    }
    let asks: Vec<Grant> = receivers
        .iter()
        .zip(&views)
        .flat_map(|(&r, v)| decide(Strategy::Pmrfs, r, &own(r), v, at(1000)))
        .collect();
    // R1 and R3 each think the spare is theirs: 6 + 6 + R2's share.
    let asked: f64 = asks.iter().map(|g| g.amount).sum();
    assert!(asked > 10.0, "the views disagree: {asks:?}");

    let mut res = Reservations::new(p, config());
    let granted: f64 = asks
        .iter()
        .map(|g| {
            res.grant(
                g.receiver,
                g.class,
                g.amount,
                Duration::ZERO,
                at(1000),
                10.0,
            )
            .amount
        })
        .sum();
    assert_eq!(granted, 10.0);
    assert_eq!(res.reserved(), 10.0);
}

#[test]
fn a_renewal_is_not_shrunk_by_the_traffic_it_carries() {
    let mut res = Reservations::new(E2, config());
    // 10 spare: E1 gets 6.
    assert_eq!(
        res.grant(E1, LT, 6.0, Duration::ZERO, at(0), 10.0).amount,
        6.0
    );
    // E1 sends at its full 6/s (units of 1, one every 166 ms).
    for k in 0..6u64 {
        assert_eq!(res.admit(E1, LT, 1, at(k * 166)), Admission::Accepted);
    }
    // The PBTT tuple now counts that traffic as load: spare 4, but 4 + 6
    // carried are lendable (less the headroom). Renewing, E1 still gets
    // its 6...
    let carried = res.carried(at(900));
    assert!((carried - 6.0).abs() < 0.1, "{carried}");
    let spare = lendable(&late(&[4.0, 0.0, 0.0]), 6.0);
    assert!((spare - 10.0 * LEND_SHARE).abs() < 1e-9);
    assert_eq!(
        res.grant(E1, LT, 6.0, Duration::ZERO, at(900), spare)
            .amount,
        6.0
    );
    // ...and another receiver only what is left beside E1's 6.
    let rest = spare - 6.0;
    assert!((res.grant(3, LT, 9.0, Duration::ZERO, at(900), spare).amount - rest).abs() < 1e-9);
    // A node short by 1 lends 1 less; short by more than it could
    // lend, nothing.
    assert!((lendable(&late(&[0.0, 0.0, -1.0]), 6.0) - (6.0 * LEND_SHARE - 1.0)).abs() < 1e-9);
    assert_eq!(lendable(&late(&[0.0, 0.0, -9.0]), 6.0), 0.0);
    // What it carries explains a shortage of 2: it asks for nothing;
    // of 8, it asks for the 2 its own traffic needs.
    let t = |lt| BandwidthTuple(vec![0.0, 0.0, lt]);
    assert_eq!(own_shortage(&late(&[0.0, 0.0, -2.0]), 6.0), t(0.0));
    assert_eq!(own_shortage(&late(&[0.0, 0.0, -8.0]), 6.0), t(-2.0));
    assert!((res.reserved() - spare).abs() < 1e-9);
    // A reservation carrying nothing counts once, as reserved.
    let mut idle = Reservations::new(E2, config());
    idle.grant(E1, LT, 6.0, Duration::ZERO, at(0), 10.0);
    assert_eq!(
        idle.grant(3, LT, 9.0, Duration::ZERO, at(900), 10.0).amount,
        4.0
    );
}

#[test]
fn reservations_expire_unless_renewed() {
    let mut res = Reservations::new(E2, config());
    res.grant(E1, LT, 4.0, Duration::from_millis(300), at(0), 10.0);
    res.grant(3, LT, 4.0, Duration::ZERO, at(0), 10.0);
    assert_eq!(res.admit(E1, LT, 1, at(299)), Admission::Accepted);
    assert_eq!(res.admit(E1, LT, 1, at(300)), Admission::NoReservation);
    assert_eq!(res.len(), 1, "admit dropped the expired reservation");
    // Renewed before its end, a reservation lives on.
    res.grant(3, LT, 4.0, Duration::ZERO, at(900), 10.0);
    assert!(res.expire(at(1500)).is_empty());
    assert_eq!(res.expire(at(1900)), vec![(3, LT, 4.0)]);
    assert!(res.is_empty());
    // Expired reservations no longer count against the spare.
    res.grant(E1, LT, 10.0, Duration::ZERO, at(0), 10.0);
    assert_eq!(
        res.grant(3, LT, 5.0, Duration::ZERO, at(500), 10.0).amount,
        0.0
    );
    assert_eq!(
        res.grant(3, LT, 5.0, Duration::ZERO, at(1000), 10.0).amount,
        5.0
    );
    // A lease longer than the provider's is cut to it.
    assert_eq!(
        res.grant(3, LT, 5.0, Duration::from_secs(60), at(1000), 10.0)
            .lease,
        Duration::from_secs(1)
    );
}

#[test]
fn the_view_ignores_stale_heartbeats_and_forgets_the_silent() {
    let mut v = PeerView::new(Duration::from_millis(500));
    assert_eq!(v.observe(E2, advert(5, &[1.0], 0), at(0)), Observed::Joined);
    assert_eq!(v.observe(E2, advert(4, &[9.0], 0), at(10)), Observed::Stale);
    assert_eq!(v.advert(E2).unwrap().tuple, tuple(&[1.0]));
    assert_eq!(
        v.observe(E2, advert(6, &[2.0], 0), at(20)),
        Observed::Updated
    );
    assert!(v.is_alive(E2, at(519)));
    assert!(!v.is_alive(E2, at(520)));
    assert_eq!(v.alive_count(at(520)), 0);
    // Gone, then back after a restart with a smaller round.
    assert_eq!(
        v.observe(E2, advert(1, &[3.0], 0), at(600)),
        Observed::Joined
    );
    assert_eq!(v.alive(at(600)).count(), 1);
    assert_eq!(v.last_heard(E2), Some(at(600)));
    // A dead provider is not matched.
    let me = advert(1, &[-1.0], 7);
    assert_eq!(decide(Strategy::Pmrfs, E1, &me, &v, at(600)).len(), 1);
    assert!(decide(Strategy::Pmrfs, E1, &me, &v, at(1100)).is_empty());
}

#[test]
fn leases_pace_sending_and_end() {
    let pacing = Pacing {
        burst: Duration::from_millis(100),
        min_burst: 10.0,
    };
    let mut l = Leases::new(pacing);
    l.set(E2, LT, 1000.0, at(1000), at(0));
    l.set(E2, ClassId(1), 1000.0, at(1000), at(0));
    l.set(3, LT, 1000.0, at(1000), at(0));
    assert_eq!(l.active(E2, at(0)), vec![ClassId(1), LT]);
    // Depth: 100 ms at 1000/s.
    assert_eq!(l.take(E2, LT, 100, at(0)), Take::Granted);
    assert!(matches!(l.take(E2, LT, 10, at(0)), Take::Wait(_)));
    assert_eq!(l.take(E2, LT, 10, at(10)), Take::Granted);
    l.end(E2, ClassId(1));
    assert_eq!(l.active(E2, at(0)), vec![LT]);
    assert_eq!(l.take(E2, LT, 1, at(1000)), Take::Wait(Duration::MAX));
    assert_eq!(l.expire(at(1000)), 2);
    l.set(3, LT, 5.0, at(2000), at(1000));
    l.set(3, LT, 0.0, at(2000), at(1000));
    assert!(l.is_empty());
    l.set(3, LT, 5.0, at(2000), at(1000));
    l.end_all(3);
    assert!(!l.has_active(3, at(1000)));
}

#[test]
fn a_provider_is_lost_only_without_heartbeats_or_acknowledgements() {
    let dead_after = at(250);
    // Heard by heartbeat: never lost.
    assert!(!provider_lost(true, None, at(1_000), dead_after));
    // Gone from the view, but acknowledging on the stream lately.
    assert!(!provider_lost(false, Some(at(900)), at(1_000), dead_after));
    // Gone, and the last acknowledgement is as old as dead_after.
    assert!(provider_lost(false, Some(at(750)), at(1_000), dead_after));
    // Gone, and nothing ever acknowledged.
    assert!(provider_lost(false, None, at(1_000), dead_after));
}

#[test]
fn in_flight_records_leave_only_when_settled() {
    let mut f = InFlight::new();
    for seq in 0..4 {
        f.sent(record(E1, seq)).unwrap();
    }
    assert!(f.sent(record(E1, 2)).is_err(), "same identity twice");
    assert_eq!(f.bytes(), 4 * record(E1, 0).size());
    assert!(f.acked((E1, 1)).is_some());
    assert!(f.acked((E1, 1)).is_none(), "a repeated ack changes nothing");
    assert_eq!(f.refused((E1, 3)).map(|r| r.seq), Some(3));
    let back: Vec<u64> = f.take_all().iter().map(|r| r.seq).collect();
    assert_eq!(back, vec![0, 2]);
    assert!(f.is_empty());
    assert_eq!(f.bytes(), 0);
}

#[test]
fn custody_acknowledges_on_the_sending_stream_only_after_delivery() {
    let mut c = Custody::new();
    for seq in 0..3 {
        c.hold((E1, seq), 7);
    }
    c.hold((E2, 0), 8);
    assert_eq!(c.held(), 4);
    assert_eq!(c.held_by(7), 3);
    assert!(c.take_delivered(7, 10).is_empty(), "nothing delivered yet");

    // A batch with two of stream 7's, one of 8's and one of this
    // node's own records.
    assert_eq!(c.delivered([(E1, 2), (E2, 0), (E1, 0), (9, 9)]), 3);
    assert_eq!(c.due(), 3);
    assert_eq!(c.take_delivered(7, 1), vec![(E1, 2)]);
    assert_eq!(c.take_delivered(7, 10), vec![(E1, 0)]);
    assert!(c.owes(7), "(E1, 1) is still undelivered");
    assert_eq!(c.delivered([(E1, 2)]), 0, "a second copy owes nothing");

    // Refused at enqueue: nothing owed; another stream's unhold of it
    // changes nothing.
    c.unhold((E1, 1), 8);
    assert_eq!(c.held_by(7), 1);
    c.unhold((E1, 1), 7);
    assert!(!c.owes(7));

    // Stream 8 ends before its ack is taken: its sender takes the
    // record back, nothing stays owed.
    assert_eq!(c.release(8), 1);
    assert!(!c.owes(8));
    assert_eq!((c.held(), c.due()), (0, 0));
}

#[test]
fn custody_owes_a_record_to_every_stream_that_sent_it() {
    let mut c = Custody::new();
    c.hold((E1, 5), 1);
    // The sender gave up on stream 1 and sent the record again on 2
    // before this provider saw stream 1 end: owed to both until one
    // ends.
    c.hold((E1, 5), 2);
    c.hold((E1, 5), 2);
    assert!(c.owes(1) && c.owes(2));
    assert_eq!((c.held(), c.held_by(1), c.held_by(2)), (1, 1, 1));
    assert_eq!(c.release(1), 1);
    assert_eq!(c.delivered([(E1, 5)]), 1);
    assert_eq!(c.take_delivered(2, 10), vec![(E1, 5)]);
    assert_eq!((c.held(), c.due()), (0, 0));

    // E1's record 6 came in on stream 1 (from E1), went on to a third
    // node and came back on stream 3 (from that node) while still held
    // for E1: delivered once, it is acknowledged to both, so E1 does
    // not take it back and send it again.
    c.hold((E1, 6), 1);
    c.hold((E1, 6), 3);
    assert_eq!(c.delivered([(E1, 6)]), 1);
    assert_eq!(c.due(), 2);
    assert_eq!(c.take_delivered(1, 10), vec![(E1, 6)]);
    assert_eq!(c.take_delivered(3, 10), vec![(E1, 6)]);
    assert!(!c.owes(1) && !c.owes(3));
    // Refused at enqueue on one stream: still owed to the other.
    c.hold((E1, 7), 1);
    c.hold((E1, 7), 3);
    c.unhold((E1, 7), 3);
    assert_eq!((c.held_by(1), c.held_by(3)), (1, 0));
    assert_eq!(c.delivered([(E1, 7)]), 1);
    assert_eq!(c.take_delivered(1, 10), vec![(E1, 7)]);
}

proptest! {
    #[test]
    fn custody_acknowledges_each_held_record_at_most_once_and_only_after_delivery(
        ops in prop::collection::vec((0u8..5, 0u64..20, 0u64..3), 0..300)
    ) {
        let mut c = Custody::new();
        // Model: which streams hold what; what was delivered while held
        // by whom.
        let mut held: HashMap<u64, Vec<u64>> = HashMap::new();
        let mut due: HashMap<u64, Vec<u64>> = HashMap::new();
        for (op, seq, stream) in ops {
            match op {
                0 | 1 => {
                    c.hold((E1, seq), stream);
                    let h = held.entry(seq).or_default();
                    if !h.contains(&stream) {
                        h.push(stream);
                    }
                }
                2 => {
                    let n = c.delivered([(E1, seq)]);
                    match held.remove(&seq) {
                        Some(streams) => {
                            prop_assert_eq!(n, 1);
                            for s in streams {
                                due.entry(s).or_default().push(seq);
                            }
                        }
                        None => prop_assert_eq!(n, 0),
                    }
                }
                3 => {
                    let acked: Vec<u64> =
                        c.take_delivered(stream, 2).into_iter().map(|k| k.1).collect();
                    let expected: Vec<u64> = {
                        let d = due.entry(stream).or_default();
                        let n = d.len().min(2);
                        d.drain(..n).collect()
                    };
                    prop_assert_eq!(acked, expected);
                }
                _ => {
                    let owed = held.values().filter(|h| h.contains(&stream)).count()
                        + due.get(&stream).map_or(0, Vec::len);
                    prop_assert_eq!(c.release(stream), owed);
                    held.retain(|_, h| {
                        h.retain(|&s| s != stream);
                        !h.is_empty()
                    });
                    due.remove(&stream);
                }
            }
            prop_assert_eq!(c.held(), held.len());
            prop_assert_eq!(c.due(), due.values().map(Vec::len).sum::<usize>());
            for s in 0..3 {
                let owed = held.values().any(|h| h.contains(&s))
                    || due.get(&s).is_some_and(|d| !d.is_empty());
                prop_assert_eq!(c.owes(s), owed);
                prop_assert_eq!(
                    c.held_by(s),
                    held.values().filter(|h| h.contains(&s)).count()
                );
            }
        }
    }

    #[test]
    fn a_provider_never_grants_more_than_its_spare(
        ops in prop::collection::vec(
            (0u64..5, 0u8..3, -10.0f64..100.0, 0.0f64..100.0, 0u64..400, 0u64..1500),
            1..80,
        )
    ) {
        let mut res = Reservations::new(99, config());
        let mut now = Duration::ZERO;
        for (receiver, class, asked, spare, dt, lease) in ops {
            now += at(dt);
            res.expire(now);
            let others = res.reserved() - res.reserved_for(receiver, ClassId(class));
            let r = res.grant(receiver, ClassId(class), asked, at(lease), now, spare);
            prop_assert!(r.amount >= 0.0 && r.amount <= asked.max(0.0) + 1e-9);
            prop_assert!(
                r.amount == 0.0 || others + r.amount <= spare + 1e-9,
                "granted {} with {} reserved for others and {} spare", r.amount, others, spare
            );
            prop_assert!((res.reserved() - (others + r.amount)).abs() <= 1e-9);
            prop_assert!(r.lease <= config().lease);
        }
    }

    #[test]
    fn in_flight_loses_and_duplicates_nothing(
        ops in prop::collection::vec((0u8..4, 0u64..30), 0..200)
    ) {
        let mut f = InFlight::new();
        let mut sent = std::collections::HashSet::new();
        let mut settled = std::collections::HashSet::new();
        let mut back = Vec::new();
        for (op, seq) in ops {
            match op {
                0 => {
                    if f.sent(record(E1, seq)).is_ok() {
                        sent.insert(seq);
                        settled.remove(&seq);
                    }
                }
                1 => {
                    if f.acked((E1, seq)).is_some() {
                        prop_assert!(settled.insert(seq));
                    }
                }
                2 => {
                    if let Some(r) = f.refused((E1, seq)) {
                        prop_assert!(settled.insert(r.seq));
                        back.push(r.seq);
                    }
                }
                _ => {
                    for r in f.take_all() {
                        prop_assert!(settled.insert(r.seq));
                        back.push(r.seq);
                    }
                }
            }
        }
        // Every identity ever sent is settled exactly once or still held.
        for seq in &sent {
            let held = f.records.contains_key(&(E1, *seq));
            prop_assert!(held != settled.contains(seq), "seq {seq}");
        }
        prop_assert_eq!(f.bytes(), f.len() * record(E1, 0).size());
    }
}

#[test]
fn advertised_asks_its_own_shortage_or_offers_what_it_can_lend() {
    let t = |v: [f64; 3]| BandwidthTuple(v.to_vec());
    // Late, short by 8 while carrying 6: asks for its own 2.
    assert_eq!(
        advertised(&late(&[0.0, 0.0, -8.0]), 6.0, 0.0),
        t([0.0, 0.0, -2.0])
    );
    // Late, short by 1 while carrying 6: offers LEND_SHARE * 6 - 1, in the
    // top class.
    let a = advertised(&late(&[0.0, 0.0, -1.0]), 6.0, 0.0);
    let offer = 6.0 * LEND_SHARE - 1.0;
    assert!((a.0[0] - offer).abs() < 1e-9 && a.0[1] == 0.0 && a.0[2] == 0.0);
    // Late, spare 3 + 1 carrying 6: LEND_SHARE * 10 lendable, spread as
    // the spare is (3:1).
    let a = advertised(&late(&[3.0, 1.0, 0.0]), 6.0, 0.0);
    let lend = 10.0 * LEND_SHARE;
    assert!((a.0[0] - 0.75 * lend).abs() < 1e-9 && (a.0[1] - 0.25 * lend).abs() < 1e-9);
    // On time: what C_out less its own traffic leaves (LEND_SHARE *
    // (100 - 20)), whatever the bunching of forwarded records did to the
    // tuple.
    let on_time = |v: [f64; 3]| BandwidthState {
        late: false,
        ..late(&v)
    };
    let lend = 80.0 * LEND_SHARE;
    let a = advertised(&on_time([3.0, 1.0, 0.0]), 6.0, 6.0);
    assert!((a.0[0] - 0.75 * lend).abs() < 1e-9 && (a.0[1] - 0.25 * lend).abs() < 1e-9);
    let a = advertised(&on_time([0.0, 0.0, -50.0]), 6.0, 6.0);
    assert!((a.0[0] - lend).abs() < 1e-9, "{a:?}");
    // Carrying nothing and nothing reserved, its shortage is its own;
    // with a reservation not yet carrying, it is not.
    assert_eq!(
        advertised(&on_time([0.0, 0.0, -50.0]), 0.0, 0.0),
        t([0.0, 0.0, -50.0])
    );
    let a = advertised(&on_time([0.0, 0.0, -50.0]), 0.0, 5.0);
    assert_eq!(a.shortage_total(), 0.0);
    // Its own traffic past what it may lend: its shortage is its own too.
    let busy = BandwidthState {
        own_rate: 98.0,
        ..on_time([0.0, 0.0, -50.0])
    };
    assert_eq!(advertised(&busy, 6.0, 6.0), t([0.0, 0.0, -44.0]));
}

fn ask(provider: NodeId, amount: f64) -> Grant {
    Grant {
        provider,
        receiver: E1,
        class: LT,
        amount,
    }
}

#[test]
fn first_asks_keep_the_providers_already_carrying() {
    // The matcher moved E1 from provider 3 (which it holds at 6) to
    // provider 4, 7 in all: it renews 3 at 6 and asks 4 for 1 more.
    let asks = first_asks(&[ask(4, 7.0)], &[(3, LT, 6.0)]);
    assert_eq!(asks, vec![ask(3, 6.0), ask(4, 1.0)]);
    // A smaller total asks the held lease down, and the rest (to zero:
    // released) from the smaller one.
    let asks = first_asks(&[ask(4, 5.0)], &[(3, LT, 6.0), (4, LT, 2.0)]);
    assert_eq!(asks, vec![ask(3, 5.0), ask(4, 0.0)]);
    // The rest beyond held leases goes to the matched providers in order,
    // onto a held one when it is among them.
    let asks = first_asks(&[ask(3, 4.0), ask(5, 4.0)], &[(3, LT, 2.0)]);
    assert_eq!(asks, vec![ask(3, 6.0), ask(5, 2.0)]);
    // Other classes' leases are not touched.
    assert_eq!(
        first_asks(&[ask(4, 1.0)], &[(3, ClassId(0), 6.0)]),
        vec![ask(4, 1.0)]
    );
    assert!(first_asks(&[], &[(3, LT, 6.0)]).is_empty());
}

#[test]
fn spill_asks_cover_what_full_providers_refused() {
    let offers = |v: &[(NodeId, f64)]| -> Vec<Offer> {
        v.iter()
            .map(|&(provider, amount)| Offer { provider, amount })
            .collect()
    };
    // 3 granted 2 of 6: 4 is asked for 4 more on top of its 1.
    let answered = [(ask(3, 6.0), 2.0), (ask(4, 1.0), 1.0)];
    let spill = spill_asks(&answered, &offers(&[(3, 9.0), (4, 3.0), (5, 8.0)]));
    // 5 advertises most: it gets the whole 4 (3 refused, so it is full).
    assert_eq!(spill, vec![ask(5, 4.0)]);
    let spill = spill_asks(&answered, &offers(&[(4, 3.0), (5, 2.0)]));
    assert_eq!(spill, vec![ask(4, 4.0), ask(5, 1.0)]);
    // Everything granted: nothing to spill.
    assert!(spill_asks(&[(ask(3, 6.0), 6.0)], &offers(&[(4, 9.0)])).is_empty());
}

#[test]
fn a_spill_step_skips_this_rounds_refusers_and_asks_remembered_ones_last() {
    let offers: Vec<Offer> = [(1, 9.0), (3, 9.0), (4, 9.0)]
        .iter()
        .map(|&(provider, amount)| Offer { provider, amount })
        .collect();
    // The first ask, to 3 (held by others), was refused.
    let mut spill = Spill::new(&[(ask(3, 6.0), 0.0)]);
    // Step one: the largest advertised spare, 1 (ties by id).
    assert_eq!(spill.asks(&offers), vec![ask(1, 6.0)]);
    // 1 is full too (its adverts show what it can lend, not what it has
    // reserved): the next step asks 4, where one step stopped before.
    spill.answered(&[(ask(1, 6.0), 0.0)]);
    assert_eq!(spill.asks(&offers), vec![ask(4, 6.0)]);
    // 4 grants 4 of 6: nobody left with room.
    spill.answered(&[(ask(4, 6.0), 4.0)]);
    assert!(spill.asks(&offers).is_empty());
    // Providers remembered from earlier rounds are asked last: not at all
    // while others cover the shortfall on paper...
    let spill = Spill::new(&[(ask(3, 6.0), 0.0)]).deferring([1]);
    assert_eq!(spill.asks(&offers), vec![ask(4, 6.0)]);
    assert_eq!(spill.refused(), &[3]);
    // ...and for what the others cannot cover.
    let few: Vec<Offer> = [(1, 9.0), (3, 9.0), (4, 2.0)]
        .iter()
        .map(|&(provider, amount)| Offer { provider, amount })
        .collect();
    assert_eq!(spill.asks(&few), vec![ask(4, 2.0), ask(1, 4.0)]);
    // Granted in part: the rest is asked, on top of what it grants.
    let mut spill = Spill::new(&[(ask(3, 6.0), 0.0)]);
    spill.answered(&[(ask(1, 6.0), 2.0)]);
    assert_eq!(spill.asks(&offers), vec![ask(4, 4.0)]);
    // Only 3 gave nothing: 1 gave part, so later rounds may ask it again.
    assert_eq!(spill.gave_nothing().collect::<Vec<_>>(), vec![3]);
}

#[test]
fn providers_that_gave_nothing_are_asked_last_for_the_memory_and_then_not() {
    let offers: Vec<Offer> = [(1, 9.0), (4, 9.0)]
        .iter()
        .map(|&(provider, amount)| Offer { provider, amount })
        .collect();
    let period = Duration::from_millis(100);
    let first = [(ask(3, 6.0), 0.0)];
    let mut memory = Refusals::default();
    // Round at 0: 1 (the largest spare, first by id) gives nothing.
    let mut spill = memory.spill(&first, Duration::ZERO);
    assert_eq!(spill.asks(&offers), vec![ask(1, 6.0)]);
    spill.answered(&[(ask(1, 6.0), 0.0)]);
    memory.remember(&spill, Duration::ZERO, period);
    // Within REFUSAL_MEMORY periods, 1 comes after 4.
    let later = period * (REFUSAL_MEMORY - 1);
    assert_eq!(memory.spill(&first, later).asks(&offers), vec![ask(4, 6.0)]);
    // Then it is forgotten: the largest spare first again.
    let after = period * REFUSAL_MEMORY;
    assert_eq!(memory.spill(&first, after).asks(&offers), vec![ask(1, 6.0)]);
}

#[test]
fn own_rate_counts_only_this_nodes_arrivals_and_smooths_them() {
    let mut own = OwnRate::new(500);
    // 0.1 s windows. First: 3,000 bytes arrived, 1,000 of them from
    // peers (the counter went 500 -> 1,500): 20,000 B/s, taken as is.
    own.window(3_000, 1_500, 0.1);
    assert!((own.rate() - 20_000.0).abs() < 1e-6, "{}", own.rate());
    // Then a window of peers' records only: a tenth of the way to 0
    // (one window of a one-second time constant).
    own.window(4_000, 5_500, 0.1);
    assert!((own.rate() - 18_000.0).abs() < 1e-6, "{}", own.rate());
    // A counter read ahead of the queues' own never goes negative.
    own.window(0, 6_000, 0.1);
    assert!((own.rate() - 16_200.0).abs() < 1e-6, "{}", own.rate());
}

#[test]
fn periods_are_aligned_on_the_clock() {
    let len = Duration::from_millis(100);
    assert_eq!(period_of(1_234_567, len), 12);
    // 34,567 us into period 12: its middle is 15,433 us away, its
    // start (passed) the next period's, 65,433 us away.
    let half = Duration::from_millis(50);
    assert_eq!(
        until_period(1_234_567, len, half),
        Duration::from_micros(15_433)
    );
    assert_eq!(
        until_period(1_234_567, len, Duration::ZERO),
        Duration::from_micros(65_433)
    );
    // Exactly at a start: the next one, a whole period away.
    assert_eq!(until_period(1_200_000, len, Duration::ZERO), len);
}

#[test]
fn lendable_is_what_own_traffic_leaves_unless_late() {
    let mut s = BandwidthState {
        tuple: BandwidthTuple(vec![0.0, 0.0, 1.0]),
        capacity: 10.0,
        own_rate: 2.0,
        ..BandwidthState::default()
    };
    assert!((lendable(&s, 0.0) - 8.0 * LEND_SHARE).abs() < 1e-9);
    assert!((lendable(&s, 5.0) - 8.0 * LEND_SHARE).abs() < 1e-9);
    // Late: no more than the tuple shows, LEND_SHARE * (1 + 5).
    s.late = true;
    assert!((lendable(&s, 5.0) - 6.0 * LEND_SHARE).abs() < 1e-9);
    // Own traffic past C_out: nothing; no capacity known: nothing.
    s.late = false;
    s.own_rate = 20.0;
    assert_eq!(lendable(&s, 5.0), 0.0);
    assert_eq!(lendable(&BandwidthState::default(), 5.0), 0.0);
    // By hand from a tuple: LEND_SHARE of its spare.
    let h = BandwidthState::from_tuple(BandwidthTuple(vec![4.0, 6.0, 0.0]));
    assert!((lendable(&h, 0.0) - 10.0 * LEND_SHARE).abs() < 1e-9);
}
