//! Prometheus metrics of peering (`weir_peer_*`), registered with the rest
//! of [`super::Metrics`].

use std::sync::atomic::{AtomicI64, AtomicU64};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use weir_core::{ClassId, ClassSet};

use super::labels::ClassLabel;

/// The `class` and `reason` labels of a refusal.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabel {
    /// Class name.
    pub class: String,
    /// Why (`no_reservation`, `over_rate`, `queue_full`, ...).
    pub reason: String,
}

/// The `peer` label: a peer's node id.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PeerLabel {
    /// The peer's `node.id`.
    pub peer: String,
}

/// The `outcome` label of a relayed advert.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// `taken` (newer than the one held), `stale` (not newer, or older
    /// than `dead_after`) or `ignored` (not a configured peer, or other
    /// classes).
    pub outcome: String,
}

/// Peering metrics: what was redirected each way, what was refused or
/// taken back, and the reservations and peers in play.
pub struct PeerMetrics {
    names: Vec<ClassLabel>,
    redirected_out: Family<ClassLabel, Counter>,
    redirected_in: Family<ClassLabel, Counter>,
    refused: Family<RefusalLabel, Counter>,
    requeued: Family<ClassLabel, Counter>,
    /// Reservations this node holds for receivers (as a provider).
    pub reservations: Gauge<i64, AtomicI64>,
    /// Their total rate, bytes/s.
    pub reserved: Gauge<f64, AtomicU64>,
    /// Rates granted to this node by providers (as a receiver).
    pub leases: Gauge<i64, AtomicI64>,
    /// Their total rate, bytes/s.
    pub leased: Gauge<f64, AtomicU64>,
    /// Configured peers heard from within `dead_after`.
    pub peers_alive: Gauge<i64, AtomicI64>,
    /// Records peers forwarded here and not yet acknowledged to them
    /// (undelivered, or delivered with the acknowledgement on its way).
    pub held: Gauge<i64, AtomicI64>,
    /// Records lost because weir aborted while they were with a peer
    /// unacknowledged (only past the shutdown deadline).
    pub abandoned: Counter,
    /// Peer calls refused because the caller's certificate did not prove
    /// the node id it spoke as.
    pub impostors: Counter,
    /// Bytes of this node's heartbeat messages (calls and replies, with
    /// any gossiped table; protobuf-encoded, before HTTP/2 framing).
    pub advert_bytes: Counter,
    relayed: Family<OutcomeLabel, Counter>,
    via: Family<PeerLabel, Counter>,
    lent: Family<PeerLabel, Gauge>,
    spare: Family<PeerLabel, Gauge<f64, AtomicU64>>,
    shortage: Family<PeerLabel, Gauge<f64, AtomicU64>>,
}

impl std::fmt::Debug for PeerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerMetrics").finish_non_exhaustive()
    }
}

impl PeerMetrics {
    /// Metrics for these classes, not yet registered.
    pub fn new(classes: &ClassSet) -> Self {
        PeerMetrics {
            names: classes
                .iter()
                .map(|(_, c)| ClassLabel {
                    class: c.name.clone(),
                })
                .collect(),
            redirected_out: Family::default(),
            redirected_in: Family::default(),
            refused: Family::default(),
            requeued: Family::default(),
            reservations: Gauge::default(),
            reserved: Gauge::default(),
            leases: Gauge::default(),
            leased: Gauge::default(),
            peers_alive: Gauge::default(),
            held: Gauge::default(),
            abandoned: Counter::default(),
            impostors: Counter::default(),
            advert_bytes: Counter::default(),
            relayed: Family::default(),
            via: Family::default(),
            lent: Family::default(),
            spare: Family::default(),
            shortage: Family::default(),
        }
    }

