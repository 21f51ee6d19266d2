use super::*;
use crate::queueing::queue::QueueCapacity;
use bytes::Bytes;

fn rec(class: u8, seq: u64) -> Record {
    Record {
        key: Bytes::new(),
        class: ClassId(class),
        origin: 1,
        seq,
        ingress_us: 0,
        payload: Bytes::from(vec![0u8; 68]),
        spool: None,
    }
}
const SIZE: usize = 100; // 68 + RECORD_OVERHEAD
const CAP: QueueCapacity = QueueCapacity {
    records: 1024,
    bytes: 1 << 20,
};
const LIMITS: BatchLimits = BatchLimits {
    max_records: 4,
    max_bytes: 1 << 20,
};

#[test]
fn urgent_class_goes_first_and_batches_respect_limits() {
    let q = MultiLevelQueue::new(&[CAP, CAP]);
    for s in 0..3 {
        q.push(rec(1, s)).unwrap();
    }
    for s in 10..16 {
        q.push(rec(0, s)).unwrap();
    }
    let mut d = Drainer::new(&[1e9, 1e9], 1e9, LIMITS, Duration::ZERO);
    // Per-class behaviour: see the mixing tests for riders.
    d.set_mixing(false);
    let seqs = |d: Drain| match d {
        Drain::Batch { records, .. } => records.iter().map(|r| r.seq).collect::<Vec<_>>(),
        other => panic!("expected a batch, got {other:?}"),
    };
    assert_eq!(
        seqs(d.next_batch(Duration::ZERO, 0, &q, None)),
        vec![10, 11, 12, 13]
    );
    assert_eq!(
        seqs(d.next_batch(Duration::ZERO, 0, &q, None)),
        vec![14, 15]
    );
    assert_eq!(
        seqs(d.next_batch(Duration::ZERO, 0, &q, None)),
        vec![0, 1, 2]
    );
    assert_eq!(d.next_batch(Duration::ZERO, 0, &q, None), Drain::Empty);
}

#[test]
fn a_class_out_of_tokens_waits_and_keeps_its_order() {
    let q = MultiLevelQueue::new(&[CAP, CAP]);
    for s in 0..3 {
        q.push(rec(1, s)).unwrap();
    }
    q.push(rec(0, 100)).unwrap();
    // Class 1: one record's worth of burst at 1000 B/s; class 0 one
    // record's worth and no rate (class 1 may not borrow from the more
    // urgent class 0, and an empty bucket spills nothing).
    let mut d = Drainer::new(&[0.0, 1000.0], SIZE as f64, LIMITS, Duration::ZERO);
    // Per-class behaviour: see the mixing tests for riders.
    d.set_mixing(false);
    let first = d.next_batch(Duration::ZERO, 0, &q, None);
    assert!(matches!(
        first,
        Drain::Batch {
            class: ClassId(0),
            ..
        }
    ));
    let second = d.next_batch(Duration::ZERO, 0, &q, None);
    assert!(
        matches!(second, Drain::Batch { class: ClassId(1), ref records } if records.len() == 1)
    );
    assert_eq!(d.held_bytes(ClassId(1)), SIZE);
    // Class 1 waits: 100 bytes at 1000 B/s.
    assert_eq!(
        d.next_batch(Duration::ZERO, 0, &q, None),
        Drain::Wait(Duration::from_millis(100))
    );
    let third = d.next_batch(Duration::from_millis(100), 0, &q, None);
    assert!(
        matches!(third, Drain::Batch { class: ClassId(1), ref records } if records[0].seq == 1)
    );
}

#[test]
fn an_urgent_class_borrows_from_less_urgent_buckets_never_the_reverse() {
    let q = MultiLevelQueue::new(&[CAP, CAP, CAP]);
    // ls has no rate at all (BWAllocator gave it nothing this window),
    // lt has room for exactly two records, nm none.
    let mut d = Drainer::new(&[0.0, 0.0, 1e-9], 2.0 * SIZE as f64, LIMITS, Duration::ZERO);
    // Per-class behaviour: see the mixing tests for riders.
    d.set_mixing(false);
    // Drain the ls and nm buckets' initial burst so only lt has tokens.
    for class in [0u8, 1] {
        for s in 0..2 {
            q.push(rec(class, s)).unwrap();
        }
        assert!(matches!(
            d.next_batch(Duration::ZERO, 0, &q, None),
            Drain::Batch { .. }
        ));
    }
    q.push(rec(0, 10)).unwrap();
    q.push(rec(1, 20)).unwrap();
    // ls borrows lt's two records' worth: one for ls...
    match d.next_batch(Duration::ZERO, 0, &q, None) {
        Drain::Batch { class, records } => {
            assert_eq!(class, ClassId(0));
            assert_eq!(records[0].seq, 10);
        }
        other => panic!("ls should borrow, got {other:?}"),
    }
    // ...and nm (more urgent than lt) borrows the other.
    assert!(matches!(
        d.next_batch(Duration::ZERO, 0, &q, None),
        Drain::Batch {
            class: ClassId(1),
            ..
        }
    ));
    // lt itself now waits: nothing borrows upward.
    q.push(rec(2, 30)).unwrap();
    assert!(matches!(
        d.next_batch(Duration::ZERO, 0, &q, None),
        Drain::Wait(_)
    ));
}

