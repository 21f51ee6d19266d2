//! `weir-lab compression`: every candidate codec's effective throughput on
//! emulated links (Dzhagaryan and Milenkovic, Table II), the piping model's
//! prediction of it, and the codec weir's chooser picks.
//!
//! For each link and payload, each codec sends the payload as one
//! transaction with compression piped into the link: a blocking thread
//! compresses the payload chunk by chunk with a streaming encoder and hands
//! over whatever compressed bytes are ready, while the sender puts them on
//! the wire at the link's rate as they come; the fixed `T_sc` is paid once,
//! after the last byte (the transaction's acknowledgement). Effective
//! throughput is uncompressed bytes over that wall-clock.
//!
//! The model's side learns online, as weir's egress does, and never from
//! the payload it is judged on. Per link and payload kind, a fresh
//! [`CompressionChooser`] first sends a stream of `--stream` earlier
//! payloads of the same kind (other seeds): for each it
//! [`decide`](CompressionChooser::decide)s from what the earlier ones taught
//! it, compresses the first 64 KiB with a codec when a sample is due (one
//! unmeasured candidate per transfer, then the stalest now and then) and
//! observes it, sends the payload piped with the chosen codec and observes
//! that compression. Each transfer's prediction is set beside what it
//! measured: the model's error on what weir actually sends. The link is
//! characterised once, by the paper's two-transfer probe (two raw
//! transfers of different sizes, Eq. 5-6). Then the payload of the table
//! comes: every codec sends it (the oracle is the best *measured*), the
//! chooser, as the stream left it, predicts each (Eq. 3 and 19-20) and picks
//! one.
//!
//! Payloads, generated deterministically from a seed: `accel-csv`,
//! timestamped 100 Hz accelerometer rows like the paper's accel.csv
//! (`2024-05-14 09:00:00.010,0.021,-0.981,0.148`: sitting, walking and
//! driving spells with sensor noise), and `random`, incompressible bytes.
//! Each transfer carries the link's rate times `--raw-secs` bytes, so an
//! uncompressed transfer takes about that long on every link.

use std::io::{self, Write as _};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;
use weir_core::compression::{
    ChooserConfig, Codec, CompressionChooser, DEFAULT_CANDIDATES, SAMPLE_SLICE_BYTES,
};
use weir_core::link_estimate::{two_transfer_probe, LinkEstimate};

use crate::link::{Link, LinkSummary};
use crate::report::{self, BarPanel, Table};

mod payload;

pub use payload::{random_bytes, Payload, SplitMix};

/// 1 MB, the paper's unit (MB/s), not MiB.
const MB: f64 = 1e6;

/// Compressed chunks the link may hold before the compressor blocks: a
/// socket send buffer's worth (a few hundred KiB at the default chunk).
const IN_FLIGHT_CHUNKS: usize = 4;

/// The paper's Table II: best vs raw on the 0.5 MB/s link (xz -0).
pub const PAPER_BEST_VS_RAW_0_5: f64 = 11.82;
/// The paper's Table II: best vs raw on the 5 MB/s link (gzip -1).
pub const PAPER_BEST_VS_RAW_5: f64 = 4.05;
/// The paper's Table II: best vs gzip -6 on the 0.5 MB/s link.
pub const PAPER_BEST_VS_GZIP6_0_5: f64 = 1.69;
/// The paper's Table II: best vs gzip -6 on the 5 MB/s link.
pub const PAPER_BEST_VS_GZIP6_5: f64 = 7.75;

/// The chooser's pick must reach this share of the oracle's measured
/// throughput (the compression lab's goal, docs/lab/compression.md).
pub const GOAL_SHARE_OF_ORACLE: f64 = 0.95;

