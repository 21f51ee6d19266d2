//! The default config's decisions on simulated links ([`weir_core::sim`]):
//! the scheduler and the delivery machine as `weir run` configures them
//! from `weir print-default-config` (with an AMQP egress), offered more
//! than the link carries.

use std::time::Duration;

use weir_core::delivery::DeliveryParams;
use weir_core::sim::{self, LinkModel, Load, Report, SimParams};

use crate::config::{self, EgressSink};

const MS: Duration = Duration::from_millis(1);

/// The default config with an AMQP egress, as the relay builds its
/// machines from it.
fn default_params(link: LinkModel, load: Load, seconds: u64) -> SimParams {
    params_with("", link, load, seconds)
}

/// The default config with an AMQP egress and `extra` (TOML tables of
/// their own), as the relay builds its machines from it.
fn params_with(extra: &str, link: LinkModel, load: Load, seconds: u64) -> SimParams {
    let cfg = config::parse(
        &format!(
            "[egress]\nkind = \"amqp\"\n[egress.amqp]\nurl = \"amqp://127.0.0.1:5672/%2f\"\n{extra}"
        ),
        "sim",
    )
    .expect("the default config with an AMQP egress");
    let EgressSink::Amqp(amqp) = &cfg.egress.sink else {
        unreachable!("asked for amqp")
    };
    SimParams {
        scheduler: crate::reload::scheduler_params(&cfg),
        delivery: DeliveryParams {
            window: amqp.max_in_flight.max(1),
            urgent_lane: amqp.urgent_lane,
            carried_on_send: cfg.egress.link.is_some(),
            link_prior: crate::reload::link_prior(&cfg),
            retry_max: amqp.reconnect_backoff_max,
            max_in_flight_bytes: crate::memory::pipe_bytes(None),
            max_batch_bytes: cfg.scheduler.max_batch_bytes as u64,
        },
        classes: cfg.classes.clone(),
        capacities: cfg.memory_capacities(),
        channel: amqp.max_in_flight.max(1),
        link,
        load,
        step: Duration::from_micros(200),
        duration: Duration::from_secs(seconds),
        warm_up: Duration::from_secs(2),
    }
}

/// A link of `mbit` Mbit/s whose batches reach the broker `delay` after
/// they left, confirmed 1 ms after.
fn link(mbit: f64, delay: Duration) -> LinkModel {
    LinkModel {
        bytes_per_sec: mbit * 1e6 / 8.0,
        delay,
        confirm: MS,
        framing: 1514.0 / 1448.0,
        per_transaction: 120,
        confirm_every: match std::env::var("WEIR_SIM_CADENCE_MS") {
            Ok(v) => MS * v.parse::<u32>().expect("ms"),
            Err(_) => Duration::ZERO,
        },
        serial: false,
    }
}

/// 256 B records at `overload` times what the link carries: 5 % `ls`,
/// 15 % `nm`, 80 % `lt` (the link sweep's load).
fn load(mbit: f64, overload: f64) -> Load {
    let total = overload * mbit * 1e6 / 8.0 / 256.0;
    Load {
        rates: vec![total * 0.05, total * 0.15, total * 0.80],
        payload: 256,
        key: 12,
    }
}

fn show(name: &str, r: &Report, mbit: f64) {
    let cap = mbit * 1e6 / 8.0;
    let last = r.samples.last();
    eprintln!(
        "{name}: link {:.0} of {cap:.0} B/s ({:.0} %), {:.0} rec/s, {} batches, acted {:.0} B/s, pipe batch {}",
        r.link_bytes_per_sec,
        100.0 * r.link_bytes_per_sec / cap,
        r.records_per_sec,
        r.batches,
        last.map_or(0.0, |s| s.acted),
        last.map_or(0, |s| s.pipe_batch)
    );
    if std::env::var("WEIR_SIM_SAMPLES").is_ok() {
        for s in &r.samples {
            eprintln!(
                "  {:>5.2}s acted {:>9.0} cap {:>9.0} rates {:?} queued {:?} flight {} pipe {}/{} linkq {:?} link {:.0} {}",
                s.at.as_secs_f64(),
                s.acted,
                s.capacity,
                s.rates.iter().map(|r| *r as u64).collect::<Vec<_>>(),
                s.queued,
                s.in_flight,
                s.pipe_bytes,
                s.pipe_batch,
                s.link_queue,
                s.link_rate,
                s.measures.map_or(String::new(), |m| format!(
                    "| queued {} {:?} sat {} delivering {:.0} rtt {:?} proven {:.0}",
                    m.queued, m.queue, m.saturated, m.delivery_rate, m.round_trip, m.proven
                ))
            );
        }
    }
    for (i, c) in r.classes.iter().enumerate() {
        eprintln!(
            "  class {i}: offered {} refused {} delivered {} p99 {:?} late(100ms) {} batches {} of {} B",
            c.offered,
            c.refused,
            c.delivered,
            c.quantile(0.99),
            c.late(MS * 100),
            c.batches.0,
            c.batches.1.checked_div(c.batches.0).unwrap_or(0)
        );
        if std::env::var("WEIR_SIM_SAMPLES").is_ok() && !c.late_at.is_empty() {
            let secs: Vec<String> = c
                .late_at
                .iter()
                .step_by(c.late_at.len().div_ceil(40))
                .map(|t| format!("{:.2}", t.as_secs_f64()))
                .collect();
            eprintln!("    late at {}", secs.join(" "));
        }
    }
}

