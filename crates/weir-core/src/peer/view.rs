//! What a node knows of its peers: the latest advert of each, and which are
//! alive ([`PeerView`]).

use std::collections::BTreeMap;
use std::time::Duration;

use super::state::Advert;
use crate::record::NodeId;

/// A peer's latest advert and when it arrived.
#[derive(Debug, Clone)]
pub(crate) struct Heard {
    advert: Advert,
    received: Duration,
}

/// What [`PeerView::observe`] made of a heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// A peer not known, or known and gone, is (again) alive.
    Joined,
    /// A newer advert of a live peer.
    Updated,
    /// Not newer than the advert held (a reordered or repeated message):
    /// ignored, so the view never goes back in time.
    Stale,
}

/// One node's view of its peers: the latest advert of each, alive while
/// heard from within `dead_after`.
#[derive(Debug, Clone)]
pub struct PeerView {
    dead_after: Duration,
    peers: BTreeMap<NodeId, Heard>,
}

impl PeerView {
    /// An empty view in which a peer is gone after `dead_after` of silence.
    pub fn new(dead_after: Duration) -> Self {
        PeerView {
            dead_after,
            peers: BTreeMap::new(),
        }
    }

    /// Records a heartbeat from `peer` received at `now`.
    ///
    /// A peer that is gone may come back with a smaller round (it restarted
    /// with a clock that went back), so rounds are only compared while it
    /// is alive.
    pub fn observe(&mut self, peer: NodeId, advert: Advert, now: Duration) -> Observed {
        if let Some(h) = self.peers.get(&peer) {
            let alive = now.saturating_sub(h.received) < self.dead_after;
            if alive && advert.round <= h.advert.round {
                return Observed::Stale;
            }
        }
        self.put(peer, advert, now, now)
    }

    /// Takes in `peer`'s advert as another node relayed it at `now` (gossip,
    /// [`crate::peer::gossip`]): heard `age` before `now`, so it counts as
    /// heard then. Taken only if its round is newer than the one held,
    /// whether that peer is alive or gone (a stale copy passed on must not
    /// bring a dead node back), and only if it is younger than
    /// `dead_after`.
    pub fn observe_relayed(
        &mut self,
        peer: NodeId,
        advert: Advert,
        age: Duration,
        now: Duration,
    ) -> Observed {
        if age >= self.dead_after {
            return Observed::Stale;
        }
        let mut heard = now.saturating_sub(age);
        if let Some(h) = self.peers.get(&peer) {
            if advert.round <= h.advert.round {
                return Observed::Stale;
            }
            heard = heard.max(h.received);
        }
        self.put(peer, advert, heard, now)
    }

    /// Holds `advert` as `peer`'s, heard at `received`: it `Joined` unless
    /// it was alive at `now` before.
    fn put(&mut self, peer: NodeId, advert: Advert, received: Duration, now: Duration) -> Observed {
        let before = self.peers.insert(peer, Heard { advert, received });
        match before {
            Some(h) if now.saturating_sub(h.received) < self.dead_after => Observed::Updated,
            _ => Observed::Joined,
        }
    }

    /// True if `peer` was heard from less than `dead_after` before `now`.
    pub fn is_alive(&self, peer: NodeId, now: Duration) -> bool {
        self.peers
            .get(&peer)
            .is_some_and(|h| now.saturating_sub(h.received) < self.dead_after)
    }

    /// The live peers and their latest adverts, by node id.
    pub fn alive(&self, now: Duration) -> impl Iterator<Item = (NodeId, &Advert)> + '_ {
        self.peers
            .iter()
            .filter(move |(_, h)| now.saturating_sub(h.received) < self.dead_after)
            .map(|(&id, h)| (id, &h.advert))
    }

    /// Forgets `peer` (dropped from the configuration): it is no longer
    /// alive, and its advert is gone.
    pub fn forget(&mut self, peer: NodeId) {
        self.peers.remove(&peer);
    }

    /// How many peers are alive at `now`.
    pub fn alive_count(&self, now: Duration) -> usize {
        self.alive(now).count()
    }

    /// The latest advert of `peer`, alive or not.
    pub fn advert(&self, peer: NodeId) -> Option<&Advert> {
        self.peers.get(&peer).map(|h| &h.advert)
    }

    /// When `peer` was last heard from.
    pub fn last_heard(&self, peer: NodeId) -> Option<Duration> {
        self.peers.get(&peer).map(|h| h.received)
    }

    /// The silence after which a peer is gone.
    pub fn dead_after(&self) -> Duration {
        self.dead_after
    }
}
