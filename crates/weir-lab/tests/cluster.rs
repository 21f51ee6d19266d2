//! Runs `weir-lab cluster` on a tiny grid (2 weir processes in their own
//! network namespaces, PMRFS, low rates, 3 s) against the RabbitMQ of
//! scripts/services.sh and checks the JSON row the issue names: every
//! field there, every acknowledged record delivered exactly once, the
//! uplink sampled. Needs root (namespaces, tc) and the `weir` and
//! `weir-load` binaries beside `weir-lab` (`cargo test --workspace` builds
//! them). No timing thresholds: the load is far below the links.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

use serde_json::Value;

fn num(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("`{key}` is not a number in {v}"))
}

fn sibling(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_BIN_EXE_weir-lab")).with_file_name(name);
    assert!(
        p.is_file(),
        "{} is missing: run the workspace's tests (`cargo test --workspace`), which build it",
        p.display()
    );
    p
}

/// What both runs share: 2 nodes (1 busy), PMRFS, 256 B records, 1 s of
/// warm-up.
const TWO_NODES: &[&str] = &[
    "--nodes",
    "2",
    "--busy",
    "1",
    "--schemes",
    "pmrfs",
    "--record-bytes",
    "256",
    "--warmup",
    "1",
];

/// The runs share the namespaces' names: one at a time.
static TESTBED: Mutex<()> = Mutex::new(());