#[test]
fn a_tolerant_backlog_sends_what_the_urgent_classes_leave_unused() {
    // ls and nm allotted 1000 B/s each and idle, lt 1000 B/s with a
    // backlog: over 10 s lt sends the whole 3000 B/s, not its own 1000.
    let q = MultiLevelQueue::new(&[CAP, CAP, CAP]);
    for s in 0..1000 {
        q.push(rec(2, s)).unwrap();
    }
    let mut d = Drainer::new(
        &[1000.0, 1000.0, 1000.0],
        2.0 * SIZE as f64,
        LIMITS,
        Duration::ZERO,
    );
    let mut now = Duration::ZERO;
    let mut sent = 0usize;
    while now <= Duration::from_secs(10) {
        match d.next_batch(now, 0, &q, None) {
            Drain::Batch { records, .. } => sent += records.len(),
            Drain::Wait(w) => now += w.max(Duration::from_millis(1)),
            other => panic!("lt has a backlog: {other:?}"),
        }
    }
    // 3000 B/s for 10 s plus lt's own initial burst, in 100 B records
    // (the urgent classes keep theirs).
    let expected = (3000 * 10 + 2 * SIZE) / SIZE;
    assert!(
        sent + 2 >= expected && sent <= expected + 2,
        "lt sent {sent} records, expected about {expected}"
    );
    // The urgent classes still hold their whole bursts.
    q.push(rec(0, 5000)).unwrap();
    q.push(rec(0, 5001)).unwrap();
    match d.next_batch(now, 0, &q, None) {
        Drain::Batch { class, records } => {
            assert_eq!(class, ClassId(0));
            assert_eq!(records.iter().filter(|r| r.class == ClassId(0)).count(), 2);
        }
        other => panic!("ls goes at once, got {other:?}"),
    }
}

#[test]
fn a_partial_batch_waits_for_its_plan_and_others_use_the_link() {
    use crate::batching::PlanReason;
    let q = MultiLevelQueue::new(&[CAP, CAP]);
    let mut d = Drainer::new(&[1e9, 1e9], 1e9, LIMITS, Duration::ZERO);
    // Per-class behaviour: see the mixing tests for riders.
    d.set_mixing(false);
    let plan = BatchPlan {
        target_records: 3,
        max_bytes: 1 << 20,
        max_wait: Duration::from_millis(50),
        expected_records: 3,
        reason: PlanReason::Batching(crate::batching::SizeLimit::Reference),
    };
    let plans = [plan, BatchPlan::unbatched(1 << 20, PlanReason::RateTooLow)];
    let t0 = 1_000_000u64; // wall clock, µs
    let mut r = rec(0, 1);
    r.ingress_us = t0;
    q.push(r).unwrap();
    q.push(rec(1, 50)).unwrap();
    // Class 0 has 1 of 3 records and has waited 0 ms: class 1 goes.
    assert!(matches!(
        d.next_batch(Duration::ZERO, t0, &q, Some(&plans)),
        Drain::Batch {
            class: ClassId(1),
            ..
        }
    ));
    // Now only class 0 waits, until its 50 ms deadline.
    assert_eq!(
        d.next_batch(Duration::ZERO, t0 + 10_000, &q, Some(&plans)),
        Drain::Wait(Duration::from_millis(40))
    );
    // Filling the batch closes it at once...
    for s in 2..4 {
        let mut r = rec(0, s);
        r.ingress_us = t0 + 10_000;
        q.push(r).unwrap();
    }
    match d.next_batch(Duration::ZERO, t0 + 10_000, &q, Some(&plans)) {
        Drain::Batch { class, records } => {
            assert_eq!(class, ClassId(0));
            assert_eq!(
                records.iter().map(|r| r.seq).collect::<Vec<_>>(),
                vec![1, 2, 3]
            );
        }
        other => panic!("expected the filled batch, got {other:?}"),
    }
    // ...and a lone record goes when its wait is over.
    let mut r = rec(0, 9);
    r.ingress_us = t0;
    q.push(r).unwrap();
    assert!(matches!(
        d.next_batch(Duration::ZERO, t0 + 50_000, &q, Some(&plans)),
        Drain::Batch {
            class: ClassId(0),
            ..
        }
    ));
}

