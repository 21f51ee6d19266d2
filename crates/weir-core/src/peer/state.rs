//! The node's own bandwidth as its scheduler last computed it
//! ([`BandwidthState`]) and the advert it sends peers ([`Advert`]).

use crate::janus::{Allocation, BandwidthTuple};

/// A node's bandwidth as its scheduler last computed it: what it advertises
/// and what it runs with.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BandwidthState {
    /// Spare (positive) or shortage (negative) per class (JANUS V-B1).
    pub tuple: BandwidthTuple,
    /// Per-class rates `V_c` in force.
    pub allocation: Allocation,
    /// `C_out`, the node's outbound capacity, in the tuple's units.
    pub capacity: f64,
    /// The rate at which the node's own traffic arrives (everything but
    /// what peers forward to it), smoothed over about a second.
    pub own_rate: f64,
    /// Whether a class's estimated delay (Eq. 1) broke its bound in the
    /// last window: the node is falling behind, whatever it thought it had.
    pub late: bool,
}

impl BandwidthState {
    /// A node at `tuple` with nothing else known: its capacity taken as
    /// the tuple's spare, no own traffic, not late (so it lends
    /// [`LEND_SHARE`](crate::peer::LEND_SHARE) of that spare). For tests and tools that set tuples
    /// by hand.
    pub fn from_tuple(tuple: BandwidthTuple) -> Self {
        BandwidthState {
            capacity: tuple.spare_total(),
            tuple,
            ..BandwidthState::default()
        }
    }
}

/// What one heartbeat told about a node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Advert {
    /// The sender's message number, increasing for its whole life: a
    /// heartbeat older than one already seen is ignored.
    pub round: u64,
    /// The node's tuple.
    pub tuple: BandwidthTuple,
    /// When its current shortage began, microseconds since the Unix epoch
    /// by its own clock (0 when it has none). FCFS serves the earliest
    /// first; every node sees the same stamp, since the requester sets it.
    pub requesting_since_us: u64,
}
