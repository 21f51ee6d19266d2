//! The JANUS evaluation with real processes: N `weir run`
//! processes, each in a network namespace of its own, with a shaped uplink
//! to the cloud, peering over real gRPC on a LAN, loaded by separate
//! `weir-load offer` processes over MQTT, delivering into RabbitMQ.
//!
//! # The testbed
//! - **Cloud**: the root namespace. RabbitMQ (`--amqp`, started by
//!   scripts/services.sh) and, per node, a delay line of this process
//!   ([`crate::delay`]) in front of it at `10.251.<k>.1`. The lab's
//!   consumer reads the run's queue there.
//! - **Node k**: namespace `weir-lab-n<k>` with
//!   - `wan0` (10.251.k.2/30), a veth to the cloud whose egress is shaped by
//!     `tc tbf` to the network's Table III rate (18 Mbit/s for 4G): the
//!     uplink. weir's AMQP egress reaches RabbitMQ through it and the
//!     delay line, which holds every byte towards the cloud for the
//!     network's Table III latency (50 ms for 4G) and nothing on the way
//!     back, as `tc netem` on the node's interface would (netem is not
//!     available here).
//!   - `lan0` (10.252.0.k/24) on a bridge with the other nodes, unshaped:
//!     the local network the paper's Pis share (Assumption 2: much faster
//!     than the uplink). Peering (gRPC, `allow_anonymous`) and weir's admin
//!     endpoint (read by the lab from the bridge's 10.252.0.254) listen
//!     there.
//!   - weir's MQTT listener on the namespace's own loopback, where that
//!     node's `weir-load offer` publishes `ls`/`nm`/`lt` at the paper's
//!     rates.
//!
//! # What is measured
//! - **Latency** of a record: when the consumer took it from RabbitMQ
//!   minus weir's `ingress_us` stamp (one machine, one clock). It includes
//!   the shaped link's queue and the 50 ms.
//! - **Throughput**: distinct records consumed by the end of the load, per
//!   second of load; on time: those within their class bound.
//! - **The physical limit**: min(offered, the sum of the shaped rates
//!   divided by the bytes each delivered record took on the uplinks),
//!   where the bytes are counted at the cloud's end of each `wan0` (IP,
//!   TCP and AMQP framing included: what `tbf` charges).
//! - **Lost**: records weir acknowledged to a device (PUBACK) that never
//!   reached RabbitMQ; **duplicates**: deliveries beyond the first.
//! - Every 250 ms each node's uplink estimate and `C_out` from its
//!   `/metrics` (the `cluster-uplink.svg` plot against the shaped rate).

use std::path::Path;

use anyhow::{ensure, Context};
use serde_json::Value;

use crate::janus;
use crate::report;

mod args;
mod cell;
mod cloud;
mod config;
mod fault;
mod node;
mod offer;
mod row;
mod sampler;
mod testbed;

use args::bins;
pub use args::Args;
use cell::run_cell;
pub(crate) use cloud::batch_of;
pub(crate) use config::toml_string;
use testbed::Testbed;

/// Runs the grid; returns the table, the rows and the SVG, and writes
/// `cluster-uplink.svg` (each node's estimate against the shaped rate)
/// into `out`.
pub async fn run(a: &Args, out: &Path) -> anyhow::Result<(String, Value, String)> {
    for n in &a.grid.networks {
        janus::preset(n)?;
    }
    ensure!(
        a.grid.busy <= a.grid.nodes,
        "--busy {} > --nodes {}",
        a.grid.busy,
        a.grid.nodes
    );
    ensure!(
        a.grid.seconds.is_finite() && a.grid.seconds > 0.0,
        "--seconds must be positive"
    );
    for &b in &a.record_bytes {
        ensure!(
            b >= 16,
            "--record-bytes {b}: at least 16 (weir-load's stamp)"
        );
    }
    let bins = bins(a)?;
    let cells = janus::grid(
        &a.schemes,
        &a.grid.networks,
        &a.grid.lt_rates,
        &a.record_bytes,
    )?;
    let bed = Testbed::build(a.grid.nodes, &a.tcp_congestion)?;
    let bar = report::progress(cells.len() as u64, "cluster");
    let mut runs = Vec::new();
    for (k, cell) in cells.iter().enumerate() {
        bar.set_message(format!(
            "{} {} lt {}/s {} B",
            cell.scheme, cell.network, cell.lt_rate, cell.record_bytes
        ));
        runs.push(run_cell(a, &bins, &bed, cell, k).await?);
        bar.inc(1);
    }
    bar.finish_and_clear();
    drop(bed);
    let uplink_svg = uplink_svg(&runs)?;
    std::fs::create_dir_all(out)?;
    let path = out.join("cluster-uplink.svg");
    std::fs::write(&path, uplink_svg)
        .with_context(|| format!("cannot write {}", path.display()))?;
    let table = janus::table(&runs);
    let svg = janus::svg(&runs)?;
    Ok((table, Value::Array(runs), svg))
}

/// Each node's uplink estimate, `C_out` and what its uplink carried over
/// the load of one run, against the shaped rate: PMRFS at 640 B (the
/// in-process lab's size) if it ran, else the first PMRFS run, else the
/// first run.
fn uplink_svg(runs: &[Value]) -> anyhow::Result<String> {
    let pmrfs = |r: &&Value| r["scheme"] == "pmrfs";
    let Some(first) = runs
        .iter()
        .filter(pmrfs)
        .find(|r| r["record_bytes"] == 640)
        .or_else(|| runs.iter().find(pmrfs))
        .or_else(|| runs.first())
    else {
        return Ok(String::new());
    };
    let mut series = Vec::new();
    for node in first["input"].as_array().into_iter().flatten() {
        let pts = |key: &str| -> Vec<(f64, f64)> {
            node["uplink"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| {
                    (
                        s["t"].as_f64().unwrap_or(0.0),
                        s[key].as_f64().unwrap_or(0.0) / 1e6,
                    )
                })
                .collect()
        };
        let label = format!("node {}", node["node"]);
        series.push(report::Series {
            name: format!("estimate, {label}"),
            points: pts("estimate_bps"),
        });
        series.push(report::Series {
            name: format!("C_out, {label}"),
            points: pts("c_out_bps"),
        });
        series.push(report::Series {
            name: format!("carried (wire), {label}"),
            points: pts("carried_wire_bps"),
        });
    }
    report::line_chart_svg(&report::LineChart {
        title: format!(
            "Uplink estimate, C_out and carried per node ({}, {}, {} B, track_uplink = {})",
            first["scheme"].as_str().unwrap_or(""),
            first["network"].as_str().unwrap_or(""),
            first["record_bytes"],
            first["track_uplink"]
        ),
        x_label: "seconds into the load".into(),
        y_label: "MB/s".into(),
        series,
        hlines: vec![report::HLine {
            name: "shaped rate (tbf)".into(),
            y: first["uplink_bps"].as_f64().unwrap_or(0.0) / 1e6,
            paper: true,
        }],
        marks: Vec::new(),
    })
}

#[cfg(test)]
mod tests;