#[test]
fn heads_are_returned_on_shutdown() {
    let q = MultiLevelQueue::new(&[CAP]);
    q.push(rec(0, 1)).unwrap();
    let mut d = Drainer::new(&[0.0], 0.0, LIMITS, Duration::ZERO);
    assert_eq!(
        d.next_batch(Duration::ZERO, 0, &q, None),
        Drain::Wait(Duration::MAX)
    );
    assert_eq!(d.take_heads().len(), 1);
    assert!(q.is_empty_all());
}

fn classes_and_seqs(d: Drain) -> (ClassId, Vec<(u8, u64)>) {
    match d {
        Drain::Batch { class, records } => {
            (class, records.iter().map(|r| (r.class.0, r.seq)).collect())
        }
        other => panic!("expected a batch, got {other:?}"),
    }
}

#[test]
fn a_closing_batch_takes_riders_from_other_classes_in_priority_order() {
    let q = MultiLevelQueue::new(&[CAP, CAP, CAP]);
    q.push(rec(0, 1)).unwrap();
    for s in 10..13 {
        q.push(rec(2, s)).unwrap();
    }
    q.push(rec(1, 5)).unwrap();
    let mut d = Drainer::new(&[1e9; 3], 1e9, LIMITS, Duration::ZERO);
    // One transaction: ls first, then nm, then lt up to the 4-record cap.
    assert_eq!(
        classes_and_seqs(d.next_batch(Duration::ZERO, 0, &q, None)),
        (ClassId(0), vec![(0, 1), (1, 5), (2, 10), (2, 11)])
    );
    // The lt record that did not fit is held, first of the next batch.
    assert_eq!(
        classes_and_seqs(d.next_batch(Duration::ZERO, 0, &q, None)),
        (ClassId(2), vec![(2, 12)])
    );
    assert_eq!(d.next_batch(Duration::ZERO, 0, &q, None), Drain::Empty);
}

#[test]
fn riders_pay_with_their_own_tokens() {
    let q = MultiLevelQueue::new(&[CAP, CAP]);
    q.push(rec(0, 1)).unwrap();
    for s in 10..13 {
        q.push(rec(1, s)).unwrap();
    }
    // Class 1 can afford one record now, then 1000 B/s.
    let mut d = Drainer::new(&[1e9, 1000.0], SIZE as f64, LIMITS, Duration::ZERO);
    assert_eq!(
        classes_and_seqs(d.next_batch(Duration::ZERO, 0, &q, None)),
        (ClassId(0), vec![(0, 1), (1, 10)])
    );
    assert!(matches!(
        d.next_batch(Duration::ZERO, 0, &q, None),
        Drain::Wait(_)
    ));
    // Order within the class is kept across the held head.
    assert_eq!(
        classes_and_seqs(d.next_batch(Duration::from_millis(100), 0, &q, None)),
        (ClassId(1), vec![(1, 11)])
    );
}

#[test]
fn a_waiting_plan_rides_along_and_the_batch_is_sorted_by_priority() {
    use crate::batching::PlanReason;
    let q = MultiLevelQueue::new(&[CAP, CAP]);
    let mut d = Drainer::new(&[1e9, 1e9], 1e9, LIMITS, Duration::ZERO);
    let waiting = BatchPlan {
        target_records: 3,
        max_bytes: 1 << 20,
        max_wait: Duration::from_millis(50),
        expected_records: 3,
        reason: PlanReason::Batching(crate::batching::SizeLimit::Reference),
    };
    let plans = [
        waiting,
        BatchPlan::unbatched(1 << 20, PlanReason::RateTooLow),
    ];
    let t0 = 1_000_000u64;
    let mut r = rec(0, 1);
    r.ingress_us = t0;
    q.push(r).unwrap();
    q.push(rec(1, 50)).unwrap();
    // Class 0 would wait for two more records; class 1 closes a batch
    // and class 0's record rides it, placed first.
    assert_eq!(
        classes_and_seqs(d.next_batch(Duration::ZERO, t0, &q, Some(&plans))),
        (ClassId(0), vec![(0, 1), (1, 50)])
    );
    assert_eq!(
        d.next_batch(Duration::ZERO, t0, &q, Some(&plans)),
        Drain::Empty
    );
}

