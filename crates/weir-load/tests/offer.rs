//! `weir-load offer` from outside, as `weir-lab cluster` runs it: a
//! per-class QoS 1 load at a broker someone else started (here the
//! Mosquitto of scripts/services.sh), its JSON report, and the clear error
//! on a bad `--rates`. (Having an integration test also makes
//! `cargo test --workspace` build this binary, which weir-lab's cluster
//! test runs.)

use std::process::Command;

use serde_json::Value;

fn weir_load() -> Command {
    Command::new(env!("CARGO_BIN_EXE_weir-load"))
}

#[test]
fn offer_reports_what_the_broker_acknowledged_per_class() {
    let json = std::env::temp_dir().join(format!("weir-load-offer-{}.json", std::process::id()));
    let out = weir_load()
        .arg("--json")
        .arg(&json)
        .args([
            "offer",
            "--addr",
            "127.0.0.1:1883",
            "--rates",
            "ls=20,nm=0,lt=200",
            "--topic-prefix",
            "weir-load-test",
            "--size",
            "64",
            "--seconds",
            "1",
        ])
        .output()
        .expect("weir-load runs");
    assert!(
        out.status.success(),
        "weir-load offer failed (is Mosquitto on 127.0.0.1:1883? scripts/services.sh):\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    let classes = r["classes"].as_array().expect("classes");
    // A class offered at 0/s is not run.
    let names: Vec<&str> = classes
        .iter()
        .map(|c| c["class"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "{r}");
    assert!(names.contains(&"ls") && names.contains(&"lt"), "{r}");
    for c in classes {
        let (offered, sent, acked) = (
            c["offered"].as_u64().unwrap(),
            c["sent"].as_u64().unwrap(),
            c["acked"].as_u64().unwrap(),
        );
        assert!(c["error"].is_null(), "{c}");
        assert!(sent > 0 && sent <= offered, "{c}");
        // Every publish written before the end is acknowledged by then.
        assert_eq!(acked, sent, "{c}");
    }
}

#[test]
fn offer_names_a_bad_rates_argument() {
    let out = weir_load()
        .args(["offer", "--rates", "ls=fast", "--seconds", "1"])
        .output()
        .expect("weir-load runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--rates"), "{err}");
}
