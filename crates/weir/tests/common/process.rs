//! weir itself: the `weir` binary, config snippets, starting `weir run`
//! and signalling it, the admin endpoint's metrics.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::PATIENCE;

/// The `weir` binary cargo built for these tests.
pub const WEIR: &str = env!("CARGO_BIN_EXE_weir");

/// Ingress section of a node fed only through gRPC on a free loopback
/// port (`App::grpc_addr` tells which).
pub const GRPC_ONLY: &str =
    "[ingress.mqtt]\nenabled = false\n[ingress.grpc]\nlisten = \"127.0.0.1:0\"";

/// An `[egress.file]` section writing batch files into `dir`.
pub fn file_egress(dir: &Path) -> String {
    format!("[egress.file]\ndir = \"{}\"", dir.display())
}

/// A weir config with two spooled classes, `ls` (topics `ls/#`) and `lt`
/// (everything else), the spool in `spool`, MQTT and admin on loopback
/// ports and no gRPC. `extra` goes in the `[spool]` section (and may open
/// further sections); `egress` is the egress section(s).
pub fn spool_config(spool: &Path, mqtt: u16, admin: u16, egress: &str, extra: &str) -> String {
    format!(
        "[[class]]\nname = \"ls\"\nbound = \"100ms\"\ndurability = \"spool\"\n\
         [[class]]\nname = \"lt\"\nbound = \"1s\"\ndurability = \"spool\"\n\
         [classify]\ndefault_class = \"lt\"\n[[classify.route]]\nmqtt = \"ls/#\"\nclass = \"ls\"\n\
         [spool]\ndir = \"{}\"\n{extra}\n\
         [ingress.mqtt]\nlisten = \"127.0.0.1:{mqtt}\"\n[ingress.grpc]\nenabled = false\n\
         [admin]\nlisten = \"127.0.0.1:{admin}\"\n{egress}\n",
        spool.display()
    )
}

/// Parses a test config (`name` is what errors call it); panics listing
/// every problem.
pub fn parse_config(text: &str, name: &str) -> weir::config::Config {
    weir::config::parse(text, name).unwrap_or_else(|e| panic!("{e}"))
}

/// A free loopback port (bound and released: weir binds it next, across
/// restarts).
pub fn free_port() -> u16 {
    super::peering::free_ports(1)[0]
}

/// Writes `text` to `dir/file` and returns the path.
pub fn write_config(dir: &Path, file: &str, text: &str) -> PathBuf {
    let path = dir.join(file);
    std::fs::write(&path, text).unwrap();
    path
}

/// `weir run --config <config>`, logging at `info` (whatever `RUST_LOG`
/// the tests run with) to `stderr`.
pub fn spawn_weir(config: &Path, stderr: impl Into<Stdio>) -> Child {
    Command::new(WEIR)
        .args(["run", "--config", config.to_str().unwrap()])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {WEIR}: {e}"))
}

/// Sends SIGTERM to process `pid`.
pub fn sigterm(pid: u32) {
    let sent = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(sent.success(), "kill -TERM {pid} failed");
}

/// Whether process `pid` catches SIGTERM (`SigCgt` in
/// `/proc/<pid>/status`, a hex mask with bit `signal - 1` set).
fn catches_sigterm(pid: u32) -> bool {
    const SIGTERM: u32 = 15;
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (SIGTERM - 1)) != 0)
}

/// Waits (blocking) until weir in `child` has installed its SIGTERM
/// handler, which it does once started: a SIGTERM before that would kill
/// it outright instead of shutting it down. Panics if it exits first.
pub fn wait_until_catching_sigterm(child: &mut Child) {
    let give_up = Instant::now() + PATIENCE;
    // Where its stderr goes, if a file: shown if it exits before it is up.
    let log = std::fs::read_link(format!("/proc/{}/fd/2", child.id())).ok();
    while !catches_sigterm(child.id()) {
        if let Some(status) = child.try_wait().unwrap() {
            let said = log
                .as_ref()
                .and_then(|path| std::fs::read_to_string(path).ok())
                .unwrap_or_default();
            panic!("weir exited with {status} before it was up:\n{said}");
        }
        assert!(
            Instant::now() < give_up,
            "weir never installed its SIGTERM handler"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until `addr` answers TCP connections.
pub async fn wait_port(addr: SocketAddr) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{addr} never answered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The Prometheus text of the admin listener at `addr` (`GET /metrics`).
pub async fn scrape(addr: SocketAddr) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(addr).await?;
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: weir\r\n\r\n")
        .await?;
    let mut text = String::new();
    conn.read_to_string(&mut text).await?;
    match text.split_once("\r\n\r\n") {
        // HTTP/1.0: the body is not chunked and ends with the connection.
        Some((head, body)) if head.starts_with("HTTP/1.0 200") => Ok(body.to_owned()),
        _ => Err(std::io::Error::other(format!(
            "unexpected answer from {addr}/metrics: {text}"
        ))),
    }
}

/// Runs `scripts/<name>` with `args` (a broker cluster's control script)
/// and returns its standard output; panics with its output if it fails.
pub fn run_script(name: &str, args: &[&str]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts")
        .join(name);
    let out = Command::new("bash")
        .arg(script)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run scripts/{name}: {e}"));
    assert!(
        out.status.success(),
        "{name} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The sum of every series of `name` (all label sets) in Prometheus text;
/// 0 when there is none.
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let value = if rest.starts_with('{') {
                rest.rsplit_once(' ')?.1
            } else {
                rest.strip_prefix(' ')?
            };
            value.trim().parse::<f64>().ok()
        })
        .sum()
}

/// Payloads of every record in the file egress's segments.
pub fn file_batch_payloads(dir: &Path) -> std::collections::BTreeSet<Vec<u8>> {
    file_batch_records(dir)
        .into_iter()
        .map(|r| r.payload.to_vec())
        .collect()
}

/// Every record in the file egress's segments (none if `dir` is not there
/// yet).
pub fn file_batch_records(dir: &Path) -> Vec<weir_proto::pb::Record> {
    match weir::egress::file::read_batches(dir, 64 << 20) {
        Ok(batches) => batches.into_iter().flat_map(|b| b.batch.records).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => panic!("reading the segments in {}: {e}", dir.display()),
    }
}
