//! `weir top` against a real running weir, in a pseudo-terminal of 80x24
//! (util-linux `script` provides it, as an SSH session would), and piped
//! into another program; `weir health`, which reads the same listener.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::mqtt::{publish_qos1, Pace};
use common::process::{
    file_egress, free_port, metric, scrape, sigterm, spawn_weir, wait_port,
    wait_until_catching_sigterm, write_config, WEIR,
};
use common::{eventually_async, tmp};

/// The visible text of terminal output: escape sequences dropped.
fn visible(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    let mut out = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ params final-byte; others: ESC and one more.
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
                out.push(' ');
            } else {
                chars.next();
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weir_top_shows_every_class_of_a_running_weir_in_80x24() {
    let dir = tmp("top");
    let (mqtt, admin) = (free_port(), free_port());
    let text = format!(
        "[[class]]\nname = \"urgent\"\nbound = \"100ms\"\n\
         [[class]]\nname = \"cooling\"\nbound = \"1s\"\n\
         [[class]]\nname = \"bulk\"\nbound = \"5s\"\n\
         [classify]\ndefault_class = \"bulk\"\n\
         [[classify.route]]\nmqtt = \"u/#\"\nclass = \"urgent\"\n\
         [ingress.mqtt]\nlisten = \"127.0.0.1:{mqtt}\"\n[ingress.grpc]\nenabled = false\n\
         [admin]\nlisten = \"127.0.0.1:{admin}\"\n{}\n",
        file_egress(&dir.join("out"))
    );
    let path = write_config(&dir, "weir.toml", &text);
    let mut child = spawn_weir(&path, Stdio::null());
    wait_until_catching_sigterm(&mut child);
    wait_port(format!("127.0.0.1:{mqtt}").parse().unwrap()).await;
    let until = tokio::time::Instant::now() + Duration::from_secs(4);
    let load = tokio::spawn(publish_qos1(
        mqtt,
        "top-load",
        Pace {
            rate: Some(500.0),
            ..Pace::unpaced(16, until)
        },
        |i| Some((b"u/1".to_vec(), format!("r{i}").into_bytes())),
    ));
    // Records go through weir before `weir top` looks.
    let admin_addr = format!("127.0.0.1:{admin}").parse().unwrap();
    eventually_async("the load to be delivered", || async {
        let m = scrape(admin_addr).await.unwrap_or_default();
        metric(&m, "weir_records_forwarded_total") > 0.0
    })
    .await;

    let command = format!(
        "stty rows 24 cols 80; exec {WEIR} top --config {} --interval 0.5 --frames 4",
        path.display()
    );
    let out = tokio::task::spawn_blocking(move || {
        Command::new("script")
            .args(["-q", "-e", "-c", &command, "/dev/null"])
            .env("TERM", "xterm")
            .stdin(Stdio::null())
            .output()
            .expect("run script(1)")
    })
    .await
    .unwrap();
    let screen = visible(&out.stdout);
    assert!(
        out.status.success(),
        "weir top exited with {}:\n{screen}",
        out.status
    );
    for needle in [
        "urgent",
        "cooling",
        "bulk",
        "100ms",
        "p99",
        "uplink",
        "compression",
    ] {
        assert!(screen.contains(needle), "{needle:?} not shown:\n{screen}");
    }
    // Drawn for 80 columns: no line of the frame is wider.
    assert!(
        screen.contains("┌classes") && screen.contains("┐"),
        "{screen}"
    );
    // Piped (no terminal): the same frames as plain text, one per refresh.
    let config = path.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(WEIR)
            .args(["top", "--config", config.to_str().unwrap()])
            .args(["--interval", "0.3", "--frames", "2"])
            .stdin(Stdio::null())
            .output()
            .expect("run weir top")
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "weir top | exited with {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !text.contains('\u{1b}'),
        "escape sequences in plain text:\n{text}"
    );
    assert_eq!(text.matches("┌classes").count(), 2, "{text}");
    for needle in ["urgent", "cooling", "bulk", "p99"] {
        assert!(text.contains(needle), "{needle:?} not printed:\n{text}");
    }
    load.await.unwrap();
    sigterm(child.id());
    assert!(child.wait().unwrap().success());
}

#[test]
fn weir_top_without_an_admin_listener_says_how_to_turn_it_on() {
    let dir = tmp("top-no-admin");
    let path = write_config(&dir, "weir.toml", "");
    let out = Command::new(WEIR)
        .args(["top", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("admin.listen"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weir_health_is_0_while_weir_answers_and_1_once_it_is_gone() {
    let dir = tmp("health");
    let (mqtt, admin) = (free_port(), free_port());
    let text = format!(
        "[ingress.mqtt]\nlisten = \"127.0.0.1:{mqtt}\"\n[ingress.grpc]\nenabled = false\n\
         [admin]\nlisten = \"0.0.0.0:{admin}\"\n{}\n",
        file_egress(&dir.join("out"))
    );
    let path = write_config(&dir, "weir.toml", &text);
    let health = |args: &[&str]| {
        Command::new(WEIR)
            .arg("health")
            .args(args)
            .output()
            .expect("run weir health")
    };
    let config = path.to_str().unwrap().to_owned();
    // Nothing listens yet.
    let out = health(&["--config", &config]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/healthz"), "{err}");

    let mut child = spawn_weir(&path, Stdio::null());
    wait_until_catching_sigterm(&mut child);
    wait_port(format!("127.0.0.1:{admin}").parse().unwrap()).await;
    // The config's unspecified address is asked on this host.
    let out = health(&["--config", &config]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = health(&["--admin", &format!("127.0.0.1:{admin}")]);
    assert!(out.status.success());

    sigterm(child.id());
    assert!(child.wait().unwrap().success());
    let out = health(&["--config", &config]);
    assert_eq!(out.status.code(), Some(1));
    // No admin listener in the config: says which key turns it on.
    let bare = write_config(&dir, "bare.toml", "");
    let out = health(&["--config", bare.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("admin.listen"), "{err}");
}
