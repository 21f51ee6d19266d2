//! What the tasks hand each other, defined where each side can see it
//! without seeing the other: the egress tells the scheduler that the link
//! is free ([`LinkReady`]); the scheduler and peering exchange the PBTT
//! state and the grants a provider made ([`PeerPort`]). The batches and
//! transaction reports themselves are `weir-core`'s
//! ([`weir_core::scheduler::OutBatch`], [`weir_core::scheduler::Delivered`]).

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::{mpsc, watch};
use weir_core::janus::Grant;
use weir_core::peer::BandwidthState;

/// Signals from the egress to the scheduler that the link is free: the
/// egress adds one permit each time it is about to wait for a batch, and the
/// scheduler takes one before it builds a batch. Batches are therefore built
/// just in time, when the link can take them, so a record of an urgent class
/// never waits behind less urgent batches queued ahead of it in a channel.
pub type LinkReady = std::sync::Arc<LinkSlots>;

/// The permits behind [`LinkReady`]. A permit is for any batch, or, while
/// no slot of the egress's window of unconfirmed batches may be offered
/// (the window is full, or its next slot is held back by the pace,
/// [`weir_core::admission::WindowPacer`]), for one batch of the most
/// urgent class beyond it (the *urgent lane*: an urgent record need not
/// wait for a confirmation or the pace, only its own small batch is added
/// to the link); a slot that may be offered widens that permit to any
/// batch.
#[derive(Debug)]
pub struct LinkSlots {
    permits: tokio::sync::Semaphore,
    urgent_only: AtomicBool,
    widened: tokio::sync::Notify,
}

impl Default for LinkSlots {
    fn default() -> Self {
        LinkSlots {
            permits: tokio::sync::Semaphore::new(0),
            urgent_only: AtomicBool::new(false),
            widened: tokio::sync::Notify::new(),
        }
    }
}

impl LinkSlots {
    /// A slot of the window is free: one batch, any.
    pub fn offer(&self) {
        self.urgent_only.store(false, Ordering::Release);
        self.permits.add_permits(1);
    }

    /// No slot of the window may be offered: one batch of the most urgent
    /// class alone.
    pub fn offer_urgent(&self) {
        self.urgent_only.store(true, Ordering::Release);
        self.permits.add_permits(1);
    }

    /// A slot may be offered while an urgent-only permit is out: it may
    /// carry any batch now.
    pub fn widen(&self) {
        self.urgent_only.store(false, Ordering::Release);
        self.widened.notify_one();
    }

    /// Whether the permit out is for the most urgent class only.
    pub fn urgent_only(&self) -> bool {
        self.urgent_only.load(Ordering::Acquire)
    }

    /// Waits for a permit (cancel safe).
    pub async fn acquire(
        &self,
    ) -> Result<tokio::sync::SemaphorePermit<'_>, tokio::sync::AcquireError> {
        self.permits.acquire().await
    }

    /// Resolves after the next [`LinkSlots::widen`] (or at once if one came
    /// since the last wait).
    pub async fn widened(&self) {
        self.widened.notified().await;
    }

    /// Permits offered and not yet taken.
    pub fn available_permits(&self) -> usize {
        self.permits.available_permits()
    }
}

/// Rung whenever records are queued, so the scheduler wakes for them: for
/// any class, and separately for the most urgent class, which alone the
/// urgent lane's permit can carry ([`LinkSlots`]): while the scheduler
/// holds that permit, arrivals of the other classes (thousands a second)
/// need not wake it.
#[derive(Debug, Default)]
pub struct Arrivals {
    any: tokio::sync::Notify,
    urgent: tokio::sync::Notify,
}

impl Arrivals {
    /// Records of `class` were queued.
    pub fn ring(&self, class: weir_core::ClassId) {
        self.any.notify_one();
        if class == weir_core::ClassId(0) {
            self.urgent.notify_one();
        }
    }

    /// Resolves after records of any class were queued since the last wait
    /// (one stored permit, so an arrival between two waits is not missed).
    pub async fn any(&self) {
        self.any.notified().await;
    }

    /// The same, for records of the most urgent class.
    pub async fn urgent(&self) {
        self.urgent.notified().await;
    }
}

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
