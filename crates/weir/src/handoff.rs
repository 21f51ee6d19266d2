//! What the tasks hand each other, defined where each side can see it
//! without seeing the other: the egress tells the scheduler that the link
//! is free ([`LinkReady`]); the scheduler and peering exchange the PBTT
//! state and the grants a provider made ([`PeerPort`]). The batches and
//! transaction reports themselves are `weir-core`'s
//! ([`weir_core::scheduler::OutBatch`], [`weir_core::scheduler::Delivered`]).

use tokio::sync::{mpsc, watch};
use weir_core::janus::Grant;
use weir_core::peer::BandwidthState;

/// Signals from the egress to the scheduler that the link is free: the
/// egress adds one permit each time it is about to wait for a batch, and the
/// scheduler takes one before it builds a batch. Batches are therefore built
/// just in time, when the link can take them, so a record of an urgent class
/// never waits behind less urgent batches queued ahead of it in a channel.
pub type LinkReady = std::sync::Arc<tokio::sync::Semaphore>;

/// The scheduler's side of peering (docs/peering.md): it publishes its PBTT
/// state for the heartbeats, and moves the grants this node made as a
/// provider into its allocation (JANUS Fig. 4).
#[derive(Debug)]
pub struct PeerPort {
    /// The tuple and allocation after every window and every applied grant.
    pub state: watch::Sender<BandwidthState>,
    /// Grants made as a provider, applied by the scheduler.
    pub shifts: mpsc::Receiver<Grant>,
}