#[test]
fn mixing_never_loses_or_reorders_records() {
    // Many classes, rates and caps: every record comes out exactly once,
    // each class in its own order.
    let q = MultiLevelQueue::new(&[CAP, CAP, CAP, CAP]);
    let mut pushed = 0;
    for s in 0..200u64 {
        q.push(rec((s * 7 % 4) as u8, s)).unwrap();
        pushed += 1;
    }
    let limits = BatchLimits {
        max_records: 7,
        max_bytes: 5 * SIZE,
    };
    let mut d = Drainer::new(
        &[5000.0, 1e9, 300.0, 2000.0],
        3.0 * SIZE as f64,
        limits,
        Duration::ZERO,
    );
    let mut last = [None::<u64>; 4];
    let mut got = 0;
    let mut now = Duration::ZERO;
    while got < pushed {
        match d.next_batch(now, 0, &q, None) {
            Drain::Batch { class, records } => {
                assert!(records.len() <= 7 && records.len() * SIZE <= 5 * SIZE);
                assert_eq!(class.0, records.iter().map(|r| r.class.0).min().unwrap());
                let classes: Vec<u8> = records.iter().map(|r| r.class.0).collect();
                assert!(classes.windows(2).all(|w| w[0] <= w[1]), "{classes:?}");
                for r in records {
                    let c = r.class.index();
                    assert!(last[c].is_none_or(|l| l < r.seq));
                    last[c] = Some(r.seq);
                    got += 1;
                }
            }
            Drain::Wait(w) => now += w.max(Duration::from_millis(1)),
            Drain::Gather(_) | Drain::Empty => panic!("{got} of {pushed} out"),
        }
    }
    assert_eq!(d.next_batch(now, 0, &q, None), Drain::Empty);
}

#[test]
fn an_urgent_record_aboard_caps_the_batch_at_its_budget() {
    let q = MultiLevelQueue::new(&[CAP, CAP]);
    let limits = BatchLimits {
        max_records: 100,
        max_bytes: 10 * SIZE,
    };
    let mut d = Drainer::new(&[1e9, 1e9], 1e9, limits, Duration::ZERO);
    d.set_rider_budgets(&[3 * SIZE]);
    for s in 0..30 {
        q.push(rec(1, s)).unwrap();
    }
    q.push(rec(0, 100)).unwrap();
    // ls aboard: 3 records in all.
    assert_eq!(
        classes_and_seqs(d.next_batch(Duration::ZERO, 0, &q, None)),
        (ClassId(0), vec![(0, 100), (1, 0), (1, 1)])
    );
    // lt alone: the byte cap (class 1 has no budget: unlimited).
    let (class, got) = classes_and_seqs(d.next_batch(Duration::ZERO, 0, &q, None));
    assert_eq!((class, got.len()), (ClassId(1), 10));
    // Another ls record goes first, with the held lt record and one more.
    q.push(rec(0, 101)).unwrap();
    assert_eq!(
        classes_and_seqs(d.next_batch(Duration::ZERO, 0, &q, None)),
        (ClassId(0), vec![(0, 101), (1, 12), (1, 13)])
    );
}

#[test]
fn rider_budget_is_a_share_of_the_bound_on_the_link() {
    // 2.25 MB/s for a tenth of 100 ms.
    assert_eq!(
        rider_budget(Duration::from_millis(100), 2.25e6, 1024),
        22_500
    );
    assert_eq!(rider_budget(Duration::from_millis(1), 2.25e6, 1024), 1024);
    assert_eq!(rider_budget(Duration::from_secs(1), 0.0, 1024), usize::MAX);
    assert_eq!(
        rider_budget(Duration::from_secs(1), f64::INFINITY, 1024),
        usize::MAX
    );
}

