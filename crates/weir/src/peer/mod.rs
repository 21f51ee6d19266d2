//! Peering: the `weir.v1.Peer` service and the tasks that run JANUS
//! redirection (Section V-B) among weir nodes without a coordinator. What
//! to ask for, grant, admit and send is decided by `weir_core::peer`; this
//! module carries those decisions over gRPC. docs/peering.md describes the
//! protocol, why it is safe without a coordinator, and what happens when
//! nodes fail.
//!
//! Wiring (what [`crate::app::App`] does): [`Peering::bind`] the listener
//! before the egress and the scheduler start; give the egress
//! [`Peering::deliveries`] (it reports every confirmed batch there, and
//! records forwarded to this node are acknowledged to their senders only
//! then); give the scheduler
//! [`Peering::scheduler_port`] (it publishes its PBTT tuple there and
//! applies provider grants) and [`Peering::scheduler_stop`] as its stop
//! token (so it keeps draining until every record lent to a peer is
//! settled); then [`Peering::start`] the tasks.
//!
//! # Layout
//! - this file: [`Peering`], [`PeeringHandle`], [`Deliveries`], the shared
//!   node state, record conversions and [`PeerError`].
//! - `service.rs`: the tonic server: heartbeats answered, reservations
//!   granted, forwarded records admitted, and acknowledged once delivered.
//! - `client.rs`: the heartbeat task per peer, the redirection round, and
//!   the forwarder per peer that sends granted traffic.
//! - `metrics.rs`: [`PeerMetrics`].

mod client;
mod metrics;
mod service;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::Status;
use tracing::{info, warn};
use weir_core::janus::scheme::Scheme;
use weir_core::janus::{BandwidthTuple, Grant};
use weir_core::peer::{
    key_of, Advert, BandwidthState, Custody, Leases, Observed, Pacing, PeerView, RecordKey,
    ReservationConfig, Reservations,
};
use weir_core::{ClassId, NodeId, Record};
use weir_proto::pb;

use crate::config::PeeringConfig;
use crate::egress::DeliveryObserver;
use crate::ingress::{unix_micros, IngressHandle};
use crate::scheduler::PeerPort;

pub use metrics::{PeerMetrics, RefusalLabel};

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
/// provider, with room), and 0.75 s at the 11.25 MB/s an idle node with a
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

/// Added to the largest class queue capacity to get the gRPC message size
/// limit of the peer service: any record a queue can hold, plus a batch's
/// worth of others and framing, fits one message.
const MESSAGE_SLACK: usize = 2 * FORWARD_BATCH_BYTES;

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
}

/// Peering, bound and not yet started.
#[derive(Debug)]
pub struct Peering {
    cfg: PeeringConfig,
    listener: TcpListener,
    addr: SocketAddr,
    state: watch::Receiver<BandwidthState>,
    port: Option<PeerPort>,
    shifts: mpsc::Sender<Grant>,
    scheduler_stop: CancellationToken,
    deliveries: Arc<Deliveries>,
}

/// Grants waiting for the scheduler to move them into its allocation; a
/// full channel drops the shift (the next PBTT window catches up), never
/// the reservation.
const SHIFT_CHANNEL: usize = 256;

