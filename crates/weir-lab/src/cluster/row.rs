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

/// Late records at most this far apart (consumed) belong to one moment.
pub(super) const STALL_SPAN_US: u64 = 20_000;

/// Distinct origins late within [`STALL_SPAN_US`] that make a moment a
/// stall of the shared cloud side: every node has a link of its own, so
/// only the one RabbitMQ, the delay line or the consumer (or the machine
/// under all of them) holds several nodes' records at once.
pub(super) const STALL_ORIGINS: usize = 3;

/// A late record: when it was consumed, its origin and the part of its
/// latency before weir published it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Late {
    pub(super) at_us: u64,
    pub(super) origin: u64,
    pub(super) in_weir_ms: Option<f64>,
}

/// Where late records' time went, for the verdict on what weir controls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Blame {
    /// Late from weir's own time: its time in weir with the way at its
    /// usual (median) time passes the bound.
    pub(super) in_weir: u64,
    /// Late on the way, alone: a node's own link held it (its `tbf` queue,
    /// what weir committed to it).
    pub(super) own_link: u64,
    /// Late on the way at a moment when records of at least
    /// [`STALL_ORIGINS`] origins were late together: the shared cloud side.
    pub(super) cloud: u64,
}

impl Blame {
    /// The late records weir answers for: its own time and its own link.
    pub(super) fn weir(&self) -> u64 {
        self.in_weir + self.own_link
    }
}

/// Sorts out `late` records of a class with `bound_ms`, given the usual
/// time on the way (`way_ms`, the median over the class's records). A
/// record without a publish time counts as weir's.
pub(super) fn blame(late: &[Late], bound_ms: f64, way_ms: f64) -> Blame {
    let mut b = Blame::default();
    for l in late {
        let Some(in_weir) = l.in_weir_ms else {
            b.in_weir += 1;
            continue;
        };
        if in_weir + way_ms > bound_ms {
            b.in_weir += 1;
            continue;
        }
        let lo = l.at_us.saturating_sub(STALL_SPAN_US);
        let hi = l.at_us.saturating_add(STALL_SPAN_US);
        let mut origins: Vec<u64> = late
            .iter()
            .filter(|o| (lo..=hi).contains(&o.at_us))
            .map(|o| o.origin)
            .collect();
        origins.sort_unstable();
        origins.dedup();
        match origins.len() >= STALL_ORIGINS {
            true => b.cloud += 1,
            false => b.own_link += 1,
        }
    }
    b
}

/// The late `ls` records of a cell sorted out ([`blame`]), as the row's
/// `ls_late_blame`.
pub(super) fn ls_blame(st: &Consumed) -> Value {
    let ls = || st.seen.iter().filter(|(_, d)| d.class == 0);
    let mut way: Vec<f64> = ls()
        .filter_map(|(_, d)| d.in_weir_ms.map(|w| d.latency_ms - w))
        .collect();
    way.sort_by(f64::total_cmp);
    let way_ms = crate::report::percentile(&way, 0.5).unwrap_or(0.0);
    let bound = CLASSES[0].1 as f64;
    let late: Vec<Late> = ls()
        .filter(|(_, d)| d.latency_ms > bound)
        .map(|(&(origin, _), d)| Late {
            at_us: d.at_us,
            origin,
            in_weir_ms: d.in_weir_ms,
        })
        .collect();
    let b = blame(&late, bound, way_ms);
    let total = ls().count().max(1) as f64;
    json!({
        "way_ms_median": round(way_ms, 1),
        "in_weir": b.in_weir,
        "own_link": b.own_link,
        "cloud": b.cloud,
        "weir": b.weir(),
        "weir_pct": round(100.0 * b.weir() as f64 / total, 2),
    })
}
