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
//! - `client.rs`: the heartbeat task per peer (or one gossip task), the
//!   redirection round, and the forwarder per peer that sends granted
//!   traffic.

mod client;
mod node;
mod service;

pub(crate) use node::sanitized_tuple;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};
use weir_core::janus::scheme::Scheme;
use weir_core::janus::Grant;
use weir_core::peer::{
    Advert, BandwidthState, Leases, Pacing, PeerView, ReservationConfig, Reservations,
};
use weir_core::{ClassId, NodeId};

use crate::config::PeeringConfig;
use crate::handoff::PeerPort;
use crate::{clock::unix_micros, intake::Intake};

use node::Node;
pub use node::{
    from_pb, to_pb, Deliveries, PeerError, CUSTODY_GRACE, FORWARD_BATCH_BYTES,
    FORWARD_BATCH_RECORDS, FORWARD_DRAIN_TIMEOUT, FORWARD_PIPELINE, FORWARD_POLL, FORWARD_RETRY,
    MAX_IN_FLIGHT_BYTES, MAX_IN_FLIGHT_RECORDS, PROVIDER_BURST, PROVIDER_MIN_BURST_BYTES,
    RECEIVER_BURST, RECEIVER_MIN_BURST_BYTES, SHUTDOWN_GRACE,
};

/// Added to the largest class queue capacity to get the gRPC message size
/// limit of the peer service: any record a queue can hold, plus a batch's
/// worth of others and framing, fits one message.
const MESSAGE_SLACK: usize = 2 * FORWARD_BATCH_BYTES;

/// Peering, bound and not yet started.
#[derive(Debug)]
pub struct Peering {
    cfg: PeeringConfig,
    security: Option<crate::security::PeerSecurity>,
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
        let security = match &cfg.tls {
            Some(files) => Some(
                crate::security::PeerSecurity::load(files)
                    .map_err(|problems| PeerError::Tls { problems })?,
            ),
            None => None,
        };
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
            security,
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
        ingress: Arc<Intake>,
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
            peers: arc_swap::ArcSwap::from_pointee(self.cfg.peers.clone()),
            cfg: self.cfg,
            security: self.security,
            ingress,
            stop,
            kill: CancellationToken::new(),
            abort,
        });
        let links = node
            .cfg
            .peers
            .iter()
            .map(|p| client::Link::new(p, &node.cfg, max_message, node.security.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;

        let tasks = TaskTracker::new();
        tasks.spawn(service::serve(
            self.listener,
            Arc::clone(&node),
            max_message,
        ));
        for link in &links {
            spawn_link(&tasks, &node, link);
        }
        let (links, links_rx) = watch::channel(links);
        if let crate::config::Adverts::Gossip { fanout, every } = node.cfg.adverts {
            tasks.spawn(client::gossip(
                Arc::clone(&node),
                links.subscribe(),
                fanout,
                every,
            ));
        }
        tasks.spawn(client::rounds(Arc::clone(&node), links_rx));
        // Closed, so that shutdown can wait for it to empty; a reload still
        // spawns a new peer's tasks on it.
        tasks.close();
        // The scheduler stops only after every peer task has handed its
        // records back (see `scheduler_stop`).
        let (stop, scheduler_stop) = (node.stop.clone(), self.scheduler_stop);
        let waited = tasks.clone();
        tracker.spawn(async move {
            stop.cancelled().await;
            waited.wait().await;
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
            links: Arc::new(links),
            tasks,
            max_message,
        })
    }
}

/// Starts `link`'s forwarder on `tasks`, and its heartbeat task when
/// adverts go to every peer (with gossip, one task serves every link).
fn spawn_link(tasks: &TaskTracker, node: &Arc<Node>, link: &client::Link) {
    if node.cfg.adverts == crate::config::Adverts::AllToAll {
        tasks.spawn(client::heartbeats(Arc::clone(node), link.clone()));
    }
    tasks.spawn(client::forwarder(Arc::clone(node), link.clone()));
}

/// A running peering: its address, a kill switch for failure experiments,
/// a look at its state, and its peers (changed by a reload).
#[derive(Debug, Clone)]
pub struct PeeringHandle {
    node: Arc<Node>,
    addr: SocketAddr,
    /// A client per peer in force, read by the redirection round.
    links: Arc<watch::Sender<Vec<client::Link>>>,
    /// Where the peer tasks run.
    tasks: TaskTracker,
    max_message: usize,
}

impl PeeringHandle {
    /// `[peering.tls]`'s files, to refresh when they change.
    pub fn watched(&self) -> Vec<Arc<dyn crate::security::Refresh>> {
        self.node
            .security
            .as_ref()
            .map(|s| s.watched())
            .unwrap_or_default()
    }
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

    /// Replaces the peers (a config reload): a new peer gets its heartbeat
    /// and forwarder at once; a dropped one (or one whose address changed)
    /// has its tasks ended, the records lent to it taken back, and its
    /// reservations, leases and advert forgotten, and its calls are refused
    /// from now on. Returns the ids added and dropped; nothing changes if a
    /// new address is unusable.
    pub fn set_peers(
        &self,
        peers: Vec<crate::config::PeerConfig>,
    ) -> Result<(Vec<NodeId>, Vec<NodeId>), PeerError> {
        let node = &self.node;
        let old = node.peers.load_full();
        let added: Vec<client::Link> = peers
            .iter()
            .filter(|p| !old.contains(p))
            .map(|p| client::Link::new(p, &node.cfg, self.max_message, node.security.as_ref()))
            .collect::<Result<_, _>>()?;
        let dropped: Vec<NodeId> = old
            .iter()
            .filter(|o| !peers.contains(o))
            .map(|o| o.id)
            .collect();
        node.peers.store(Arc::new(peers));
        let mut links = self.links.borrow().clone();
        links.retain(|l| {
            let stays = !dropped.contains(&l.id);
            if !stays {
                l.gone.cancel();
            }
            stays
        });
        for id in &dropped {
            if !added.iter().any(|l| l.id == *id) {
                node.view().forget(*id);
            }
            node.leases().end_all(*id);
            node.reservations().release_all(*id);
        }
        node.leases_changed();
        for link in &added {
            spawn_link(&self.tasks, node, link);
        }
        links.extend(added.iter().cloned());
        self.links.send_replace(links);
        let added = added.iter().map(|l| l.id).collect();
        info!(?added, ?dropped, "peering.peers reloaded");
        Ok((added, dropped))
    }

    /// Publishes each configured peer's last advert in the metrics
    /// (called when they are scraped).
    pub fn publish_adverts(&self) {
        let now = self.node.now();
        let view = self.node.view();
        let alive: std::collections::HashMap<NodeId, Vec<f64>> = view
            .alive(now)
            .map(|(id, advert)| (id, advert.tuple.0.clone()))
            .collect();
        drop(view);
        for p in self.node.peers.load().iter() {
            self.node
                .metrics()
                .set_advert(p.id, alive.get(&p.id).map(Vec::as_slice));
        }
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
