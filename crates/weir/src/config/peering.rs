//! `[peering]`: redirection of overflow to neighbouring nodes without a
//! coordinator (docs/peering.md), with its `[[peering.peers]]`: as written,
//! their defaults, checked, and their validation.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;
use weir_core::record::NodeId;

use super::ingress::{parse_broker, BrokerAddr};
use super::problems::Problems;
use super::tls::{check_exposed, tls, RawTls, TlsFiles};
use super::units::{HumanDuration, Written};

/// Peers exchange tuples once per PBTT window (the default `scheduler.window`),
/// so each round matches on tuples at most one window old.
pub const PEER_HEARTBEAT: Duration = Duration::from_millis(100);

/// Five missed heartbeats: one lost packet or a GC-like stall does not drop
/// a peer, a dead one stops being matched within half a second.
pub const PEER_DEAD_AFTER: Duration = Duration::from_millis(500);

/// Ten rounds: a receiver renews every round, so a reservation survives a
/// few lost renewals, and a dead receiver's reservation is freed in a second.
pub const PEER_LEASE: Duration = Duration::from_secs(1);

/// Heartbeats leave within the first 30 % of their period (a hash of the
/// pair and the period picks where): spread out, and still well before the
/// round half a period in.
pub const PEER_HEARTBEAT_JITTER: f64 = 0.3;

/// `[peering]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPeering {
    pub listen: Option<String>,
    #[serde(default)]
    pub peers: Vec<RawPeer>,
    pub heartbeat: Option<Written<HumanDuration>>,
    pub heartbeat_jitter: Option<f64>,
    pub dead_after: Option<Written<HumanDuration>>,
    pub lease: Option<Written<HumanDuration>>,
    pub adverts: Option<String>,
    pub gossip_fanout: Option<i64>,
    pub gossip_every: Option<Written<HumanDuration>>,
    pub allow_anonymous: Option<bool>,
    pub tls: Option<RawTls>,
}

/// One `[[peering.peers]]` (or inline `{ id = 2, addr = "..." }`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPeer {
    pub id: Option<u64>,
    pub addr: Option<String>,
}

/// `[peering]`: redirection of overflow to neighbouring nodes without a
/// coordinator (docs/peering.md).
#[derive(Debug, Clone, PartialEq)]
pub struct PeeringConfig {
    /// Where this node serves `weir.v1.Peer`.
    pub listen: SocketAddr,
    /// The nodes it peers with; ids unique and not this node's.
    pub peers: Vec<PeerConfig>,
    /// How often it sends its state to each peer and runs a redirection
    /// round.
    pub heartbeat: Duration,
    /// The share of a period over which heartbeats to the peers are
    /// spread (0: all at the period's start).
    pub heartbeat_jitter: f64,
    /// Silence after which a peer counts as gone; longer than `heartbeat`
    /// (and, with gossip, than two gossip periods).
    pub dead_after: Duration,
    /// How adverts reach the peers: to every peer every heartbeat, or by
    /// gossip.
    pub adverts: Adverts,
    /// How long a reservation lasts unless renewed; longer than
    /// `heartbeat`.
    pub lease: Duration,
    /// Mutual TLS between nodes: each proves its node id with a
    /// certificate from `cafile` naming `<id>.node.weir`.
    pub tls: Option<TlsFiles>,
}

/// `peering.adverts`: how a node's advert reaches its peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adverts {
    /// `"all-to-all"` (the default): a heartbeat to every peer every
    /// `heartbeat`; a peer is gone after `dead_after` (500 ms) of silence.
    AllToAll,
    /// `"gossip"`: every `every`, the node's table (its advert and every live
    /// one it holds, with their ages) to `fanout` peers, push-pull
    /// (`weir_core::peer::gossip`); `dead_after` defaults to 6 periods.
    Gossip { fanout: usize, every: Duration },
}

/// One `peering.peers` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerConfig {
    /// Its `node.id`.
    pub id: NodeId,
    /// Where it serves `weir.v1.Peer` (`peering.listen` on that node).
    pub addr: BrokerAddr,
}

