//! The window step on a simulated clock: unit tests of each `handle_*` and
//! `poll_*`, and property tests over arbitrary event sequences (no record
//! lost, sent twice or reordered within its class) and over a simulated
//! link (an urgent record is never held behind a batch longer than its
//! bound allows).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use bytes::Bytes;
use proptest::prelude::*;

use super::*;
use crate::janus::redirect::Strategy as Matcher;
use crate::queueing::queue::QueueCapacity;
use crate::record::RECORD_OVERHEAD;

const MS: Duration = Duration::from_millis(1);
/// The wall clock (µs since the Unix epoch) at the simulation's `now = 0`.
const WALL0: u64 = 1_700_000_000_000_000;

fn wall(now: Duration) -> u64 {
    WALL0 + now.as_micros() as u64
}

fn params(scheme: Scheme) -> SchedulerParams {
    SchedulerParams {
        scheme,
        window: MS * 100,
        processing_delay: MS,
        capacity: 1e6,
        burst_bytes: Some(64.0 * 1024.0),
        limits: BatchLimits {
            max_records: 1024,
            max_bytes: 64 * 1024,
        },
        adaptive: true,
        reference: vec![2, 6, 11],
        track_uplink: true,
        mix_classes: true,
        gather: Duration::ZERO,
    }
}

fn link(bytes_per_sec: f64, per_transaction: Duration) -> LinkEstimate {
    LinkEstimate {
        bytes_per_sec,
        per_transaction,
    }
}

fn queues(classes: &ClassSet, scheme: Scheme) -> MultiLevelQueue {
    let cap = QueueCapacity {
        records: 1 << 16,
        bytes: 64 << 20,
    };
    if scheme.uses_classes() {
        MultiLevelQueue::uniform(classes, cap)
    } else {
        MultiLevelQueue::fifo(cap)
    }
}

fn record(class: usize, seq: u64, payload: usize, at: Duration) -> Record {
    Record {
        key: Bytes::new(),
        class: ClassId(class as u8),
        origin: 1,
        seq,
        ingress_us: wall(at),
        payload: Bytes::from(vec![0u8; payload]),
        spool: None,
    }
}

/// A scheduler over the JANUS classes on a 100 MB/s link with 1 ms per
/// transaction, starting at 0.
fn on_a_fast_link(p: SchedulerParams, q: &MultiLevelQueue) -> Scheduler {
    Scheduler::new(
        p,
        ClassSet::janus_default(),
        q,
        link(100e6, MS),
        0,
        1,
        Duration::ZERO,
    )
}

fn scheduler(p: SchedulerParams, q: &MultiLevelQueue) -> Scheduler {
    let l = link(p.capacity, MS * 10);
    Scheduler::new(p, ClassSet::janus_default(), q, l, 0, 1, Duration::ZERO)
}

fn events(s: &mut Scheduler) -> Vec<Event> {
    std::iter::from_fn(|| s.poll_event()).collect()
}

#[test]
fn it_starts_by_announcing_the_initial_rates() {
    let p = params(Scheme::QmOnly);
    let q = queues(&ClassSet::janus_default(), p.scheme);
    let mut s = scheduler(p, &q);
    let ev = events(&mut s);
    assert!(
        matches!(&ev[..], [Event::Rates(r), Event::Horizon(h)] if r.len() == 3 && *h == MS * 35),
        "{ev:?}"
    );
    assert_eq!(s.poll_timeout(), MS * 100);
}

#[test]
fn the_gather_stays_within_its_share_of_the_horizon() {
    let mut p = params(Scheme::QmOnly);
    p.gather = MS * 10;
    p.adaptive = false;
    let q = queues(&ClassSet::janus_default(), p.scheme);
    let mut s = scheduler(p.clone(), &q);
    q.push(record(2, 0, 100, Duration::ZERO)).unwrap();
    assert!(matches!(
        s.poll_batch(Duration::ZERO, wall(Duration::ZERO), &q),
        Poll::Batch(_)
    ));
    q.push(record(2, 1, 100, Duration::ZERO)).unwrap();
    // The horizon is 35 ms (the 100 ms class): a gather of 35/16 ms, not 10.
    let cap = crate::admission::gather(p.gather, MS * 35);
    assert_eq!(cap, Duration::from_micros(2187) + Duration::from_nanos(500));
    assert_eq!(
        s.poll_batch(Duration::ZERO, wall(Duration::ZERO), &q),
        Poll::Gather(cap)
    );
    assert!(matches!(s.poll_batch(cap, wall(cap), &q), Poll::Batch(_)));
    // A shorter gather stands as configured.
    p.gather = MS;
    let mut s = scheduler(p, &q);
    q.push(record(2, 2, 100, Duration::ZERO)).unwrap();
    assert!(matches!(
        s.poll_batch(Duration::ZERO, wall(Duration::ZERO), &q),
        Poll::Batch(_)
    ));
    q.push(record(2, 3, 100, Duration::ZERO)).unwrap();
    assert_eq!(
        s.poll_batch(Duration::ZERO, wall(Duration::ZERO), &q),
        Poll::Gather(MS)
    );
}