/// Runs the default config on `mbit` Mbit/s with a `rtt` ms round trip
/// at 1.7x overload; prints the figures (and with `WEIR_SIM_SAMPLES` set,
/// the time series).
fn cell(mbit: f64, rtt: u32) -> Report {
    let p = default_params(link(mbit, MS * rtt), load(mbit, 1.7), 12);
    let r = sim::run(&p);
    show(&format!("{mbit} Mbit/s @ {rtt} ms"), &r, mbit);
    r
}

/// The link carried at least `share` of its rate, `ls` records were all
/// within 100 ms and `nm` was delivered.
fn assert_full(r: &Report, mbit: f64, share: f64) {
    let cap = mbit * 1e6 / 8.0;
    assert!(
        r.link_bytes_per_sec >= share * cap,
        "{mbit} Mbit/s: {:.0} of {cap:.0} B/s carried",
        r.link_bytes_per_sec
    );
    let ls = &r.classes[0];
    assert_eq!(ls.late(MS * 100), 0, "{mbit} Mbit/s: ls records late");
    let nm = &r.classes[1];
    assert!(
        nm.delivered as f64 >= 0.9 * nm.offered as f64,
        "{mbit} Mbit/s: nm {} of {} delivered",
        nm.delivered,
        nm.offered
    );
}

#[test]
fn short_round_trips_keep_the_link_full_with_the_defaults() {
    // Urgent batches sent every few milliseconds each overlap the one
    // before: a clock that charged each its round trip ran seconds ahead
    // and the egress asked for nothing but `ls` (15 % of the link).
    for mbit in [1.0, 4.0, 18.0] {
        let r = cell(mbit, 5);
        assert_full(&r, mbit, 0.95);
    }
}

/// Any cells (`WEIR_SIM_CELLS=4@5,100@50`, rate in Mbit/s @ round trip in
/// ms), printed: a probe for working on the decisions, which asserts only
/// that records were delivered.
#[test]
fn cells_from_the_environment() {
    let Ok(v) = std::env::var("WEIR_SIM_CELLS") else {
        return;
    };
    for c in v.split(',') {
        let (m, r) = c.split_once('@').expect("RATE@RTT");
        let r = cell(m.parse().expect("rate"), r.parse().expect("rtt"));
        assert!(r.records_per_sec > 0.0);
    }
}

/// `weir-load contention`'s set-up at its defaults: the emulated 4 Mbit/s
/// link with 10 ms per transaction (`egress.link`, one transaction at a
/// time), the scheduler at its defaults (the 18 Mbit/s prior), 256 B
/// records at 1.7x the link, 10 % of the bytes `ls`, 20 % `nm`, 70 %
/// `lt`.
fn emulated(mbit: f64, per_transaction: Duration, seconds: u64) -> Report {
    let extra = format!(
        "[egress.link]\nbandwidth = \"{mbit}Mbit/s\"\ndelay = \"{}ms\"\n",
        per_transaction.as_millis()
    );
    let link = LinkModel {
        bytes_per_sec: mbit * 1e6 / 8.0,
        delay: per_transaction,
        confirm: MS * 2,
        framing: 1.0,
        per_transaction: 0,
        confirm_every: Duration::ZERO,
        serial: true,
    };
    let total = 1.7 * mbit * 1e6 / 8.0 / 256.0;
    let load = Load {
        rates: vec![total * 0.1, total * 0.2, total * 0.7],
        payload: 256,
        key: 30,
    };
    let p = params_with(&extra, link, load, seconds);
    assert!(p.delivery.carried_on_send, "egress.link is set");
    let r = sim::run(&p);
    show(
        &format!("emulated {mbit} Mbit/s, {per_transaction:?} a transaction"),
        &r,
        mbit,
    );
    r
}

#[test]
fn an_emulated_link_carries_ls_and_nm_within_their_bounds() {
    // One send at a time, 10 ms each beside the bytes. With the urgent
    // lane beside the window, one-record `ls` batches queued behind the
    // send: 48 % of the link and `nm` 100 % late with the link clock
    // charging bytes alone; charging each transaction its 10 ms as well,
    // every lane batch pushed the next full one back: 20 % of the link,
    // nothing but `ls` sent. Without the lane: 70 %, `ls` p99 75 ms.
    // From the default 18 Mbit/s prior the estimate must also come down to
    // the link: the emulated send is timed exactly, so its fits are acted
    // on (with no queue seen they were not, and the prior stood: batches
    // of 50 kB, every `ls` record late).
    let r = emulated(4.0, MS * 10, 12);
    assert_full(&r, 4.0, 0.6);
}

#[test]
fn a_round_trip_past_the_urgent_bound_closes_the_urgent_lane() {
    // 200 ms to the broker and back: no `ls` record can make 100 ms, and
    // the lane's one-record batches held the 4 Mbit/s link to 58 %.
    let r = cell(4.0, 200);
    let cap = 4e6 / 8.0;
    assert!(
        r.link_bytes_per_sec >= 0.9 * cap,
        "{:.0} of {cap:.0} B/s carried",
        r.link_bytes_per_sec
    );
}

#[test]
fn a_link_faster_than_the_prior_is_found_by_probing() {
    // 100 Mbit/s, 5 ms from the broker: single transactions show the link
    // faster than the 18 Mbit/s prior, but paced at what they show, every
    // confirmation came at the rate it was sent at (44 % of the link); the
    // bandwidth probe finds more.
    let r = cell(100.0, 5);
    let cap = 100e6 / 8.0;
    assert!(
        r.link_bytes_per_sec >= 0.7 * cap,
        "{:.0} of {cap:.0} B/s carried",
        r.link_bytes_per_sec
    );
    assert_eq!(r.classes[0].late(MS * 100), 0, "ls records late");
}
