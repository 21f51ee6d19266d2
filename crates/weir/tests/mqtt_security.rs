//! MQTT authentication, ACLs and TLS against the real `weir` process, with
//! the clients and files an operator uses: `mosquitto_passwd` writes the
//! password file, `openssl` makes the certificates, `mosquitto_pub`
//! publishes (MQTT 3.1.1 and 5, plain and TLS).

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::pki::{Ca, Pair};
use common::process::{
    file_batch_payloads, free_port, metric, scrape, sigterm, spawn_weir, wait_port, write_config,
};
use common::{eventually_async, tmp, PATIENCE};

/// A running weir with its file egress, stopped (SIGTERM) on drop.
struct Weir {
    child: Child,
    out: PathBuf,
    admin: SocketAddr,
}

impl Weir {
    /// Starts weir with `ingress` (the `[ingress.mqtt]` tables) in `dir`,
    /// waiting for each of `ports` to answer.
    async fn start(dir: &Path, ingress: &str, ports: &[u16]) -> Weir {
        let out = dir.join("out");
        let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let config = format!(
            "{ingress}\n[ingress.grpc]\nenabled = false\n[egress.file]\ndir = \"{}\"\n\
             [admin]\nlisten = \"{admin}\"\n[scheduler]\nwindow = \"20ms\"\n",
            out.display()
        );
        let path = write_config(dir, "weir.toml", &config);
        let log = std::fs::File::create(dir.join("weir.log")).unwrap();
        let child = spawn_weir(&path, log);
        for port in ports {
            wait_port(format!("127.0.0.1:{port}").parse().unwrap()).await;
        }
        Weir { child, out, admin }
    }

    async fn metrics(&self) -> String {
        scrape(self.admin).await.expect("scrape /metrics")
    }

    /// Stops weir cleanly and returns every payload it delivered.
    fn stop(mut self) -> BTreeSet<Vec<u8>> {
        sigterm(self.child.id());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "weir exited with {status}");
        file_batch_payloads(&self.out)
    }
}