#[test]
fn the_window_runs_only_when_due() {
    let p = params(Scheme::QmOnly);
    let q = queues(&ClassSet::janus_default(), p.scheme);
    let mut s = scheduler(p, &q);
    assert!(!s.poll_window(MS * 99, &q, 0));
    assert!(s.poll_window(MS * 100, &q, 0));
    assert_eq!(s.poll_timeout(), MS * 200);
    // A late window does not try to catch up on the ones it missed.
    assert!(s.poll_window(MS * 750, &q, 0));
    assert_eq!(s.poll_timeout(), MS * 750);
}

#[test]
fn a_loaded_class_is_reallocated_from_the_queues_arrivals() {
    let p = params(Scheme::QmOnly);
    let q = queues(&ClassSet::janus_default(), p.scheme);
    let mut s = scheduler(p, &q);
    let before = s.rates();
    events(&mut s);
    // 400 KB of `ls` in one 100 ms window: 4 MB/s demanded of a 1 MB/s link.
    for i in 0..4000 {
        q.push(record(0, i, 100 - RECORD_OVERHEAD, Duration::ZERO))
            .unwrap();
    }
    assert!(s.poll_window(MS * 100, &q, 0));
    let ev = events(&mut s);
    assert!(
        ev.iter().any(|e| matches!(e, Event::Reallocated { .. })),
        "{ev:?}"
    );
    let after = s.rates();
    assert!(after[0] > before[0], "{before:?} -> {after:?}");
    assert!(after.iter().sum::<f64>() <= 1e6 * (1.0 + 1e-9));
}

#[test]
fn capacity_follows_the_uplink_estimate_beyond_the_hysteresis() {
    let p = params(Scheme::QmOnly);
    let q = queues(&ClassSet::janus_default(), p.scheme);
    let mut s = scheduler(p, &q);
    events(&mut s);
    // Less the headroom, 1.02e6 is within 1 % of the 1e6 configured.
    s.handle_link_estimate(link(1.02e6, MS * 10));
    s.poll_window(MS * 100, &q, 0);
    assert_eq!(s.capacity(), 1e6, "a 1 % rise is jitter");
    s.handle_link_estimate(link(2e6, MS * 10));
    s.poll_window(MS * 200, &q, 0);
    // C_out leaves the headroom of the measured link unallocated.
    let followed = 2e6 * (1.0 - UPLINK_HEADROOM);
    assert_eq!(s.capacity(), followed);
    assert!(events(&mut s).contains(&Event::CapacityFollowed(followed)));
    assert!((s.rates().iter().sum::<f64>() - followed).abs() < 1.0);
    // A fall the old 5 % hysteresis ignored is followed: C_out must not
    // stay above what the link carries.
    s.handle_link_estimate(link(1.92e6, MS * 10));
    s.poll_window(MS * 300, &q, 0);
    assert_eq!(s.capacity(), 1.92e6 * (1.0 - UPLINK_HEADROOM));
    // A fall of 1 % is followed too (C_out would otherwise sit 0.5 %
    // above the estimate); a rise of 1 % is not.
    s.handle_link_estimate(link(1.92e6 * 0.99, MS * 10));
    s.poll_window(MS * 400, &q, 0);
    let fell = 1.92e6 * 0.99 * (1.0 - UPLINK_HEADROOM);
    assert_eq!(s.capacity(), fell);
    s.handle_link_estimate(link(1.92e6, MS * 10));
    s.poll_window(MS * 500, &q, 0);
    assert_eq!(s.capacity(), fell, "a 1 % rise is jitter");
    // Whatever the estimate does, C_out stays under it.
    for (k, e) in [1.9e6, 1.89e6, 1.95e6, 1.87e6, 1.99e6, 1.88e6]
        .into_iter()
        .enumerate()
    {
        s.handle_link_estimate(link(e, MS * 10));
        s.poll_window(MS * (600 + 100 * k as u32), &q, 0);
        assert!(
            s.capacity() < e,
            "C_out {} above an estimate of {e}",
            s.capacity()
        );
    }
}