#[test]
fn a_partial_batch_gathers_until_one_gather_after_the_last() {
    let q = MultiLevelQueue::new(&[CAP, CAP]);
    let limits = BatchLimits {
        max_records: 10,
        max_bytes: 1 << 20,
    };
    let ms = Duration::from_millis(1);
    let mut d = Drainer::new(&[1e9, 1e9], 1e9, limits, Duration::ZERO);
    d.set_gather(ms * 2);
    // The first batch does not gather: nothing went before it.
    q.push(rec(1, 0)).unwrap();
    assert!(matches!(
        d.next_batch(Duration::ZERO, 0, &q, None),
        Drain::Batch { .. }
    ));
    // Nothing queued: empty, not a gather.
    assert_eq!(d.next_batch(ms / 2, 0, &q, None), Drain::Empty);
    // A partial batch half a millisecond later gathers for the rest.
    for seq in 1..4 {
        q.push(rec(0, seq)).unwrap();
    }
    assert_eq!(d.next_batch(ms / 2, 0, &q, None), Drain::Gather(ms * 3 / 2));
    q.push(rec(1, 4)).unwrap();
    match d.next_batch(ms * 2, 0, &q, None) {
        Drain::Batch { records, .. } => assert_eq!(records.len(), 4),
        other => panic!("{other:?}"),
    }
    // A full batch's worth never waits, records or bytes.
    for seq in 10..20 {
        q.push(rec(1, seq)).unwrap();
    }
    assert!(matches!(
        d.next_batch(ms * 2, 0, &q, None),
        Drain::Batch { .. }
    ));
    d.set_limits(BatchLimits {
        max_records: 100,
        max_bytes: 3 * SIZE,
    });
    for seq in 20..23 {
        q.push(rec(0, seq)).unwrap();
    }
    assert!(matches!(
        d.next_batch(ms * 2, 0, &q, None),
        Drain::Batch { .. }
    ));
    // After a long pause a lone record goes at once.
    q.push(rec(0, 30)).unwrap();
    assert!(matches!(
        d.next_batch(ms * 10, 0, &q, None),
        Drain::Batch { .. }
    ));
    // Without a gather, whatever is queued goes whenever asked.
    d.set_gather(Duration::ZERO);
    q.push(rec(0, 31)).unwrap();
    assert!(matches!(
        d.next_batch(ms * 10, 0, &q, None),
        Drain::Batch { .. }
    ));
}

#[test]
fn the_urgent_lane_takes_the_most_urgent_class_alone() {
    let q = MultiLevelQueue::new(&[CAP, CAP, CAP]);
    for s in 0..3 {
        q.push(rec(2, s)).unwrap();
    }
    // Nothing urgent: the lane has nothing, whatever else waits.
    let mut d = Drainer::new(&[1e9, 1e9, 1e9], 1e9, LIMITS, Duration::ZERO);
    assert_eq!(d.next_urgent(Duration::ZERO, 0, &q, None), Drain::Empty);
    q.push(rec(0, 10)).unwrap();
    q.push(rec(1, 20)).unwrap();
    q.push(rec(0, 11)).unwrap();
    // Mixing is on, yet no other class rides in the lane.
    match d.next_urgent(Duration::ZERO, 0, &q, None) {
        Drain::Batch { class, records } => {
            assert_eq!(class, ClassId(0));
            assert_eq!(records.iter().map(|r| r.seq).collect::<Vec<_>>(), [10, 11]);
        }
        other => panic!("expected the urgent records, got {other:?}"),
    }
    // The rest is left for the window, in order.
    match d.next_batch(Duration::ZERO, 0, &q, None) {
        Drain::Batch { records, .. } => {
            assert_eq!(
                records.iter().map(|r| r.seq).collect::<Vec<_>>(),
                [20, 0, 1, 2]
            );
        }
        other => panic!("expected a batch, got {other:?}"),
    }
}

#[test]
fn the_urgent_lane_keeps_the_class_plan_and_tokens() {
    let q = MultiLevelQueue::new(&[CAP]);
    q.push(rec(0, 1)).unwrap();
    q.push(rec(0, 2)).unwrap();
    // Tokens for one record, no class to borrow from: one goes, the
    // other waits (held, not lost).
    let mut d = Drainer::new(&[1000.0], SIZE as f64, LIMITS, Duration::ZERO);
    assert!(
        matches!(d.next_urgent(Duration::ZERO, 0, &q, None), Drain::Batch { ref records, .. } if records.len() == 1)
    );
    assert!(matches!(
        d.next_urgent(Duration::ZERO, 0, &q, None),
        Drain::Wait(_)
    ));
    assert_eq!(d.take_heads().len(), 1);
    let q = MultiLevelQueue::new(&[CAP, CAP]);
    q.push(rec(0, 1)).unwrap();
    // A plan that waits for more records keeps the batch open.
    let plan = BatchPlan {
        target_records: 4,
        max_bytes: 1 << 20,
        max_wait: Duration::from_millis(30),
        expected_records: 4,
        reason: crate::batching::PlanReason::Batching(crate::batching::SizeLimit::Reference),
    };
    let mut d = Drainer::new(&[1e9, 1e9], 1e9, LIMITS, Duration::ZERO);
    let plans = [plan, plan];
    assert_eq!(
        d.next_urgent(Duration::ZERO, 10_000, &q, Some(&plans)),
        Drain::Wait(Duration::from_millis(20))
    );
    assert!(matches!(
        d.next_urgent(Duration::ZERO, 30_000, &q, Some(&plans)),
        Drain::Batch { .. }
    ));
}
