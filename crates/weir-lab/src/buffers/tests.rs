use super::*;

fn sample(ms: u64, bytes: u64, packets: u64, drops: u64, backlog: u64) -> Sample {
    Sample {
        at: Duration::from_millis(ms),
        bytes,
        packets,
        drops,
        backlog,
    }
}

#[test]
fn drops_closer_than_a_round_trip_are_one_congestion_event() {
    let rtt = Duration::from_millis(40);
    let s = [
        sample(0, 0, 0, 0, 0),
        sample(10, 1000, 1, 2, 3000),
        sample(20, 2000, 2, 3, 3000),
        // 30 ms after the last drop: the same event.
        sample(50, 3000, 3, 5, 3000),
        sample(60, 4000, 4, 5, 0),
        // 100 ms after: a new one.
        sample(150, 5000, 5, 9, 1000),
    ];
    let m = measure(&s, (Duration::ZERO, Duration::from_secs(1)), rtt, 40.0).unwrap();
    assert_eq!(m.drops, 9);
    assert_eq!(m.events, 2);
    assert_eq!(m.drops_per_event(), 4.5);
    assert!((m.loss - 9.0 / 14.0).abs() < 1e-12);
}

#[test]
fn queuing_delay_is_backlog_over_departures() {
    // 5,000 bytes sent per 10 ms = 500 kB/s; a steady 5,000-byte
    // backlog waits 10 ms.
    let s: Vec<Sample> = (0..=100)
        .map(|k| sample(k * 10, k * 5000, k * 4, 0, 5000))
        .collect();
    let m = measure(
        &s,
        (Duration::ZERO, Duration::from_secs(2)),
        Duration::from_millis(40),
        40.0,
    )
    .unwrap();
    assert!(
        (m.queuing_delay_ms - 10.0).abs() < 1e-9,
        "{}",
        m.queuing_delay_ms
    );
    assert_eq!(m.events, 0);
    assert_eq!(m.drops_per_event(), 0.0);
}