#[test]
fn the_urgent_lane_carries_the_most_urgent_class_alone_and_native_has_none() {
    let p = params(Scheme::QmOnly);
    let q = queues(&ClassSet::janus_default(), p.scheme);
    let mut s = scheduler(p, &q);
    q.push(record(2, 1, 500, Duration::ZERO)).unwrap();
    assert_eq!(
        s.poll_urgent_batch(MS, wall(MS), &q),
        Poll::Empty,
        "nothing urgent"
    );
    q.push(record(0, 2, 100, Duration::ZERO)).unwrap();
    match s.poll_urgent_batch(MS, wall(MS), &q) {
        Poll::Batch(b) => {
            assert_eq!(b.class, ClassId(0));
            assert_eq!(b.records.iter().map(|r| r.seq).collect::<Vec<_>>(), [2]);
        }
        other => panic!("expected the urgent record, got {other:?}"),
    }
    let p = params(Scheme::Native);
    let q = queues(&ClassSet::janus_default(), p.scheme);
    let mut s = scheduler(p, &q);
    q.push(record(0, 3, 100, Duration::ZERO)).unwrap();
    assert_eq!(s.poll_urgent_batch(MS, wall(MS), &q), Poll::Empty);
}

#[test]
fn a_pinned_uplink_ignores_the_estimate() {
    let mut p = params(Scheme::QmOnly);
    p.track_uplink = false;
    let q = queues(&ClassSet::janus_default(), p.scheme);
    let mut s = scheduler(p, &q);
    s.handle_link_estimate(link(2e6, MS * 10));
    s.poll_window(MS * 100, &q, 0);
    assert_eq!(s.capacity(), 1e6);
}

#[test]
fn compression_counts_in_record_bytes() {
    let p = params(Scheme::QmOnly);
    let q = queues(&ClassSet::janus_default(), p.scheme);
    let mut s = scheduler(p, &q);
    // Transactions that shrink 3:1 on the wire: the link carries about
    // three times its wire rate in record bytes.
    for _ in 0..100 {
        s.handle_delivered(Delivered {
            class: ClassId(2),
            bytes: 1000,
            raw_bytes: 3000,
            records: 30,
            elapsed: MS * 20,
        });
    }
    s.handle_link_estimate(link(1e6, MS * 10));
    s.poll_window(MS * 100, &q, 0);
    let expected = 3e6 * (1.0 - UPLINK_HEADROOM);
    assert!(
        (s.capacity() - expected).abs() < 0.01 * expected,
        "{}",
        s.capacity()
    );
}

#[test]
fn a_grant_moves_spare_and_tells_the_peers() {
    let p = params(Scheme::Janus(Matcher::Pmrfs));
    let q = queues(&ClassSet::janus_default(), p.scheme);
    let mut s = scheduler(p, &q);
    s.publish_peer_state(true);
    // An idle window: every class has spare.
    s.poll_window(MS * 100, &q, 0);
    events(&mut s);
    let grant = Grant {
        provider: 1,
        receiver: 2,
        class: ClassId(0),
        amount: 1000.0,
    };
    let moved = s.handle_grant(MS * 100, &grant);
    assert!(moved > 0.0);
    let ev = events(&mut s);
    assert!(matches!(ev.first(), Some(Event::Rates(_))), "{ev:?}");
    assert!(matches!(ev.last(), Some(Event::PeerState(_))), "{ev:?}");
}

#[test]
fn without_peers_no_peer_state_is_published() {
    let p = params(Scheme::Janus(Matcher::Pmrfs));
    let q = queues(&ClassSet::janus_default(), p.scheme);
    let mut s = scheduler(p, &q);
    s.poll_window(MS * 100, &q, 0);
    assert!(!events(&mut s)
        .iter()
        .any(|e| matches!(e, Event::PeerState(_))));
}

#[test]
fn native_drains_one_fifo_in_arrival_order() {
    let p = params(Scheme::Native);
    let classes = ClassSet::janus_default();
    let q = queues(&classes, p.scheme);
    let mut s = scheduler(p, &q);
    for (i, c) in [2, 0, 1, 0].into_iter().enumerate() {
        q.push(record(c, i as u64, 100, Duration::ZERO)).unwrap();
    }
    let Poll::Batch(b) = s.poll_batch(Duration::ZERO, wall(Duration::ZERO), &q) else {
        panic!("a batch");
    };
    let seqs: Vec<u64> = b.records.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, [0, 1, 2, 3]);
    assert_eq!(b.seq, 1);
    assert_eq!(s.poll_batch(MS, wall(MS), &q), Poll::Empty);
}

#[test]
fn native_drains_a_fifo_as_large_as_the_largest_class_queue() {
    let caps = [
        QueueCapacity {
            records: 10,
            bytes: 5000,
        },
        QueueCapacity {
            records: 40,
            bytes: 1000,
        },
    ];
    let q = queues_for(Scheme::Native, &caps);
    assert_eq!(q.classes(), 1);
    let cap = q.class(ClassId(1)).capacity();
    assert_eq!((cap.records, cap.bytes), (40, 5000));
    assert_eq!(queues_for(Scheme::QmOnly, &caps).classes(), 2);
}

