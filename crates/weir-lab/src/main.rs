//! weir-lab: the papers' experiments, run in one process over an emulated
//! uplink, with weir's own models making the decisions.
//!
//! Each experiment prints a table on stdout, writes `<experiment>.json` and
//! `<experiment>.svg` to `--out`, and shows a progress bar on stderr while
//! it runs (hidden when stderr is not a terminal). docs/lab.md indexes the
//! experiments; docs/lab/ has a page on each and its results.
//!
//! # Layout
//! - `link`: the emulated uplink (fixed time per transaction plus bytes over
//!   the bandwidth), whole transactions or piped chunks.
//! - `batching`: buffer-aided relaying's 50-record job (Li et al., Fig. 10)
//!   and the batch plan of weir's fitted model.
//! - `compression`: every codec's effective throughput per link and payload
//!   (Dzhagaryan and Milenkovic, Table II), the piping model's prediction
//!   and the chooser's pick.
//! - `janus`: the JANUS evaluation, N peering nodes of weir's `App` in
//!   this process, every scheme (Tables IV, V, Fig. 6).
//! - `cluster`: the JANUS evaluation with real processes: `weir run` per
//!   network namespace, shaped uplinks, `weir-load offer` per node,
//!   RabbitMQ behind delay lines, peering over a LAN bridge.
//! - `formats`: seed 002's message formats (raw bytes, Base64, JSON)
//!   through weir's gRPC ingress into RabbitMQ.
//! - `buffers`: seed 004's router buffer sizes, real TCP flows through a
//!   shaped link and a packet delay line in network namespaces.
//! - `scale`: peering at 16-256 nodes in simulated time with weir-core's
//!   matching, all-to-all heartbeats against gossip.
//! - `netns`: entering network namespaces from a thread, and the TUN
//!   packet delay line (`buffers`, `formats` over a shaped link).
//! - `delay`: the delay line (`weir-lab delay`, and the cluster's).
//! - `relay`: a job through weir's own `App` (scheduler, batch plans, file
//!   egress behind the emulated link).
//! - `peers`: the chart of a peer benchmark (`scripts/peer-bench.sh`).
//! - `report`: tables, JSON files, SVG plots, progress bars.

mod batching;
mod buffer_sizing;
mod buffers;
mod cluster;
mod compression;
mod delay;
mod formats;
mod janus;
mod link;
mod netns;
mod peers;
mod relay;
mod report;
mod scale;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

/// Command line of weir-lab.
#[derive(Debug, Parser)]
#[command(
    name = "weir-lab",
    version,
    about = "Reproduce the papers' experiments with weir's models over an emulated link"
)]
struct Cli {
    /// Directory for `<experiment>.json` and `<experiment>.svg`.
    #[arg(long, global = true, default_value = ".")]
    out: PathBuf,
    #[command(subcommand)]
    experiment: Experiment,
}

/// The experiments.
#[derive(Debug, Subcommand)]
enum Experiment {
    /// Wall-clock of the 50-record job: FIFS, fixed buffers 2..50, and the
    /// batch plan of weir's fitted model (buffer-aided relaying, Fig. 10).
    Batching(batching::Args),
    /// Effective throughput of every codec on 0.5 and 5 MB/s links, the
    /// piping model's prediction, and the chooser's pick (Table II).
    Compression(compression::Args),
    /// The JANUS evaluation: N peering nodes over emulated Table III
    /// uplinks, every scheme; latency, violations, throughput (Tables IV,
    /// V, Fig. 6).
    Janus(janus::Args),
    /// The JANUS evaluation with real processes: N `weir run` in network
    /// namespaces, uplinks shaped by tc tbf to Table III, RabbitMQ behind
    /// delay lines, load from `weir-load offer` over MQTT, peering over
    /// gRPC. Needs root and RabbitMQ (scripts/services.sh).
    Cluster(Box<cluster::Args>),
    /// Seed 002: a frame in each of the paper's message formats (raw
    /// bytes, Base64 in bytes or string, Base64 in JSON) through weir's
    /// gRPC ingress into RabbitMQ; encode, transfer and decode times
    /// beside the paper's Tables 1-2. Needs RabbitMQ.
    Formats(formats::Args),
    /// Seed 004: the output buffer of an IoT edge router sized by Eq. 5
    /// (as printed and re-derived), Appenzeller's C T / sqrt(n) and C T,
    /// each run with real TCP Reno flows through a tc tbf access link and
    /// a packet delay line in network namespaces; utilisation, queuing
    /// delay, loss, goodput (Figs. 5-11). Needs root.
    Buffers(buffers::Args),
    /// Peering at 16, 64 and 256 nodes, simulated (deterministic, weir-core's
    /// matching and reservations): all-to-all heartbeats against gossip;
    /// convergence, spare used, advert bytes per node.
    Scale(scale::Args),
    /// The table and chart of a peer benchmark (`scripts/peer-bench.sh`):
    /// records/s per system and size, p99 to PUBACK when paced.
    Peers(peers::Args),
    /// Not an experiment: a TCP proxy that adds a fixed delay each way
    /// without limiting throughput (the propagation delay of a shaped
    /// link in the real-process lab, where netem is not available). Runs
    /// until stopped.
    Delay(delay::Args),
}

impl Experiment {
    fn name(&self) -> &'static str {
        match self {
            Experiment::Batching(_) => "batching",
            Experiment::Compression(_) => "compression",
            Experiment::Janus(_) => "janus",
            Experiment::Cluster(_) => "cluster",
            Experiment::Formats(_) => "formats",
            Experiment::Buffers(_) => "buffers",
            Experiment::Scale(_) => "scale",
            Experiment::Peers(_) => "peers",
            Experiment::Delay(_) => "delay",
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // weir's own logs, for looking inside a run: off unless RUST_LOG asks
    // (e.g. `RUST_LOG=weir::peer=debug`), on stderr beside the progress bar.
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_default_env() {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("weir-lab: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("weir-lab")
        .build()
        .context("cannot start the async runtime")?;
    let name = cli.experiment.name();
    let (table, json, svg) = rt.block_on(async {
        match &cli.experiment {
            Experiment::Batching(a) => batching::run(a).await,
            Experiment::Compression(a) => compression::run(a).await,
            Experiment::Janus(a) => janus::run(a).await,
            Experiment::Cluster(a) => cluster::run(a, &cli.out).await,
            Experiment::Formats(a) => formats::run(a).await,
            Experiment::Buffers(a) => buffers::run(a).await,
            Experiment::Scale(a) => scale::run(a).await,
            Experiment::Peers(a) => peers::run(a).await,
            Experiment::Delay(a) => delay::serve(a)
                .await
                .map(|()| (String::new(), serde_json::Value::Null, String::new())),
        }
    })?;
    if matches!(cli.experiment, Experiment::Delay(_)) {
        return Ok(());
    }
    print!("{table}");
    let out = report::write_outputs(&cli.out, name, &json, &svg)?;
    eprintln!("wrote {} and {}", out.json.display(), out.svg.display());
    Ok(())
}