    /// One advert a peer relayed (gossip), and what became of it.
    pub fn relayed(&self, outcome: &str) {
        self.relayed
            .get_or_create(&OutcomeLabel {
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// `n` of this node's records a peer acknowledged as delivered.
    pub fn delivered_via(&self, peer: weir_core::NodeId, n: u64) {
        self.via
            .get_or_create(&PeerLabel {
                peer: peer.to_string(),
            })
            .inc_by(n);
    }

    /// `n` of this node's records are with `peer`, sent and not yet
    /// acknowledged as delivered (taken back if the peer is lost).
    pub fn set_lent(&self, peer: weir_core::NodeId, n: usize) {
        self.lent
            .get_or_create(&PeerLabel {
                peer: peer.to_string(),
            })
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// What a peer last advertised: its spare and shortage over all
    /// classes, bytes/s (`None`: not heard from within `dead_after`, shown
    /// as zero).
    pub fn set_advert(&self, peer: weir_core::NodeId, tuple: Option<&[f64]>) {
        let label = PeerLabel {
            peer: peer.to_string(),
        };
        let finite = |v: &&f64| v.is_finite();
        let (spare, short) = tuple.map_or((0.0, 0.0), |t| {
            (
                t.iter().filter(finite).filter(|v| **v > 0.0).sum(),
                -t.iter().filter(finite).filter(|v| **v < 0.0).sum::<f64>(),
            )
        });
        self.spare.get_or_create(&label).set(spare);
        self.shortage.get_or_create(&label).set(short);
    }

    /// Registers every metric in `registry` (prefix `weir_` comes from it).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "peer_records_redirected_out",
            "Records a provider acknowledged as delivered: this node's overflow the cloud has through a peer",
            self.redirected_out.clone(),
        );
        registry.register(
            "peer_records_redirected_in",
            "Records from peers enqueued here (as a provider)",
            self.redirected_in.clone(),
        );
        registry.register(
            "peer_records_refused",
            "Records from peers refused here, by reason",
            self.refused.clone(),
        );
        registry.register(
            "peer_records_requeued",
            "Records a peer refused or never acknowledged, queued here again",
            self.requeued.clone(),
        );
        registry.register(
            "peer_identity_refused",
            "Peer calls refused before anything moved: the certificate did not prove the node id claimed (mutual TLS)",
            self.impostors.clone(),
        );
        registry.register(
            "peer_reservations_active",
            "Reservations this node holds for receivers",
            self.reservations.clone(),
        );
        registry.register(
            "peer_reserved_bytes_per_second",
            "Total rate reserved for receivers",
            self.reserved.clone(),
        );
        registry.register(
            "peer_leases_active",
            "Rates providers granted this node",
            self.leases.clone(),
        );
        registry.register(
            "peer_leased_bytes_per_second",
            "Total rate providers granted this node",
            self.leased.clone(),
        );
        registry.register(
            "peer_records_held",
            "Records peers forwarded here, not yet acknowledged to them as delivered",
            self.held.clone(),
        );
        registry.register(
            "peers_alive",
            "Configured peers heard from within dead_after",
            self.peers_alive.clone(),
        );
        registry.register(
            "peer_records_lent",
            "This node's records with a peer, sent and not yet acknowledged as delivered (taken back if the peer is lost), by peer",
            self.lent.clone(),
        );
        registry.register(
            "peer_records_delivered_via",
            "This node's records a peer acknowledged as delivered, by peer",
            self.via.clone(),
        );
        registry.register(
            "peer_spare_bytes_per_second",
            "Spare outbound rate a peer last advertised (0 when not heard from within dead_after)",
            self.spare.clone(),
        );
        registry.register(
            "peer_shortage_bytes_per_second",
            "Shortage a peer last advertised (0 when not heard from within dead_after)",
            self.shortage.clone(),
        );
        registry.register(
            "peer_advert_bytes_sent",
            "Bytes of heartbeat calls and replies this node sent, gossiped tables included (protobuf, before HTTP/2 framing)",
            self.advert_bytes.clone(),
        );
        registry.register(
            "peer_adverts_relayed",
            "Adverts of other nodes a peer relayed here (gossip), by outcome: taken, stale, ignored",
            self.relayed.clone(),
        );
        registry.register(
            "peer_records_abandoned",
            "Records with a peer, unacknowledged, when weir aborted",
            self.abandoned.clone(),
        );
    }

    fn label(&self, class: ClassId) -> &ClassLabel {
        &self.names[class.index().min(self.names.len().saturating_sub(1))]
    }

    /// `n` records of `class` a provider acknowledged as delivered.
    pub fn redirected_out(&self, class: ClassId, n: u64) {
        self.redirected_out
            .get_or_create(self.label(class))
            .inc_by(n);
    }

    /// Records providers acknowledged as delivered so far, all classes.
    pub fn redirected_out_total(&self) -> u64 {
        self.names
            .iter()
            .map(|l| self.redirected_out.get_or_create(l).get())
            .sum()
    }

    /// `n` records of `class` from a peer enqueued here.
    pub fn redirected_in(&self, class: ClassId, n: u64) {
        self.redirected_in
            .get_or_create(self.label(class))
            .inc_by(n);
    }

    /// Records from peers enqueued here so far, all classes.
    pub fn redirected_in_total(&self) -> u64 {
        self.names
            .iter()
            .map(|l| self.redirected_in.get_or_create(l).get())
            .sum()
    }

    /// One record from a peer refused here for `reason`.
    pub fn refused(&self, class_name: &str, reason: &str) {
        self.refused
            .get_or_create(&RefusalLabel {
                class: class_name.to_owned(),
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// One record taken back from a peer and queued here again.
    pub fn requeued(&self, class: ClassId) {
        self.requeued.get_or_create(self.label(class)).inc();
    }

    /// Records taken back so far, all classes.
    pub fn requeued_total(&self) -> u64 {
        self.names
            .iter()
            .map(|l| self.requeued.get_or_create(l).get())
            .sum()
    }
}