#[test]
fn batches_are_numbered_in_order() {
    let mut p = params(Scheme::QmOnly);
    p.limits.max_records = 1;
    let q = queues(&ClassSet::janus_default(), p.scheme);
    let mut s = scheduler(p, &q);
    for i in 0..3 {
        q.push(record(2, i, 100, Duration::ZERO)).unwrap();
    }
    let seqs: Vec<u64> = (0..3)
        .map(
            |_| match s.poll_batch(Duration::ZERO, wall(Duration::ZERO), &q) {
                Poll::Batch(b) => b.seq,
                other => panic!("{other:?}"),
            },
        )
        .collect();
    assert_eq!(seqs, [1, 2, 3]);
}

#[test]
fn a_wait_never_reaches_past_the_next_window() {
    let mut p = params(Scheme::QmOnly);
    p.burst_bytes = Some(1000.0);
    p.capacity = 10_000.0;
    let q = queues(&ClassSet::janus_default(), p.scheme);
    let mut s = scheduler(p, &q);
    // Far more than the buckets hold: the second poll must wait for tokens,
    // and at 10 kB/s that is longer than the 100 ms to the next window.
    for i in 0..50 {
        q.push(record(2, i, 968, Duration::ZERO)).unwrap();
    }
    let mut waited = None;
    for _ in 0..10 {
        match s.poll_batch(Duration::ZERO, wall(Duration::ZERO), &q) {
            Poll::Batch(_) => continue,
            Poll::Wait(t) => {
                waited = Some(t);
                break;
            }
            Poll::Gather(_) | Poll::Empty => panic!("records are queued, no gather set"),
        }
    }
    assert_eq!(waited, Some(s.poll_timeout()));
}

/// One step of an arbitrary sequence of what can happen to a scheduler.
#[derive(Debug, Clone)]
enum Op {
    /// A record of this class and payload arrives.
    Arrive(usize, usize),
    /// Time passes.
    Advance(u64),
    /// The driver runs the window if due.
    Window,
    /// The link is free: the driver asks for a batch.
    Poll,
    /// The last batch was confirmed, taking this many milliseconds.
    Deliver(u64),
    /// A peer was granted spare of this class.
    Grant(usize, u32),
    /// A new uplink estimate, bytes/s.
    Link(u32),
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    prop_oneof![
        6 => (0..3usize, 0..3000usize).prop_map(|(c, n)| Op::Arrive(c, n)),
        3 => (0..300u64).prop_map(Op::Advance),
        2 => Just(Op::Window),
        5 => Just(Op::Poll),
        2 => (1..200u64).prop_map(Op::Deliver),
        1 => (0..3usize, 1..500_000u32).prop_map(|(c, a)| Op::Grant(c, a)),
        1 => (1_000..10_000_000u32).prop_map(Op::Link),
    ]
}

fn scheme() -> impl proptest::strategy::Strategy<Value = Scheme> {
    prop_oneof![
        Just(Scheme::Native),
        Just(Scheme::QmOnly),
        Just(Scheme::Janus(Matcher::Pmrfs)),
    ]
}