/// `[peering]` checked against this node's `node_id`, or `None` after
/// recording why.
///
/// `Some(None)` when valid and off (no `listen`).
pub(crate) fn peering(
    p: &mut Problems,
    raw: RawPeering,
    node_id: u64,
) -> Option<Option<PeeringConfig>> {
    const PATH: &str = "peering";
    let before = p.len();
    let listen = raw
        .listen
        .as_deref()
        .map(|text| p.socket_addr(&format!("{PATH}.listen"), text));
    if raw.listen.is_none() && !raw.peers.is_empty() {
        p.push(
            format!("{PATH}.listen"),
            "missing; peers are only used by a node that serves the peer protocol too, e.g. listen = \"0.0.0.0:7070\"",
        );
    }
    let adverts = adverts(p, &raw);
    let Timing {
        heartbeat,
        heartbeat_jitter,
        dead_after,
        lease,
    } = timing(
        p,
        [raw.heartbeat, raw.dead_after, raw.lease],
        raw.heartbeat_jitter,
        adverts,
    );
    let peers = peer_list(p, raw.peers, node_id);
    let tls = peering_tls(p, raw.tls);
    if let Some(Some(addr)) = listen {
        check_exposed(
            p,
            &format!("{PATH}.listen"),
            addr,
            tls.is_some(),
            raw.allow_anonymous,
            &format!("{PATH}.allow_anonymous"),
            "configure [peering.tls] (mutual TLS: certfile, keyfile, cafile; docs/security.md)",
        );
    }
    if p.len() != before {
        return None;
    }
    let Some(listen) = listen else {
        return Some(None);
    };
    Some(Some(PeeringConfig {
        listen: listen?,
        peers,
        heartbeat: heartbeat?,
        heartbeat_jitter,
        dead_after: dead_after?,
        adverts: adverts?,
        lease: lease?,
        tls,
    }))
}

/// Peering's periods, each `None` where a problem was recorded.
struct Timing {
    heartbeat: Option<Duration>,
    heartbeat_jitter: f64,
    dead_after: Option<Duration>,
    lease: Option<Duration>,
}

/// `peering.heartbeat`, `heartbeat_jitter`, `dead_after` and `lease`
/// (`written`: heartbeat, dead_after, lease as written), checked against
/// each other and the adverts' period.
fn timing(
    p: &mut Problems,
    written: [Option<Written<HumanDuration>>; 3],
    heartbeat_jitter: Option<f64>,
    adverts: Option<Adverts>,
) -> Timing {
    const PATH: &str = "peering";
    let [heartbeat_written, dead_after_written, lease_written] = written;
    let heartbeat = p.positive_duration(
        &format!("{PATH}.heartbeat"),
        heartbeat_written,
        PEER_HEARTBEAT,
    );
    let heartbeat_jitter = heartbeat_jitter.unwrap_or(PEER_HEARTBEAT_JITTER);
    let max_jitter = weir_core::peer::MAX_HEARTBEAT_JITTER;
    if !(0.0..=max_jitter).contains(&heartbeat_jitter) {
        p.push(
            format!("{PATH}.heartbeat_jitter"),
            format!(
                "{heartbeat_jitter} is not within 0.0..={max_jitter}: heartbeats must arrive before the round, half a period in"
            ),
        );
    }
    let default_dead_after = match adverts {
        Some(Adverts::Gossip { every, .. }) => {
            every * weir_core::peer::gossip::GOSSIP_DEAD_AFTER_PERIODS
        }
        _ => PEER_DEAD_AFTER,
    };
    let dead_after = p.positive_duration(
        &format!("{PATH}.dead_after"),
        dead_after_written,
        default_dead_after,
    );
    if let (Some(Adverts::Gossip { every, .. }), Some(dead_after)) = (adverts, dead_after) {
        if dead_after <= every * 2 {
            p.push(
                format!("{PATH}.dead_after"),
                format!(
                    "{} must be longer than two gossip periods (peering.gossip_every = {}): an advert reaches a node through others, a period or more later; {} is usual",
                    HumanDuration(dead_after),
                    HumanDuration(every),
                    HumanDuration(every * weir_core::peer::gossip::GOSSIP_DEAD_AFTER_PERIODS)
                ),
            );
        }
    }
    let lease = p.positive_duration(&format!("{PATH}.lease"), lease_written, PEER_LEASE);
    if let (Some(heartbeat), Some(dead_after)) = (heartbeat, dead_after) {
        if dead_after <= heartbeat {
            p.push(
                format!("{PATH}.dead_after"),
                format!(
                    "{} must be longer than peering.heartbeat ({}), or a live peer is declared gone between two heartbeats; a few heartbeats is usual",
                    HumanDuration(dead_after),
                    HumanDuration(heartbeat)
                ),
            );
        }
    }
    if let (Some(heartbeat), Some(lease)) = (heartbeat, lease) {
        if lease <= heartbeat {
            p.push(
                format!("{PATH}.lease"),
                format!(
                    "{} must be longer than peering.heartbeat ({}): receivers renew their reservations once per heartbeat",
                    HumanDuration(lease),
                    HumanDuration(heartbeat)
                ),
            );
        }
    }
    Timing {
        heartbeat,
        heartbeat_jitter,
        dead_after,
        lease,
    }
}

