//! The admin endpoint over HTTPS (`[admin.tls]`), read with `curl` as an
//! operator (or Prometheus with `scheme: https`) would.

mod common;

use std::process::Command;

use common::pki::Ca;
use common::process::{free_port, spawn_weir, wait_port, write_config, GRPC_ONLY};
use common::tmp;

#[tokio::test]
async fn metrics_are_served_over_https_and_not_over_plain_http() {
    let dir = tmp("admin-tls");
    let ca = Ca::new(&dir, "ca");
    let server = ca.server("server");
    let port = free_port();
    let config = format!(
        "{GRPC_ONLY}\n[egress.file]\ndir = \"{}\"\n[admin]\nlisten = \"127.0.0.1:{port}\"\n\
         [admin.tls]\ncertfile = \"{}\"\nkeyfile = \"{}\"\n",
        dir.join("out").display(),
        server.cert.display(),
        server.key.display()
    );
    let path = write_config(&dir, "weir.toml", &config);
    let log = std::fs::File::create(dir.join("weir.log")).unwrap();
    let mut weir = spawn_weir(&path, log);
    wait_port(format!("127.0.0.1:{port}").parse().unwrap()).await;
    let curl = |args: &[&str]| {
        Command::new("curl")
            .args(["-sS", "--max-time", "10"])
            .args(args)
            .output()
            .expect("run curl")
    };
    let https = curl(&[
        "--cacert",
        ca.pair.cert.to_str().unwrap(),
        &format!("https://127.0.0.1:{port}/metrics"),
    ]);
    let body = String::from_utf8_lossy(&https.stdout);
    assert!(
        https.status.success() && body.contains("weir_tls_handshakes_total"),
        "{body} {}",
        String::from_utf8_lossy(&https.stderr)
    );
    let plain = curl(&[&format!("http://127.0.0.1:{port}/metrics")]);
    assert!(
        !String::from_utf8_lossy(&plain.stdout).contains("weir_"),
        "plain HTTP is not served"
    );
    let untrusted = curl(&[&format!("https://127.0.0.1:{port}/metrics")]);
    assert!(
        !untrusted.status.success(),
        "curl without the CA refuses the certificate"
    );
    let _ = weir.kill();
    let _ = weir.wait();
}
