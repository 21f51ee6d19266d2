//! `weir-lab peers`: the chart and table of a peer benchmark
//! (`scripts/peer-bench.sh`), read from its `results.jsonl`.
//!
//! Each line is `{"system", "size", "mode", "report"}` with the report of
//! `weir-load broker` (Mosquitto, rumqttd, weir with file egress) or
//! `weir-load throughput` (weir into RabbitMQ). The chart has one panel of
//! acknowledged records/s per record size at full rate, and, for paced
//! runs, one panel of p99 PUBLISH-to-PUBACK.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use serde_json::Value;

use crate::report::{bar_panels_svg, BarPanel};

/// `weir-lab peers`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The JSON lines a peer benchmark wrote (`$OUT/results.jsonl`).
    #[arg(long)]
    pub input: PathBuf,
}

/// One measurement, the figures the chart and table show.
#[derive(Debug, Clone, serde::Serialize)]
struct Row {
    system: String,
    size: u64,
    mode: String,
    acked_per_sec: f64,
    /// The system's own CPU per acknowledged record (weir's for the weir
    /// rows), microseconds.
    us_per_record: f64,
    /// RabbitMQ's CPU per record, for the weir-into-RabbitMQ rows.
    rabbitmq_us_per_record: Option<f64>,
    cores: Option<f64>,
    ack_p50_ms: f64,
    ack_p99_ms: f64,
    ack_max_ms: f64,
    peak_rss_mib: Option<f64>,
    load_cores: Option<f64>,
}

fn f(v: &Value, path: &[&str]) -> Option<f64> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_f64()
}

fn row(line: &Value) -> anyhow::Result<Row> {
    let r = line.get("report").context("no report")?;
    let system = line["system"].as_str().context("no system")?.to_string();
    let size = line["size"].as_u64().context("no size")?;
    let mode = line
        .get("mode")
        .and_then(Value::as_str)
        .unwrap_or("full")
        .to_string();
    let acked = f(r, &["acked_per_sec"]).context("no acked_per_sec")?;
    // weir-load broker reports the broker's CPU; throughput reports weir's
    // and RabbitMQ's, and this tool's per thread.
    let (us, rabbit, cores, rss, load) = if r.get("cpu").is_some() {
        let load: f64 = r["cpu"]["tool_threads"]
            .as_object()
            .map(|m| m.values().filter_map(Value::as_f64).sum())
            .unwrap_or(0.0);
        (
            f(r, &["cpu", "weir_us_per_record"]).unwrap_or(0.0),
            f(r, &["cpu", "rabbitmq_us_per_record"]),
            f(r, &["cpu", "weir_cores"]),
            f(r, &["weir_rss_hwm_kib"]).map(|k| k / 1024.0),
            Some(load),
        )
    } else {
        (
            f(r, &["broker_us_per_record"]).unwrap_or(0.0),
            None,
            f(r, &["broker_cores"]),
            f(r, &["broker_peak_rss_kib"]).map(|k| k / 1024.0),
            f(r, &["load_cores"]),
        )
    };
    Ok(Row {
        system,
        size,
        mode,
        acked_per_sec: acked,
        us_per_record: us,
        rabbitmq_us_per_record: rabbit,
        cores,
        ack_p50_ms: f(r, &["ack_latency_ms", "p50"]).unwrap_or(0.0),
        ack_p99_ms: f(r, &["ack_latency_ms", "p99"]).unwrap_or(0.0),
        ack_max_ms: f(r, &["ack_latency_ms", "max"]).unwrap_or(0.0),
        peak_rss_mib: rss,
        load_cores: load,
    })
}

fn size_name(size: u64) -> String {
    if size >= 1024 && size.is_multiple_of(1024) {
        format!("{} KiB", size / 1024)
    } else {
        format!("{size} B")
    }
}

