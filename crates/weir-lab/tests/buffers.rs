//! Runs `weir-lab buffers` briefly (8 flows, long-only and half short, a
//! two-point sweep, 2 s per run) and checks what the experiment rests on:
//! the delay line adds the round trip asked for (the measured `T` is at
//! least twice the one-way delay), traffic crosses the shaped link, short
//! flows open new connections while long ones keep theirs, the Appenzeller
//! run measures an `l` for Eq. 5, and a rule-of-thumb buffer queues longer
//! than a two-packet one (the same run, a ratio, no threshold on time).
//! Needs root (namespaces, tc, a TUN device).

use std::process::Command;

use serde_json::Value;

fn num(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("`{key}` is not a number in {v}"))
}

#[test]
fn tcp_flows_cross_the_shaped_link_and_every_rule_is_run_or_explained() {
    let dir = std::env::temp_dir().join(format!("weir-lab-test-buffers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new(env!("CARGO_BIN_EXE_weir-lab"))
        .arg("--out")
        .arg(&dir)
        .args([
            "buffers",
            "--flows",
            "8",
            "--long-fractions",
            "1,0.5",
            "--seconds",
            "2",
            "--warmup",
            "0.5",
            "--sweep-points",
            "2",
            "--sweep-flows",
            "8",
            "--one-way",
            "20ms",
        ])
        .output()
        .expect("weir-lab runs");
    assert!(
        out.status.success(),
        "weir-lab buffers failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("buffers.json")).unwrap()).unwrap();
    assert!(
        num(&v, "rtt_ms") >= 40.0,
        "the delay line adds 20 ms each way: {v}"
    );
    let runs = v["runs"].as_array().expect("runs");
    // 2 alphas x 4 rules + 2 alphas x 2 sweep points.
    assert_eq!(runs.len(), 12, "{runs:#?}");
    for r in runs {
        if r.get("error").is_some() {
            assert!(
                r["rule"] == "eq5_printed",
                "only Eq. 5 as printed can have no solution: {r}"
            );
            continue;
        }
        assert!(
            num(r, "goodput_mbit") > 1.0,
            "traffic crosses the link: {r}"
        );
        assert!(num(r, "utilization_pct") > 10.0, "{r}");
        let conns = num(r, "connections");
        if num(r, "long_fraction") == 1.0 {
            assert_eq!(conns, 8.0, "long flows keep their connection: {r}");
        } else {
            assert!(conns > 8.0, "short flows reconnect after idling: {r}");
        }
    }
    let find = |rule: &str, alpha: f64, buffer_rank: usize| -> &Value {
        let mut rows: Vec<&Value> = runs
            .iter()
            .filter(|r| r["rule"] == rule && num(r, "long_fraction") == alpha)
            .collect();
        rows.sort_by(|a, b| num(a, "buffer_bytes").total_cmp(&num(b, "buffer_bytes")));
        rows[buffer_rank]
    };
    for alpha in [1.0, 0.5] {
        let app = find("appenzeller", alpha, 0);
        assert!(
            num(app, "drops_per_event_used") >= 1.0,
            "Eq. 5's l comes from the Appenzeller run: {app}"
        );
        let rederived = find("eq5_rederived", alpha, 0);
        assert!(rederived.get("error").is_none(), "{rederived}");
        let small = find("sweep", alpha, 0);
        let thumb = find("rule_of_thumb", alpha, 0);
        assert!(
            num(thumb, "queuing_delay_ms") > num(small, "queuing_delay_ms"),
            "a C T buffer queues longer than 2 MTU: {thumb} vs {small}"
        );
    }
    assert!(std::fs::read_to_string(dir.join("buffers.svg"))
        .unwrap()
        .contains("<svg"));
    let left = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip runs");
    assert!(
        !String::from_utf8_lossy(&left.stdout).contains("weir-bsz-"),
        "the namespaces are removed"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