proptest! {
    /// Whatever happens, in whatever order, every record that entered a
    /// queue leaves in exactly one batch, in arrival order within its class
    /// (or within Native's FIFO), once time lets the buckets refill.
    #[test]
    fn no_record_is_lost_duplicated_or_reordered(
        scheme in scheme(),
        mix in any::<bool>(),
        adaptive in any::<bool>(),
        gather_ms in 0..4u64,
        max_records in 1..64usize,
        ops in proptest::collection::vec(op(), 1..300),
    ) {
        let mut p = params(scheme);
        let gather = MS * gather_ms as u32;
        p.gather = gather;
        p.mix_classes = mix;
        p.adaptive = adaptive;
        p.limits.max_records = max_records;
        p.limits.max_bytes = 16 * 1024;
        let classes = ClassSet::janus_default();
        let q = queues(&classes, scheme);
        let mut s = Scheduler::new(p, classes, &q, link(1e6, MS * 10), 0, 1, Duration::ZERO);
        s.publish_peer_state(true);
        let mut now = Duration::ZERO;
        let mut pushed = 0u64;
        let mut sent: Vec<Record> = Vec::new();
        let mut last: Option<OutBatch> = None;
        let check_batch = |b: &OutBatch, sent: &mut Vec<Record>| {
            prop_assert!(!b.records.is_empty());
            prop_assert!(b.records.len() <= max_records);
            if scheme.uses_classes() {
                prop_assert_eq!(b.class, b.records[0].class);
            }
            sent.extend(b.records.iter().cloned());
            Ok(())
        };
        for op in ops {
            match op {
                Op::Arrive(c, n) => {
                    q.push(record(c, pushed, n, now)).unwrap();
                    pushed += 1;
                }
                Op::Advance(ms) => now += MS * ms as u32,
                Op::Window => { s.poll_window(now, &q, 0); }
                Op::Poll => match s.poll_batch(now, wall(now), &q) {
                    Poll::Batch(b) => {
                        check_batch(&b, &mut sent)?;
                        last = Some(b);
                    }
                    Poll::Wait(t) => prop_assert!(t <= s.poll_timeout().max(now) && (t >= now || t == s.poll_timeout())),
                    Poll::Gather(t) => prop_assert!(t > now && t <= now + gather),
                    Poll::Empty => {}
                },
                Op::Deliver(ms) => if let Some(b) = last.take() {
                    let bytes = b.bytes();
                    s.handle_delivered(Delivered {
                        class: b.class,
                        bytes,
                        raw_bytes: bytes,
                        records: b.records.len(),
                        elapsed: MS * ms as u32,
                    });
                },
                Op::Grant(c, amount) => {
                    s.handle_grant(now, &Grant {
                        provider: 1,
                        receiver: 2,
                        class: ClassId(c as u8),
                        amount: amount as f64,
                    });
                }
                Op::Link(rate) => s.handle_link_estimate(link(rate as f64, MS * 10)),
            }
            while s.poll_event().is_some() {}
        }
        // Then the driver runs on its own: every record comes out.
        for _ in 0..100_000 {
            s.poll_window(now, &q, 0);
            match s.poll_batch(now, wall(now), &q) {
                Poll::Batch(b) => check_batch(&b, &mut sent)?,
                Poll::Wait(t) | Poll::Gather(t) => now = t.max(now + MS),
                Poll::Empty => break,
            }
        }
        prop_assert_eq!(sent.len() as u64, pushed, "every record sent once");
        let unique: HashSet<u64> = sent.iter().map(|r| r.seq).collect();
        prop_assert_eq!(unique.len() as u64, pushed, "no record sent twice");
        let mut last_seq: HashMap<ClassId, u64> = HashMap::new();
        for r in &sent {
            let lane = if scheme.uses_classes() { r.class } else { ClassId(0) };
            if let Some(prev) = last_seq.insert(lane, r.seq) {
                prop_assert!(prev < r.seq, "class {:?}: {} after {}", lane, r.seq, prev);
            }
        }
    }

    /// On a link that behaves as estimated, with the classes' bounds long
    /// enough for one full batch plus an urgent record's own transaction
    /// (what `planning_bound` and the rider budget assume), and the urgent
    /// class within what the link carries: however much tolerant traffic
    /// floods the node, every `ls` record reaches the end of its transaction
    /// within its bound. The driver polls whenever the link frees, a record
    /// arrives, or a wait or window ends, as the relay's task does.
    #[test]
    fn an_urgent_record_is_never_held_behind_a_batch_beyond_its_bound(
        scheme in prop_oneof![Just(Scheme::QmOnly), Just(Scheme::Janus(Matcher::Pmrfs))],
        mix in any::<bool>(),
        adaptive in any::<bool>(),
        kbytes_per_sec in 500..4000u32,
        t_sc_ms in 1..30u64,
        ls_gap_ms in 20..200u64,
        lt_per_ms in 1..8usize,
        payload in 50..1500usize,
    ) {
        let capacity = kbytes_per_sec as f64 * 1000.0;
        let t_sc = MS * t_sc_ms as u32;
        let classes = ClassSet::janus_default();
        let ls_bound = classes.get(ClassId(0)).bound;
        let mut p = params(scheme);
        p.capacity = capacity;
        p.mix_classes = mix;
        p.adaptive = adaptive;
        // The largest batch whose transaction, plus an urgent record's own
        // transaction, fits the `ls` bound. Its own transaction holds its
        // rider budget, or, while `ls` has traffic, a batch at the cap of
        // its horizon if that fits the horizon.
        let est = link(capacity, t_sc);
        let h = crate::admission::horizon(ls_bound);
        let cap = crate::admission::batch_cap(&est, h);
        let mut own_bytes = rider_budget(ls_bound, capacity, RIDER_FLOOR_BYTES);
        if crate::admission::drain_time(1, cap as u64, &est) <= h {
            own_bytes = own_bytes.max(cap);
        }
        let own = est.transaction_secs(own_bytes as f64);
        let room = ls_bound.as_secs_f64() - own - t_sc.as_secs_f64();
        prop_assume!(room > 0.002);
        p.limits.max_bytes = ((room * capacity) as usize).clamp(2048, 64 * 1024);
        prop_assume!(est.transaction_secs(p.limits.max_bytes as f64) + own <= ls_bound.as_secs_f64());
        let q = queues(&classes, scheme);
        let mut s = Scheduler::new(p, classes, &q, est, 0, 1, Duration::ZERO);

        let end = Duration::from_secs(2);
        let mut ls_pushed = 0u64;
        let mut now = Duration::ZERO;
        let mut next_ls = Duration::ZERO;
        let mut next_lt = Duration::ZERO;
        let mut link_free_at = Duration::ZERO;
        let mut on_link: Option<(OutBatch, Duration)> = None;
        let mut seq = 0u64;
        let mut worst = Duration::ZERO;
        let mut ls_sent = 0u64;
        let mut wake;
        while now < end || ls_sent < ls_pushed {
            prop_assert!(now < end + Duration::from_secs(600), "the backlog never drained");
            // Arrivals due by now (none after `end`).
            while next_ls <= now && next_ls < end {
                q.push(record(0, seq, payload, next_ls)).unwrap();
                seq += 1;
                ls_pushed += 1;
                next_ls += MS * ls_gap_ms as u32;
            }
            while next_lt <= now && next_lt < end {
                for _ in 0..lt_per_ms {
                    q.push(record(2, seq, payload, next_lt)).unwrap();
                    seq += 1;
                }
                next_lt += MS;
            }
            if let Some((b, done)) = on_link.take() {
                if done <= now {
                    for r in b.records.iter().filter(|r| r.class == ClassId(0)) {
                        let waited = Duration::from_micros(wall(done) - r.ingress_us);
                        worst = worst.max(waited);
                        ls_sent += 1;
                    }
                    let bytes = b.bytes();
                    s.handle_delivered(Delivered {
                        class: b.class,
                        bytes,
                        raw_bytes: bytes,
                        records: b.records.len(),
                        elapsed: Duration::from_secs_f64(est.transaction_secs(bytes as f64)),
                    });
                } else {
                    on_link = Some((b, done));
                }
            }
            s.poll_window(now, &q, 0);
            while s.poll_event().is_some() {}
            if on_link.is_none() {
                match s.poll_batch(now, wall(now), &q) {
                    Poll::Batch(b) => {
                        let done = now + Duration::from_secs_f64(est.transaction_secs(b.bytes() as f64));
                        link_free_at = done;
                        on_link = Some((b, done));
                        wake = done;
                    }
                    Poll::Wait(t) | Poll::Gather(t) => wake = t,
                    Poll::Empty => wake = s.poll_timeout(),
                }
            } else {
                wake = link_free_at;
            }
            let mut next = wake.min(s.poll_timeout());
            if next_ls < end { next = next.min(next_ls); }
            if next_lt < end { next = next.min(next_lt); }
            now = next.max(now + Duration::from_micros(1));
        }
        prop_assert!(ls_sent > 0);
        prop_assert!(worst <= ls_bound, "an ls record took {:?} (bound {:?})", worst, ls_bound);
    }
}

