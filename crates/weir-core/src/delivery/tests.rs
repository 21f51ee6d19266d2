use super::*;

const MS: Duration = Duration::from_millis(1);

fn params(window: usize, urgent_lane: bool) -> DeliveryParams {
    DeliveryParams {
        window,
        urgent_lane,
        carried_on_send: false,
        link_prior: LinkEstimate {
            bytes_per_sec: 1e6,
            per_transaction: MS,
        },
        retry_max: MS * 400,
        max_in_flight_bytes: 64 << 20,
        max_batch_bytes: 4 << 20,
    }
}

/// Takes every event, returning the sequence numbers confirmed.
fn confirmed(d: &mut Delivery<u64>) -> Vec<u64> {
    let mut out = Vec::new();
    while let Some(e) = d.poll_event() {
        if let Event::Confirmed(c) = e {
            out.push(c.batch);
        }
    }
    out
}

/// Permits and batches until the window is full: the batches sent.
fn fill(d: &mut Delivery<u64>, now: Duration, next: &mut u64) -> Vec<u64> {
    let mut sent = Vec::new();
    while d.poll_permit(now) == Some(Offer::Any) {
        assert!(d.may_receive());
        d.handle_batch(now, *next, 1000);
        *next += 1;
        let seq = *d.poll_send(now).expect("a free slot");
        d.handle_sent(now);
        sent.push(seq);
    }
    sent
}

#[test]
fn a_window_of_batches_is_sent_before_the_first_confirm() {
    let mut d = Delivery::new(params(4, false), Duration::ZERO);
    let mut next = 1;
    assert_eq!(fill(&mut d, Duration::ZERO, &mut next), vec![1, 2, 3, 4]);
    assert_eq!(d.poll_permit(MS), None, "the window is full");
    d.handle_confirm(MS * 5);
    assert_eq!(confirmed(&mut d), vec![1]);
    assert_eq!(fill(&mut d, MS * 5, &mut next), vec![5]);
}

#[test]
fn a_failed_confirm_resends_it_and_every_later_batch_in_order_after_a_backoff() {
    let mut d = Delivery::new(params(4, false), Duration::ZERO);
    let mut next = 1;
    fill(&mut d, Duration::ZERO, &mut next);
    d.handle_confirm(MS);
    assert_eq!(confirmed(&mut d), vec![1]);
    d.handle_failure(MS * 2);
    let retry = d.poll_timeout().expect("a retry is due");
    assert_eq!(retry, MS * 2 + RETRY_INITIAL);
    assert!(d.poll_send(MS * 3).is_none(), "not before the backoff");
    let mut again = Vec::new();
    while let Some(&b) = d.poll_send(retry) {
        again.push(b);
        d.handle_sent(retry);
    }
    assert_eq!(again, vec![2, 3, 4]);
    for i in 0..3u32 {
        d.handle_confirm(retry + MS * (i + 1));
    }
    let events: Vec<_> = std::iter::from_fn(|| d.poll_event()).collect();
    assert!(events.iter().any(|e| matches!(
        e,
        Event::Retrying {
            batches: 3,
            new: 3,
            attempt: 1
        }
    )));
    let done: Vec<u64> = events
        .into_iter()
        .filter_map(|e| match e {
            Event::Confirmed(c) => Some(c.batch),
            _ => None,
        })
        .collect();
    assert_eq!(done, vec![2, 3, 4]);
}

#[test]
fn a_failed_send_is_retried_with_a_doubling_backoff_up_to_its_cap() {
    let mut d = Delivery::new(params(1, false), Duration::ZERO);
    assert_eq!(d.poll_permit(Duration::ZERO), Some(Offer::Any));
    d.handle_batch(Duration::ZERO, 7u64, 100);
    let mut now = Duration::ZERO;
    let mut waits = Vec::new();
    for _ in 0..4 {
        assert_eq!(d.poll_send(now), Some(&7));
        d.handle_failure(now);
        let at = d.poll_timeout().unwrap();
        waits.push(at - now);
        now = at;
    }
    assert_eq!(waits, vec![MS * 100, MS * 200, MS * 400, MS * 400]);
    assert_eq!(d.poll_send(now), Some(&7));
    d.handle_sent(now);
    d.handle_confirm(now + MS);
    assert_eq!(confirmed(&mut d), vec![7]);
    d.handle_closed();
    assert!(d.is_done());
}

#[test]
fn the_urgent_lane_has_a_window_of_its_own_beside_a_full_one() {
    let mut d = Delivery::new(params(2, true), Duration::ZERO);
    let mut next = 1;
    // The window full, `fill` was given the lane's permit last.
    assert_eq!(fill(&mut d, Duration::ZERO, &mut next).len(), 2);
    assert!(d.may_receive());
    d.handle_batch(Duration::ZERO, 100, 10);
    assert!(d.last_was_urgent());
    assert_eq!(
        d.poll_send(Duration::ZERO),
        Some(&100),
        "beyond the full window"
    );
    d.handle_sent(Duration::ZERO);
    // The lane's second slot.
    assert_eq!(d.poll_permit(Duration::ZERO), Some(Offer::Urgent));
    d.handle_batch(Duration::ZERO, 101, 10);
    assert_eq!(d.poll_send(Duration::ZERO), Some(&101));
    d.handle_sent(Duration::ZERO);
    assert_eq!(d.poll_permit(Duration::ZERO), None, "both windows full");
    let unconfirmed: Vec<u64> = d.unconfirmed().copied().collect();
    assert_eq!(unconfirmed, vec![1, 2, 100, 101]);
}

