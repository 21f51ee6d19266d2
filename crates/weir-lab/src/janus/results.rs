//! The JANUS results: the paper's figures (Tables IV and V), the results
//! table with its headline checks, and the SVG.

use serde_json::{json, Value};

use super::classes::CLASSES;
use crate::report::{self, Table};

pub(crate) fn nan0(x: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        0.0
    }
}

/// JANUS Table IV (5k records/s, seconds) and Table V (4G) for a scheme
/// and network; Native shares one latency across classes. "pmrfs" is the
/// paper's "Janus" row.
pub(crate) fn paper(scheme: &str, network: &str) -> Value {
    let col = match network {
        "3g" => 0,
        "4g" => 1,
        "wifi" => 2,
        _ => return Value::Null,
    };
    // (ls, nm, lt) mean ± sd in seconds, per network 3G, 4G, WiFi.
    let t4: [[(f64, f64); 3]; 3] = match scheme {
        "native" => [[(10.86, 0.12); 3], [(7.52, 0.08); 3], [(7.26, 0.09); 3]],
        "qm-only" => [
            [(1.13, 0.18), (8.51, 0.19), (13.22, 0.14)],
            [(0.53, 0.07), (4.51, 0.08), (9.69, 0.09)],
            [(0.41, 0.07), (3.57, 0.06), (8.72, 0.07)],
        ],
        "fcfs" => [
            [(4.75, 0.16), (6.95, 0.14), (7.69, 0.07)],
            [(1.52, 0.04), (2.29, 0.06), (5.19, 0.11)],
            [(1.29, 0.03), (2.24, 0.05), (4.63, 0.08)],
        ],
        "lrfs" => [
            [(4.73, 0.07), (6.89, 0.11), (7.77, 0.04)],
            [(1.48, 0.06), (2.26, 0.04), (5.68, 0.13)],
            [(1.26, 0.03), (2.19, 0.08), (4.81, 0.09)],
        ],
        "best-fit" => [
            [(4.68, 0.12), (6.83, 0.11), (7.70, 0.03)],
            [(1.55, 0.04), (2.33, 0.16), (5.04, 0.06)],
            [(1.30, 0.03), (2.29, 0.12), (4.08, 0.13)],
        ],
        "random" => [
            [(4.81, 0.14), (6.93, 0.07), (7.66, 0.13)],
            [(1.49, 0.04), (2.30, 0.08), (5.26, 0.17)],
            [(1.27, 0.03), (2.21, 0.04), (4.41, 0.08)],
        ],
        "pmrfs" => [
            [(4.71, 0.11), (6.54, 0.09), (8.04, 0.05)],
            [(1.58, 0.08), (2.41, 0.11), (3.53, 0.06)],
            [(1.32, 0.04), (2.39, 0.03), (3.06, 0.05)],
        ],
        _ => return Value::Null,
    };
    let t5: Option<[f64; 3]> = match (scheme, network) {
        ("native", "4g") => Some([17.5, 4.2, 5.7]),
        ("qm-only", "4g") => Some([0.0, 9.8, 15.5]),
        ("pmrfs", "4g") => Some([0.0, 6.7, 9.4]),
        _ => None,
    };
    let mut m = serde_json::Map::new();
    for (c, (name, _)) in CLASSES.iter().enumerate() {
        let (mean, sd) = t4[col][c];
        let mut o = json!({"latency_ms_mean": mean * 1e3, "latency_ms_sd": sd * 1e3});
        if let Some(v) = t5 {
            o["violation_pct"] = json!(v[c]);
        }
        m.insert(name.to_string(), o);
    }
    json!({"lt_rate": 5000, "classes": Value::Object(m)})
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// The results table, then the headline checks per network and rate.
pub(crate) fn table(runs: &[Value]) -> String {
    let mut t = Table::new([
        "scheme",
        "network",
        "lt/s",
        "bytes",
        "ls ms",
        "nm ms",
        "lt ms",
        "ls viol",
        "nm viol",
        "lt viol",
        "thr rec/s",
        "on time",
        "limit rec/s",
        "input rec/s",
        "redirected",
        "lost",
    ]);
    for r in runs {
        let c = |k: &str, f_: &str| f(&r["classes"][k][f_]);
        let input: f64 = r["input"]
            .as_array()
            .map(|v| v.iter().map(|n| f(&n["accepted_rps"])).sum())
            .unwrap_or(0.0);
        let lost = r["lost"].as_u64().unwrap_or(0);
        t.row([
            r["scheme"].as_str().unwrap_or("").to_string(),
            r["network"].as_str().unwrap_or("").to_string(),
            r["lt_rate"].to_string(),
            r["record_bytes"].to_string(),
            format!(
                "{:.0} ± {:.0}",
                c("ls", "latency_ms_mean"),
                c("ls", "latency_ms_sd")
            ),
            format!(
                "{:.0} ± {:.0}",
                c("nm", "latency_ms_mean"),
                c("nm", "latency_ms_sd")
            ),
            format!(
                "{:.0} ± {:.0}",
                c("lt", "latency_ms_mean"),
                c("lt", "latency_ms_sd")
            ),
            format!("{:.1}%", c("ls", "violation_pct")),
            format!("{:.1}%", c("nm", "violation_pct")),
            format!("{:.1}%", c("lt", "violation_pct")),
            format!("{:.0}", f(&r["throughput_rps"])),
            format!("{:.0}", f(&r["delivered_on_time_rps"])),
            format!("{:.0}", f(&r["capacity_limit_rps"])),
            format!("{input:.0}"),
            r["redirected"].to_string(),
            lost.to_string(),
        ]);
    }
    let mut out = t.render();
    // Headline (paper: 4G, 5k/s): PMRFS's ls latency <= 16.6% of Native's,
    // zero ls violations, throughput >= 1.7x QM-only's, nm/lt violations
    // below 6.7% / 9.4%.
    let find = |s: &str, n: &Value, l: &Value, b: &Value| {
        runs.iter().find(|r| {
            r["scheme"] == s && &r["network"] == n && &r["lt_rate"] == l && &r["record_bytes"] == b
        })
    };
    for r in runs.iter().filter(|r| r["scheme"] == "pmrfs") {
        let (n, l, b) = (&r["network"], &r["lt_rate"], &r["record_bytes"]);
        out.push_str(&format!(
            "\nheadline, {} at lt {}/s, {} B records (paper: 4G, 5000/s):\n",
            n.as_str().unwrap_or(""),
            l,
            b
        ));
        out.push_str(&format!(
            "  delivered {:.1}% of min(offered, sum of uplinks) ({:.0} of {:.0} records/s), {:.1}% on time (goal >= 95%)\n",
            100.0 * f(&r["delivered_rps"]) / f(&r["capacity_limit_rps"]),
            f(&r["delivered_rps"]),
            f(&r["capacity_limit_rps"]),
            100.0 * f(&r["delivered_on_time_rps"]) / f(&r["capacity_limit_rps"]),
        ));
        if let Some(nat) = find("native", n, l, b) {
            let pct = 100.0 * f(&r["classes"]["ls"]["latency_ms_mean"])
                / f(&nat["classes"]["ls"]["latency_ms_mean"]);
            out.push_str(&format!(
                "  ls latency vs Native: {pct:.1}% (paper 16.6%, goal <= 16.6%)\n"
            ));
        }
        if let Some(qm) = find("qm-only", n, l, b) {
            let x = f(&r["throughput_rps"]) / f(&qm["throughput_rps"]);
            out.push_str(&format!(
                "  throughput vs QM-only: {x:.2}x (paper 1.7x, goal >= 1.7x); QM-only carried {:.1}% of what its own uplinks allow ({:.0} records/s), so the ratio's ceiling is {:.2}x\n",
                100.0 * f(&qm["delivered_rps"]) / f(&qm["own_links_limit_rps"]),
                f(&qm["own_links_limit_rps"]),
                f(&r["capacity_limit_rps"]) / f(&qm["own_links_limit_rps"]),
            ));
        }
        out.push_str(&format!(
            "  violations ls/nm/lt: {:.1}% / {:.1}% / {:.1}% (paper 0 / 6.7% / 9.4%)\n",
            f(&r["classes"]["ls"]["violation_pct"]),
            f(&r["classes"]["nm"]["violation_pct"]),
            f(&r["classes"]["lt"]["violation_pct"]),
        ));
        let blame = &r["ls_late_blame"];
        if blame.is_object() {
            out.push_str(&format!(
                "  ls late from what weir controls: {} records, {:.2}% (goal 0): {} from time in weir, {} on a node's own link; {} in stalls of the shared cloud side (RabbitMQ, delay line, consumer), not counted\n",
                blame["weir"],
                f(&blame["weir_pct"]),
                blame["in_weir"],
                blame["own_link"],
                blame["cloud"],
            ));
        }
    }
    out
}

/// Per network and rate: mean latency per class per scheme, and
/// throughput per scheme.
pub(crate) fn svg(runs: &[Value]) -> anyhow::Result<String> {
    let mut panels = Vec::new();
    let mut groups: Vec<(Value, Value, Value)> = Vec::new();
    for r in runs {
        let g = (
            r["network"].clone(),
            r["lt_rate"].clone(),
            r["record_bytes"].clone(),
        );
        if !groups.contains(&g) {
            groups.push(g);
        }
    }
    for (n, l, b) in &groups {
        let rs: Vec<&Value> = runs
            .iter()
            .filter(|r| &r["network"] == n && &r["lt_rate"] == l && &r["record_bytes"] == b)
            .collect();
        let cats: Vec<String> = rs
            .iter()
            .map(|r| r["scheme"].as_str().unwrap_or("").to_string())
            .collect();
        for (c, bound) in CLASSES {
            panels.push(report::BarPanel {
                title: format!(
                    "{c} latency, ms ({} lt {l}/s, {b} B; dot: paper; bound {bound})",
                    n.as_str().unwrap_or("")
                ),
                categories: cats.clone(),
                bars: rs
                    .iter()
                    .map(|r| nan0(f(&r["classes"][c]["latency_ms_mean"])))
                    .collect(),
                dots: rs
                    .iter()
                    .map(|r| r["paper"]["classes"][c]["latency_ms_mean"].as_f64())
                    .collect(),
                highlight: cats.iter().position(|s| s == "pmrfs"),
                best: None,
            });
        }
        panels.push(report::BarPanel {
            title: format!(
                "throughput, records/s ({} lt {l}/s, {b} B)",
                n.as_str().unwrap_or("")
            ),
            categories: cats.clone(),
            bars: rs.iter().map(|r| nan0(f(&r["throughput_rps"]))).collect(),
            dots: vec![None; rs.len()],
            highlight: cats.iter().position(|s| s == "pmrfs"),
            best: None,
        });
    }
    report::bar_panels_svg(
        "JANUS evaluation: latency per class and throughput per scheme",
        "ms or records/s",
        &panels,
        2,
    )
}
