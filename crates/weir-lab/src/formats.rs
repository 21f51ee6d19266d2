//! `weir-lab formats`: seed 002 (Filho et al., WEBIST 2021, "message
//! formats over gRPC") through a real weir.
//!
//! The paper sends a JPEG-encoded Full-HD video frame from a client to a
//! gRPC server in five formats and times the steps (Tables 1-6, median
//! of 1000 rounds): `base` (a message of one boolean, the protocol's own
//! cost), `bytes` (the JPEG in a protobuf `bytes` field), `base64bytes`
//! (its Base64 text in a `bytes` field), `base64str` (the same text in a
//! `string` field) and `base64strjson` (a JSON object holding that
//! string). Its finding: raw bytes were the fastest everywhere, by a few
//! per cent on one host and by 30 % (545 against 769-940 ms) between VMs
//! under network traffic.
//!
//! Here the client publishes each format's payload to weir's gRPC ingress
//! (`Ingress.Publish`, one unary call a round, as the paper's pipeline
//! does), weir relays it to RabbitMQ (AMQP egress, publisher confirms), and
//! a consumer in this process decodes the batch and then the format. Per
//! round: the client's encoding, the call until weir's acknowledgement,
//! the time from the call to the consumer holding the record (the paper's
//! transmission, here through weir and a broker), and the consumer's
//! decoding (checked against the frame, untimed). Formats alternate within
//! each round, so noise on the shared machine falls on all of them alike.
//!
//! weir carries payloads as raw `bytes` end to end (DESIGN.md section 5);
//! this measures what a device pays when it wraps them anyway. A protobuf
//! `string` field is on the wire exactly a `bytes` field holding UTF-8:
//! `base64str` is sent as such, and its decoding includes the UTF-8 check a
//! `string` field's receiver makes.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use base64::Engine as _;
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, ExchangeDeleteOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use weir_proto::pb::ingress_client::IngressClient;
use weir_proto::pb::PublishRequest;

use crate::compression::random_bytes;
use crate::netns::{delay_between, enter, sh, veth_pair};
use crate::report::{bar_panels_svg, round, BarPanel, Table};

/// `weir-lab formats`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Rounds per format (the paper: 1000).
    #[arg(long, default_value_t = 1000)]
    pub rounds: usize,
    /// Bytes of the frame. The paper's is a JPEG of a 1080p H.264 frame
    /// (a car trip); its size is not given. Random bytes stand in for it:
    /// a JPEG, too, does not compress further.
    #[arg(long, default_value_t = 200_000)]
    pub frame_bytes: usize,
    /// Rounds run first and not counted (connections warm, caches filled).
    #[arg(long, default_value_t = 20)]
    pub warmup: usize,
    /// RabbitMQ, for weir's egress and the consumer.
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    pub amqp: String,
    /// The weir binary (default: next to weir-lab).
    #[arg(long)]
    pub weir: Option<PathBuf>,
    /// Put the client behind a shaped link to weir: a JANUS Table III
    /// network (`4g`, `wifi`, `3g`), its rate by `tc tbf` towards weir and
    /// its latency each way by a packet delay line, the client in a network
    /// namespace of its own (the paper's multi-VM and remote cases; needs
    /// root). Unset: the client on weir's host (the paper's single VM).
    #[arg(long)]
    pub network: Option<String>,
}

/// Namespaces of the shaped path: the client's, and the link's.
const NS_CLI: &str = "weir-fmt-cli";
const NS_WAN: &str = "weir-fmt-wan";
/// weir's end of the shaped path (in this process's namespace).
const WEIR_ADDR: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 73, 1, 1);

