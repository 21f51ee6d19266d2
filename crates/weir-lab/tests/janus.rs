//! Runs `weir-lab janus` on a tiny grid (2 nodes, Native and PMRFS, 2 s,
//! low rates) and checks the JSON it writes: every field there, every
//! accepted record delivered exactly once. No timing thresholds: the load
//! is far below the link, so latencies are only checked to be present.

use std::process::Command;

use serde_json::Value;

fn num(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("`{key}` is not a number in {v}"))
}

#[test]
fn a_quick_janus_grid_writes_every_field_and_delivers_every_record() {
    let dir = std::env::temp_dir().join(format!("weir-lab-test-janus-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new(env!("CARGO_BIN_EXE_weir-lab"))
        .arg("--out")
        .arg(&dir)
        .args([
            "janus",
            "--nodes",
            "2",
            "--busy",
            "1",
            "--schemes",
            "native,pmrfs",
            "--seconds",
            "2",
            "--warmup",
            "1",
            "--lt-rates",
            "200",
            "--busy-rates",
            "10,50",
            "--idle-rate",
            "10",
        ])
        .output()
        .expect("weir-lab runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "weir-lab janus failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("pmrfs"), "no table:\n{stdout}");
    let svg = std::fs::read_to_string(dir.join("janus.svg")).expect("the SVG file is written");
    assert!(svg.starts_with("<svg"), "not an SVG");
    let json: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("janus.json")).expect("the JSON file is written"),
    )
    .expect("valid JSON");
    let runs = json.as_array().expect("an array of runs");
    assert_eq!(runs.len(), 2, "{json}");
    for (r, scheme) in runs.iter().zip(["native", "pmrfs"]) {
        assert_eq!(r["scheme"], scheme);
        assert_eq!(r["network"], "4g");
        assert_eq!(r["lt_rate"], 200);
        assert!(r["drained"].as_bool().expect("drained"), "{r}");
        assert!(num(r, "throughput_rps") > 0.0, "{r}");
        let accepted = num(r, "accepted");
        assert!(accepted > 0.0, "{r}");
        assert_eq!(num(r, "delivered"), accepted, "every record arrives: {r}");
        // The honest throughput: never above the physical limit, which is
        // never above what was offered.
        assert_eq!(num(r, "lost"), 0.0, "{r}");
        assert_eq!(r["record_bytes"], 640);
        assert!(num(r, "wire_bytes_per_record") > 640.0, "{r}");
        let limit = num(r, "capacity_limit_rps");
        assert!(limit > 0.0 && limit <= num(r, "offered_rps") + 1e-6, "{r}");
        // Without redirection the nodes' own uplinks allow no more.
        let own = num(r, "own_links_limit_rps");
        assert!(own > 0.0 && own <= limit + 1e-6, "{r}");
        assert!(num(r, "delivered_rps") <= limit * 1.05, "{r}");
        assert!(
            num(r, "delivered_on_time_rps") <= num(r, "delivered_rps"),
            "{r}"
        );
        assert_eq!(r["track_uplink"], false);
        for class in ["ls", "nm", "lt"] {
            let c = &r["classes"][class];
            assert!(num(c, "latency_ms_mean") > 0.0, "{class}: {r}");
            assert!(num(c, "latency_ms_sd") >= 0.0, "{class}: {r}");
            let v = num(c, "violation_pct");
            assert!((0.0..=100.0).contains(&v), "{class}: {r}");
            assert_eq!(num(c, "refused"), 0.0, "{class}: {r}");
            assert_eq!(num(c, "delivered"), num(c, "accepted"), "{class}: {r}");
        }
        let input = r["input"].as_array().expect("input rates");
        assert_eq!(input.len(), 2);
        for n in input {
            assert!(num(n, "accepted_rps") > 0.0, "{n}");
            assert!(num(n, "target_rps") > 0.0, "{n}");
            // The node's uplink as it saw it, sampled through the load.
            let uplink = n["uplink"].as_array().expect("uplink samples");
            assert!(uplink.len() >= 4, "{n}");
            assert!(uplink.iter().all(|u| num(u, "c_out_bps") > 0.0), "{n}");
        }
        assert!(r["paper"]["classes"]["ls"]["latency_ms_mean"].is_number());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