pub async fn run(args: &Args) -> anyhow::Result<(String, Value, String)> {
    let text = std::fs::read_to_string(&args.input)
        .with_context(|| format!("reading {}", args.input.display()))?;
    let rows = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map_err(anyhow::Error::from)
                .and_then(|v| row(&v))
                .with_context(|| format!("{} line {}", args.input.display(), i + 1))
        })
        .collect::<anyhow::Result<Vec<Row>>>()?;
    anyhow::ensure!(
        !rows.is_empty(),
        "{} holds no measurement",
        args.input.display()
    );

    let mut table = String::from(
        "| system | size | mode | acked/s | us/record | RabbitMQ us/record | cores | PUBACK p50 / p99 / max ms | peak RSS MiB | load cores |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in &rows {
        let opt = |v: Option<f64>, d: usize| v.map_or("-".to_string(), |v| format!("{v:.d$}"));
        table += &format!(
            "| {} | {} | {} | {:.0} | {:.2} | {} | {} | {:.2} / {:.2} / {:.2} | {} | {} |\n",
            r.system,
            size_name(r.size),
            r.mode,
            r.acked_per_sec,
            r.us_per_record,
            opt(r.rabbitmq_us_per_record, 2),
            opt(r.cores, 2),
            r.ack_p50_ms,
            r.ack_p99_ms,
            r.ack_max_ms,
            opt(r.peak_rss_mib, 1),
            opt(r.load_cores, 2),
        );
    }

    // One panel per (mode, size): full rate shows records/s, paced the p99.
    let mut groups: BTreeMap<(bool, u64), Vec<&Row>> = BTreeMap::new();
    for r in &rows {
        groups
            .entry((r.mode != "full", r.size))
            .or_default()
            .push(r);
    }
    let panels: Vec<BarPanel> = groups
        .iter()
        .map(|((paced, size), rs)| {
            let bars: Vec<f64> = rs
                .iter()
                .map(|r| {
                    if *paced {
                        r.ack_p99_ms
                    } else {
                        r.acked_per_sec / 1000.0
                    }
                })
                .collect();
            let title = if *paced {
                format!("{}, {}: p99 to PUBACK (ms)", size_name(*size), rs[0].mode)
            } else {
                format!("{}, full rate: thousand acked records/s", size_name(*size))
            };
            BarPanel {
                title,
                categories: rs.iter().map(|r| r.system.clone()).collect(),
                bars,
                dots: vec![None; rs.len()],
                highlight: rs.iter().position(|r| r.system.starts_with("weir")),
                best: None,
            }
        })
        .collect();
    let svg = bar_panels_svg(
        "Peer benchmark: MQTT QoS 1, 4 connections x 1000 in flight, each system alone",
        "",
        &panels,
        3,
    )?;
    let json = serde_json::json!({ "rows": rows });
    Ok((table, json, svg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn both_report_shapes_become_rows_a_table_and_a_chart() {
        let broker = r#"{"system":"rumqttd","size":1024,"mode":"full","report":{"kind":"broker","acked_per_sec":438256.0,"broker_cores":1.01,"broker_us_per_record":2.3,"broker_peak_rss_kib":1409126,"ack_latency_ms":{"n":10,"p50":8.0,"p90":9.0,"p99":18.2,"p999":30.0,"max":37.4,"mean":8.5},"load_cores":0.46}}"#;
        let weir = r#"{"system":"weir-amqp","size":256,"mode":"paced-50000","report":{"kind":"throughput","acked_per_sec":50006.0,"weir_rss_hwm_kib":23962,"cpu":{"weir_cores":0.28,"weir_us_per_record":5.54,"rabbitmq_us_per_record":14.08,"tool_threads":{"load-pub":0.12,"load-con":0.1}},"ack_latency_ms":{"n":10,"p50":0.14,"p90":0.5,"p99":1.36,"p999":5.0,"max":16.5,"mean":0.2}}}"#;
        let dir = std::env::temp_dir().join(format!("weir-lab-peers-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let input = dir.join("results.jsonl");
        std::fs::write(&input, format!("{broker}\n{weir}\n")).unwrap();
        let (table, json, svg) = run(&Args { input }).await.unwrap();
        assert!(table.contains("| rumqttd | 1 KiB | full | 438256 | 2.30 | - | 1.01 | 8.00 / 18.20 / 37.40 | 1376.1 | 0.46 |"), "{table}");
        assert!(table.contains("| weir-amqp | 256 B | paced-50000 | 50006 | 5.54 | 14.08 | 0.28 | 0.14 / 1.36 / 16.50 | 23.4 | 0.22 |"), "{table}");
        assert_eq!(json["rows"].as_array().unwrap().len(), 2);
        assert!(svg.contains("p99 to PUBACK") && svg.contains("acked records/s"));
        // A line that is not a measurement is named, not skipped.
        std::fs::write(dir.join("bad.jsonl"), "{\"system\":\"x\"}\n").unwrap();
        let err = run(&Args {
            input: dir.join("bad.jsonl"),
        })
        .await
        .unwrap_err();
        assert!(format!("{err:#}").contains("line 1"), "{err:#}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