/// Options of `weir-lab compression`. Unset values take the full-size
/// defaults, or the `--quick` ones.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Link rates, MB/s (1 MB = 10^6 bytes) [default: 0.5,5, Table II].
    #[arg(long, value_delimiter = ',')]
    pub links: Option<Vec<f64>>,
    /// Fixed time per transaction `T_sc`, ms [default: 100; quick: 10].
    #[arg(long)]
    pub t_sc_ms: Option<f64>,
    /// Size each transfer so that sending it raw takes this many seconds
    /// on its link [default: 1.5; quick: 0.05].
    #[arg(long)]
    pub raw_secs: Option<f64>,
    /// Candidate codecs, e.g. none,gzip-6,zstd-3 [default: none, gzip
    /// 1/6/9, zstd 1/3/9/19].
    #[arg(long, value_delimiter = ',', value_parser = parse_codec)]
    pub codecs: Option<Vec<Codec>>,
    /// Earlier payloads of each kind the chooser sends, and learns from,
    /// before the measured one [default: 10: every candidate sampled once,
    /// then a few transfers on what it learned].
    #[arg(long, default_value_t = 10)]
    pub stream: usize,
    /// Uncompressed bytes the compressor takes at a time.
    #[arg(long, default_value_t = 64 * 1024)]
    pub chunk_bytes: usize,
    /// Transfers per codec and condition; the table shows the mean.
    #[arg(long, default_value_t = 1)]
    pub repeat: u32,
    /// Seed of the generated payloads.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Small and fast: for tests and a first look.
    #[arg(long)]
    pub quick: bool,
}

fn parse_codec(s: &str) -> Result<Codec, String> {
    s.parse()
        .map_err(|e: weir_core::compression::CodecError| e.to_string())
}

/// A streaming encoder for one codec, whose output can be taken as it is
/// produced (without flushing, so the output is that of one-shot
/// compression: zstd is told the input size, as weir's one-shot
/// `zstd::bulk::compress` of a batch is).
enum Encoder {
    Raw,
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
}

impl Encoder {
    fn new(codec: Codec, input_len: u64) -> io::Result<Self> {
        Ok(match codec {
            Codec::None => Encoder::Raw,
            Codec::Gzip(level) => Encoder::Gzip(flate2::write::GzEncoder::new(
                Vec::new(),
                flate2::Compression::new(level.into()),
            )),
            Codec::Zstd(level) => {
                let mut e = zstd::stream::write::Encoder::new(Vec::new(), level.into())?;
                e.set_pledged_src_size(Some(input_len))?;
                e.include_contentsize(true)?;
                Encoder::Zstd(e)
            }
        })
    }

    /// Compresses `input`; returns the compressed bytes ready so far.
    fn push(&mut self, input: &[u8]) -> io::Result<Vec<u8>> {
        match self {
            Encoder::Raw => Ok(input.to_vec()),
            Encoder::Gzip(e) => {
                e.write_all(input)?;
                Ok(std::mem::take(e.get_mut()))
            }
            Encoder::Zstd(e) => {
                e.write_all(input)?;
                Ok(std::mem::take(e.get_mut()))
            }
        }
    }

    /// Ends the stream; returns the last compressed bytes.
    fn finish(self) -> io::Result<Vec<u8>> {
        match self {
            Encoder::Raw => Ok(Vec::new()),
            Encoder::Gzip(e) => e.finish(),
            Encoder::Zstd(e) => e.finish(),
        }
    }
}

/// Compresses `data` as weir's egress compresses a batch (weir-proto's
/// one-shot `compress`): compressed size and the time it took.
pub fn compress_timed(codec: Codec, data: &[u8]) -> anyhow::Result<(u64, Duration)> {
    let Some((encoding, level)) = weir::egress::compress::wire_encoding(codec) else {
        return Ok((data.len() as u64, Duration::ZERO));
    };
    let start = std::time::Instant::now();
    let out = weir_proto::compress(data, encoding, level)?;
    Ok((out.len() as u64, start.elapsed()))
}

/// What one piped transfer measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Transfer {
    /// Start of compression to the end of the transaction.
    pub wall: Duration,
    /// Bytes that went on the wire.
    pub wire_bytes: u64,
    /// Time the compressor spent compressing (not waiting for the link).
    pub compress_time: Duration,
}

/// Sends `data` over `link` as one transaction, compressed with `codec` in
/// `chunk`-byte steps on a blocking thread, piped into the link.
pub async fn piped_transfer(
    data: Arc<Vec<u8>>,
    codec: Codec,
    link: Link,
    chunk: usize,
) -> anyhow::Result<Transfer> {
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(IN_FLIGHT_CHUNKS);
    let start = Instant::now();
    let compressor = tokio::task::spawn_blocking(move || -> io::Result<Duration> {
        let mut busy = Duration::ZERO;
        let mut enc = Encoder::new(codec, data.len() as u64)?;
        for piece in data.chunks(chunk.max(1)) {
            let t = std::time::Instant::now();
            let out = enc.push(piece)?;
            busy += t.elapsed();
            if !out.is_empty() && tx.blocking_send(out).is_err() {
                return Err(io::Error::other("the link stopped taking bytes"));
            }
        }
        let t = std::time::Instant::now();
        let out = enc.finish()?;
        busy += t.elapsed();
        if !out.is_empty() && tx.blocking_send(out).is_err() {
            return Err(io::Error::other("the link stopped taking bytes"));
        }
        Ok(busy)
    });
    let wire_bytes = link.transact_streaming(&mut rx).await;
    let wall = start.elapsed();
    let compress_time = compressor
        .await
        .context("the compressor thread panicked")?
        .with_context(|| format!("{codec} failed"))?;
    Ok(Transfer {
        wall,
        wire_bytes,
        compress_time,
    })
}

