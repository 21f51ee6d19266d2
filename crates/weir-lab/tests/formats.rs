//! Runs `weir-lab formats` briefly against the RabbitMQ of
//! scripts/services.sh, with the `weir` binary `cargo test --workspace`
//! builds: every format's record goes through weir and comes back equal to
//! the frame (the run fails otherwise), and the JSON rows carry each
//! step's median and deviation. No timing thresholds.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

#[test]
fn every_format_goes_through_weir_and_is_timed() {
    let weir = PathBuf::from(env!("CARGO_BIN_EXE_weir-lab")).with_file_name("weir");
    assert!(
        weir.is_file(),
        "{} is missing: run `cargo test --workspace`",
        weir.display()
    );
    let dir = std::env::temp_dir().join(format!("weir-lab-test-formats-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new(env!("CARGO_BIN_EXE_weir-lab"))
        .arg("--out")
        .arg(&dir)
        .args([
            "formats",
            "--rounds",
            "10",
            "--warmup",
            "2",
            "--frame-bytes",
            "30000",
        ])
        .arg("--weir")
        .arg(&weir)
        .output()
        .expect("weir-lab runs");
    assert!(
        out.status.success(),
        "weir-lab formats failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("formats.json")).unwrap()).unwrap();
    let rows = rows.as_array().expect("rows");
    let names: Vec<&str> = rows.iter().map(|r| r["format"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["base", "base64bytes", "base64str", "base64strjson", "bytes"]
    );
    let bytes = |k: usize| rows[k]["payload_bytes"].as_u64().unwrap();
    assert_eq!(bytes(0), 1);
    assert_eq!(bytes(1), 40_000, "Base64: 4 bytes per 3");
    assert_eq!(bytes(2), 40_000);
    assert!(bytes(3) > 40_000, "JSON wraps the Base64 text");
    assert_eq!(bytes(4), 30_000);
    for r in rows {
        assert_eq!(r["rounds"].as_u64(), Some(10), "{r}");
        for step in ["encode", "ack", "transfer", "decode", "total"] {
            let m = r[step]["median_ms"].as_f64().unwrap_or(f64::NAN);
            assert!(m.is_finite() && m >= 0.0, "{step} in {r}");
        }
        assert!(r["paper"]["grpc_rtt_ms"].as_f64().is_some(), "{r}");
    }
    assert!(dir.join("formats.svg").is_file());
    let _ = std::fs::remove_dir_all(&dir);
}
