//! Runs both experiments of the `weir-lab` binary in quick mode and checks
//! the files they write: every field there, values sane. No timing
//! thresholds: only ratios measured within one run.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

/// A fresh output directory per test.
fn out_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weir-lab-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Runs `weir-lab --out <dir> <args>` and returns its stdout and the JSON
/// it wrote.
fn lab(dir: &PathBuf, experiment: &str, args: &[&str]) -> (String, Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_weir-lab"))
        .arg("--out")
        .arg(dir)
        .arg(experiment)
        .args(args)
        .output()
        .expect("weir-lab runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "weir-lab {experiment} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = std::fs::read_to_string(dir.join(format!("{experiment}.json")))
        .expect("the JSON file is written");
    let svg = std::fs::read_to_string(dir.join(format!("{experiment}.svg")))
        .expect("the SVG file is written");
    assert!(
        svg.starts_with("<svg"),
        "not an SVG: {}",
        &svg[..svg.len().min(80)]
    );
    (stdout, serde_json::from_str(&json).expect("valid JSON"))
}

fn num(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("`{key}` is not a number in {v}"))
}

#[test]
fn batching_quick_run_batches_and_beats_fifs() {
    let dir = out_dir("batching");
    let (stdout, j) = lab(&dir, "batching", &["--quick"]);
    assert_eq!(j["experiment"], "batching");
    let fifs = num(&j, "fifs_ms");
    let chosen = num(&j, "chosen_ms");
    let best = num(&j, "best_ms");
    assert!(fifs > 0.0 && chosen > 0.0 && best > 0.0, "{j}");
    // The fitted model batches, and batching beats one record per
    // transaction on a link with a fixed per-transaction cost.
    assert!(num(&j, "chosen_batch") > 1.0, "{j}");
    assert!(num(&j, "speedup") > 1.0, "{j}");
    assert!((num(&j, "speedup") - fifs / chosen).abs() < 0.01 * fifs / chosen);
    let best_batch = num(&j, "best_batch");
    let series = j["series"].as_array().expect("series");
    assert_eq!(series.len(), 4, "quick sizes 2,5,10,20");
    assert!(series.iter().any(|p| num(p, "batch") == best_batch));
    assert!(series.iter().all(|p| num(p, "ms") >= best));
    // The model was fitted, not configured.
    let model = &j["model"];
    assert!(model["plan"]["reason"]
        .as_str()
        .unwrap()
        .starts_with("batching"));
    assert!(num(&model["link_estimate"], "per_transaction_ms") > 0.0);
    assert_eq!(num(&j["paper"], "fifs_ms"), 7694.0);
    assert_eq!(num(&j["paper"], "batched_ms"), 2025.0);
    // weir's own relay delivered the job too.
    assert!(num(&j["relay"], "ms") > 0.0, "{j}");
    let batches = j["relay"]["batches"][0].as_array().expect("relay batches");
    let delivered: f64 = batches.iter().map(|b| b.as_f64().unwrap()).sum();
    assert_eq!(delivered, num(&j["params"], "records"));
    assert!(stdout.contains("FIFS") && stdout.contains("weir's plan"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn compression_quick_run_reports_every_condition() {
    let dir = out_dir("compression");
    let (stdout, j) = lab(&dir, "compression", &["--quick"]);
    assert_eq!(j["experiment"], "compression");
    let conditions = j["conditions"].as_array().expect("conditions");
    assert_eq!(conditions.len(), 4, "two links x two payloads");
    for c in conditions {
        for key in ["link_mbps", "chosen_mbps", "oracle_mbps", "model_error_pct"] {
            assert!(num(c, key).is_finite(), "{key} in {c}");
        }
        let chosen = c["chosen"].as_str().expect("chosen");
        let oracle = c["oracle"].as_str().expect("oracle");
        let cands = c["candidates"].as_array().expect("candidates");
        assert_eq!(cands.len(), 8, "the default candidate set");
        assert!(cands.iter().any(|k| k["codec"] == chosen));
        assert!(cands.iter().any(|k| k["codec"] == oracle));
        // The oracle is the best measured candidate.
        let best = cands
            .iter()
            .map(|k| num(k, "measured_mbps"))
            .fold(0.0, f64::max);
        assert_eq!(num(c, "oracle_mbps"), best);
        assert!(num(c, "chosen_mbps") <= best);
        match c["payload"].as_str().unwrap() {
            // Compression only costs time on incompressible data.
            "random" => assert_eq!(chosen, "none", "{c}"),
            "accel-csv" => {
                let none = cands.iter().find(|k| k["codec"] == "none").unwrap();
                let zstd = cands.iter().find(|k| k["codec"] == "zstd-3").unwrap();
                assert!(num(zstd, "ratio") > 2.0, "{zstd}");
                assert!(num(none, "ratio") == 1.0);
                // On the slowest link a CSV always pays to compress.
                if num(c, "link_mbps") == 0.5 {
                    assert_ne!(chosen, "none", "{c}");
                }
            }
            other => panic!("unknown payload {other}"),
        }
    }
    // The chooser learned online from earlier payloads, never from the
    // one it is judged on: every transfer of the stream is recorded, with
    // the prediction it was sent on.
    for c in conditions {
        let stream = c["stream"].as_array().expect("stream");
        assert_eq!(stream.len(), 10, "the default stream: {c}");
        assert!(
            stream.iter().any(|t| t["sampled"].is_string()),
            "candidates are sampled as the stream goes: {c}"
        );
        assert!(stream.iter().any(|t| t["settled"] == true), "{c}");
        assert!(num(c, "stream_model_error_pct").is_finite(), "{c}");
    }
    assert!(j["goals"]["none_on_incompressible"].as_bool().unwrap());
    assert!(stdout.contains("summary"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_bad_option_is_refused_with_a_message() {
    let out = Command::new(env!("CARGO_BIN_EXE_weir-lab"))
        .args(["batching", "--sizes", "5..2"])
        .output()
        .expect("weir-lab runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("batch sizes"));
}
