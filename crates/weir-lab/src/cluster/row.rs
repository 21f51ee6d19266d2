//! The parts of a cell's row: per-node latency, the late `ls` records,
//! the load's input rows and the advertised rate.

use serde_json::{json, Value};

use super::args::Args;
use super::cloud::Consumed;
use super::offer::Offered;
use crate::janus::CLASSES;
use crate::report::round;

/// Late `ls` records listed one by one in a row (`late_ls`), the first ones.
const LATE_LS_LISTED: usize = 200;

/// Per node (origin) and class: the latencies' sum, the records and those
/// past the class's bound.
pub(super) fn per_node_latency(st: &Consumed, n: usize) -> Vec<[(f64, u64, u64); 3]> {
    let mut per_node: Vec<[(f64, u64, u64); 3]> = vec![[(0.0, 0, 0); 3]; n];
    for (&(origin, _), d) in &st.seen {
        if let Some(slot) = per_node.get_mut((origin as usize).wrapping_sub(1)) {
            let (sum, count, late) = &mut slot[d.class];
            *sum += d.latency_ms;
            *count += 1;
            *late += u64::from(d.latency_ms > CLASSES[d.class].1 as f64);
        }
    }
    per_node
}

/// Every late `ls` record, in order of arrival (the first
/// [`LATE_LS_LISTED`]): when, from where, and how its time split (a burst
/// of them at one moment is a stall, spread ones a standing queue).
pub(super) fn late_ls(st: &Consumed, start_us: u64) -> Vec<Value> {
    let mut late_ls: Vec<(u64, u64, f64, Option<f64>)> = st
        .seen
        .iter()
        .filter(|(_, d)| d.class == 0 && d.latency_ms > CLASSES[0].1 as f64)
        .map(|(&(origin, _), d)| (d.at_us, origin, d.latency_ms, d.in_weir_ms))
        .collect();
    late_ls.sort_by_key(|l| l.0);
    late_ls
        .iter()
        .take(LATE_LS_LISTED)
        .map(|&(at, origin, ms, in_weir)| {
            json!({
                "t": round(at.saturating_sub(start_us) as f64 / 1e6, 3),
                "origin": origin,
                "latency_ms": round(ms, 1),
                "in_weir_ms": in_weir.map(|w| round(w, 1)),
            })
        })
        .collect()
}

/// The row's `input`: per node, what it was offered and accepted, its
/// records' latency per class and its uplink samples.
pub(super) fn input_rows(
    a: &Args,
    offered: &[Offered],
    per_node: &[[(f64, u64, u64); 3]],
    uplinks: Vec<Vec<Value>>,
) -> Vec<Value> {
    offered
        .iter()
        .enumerate()
        .zip(uplinks)
        .map(|((i, o), uplink)| {
            let secs = o.seconds.max(1e-9);
            let classes: serde_json::Map<String, Value> = CLASSES
                .iter()
                .zip(per_node[i])
                .map(|((name, _), (sum, count, late))| {
                    let count_f = count.max(1) as f64;
                    (
                        name.to_string(),
                        json!({
                            "delivered": count,
                            "latency_ms_mean": round(sum / count_f, 1),
                            "violation_pct": round(100.0 * late as f64 / count_f, 2),
                        }),
                    )
                })
                .collect();
            json!({
                "node": i + 1,
                "busy": i < a.grid.busy,
                "offered": o.offered,
                "sent": o.sent,
                "acked": o.acked,
                "accepted_rps": round(o.acked.iter().sum::<u64>() as f64 / secs, 1),
                "offered_rps": round(o.offered.iter().sum::<u64>() as f64 / secs, 1),
                "load_secs": round(o.seconds, 3),
                "errors": o.errors,
                "classes": classes,
                "uplink": uplink,
            })
        })
        .collect()
}

/// Heartbeat (or gossip) bytes a node sent per second over the load, the
/// mean over nodes: from the first and last samples of
/// `weir_peer_advert_bytes_sent_total` in each node's `uplink` series.
pub(super) fn advert_rate(input: &[Value]) -> f64 {
    let rates: Vec<f64> = input
        .iter()
        .filter_map(|node| {
            let s = node["uplink"].as_array()?;
            let (first, last) = (s.first()?, s.last()?);
            let dt = last["t"].as_f64()? - first["t"].as_f64()?;
            let db = last["advert_bytes"].as_f64()? - first["advert_bytes"].as_f64()?;
            (dt > 0.0).then_some(db / dt)
        })
        .collect();
    rates.iter().sum::<f64>() / rates.len() as f64
}