impl Peering {
    /// Binds `cfg.listen`, so that a busy port is reported at startup and
    /// port 0 can be read back with [`Self::local_addr`].
    pub async fn bind(cfg: PeeringConfig) -> Result<Peering, PeerError> {
        let listener = TcpListener::bind(cfg.listen)
            .await
            .map_err(|source| PeerError::Bind {
                addr: cfg.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| PeerError::Bind {
            addr: cfg.listen,
            source,
        })?;
        let (state_tx, state) = watch::channel(BandwidthState::default());
        let (shifts, shifts_rx) = mpsc::channel(SHIFT_CHANNEL);
        Ok(Peering {
            cfg,
            listener,
            addr,
            state,
            port: Some(PeerPort {
                state: state_tx,
                shifts: shifts_rx,
            }),
            shifts,
            scheduler_stop: CancellationToken::new(),
            deliveries: Arc::new(Deliveries::new()),
        })
    }

    /// Where the egress reports the records of every confirmed batch
    /// ([`crate::egress::EgressContext::observer`]): records peers forwarded
    /// here are acknowledged to them only once reported.
    pub fn deliveries(&self) -> Arc<Deliveries> {
        Arc::clone(&self.deliveries)
    }

    /// Where the peer service listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The scheduler's side (its PBTT state out, provider grants in); `None`
    /// after the first call.
    pub fn scheduler_port(&mut self) -> Option<PeerPort> {
        self.port.take()
    }

    /// The token to give the scheduler as its `stop`: cancelled once weir is
    /// stopping *and* every peer task has ended, so records a peer did not
    /// acknowledge are back in the queues before the scheduler's last drain.
    pub fn scheduler_stop(&self) -> CancellationToken {
        self.scheduler_stop.clone()
    }

    /// Starts the server, a heartbeat task and a forwarder per peer, and the
    /// redirection round, all on `tracker` (so shutdown waits for them).
    /// `stop` stops accepting and sending; `abort` ends everything at once.
    pub fn start(
        self,
        scheme: Scheme,
        ingress: Arc<IngressHandle>,
        stop: CancellationToken,
        abort: CancellationToken,
        tracker: &TaskTracker,
    ) -> Result<PeeringHandle, PeerError> {
        let classes = ingress.classes().clone();
        let largest_queue = ingress
            .queues()
            .iter()
            .map(|(_, q)| q.capacity().bytes)
            .max()
            .unwrap_or(0);
        let max_message = largest_queue.saturating_add(MESSAGE_SLACK);
        let me = ingress.node();
        let node = Arc::new(Node {
            me,
            class_names: classes.iter().map(|(_, c)| c.name.clone()).collect(),
            scheme,
            local: self.state,
            shifts: self.shifts,
            view: Mutex::new(PeerView::new(self.cfg.dead_after)),
            reservations: Mutex::new(Reservations::new(
                me,
                ReservationConfig {
                    lease: self.cfg.lease,
                    pacing: Pacing {
                        burst: PROVIDER_BURST,
                        min_burst: PROVIDER_MIN_BURST_BYTES,
                    },
                },
            )),
            leases: Mutex::new(Leases::new(Pacing {
                burst: RECEIVER_BURST,
                min_burst: RECEIVER_MIN_BURST_BYTES,
            })),
            leases_changed: watch::Sender::new(()),
            round: AtomicU64::new(unix_micros()),
            requesting_since_us: AtomicU64::new(0),
            published: Mutex::new((0, Advert::default())),
            scheme_warned: Mutex::new(HashSet::new()),
            epoch: Instant::now(),
            deliveries: self.deliveries,
            next_stream: AtomicU64::new(1),
            cfg: self.cfg,
            ingress,
            stop,
            kill: CancellationToken::new(),
            abort,
        });
        let links = node
            .cfg
            .peers
            .iter()
            .map(|p| client::Link::new(p, &node.cfg, max_message))
            .collect::<Result<Vec<_>, _>>()?;

        let tasks = TaskTracker::new();
        tasks.spawn(service::serve(
            self.listener,
            Arc::clone(&node),
            max_message,
        ));
        for link in &links {
            tasks.spawn(client::heartbeats(Arc::clone(&node), link.clone()));
            tasks.spawn(client::forwarder(Arc::clone(&node), link.clone()));
        }
        tasks.spawn(client::rounds(Arc::clone(&node), links));
        tasks.close();
        // The scheduler stops only after every peer task has handed its
        // records back (see `scheduler_stop`).
        let (stop, scheduler_stop) = (node.stop.clone(), self.scheduler_stop);
        tracker.spawn(async move {
            stop.cancelled().await;
            tasks.wait().await;
            scheduler_stop.cancel();
        });
        info!(
            node = me,
            listen = %self.addr,
            peers = node.cfg.peers.len(),
            scheme = %scheme,
            "peering started"
        );
        Ok(PeeringHandle {
            node,
            addr: self.addr,
        })
    }
}

/// A running peering: its address, a kill switch for failure experiments,
/// and a look at its state.
#[derive(Debug, Clone)]
pub struct PeeringHandle {
    node: Arc<Node>,
    addr: SocketAddr,
}

/// What a node's peering holds at one moment (for tests, the lab and logs).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PeeringStatus {
    /// Peers heard from within `dead_after`.
    pub alive: Vec<NodeId>,
    /// As a provider: (receiver, class, bytes/s) reserved.
    pub reservations: Vec<(NodeId, ClassId, f64)>,
    /// As a receiver: (provider, class, bytes/s) granted.
    pub leases: Vec<(NodeId, ClassId, f64)>,
}

