//! What the peer tasks share: the node's state ([`Node`]), the tuning
//! constants of forwarding, the delivery reports ([`Deliveries`]), record
//! conversions to and from the wire, and [`PeerError`]. The server
//! (`service.rs`), the clients (`client.rs`) and the wiring (`mod.rs`) all
//! build on this file; it builds on none of them.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tracing::{info, warn};
use weir_core::janus::scheme::Scheme;
use weir_core::janus::{BandwidthTuple, Grant};
use weir_core::peer::gossip::{self, Relayed};
use weir_core::peer::{
    Advert, BandwidthState, Custody, Leases, Observed, PeerView, RecordKey, Reservations,
};
use weir_core::{ClassId, NodeId, Receipt, Record};
use weir_proto::pb;

use crate::config::{Adverts, PeerConfig, PeeringConfig};
use crate::egress::DeliveryObserver;
use crate::{clock::unix_micros, intake::Intake};

use crate::metrics::PeerMetrics;

/// Records per `ForwardRequest`: large enough that per-message costs
/// (framing, one lock of the reservations, one ack) vanish at 50k
/// records/s, small enough that an ack comes back within milliseconds.
pub const FORWARD_BATCH_RECORDS: usize = 512;

/// Bytes per `ForwardRequest` (records' [`Record::size`]), for the same
/// reason; a single larger record still goes alone.
pub const FORWARD_BATCH_BYTES: usize = 256 * 1024;

/// `ForwardRequest`s sent and not yet answered (admitted or refused), per
/// provider: enough to keep a loopback or LAN link busy while answers
/// travel back (16 x 256 KiB per round trip). Answers come at admission,
/// not delivery, so this does not grow with the provider's queueing.
pub const FORWARD_PIPELINE: usize = 16;

/// Records lent to one provider and not yet acknowledged as delivered. A
/// record stays in flight for a round trip plus the provider's queueing,
/// batching and confirm, which PBTT keeps within the class bound (about
/// 1 s for the classes worth redirecting); at the 1-3 MB/s a provider
/// typically grants, 1 s at 3 MB/s of ~96-byte records is about 32k
/// records. When the cap binds the receiver forwards less and keeps the
/// rest queued at home (safe, less effective). It also bounds what a dead
/// provider hands back at once, and what a lost acknowledgement can
/// duplicate.
pub const MAX_IN_FLIGHT_RECORDS: usize = 32 * 1024;

/// Bytes lent to one provider and not yet acknowledged as delivered: 8 MiB
/// covers 2.7 s at 3 MB/s (a class bound of queueing and confirm at the
/// provider, with room), and 0.69 s at the 12.1 MB/s an idle node with a
/// 100 Mbit/s uplink lends at most (see docs/peering.md).
pub const MAX_IN_FLIGHT_BYTES: usize = 8 * 1024 * 1024;

/// How often a forwarder with a live lease looks at an empty class queue:
/// the scheduler owns the queue's arrival signal, and 5 ms is nothing
/// against the bounds of classes worth redirecting.
pub const FORWARD_POLL: Duration = Duration::from_millis(5);

/// At shutdown, how long a forwarder waits for delivery acknowledgements of
/// what it already sent before taking those records back into its queue
/// (where they may then be delivered twice): several class bounds of
/// queueing and confirm at the provider.
pub const FORWARD_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// At a provider's shutdown, how long its Forward streams stay open for the
/// delivery acknowledgements of records it holds for their senders (its
/// scheduler keeps sending meanwhile); what is still undelivered then is
/// taken back by the senders and may arrive twice. Shorter than
/// [`SHUTDOWN_GRACE`], after which the server closes its connections.
pub const CUSTODY_GRACE: Duration = Duration::from_secs(4);

/// After a Forward stream broke, the pause before the next one: a round
/// (the default heartbeat), so a provider that is restarting is not
/// hammered.
pub const FORWARD_RETRY: Duration = Duration::from_millis(100);

