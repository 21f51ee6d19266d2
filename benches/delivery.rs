//! The delivery machine's decisions (`weir_core::delivery`): what a batch
//! costs from the scheduler's permit to its confirmation (permit, hand-over,
//! send, confirm: the estimator, the pipe and the carried bound included),
//! with a window of 8 and of 64 batches (64 KiB each) in flight.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use weir_core::delivery::{Delivery, DeliveryParams, Event};
use weir_core::link_estimate::LinkEstimate;

fn params(window: usize) -> DeliveryParams {
    DeliveryParams {
        window,
        urgent_lane: true,
        carried_on_send: false,
        link_prior: LinkEstimate {
            bytes_per_sec: 2.15e6,
            per_transaction: Duration::from_millis(50),
        },
        retry_max: Duration::from_secs(30),
        max_in_flight_bytes: 32 << 20,
        max_batch_bytes: 4 << 20,
    }
}

/// One batch through the machine per iteration, `window` kept in flight:
/// permit, hand-over, send, and the oldest confirmed.
fn per_batch(c: &mut Criterion) {
    let mut g = c.benchmark_group("delivery");
    g.throughput(Throughput::Elements(1));
    for window in [8usize, 64] {
        g.bench_with_input(
            BenchmarkId::new("batch_through", window),
            &window,
            |b, &window| {
                let mut d = Delivery::new(params(window), Duration::ZERO);
                let mut now = Duration::ZERO;
                let mut seq = 0u64;
                let mut in_flight = 0usize;
                b.iter(|| loop {
                    // One batch confirmed per iteration: permits and sends
                    // while the window and the pipe allow, else the
                    // oldest's confirmation.
                    now += Duration::from_micros(200);
                    let mut moved = false;
                    if d.poll_permit(now).is_some() && d.may_receive() {
                        d.handle_batch(now, seq, 64 << 10);
                        seq += 1;
                        moved = true;
                    }
                    if d.poll_send(now).is_some() {
                        d.handle_sent(now);
                        in_flight += 1;
                        moved = true;
                    }
                    if !moved && in_flight > 0 {
                        d.handle_confirm(now);
                        in_flight -= 1;
                    }
                    let mut done = false;
                    while let Some(e) = d.poll_event() {
                        if let Event::Confirmed(c) = e {
                            black_box(c.batch);
                            done = true;
                        }
                    }
                    if done {
                        break;
                    }
                });
            },
        );
    }
    g.finish();
}

criterion_group!(benches, per_batch);
criterion_main!(benches);