/// What the chooser had learned about one codec when the measured payload
/// came.
#[derive(Debug, Clone, Copy)]
struct Learned {
    codec: Codec,
    ratio: f64,
    compress_bytes_per_sec: f64,
}

/// One transfer of the online stream.
#[derive(Debug, Clone, Copy)]
struct StreamTransfer {
    codec: Codec,
    /// The codec sampled on this transfer's first 64 KiB, if one was due.
    sampled: Option<Codec>,
    predicted: Option<f64>,
    measured: f64,
    /// Every compressing candidate had been measured before the decision.
    settled: bool,
}

/// Sends `payloads` one after another as weir's egress would: decide from
/// what the earlier ones taught `chooser`, sample when due, send piped,
/// observe.
async fn stream(
    chooser: &mut CompressionChooser,
    kind: &'static str,
    payloads: Vec<Arc<Vec<u8>>>,
    link: Link,
    estimate: &LinkEstimate,
    chunk: usize,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<Vec<StreamTransfer>> {
    let compressing = chooser.candidates().iter().filter(|c| !c.is_none()).count();
    let epoch = Instant::now();
    let mut out = Vec::new();
    for (k, data) in payloads.into_iter().enumerate() {
        let size = data.len() as u64;
        let decision = chooser.decide(kind, size, estimate, epoch.elapsed());
        if let Some(codec) = decision.sample {
            let slice = Arc::clone(&data);
            let (n, compressed, elapsed) = tokio::task::spawn_blocking(move || {
                let n = SAMPLE_SLICE_BYTES.min(slice.len());
                compress_timed(codec, &slice[..n]).map(|(c, e)| (n as u64, c, e))
            })
            .await??;
            chooser.observe(kind, codec, n, compressed, elapsed);
        }
        let t = piped_transfer(data, decision.codec, link, chunk).await?;
        chooser.observe(kind, decision.codec, size, t.wire_bytes, t.compress_time);
        out.push(StreamTransfer {
            codec: decision.codec,
            sampled: decision.sample,
            predicted: decision.predicted,
            measured: size as f64 / t.wall.as_secs_f64(),
            settled: k >= compressing,
        });
        bar.inc(1);
    }
    Ok(out)
}

/// What `chooser` holds about every candidate of `kind`.
fn learned(chooser: &CompressionChooser, kind: &str) -> Vec<Learned> {
    let table = chooser.table(kind);
    chooser
        .candidates()
        .iter()
        .map(|&codec| {
            let st = table.and_then(|t| t.stats(codec));
            Learned {
                codec,
                ratio: st.and_then(|s| s.ratio()).unwrap_or(1.0),
                compress_bytes_per_sec: st
                    .and_then(|s| s.compress_bytes_per_sec())
                    .unwrap_or(f64::INFINITY),
            }
        })
        .collect()
}

/// One codec in one condition.
#[derive(Debug, Clone)]
struct Candidate {
    codec: Codec,
    runs: Vec<Transfer>,
    /// Mean effective throughput, bytes/s.
    measured: f64,
    /// The model's, bytes/s.
    predicted: Option<f64>,
    /// What the chooser had learned of it from the stream.
    learned: Option<Learned>,
}

/// One link and payload.
#[derive(Debug, Clone)]
struct Condition {
    rate: f64,
    payload: Payload,
    bytes: usize,
    link: Link,
    probe: Option<LinkEstimate>,
    estimate: LinkEstimate,
    cands: Vec<Candidate>,
    choice: weir_core::compression::Choice,
    stream: Vec<StreamTransfer>,
}

/// The run's settings, `--quick` and the defaults applied.
struct Plan {
    links_mbps: Vec<f64>,
    t_sc: Duration,
    raw_secs: f64,
    codecs: Vec<Codec>,
    repeat: usize,
    config: ChooserConfig,
    /// Per link, the bytes a raw transfer takes `raw_secs` to send.
    sizes: Vec<usize>,
}

impl Plan {
    /// The settings of `args`, checked.
    fn new(args: &Args) -> anyhow::Result<Plan> {
        let q = args.quick;
        let links_mbps = args.links.clone().unwrap_or_else(|| vec![0.5, 5.0]);
        let t_sc =
            Duration::from_secs_f64(args.t_sc_ms.unwrap_or(if q { 10.0 } else { 100.0 }) / 1e3);
        let raw_secs = args.raw_secs.unwrap_or(if q { 0.05 } else { 1.5 });
        let codecs = args
            .codecs
            .clone()
            .unwrap_or_else(|| DEFAULT_CANDIDATES.to_vec());
        let repeat = args.repeat.max(1) as usize;
        anyhow::ensure!(
            !links_mbps.is_empty() && links_mbps.iter().all(|r| r.is_finite() && *r > 0.0),
            "--links must list positive rates in MB/s, e.g. 0.5,5"
        );
        anyhow::ensure!(raw_secs > 0.0, "--raw-secs must be positive");
        let config = ChooserConfig {
            candidates: codecs.clone(),
            ..ChooserConfig::default()
        };
        CompressionChooser::new(config.clone()).map_err(|errs| {
            let text: Vec<String> = errs.iter().map(ToString::to_string).collect();
            anyhow::anyhow!("--codecs: {}", text.join("; "))
        })?;
        let sizes: Vec<usize> = links_mbps
            .iter()
            .map(|r| (r * MB * raw_secs).round().max(1.0) as usize)
            .collect();
        Ok(Plan {
            links_mbps,
            t_sc,
            raw_secs,
            codecs,
            repeat,
            config,
            sizes,
        })
    }
}

/// One link as the experiment sees it: its rate, the payload size on it
/// and what the two-transfer probe made of it.
struct Probed {
    /// MB/s.
    rate: f64,
    size: usize,
    link: Link,
    probe: Option<LinkEstimate>,
    /// The probe's estimate, or the nominal link's if it failed.
    estimate: LinkEstimate,
}

/// Runs the experiment: returns the table for stdout, the JSON and the SVG.
pub async fn run(args: &Args) -> anyhow::Result<(String, serde_json::Value, String)> {
    let plan = Plan::new(args)?;
    let largest = plan.sizes.iter().copied().max().unwrap_or(1);
    let conditions_n = plan.sizes.len() * Payload::ALL.len();
    let steps = Payload::ALL.len()
        + plan.links_mbps.len()
        + conditions_n * (args.stream + plan.codecs.len() * plan.repeat);
    let bar = report::progress(steps as u64, "compression");
    let payloads = generate_payloads(args.seed, largest, &bar).await?;

    // Each link: the two-transfer probe; then for each payload a fresh
    // chooser learns from samples taken just before the transfers (so they
    // see the CPU as the transfers will), and every codec is measured.
    let mut conditions = Vec::new();
    for (&rate, &size) in plan.links_mbps.iter().zip(&plan.sizes) {
        let probed = probe_link(&plan, rate, size, &bar).await;
        for (p, full) in &payloads {
            conditions.push(measure(args, &plan, &probed, *p, full, &bar).await?);
        }
    }
    bar.finish_and_clear();

    // Tables, JSON and the plot.
    let mut report = Report::new(args, &plan);
    for cond in &conditions {
        report.add(cond);
    }
    report.finish(args, &plan)
}

/// Generates `largest` bytes of each payload.
async fn generate_payloads(
    seed: u64,
    largest: usize,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<Vec<(Payload, Arc<Vec<u8>>)>> {
    let mut payloads = Vec::new();
    for p in Payload::ALL {
        bar.set_message(format!("generating {}", p.name()));
        let data = tokio::task::spawn_blocking(move || p.generate(largest, seed)).await?;
        payloads.push((p, Arc::new(data)));
        bar.inc(1);
    }
    Ok(payloads)
}

/// The link of `rate` MB/s, probed with two transfers sized after `size`.
async fn probe_link(plan: &Plan, rate: f64, size: usize, bar: &indicatif::ProgressBar) -> Probed {
    let link = Link {
        per_transaction: plan.t_sc,
        bytes_per_sec: rate * MB,
    };
    bar.set_message(format!("probing the {rate} MB/s link"));
    let (small, large) = ((size / 16).max(1) as u64, (size / 4).max(2) as u64);
    let t0 = Instant::now();
    link.transact(small).await;
    let t_small = t0.elapsed();
    let t0 = Instant::now();
    link.transact(large).await;
    let t_large = t0.elapsed();
    let probe = two_transfer_probe(small, t_small, large, t_large).ok();
    let estimate: LinkEstimate = probe.unwrap_or_else(|| link.estimate());
    bar.inc(1);
    Probed {
        rate,
        size,
        link,
        probe,
        estimate,
    }
}

/// One condition: a fresh chooser learns online from `args.stream`
/// earlier payloads of kind `p`, then every codec sends the measured one
/// (the first `size` bytes of `full`).
async fn measure(
    args: &Args,
    plan: &Plan,
    probed: &Probed,
    p: Payload,
    full: &[u8],
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<Condition> {
    let Probed {
        rate,
        size,
        link,
        probe,
        estimate,
    } = *probed;
    bar.set_message(format!("{} at {rate} MB/s: learning online", p.name()));
    let kind = p.name();
    let mut chooser = CompressionChooser::new(plan.config.clone()).expect("validated above");
    let mut earlier = Vec::new();
    for k in 0..args.stream {
        let seed = args.seed.wrapping_add(1 + k as u64);
        earlier.push(Arc::new(
            tokio::task::spawn_blocking(move || p.generate(size, seed)).await?,
        ));
    }
    let stream = stream(
        &mut chooser,
        kind,
        earlier,
        link,
        &estimate,
        args.chunk_bytes,
        bar,
    )
    .await?;
    let learned_now = learned(&chooser, kind);

    let data = Arc::new(full[..size.min(full.len())].to_vec());
    let mut cands = Vec::new();
    for &codec in &plan.codecs {
        bar.set_message(format!("{} at {rate} MB/s: {codec}", p.name()));
        let mut runs = Vec::new();
        for _ in 0..plan.repeat {
            runs.push(piped_transfer(Arc::clone(&data), codec, link, args.chunk_bytes).await?);
            bar.inc(1);
        }
        let walls: Vec<f64> = runs.iter().map(|r| r.wall.as_secs_f64()).collect();
        let measured = data.len() as f64 / report::mean(&walls);
        let predicted = chooser.predict(kind, codec, data.len() as u64, &estimate);
        cands.push(Candidate {
            codec,
            runs,
            measured,
            predicted,
            learned: learned_now.iter().find(|s| s.codec == codec).copied(),
        });
    }
    let choice = chooser.choose(kind, data.len() as u64, &estimate);
    Ok(Condition {
        rate,
        payload: p,
        bytes: data.len(),
        link,
        probe,
        estimate,
        cands,
        choice,
        stream,
    })
}

/// Bytes/s in MB/s.
fn mbps(x: f64) -> f64 {
    x / MB
}

/// A candidate's model error: predicted against measured, percent.
fn model_err(c: &Candidate) -> Option<f64> {
    c.predicted.map(|pr| (pr - c.measured) / c.measured * 100.0)
}

/// A stream transfer's model error: predicted against measured, percent.
fn stream_err(t: &StreamTransfer) -> Option<f64> {
    t.predicted.map(|pr| (pr - t.measured) / t.measured * 100.0)
}

/// How a condition came out: the chooser's pick against the oracle (the
/// fastest codec measured) and the model's errors.
struct Verdict<'a> {
    oracle: &'a Candidate,
    chosen: &'a Candidate,
    /// Mean absolute model error over the candidates, percent.
    model_error_pct: f64,
    /// The stream's mean absolute model error once every candidate had
    /// been measured, percent.
    stream_error_pct: Option<f64>,
    best_vs_raw: Option<f64>,
    best_vs_gzip6: Option<f64>,
    /// The chosen codec's share of the oracle's throughput.
    share: f64,
    /// Whether the share reaches [`GOAL_SHARE_OF_ORACLE`].
    met: bool,
}

impl<'a> Verdict<'a> {
    /// How `cond` came out.
    fn of(cond: &'a Condition) -> Verdict<'a> {
        let cands = &cond.cands;
        let oracle = cands
            .iter()
            .max_by(|a, b| a.measured.total_cmp(&b.measured))
            .expect("at least one codec");
        let chosen = cands
            .iter()
            .find(|c| c.codec == cond.choice.codec)
            .expect("the chooser picks a candidate");
        let errs: Vec<f64> = cands.iter().filter_map(model_err).map(f64::abs).collect();
        let model_error_pct = report::mean(&errs);
        // The stream: each transfer's prediction against what it measured,
        // once every candidate had been measured.
        let settled_errs: Vec<f64> = cond
            .stream
            .iter()
            .filter(|t| t.settled)
            .filter_map(stream_err)
            .map(f64::abs)
            .collect();
        let stream_error_pct = (!settled_errs.is_empty()).then(|| report::mean(&settled_errs));
        let raw = cands.iter().find(|c| c.codec.is_none()).map(|c| c.measured);
        let gzip6 = cands
            .iter()
            .find(|c| c.codec == Codec::Gzip(6))
            .map(|c| c.measured);
        let share = chosen.measured / oracle.measured;
        Verdict {
            oracle,
            chosen,
            model_error_pct,
            stream_error_pct,
            best_vs_raw: raw.map(|r| oracle.measured / r),
            best_vs_gzip6: gzip6.map(|g| oracle.measured / g),
            share,
            met: share >= GOAL_SHARE_OF_ORACLE,
        }
    }
}

/// The report as the conditions are added: the text, the summary table,
/// the JSON conditions, the plot's panels and whether the goals held.
struct Report {
    text: String,
    summary: Table,
    json_conditions: Vec<serde_json::Value>,
    panels: Vec<BarPanel>,
    all_goals: bool,
    none_on_random: bool,
}

impl Report {
    /// An empty report, headed with the run's settings.
    fn new(args: &Args, plan: &Plan) -> Report {
        let text = format!(
            "compression: T_sc {:.0} ms per transfer, raw transfer {:.2} s on each link, chunks of {} B, the chooser learning online from {} earlier payloads per condition, {} run(s) each\n",
            plan.t_sc.as_secs_f64() * 1e3,
            plan.raw_secs,
            args.chunk_bytes,
            args.stream,
            plan.repeat
        );
        let summary = Table::new([
            "link MB/s",
            "payload",
            "chosen",
            "chosen MB/s",
            "oracle",
            "oracle MB/s",
            "chosen/oracle",
            "model err %",
            "online err %",
            "best/raw",
            "best/gzip-6",
        ]);
        Report {
            text,
            summary,
            json_conditions: Vec::new(),
            panels: Vec::new(),
            all_goals: true,
            none_on_random: true,
        }
    }

    /// Adds a condition: its table and stream to the text, a summary row,
    /// its JSON and its panel.
    fn add(&mut self, cond: &Condition) {
        let Condition {
            rate,
            payload: p,
            cands,
            choice,
            ..
        } = cond;
        let v = Verdict::of(cond);
        self.all_goals &= v.met;
        if *p == Payload::Random {
            self.none_on_random &= choice.codec.is_none();
        }
        let (t, json_cands) = candidate_table(cond, &v);
        self.text.push_str(&condition_text(cond, &t, &v));
        self.summary.row([
            format!("{rate}"),
            p.name().to_string(),
            choice.codec.to_string(),
            format!("{:.3}", mbps(v.chosen.measured)),
            v.oracle.codec.to_string(),
            format!("{:.3}", mbps(v.oracle.measured)),
            format!("{:.1}%", v.share * 100.0),
            format!("{:.1}", v.model_error_pct),
            v.stream_error_pct.map_or("-".into(), |e| format!("{e:.1}")),
            v.best_vs_raw.map_or("-".into(), |v| format!("{v:.2}x")),
            v.best_vs_gzip6.map_or("-".into(), |v| format!("{v:.2}x")),
        ]);
        self.json_conditions
            .push(condition_json(cond, &v, json_cands));
        self.panels.push(BarPanel {
            title: format!(
                "{} on {rate} MB/s (chosen {}, best {})",
                p.name(),
                choice.codec,
                v.oracle.codec
            ),
            categories: cands.iter().map(|c| c.codec.to_string()).collect(),
            bars: cands.iter().map(|c| mbps(c.measured)).collect(),
            dots: cands.iter().map(|c| c.predicted.map(mbps)).collect(),
            highlight: cands.iter().position(|c| c.codec == choice.codec),
            best: cands.iter().position(|c| c.codec == v.oracle.codec),
        });
    }

    /// The text with the summary and the goals, the JSON and the SVG.
    fn finish(
        mut self,
        args: &Args,
        plan: &Plan,
    ) -> anyhow::Result<(String, serde_json::Value, String)> {
        let (all_goals, none_on_random) = (self.all_goals, self.none_on_random);
        let text = &mut self.text;
        text.push_str("\nsummary (paper, Table II, accel.csv: best/raw 11.82x on 0.5 MB/s and 4.05x on 5 MB/s; best/gzip-6 1.69x and 7.75x):\n");
        text.push_str(&self.summary.render());
        text.push_str(&format!(
            "goals: chosen >= {:.0}% of the oracle everywhere: {}; none on incompressible data: {}\n",
            GOAL_SHARE_OF_ORACLE * 100.0,
            if all_goals { "met" } else { "NOT met" },
            if none_on_random { "met" } else { "NOT met" },
        ));

        let json = json!({
            "experiment": "compression",
            "units": "MB/s, 1 MB = 10^6 bytes (the paper's unit); link_mbps is the link's rate in MB/s",
            "params": {
                "links_mbps": plan.links_mbps,
                "t_sc_ms": report::ms(plan.t_sc),
                "raw_secs": plan.raw_secs,
                "codecs": plan.codecs.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "stream": args.stream,
                "sample_slice_bytes": SAMPLE_SLICE_BYTES,
                "chunk_bytes": args.chunk_bytes,
                "repeat": plan.repeat,
                "seed": args.seed,
            },
            "conditions": self.json_conditions,
            "paper": {
                "best_vs_raw_0_5": PAPER_BEST_VS_RAW_0_5,
                "best_vs_raw_5": PAPER_BEST_VS_RAW_5,
                "best_vs_gzip6_0_5": PAPER_BEST_VS_GZIP6_0_5,
                "best_vs_gzip6_5": PAPER_BEST_VS_GZIP6_5,
            },
            "goals": {
                "chosen_share_of_oracle_at_least": GOAL_SHARE_OF_ORACLE,
                "chosen_within_goal_everywhere": all_goals,
                "none_on_incompressible": none_on_random,
            },
        });
        let svg = report::bar_panels_svg(
            "Effective throughput per codec: bars measured (orange: weir's pick), dots the piping model",
            "MB/s",
            &self.panels,
            Payload::ALL.len(),
        )?;
        Ok((self.text, json, svg))
    }
}

/// A condition's table of candidates, and the same as JSON.
fn candidate_table(cond: &Condition, v: &Verdict) -> (Table, Vec<serde_json::Value>) {
    let bytes = cond.bytes;
    let mut t = Table::new([
        "codec",
        "learned CR",
        "learned Th_c MB/s",
        "CR",
        "Th_c MB/s",
        "wall ms",
        "measured MB/s",
        "predicted MB/s",
        "error %",
    ]);
    let mut json_cands = Vec::new();
    for c in &cond.cands {
        let wire = report::mean(
            &c.runs
                .iter()
                .map(|r| r.wire_bytes as f64)
                .collect::<Vec<_>>(),
        );
        let comp = report::mean(
            &c.runs
                .iter()
                .map(|r| r.compress_time.as_secs_f64() * 1e3)
                .collect::<Vec<_>>(),
        );
        let wall = report::mean(
            &c.runs
                .iter()
                .map(|r| r.wall.as_secs_f64() * 1e3)
                .collect::<Vec<_>>(),
        );
        let mark = match (c.codec == cond.choice.codec, c.codec == v.oracle.codec) {
            (true, true) => " (chosen, best)",
            (true, false) => " (chosen)",
            (false, true) => " (best)",
            _ => "",
        };
        let sample = c.learned.filter(|_| !c.codec.is_none());
        // The compressor's own speed in the transfer (not waiting for the
        // link): what the sample's Th_c tried to foresee.
        let th_c = (comp > 0.0 && !c.codec.is_none()).then(|| bytes as f64 / (comp / 1e3));
        t.row([
            format!("{}{mark}", c.codec),
            sample.map_or("-".into(), |s| format!("{:.2}", s.ratio)),
            sample.map_or("-".into(), |s| {
                format!("{:.1}", mbps(s.compress_bytes_per_sec))
            }),
            format!("{:.2}", bytes as f64 / wire),
            th_c.map_or("-".into(), |v| format!("{:.1}", mbps(v))),
            format!("{wall:.1}"),
            format!("{:.3}", mbps(c.measured)),
            c.predicted
                .map_or("-".into(), |v| format!("{:.3}", mbps(v))),
            model_err(c).map_or("-".into(), |e| format!("{e:+.1}")),
        ]);
        json_cands.push(json!({
            "codec": c.codec.to_string(),
            "measured_mbps": report::round(mbps(c.measured), 4),
            "runs_mbps": c.runs.iter().map(|r| report::round(mbps(bytes as f64 / r.wall.as_secs_f64()), 4)).collect::<Vec<_>>(),
            "predicted_mbps": c.predicted.map(|v| report::round(mbps(v), 4)),
            "error_pct": model_err(c).map(|e| report::round(e, 2)),
            "wire_bytes": wire.round(),
            "ratio": report::round(bytes as f64 / wire, 3),
            "compress_ms": report::round(comp, 2),
            "compress_mbps": th_c.map(|v| report::round(mbps(v), 2)),
            "learned_ratio": sample.map(|s| report::round(s.ratio, 3)),
            "learned_compress_mbps": sample.map(|s| report::round(mbps(s.compress_bytes_per_sec), 2)),
            "wall_ms": report::round(wall, 2),
        }));
    }
    (t, json_cands)
}

/// A condition in the text: the probe, the candidates' table `t`, the
/// online stream and its model error.
fn condition_text(cond: &Condition, t: &Table, v: &Verdict) -> String {
    let Condition {
        rate,
        payload: p,
        bytes,
        probe,
        stream,
        ..
    } = cond;
    let mut text = format!(
        "\n{} on {rate} MB/s ({bytes} B; probe: {}):\n",
        p.name(),
        match probe {
            Some(e) => format!(
                "{:.3} MB/s, T_sc {:.1} ms",
                mbps(e.bytes_per_sec),
                e.per_transaction.as_secs_f64() * 1e3
            ),
            None => "failed, using the nominal link".into(),
        }
    );
    text.push_str(&t.render());
    text.push_str("online stream (codec sent [sampled]: predicted / measured MB/s):");
    for (k, tr) in stream.iter().enumerate() {
        text.push_str(&format!(
            "{}{} {}{}: {} / {:.3}",
            if k % 3 == 0 { "\n  " } else { "; " },
            k,
            tr.codec,
            tr.sampled.map_or(String::new(), |c| format!(" [{c}]")),
            tr.predicted
                .map_or("-".into(), |v| format!("{:.3}", mbps(v))),
            mbps(tr.measured),
        ));
    }
    text.push_str(&format!(
        "\n  model error once every candidate was measured (mean abs.): {}\n",
        v.stream_error_pct
            .map_or("-".into(), |e| format!("{e:.1}%"))
    ));
    text
}

/// A condition in the JSON, with its candidates' `json_cands`.
fn condition_json(
    cond: &Condition,
    v: &Verdict,
    json_cands: Vec<serde_json::Value>,
) -> serde_json::Value {
    let Condition {
        rate,
        payload: p,
        bytes,
        link,
        probe,
        estimate,
        choice,
        stream,
        ..
    } = cond;
    json!({
        "link_mbps": rate,
        "payload": p.name(),
        "bytes": bytes,
        "link": link.summary(),
        "link_estimate": LinkSummary::from(*estimate),
        "probe_ok": probe.is_some(),
        "chosen": choice.codec.to_string(),
        "chosen_mbps": report::round(mbps(v.chosen.measured), 4),
        "chosen_predicted_mbps": report::round(mbps(choice.predicted_throughput), 4),
        "oracle": v.oracle.codec.to_string(),
        "oracle_mbps": report::round(mbps(v.oracle.measured), 4),
        "chosen_share_of_oracle": report::round(v.share, 4),
        "model_error_pct": report::round(v.model_error_pct, 2),
        "stream_model_error_pct": v.stream_error_pct.map(|e| report::round(e, 2)),
        "stream": stream.iter().map(|t| json!({
            "codec": t.codec.to_string(),
            "sampled": t.sampled.map(|c| c.to_string()),
            "predicted_mbps": t.predicted.map(|v| report::round(mbps(v), 4)),
            "measured_mbps": report::round(mbps(t.measured), 4),
            "error_pct": stream_err(t).map(|e| report::round(e, 2)),
            "settled": t.settled,
        })).collect::<Vec<_>>(),
        "chosen_model_error_pct": model_err(v.chosen).map(|e| report::round(e, 2)),
        "best_vs_raw": v.best_vs_raw.map(|v| report::round(v, 3)),
        "best_vs_gzip6": v.best_vs_gzip6.map(|v| report::round(v, 3)),
        "goal_met": v.met,
        "candidates": json_cands,
    })
}

#[cfg(test)]
mod tests;