/// The client's path to weir over a shaped link: client namespace ->
/// link namespace (tbf towards weir, a TUN delay line both ways) -> this
/// namespace, where weir and RabbitMQ are. Removed when dropped.
struct ShapedPath {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl ShapedPath {
    fn build(bytes_per_sec: f64, delay: Duration) -> anyhow::Result<ShapedPath> {
        ShapedPath::remove();
        for ns in [NS_CLI, NS_WAN] {
            sh("ip", &["netns", "add", ns])?;
            sh("ip", &["-n", ns, "link", "set", "lo", "up"])?;
        }
        let mut path = ShapedPath {
            stop: Arc::new(AtomicBool::new(false)),
            threads: Vec::new(),
        };
        veth_pair(
            (Some(NS_CLI), "c0", "10.73.0.2/24"),
            (Some(NS_WAN), "w0", "10.73.0.1/24"),
            false,
        )?;
        veth_pair(
            (None, "wfmt0", "10.73.1.1/24"),
            (Some(NS_WAN), "w1", "10.73.1.2/24"),
            false,
        )?;
        sh(
            "ip",
            &["-n", NS_CLI, "route", "add", "default", "via", "10.73.0.1"],
        )?;
        sh(
            "ip",
            &["route", "replace", "10.73.0.0/24", "via", "10.73.1.2"],
        )?;
        // The uplink: the rate towards weir, a queue of 200 ms at it.
        let rate = format!("{}bit", (bytes_per_sec * 8.0).round() as u64);
        let limit = ((bytes_per_sec * 0.2) as u64).max(64 * 1024).to_string();
        sh(
            "tc",
            &[
                "-n", NS_WAN, "qdisc", "add", "dev", "w1", "root", "tbf", "rate", &rate, "burst",
                "32kb", "limit", &limit,
            ],
        )
        .context("tc tbf on the client's uplink")?;
        path.threads = delay_between(NS_WAN, ["w0", "w1"], delay, path.stop.clone())?;
        Ok(path)
    }

    fn remove() {
        for ns in [NS_CLI, NS_WAN] {
            let _ = sh("ip", &["netns", "del", ns]);
        }
    }
}

impl Drop for ShapedPath {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        ShapedPath::remove();
    }
}

/// The paper's five formats, in its tables' order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Base,
    Base64Bytes,
    Base64Str,
    Base64StrJson,
    Bytes,
}

const FORMATS: [Format; 5] = [
    Format::Base,
    Format::Base64Bytes,
    Format::Base64Str,
    Format::Base64StrJson,
    Format::Bytes,
];

impl Format {
    fn name(self) -> &'static str {
        match self {
            Format::Base => "base",
            Format::Base64Bytes => "base64bytes",
            Format::Base64Str => "base64str",
            Format::Base64StrJson => "base64strjson",
            Format::Bytes => "bytes",
        }
    }

    /// The paper's Table 1 (MEC single VM, medians, ms): client frame
    /// processing, gRPC round trip, server frame processing, total (which
    /// also holds the inference, not modelled here).
    fn paper_single_vm(self) -> [f64; 4] {
        match self {
            Format::Base => [0.02, 2.55, 0.01, 2.58],
            Format::Base64Bytes => [40.21, 4.64, 32.18, 100.67],
            Format::Base64Str => [40.45, 5.5, 34.11, 105.73],
            Format::Base64StrJson => [40.89, 5.29, 34.31, 104.32],
            Format::Bytes => [39.59, 4.66, 30.6, 99.42],
        }
    }

    /// The paper's Table 2 (MEC multi-VM) gRPC round trip, ms.
    fn paper_multi_vm_rtt(self) -> f64 {
        match self {
            Format::Base => 3.18,
            Format::Base64Bytes => 769.24,
            Format::Base64Str => 769.14,
            Format::Base64StrJson => 940.51,
            Format::Bytes => 545.28,
        }
    }

    /// What the client puts in the `payload` field for `frame`.
    fn encode(self, frame: &[u8]) -> Vec<u8> {
        let b64 = || base64::engine::general_purpose::STANDARD.encode(frame);
        match self {
            // One boolean: protobuf's `true`.
            Format::Base => vec![1],
            Format::Bytes => frame.to_vec(),
            Format::Base64Bytes | Format::Base64Str => b64().into_bytes(),
            Format::Base64StrJson => {
                serde_json::to_vec(&json!({ "image": b64() })).expect("a string serialises")
            }
        }
    }

    /// What the receiver gets back from `payload`: the frame (or the
    /// boolean).
    fn decode(self, payload: &[u8]) -> anyhow::Result<Vec<u8>> {
        let b64 = |s: &[u8]| {
            base64::engine::general_purpose::STANDARD
                .decode(s)
                .context("not Base64")
        };
        match self {
            Format::Base | Format::Bytes => Ok(payload.to_vec()),
            Format::Base64Bytes => b64(payload),
            Format::Base64Str => b64(std::str::from_utf8(payload)
                .context("a string field that is not UTF-8")?
                .as_bytes()),
            Format::Base64StrJson => {
                let v: Value = serde_json::from_slice(payload).context("not JSON")?;
                let s = v["image"].as_str().context("no \"image\" string")?;
                b64(s.as_bytes())
            }
        }
    }
}

/// Median and standard deviation of one step, milliseconds.
#[derive(Debug, Clone, Copy, Serialize)]
struct Step {
    median_ms: f64,
    sd_ms: f64,
}