/// `peering.peers`: each with an id (not this node's `node_id`, not 0,
/// not another entry's) and an address.
fn peer_list(p: &mut Problems, raw: Vec<RawPeer>, node_id: u64) -> Vec<PeerConfig> {
    const PATH: &str = "peering";
    let mut peers: Vec<PeerConfig> = Vec::with_capacity(raw.len());
    let mut seen: Vec<(u64, usize)> = Vec::with_capacity(raw.len());
    for (i, peer) in raw.into_iter().enumerate() {
        let path = format!("{PATH}.peers[{i}]");
        let id = match peer.id {
            None => {
                p.push(format!("{path}.id"), "missing; give the peer's node.id");
                None
            }
            Some(0) => {
                p.push(
                    format!("{path}.id"),
                    "0 is reserved; give the peer's node.id",
                );
                None
            }
            Some(id) if id == node_id => {
                p.push(
                    format!("{path}.id"),
                    format!("{id} is this node's own node.id; list only the other nodes"),
                );
                None
            }
            Some(id) => {
                match seen.iter().find(|(other, _)| *other == id) {
                    Some((_, first)) => {
                        p.push(
                        format!("{path}.id"),
                        format!("{id} is already the id of {PATH}.peers[{first}]; node ids are unique"),
                    );
                        None
                    }
                    None => {
                        seen.push((id, i));
                        Some(id)
                    }
                }
            }
        };
        let addr = match peer.addr {
            None => {
                p.push(
                    format!("{path}.addr"),
                    "missing; give the peer's peering.listen as host:port, e.g. \"10.0.0.2:7070\"",
                );
                None
            }
            Some(text) => match parse_broker(&text) {
                Ok(addr) => Some(addr),
                Err(why) => {
                    p.push(format!("{path}.addr"), format!("{text:?}: {why}"));
                    None
                }
            },
        };
        if let (Some(id), Some(addr)) = (id, addr) {
            peers.push(PeerConfig { id, addr });
        }
    }
    peers
}

/// `[peering.tls]`: always mutual, so a CA is required and
/// `require_certificate` may not be turned off.
fn peering_tls(p: &mut Problems, raw: Option<RawTls>) -> Option<TlsFiles> {
    const PATH: &str = "peering";
    let refuses_plain = raw.as_ref().and_then(|t| t.require_certificate) == Some(false);
    let tls = raw.and_then(|t| tls(p, &format!("{PATH}.tls"), t, &[]));
    if refuses_plain {
        p.push(
            format!("{PATH}.tls.require_certificate"),
            "peering TLS is always mutual: every node proves its node id with its certificate; remove this key",
        );
    }
    tls.and_then(|t| {
        if t.files.cafile.is_none() {
            p.push(
                format!("{PATH}.tls.cafile"),
                "missing: peers prove their node id with a certificate from this CA",
            );
            return None;
        }
        Some(TlsFiles {
            require_certificate: true,
            ..t.files
        })
    })
}

/// `peering.adverts` with `gossip_fanout` and `gossip_every`, or `None`
/// after recording why.
fn adverts(p: &mut Problems, raw: &RawPeering) -> Option<Adverts> {
    const PATH: &str = "peering";
    let gossip = match raw.adverts.as_deref() {
        None | Some("all-to-all") => false,
        Some("gossip") => true,
        Some(other) => {
            p.push(
                format!("{PATH}.adverts"),
                format!("{other:?} is not one of \"all-to-all\", \"gossip\""),
            );
            return None;
        }
    };
    if !gossip {
        for (key, set) in [
            ("gossip_fanout", raw.gossip_fanout.is_some()),
            ("gossip_every", raw.gossip_every.is_some()),
        ] {
            if set {
                p.push(
                    format!("{PATH}.{key}"),
                    "only used with adverts = \"gossip\"; set that too, or remove this key",
                );
            }
        }
        return Some(Adverts::AllToAll);
    }
    let fanout = match raw.gossip_fanout {
        None => Some(weir_core::peer::gossip::GOSSIP_FANOUT),
        Some(n) if (1..=64).contains(&n) => Some(n as usize),
        Some(n) => {
            p.push(
                format!("{PATH}.gossip_fanout"),
                format!("{n} is not within 1..=64: the peers a node exchanges its table with each period (2 is usual)"),
            );
            None
        }
    };
    let every = p.positive_duration(
        &format!("{PATH}.gossip_every"),
        raw.gossip_every.clone(),
        weir_core::peer::gossip::GOSSIP_EVERY,
    );
    Some(Adverts::Gossip {
        fanout: fanout?,
        every: every?,
    })
}
