//! The `offer` run: the devices of a lab. One QoS 1 connection per class
//! publishes to a weir someone else started, at a fixed rate for a fixed
//! time, from an agreed start, so that one generator per node (each in its
//! node's network namespace) loads a cluster together. It reports what was
//! offered (the rate times the time), sent (what weir's back-pressure let
//! through) and acknowledged per class; the lab consumes and times the
//! records itself.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::ensure;
use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cli::{OfferArgs, Pacing};
use crate::contention::class_values;
use crate::mqtt::{run_publishers, MqttLoad};
use crate::shared::Counters;
use crate::stamp::{now_us, STAMP};

/// One class's connection.
#[derive(Serialize)]
pub struct OfferedClass {
    pub class: String,
    /// Records/s asked for.
    pub rate: f64,
    /// The rate times the time the load ran.
    pub offered: u64,
    /// Records written to the connection.
    pub sent: u64,
    /// Records weir acknowledged (PUBACK).
    pub acked: u64,
    /// Why the connection ended early, if it did (weir killed, the
    /// connection refused): the counts are what happened until then.
    pub error: Option<String>,
}

/// What `weir-load offer` did.
#[derive(Serialize)]
pub struct OfferReport {
    pub kind: &'static str,
    /// Unix time the load started and how long it ran, in seconds.
    pub started_us: u64,
    pub seconds: f64,
    pub classes: Vec<OfferedClass>,
    pub params: OfferArgs,
}

pub async fn offer(a: &OfferArgs) -> anyhow::Result<OfferReport> {
    ensure!(a.size >= STAMP, "--size must be at least {STAMP} bytes");
    ensure!(
        a.seconds.is_finite() && a.seconds > 0.0,
        "--seconds must be a positive number"
    );
    ensure!(a.window > 0, "--window must be at least 1");
    let rates = class_values(&a.rates, "--rates")?;
    if let Some(ms) = a.start_at_ms {
        let wait_us = (ms * 1000).saturating_sub(now_us());
        tokio::time::sleep(Duration::from_micros(wait_us)).await;
    }
    let started_us = now_us();
    let started = Instant::now();
    let stop = CancellationToken::new();
    let runs: Vec<_> = rates
        .iter()
        .filter(|(_, &rate)| rate > 0.0)
        .map(|(class, &rate)| {
            let counters = Arc::new(Counters::default());
            let load = MqttLoad {
                addr: a.addr,
                client_id: format!("{}-{class}", a.topic_prefix),
                topic: format!("{}/{class}/t", a.topic_prefix),
                size: a.size,
                window: a.window,
                rate: Some(rate),
                pacing: Pacing::Tick,
                limit: None,
                tls: None,
            };
            let task = tokio::spawn(run_publishers(
                vec![load],
                Arc::clone(&counters),
                stop.clone(),
            ));
            (class.clone(), rate, counters, task)
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(a.seconds)).await;
    stop.cancel();
    let seconds = started.elapsed().as_secs_f64();
    let mut classes = Vec::new();
    for (class, rate, counters, task) in runs {
        let error = match task.await {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!("{e:#}")),
            Err(e) => Some(format!("the publisher panicked: {e}")),
        };
        classes.push(OfferedClass {
            class,
            rate,
            offered: (rate * seconds).round() as u64,
            sent: counters.sent.load(Ordering::Relaxed),
            acked: counters.acked.load(Ordering::Relaxed),
            error,
        });
    }
    Ok(OfferReport {
        kind: "offer",
        started_us,
        seconds,
        classes,
        params: a.clone(),
    })
}

pub fn print_offer(r: &OfferReport) {
    for c in &r.classes {
        println!(
            "offer: {:<3} {:>7.0}/s for {:.2} s: offered {} sent {} acked {}{}",
            c.class,
            c.rate,
            r.seconds,
            c.offered,
            c.sent,
            c.acked,
            c.error
                .as_ref()
                .map(|e| format!(" (ended early: {e})"))
                .unwrap_or_default()
        );
    }
}