#[test]
fn reconfigure_keeps_every_record_and_installs_the_new_rates() {
    let p = params(Scheme::QmOnly);
    let classes = ClassSet::janus_default();
    let q = queues(&classes, p.scheme);
    let mut s = scheduler(p.clone(), &q);
    let mut sent = Vec::new();
    for i in 0..300 {
        q.push(record((i % 3) as usize, i, 200, Duration::ZERO))
            .unwrap();
    }
    // Some records leave the queues (one batch), some are held as heads.
    if let Poll::Batch(b) = s.poll_batch(MS, wall(MS), &q) {
        sent.extend(b.records.iter().map(|r| r.seq));
    }
    let mut wider = ClassSet::janus_default()
        .iter()
        .map(|(_, c)| c.clone())
        .collect::<Vec<_>>();
    wider[0].bound = MS * 50;
    wider[2].min_share = 0.25;
    let new = SchedulerParams {
        capacity: 2e6,
        track_uplink: false,
        window: MS * 250,
        ..p
    };
    events(&mut s);
    s.reconfigure(MS * 2, new, ClassSet::new(wider).unwrap())
        .unwrap();
    let rates = s.rates();
    assert!(
        (rates.iter().sum::<f64>() - 2e6).abs() < 1.0,
        "the new capacity is shared out: {rates:?}"
    );
    assert!(rates[2] >= 0.25 * 2e6 - 1.0, "lt's min_share: {rates:?}");
    let announced: Vec<Event> = events(&mut s)
        .into_iter()
        .filter(|e| matches!(e, Event::Rates(_)))
        .collect();
    assert!(matches!(&announced[..], [Event::Rates(r)] if *r == rates));
    assert_eq!(s.poll_timeout(), MS * 252, "a full new window from now");
    let mut now = MS * 2;
    while sent.len() < 300 {
        now += MS * 10;
        s.poll_window(now, &q, 0);
        while let Poll::Batch(b) = s.poll_batch(now, wall(now), &q) {
            sent.extend(b.records.iter().map(|r| r.seq));
        }
        assert!(
            now < Duration::from_secs(60),
            "records stuck: {}",
            sent.len()
        );
    }
    sent.sort_unstable();
    assert_eq!(sent, (0..300).collect::<Vec<_>>(), "each record once");
}

