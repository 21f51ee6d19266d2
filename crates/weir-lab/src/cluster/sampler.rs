//! The sampler of each node's uplink estimate, `C_out` and link
//! counters during the load.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use tokio::time::Instant;

use super::node::{metric, metric_sum, scrape, tcp_retransmits};
use super::testbed::{ns, uplink_bytes};
use crate::janus::{nan0, CLASSES};
use crate::netns;
use crate::report::round;

/// How often each node's uplink estimate is sampled.
const UPLINK_SAMPLE: Duration = Duration::from_millis(250);

/// Each node's uplink as it sees it, sampled every [`UPLINK_SAMPLE`] from
/// `start_us` until `seconds` into the load: a series per node.
pub(super) async fn sample_uplinks(
    admins: Vec<SocketAddr>,
    pids: Vec<Option<u32>>,
    start_us: u64,
    seconds: f64,
) -> Vec<Vec<Value>> {
    let mut series = vec![Vec::new(); admins.len()];
    let mut tick = tokio::time::interval(UPLINK_SAMPLE);
    let start = UNIX_EPOCH + Duration::from_micros(start_us);
    let mut last: Option<(Instant, Vec<u64>)> = None;
    loop {
        tick.tick().await;
        // What each uplink carried since the last sample (wire bytes).
        let counted = uplink_bytes(admins.len()).ok().map(|b| (Instant::now(), b));
        let carried: Vec<f64> = match (&last, &counted) {
            (Some((t0, b0)), Some((t1, b1))) => b1
                .iter()
                .zip(b0)
                .map(|(b1, b0)| (b1 - b0) as f64 / (*t1 - *t0).as_secs_f64())
                .collect(),
            _ => vec![f64::NAN; admins.len()],
        };
        last = counted;
        let t = SystemTime::now()
            .duration_since(start)
            .map(|d| d.as_secs_f64())
            .unwrap_or_else(|e| -e.duration().as_secs_f64());
        if t >= 0.0 {
            let links = link_counters(pids.clone()).await;
            for (k, ((addr, s), carried)) in admins
                .iter()
                .zip(series.iter_mut())
                .zip(&carried)
                .enumerate()
            {
                let Ok(text) = scrape(*addr).await else {
                    continue;
                };
                let (tbf, retrans) = links.get(k).copied().unwrap_or((None, None));
                s.push(uplink_sample(t, &text, *carried, tbf, retrans));
            }
        }
        if t >= seconds {
            return series;
        }
    }
}

/// Per node, its uplink's shaped queue and its weir's TCP retransmissions:
/// whether the link or the sender set the pace (`None` where unreadable).
async fn link_counters(pids: Vec<Option<u32>>) -> Vec<(Option<netns::TbfCounters>, Option<u64>)> {
    // `tc` is a process per node: run off the runtime's threads.
    tokio::task::spawn_blocking(move || {
        pids.iter()
            .enumerate()
            .map(|(k, pid)| {
                (
                    netns::tbf_counters(Some(&ns(k + 1)), "wan0").ok(),
                    pid.and_then(tcp_retransmits),
                )
            })
            .collect()
    })
    .await
    .unwrap_or_default()
}

/// One sample of a node's uplink at `t` seconds into the load, from its
/// `/metrics` text, what its uplink carried (wire bytes per second) and
/// its link counters.
fn uplink_sample(
    t: f64,
    text: &str,
    carried: f64,
    tbf: Option<netns::TbfCounters>,
    retrans: Option<u64>,
) -> Value {
    let m = |name: &str| metric(text, name).unwrap_or(f64::NAN);
    let rates: Vec<f64> = CLASSES
        .iter()
        .map(|(c, _)| {
            m(&format!(
                "weir_class_allocated_bytes_per_second{{class=\"{c}\"}}"
            ))
        })
        .collect();
    json!({
        "t": round(t, 2),
        "estimate_bps": round(nan0(m("weir_link_bandwidth_bytes_per_second")), 0),
        "acted_bps": round(nan0(m("weir_link_acted_bytes_per_second")), 0),
        "proven_bps": round(nan0(m("weir_link_proven_bytes_per_second")), 0),
        "quiet": m("weir_link_quiet"),
        "probes_kept_up": m("weir_link_probes_kept_up_total"),
        "probes_full": m("weir_link_probes_full_total"),
        "probes_inconclusive": m("weir_link_probes_inconclusive_total"),
        "probe_phase": m("weir_link_probe_phase"),
        "delivery_rate_bps": m("weir_egress_delivery_rate_bytes_per_second"),
        "t_sc_ms": round(nan0(m("weir_link_transaction_seconds") * 1e3), 2),
        "queue_ms": round(nan0(m("weir_link_queue_seconds") * 1e3), 2),
        "c_out_bps": round(nan0(rates.iter().sum()), 0),
        "carried_wire_bps": round(nan0(carried), 0),
        "batches": metric_sum(text, "weir_batches_confirmed_total"),
        "batch_bytes": metric_sum(text, "weir_egress_bytes_total"),
        "rates_bps": rates.iter().map(|r| round(nan0(*r), 0)).collect::<Vec<_>>(),
        "queued_records": metric_sum(text, "weir_class_queued_records"),
        "advert_bytes": metric_sum(text, "weir_peer_advert_bytes_sent_total"),
        "confirm_s_sum": m("weir_egress_stage_seconds_sum{stage=\"confirm\"}"),
        "confirm_count": m("weir_egress_stage_seconds_count{stage=\"confirm\"}"),
        "tbf_backlog_bytes": tbf.map(|t| t.backlog),
        "tbf_drops": tbf.map(|t| t.drops),
        "tcp_retransmits": retrans,
    })
}