/// Runs `weir-lab cluster` with `args` into a fresh directory; its rows
/// and the uplink plot.
fn cluster(tag: &str, args: &[&str]) -> (Vec<Value>, String) {
    let dir = std::env::temp_dir().join(format!(
        "weir-lab-test-cluster-{tag}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new(env!("CARGO_BIN_EXE_weir-lab"))
        .arg("--out")
        .arg(&dir)
        .arg("cluster")
        .args(TWO_NODES)
        .args(args)
        .arg("--weir")
        .arg(sibling("weir"))
        .arg("--weir-load")
        .arg(sibling("weir-load"))
        .output()
        .expect("weir-lab runs");
    assert!(
        out.status.success(),
        "weir-lab cluster failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("cluster.json")).expect("the JSON file is written"),
    )
    .expect("valid JSON");
    let svg = std::fs::read_to_string(dir.join("cluster-uplink.svg"))
        .expect("the uplink plot is written");
    let _ = std::fs::remove_dir_all(&dir);
    (json.as_array().expect("an array of rows").clone(), svg)
}

#[test]
fn a_provider_killed_and_a_provider_cut_off_lose_no_acknowledged_record() {
    let _one = TESTBED.lock().unwrap_or_else(|e| e.into_inner());
    // 3G (97.5 kB/s): the busy node offers about 1.6 times its uplink and
    // lends to the other. The lender is killed with -9 1.5 s into the
    // load and restarted 1 s later (spool durability: what it
    // acknowledged is on disk), then cut off the LAN for 1 s.
    let (runs, _) = cluster(
        "faults",
        &[
            "--networks",
            "3g",
            "--seconds",
            "6",
            "--lt-rates",
            "500",
            "--busy-rates",
            "5,20",
            "--idle-rate",
            "5",
            "--durability",
            "spool",
            "--kill-at",
            "1.5",
            "--restart-after",
            "1",
            "--partition-at",
            "3.5",
            "--partition-for",
            "1",
            "--drain",
            "30",
        ],
    );
    assert_eq!(runs.len(), 1);
    let r = &runs[0];
    assert_eq!(r["durability"], "spool");
    assert!(r["drained"].as_bool().expect("drained"), "{r}");
    assert!(
        num(r, "redirected") > 0.0,
        "the busy node lent nothing: {r}"
    );
    let acked = num(r, "acked");
    assert!(acked > 0.0, "{r}");
    assert_eq!(num(r, "lost"), 0.0, "{r}");
    assert_eq!(num(r, "delivered"), acked, "{r}");
    // Duplicates are allowed (a provider killed between delivering and
    // saying so), and counted.
    assert!(num(r, "duplicates") >= 0.0, "{r}");
    let kill = &r["faults"]["kill"];
    assert_eq!(kill["node"], 2, "{r}");
    assert!(kill["peers_seen_after_restart_ms"].is_number(), "{r}");
    let cut = &r["faults"]["partition"];
    assert!(cut["peers_seen_after_heal_ms"].is_number(), "{r}");
    assert!(cut.get("rematched_after_heal_ms").is_some(), "{r}");
    // The killed node's devices saw their connection end.
    let victim = &r["input"][1];
    assert!(
        victim["errors"].as_array().is_some_and(|e| !e.is_empty()),
        "{victim}"
    );
}

#[test]
fn a_small_real_process_cluster_delivers_every_acknowledged_record_once() {
    let _one = TESTBED.lock().unwrap_or_else(|e| e.into_inner());
    let (runs, svg) = cluster(
        "clean",
        &[
            "--seconds",
            "2",
            "--lt-rates",
            "300",
            "--busy-rates",
            "10,50",
            "--idle-rate",
            "10",
        ],
    );
    assert!(svg.starts_with("<svg"), "the uplink plot is not an SVG");
    assert_eq!(runs.len(), 1);
    let r = &runs[0];
    assert_eq!(r["scheme"], "pmrfs");
    assert_eq!(r["network"], "4g");
    assert_eq!(r["record_bytes"], 256);
    assert_eq!(r["track_uplink"], true);
    assert!(r["drained"].as_bool().expect("drained"), "{r}");
    let acked = num(r, "acked");
    assert!(acked > 0.0, "{r}");
    assert_eq!(
        num(r, "delivered"),
        acked,
        "every acknowledged record arrives: {r}"
    );
    assert_eq!(num(r, "lost"), 0.0, "{r}");
    assert_eq!(num(r, "duplicates"), 0.0, "{r}");
    // Bytes counted on the shaped uplinks: the batch and the framing of
    // AMQP, TCP, IP and Ethernet around it.
    assert!(
        num(r, "wire_bytes_per_record") > num(r, "batch_bytes_per_record"),
        "{r}"
    );
    assert!(num(r, "batch_bytes_per_record") > 256.0, "{r}");
    let limit = num(r, "capacity_limit_rps");
    assert!(limit > 0.0 && limit <= num(r, "offered_rps") + 1e-6, "{r}");
    // Without redirection the nodes' own uplinks allow no more.
    let own = num(r, "own_links_limit_rps");
    assert!(own > 0.0 && own <= limit + 1e-6, "{r}");
    assert!(num(r, "delivered_rps") > 0.0, "{r}");
    assert!(
        num(r, "delivered_on_time_rps") <= num(r, "delivered_rps"),
        "{r}"
    );
    for class in ["ls", "nm", "lt"] {
        let c = &r["classes"][class];
        // At least the 50 ms the delay line holds every byte for.
        assert!(num(c, "latency_ms_mean") >= 50.0, "{class}: {r}");
        let v = num(c, "violation_pct");
        assert!((0.0..=100.0).contains(&v), "{class}: {r}");
        assert_eq!(num(c, "delivered"), num(c, "accepted"), "{class}: {r}");
    }
    let input = r["input"].as_array().expect("per node");
    assert_eq!(input.len(), 2);
    for n in input {
        assert!(num(n, "accepted_rps") > 0.0, "{n}");
        assert!(n["errors"].as_array().is_some_and(|e| e.is_empty()), "{n}");
        let uplink = n["uplink"].as_array().expect("uplink samples");
        assert!(uplink.len() >= 4, "{n}");
        assert!(uplink.iter().all(|u| num(u, "c_out_bps") > 0.0), "{n}");
    }
    // The namespaces are gone.
    let ns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&ns.stdout).contains("weir-lab-n"),
        "namespaces left behind"
    );
}