#[test]
fn reconfigure_refuses_a_new_scheme_or_new_class_names_and_changes_nothing() {
    let p = params(Scheme::Janus(Matcher::Pmrfs));
    let q = queues(&ClassSet::janus_default(), p.scheme);
    let mut s = scheduler(p.clone(), &q);
    let before = s.rates();
    events(&mut s);
    let native = SchedulerParams {
        scheme: Scheme::QmOnly,
        capacity: 5e6,
        ..p.clone()
    };
    assert_eq!(
        s.reconfigure(MS, native, ClassSet::janus_default()),
        Err(ReconfigureError::Scheme {
            from: Scheme::Janus(Matcher::Pmrfs),
            to: Scheme::QmOnly
        })
    );
    let renamed = ClassSet::new(vec![
        crate::class::LatencyClass::new("urgent", MS * 100),
        crate::class::LatencyClass::new("nm", MS * 500),
        crate::class::LatencyClass::new("lt", MS * 1000),
    ])
    .unwrap();
    let wider = SchedulerParams {
        capacity: 5e6,
        track_uplink: false,
        ..p
    };
    assert_eq!(
        s.reconfigure(MS, wider, renamed),
        Err(ReconfigureError::Classes)
    );
    assert_eq!(s.rates(), before);
    assert!(events(&mut s).is_empty());
    assert_eq!(s.poll_timeout(), MS * 100);
}

#[test]
fn a_tracked_capacity_survives_a_reconfigure() {
    let p = params(Scheme::QmOnly);
    let q = queues(&ClassSet::janus_default(), p.scheme);
    let mut s = scheduler(p.clone(), &q);
    s.handle_link_estimate(link(3e6, MS * 10));
    assert!(s.poll_window(MS * 100, &q, 0));
    let followed = 3e6 * (1.0 - UPLINK_HEADROOM);
    assert!((s.capacity() - followed).abs() < 1.0);
    s.reconfigure(MS * 101, p, ClassSet::janus_default())
        .unwrap();
    assert!(
        (s.capacity() - followed).abs() < 1.0,
        "the measured C_out stays, not the configured prior"
    );
}

/// A scheduler that woke late, with a deep backlog of the least urgent
/// class and plenty of tokens, still hands out batches no longer on the
/// link than the horizon of the tightest class with traffic.
#[test]
fn a_late_wake_up_does_not_commit_a_long_transfer() {
    let p = SchedulerParams {
        burst_bytes: Some(1e9),
        limits: BatchLimits {
            max_records: 100_000,
            max_bytes: 8 << 20,
        },
        ..params(Scheme::QmOnly)
    };
    let q = queues(&ClassSet::janus_default(), p.scheme);
    // A 4 Mbit/s link with 10 ms per transaction.
    let l = link(500_000.0, MS * 10);
    let mut s = Scheduler::new(p, ClassSet::janus_default(), &q, l, 0, 1, Duration::ZERO);
    for i in 0..20_000 {
        q.push(record(2, i, 200, Duration::ZERO)).unwrap();
    }
    q.push(record(0, 1_000_000, 200, Duration::ZERO)).unwrap();
    // The first window sees ls and lt traffic: the horizon is ls's.
    assert!(s.poll_window(MS * 100, &q, 0));
    assert_eq!(s.horizon(), MS * 35);
    // Very late: ten seconds of tokens.
    let now = Duration::from_secs(10);
    let cap = crate::admission::batch_cap(&l, s.horizon());
    let mut seen = 0;
    while let Poll::Batch(b) = s.poll_batch(now, wall(now), &q) {
        let single = b.records.len() == 1;
        assert!(
            b.bytes() <= cap || single,
            "a batch of {} B against a cap of {cap} B",
            b.bytes()
        );
        seen += 1;
        if seen > 50 {
            break;
        }
    }
    assert!(seen > 1);
}

proptest! {
    /// Whatever the link, the bounds and how late the poll, no batch takes
    /// longer on the link than the horizon (or is one record).
    #[test]
    fn batches_fit_the_horizon_however_late_the_poll(
        bw in 50_000.0f64..50e6,
        tsc_ms in 0u32..40,
        late_ms in 0u64..30_000,
        sizes in proptest::collection::vec(16usize..4000, 1..300),
    ) {
        let p = SchedulerParams {
            burst_bytes: Some(1e12),
            limits: BatchLimits { max_records: 100_000, max_bytes: 16 << 20 },
            ..params(Scheme::QmOnly)
        };
        let q = queues(&ClassSet::janus_default(), p.scheme);
        let l = link(bw, MS * tsc_ms);
        let mut s = Scheduler::new(p, ClassSet::janus_default(), &q, l, 0, 1, Duration::ZERO);
        for (i, size) in sizes.iter().enumerate() {
            q.push(record(i % 3, i as u64, *size, Duration::ZERO)).unwrap();
        }
        s.poll_window(MS * 100, &q, 0);
        let now = MS * 100 + Duration::from_millis(late_ms);
        let cap = crate::admission::batch_cap(&l, s.horizon());
        let mut n = 0;
        while let Poll::Batch(b) = s.poll_batch(now, wall(now), &q) {
            prop_assert!(b.bytes() <= cap || b.records.len() == 1, "{} > {cap}", b.bytes());
            n += 1;
            if n > 400 { break; }
        }
    }
}