fn step(xs: &[Duration]) -> Step {
    let mut v: Vec<f64> = xs.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    v.sort_by(f64::total_cmp);
    let median = match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    };
    let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len().max(1) as f64;
    Step {
        median_ms: round(median, 3),
        sd_ms: round(var.sqrt(), 3),
    }
}

#[derive(Debug, Default)]
struct Samples {
    encode: Vec<Duration>,
    ack: Vec<Duration>,
    transfer: Vec<Duration>,
    decode: Vec<Duration>,
    total: Vec<Duration>,
}

/// A record the consumer took out of a batch, and when.
struct Received {
    at: Instant,
    payload: bytes::Bytes,
}

fn config_text(
    dir: &std::path::Path,
    listen: std::net::SocketAddr,
    amqp: &str,
    queue: &str,
) -> String {
    format!(
        r#"# weir-lab formats: one gRPC stream into RabbitMQ.
[node]
id = 1
name = "formats"
[[class]]
name = "ls"
bound = "100ms"
[classify]
default_class = "ls"
[spool]
dir = "{dir}/spool"
[ingress.mqtt]
enabled = false
[ingress.grpc]
listen = "{listen}"{anonymous}
# The frames are random bytes, as a JPEG does not compress either.
[compression]
enabled = false
# One host, as the paper's single VM: an uplink far above what loopback
# carries (the token buckets never hold a frame back), and each frame goes
# as it arrives (no batch plan waits for more; the paper's pipeline sends
# one frame a round).
[scheduler]
uplink = "10Gbit/s"
track_uplink = false
burst = "4MiB"
[batching]
adaptive = false
gather = "0s"
[egress]
kind = "amqp"
[egress.amqp]
url = "{amqp}"
exchange = "{queue}"
queue = "{queue}"
routing_key = "{queue}"
"#,
        dir = crate::cluster::toml_string(dir),
        // Off loopback only on the lab's own namespace path.
        anonymous = if listen.ip().is_loopback() {
            ""
        } else {
            "\nallow_anonymous = true"
        },
    )
}

async fn consume(
    ch: lapin::Channel,
    queue: String,
    tx: mpsc::Sender<Received>,
) -> anyhow::Result<()> {
    let mut consumer = ch
        .basic_consume(
            queue.as_str().into(),
            "weir-lab-formats".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    while let Some(delivery) = consumer.next().await {
        let delivery = delivery?;
        let at = Instant::now();
        let batch = crate::cluster::batch_of(&delivery)?;
        for r in batch.records {
            if tx
                .send(Received {
                    at,
                    payload: r.payload,
                })
                .await
                .is_err()
            {
                return Ok(());
            }
        }
        delivery.ack(BasicAckOptions::default()).await?;
    }
    Ok(())
}

/// The client's rounds: every format each round, published to weir and
/// awaited at the consumer (`rx`).
async fn client_rounds(
    endpoint: String,
    frame_bytes: usize,
    warmup: usize,
    rounds: usize,
    mut rx: mpsc::Receiver<Received>,
) -> anyhow::Result<(Vec<Samples>, [usize; FORMATS.len()])> {
    let started = Instant::now();
    let mut client = loop {
        match IngressClient::connect(endpoint.clone()).await {
            Ok(c) => break c,
            Err(_) if started.elapsed() < Duration::from_secs(15) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e).context("cannot reach weir's gRPC ingress"),
        }
    };
    // Incompressible, like a JPEG.
    let frame = random_bytes(frame_bytes, 1);
    let mut samples: Vec<Samples> = FORMATS.iter().map(|_| Samples::default()).collect();
    let mut payload_bytes = [0usize; FORMATS.len()];
    let mut id = 0u64;
    for round_no in 0..warmup + rounds {
        for (k, &f) in FORMATS.iter().enumerate() {
            let t0 = Instant::now();
            let payload = f.encode(&frame);
            let encode = t0.elapsed();
            payload_bytes[k] = payload.len();
            id += 1;
            let sent = Instant::now();
            client
                .publish(PublishRequest {
                    stream: "frames".into(),
                    payload: payload.into(),
                    id,
                })
                .await
                .with_context(|| format!("publishing a {} payload", f.name()))?;
            let ack = sent.elapsed();
            let got = tokio::time::timeout(Duration::from_secs(30), rx.recv())
                .await
                .with_context(|| format!("no {} record reached RabbitMQ in 30 s", f.name()))?
                .context("the consumer stopped")?;
            let transfer = got.at.saturating_duration_since(sent);
            let t1 = Instant::now();
            let decoded = f.decode(&got.payload)?;
            let decode = t1.elapsed();
            let expected: &[u8] = if f == Format::Base { &[1] } else { &frame };
            ensure!(
                decoded == expected,
                "the {} record came back different",
                f.name()
            );
            if round_no >= warmup {
                let s = &mut samples[k];
                s.encode.push(encode);
                s.ack.push(ack);
                s.transfer.push(transfer);
                s.decode.push(decode);
                s.total.push(encode + transfer + decode);
            }
        }
    }
    Ok((samples, payload_bytes))
}

