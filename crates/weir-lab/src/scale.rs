//! `weir-lab scale`: peering at 16, 64 and 256 nodes, simulated.
//!
//! Deterministic, in this process, in simulated time, with weir-core's own
//! peering: each node keeps a [`PeerView`] of adverts, runs the shared
//! matcher over it ([`decide`], PMRFS), asks providers with
//! [`first_asks`] and then the spill-over [`Spill`] (as weir's client
//! does), and
//! each provider grants from its own [`Reservations`] (the authority over
//! its spare). What is simulated is
//! only what carries adverts between nodes, two ways:
//!
//! - `all-to-all` (weir today): every node sends its advert to every other
//!   every heartbeat period (`peering.heartbeat`, 100 ms); a peer not heard
//!   for `dead_after` (500 ms) is gone.
//! - `gossip` (`peering.adverts = "gossip"`, weir-core's
//!   [`gossip`](weir_core::peer::gossip) as weir runs it): every
//!   `--gossip-every` a node exchanges its table (every live advert it
//!   holds, each with its age) with `--fanout` peers
//!   ([`gossip::partners`]), push-pull; each side's own advert is heard
//!   first-hand, the rest as relayed (taken only if newer, heard its age
//!   ago), so a dead node's last advert ages out everywhere after
//!   `--gossip-dead-after` however it is passed on. The matching runs every
//!   heartbeat period on whatever the view holds; a stale view costs a
//!   refused or reduced Reserve (providers grant only what they have), not
//!   a double booking.
//!
//! Load: `--busy-share` of the nodes offer `--busy-load` times their
//! capacity (a shortage in `lt`), the rest `--idle-load` (spare to lend,
//! [`lendable`]'s share of what their own traffic leaves). At 10 s the busy
//! and idle nodes swap; at 20 s the provider holding the most reservations
//! dies. Each period: spare used = what live receivers were granted (up to
//! their shortage) over min(total shortage, total lendable).
//!
//! Bytes: a heartbeat is a unary gRPC call each way; its bytes are the
//! encoded `NodeState` (weir-proto, measured here) plus the framing
//! measured between two namespaces (`docs/peering.md`: 5,607 bytes a second
//! each way per peer at 100 ms, i.e. 560.7 bytes per heartbeat, HTTP/2,
//! TCP/IP and acknowledgements included). A gossip exchange is costed as
//! one such call (with the sender's own state) plus a `RelayedState` per
//! entry of its table, encoded as weir encodes them. Renewing a
//! lease is one `Reserve` call per lease per period, counted apart.

use std::time::Duration;

use anyhow::ensure;
use prost::Message as _;
use serde_json::{json, Value};
use weir_core::class::ClassId;
use weir_core::janus::redirect::Strategy;
use weir_core::janus::{BandwidthTuple, Grant};
use weir_core::peer::{
    decide, first_asks, gossip, lendable, offers_in, Advert, BandwidthState, Pacing, PeerView,
    Refusals, ReservationConfig, Reservations, MAX_SPILL_STEPS,
};
use weir_core::record::NodeId;
use weir_proto::pb::{NodeState, RelayedState, ReserveReply, ReserveRequest};

use crate::report::{line_chart_svg, round, LineChart, Series, Table};

