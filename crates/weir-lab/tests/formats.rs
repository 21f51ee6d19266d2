//! Runs `weir-lab formats` briefly against the RabbitMQ of
//! scripts/services.sh, with the `weir` binary `cargo test --workspace`
//! builds: every format's record goes through weir and comes back equal to
//! the frame (the run fails otherwise), and the JSON rows carry each
//! step's median and deviation. No timing thresholds.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

/// Runs `weir-lab formats` with `args` (and the `weir` beside it) into
/// `dir`; returns the JSON rows.
fn formats(dir: &std::path::Path, args: &[&str]) -> Value {
    let weir = PathBuf::from(env!("CARGO_BIN_EXE_weir-lab")).with_file_name("weir");
    assert!(
        weir.is_file(),
        "{} is missing: run `cargo test --workspace`",
        weir.display()
    );
    let _ = std::fs::remove_dir_all(dir);
    let out = Command::new(env!("CARGO_BIN_EXE_weir-lab"))
        .arg("--out")
        .arg(dir)
        .arg("formats")
        .args(args)
        .arg("--weir")
        .arg(&weir)
        .output()
        .expect("weir-lab runs");
    assert!(
        out.status.success(),
        "weir-lab formats {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(dir.join("formats.json")).unwrap()).unwrap()
}

#[test]
fn every_format_goes_through_weir_and_is_timed() {
    let dir = std::env::temp_dir().join(format!("weir-lab-test-formats-{}", std::process::id()));
    let rows = formats(
        &dir,
        &["--rounds", "10", "--warmup", "2", "--frame-bytes", "30000"],
    );
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

/// The client behind a shaped 4G link (its own namespace, tbf, the packet
/// delay line; root): every record still comes back equal, and its trip to
/// the consumer takes at least the link's 50 ms one-way delay plus the
/// frame at 18 Mbit/s, where on the host it takes a few milliseconds. A
/// lower bound set by the link, not a timing threshold on the machine.
#[test]
fn a_client_behind_a_shaped_link_pays_the_link() {
    let dir = std::env::temp_dir().join(format!("weir-lab-test-formats-4g-{}", std::process::id()));
    let rows = formats(
        &dir,
        &[
            "--network",
            "4g",
            "--rounds",
            "3",
            "--warmup",
            "1",
            "--frame-bytes",
            "60000",
        ],
    );
    for r in rows.as_array().expect("rows") {
        assert_eq!(r["network"], "4g", "{r}");
        let transfer = r["transfer"]["median_ms"].as_f64().unwrap();
        let bytes = r["payload_bytes"].as_f64().unwrap();
        // 50 ms one way, and the payload at 18 Mbit/s less tbf's 32 KiB burst.
        let floor = 50.0 + ((bytes - 33_000.0).max(0.0) * 8.0 / 18e6) * 1e3;
        assert!(transfer >= floor, "{transfer} ms < {floor} ms: {r}");
    }
    let left = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&left.stdout).contains("weir-fmt-"),
        "the namespaces are removed"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