/// Runs the experiment; the table, the JSON rows and the plot.
pub async fn run(a: &Args) -> anyhow::Result<(String, Value, String)> {
    ensure!(a.rounds > 0, "--rounds must be at least 1");
    ensure!(a.frame_bytes > 0, "--frame-bytes must be at least 1");
    let weir = match &a.weir {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .context("cannot find this executable's path")?
            .with_file_name("weir"),
    };
    ensure!(
        weir.is_file(),
        "no weir binary at {} (build with `cargo build --release -p weir -p weir-lab`, or pass --weir)",
        weir.display()
    );
    let dir = std::env::temp_dir().join(format!("weir-lab-formats-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let queue = format!("weir-lab.formats.{}", std::process::id());
    let grpc = crate::janus::free_ports(1)?[0];
    let link = match &a.network {
        Some(n) => Some(crate::janus::preset(n)?),
        None => None,
    };
    let path = match &link {
        Some(l) => Some(ShapedPath::build(l.bytes_per_sec, l.delay)?),
        None => None,
    };
    let ip = if path.is_some() {
        WEIR_ADDR
    } else {
        std::net::Ipv4Addr::LOCALHOST
    };
    let listen = std::net::SocketAddr::from((ip, grpc));
    let config = dir.join("weir.toml");
    std::fs::write(&config, config_text(&dir, listen, &a.amqp, &queue))?;

    // The consumer's queue first, declared as weir declares it.
    let conn = Connection::connect(&a.amqp, ConnectionProperties::default())
        .await
        .with_context(|| format!("RabbitMQ at {} (run scripts/services.sh)", a.amqp))?;
    let admin = conn.create_channel().await?;
    admin
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::durable(),
            FieldTable::default(),
        )
        .await
        .with_context(|| format!("declaring queue {queue}"))?;

    let log = std::fs::File::create(dir.join("weir.log"))?;
    let mut child = tokio::process::Command::new(&weir)
        .arg("run")
        .arg("--config")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", weir.display()))?;

    let result = async {
        // weir up: its gRPC port answers (from here, whichever the path).
        let started = Instant::now();
        while tokio::net::TcpStream::connect(listen).await.is_err() {
            if let Some(status) = child.try_wait()? {
                bail!(
                    "weir exited ({status}) before listening: see {}",
                    dir.join("weir.log").display()
                );
            }
            ensure!(
                started.elapsed() < Duration::from_secs(15),
                "weir's gRPC ingress did not come up"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (tx, rx) = mpsc::channel(16);
        let consumer = tokio::spawn(consume(conn.create_channel().await?, queue.clone(), tx));
        // The client on a thread of its own, in its namespace when the
        // path is shaped (the sockets it opens stay there).
        let endpoint = format!("http://{listen}");
        let (warmup, rounds, frame_bytes) = (a.warmup, a.rounds, a.frame_bytes);
        let in_client_ns = path.is_some();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let run = || -> anyhow::Result<(Vec<Samples>, [usize; FORMATS.len()])> {
                if in_client_ns {
                    enter(NS_CLI)?;
                }
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?
                    .block_on(client_rounds(endpoint, frame_bytes, warmup, rounds, rx))
            };
            let _ = done_tx.send(run());
        });
        let out = done_rx.await.context("the client thread panicked")?;
        consumer.abort();
        out
    }
    .await;

    let _ = child.start_kill();
    let _ = child.wait().await;
    let _ = admin
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await;
    let _ = admin
        .exchange_delete(queue.as_str().into(), ExchangeDeleteOptions::default())
        .await;
    let _ = conn.close(200, "done".into()).await;
    drop(path);
    let (samples, payload_bytes) = result?;
    let _ = std::fs::remove_dir_all(&dir);
    report(a, link.as_ref(), &samples, &payload_bytes)
}

fn report(
    a: &Args,
    link: Option<&weir::egress::link::LinkProfile>,
    samples: &[Samples],
    payload_bytes: &[usize],
) -> anyhow::Result<(String, Value, String)> {
    let mut table = Table::new([
        "format",
        "payload B",
        "encode ms",
        "ack ms",
        "to consumer ms",
        "decode ms",
        "total ms",
        "paper client+server ms",
        "paper RTT 1 VM",
        "paper RTT 2 VMs",
    ]);
    let mut rows = Vec::new();
    for (k, f) in FORMATS.iter().enumerate() {
        let s = &samples[k];
        let (encode, ack, transfer, decode, total) = (
            step(&s.encode),
            step(&s.ack),
            step(&s.transfer),
            step(&s.decode),
            step(&s.total),
        );
        let paper = f.paper_single_vm();
        table.row([
            f.name().to_string(),
            payload_bytes[k].to_string(),
            format!("{:.3}", encode.median_ms),
            format!("{:.3}", ack.median_ms),
            format!("{:.3}", transfer.median_ms),
            format!("{:.3}", decode.median_ms),
            format!("{:.3}", total.median_ms),
            format!("{:.2}", paper[0] + paper[2]),
            format!("{:.2}", paper[1]),
            format!("{:.2}", f.paper_multi_vm_rtt()),
        ]);
        rows.push(json!({
            "format": f.name(),
            "payload_bytes": payload_bytes[k],
            "frame_bytes": a.frame_bytes,
            "rounds": s.total.len(),
            "network": a.network.as_deref().unwrap_or("host"),
            "link": link.map(|l| json!({
                "tbf_bits_per_sec": (l.bytes_per_sec * 8.0).round(),
                "delay_each_way_ms": l.delay.as_secs_f64() * 1e3,
            })),
            "encode": encode,
            "ack": ack,
            "transfer": transfer,
            "decode": decode,
            "total": total,
            "paper": {
                "client_frame_proc_ms": paper[0],
                "grpc_rtt_ms": paper[1],
                "server_frame_proc_ms": paper[2],
                "total_ms": paper[3],
                "multi_vm_grpc_rtt_ms": f.paper_multi_vm_rtt(),
            },
        }));
    }
    let bytes = FORMATS
        .iter()
        .position(|&f| f == Format::Bytes)
        .expect("listed");
    let total = |k: usize| step(&samples[k].total).median_ms;
    let mut text = table.render();
    let path = match link {
        Some(l) => format!(
            "from a client behind a {} link ({:.0} Mbit/s by tbf, {} ms each way)",
            a.network.as_deref().unwrap_or(""),
            l.bytes_per_sec * 8.0 / 1e6,
            l.delay.as_millis()
        ),
        None => "from a client on weir's host".into(),
    };
    text.push_str(&format!(
        "\n{} B frames, {} rounds each (the paper: 1000), {path}, through weir's gRPC ingress into RabbitMQ.\n",
        a.frame_bytes, a.rounds
    ));
    for (k, f) in FORMATS.iter().enumerate() {
        if matches!(f, Format::Base | Format::Bytes) {
            continue;
        }
        text.push_str(&format!(
            "  {}: {:.2}x the time of raw bytes ({:.1}x the bytes)\n",
            f.name(),
            total(k) / total(bytes),
            payload_bytes[k] as f64 / payload_bytes[bytes] as f64
        ));
    }
    let names: Vec<String> = FORMATS.iter().map(|f| f.name().to_string()).collect();
    let panel = |title: &str, pick: &dyn Fn(&Samples) -> &Vec<Duration>| BarPanel {
        title: title.to_string(),
        categories: names.clone(),
        bars: samples.iter().map(|s| step(pick(s)).median_ms).collect(),
        dots: vec![None; names.len()],
        highlight: Some(bytes),
        best: None,
    };
    let svg = bar_panels_svg(
        &format!(
            "Seed 002: a {} B frame per format through weir (median of {} rounds)",
            a.frame_bytes, a.rounds
        ),
        "ms",
        &[
            panel("client encode", &|s| &s.encode),
            panel("publish to consumer", &|s| &s.transfer),
            panel("consumer decode", &|s| &s.decode),
            panel("total", &|s| &s.total),
        ],
        2,
    )?;
    Ok((text, Value::Array(rows), svg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_format_decodes_to_the_frame_and_base64_costs_a_third_more() {
        let frame = random_bytes(3000, 1);
        for f in FORMATS {
            let p = f.encode(&frame);
            let back = f.decode(&p).unwrap();
            if f == Format::Base {
                assert_eq!(back, vec![1]);
            } else {
                assert_eq!(back, frame, "{f:?}");
            }
        }
        assert_eq!(Format::Base64Bytes.encode(&frame).len(), 4000);
        assert!(Format::Base64StrJson.encode(&frame).len() > 4000);
        assert!(Format::Base64Str.decode(&[0xff, 0xfe]).is_err());
    }
}