impl Drop for Weir {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `mosquitto_pub -h 127.0.0.1 -p <port> <args>`: its exit code and
/// stderr.
async fn pub_(port: u16, args: &[&str]) -> (i32, String) {
    let out = tokio::time::timeout(
        PATIENCE,
        tokio::process::Command::new("mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("mosquitto_pub finishes")
    .expect("run mosquitto_pub (install mosquitto-clients: scripts/services.sh)");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Asserts that a publish went through.
async fn pub_ok(port: u16, args: &[&str]) {
    let (code, stderr) = pub_(port, args).await;
    assert_eq!(code, 0, "mosquitto_pub {args:?}: {stderr}");
}

/// A password file written by `mosquitto_passwd -c -b`.
fn passwd(dir: &Path, users: &[(&str, &str)]) -> PathBuf {
    let file = dir.join("passwd");
    for (i, (user, password)) in users.iter().enumerate() {
        let mut cmd = Command::new("mosquitto_passwd");
        if i == 0 {
            cmd.arg("-c");
        }
        let status = cmd
            .args(["-b", file.to_str().unwrap(), user, password])
            .status()
            .expect("run mosquitto_passwd (install mosquitto: scripts/services.sh)");
        assert!(status.success());
    }
    file
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mosquitto_passwd_users_and_acl_topics_decide_what_is_relayed() {
    let dir = tmp("mqtt-passwd-acl");
    let passwd = passwd(&dir, &[("alice", "s3cret"), ("bob", "hunter2")]);
    let acl = dir.join("acl");
    std::fs::write(
        &acl,
        "user alice\ntopic write plant/#\ntopic deny plant/secret\nuser bob\ntopic write bob/#\n\
         pattern write devices/%c/#\n",
    )
    .unwrap();
    let port = free_port();
    let weir = Weir::start(
        &dir,
        &format!(
            "[ingress.mqtt]\nlisten = \"127.0.0.1:{port}\"\npassword_file = \"{}\"\nacl_file = \"{}\"",
            path(&passwd),
            path(&acl)
        ),
        &[port],
    )
    .await;
    let alice = ["-u", "alice", "-P", "s3cret", "-q", "1"];
    let v5 = ["-V", "mqttv5"];

    // Right passwords, allowed topics, both versions and all QoS.
    for (i, qos) in ["0", "1", "2"].iter().enumerate() {
        let m = format!("alice-{i}");
        pub_ok(
            port,
            &[
                "-u", "alice", "-P", "s3cret", "-q", qos, "-t", "plant/a", "-m", &m,
            ],
        )
        .await;
        let m = format!("alice-v5-{i}");
        pub_ok(
            port,
            &[
                "-u", "alice", "-P", "s3cret", "-q", qos, "-V", "mqttv5", "-t", "plant/b", "-m", &m,
            ],
        )
        .await;
    }
    pub_ok(
        port,
        &[
            "-u", "bob", "-P", "hunter2", "-q", "1", "-t", "bob/x", "-m", "bob-1",
        ],
    )
    .await;
    pub_ok(
        port,
        &[
            "-u",
            "bob",
            "-P",
            "hunter2",
            "-q",
            "1",
            "-i",
            "d7",
            "-t",
            "devices/d7/t",
            "-m",
            "bob-pattern",
        ],
    )
    .await;

    // Wrong, missing and unknown credentials: CONNACK "not authorized"
    // (3.1.1 return code 5, which mosquitto_pub exits with; MQTT 5 reason
    // 0x87 = 135).
    let (code, stderr) = pub_(
        port,
        &["-u", "alice", "-P", "wrong", "-t", "plant/a", "-m", "x1"],
    )
    .await;
    assert_eq!(code, 5, "{stderr}");
    assert!(stderr.contains("not authorised"), "{stderr}");
    let (code, stderr) = pub_(
        port,
        &[
            "-u", "alice", "-P", "wrong", "-V", "mqttv5", "-t", "plant/a", "-m", "x2",
        ],
    )
    .await;
    assert_eq!(code, 135, "{stderr}");
    let (code, _) = pub_(port, &["-t", "plant/a", "-m", "x3"]).await;
    assert_eq!(
        code, 5,
        "anonymous clients are refused once a password file is set"
    );
    let (code, _) = pub_(
        port,
        &["-u", "mallory", "-P", "s3cret", "-t", "plant/a", "-m", "x4"],
    )
    .await;
    assert_eq!(code, 5, "unknown user");
    // A client id that would widen the %c pattern is refused too.
    let (code, _) = pub_(
        port,
        &[
            "-u",
            "bob",
            "-P",
            "hunter2",
            "-i",
            "d7/+",
            "-t",
            "devices/d7/t",
            "-m",
            "x5",
        ],
    )
    .await;
    assert_eq!(code, 5, "client id with + and /");

    // Topics the ACL denies: MQTT 3.1.1 is acknowledged and dropped (as
    // Mosquitto does); MQTT 5 is told "not authorized" in its PUBACK.
    let mut args = alice.to_vec();
    args.extend(["-t", "plant/secret", "-m", "denied-1"]);
    pub_ok(port, &args).await;
    let mut args = alice.to_vec();
    args.extend(["-t", "other/topic", "-m", "denied-2"]);
    pub_ok(port, &args).await;
    let mut args = alice.to_vec();
    args.extend(v5);
    args.extend(["-t", "other/topic", "-m", "denied-3"]);
    let (code, stderr) = pub_(port, &args).await;
    assert!(
        stderr.contains("Not authorized"),
        "MQTT 5 PUBACK reason: {code} {stderr}"
    );
    pub_ok(
        port,
        &[
            "-u", "bob", "-P", "hunter2", "-q", "1", "-t", "plant/a", "-m", "denied-4",
        ],
    )
    .await;

    // A user added to both files while weir runs can connect and publish
    // without a restart (the files are watched).
    std::fs::OpenOptions::new()
        .append(true)
        .open(&acl)
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"user carol\ntopic write carol/#\n"))
        .unwrap();
    let status = Command::new("mosquitto_passwd")
        .args(["-b", path(&passwd), "carol", "pw"])
        .status()
        .unwrap();
    assert!(status.success());
    eventually_async("carol to be let in after the files changed", || async {
        let (code, stderr) = pub_(
            port,
            &[
                "-u", "carol", "-P", "pw", "-q", "1", "-V", "mqttv5", "-t", "carol/x", "-m",
                "carol-1",
            ],
        )
        .await;
        code == 0 && !stderr.contains("Not authorized")
    })
    .await;

    eventually_async("the refusals to be counted", || async {
        let m = weir.metrics().await;
        metric(&m, "weir_mqtt_connects_refused_total") >= 5.0
            && metric(&m, "weir_mqtt_publishes_denied_total") >= 4.0
    })
    .await;
    let m = weir.metrics().await;
    assert!(
        m.contains("weir_mqtt_connects_refused_total{reason=\"bad_password\"} 2"),
        "{m}"
    );
    assert!(
        m.contains("weir_mqtt_publishes_denied_total{user=\"alice\"} 3"),
        "{m}"
    );
    assert!(
        m.contains("weir_mqtt_publishes_denied_total{user=\"bob\"} 1"),
        "{m}"
    );

    let delivered = weir.stop();
    let delivered: BTreeSet<String> = delivered
        .into_iter()
        .map(|p| String::from_utf8(p).unwrap())
        .collect();
    let mut expected: BTreeSet<String> = (0..3)
        .flat_map(|i| [format!("alice-{i}"), format!("alice-v5-{i}")])
        .collect();
    expected.insert("bob-1".into());
    expected.insert("bob-pattern".into());
    expected.insert("carol-1".into());
    assert_eq!(
        delivered, expected,
        "only authenticated, ACL-allowed publishes reach the egress"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_client_certificates_names_the_user() {
    let dir = tmp("mqtt-tls-mtls");
    let ca = Ca::new(&dir, "ca");
    let server = ca.server("server");
    let dev1 = ca.client("dev1", "dev-1");
    let rogue_ca = Ca::new(&dir, "rogue");
    let rogue = rogue_ca.client("rogue-dev1", "dev-1");
    let acl = dir.join("acl");
    std::fs::write(&acl, "user dev-1\ntopic write dev/1/#\n").unwrap();
    let port = free_port();
    let weir = Weir::start(
        &dir,
        &format!(
            "[ingress.mqtt]\nlisten = \"off\"\nacl_file = \"{}\"\n[ingress.mqtt.tls]\n\
             listen = \"127.0.0.1:{port}\"\ncertfile = \"{}\"\nkeyfile = \"{}\"\ncafile = \"{}\"\n\
             require_certificate = true\nuse_identity_as_username = true",
            path(&acl),
            path(&server.cert),
            path(&server.key),
            path(&ca.pair.cert)
        ),
        &[port],
    )
    .await;
    let tls = |pair: &Pair| {
        vec![
            "--cafile".to_owned(),
            path(&ca.pair.cert).to_owned(),
            "--cert".to_owned(),
            path(&pair.cert).to_owned(),
            "--key".to_owned(),
            path(&pair.key).to_owned(),
            "-q".to_owned(),
            "1".to_owned(),
        ]
    };
    let run = |extra: Vec<String>, rest: &'static [&'static str]| async move {
        let mut args: Vec<&str> = extra.iter().map(String::as_str).collect();
        args.extend(rest);
        pub_(port, &args).await
    };
    let (code, stderr) = run(tls(&dev1), &["-t", "dev/1/temp", "-m", "tls-1"]).await;
    assert_eq!(code, 0, "{stderr}");
    let (code, stderr) = run(
        tls(&dev1),
        &["-V", "mqttv5", "-t", "dev/1/temp", "-m", "tls-2"],
    )
    .await;
    assert_eq!(code, 0, "{stderr}");
    // The ACL applies to the certificate's name.
    let (code, stderr) = run(tls(&dev1), &["-t", "dev/2/temp", "-m", "tls-denied"]).await;
    assert_eq!(code, 0, "3.1.1: acknowledged, dropped: {stderr}");
    // A certificate from another CA, even with the same CN, and no
    // certificate at all: refused in the handshake.
    let (code, _) = run(tls(&rogue), &["-t", "dev/1/temp", "-m", "rogue"]).await;
    assert_ne!(code, 0, "a certificate from another CA is refused");
    let no_cert = vec!["--cafile".to_owned(), path(&ca.pair.cert).to_owned()];
    let (code, _) = run(no_cert, &["-t", "dev/1/temp", "-m", "no-cert"]).await;
    assert_ne!(code, 0, "a client without a certificate is refused");
    // Plain TCP is not served at all here; a password cannot stand in for
    // the certificate.
    let m = weir.metrics().await;
    assert!(
        metric(&m, "weir_tls_handshake_failures_total") >= 2.0,
        "{m}"
    );
    assert_eq!(metric(&m, "weir_tls_handshakes_total"), 3.0, "{m}");
    assert!(
        m.contains("weir_mqtt_publishes_denied_total{user=\"dev-1\"} 1"),
        "{m}"
    );
    let delivered = weir.stop();
    let expected: BTreeSet<Vec<u8>> = [b"tls-1".to_vec(), b"tls-2".to_vec()].into();
    assert_eq!(delivered, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_serves_new_connections_while_old_ones_go_on() {
    use tokio::io::AsyncWriteExt;
    let dir = tmp("mqtt-tls-rotate");
    let old_ca = Ca::new(&dir, "old-ca");
    let new_ca = Ca::new(&dir, "new-ca");
    let old = old_ca.server("old-server");
    let new = new_ca.server("new-server");
    // The files weir reads, replaced in place later.
    let (cert, key) = (dir.join("server.pem"), dir.join("server.key"));
    std::fs::copy(&old.cert, &cert).unwrap();
    std::fs::copy(&old.key, &key).unwrap();
    let port = free_port();
    let weir = Weir::start(
        &dir,
        &format!(
            "[ingress.mqtt]\nlisten = \"off\"\n[ingress.mqtt.tls]\nlisten = \"127.0.0.1:{port}\"\n\
             certfile = \"{}\"\nkeyfile = \"{}\"",
            path(&cert),
            path(&key)
        ),
        &[port],
    )
    .await;
    // A long-lived client: `mosquitto_pub -l` publishes each line of its
    // input on one connection.
    let mut old_client = tokio::process::Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "--cafile"])
        .arg(&old_ca.pair.cert)
        .args(["-q", "1", "-t", "rot/old", "-l"])
        .stdin(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut input = old_client.stdin.take().unwrap();
    input.write_all(b"before-1\nbefore-2\n").await.unwrap();
    input.flush().await.unwrap();
    let ca_arg = |ca: &Ca| path(&ca.pair.cert).to_owned();
    pub_ok(
        port,
        &[
            "--cafile",
            &ca_arg(&old_ca),
            "-q",
            "1",
            "-t",
            "rot/new",
            "-m",
            "old-cert",
        ],
    )
    .await;

    // Rotate: write the new files (key first, then the certificate).
    std::fs::copy(&new.key, &key).unwrap();
    std::fs::copy(&new.cert, &cert).unwrap();
    eventually_async(
        "new connections to be served the new certificate",
        || async {
            pub_(
                port,
                &[
                    "--cafile",
                    &ca_arg(&new_ca),
                    "-q",
                    "1",
                    "-t",
                    "rot/new",
                    "-m",
                    "new-cert",
                ],
            )
            .await
            .0 == 0
        },
    )
    .await;
    let (code, _) = pub_(
        port,
        &[
            "--cafile",
            &ca_arg(&old_ca),
            "-q",
            "1",
            "-t",
            "rot/new",
            "-m",
            "stale",
        ],
    )
    .await;
    assert_ne!(code, 0, "the old certificate is no longer served");

    // The connection made before the rotation still publishes.
    input.write_all(b"after-1\nafter-2\n").await.unwrap();
    drop(input);
    let status = tokio::time::timeout(PATIENCE, old_client.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "the old connection kept working");
    common::eventually("the old connection's last records to be delivered", || {
        let delivered = file_batch_payloads(&weir.out);
        delivered.contains(b"after-1".as_slice()) && delivered.contains(b"after-2".as_slice())
    })
    .await;
    let delivered = weir.stop();
    for p in [
        "before-1", "before-2", "after-1", "after-2", "old-cert", "new-cert",
    ] {
        assert!(
            delivered.contains(p.as_bytes()),
            "{p} not delivered: {delivered:?}"
        );
    }
    assert!(!delivered.contains(b"stale".as_slice()));
}
