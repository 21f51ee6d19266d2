//! The `weir` command line: exit codes, every config problem listed, the
//! default config printed and valid, clean shutdown on SIGTERM, `decode`.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::process::{
    file_egress, sigterm, spawn_weir, wait_until_catching_sigterm, write_config, GRPC_ONLY, WEIR,
};
use common::tmp;

#[test]
fn a_bad_config_exits_2_and_lists_every_problem() {
    let dir = tmp("cli-bad");
    let file = dir.join("bad.toml");
    std::fs::write(
        &file,
        "[node]\nid = 0\n[[class]]\nname = \"ls\"\nbound = \"0ms\"\n[scheduler]\nuplink = \"fast\"\n",
    )
    .unwrap();
    for args in [
        vec!["check-config", file.to_str().unwrap()],
        vec!["run", "--config", file.to_str().unwrap()],
    ] {
        let out = Command::new(WEIR).args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("bad.toml"), "names the file: {err}");
        for key in ["node.id", "class[0].bound", "scheduler.uplink"] {
            assert!(err.contains(key), "lists {key}: {err}");
        }
        assert!(
            !err.contains("panicked") && !err.contains("backtrace"),
            "{err}"
        );
    }
}

#[test]
fn unknown_keys_and_missing_files_exit_2() {
    let dir = tmp("cli-unknown");
    let file = dir.join("typo.toml");
    std::fs::write(&file, "[scheduler]\nwindw = \"100ms\"\n").unwrap();
    let out = Command::new(WEIR)
        .args(["check-config", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("windw"));
    let out = Command::new(WEIR)
        .args(["check-config", "/nonexistent/weir.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/weir.toml"));
}

/// `weir check-config` and `weir run` on `text`: each exits 2, and its
/// stderr contains every one of `needles`.
fn refused_with(name: &str, text: &str, needles: &[&str]) {
    let dir = tmp(&format!("{name}-config"));
    let file = write_config(&dir, "weir.toml", text);
    for args in [
        vec!["check-config", file.to_str().unwrap()],
        vec!["run", "--config", file.to_str().unwrap()],
    ] {
        let out = Command::new(WEIR).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        for needle in needles {
            assert!(err.contains(needle), "{args:?} names {needle:?}: {err}");
        }
    }
}

#[test]
fn a_listener_other_hosts_reach_without_authentication_exits_2() {
    refused_with(
        "cli-exposed",
        "[ingress.mqtt]\nlisten = \"0.0.0.0:1883\"\n[ingress.grpc]\nlisten = \"0.0.0.0:50051\"\n",
        &[
            "ingress.mqtt.listen",
            "ingress.mqtt.allow_anonymous = true",
            "ingress.grpc.allow_anonymous = true",
        ],
    );
}

#[test]
fn unusable_password_acl_and_certificate_files_exit_2_naming_each() {
    let dir = tmp("cli-security-files");
    let passwd = dir.join("passwd");
    std::fs::write(&passwd, "alice:plaintext\nbob:$6$bad\n").unwrap();
    let acl = dir.join("acl");
    std::fs::write(&acl, "user alice\ntopic write a/#/b\n").unwrap();
    let text = format!(
        "[ingress.mqtt]\nlisten = \"127.0.0.1:0\"\npassword_file = \"{}\"\nacl_file = \"{}\"\n\
         [ingress.mqtt.tls]\nlisten = \"127.0.0.1:0\"\ncertfile = \"{}\"\nkeyfile = \"/nonexistent/key.pem\"\n\
         [ingress.grpc]\nenabled = false\n",
        passwd.display(),
        acl.display(),
        passwd.display(),
    );
    let passwd_line = |n: usize| format!("{}:{n}:", passwd.display());
    refused_with(
        "cli-security-files",
        &text,
        &[
            &passwd_line(1),
            &passwd_line(2),
            &format!("{}:2:", acl.display()),
            "ingress.mqtt.tls.certfile",
            "ingress.mqtt.tls.keyfile",
            "/nonexistent/key.pem",
        ],
    );
}

#[test]
fn the_printed_default_config_is_valid() {
    let out = Command::new(WEIR)
        .arg("print-default-config")
        .output()
        .unwrap();
    assert!(out.status.success());
    let dir = tmp("cli-default");
    let file = dir.join("default.toml");
    std::fs::write(&file, &out.stdout).unwrap();
    let check = Command::new(WEIR)
        .args(["check-config", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
}

#[test]
fn sigterm_shuts_down_cleanly_and_batches_decode() {
    let dir = tmp("cli-run");
    let out_dir = dir.join("out");
    let file = write_config(
        &dir,
        "weir.toml",
        &format!("{GRPC_ONLY}\n{}\n", file_egress(&out_dir)),
    );
    let err = stop_when_up(spawn_weir(&file, Stdio::piped()));
    assert!(err.contains("SIGTERM"), "{err}");
    assert!(err.contains("shut down cleanly"), "{err}");

    // `decode` reads a batch file back, raw bytes escaped.
    let batch = weir_proto::pb::Batch {
        padding: Default::default(),
        node: 5,
        batch_seq: 9,
        created_us: 1,
        records: vec![weir_proto::pb::Record {
            key: "factory/a".into(),
            class: "ls".into(),
            origin: 5,
            seq: 77,
            ingress_us: 2,
            payload: bytes::Bytes::from_static(b"hi\x00\xff"),
        }],
    };
    let path = dir.join("5-00000000000000000009.identity.weirbatch");
    std::fs::write(&path, weir_proto::encode_batch(&batch)).unwrap();
    let out = Command::new(WEIR)
        .args(["decode", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("seq=77"), "{text}");
    assert!(text.contains(r#"payload="hi\x00\xff""#), "{text}");

    // A segment: every batch in it, each in its own encoding; a torn tail
    // (a crash while it was written) is reported and skipped.
    let mut seg = Vec::new();
    for (seq, encoding) in [
        (9u64, weir_proto::Encoding::Identity),
        (10, weir_proto::Encoding::Zstd),
    ] {
        let plain = weir_proto::encode_batch(&weir_proto::pb::Batch {
            batch_seq: seq,
            ..batch.clone()
        });
        let body = weir_proto::compress(&plain, encoding, 3).unwrap();
        let header = weir_proto::segment::FrameHeader {
            encoding,
            len: body.len(),
            batch_seq: seq,
            written_us: 3,
        };
        let start = seg.len();
        seg.extend_from_slice(&header.encode(&body));
        seg.extend_from_slice(&body);
        seg.resize(start + weir_proto::segment::frame_len(body.len()), 0);
    }
    seg.extend_from_slice(b"WRF1 torn");
    let path = dir.join("5-00000000000000000009.weirseg");
    std::fs::write(&path, &seg).unwrap();
    let out = Command::new(WEIR)
        .args(["decode", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("batch ")).collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].contains("seq=9 ") && lines[0].contains("encoding=identity"),
        "{text}"
    );
    assert!(
        lines[1].contains("seq=10 ") && lines[1].contains("encoding=zstd"),
        "{text}"
    );
    assert_eq!(text.matches(r#"payload="hi\x00\xff""#).count(), 2, "{text}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("hold no intact batch"), "{err}");

    // From stdin, and garbage is refused with a clear error.
    let mut child = Command::new(WEIR)
        .args(["decode", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"\xff\xff\xff")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a weir.v1.Batch"));
}

#[test]
fn probe_link_measures_the_emulated_uplink_with_empty_batches() {
    let dir = tmp("cli-probe");
    let out_dir = dir.join("out");
    // The probe fits a line through the median times of a small and a
    // large transfer, and gives no figure if the large one was not slower.
    // At 1 Mbit/s the 64 KiB transfer takes over half a second longer than
    // the small one, which no hiccup of a loaded machine (a slow fsync of
    // a batch file, a preempted thread) outweighs; at 8 Mbit/s it was 64 ms.
    let file = write_config(
        &dir,
        "weir.toml",
        &format!(
            "{GRPC_ONLY}\n{}\n[egress.link]\nbandwidth = \"1Mbit/s\"\ndelay = \"20ms\"\n",
            file_egress(&out_dir)
        ),
    );
    let out = Command::new(WEIR)
        .args([
            "probe-link",
            "--config",
            file.to_str().unwrap(),
            "--large",
            "65536",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let uplink: f64 = text
        .split("uplink ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no uplink figure in {text}"));
    assert!(uplink > 0.0, "{text}");
    assert!(text.contains("per-transaction time"), "{text}");
    // Six probe batches, none carrying a record.
    let batches = weir::egress::file::read_batches(&out_dir, 1 << 20).unwrap();
    assert_eq!(batches.len(), 6);
    assert!(batches.iter().all(|b| b.batch.records.is_empty()));
}

/// Runs weir with `log` (the `[log]` table) and `env` until it is up, stops
/// it with SIGTERM, and returns its stderr.
fn run_and_log(name: &str, log: &str, env: &[(&str, &str)]) -> String {
    let dir = tmp(name);
    let file = write_config(
        &dir,
        "weir.toml",
        &format!(
            "{GRPC_ONLY}\n{}\n[log]\n{log}\n",
            file_egress(&dir.join("out"))
        ),
    );
    let child = Command::new(WEIR)
        .args(["run", "--config", file.to_str().unwrap()])
        .env_remove("RUST_LOG")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    stop_when_up(child)
}

/// Waits until weir in `child` (stderr piped) is up, stops it with
/// SIGTERM, checks it exited cleanly, and returns its stderr. Once started,
/// weir catches SIGTERM; before that, SIGTERM would kill it outright: the
/// wait is for that, not for a time.
fn stop_when_up(mut child: std::process::Child) -> String {
    wait_until_catching_sigterm(&mut child);
    sigterm(child.id());
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(status.success(), "exit {status}: {err}");
    err
}

#[test]
fn json_logs_are_one_object_per_line() {
    let err = run_and_log("cli-log-json", "format = \"json\"", &[]);
    let lines: Vec<&str> = err.lines().collect();
    assert!(lines.len() >= 3, "{err}");
    let mut started = false;
    for line in lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
        assert!(
            v["level"].is_string() && v["timestamp"].is_string(),
            "{line}"
        );
        started |= v["message"] == "weir started" && v["node"] == 1;
    }
    assert!(started, "{err}");
}

#[test]
fn under_journald_text_lines_carry_priorities_and_no_timestamps() {
    let err = run_and_log(
        "cli-log-journald",
        "format = \"text\"",
        &[("JOURNAL_STREAM", "8:12345")],
    );
    for line in err.lines() {
        assert!(
            ["<3>", "<4>", "<6>", "<7>"]
                .iter()
                .any(|p| line.starts_with(p)),
            "{line:?}"
        );
        assert!(!line.contains("\u{1b}["), "no colours: {line:?}");
        assert!(!line[3..].starts_with("20"), "no timestamp: {line:?}");
    }
    assert!(
        err.lines()
            .any(|l| l.starts_with("<6>") && l.contains("weir started")),
        "{err}"
    );
}

#[test]
fn tells_systemd_it_is_ready_and_feeds_the_watchdog() {
    let dir = tmp("cli-notify");
    // What systemd does for Type=notify with WatchdogSec: a datagram socket
    // in NOTIFY_SOCKET, the period in WATCHDOG_USEC.
    let path = dir.join("notify.sock");
    let socket = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    socket
        .set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let file = write_config(
        &dir,
        "weir.toml",
        &format!("{GRPC_ONLY}\n{}\n", file_egress(&dir.join("out"))),
    );
    let mut child = Command::new(WEIR)
        .args(["run", "--config", file.to_str().unwrap()])
        .env("NOTIFY_SOCKET", &path)
        .env("WATCHDOG_USEC", "400000")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let next = || {
        let mut buf = [0u8; 256];
        let n = socket.recv(&mut buf).expect("a notification");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    assert_eq!(next(), "READY=1\n");
    for _ in 0..3 {
        assert_eq!(next(), "WATCHDOG=1\n", "fed while the scheduler runs");
    }
    // `systemctl reload` (ExecReload): SIGHUP re-reads files, and weir
    // stays up.
    let hup = Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    for _ in 0..2 {
        assert_eq!(next(), "WATCHDOG=1\n", "still running after SIGHUP");
    }
    assert!(child.try_wait().unwrap().is_none());
    sigterm(child.id());
    let mut stopping = false;
    for _ in 0..10 {
        if next() == "STOPPING=1\n" {
            stopping = true;
            break;
        }
    }
    assert!(stopping, "says it is stopping");
    assert!(child.wait().unwrap().success());
}

#[test]
fn the_systemd_unit_verifies() {
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../contrib/systemd/weir.service"
    ))
    .unwrap();
    // The unit names the installed binary; verify it against this build.
    let dir = tmp("cli-unit");
    let path = dir.join("weir.service");
    std::fs::write(&path, unit.replace("/usr/bin/weir", WEIR)).unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", path.to_str().unwrap()])
        .output()
        .expect("run systemd-analyze (install systemd: scripts/services.sh)");
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Starts weir on `config` in a session of its own (so that its autogroup
/// is not the test runner's), stderr piped.
fn spawn_in_session(config: &std::path::Path, wrapper: &[&str]) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let mut cmd = match wrapper.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(WEIR);
            c
        }
        None => Command::new(WEIR),
    };
    cmd.args(["run", "--config", config.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: setsid is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    cmd.spawn().unwrap()
}

/// Field `n` (1-based, as proc(5) numbers them) of a /proc stat line.
fn stat_field(stat: &str, n: usize) -> String {
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    rest.split_whitespace().nth(n - 3).unwrap().to_owned()
}

/// Every thread of `pid`: (nice, scheduling policy).
fn thread_priorities(pid: u32) -> Vec<(i32, u32)> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|t| {
            let stat = std::fs::read_to_string(t.unwrap().path().join("stat")).unwrap();
            (
                stat_field(&stat, 19).parse().unwrap(),
                stat_field(&stat, 41).parse().unwrap(),
            )
        })
        .collect()
}

#[test]
fn cpu_priority_reaches_every_thread_and_the_autogroup() {
    let dir = tmp("cli-priority");
    let egress = file_egress(&dir.join("out"));
    let nice = write_config(
        &dir,
        "nice.toml",
        &format!("{GRPC_ONLY}\n{egress}\n[node]\nnice = -3\n"),
    );
    let mut child = spawn_in_session(&nice, &[]);
    wait_until_catching_sigterm(&mut child);
    let threads = thread_priorities(child.id());
    assert!(threads.len() >= 3, "{threads:?}");
    assert!(
        threads.iter().all(|&(n, policy)| n == -3 && policy == 0),
        "{threads:?}"
    );
    let group = std::fs::read_to_string(format!("/proc/{}/autogroup", child.id()));
    if let Ok(group) = group {
        assert!(group.trim().ends_with("nice -3"), "{group}");
    }
    let err = stop_when_up(child);
    assert!(err.contains("CPU priority applied"), "{err}");

    let rr = write_config(
        &dir,
        "rr.toml",
        &format!("{GRPC_ONLY}\n{egress}\n[node]\nrealtime_priority = 5\n"),
    );
    let mut child = spawn_in_session(&rr, &[]);
    wait_until_catching_sigterm(&mut child);
    let threads = thread_priorities(child.id());
    // SCHED_RR is policy 2.
    assert!(
        threads.iter().all(|&(_, policy)| policy == 2),
        "{threads:?}"
    );
    stop_when_up(child);
}

#[test]
fn a_priority_the_kernel_refuses_stops_start_up_saying_what_to_grant() {
    let dir = tmp("cli-priority-refused");
    let config = write_config(
        &dir,
        "weir.toml",
        &format!(
            "{GRPC_ONLY}\n{}\n[node]\nrealtime_priority = 5\n",
            file_egress(&dir.join("out"))
        ),
    );
    // As nobody, without capabilities: SCHED_RR is refused (a user other
    // than root has no capabilities to drop).
    let as_nobody: &[&str] = match is_root() {
        true => &[
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ],
        false => &[],
    };
    let child = spawn_in_session(&config, as_nobody);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("node.realtime_priority = 5"), "{err}");
    assert!(err.contains("CAP_SYS_NICE"), "{err}");
}

/// Whether the tests run as root (`Uid:` in /proc/self/status, effective).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}