/// A provider's bucket depth in time at the reserved rate: half a second of
/// bunching (batches, scheduling, network jitter) is admitted before it
/// refuses.
pub const PROVIDER_BURST: Duration = Duration::from_millis(500);

/// A receiver's pacing depth: a fifth of the provider's, so its sending
/// stays well inside what the provider admits.
pub const RECEIVER_BURST: Duration = Duration::from_millis(100);

/// Least bucket depth on the provider: a large record or a full batch
/// always fits once the bucket is full.
pub const PROVIDER_MIN_BURST_BYTES: f64 = 512.0 * 1024.0;

/// Least pacing depth on the receiver, below the provider's.
pub const RECEIVER_MIN_BURST_BYTES: f64 = 128.0 * 1024.0;

/// After shutdown is requested, how long open peer calls get before the
/// server returns anyway (the same grace as the gRPC ingress).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Why peering could not start.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// The listener could not be bound.
    #[error("cannot listen for peers on {addr} (is another program using it? change `peering.listen`): {source}")]
    Bind {
        /// The address in `peering.listen`.
        addr: SocketAddr,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A peer address that is not a valid URI authority.
    #[error("peering.peers: node {id} at {addr} is not a usable address: {source}")]
    Address {
        /// The peer's node id.
        id: NodeId,
        /// Its address as configured.
        addr: String,
        /// What tonic said.
        #[source]
        source: tonic::transport::Error,
    },
    /// `[peering.tls]`'s files cannot be used.
    #[error("{}", problems.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("; "))]
    Tls {
        /// Every problem, under the key naming the file.
        problems: Vec<crate::config::Problem>,
    },
}

/// Everything the peer tasks share.
#[derive(Debug)]
pub(crate) struct Node {
    pub(super) me: NodeId,
    /// `[peering]` as at start; its `peers` are [`Node::peers`]'s first
    /// value.
    pub(super) cfg: PeeringConfig,
    /// The peers in force (a reload changes them).
    pub(super) peers: ArcSwap<Vec<PeerConfig>>,
    /// Mutual TLS, when `[peering.tls]` is configured.
    pub(super) security: Option<crate::security::PeerSecurity>,
    pub(super) class_names: Vec<String>,
    pub(super) scheme: Scheme,
    pub(super) ingress: Arc<Intake>,
    /// The scheduler's latest PBTT state.
    pub(super) local: watch::Receiver<BandwidthState>,
    /// Grants made as a provider, for the scheduler to apply.
    pub(super) shifts: mpsc::Sender<Grant>,
    pub(super) view: Mutex<PeerView>,
    pub(super) reservations: Mutex<Reservations>,
    pub(super) leases: Mutex<Leases>,
    /// Bumped whenever leases change, to wake forwarders.
    pub(super) leases_changed: watch::Sender<()>,
    /// Number of the last state message sent (seeded from the clock).
    pub(super) round: AtomicU64,
    pub(super) requesting_since_us: AtomicU64,
    /// The advert of the current heartbeat period (its number, and the
    /// advert): what every heartbeat and reply of the period carries, and
    /// what this node's own round matches with, so that all nodes match on
    /// the same tuples.
    pub(super) published: Mutex<(u64, Advert)>,
    /// Peers already warned about for running another scheme.
    pub(super) scheme_warned: Mutex<HashSet<NodeId>>,
    pub(super) epoch: Instant,
    /// Forwarded records held for their senders until delivered.
    pub(super) deliveries: Arc<Deliveries>,
    /// Number of the next Forward stream served.
    pub(super) next_stream: AtomicU64,
    pub(super) stop: CancellationToken,
    pub(super) kill: CancellationToken,
    pub(super) abort: CancellationToken,
}

/// Records peers forwarded to this node, held for them until this node has
/// delivered them ([`Custody`]), and the signal that wakes the Forward
/// stream tasks to acknowledge deliveries. The egress reports each
/// confirmed batch here ([`DeliveryObserver`]); so does this node's own
/// forwarder when a further provider acknowledges delivery of a record this
/// node passed on.
#[derive(Debug)]
pub struct Deliveries {
    pub(super) custody: Mutex<Custody>,
    /// Bumped whenever a held record is delivered.
    pub(super) changed: watch::Sender<()>,
}