#[test]
fn without_tracking_the_configured_link_stands() {
    let classes = ClassSet::janus_default();
    let mut p = params(Scheme::QmOnly);
    p.track_uplink = false;
    let q = queues(&classes, p.scheme);
    let configured = link(2_250_000.0, MS * 50);
    let mut s = Scheduler::new(
        p.clone(),
        classes.clone(),
        &q,
        configured,
        0,
        1,
        Duration::ZERO,
    );
    s.handle_link_estimate(link(2_250_000.0, MS));
    assert_eq!(s.link(), configured);
    // Tracking again (a reload) follows the next estimate.
    p.track_uplink = true;
    s.reconfigure(MS, p, classes).unwrap();
    s.handle_link_estimate(link(2_250_000.0, MS));
    assert_eq!(s.link().per_transaction, MS);
}

#[test]
fn batches_follow_the_pipe_and_an_auto_burst_follows_the_batches() {
    // A fast link (100 MB/s, 1 ms per transaction) and a deep backlog of
    // the least urgent class: batches as large as the pipe asks for, and
    // with burst = "auto" the bucket holds one such batch.
    let mut p = params(Scheme::QmOnly);
    p.capacity = 100e6;
    p.burst_bytes = None;
    p.adaptive = false;
    p.limits = BatchLimits {
        max_records: 1 << 16,
        max_bytes: 4 << 20,
    };
    let q = queues(&ClassSet::janus_default(), p.scheme);
    let mut s = on_a_fast_link(p, &q);
    for seq in 0..20_000u64 {
        q.push(record(2, seq, 1000, Duration::ZERO)).unwrap();
    }
    let sizes = |s: &mut Scheduler, at: Duration| -> usize {
        match s.poll_batch(at, wall(at), &q) {
            Poll::Batch(b) => b.bytes(),
            other => panic!("{other:?}"),
        }
    };
    s.handle_pipe_batch(200_000);
    let first = sizes(&mut s, MS * 200);
    assert!((190_000..=200_000).contains(&first), "{first} bytes");
    s.handle_pipe_batch(1_000_000);
    // A second later the bucket is full again: one batch of the new size.
    let second = sizes(&mut s, MS * 1200);
    assert!((990_000..=1_000_000).contains(&second), "{second} bytes");
}

#[test]
fn a_backlog_spooled_on_disk_counts_for_its_class() {
    // After an outage both classes drain a deep backlog of which their
    // queues hold only a window; the reader refills lt as fast as ls, so
    // lt's queue looks as busy. Told what is still on disk, PBTT gives the
    // urgent class the link; without it, lt takes most of it.
    let rates = |spooled: &[u64]| -> Vec<f64> {
        let mut p = params(Scheme::QmOnly);
        p.capacity = 100e6;
        let q = queues(&ClassSet::janus_default(), p.scheme);
        let mut s = on_a_fast_link(p, &q);
        for seq in 0..250u64 {
            q.push(record(0, seq, 4000, Duration::ZERO)).unwrap();
        }
        for seq in 0..5_000u64 {
            q.push(record(2, seq, 4000, Duration::ZERO)).unwrap();
        }
        s.handle_spooled(spooled);
        assert!(s.window_due(MS * 100));
        assert!(s.poll_window(MS * 100, &q, 0));
        s.rates()
    };
    let blind = rates(&[]);
    let told = rates(&[80 << 20, 0, 160 << 20]);
    assert!(
        blind[2] > blind[0],
        "without the spool's backlog: {blind:?}"
    );
    assert!(told[0] > 0.9 * 100e6, "told of it: {told:?}");
    assert!(told[2] < 0.05 * 100e6, "told of it: {told:?}");
}

#[test]
fn receipts_keep_what_a_confirmation_needs() {
    let record = |seq: u64| Record {
        key: Bytes::from_static(b"plant/7/temp"),
        class: ClassId(1),
        origin: 3,
        seq,
        ingress_us: WALL0 + seq,
        payload: Bytes::from(vec![7u8; 256]),
        spool: Some(seq * 2),
    };
    let batch = OutBatch {
        seq: 9,
        class: ClassId(1),
        records: (0..4).map(record).collect(),
    };
    let receipts = batch.receipts();
    // The memory plan counts a receipt at 48 bytes (`weir::memory`).
    assert!(std::mem::size_of::<Receipt>() <= 48);
    assert_eq!(receipts.len(), 4);
    for (i, r) in receipts.iter().enumerate() {
        let i = i as u64;
        assert_eq!(
            (r.class, r.origin, r.seq, r.ingress_us, r.spool),
            (ClassId(1), 3, i, WALL0 + i, Some(i * 2))
        );
    }
}