/// `weir-lab scale`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Cluster sizes.
    #[arg(long, value_delimiter = ',', default_value = "16,64,256")]
    pub nodes: Vec<usize>,
    /// Share of the nodes that start busy.
    #[arg(long, default_value_t = 0.5)]
    pub busy_share: f64,
    /// A busy node's offered load, in multiples of its capacity.
    #[arg(long, default_value_t = 1.3)]
    pub busy_load: f64,
    /// An idle node's own load, in multiples of its capacity.
    #[arg(long, default_value_t = 0.1)]
    pub idle_load: f64,
    /// Each node's uplink, bytes/s (JANUS Table III's 4G: 18 Mbit/s).
    #[arg(long, default_value_t = 2_250_000.0)]
    pub uplink: f64,
    /// Heartbeat period (weir's `peering.heartbeat`), milliseconds.
    #[arg(long, default_value_t = 100)]
    pub period_ms: u64,
    /// Gossip: exchanges a node starts per `--gossip-every-ms`.
    #[arg(long, default_value_t = 2)]
    pub fanout: usize,
    /// Gossip: how often a node starts its exchanges, milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub gossip_every_ms: u64,
    /// Gossip: an advert this old (its age as relayed) means the node is
    /// gone, milliseconds (weir's default: six gossip periods).
    #[arg(long, default_value_t = 6000)]
    pub gossip_dead_after_ms: u64,
    /// Simulated seconds (the swap at 10 s and the failure at 20 s need 30).
    #[arg(long, default_value_t = 30)]
    pub seconds: u64,
    /// Seed of the gossip partners' choice.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// Framing of one heartbeat each way beyond its `NodeState`: the measured
/// 5,607 bytes a second per peer at 10 heartbeats a second, less the
/// encoded state (docs/peering.md).
const MEASURED_HEARTBEAT_BYTES: f64 = 560.7;

/// Share of spare used that counts as matched.
const MATCHED: f64 = 0.95;

const LT: ClassId = ClassId(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    AllToAll,
    Gossip,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::AllToAll => "all-to-all",
            Mode::Gossip => "gossip",
        }
    }
}

struct Node {
    view: PeerView,
    reservations: Reservations,
    /// Leases held as a receiver: (provider, rate).
    leases: Vec<(NodeId, f64)>,
    /// Providers that gave it nothing lately, skipped until then.
    refusals: Refusals,
    busy: bool,
    alive: bool,
    /// This node's latest advert.
    advert: Advert,
}

/// Encoded bytes of a heartbeat's state, of one gossiped entry and of a
/// Reserve call's messages.
fn message_sizes() -> (f64, f64, f64) {
    // Rounds are seeded from the Unix clock in microseconds.
    let state = NodeState {
        node: 200,
        classes: vec!["ls".into(), "nm".into(), "lt".into()],
        tuple: vec![1.9e6, 0.0, -6.5e5],
        round: 1_790_000_000_000_000,
        sent_us: 1_790_000_000_000_000,
        requesting_since_us: 1_790_000_000_000_000,
        scheme: "pmrfs".into(),
    };
    // As weir's `Node::relayed_table` writes it: no scheme or send time.
    let relayed = RelayedState {
        state: Some(NodeState {
            sent_us: 0,
            scheme: String::new(),
            ..state.clone()
        }),
        age_us: 2_500_000,
    };
    let reserve = ReserveRequest {
        receiver: 200,
        class: "lt".into(),
        bytes_per_sec: 6.5e5,
        lease_ms: 1000,
    }
    .encoded_len()
        + ReserveReply {
            granted_bytes_per_sec: 6.5e5,
            lease_ms: 1000,
        }
        .encoded_len();
    // A repeated field adds a tag and a length per entry.
    (
        state.encoded_len() as f64 + 2.0,
        relayed.encoded_len() as f64 + 2.0,
        reserve as f64 / 2.0,
    )
}

/// One cluster size under one dissemination.
struct Outcome {
    row: Value,
    used: Vec<(f64, f64)>,
}

fn state_of(a: &Args, busy: bool) -> BandwidthState {
    let own = if busy { a.busy_load } else { a.idle_load } * a.uplink;
    let shortage = (own - a.uplink).max(0.0);
    let spare = (a.uplink - own).max(0.0);
    BandwidthState {
        tuple: BandwidthTuple(vec![spare, 0.0, -shortage]),
        capacity: a.uplink,
        own_rate: own,
        ..BandwidthState::default()
    }
}

