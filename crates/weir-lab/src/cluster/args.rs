//! The command line of `weir-lab cluster` and the binaries it runs.

use std::path::PathBuf;

use anyhow::{ensure, Context};

use crate::janus;

/// Command line of `weir-lab cluster`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Schemes to compare (the paper's: native, qm-only, pmrfs, random,
    /// fcfs, lrfs, best-fit).
    #[arg(long, value_delimiter = ',', default_values_t = ["native", "qm-only", "pmrfs"].map(String::from))]
    pub schemes: Vec<String>,
    /// Payload bytes per record. The paper gives none (a smart-building
    /// dataset's readings); the sizes the issue names, each reported.
    #[arg(long, value_delimiter = ',', default_values_t = [256usize, 480, 640, 720, 1024])]
    pub record_bytes: Vec<usize>,
    #[command(flatten)]
    pub grid: janus::Grid,
    /// Most seconds to wait for the queues to drain after the load; what
    /// is still queued then is reported (`queued_at_end`), not counted as
    /// lost, and is missing from the latency figures (which flatters the
    /// schemes that fall behind: Native, QM-only).
    #[arg(long, default_value_t = 10.0)]
    pub drain: f64,
    /// Pin `C_out` at the preset's rate (`scheduler.track_uplink = false`)
    /// instead of each node's own online estimate.
    #[arg(long)]
    pub pin_uplink: bool,
    /// RabbitMQ, as the cloud sees it (the nodes reach it through their
    /// delay lines).
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    pub amqp: String,
    /// The weir binary [default: `weir` next to this executable].
    #[arg(long)]
    pub weir: Option<PathBuf>,
    /// The weir-load binary [default: `weir-load` next to this executable].
    #[arg(long)]
    pub weir_load: Option<PathBuf>,
    /// Durability of every class on every node: memory, or spool (an
    /// acknowledgement means on disk, so a node killed with -9 and
    /// restarted still delivers what it acknowledged).
    #[arg(long, default_value = "memory", value_parser = ["memory", "spool"])]
    pub durability: String,
    /// Kill one node with SIGKILL this many seconds into the load (the
    /// last node, an idle one and so a provider), and restart it
    /// `--restart-after` later.
    #[arg(long)]
    pub kill_at: Option<f64>,
    /// Seconds between the kill and the restart.
    #[arg(long, default_value_t = 3.0)]
    pub restart_after: f64,
    /// Cut one node (the last) off the LAN this many seconds into the load
    /// (`ip link set lan0 down`: no heartbeats, no forwarding; its uplink
    /// stays) for `--partition-for` seconds, then measure how long the
    /// cluster takes to see it and match it again.
    #[arg(long)]
    pub partition_at: Option<f64>,
    /// Seconds the partition lasts.
    #[arg(long, default_value_t = 10.0)]
    pub partition_for: f64,
    /// How the nodes' adverts travel (`peering.adverts`): a heartbeat to
    /// every peer every period, or gossip (docs/peering.md).
    #[arg(long, default_value = "all-to-all", value_parser = ["all-to-all", "gossip"])]
    pub adverts: String,
    /// Gossip: peers a node exchanges its table with each gossip period.
    #[arg(long, default_value_t = 2)]
    pub gossip_fanout: usize,
    /// Gossip: the gossip period, milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub gossip_every_ms: u64,
    /// TCP congestion control in the nodes' namespaces
    /// (`net.ipv4.tcp_congestion_control`): cubic, Linux's default and the
    /// JANUS Pis' (Raspbian), whatever this machine's own default is.
    #[arg(long, default_value = "cubic")]
    pub tcp_congestion: String,
    /// Each node's `scheduler.burst` (token bucket depth per class), e.g.
    /// `32KiB` [default: weir's, 64 KiB].
    #[arg(long)]
    pub burst: Option<String>,
    /// Each node's `egress.amqp.urgent_lane` (`true` or `false`): `ls`
    /// batches may go beyond a full window of unconfirmed batches, the
    /// others are paced over the round trip (docs/scheduling.md) [default:
    /// weir's, on; the key is written only when given, so older `--weir`
    /// binaries still run].
    #[arg(long)]
    pub urgent_lane: Option<bool>,
    /// Keep each run's configs and logs (in the system's temp directory).
    #[arg(long)]
    pub keep: bool,
    /// Each node runs weir's default config, changing only its addresses,
    /// the egress endpoint, the routes of the load's topics to the default
    /// classes and the shutdown's drain timeout (5 s): no uplink prior, no
    /// scheme, compression as shipped, no peering. With `--nodes 1 --busy
    /// 1`: the link sweep (docs/lab/link-sweep.md).
    #[arg(long)]
    pub defaults: bool,
    /// A hand-tuned batch cap: `scheduler.max_batch_bytes` and
    /// `scheduler.burst` set to this (e.g. `256KiB`); labelled tuned.
    #[arg(long)]
    pub max_batch_bytes: Option<String>,
    /// A hand-tuned window: `egress.amqp.max_in_flight`; labelled tuned.
    #[arg(long)]
    pub max_in_flight: Option<u32>,
}

/// The binaries the lab runs.
pub(super) struct Bins {
    pub(super) weir: PathBuf,
    pub(super) weir_load: PathBuf,
}

pub(super) fn bins(a: &Args) -> anyhow::Result<Bins> {
    let next_to_me = |name: &str| -> anyhow::Result<PathBuf> {
        Ok(std::env::current_exe()
            .context("cannot find this executable's path")?
            .with_file_name(name))
    };
    let b = Bins {
        weir: a.weir.clone().map_or_else(|| next_to_me("weir"), Ok)?,
        weir_load: a
            .weir_load
            .clone()
            .map_or_else(|| next_to_me("weir-load"), Ok)?,
    };
    for (p, flag) in [(&b.weir, "--weir"), (&b.weir_load, "--weir-load")] {
        ensure!(
            p.is_file(),
            "no binary at {} (build with `cargo build --release -p weir -p weir-load -p weir-lab`, or pass {flag})",
            p.display()
        );
    }
    Ok(b)
}