impl Deliveries {
    pub(super) fn new() -> Self {
        Deliveries {
            custody: Mutex::new(Custody::new()),
            changed: watch::Sender::new(()),
        }
    }

    pub(super) fn custody(&self) -> MutexGuard<'_, Custody> {
        lock(&self.custody)
    }

    /// These records were delivered; wakes the streams owed them.
    pub(super) fn delivered_keys(&self, keys: impl IntoIterator<Item = RecordKey>) {
        if self.custody().delivered(keys) > 0 {
            self.changed.send_replace(());
        }
    }

    /// Records held for peers and not yet acknowledged (delivered or not).
    pub(super) fn owed(&self) -> usize {
        let c = self.custody();
        c.held() + c.due()
    }
}

impl DeliveryObserver for Deliveries {
    fn delivered(&self, records: &[Receipt]) {
        self.delivered_keys(records.iter().map(|r| (r.origin, r.seq)));
    }
}

/// Locks a mutex whose data stays consistent even if a holder panicked
/// (every critical section here is a single call into `weir-core`).
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Node {
    /// Time on the clock `weir-core` is fed with.
    pub(super) fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    pub(super) fn metrics(&self) -> &PeerMetrics {
        &self.ingress.metrics().peer
    }

    pub(super) fn view(&self) -> MutexGuard<'_, PeerView> {
        lock(&self.view)
    }

    pub(super) fn reservations(&self) -> MutexGuard<'_, Reservations> {
        lock(&self.reservations)
    }

    pub(super) fn leases(&self) -> MutexGuard<'_, Leases> {
        lock(&self.leases)
    }

    /// True when `id` is in `peering.peers`.
    pub(super) fn is_peer(&self, id: NodeId) -> bool {
        self.peers.load().iter().any(|p| p.id == id)
    }

    /// True while this node takes part: not stopping, not killed.
    pub(super) fn active(&self) -> bool {
        !self.stop.is_cancelled() && !self.kill.is_cancelled()
    }

    /// How long an RPC to a peer may take: longer and the peer counts as
    /// gone anyway.
    pub(super) fn rpc_timeout(&self) -> Duration {
        match self.cfg.adverts {
            Adverts::AllToAll => self.cfg.dead_after,
            // Gossip's dead_after is seconds: a call to a dead provider
            // must not hold a round that long. Five heartbeats, as
            // all-to-all's default.
            Adverts::Gossip { .. } => self.cfg.dead_after.min(self.cfg.heartbeat * 5),
        }
    }

    pub(super) fn class_of(&self, name: &str) -> Option<ClassId> {
        self.class_names
            .iter()
            .position(|n| n == name)
            .map(|i| ClassId(i as u8))
    }

    pub(super) fn class_name(&self, class: ClassId) -> &str {
        self.class_names
            .get(class.index())
            .map_or("?", String::as_str)
    }

    /// The tuple this node advertises: its PBTT tuple, or all zeros when it
    /// does not redirect (Native, QM-only) or is leaving, so that nobody
    /// matches with it.
    pub(super) fn own_tuple(&self) -> BandwidthTuple {
        let n = self.class_names.len();
        if self.scheme.redirects().is_none() || !self.active() {
            return BandwidthTuple(vec![0.0; n]);
        }
        let mut state = self.local.borrow().clone();
        let t = &mut state.tuple;
        t.0.resize(n, 0.0);
        for b in &mut t.0 {
            if !b.is_finite() {
                *b = 0.0;
            }
        }
        // What it asks for or can lend, counting what it carries for peers
        // (weir-core `peer::advertised`).
        let (carried, reserved) = {
            let mut r = self.reservations();
            (r.carried(self.now()), r.reserved())
        };
        weir_core::peer::advertised(&state, carried, reserved)
    }

    /// What this node can lend now: its advertised spare, which counts
    /// what it carries for peers as lendable.
    pub(super) fn spare(&self) -> f64 {
        self.own_tuple().spare_total()
    }

    /// This node's advert, stamped with `round`; starts or ends the
    /// "requesting since" clock as its shortage appears or goes.
    pub(super) fn advert(&self, round: u64) -> Advert {
        let tuple = self.own_tuple();
        let since = if tuple.shortage_total() > 0.0 {
            let now = unix_micros().max(1);
            match self.requesting_since_us.compare_exchange(
                0,
                now,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => now,
                Err(since) => since,
            }
        } else {
            self.requesting_since_us.store(0, Ordering::Release);
            0
        };
        Advert {
            round,
            tuple,
            requesting_since_us: since,
        }
    }

    /// The number of the heartbeat period running now: periods are aligned
    /// on the Unix clock, so nodes with synchronised clocks (NTP) share them.
    pub(super) fn period(&self) -> u64 {
        weir_core::peer::period_of(unix_micros(), self.cfg.heartbeat)
    }

    /// This period's advert: taken once per period, at its first use, so
    /// every heartbeat and reply of the period says the same, and the
    /// node's own round matches with the tuple its peers have. A node
    /// leaving (or killed) advertises nothing at once.
    pub(super) fn published(&self) -> Advert {
        let period = self.period();
        let mut p = lock(&self.published);
        if p.0 != period || !self.active() {
            let round = self.round.fetch_add(1, Ordering::Relaxed) + 1;
            *p = (period, self.advert(round));
        }
        p.1.clone()
    }

    /// This node's state for a heartbeat or a reply: this period's advert.
    pub(super) fn state(&self) -> pb::NodeState {
        let advert = self.published();
        let round = advert.round;
        pb::NodeState {
            node: self.me,
            classes: self.class_names.clone(),
            tuple: advert.tuple.0,
            round,
            sent_us: unix_micros(),
            requesting_since_us: advert.requesting_since_us,
            scheme: self.scheme.to_string(),
        }
    }

    /// Takes in a peer's state (from its heartbeat, or its reply to ours
    /// when `expected` names who should have answered).
    pub(super) fn hear(
        &self,
        state: pb::NodeState,
        expected: Option<NodeId>,
    ) -> Result<Observed, Status> {
        if let Some(expected) = expected.filter(|&e| e != state.node) {
            return Err(Status::failed_precondition(format!(
                "the peer listed as node {expected} answered as node {}; fix peering.peers on node {}",
                state.node, self.me
            )));
        }
        if !self.is_peer(state.node) {
            return Err(Status::failed_precondition(format!(
                "node {} is not in peering.peers of node {}; add it there with its address",
                state.node, self.me
            )));
        }
        if state.classes != self.class_names {
            return Err(Status::failed_precondition(format!(
                "node {} has latency classes [{}] but node {} has [{}]; every peering node needs the same [[class]] list in the same order",
                state.node,
                state.classes.join(", "),
                self.me,
                self.class_names.join(", ")
            )));
        }
        if state.scheme != self.scheme.to_string() && lock(&self.scheme_warned).insert(state.node) {
            warn!(
                peer = state.node,
                theirs = %state.scheme,
                ours = %self.scheme,
                "peer runs another scheduler.scheme; matchings will disagree more often (safe, but less effective)"
            );
        }
        let tuple = sanitized_tuple(state.tuple, self.class_names.len());
        let advert = Advert {
            round: state.round,
            tuple,
            requesting_since_us: state.requesting_since_us,
        };
        let now = self.now();
        let observed = self.view().observe(state.node, advert, now);
        if observed == Observed::Joined {
            info!(peer = state.node, "peer up");
        }
        Ok(observed)
    }

    /// The table this node gossips to `partner`: every other live peer's
    /// latest state and its age ([`weir_core::peer::gossip::table`]).
    pub(super) fn relayed_table(&self, partner: NodeId) -> Vec<pb::RelayedState> {
        let now = self.now();
        let table = gossip::table(&self.view(), now, partner);
        table
            .into_iter()
            .map(|r| pb::RelayedState {
                state: Some(pb::NodeState {
                    node: r.node,
                    classes: self.class_names.clone(),
                    tuple: r.advert.tuple.0,
                    round: r.advert.round,
                    sent_us: 0,
                    requesting_since_us: r.advert.requesting_since_us,
                    scheme: String::new(),
                }),
                age_us: r.age.as_micros() as u64,
            })
            .collect()
    }

    /// Takes in the table `from` gossiped: each state of another configured
    /// peer with this node's classes, as heard `age_us` ago
    /// ([`PeerView::observe_relayed`]). Others are counted and skipped:
    /// what a peer relays is advice, checked by the provider it names.
    pub(super) fn hear_relayed(&self, from: NodeId, relayed: Vec<pb::RelayedState>) {
        let now = self.now();
        let m = self.metrics();
        for r in relayed {
            let Some(state) = r.state else {
                m.relayed("ignored");
                continue;
            };
            if !self.is_peer(state.node) || state.classes != self.class_names {
                m.relayed("ignored");
                continue;
            }
            let entry = Relayed {
                node: state.node,
                advert: Advert {
                    round: state.round,
                    tuple: sanitized_tuple(state.tuple, self.class_names.len()),
                    requesting_since_us: state.requesting_since_us,
                },
                age: Duration::from_micros(r.age_us),
            };
            let node = entry.node;
            match gossip::take(&mut self.view(), self.me, from, entry, now) {
                None => m.relayed("ignored"),
                Some(Observed::Stale) => m.relayed("stale"),
                Some(Observed::Joined) => {
                    m.relayed("taken");
                    info!(peer = node, via = from, "peer up (relayed)");
                }
                Some(Observed::Updated) => m.relayed("taken"),
            }
        }
    }

    /// Refreshes the gauge of records held for peers.
    pub(super) fn update_held(&self) {
        self.metrics().held.set(self.deliveries.owed() as i64);
    }

    /// Wakes the forwarders after leases changed.
    pub(super) fn leases_changed(&self) {
        self.leases_changed.send_replace(());
    }

    /// Puts records a peer did not take back into their class queues.
    pub(super) async fn requeue(&self, records: Vec<Record>) {
        for record in records {
            let class = record.class;
            match self.ingress.requeue(record, &self.abort).await {
                Ok(()) => self.metrics().requeued(class),
                Err(lost) => {
                    self.metrics().abandoned.inc();
                    warn!(
                        origin = lost.origin,
                        seq = lost.seq,
                        "aborting: a record a peer did not acknowledge was not delivered"
                    );
                }
            }
        }
    }
}

/// A record as it travels between peers: its identity, class name and
/// ingress time kept.
pub fn to_pb(record: &Record, class_name: &str) -> pb::Record {
    pb::Record {
        key: String::from_utf8_lossy(&record.key).into_owned(),
        class: class_name.to_owned(),
        origin: record.origin,
        seq: record.seq,
        ingress_us: record.ingress_us,
        payload: record.payload.clone(),
    }
}

/// A forwarded record back into weir's type, in `class`.
/// A peer's bandwidth tuple as this node uses it: one entry per class
/// (missing ones 0, extra ones dropped), non-finite entries 0.
pub fn sanitized_tuple(mut tuple: Vec<f64>, classes: usize) -> BandwidthTuple {
    tuple.resize(classes, 0.0);
    for b in &mut tuple {
        if !b.is_finite() {
            *b = 0.0;
        }
    }
    BandwidthTuple(tuple)
}

pub fn from_pb(record: pb::Record, class: ClassId) -> Record {
    Record {
        key: Bytes::from(record.key),
        class,
        origin: record.origin,
        seq: record.seq,
        ingress_us: record.ingress_us,
        payload: record.payload,
        spool: None,
    }
}
