//! What a destination is ([`Sink`]), how a delivery fails, and who is told
//! of each confirmed batch ([`DeliveryObserver`]).

use std::future::Future;

use weir_core::Record;

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

/// A destination for batches.
pub trait Sink: Send + 'static {
    /// Delivers one batch and returns once the destination has durably
    /// accepted it (publisher confirm, file renamed into place).
    fn deliver(
        &mut self,
        batch: &EncodedBatch,
    ) -> impl Future<Output = Result<(), SinkError>> + Send;

    /// A short name for logs.
    fn name(&self) -> &'static str;
}

/// Told, right after each confirmed transaction, which records it carried:
/// peering acknowledges records that peers forwarded to this node only then
/// (`crate::peer::Deliveries`). Called on the egress task, so it must
/// return at once (no waiting, no I/O).
pub trait DeliveryObserver: std::fmt::Debug + Send + Sync {
    /// The destination has durably accepted these records.
    fn delivered(&self, records: &[Record]);
}