/// Simulates `n` nodes under `mode` for `--seconds`: the row and the
/// share of spare used each period.
fn simulate(a: &Args, n: usize, mode: Mode) -> Outcome {
    let mut sim = Sim::new(a, n, mode);
    let mut used = Vec::new();
    let mut view_converged: Option<Duration> = None;
    let mut matched: [Option<Duration>; 3] = [None; 3];
    let events = [
        Duration::ZERO,
        Duration::from_secs(10),
        Duration::from_secs(20),
    ];
    let end = Duration::from_secs(a.seconds);
    let mut killed: Option<usize> = None;
    let mut t = Duration::ZERO;
    let mut k = 0u64;
    while t < end {
        if t == events[1] {
            sim.swap_roles();
        }
        if t == events[2] {
            if let Some(v) = sim.kill_provider() {
                killed = Some(v);
            }
        }
        let states = sim.advertise(k);
        sim.disseminate(t);
        if view_converged.is_none() && views_complete(&sim.nodes, t) {
            view_converged = Some(t);
        }
        let used_now = sim.match_round(&states, t);
        let share = sim.share_used(&states, used_now);
        used.push((t.as_secs_f64(), share * 100.0));
        for (e, at) in events.iter().enumerate() {
            if t >= *at && matched[e].is_none() && share >= MATCHED {
                let next = events.get(e + 1).copied().unwrap_or(end);
                if t < next {
                    matched[e] = Some(t - *at);
                }
            }
        }
        t += sim.period;
        k += 1;
    }
    let secs = end.as_secs_f64();
    let per_node = sim.sent_bytes / n as f64 / secs;
    let reserve_per_node = sim.reserve_sent / n as f64 / secs;
    let steady: Vec<f64> = used
        .iter()
        .filter(|(s, _)| (5.0..10.0).contains(s))
        .map(|p| p.1)
        .collect();
    let ms = |d: Option<Duration>| d.map(|d| d.as_millis() as f64);
    let row = json!({
        "nodes": n,
        "dissemination": mode.name(),
        "busy": sim.busy_count,
        "period_ms": a.period_ms,
        "fanout": (mode == Mode::Gossip).then_some(a.fanout),
        "gossip_every_ms": (mode == Mode::Gossip).then_some(a.gossip_every_ms),
        "dead_after_ms": sim.dead_after.as_millis() as u64,
        "advert_bytes_per_node_per_s": round(per_node, 0),
        "advert_share_of_4g_pct": round(100.0 * per_node / 2_250_000.0, 2),
        "reserve_bytes_per_node_per_s": round(reserve_per_node, 0),
        "views_complete_ms": ms(view_converged),
        "matched_after_start_ms": ms(matched[0]),
        "matched_after_swap_ms": ms(matched[1]),
        "matched_after_failure_ms": ms(matched[2]),
        "killed_node": killed.map(|v| v + 1),
        "spare_used_steady_pct": round(steady.iter().sum::<f64>() / steady.len().max(1) as f64, 1),
        "asked_granted_pct": round(100.0 * sim.granted_total / sim.asked_total.max(1e-9), 1),
    });
    Outcome { row, used }
}

/// One cluster being simulated: its nodes, what its messages cost and
/// what they added up to.
struct Sim<'a> {
    a: &'a Args,
    n: usize,
    mode: Mode,
    /// The heartbeat period: one step of the simulation.
    period: Duration,
    dead_after: Duration,
    config: ReservationConfig,
    busy_count: usize,
    nodes: Vec<Node>,
    ids: Vec<NodeId>,
    gossip_every: Duration,
    /// Encoded bytes of one gossiped entry and of a Reserve call's
    /// messages, and a heartbeat's framing beyond its state.
    relayed_bytes: f64,
    reserve_bytes: f64,
    framing: f64,
    /// Advert bytes sent (heartbeats or gossip), Reserve bytes sent.
    sent_bytes: f64,
    reserve_sent: f64,
    /// Rates asked for and granted, summed.
    asked_total: f64,
    granted_total: f64,
}