impl PeeringHandle {
    /// Where the peer service listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Makes this node's peering die on the spot, silently, as peers see a
    /// node cut off by a partition (no connection reset, no answers): every
    /// call hangs until weir stops, records forwarded here are never
    /// acknowledged (their senders take them back once the node is gone
    /// from their view), and this node stops heartbeating and forwarding
    /// (taking its own lent records back). The rest of the node (ingress,
    /// scheduler, egress) runs on and delivers what it holds, so the cloud
    /// sees those forwarded records twice. A crashed process is the other
    /// case: it delivers nothing more, and its senders' copies are the only
    /// ones.
    pub fn kill(&self) {
        warn!(node = self.node.me, "peering killed");
        self.node.kill.cancel();
    }

    /// The current peers, reservations and leases.
    pub fn status(&self) -> PeeringStatus {
        let now = self.node.now();
        PeeringStatus {
            alive: self.node.view().alive(now).map(|(id, _)| id).collect(),
            reservations: self
                .node
                .reservations()
                .iter()
                .filter(|&(_, _, _, expires)| now < expires)
                .map(|(n, c, r, _)| (n, c, r))
                .collect(),
            leases: self.node.leases().iter(now).collect(),
        }
    }
}

/// Everything the peer tasks share.
#[derive(Debug)]
pub(crate) struct Node {
    me: NodeId,
    cfg: PeeringConfig,
    class_names: Vec<String>,
    scheme: Scheme,
    ingress: Arc<IngressHandle>,
    /// The scheduler's latest PBTT state.
    local: watch::Receiver<BandwidthState>,
    /// Grants made as a provider, for the scheduler to apply.
    shifts: mpsc::Sender<Grant>,
    view: Mutex<PeerView>,
    reservations: Mutex<Reservations>,
    leases: Mutex<Leases>,
    /// Bumped whenever leases change, to wake forwarders.
    leases_changed: watch::Sender<()>,
    /// Number of the last state message sent (seeded from the clock).
    round: AtomicU64,
    requesting_since_us: AtomicU64,
    /// The advert of the current heartbeat period (its number, and the
    /// advert): what every heartbeat and reply of the period carries, and
    /// what this node's own round matches with, so that all nodes match on
    /// the same tuples.
    published: Mutex<(u64, Advert)>,
    /// Peers already warned about for running another scheme.
    scheme_warned: Mutex<HashSet<NodeId>>,
    epoch: Instant,
    /// Forwarded records held for their senders until delivered.
    deliveries: Arc<Deliveries>,
    /// Number of the next Forward stream served.
    next_stream: AtomicU64,
    stop: CancellationToken,
    kill: CancellationToken,
    abort: CancellationToken,
}

/// Records peers forwarded to this node, held for them until this node has
/// delivered them ([`Custody`]), and the signal that wakes the Forward
/// stream tasks to acknowledge deliveries. The egress reports each
/// confirmed batch here ([`DeliveryObserver`]); so does this node's own
/// forwarder when a further provider acknowledges delivery of a record this
/// node passed on.
#[derive(Debug)]
pub struct Deliveries {
    custody: Mutex<Custody>,
    /// Bumped whenever a held record is delivered.
    changed: watch::Sender<()>,
}

impl Deliveries {
    fn new() -> Self {
        Deliveries {
            custody: Mutex::new(Custody::new()),
            changed: watch::Sender::new(()),
        }
    }

    fn custody(&self) -> MutexGuard<'_, Custody> {
        lock(&self.custody)
    }

    /// These records were delivered; wakes the streams owed them.
    fn delivered_keys(&self, keys: impl IntoIterator<Item = RecordKey>) {
        if self.custody().delivered(keys) > 0 {
            self.changed.send_replace(());
        }
    }

    /// Records held for peers and not yet acknowledged (delivered or not).
    fn owed(&self) -> usize {
        let c = self.custody();
        c.held() + c.due()
    }
}