#[test]
fn a_full_pipe_holds_the_permit_while_window_slots_are_free() {
    let mut p = params(64, false);
    p.max_in_flight_bytes = 4000;
    let mut d = Delivery::new(p, Duration::ZERO);
    let mut next = 1;
    let sent = fill(&mut d, Duration::ZERO, &mut next);
    assert_eq!(
        sent.len(),
        4,
        "4 batches of 1000 bytes fill a 4000-byte pipe"
    );
    d.handle_confirm(MS);
    assert_eq!(fill(&mut d, MS, &mut next).len(), 1);
}

#[test]
fn unconfirmed_batches_are_reported_at_shutdown() {
    let mut d = Delivery::new(params(4, false), Duration::ZERO);
    let mut next = 1;
    fill(&mut d, Duration::ZERO, &mut next);
    d.handle_confirm(MS);
    d.handle_closed();
    assert!(!d.is_done());
    assert_eq!(d.unconfirmed().copied().collect::<Vec<_>>(), vec![2, 3, 4]);
    assert_eq!(d.poll_permit(MS), None, "nothing is offered once closed");
}

#[test]
fn a_busy_pipe_asks_for_larger_batches() {
    // A destination confirming 20 ms after each send at up to 200 MB/s:
    // with batches back to back the pipe grows past the floor.
    let mut d = Delivery::new(params(64, false), Duration::ZERO);
    let first = d.pipe().batch_bytes();
    let mut now = Duration::ZERO;
    let mut seq = 0u64;
    let mut flight: VecDeque<Duration> = VecDeque::new();
    let mut free_at = Duration::ZERO;
    while now < Duration::from_secs(3) {
        while d.poll_permit(now).is_some() {
            let bytes = d.pipe().batch_bytes();
            d.handle_batch(now, seq, bytes);
            seq += 1;
            d.poll_send(now).expect("sendable");
            d.handle_sent(now);
            free_at = free_at.max(now) + Duration::from_secs_f64(bytes as f64 / 200e6);
            flight.push_back(free_at + MS * 20);
        }
        now = match (flight.front(), d.poll_timeout()) {
            (Some(&c), Some(t)) if t < c => t,
            (Some(&c), _) => {
                flight.pop_front();
                d.handle_confirm(c);
                c
            }
            (None, Some(t)) => t,
            (None, None) => break,
        };
        while d.poll_event().is_some() {}
    }
    assert!(
        d.pipe().batch_bytes() >= 4 * first,
        "batches of {} bytes (from {first})",
        d.pipe().batch_bytes()
    );
    let rate = d.pipe().delivery_rate().unwrap();
    assert!(rate > 150e6, "delivering {rate:.0} B/s of 200 MB/s");
}

#[test]
fn batches_that_cross_faster_than_the_estimate_lift_it_above_the_prior() {
    // The default prior (18 Mbit/s) and a destination that confirms 2 kB
    // batches half a millisecond after they were sent: the link carries at
    // least 4 MB/s, whatever the fits say, and the estimate acted on
    // follows (it stayed at the prior before, and C_out with it).
    let mut p = params(8, false);
    p.link_prior = LinkEstimate {
        bytes_per_sec: 2.15e6,
        per_transaction: MS * 50,
    };
    let mut d = Delivery::new(p, Duration::ZERO);
    let mut now = Duration::ZERO;
    let mut acted = Vec::new();
    for seq in 0..200u64 {
        assert!(d.poll_permit(now).is_some());
        d.handle_batch(now, seq, 2000);
        d.poll_send(now).expect("sendable");
        d.handle_sent(now);
        now += Duration::from_micros(500);
        d.handle_confirm(now);
        while let Some(e) = d.poll_event() {
            if let Event::Link(l) = e {
                acted.push(l.bytes_per_sec);
            }
        }
        now += MS;
    }
    let last = *acted.last().expect("published");
    assert!(last >= 3.9e6, "acted on {last:.0} B/s");
    assert!(d.link().bytes_per_sec >= 3.9e6);
}

/// The offers at `now` until none comes (at most 4), each taken with a
/// batch that is sent at once.
fn offers(d: &mut Delivery<u64>, now: Duration, next: &mut u64) -> Vec<Offer> {
    let mut out = Vec::new();
    while let Some(o) = d.poll_permit(now) {
        out.push(o);
        if out.len() == 4 {
            break;
        }
        d.handle_batch(now, *next, 1000);
        *next += 1;
        if d.poll_send(now).is_some() {
            d.handle_sent(now);
        }
    }
    out
}

#[test]
fn the_urgent_lane_closes_where_every_round_trip_is_twice_the_bound() {
    // A 100 ms class: the lane stays open under 200 ms round trips.
    for (round_trip, open) in [(MS * 150, true), (MS * 250, false)] {
        let mut d = Delivery::new(params(2, true), Duration::ZERO);
        d.set_horizon(crate::admission::horizon(MS * 100));
        let mut next = 1;
        assert_eq!(d.poll_permit(Duration::ZERO), Some(Offer::Any));
        d.handle_batch(Duration::ZERO, next, 1000);
        next += 1;
        assert!(d.poll_send(Duration::ZERO).is_some());
        d.handle_sent(Duration::ZERO);
        d.handle_confirm(round_trip);
        let got = offers(&mut d, round_trip, &mut next);
        assert_eq!(
            got.contains(&Offer::Urgent),
            open,
            "round trip {round_trip:?}: offers {got:?}"
        );
        if !open {
            assert_eq!(got, vec![Offer::Any, Offer::Any], "the window alone");
        }
    }
}
