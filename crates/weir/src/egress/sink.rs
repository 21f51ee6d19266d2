//! What a destination is ([`Sink`]), how a delivery fails, and who is told
//! of each confirmed batch ([`DeliveryObserver`]).

use std::future::Future;

use futures::future::BoxFuture;
use weir_core::Receipt;

use super::batch::EncodedBatch;

/// Why a delivery failed; the batch is retried either way.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The destination cannot be reached now (connection lost, broker
    /// restarting, disk full); retry after a backoff.
    #[error("egress unavailable: {0}")]
    Unavailable(String),
    /// The destination refused this batch (nack, unroutable return).
    #[error("batch refused by the destination: {0}")]
    Refused(String),
}

/// A sent batch's confirmation: resolves once the destination has durably
/// accepted the batch, or with why it did not.
pub type Confirm = BoxFuture<'static, Result<(), SinkError>>;

/// A confirmation that is already in.
pub fn confirmed() -> Confirm {
    Box::pin(std::future::ready(Ok(())))
}

/// A destination for batches.
///
/// Sending and confirming are separate steps so that the delivery loop can
/// keep a window of sent, unconfirmed batches ([`Sink::window`]): a sink
/// whose destination confirms asynchronously (RabbitMQ) is not limited to
/// one round trip per batch.
pub trait Sink: Send + 'static {
    /// Sends one batch and resolves once it is on its way, with the future
    /// of its confirmation. Calls are serial: a sink sees the batches in
    /// sending order, and an error here means the batch was not sent.
    fn send(
        &mut self,
        batch: &EncodedBatch,
    ) -> impl Future<Output = Result<Confirm, SinkError>> + Send;

    /// Sends one batch and returns once the destination has durably
    /// accepted it (publisher confirm, file renamed into place).
    fn deliver(
        &mut self,
        batch: &EncodedBatch,
    ) -> impl Future<Output = Result<(), SinkError>> + Send {
        async move { self.send(batch).await?.await }
    }

    /// How many sent batches may await their confirmation at once (at
    /// least 1).
    fn window(&self) -> usize {
        1
    }

    /// A short name for logs.
    fn name(&self) -> &'static str;

    /// Whether [`Sink::send`] returns only once the link has carried the
    /// batch (the emulated link); otherwise the egress predicts when it has
    /// from the link estimate ([`weir_core::admission::LinkClock`]).
    fn carried_on_send(&self) -> bool {
        false
    }
}

/// Told, right after each confirmed transaction, which records it carried:
/// peering acknowledges records that peers forwarded to this node only then
/// (`crate::peer::Deliveries`). Called on the egress task, so it must
/// return at once (no waiting, no I/O).
pub trait DeliveryObserver: std::fmt::Debug + Send + Sync {
    /// The destination has durably accepted these records.
    fn delivered(&self, records: &[Receipt]);
}