impl DeliveryObserver for Deliveries {
    fn delivered(&self, records: &[Record]) {
        self.delivered_keys(records.iter().map(key_of));
    }
}

/// Locks a mutex whose data stays consistent even if a holder panicked
/// (every critical section here is a single call into `weir-core`).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Node {
    /// Time on the clock `weir-core` is fed with.
    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    fn metrics(&self) -> &PeerMetrics {
        &self.ingress.metrics().peer
    }

    fn view(&self) -> MutexGuard<'_, PeerView> {
        lock(&self.view)
    }

    fn reservations(&self) -> MutexGuard<'_, Reservations> {
        lock(&self.reservations)
    }

    fn leases(&self) -> MutexGuard<'_, Leases> {
        lock(&self.leases)
    }

    /// True when `id` is in `peering.peers`.
    fn is_peer(&self, id: NodeId) -> bool {
        self.cfg.peers.iter().any(|p| p.id == id)
    }

    /// True while this node takes part: not stopping, not killed.
    fn active(&self) -> bool {
        !self.stop.is_cancelled() && !self.kill.is_cancelled()
    }

    /// How long an RPC to a peer may take: longer and the peer counts as
    /// gone anyway.
    fn rpc_timeout(&self) -> Duration {
        self.cfg.dead_after
    }

    fn class_of(&self, name: &str) -> Option<ClassId> {
        self.class_names
            .iter()
            .position(|n| n == name)
            .map(|i| ClassId(i as u8))
    }

    fn class_name(&self, class: ClassId) -> &str {
        self.class_names
            .get(class.index())
            .map_or("?", String::as_str)
    }

    /// The tuple this node advertises: its PBTT tuple, or all zeros when it
    /// does not redirect (Native, QM-only) or is leaving, so that nobody
    /// matches with it.
    fn own_tuple(&self) -> BandwidthTuple {
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
    fn spare(&self) -> f64 {
        self.own_tuple().spare_total()
    }

    /// This node's advert, stamped with `round`; starts or ends the
    /// "requesting since" clock as its shortage appears or goes.
    fn advert(&self, round: u64) -> Advert {
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
    fn period(&self) -> u64 {
        weir_core::peer::period_of(unix_micros(), self.cfg.heartbeat)
    }

    /// This period's advert: taken once per period, at its first use, so
    /// every heartbeat and reply of the period says the same, and the
    /// node's own round matches with the tuple its peers have. A node
    /// leaving (or killed) advertises nothing at once.
    fn published(&self) -> Advert {
        let period = self.period();
        let mut p = lock(&self.published);
        if p.0 != period || !self.active() {
            let round = self.round.fetch_add(1, Ordering::Relaxed) + 1;
            *p = (period, self.advert(round));
        }
        p.1.clone()
    }

    /// This node's state for a heartbeat or a reply: this period's advert.
    fn state(&self) -> pb::NodeState {
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
    fn hear(&self, state: pb::NodeState, expected: Option<NodeId>) -> Result<Observed, Status> {
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
        let mut tuple = BandwidthTuple(state.tuple);
        tuple.0.resize(self.class_names.len(), 0.0);
        for b in &mut tuple.0 {
            if !b.is_finite() {
                *b = 0.0;
            }
        }
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

    /// Refreshes the gauge of records held for peers.
    fn update_held(&self) {
        self.metrics().held.set(self.deliveries.owed() as i64);
    }

    /// Wakes the forwarders after leases changed.
    fn leases_changed(&self) {
        self.leases_changed.send_replace(());
    }

    /// Puts records a peer did not take back into their class queues.
    async fn requeue(&self, records: Vec<Record>) {
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
pub fn from_pb(record: pb::Record, class: ClassId) -> Record {
    Record {
        key: Bytes::from(record.key),
        class,
        origin: record.origin,
        seq: record.seq,
        ingress_us: record.ingress_us,
        payload: record.payload,
    }
}