impl<'a> Sim<'a> {
    /// `n` nodes, the first `busy_share` of them busy, none reserving yet.
    fn new(a: &'a Args, n: usize, mode: Mode) -> Sim<'a> {
        let period = Duration::from_millis(a.period_ms);
        let dead_after = match mode {
            Mode::AllToAll => Duration::from_millis(500),
            Mode::Gossip => Duration::from_millis(a.gossip_dead_after_ms),
        };
        let config = ReservationConfig {
            lease: Duration::from_secs(1),
            pacing: Pacing {
                burst: Duration::from_millis(100),
                min_burst: 4096.0,
            },
        };
        let busy_count = ((n as f64) * a.busy_share).round() as usize;
        let nodes: Vec<Node> = (0..n)
            .map(|i| Node {
                view: PeerView::new(dead_after),
                reservations: Reservations::new(i as NodeId + 1, config),
                leases: Vec::new(),
                refusals: Refusals::default(),
                busy: i < busy_count,
                alive: true,
                advert: Advert::default(),
            })
            .collect();
        let (state_bytes, relayed_bytes, reserve_bytes) = message_sizes();
        Sim {
            a,
            n,
            mode,
            period,
            dead_after,
            config,
            busy_count,
            nodes,
            ids: (1..=n as NodeId).collect(),
            gossip_every: Duration::from_millis(a.gossip_every_ms.max(1)),
            relayed_bytes,
            reserve_bytes,
            framing: MEASURED_HEARTBEAT_BYTES - state_bytes,
            sent_bytes: 0.0,
            reserve_sent: 0.0,
            asked_total: 0.0,
            granted_total: 0.0,
        }
    }

    /// Busy nodes become idle and idle ones busy.
    fn swap_roles(&mut self) {
        for node in self.nodes.iter_mut() {
            node.busy = !node.busy;
        }
    }

    /// The provider holding the most reservations dies; which, if any.
    fn kill_provider(&mut self) -> Option<usize> {
        let nodes = &mut self.nodes;
        let victim = (0..self.n)
            .filter(|&i| nodes[i].alive && !nodes[i].busy)
            .max_by_key(|&i| (nodes[i].reservations.len(), usize::MAX - i));
        if let Some(v) = victim {
            nodes[v].alive = false;
        }
        victim
    }

    /// Each live node's advert for period `k`; every node's state.
    fn advertise(&mut self, k: u64) -> Vec<BandwidthState> {
        let states: Vec<BandwidthState> = self
            .nodes
            .iter()
            .map(|x| state_of(self.a, x.busy))
            .collect();
        for (i, node) in self.nodes.iter_mut().enumerate() {
            if !node.alive {
                continue;
            }
            let mut tuple = states[i].tuple.clone();
            let lend = lendable(&states[i], 0.0);
            if tuple.0[0] > 0.0 {
                tuple.0[0] = lend;
            }
            node.advert = Advert {
                round: k + 1,
                tuple,
                requesting_since_us: if node.busy { 1 } else { 0 },
            };
        }
        states
    }

    /// Dissemination at `t`: a heartbeat to every peer, or a gossip round
    /// when one is due.
    fn disseminate(&mut self, t: Duration) {
        match self.mode {
            Mode::AllToAll => self.heartbeats(t),
            Mode::Gossip => {
                if t.as_millis().is_multiple_of(self.gossip_every.as_millis()) {
                    self.gossip(t);
                }
            }
        }
    }

    /// Every live node's advert to every other live node.
    fn heartbeats(&mut self, t: Duration) {
        let n = self.n;
        let nodes = &mut self.nodes;
        for i in 0..n {
            if !nodes[i].alive {
                continue;
            }
            let advert = nodes[i].advert.clone();
            for (j, other) in nodes.iter_mut().enumerate() {
                if j != i && other.alive {
                    other.view.observe(i as NodeId + 1, advert.clone(), t);
                }
            }
            self.sent_bytes += (n - 1) as f64 * MEASURED_HEARTBEAT_BYTES;
        }
    }

    /// A gossip round: every live node exchanges tables with its partners.
    fn gossip(&mut self, t: Duration) {
        let (a, relayed_bytes) = (self.a, self.relayed_bytes);
        let nodes = &mut self.nodes;
        for i in 0..self.n {
            if !nodes[i].alive {
                continue;
            }
            let period = (t.as_millis() / self.gossip_every.as_millis()) as u64;
            let me = i as NodeId + 1;
            for j in gossip::partners(me, period ^ (a.seed << 48), &self.ids, a.fanout) {
                let j = j as usize - 1;
                // Push: i's table to j; pull: j's table back
                // (a dead j does not answer: i's request still
                // went out).
                let table_i = gossip::table(&nodes[i].view, t, j as NodeId + 1);
                self.sent_bytes += MEASURED_HEARTBEAT_BYTES + table_i.len() as f64 * relayed_bytes;
                if !nodes[j].alive {
                    continue;
                }
                let table_j = gossip::table(&nodes[j].view, t, me);
                self.sent_bytes += MEASURED_HEARTBEAT_BYTES + table_j.len() as f64 * relayed_bytes;
                // Each side's own advert first-hand, the
                // tables as relayed (weir's service and client
                // do the same).
                let (own_i, own_j) = (nodes[i].advert.clone(), nodes[j].advert.clone());
                nodes[j].view.observe(me, own_i, t);
                nodes[i].view.observe(j as NodeId + 1, own_j, t);
                merge(&mut nodes[j], j, i, table_i, t);
                merge(&mut nodes[i], i, j, table_j, t);
            }
        }
    }

    /// The round: every live receiver matches on its view and asks; the
    /// rate used of what the receivers lack.
    fn match_round(&mut self, states: &[BandwidthState], t: Duration) -> f64 {
        let mut used_now = 0.0;
        for i in 0..self.n {
            if !self.nodes[i].alive || !self.nodes[i].busy {
                continue;
            }
            self.receiver_round(i, states, t);
            let shortage = -states[i].tuple.0[2].min(0.0);
            used_now += self.nodes[i]
                .leases
                .iter()
                .map(|l| l.1)
                .sum::<f64>()
                .min(shortage);
        }
        used_now
    }

    /// Receiver `i`'s round: it asks the providers its match picks, then
    /// spills over, and keeps the leases granted.
    fn receiver_round(&mut self, i: usize, states: &[BandwidthState], t: Duration) {
        let me = i as NodeId + 1;
        let own = self.nodes[i].advert.clone();
        let grants = decide(Strategy::Pmrfs, me, &own, &self.nodes[i].view, t);
        let held: Vec<(NodeId, ClassId, f64)> = self.nodes[i]
            .leases
            .iter()
            .map(|&(p, r)| (p, LT, r))
            .collect();
        let first = first_asks(&grants, &held);
        let mut answered: Vec<(Grant, f64)> = Vec::new();
        for ask in &first {
            let got = self.ask(states, ask, t);
            answered.push((*ask, got));
        }
        let offers = offers_in(&self.nodes[i].view, me, t);
        // The spill-over weir's client runs (weir_core::peer::Spill):
        // steps past every provider that refused this round, and
        // providers that gave nothing lately asked last.
        let mut spill = self.nodes[i].refusals.spill(&answered, t);
        for _ in 0..MAX_SPILL_STEPS {
            let asks = spill.asks(&offers);
            if asks.is_empty() {
                break;
            }
            let mut step = Vec::new();
            for ask in asks {
                let got = self.ask(states, &ask, t);
                step.push((ask, got));
                match answered
                    .iter_mut()
                    .find(|(a, _)| a.provider == ask.provider)
                {
                    Some(entry) => *entry = (ask, got),
                    None => answered.push((ask, got)),
                }
            }
            spill.answered(&step);
        }
        self.nodes[i].refusals.remember(&spill, t, self.period);
        self.nodes[i].leases = answered
            .iter()
            .filter(|(_, got)| *got > 0.0)
            .map(|(a, got)| (a.provider, *got))
            .collect();
    }

    /// One Reserve call: the provider's answer to `ask`, counted.
    fn ask(&mut self, states: &[BandwidthState], ask: &Grant, t: Duration) -> f64 {
        let got = reserve(&mut self.nodes, states, ask, t, self.config.lease);
        self.reserve_sent += 2.0 * (self.framing + self.reserve_bytes);
        self.asked_total += ask.amount;
        self.granted_total += got;
        got
    }

    /// `used_now` as a share of what could be used: the live receivers'
    /// shortage or the live providers' spare, the smaller (1 if none).
    fn share_used(&self, states: &[BandwidthState], used_now: f64) -> f64 {
        let nodes = &self.nodes;
        let shortage: f64 = (0..self.n)
            .filter(|&i| nodes[i].alive && nodes[i].busy)
            .map(|i| -states[i].tuple.0[2].min(0.0))
            .sum();
        let spare: f64 = (0..self.n)
            .filter(|&i| nodes[i].alive && !nodes[i].busy)
            .map(|i| lendable(&states[i], 0.0))
            .sum();
        let possible = shortage.min(spare);
        if possible > 0.0 {
            used_now / possible
        } else {
            1.0
        }
    }
}

/// Node `i` takes in the table partner `from` sent, as weir's
/// `Node::hear_relayed` does ([`gossip::take`]).
fn merge(node: &mut Node, i: usize, from: usize, table: Vec<gossip::Relayed>, t: Duration) {
    let (me, from) = (i as NodeId + 1, from as NodeId + 1);
    for r in table {
        gossip::take(&mut node.view, me, from, r, t);
    }
}

/// Whether every live node sees every other live node.
fn views_complete(nodes: &[Node], t: Duration) -> bool {
    let live = nodes.iter().filter(|x| x.alive).count();
    nodes.iter().filter(|x| x.alive).all(|x| {
        x.view
            .alive(t)
            .filter(|(id, _)| nodes[*id as usize - 1].alive)
            .count()
            + 1
            >= live
    })
}

/// The provider's answer to `ask` (0 if it is dead).
fn reserve(
    nodes: &mut [Node],
    states: &[BandwidthState],
    ask: &Grant,
    t: Duration,
    lease: Duration,
) -> f64 {
    let p = ask.provider as usize - 1;
    if !nodes[p].alive || nodes[p].busy {
        return 0.0;
    }
    let spare = lendable(&states[p], 0.0);
    nodes[p]
        .reservations
        .grant(ask.receiver, ask.class, ask.amount, lease, t, spare)
        .amount
}

/// Runs the simulation; the table, the JSON rows and the plot.
pub async fn run(a: &Args) -> anyhow::Result<(String, Value, String)> {
    ensure!(!a.nodes.is_empty(), "--nodes needs at least one size");
    ensure!(
        a.nodes.iter().all(|&n| n >= 2),
        "--nodes: a cluster has at least 2 nodes"
    );
    ensure!(
        a.busy_share > 0.0 && a.busy_share < 1.0,
        "--busy-share must be between 0 and 1"
    );
    ensure!(
        a.period_ms > 0 && a.fanout > 0,
        "--period-ms and --fanout must be positive"
    );
    ensure!(
        a.gossip_every_ms.is_multiple_of(a.period_ms),
        "--gossip-every-ms must be a multiple of --period-ms"
    );
    let mut rows = Vec::new();
    let mut series = Vec::new();
    let mut table = Table::new([
        "nodes",
        "dissemination",
        "advert B/s/node",
        "% of 4G",
        "reserve B/s/node",
        "views ms",
        "matched ms",
        "after swap ms",
        "after failure ms",
        "spare used %",
        "granted/asked %",
    ]);
    for &n in &a.nodes {
        for mode in [Mode::AllToAll, Mode::Gossip] {
            let o = simulate(a, n, mode);
            let r = &o.row;
            let cell = |k: &str| match &r[k] {
                Value::Null => "-".to_string(),
                v => v.to_string(),
            };
            table.row([
                n.to_string(),
                mode.name().to_string(),
                cell("advert_bytes_per_node_per_s"),
                cell("advert_share_of_4g_pct"),
                cell("reserve_bytes_per_node_per_s"),
                cell("views_complete_ms"),
                cell("matched_after_start_ms"),
                cell("matched_after_swap_ms"),
                cell("matched_after_failure_ms"),
                cell("spare_used_steady_pct"),
                cell("asked_granted_pct"),
            ]);
            series.push(Series {
                name: format!("{n} nodes, {}", mode.name()),
                points: o.used,
            });
            rows.push(o.row);
        }
    }
    let svg = line_chart_svg(&LineChart {
        title: "Spare used per heartbeat period (swap at 10 s, a provider dies at 20 s)".into(),
        x_label: "simulated seconds".into(),
        y_label: "% of min(shortage, spare)".into(),
        series,
        hlines: Vec::new(),
        marks: Vec::new(),
    })?;
    Ok((table.render(), Value::Array(rows), svg))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> Args {
        Args {
            nodes: vec![8],
            busy_share: 0.5,
            busy_load: 1.3,
            idle_load: 0.1,
            uplink: 2_250_000.0,
            period_ms: 100,
            fanout: 2,
            gossip_every_ms: 1000,
            gossip_dead_after_ms: 6000,
            seconds: 30,
            seed: 1,
        }
    }

    #[test]
    fn both_disseminations_match_the_spare_after_start_swap_and_failure() {
        for mode in [Mode::AllToAll, Mode::Gossip] {
            let o = simulate(&args(), 8, mode);
            let r = &o.row;
            for k in [
                "views_complete_ms",
                "matched_after_start_ms",
                "matched_after_swap_ms",
                "matched_after_failure_ms",
            ] {
                assert!(r[k].as_f64().is_some(), "{k} never reached in {r}");
            }
            assert!(r["spare_used_steady_pct"].as_f64().unwrap() >= 95.0, "{r}");
            assert!(r["killed_node"].as_u64().is_some(), "{r}");
        }
    }

    /// With one spill step (weir's client today) a 16-node cluster stayed
    /// at 67.5 % after a provider died; with three steps and no memory of
    /// refusals, a 64-node one at 91.6 %.
    #[test]
    fn sixteen_and_sixty_four_nodes_recover_from_a_provider_failure() {
        for (n, mode) in [
            (16, Mode::AllToAll),
            (16, Mode::Gossip),
            (64, Mode::AllToAll),
            (64, Mode::Gossip),
        ] {
            let r = simulate(&args(), n, mode).row;
            assert!(r["matched_after_failure_ms"].as_f64().is_some(), "{r}");
        }
    }

    #[test]
    fn gossip_sends_fewer_advert_bytes_than_all_to_all_at_64_nodes() {
        let all = simulate(&args(), 64, Mode::AllToAll).row;
        let gossip = simulate(&args(), 64, Mode::Gossip).row;
        let bytes = |r: &Value| r["advert_bytes_per_node_per_s"].as_f64().unwrap();
        // All-to-all: 63 peers x 5,607 B/s, as measured (a little less:
        // one node is dead for the last third).
        let expected = 63.0 * 5607.0;
        assert!((bytes(&all) - expected).abs() < 0.02 * expected, "{all}");
        assert!(bytes(&gossip) < bytes(&all) / 5.0, "{gossip} vs {all}");
    }

    #[test]
    fn the_same_seed_gives_the_same_run() {
        let a = simulate(&args(), 16, Mode::Gossip).row;
        let b = simulate(&args(), 16, Mode::Gossip).row;
        assert_eq!(a, b);
    }
}
