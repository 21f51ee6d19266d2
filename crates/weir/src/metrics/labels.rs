//! The label sets of weir's metrics.

use prometheus_client::encoding::EncodeLabelSet;

/// The `class` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabel {
    /// Class name.
    pub class: String,
}

/// The `codec` label: `none`, `gzip-<level>`, `zstd-<level>`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodecLabel {
    /// Codec and level.
    pub codec: String,
}

/// The `class` and `reason` labels: why spooled records were dropped
/// (`full`, `evicted`, `ttl`), or which limit blocks a class
/// (`spool_max_bytes`, `max_bytes`, `min_free_bytes`, `writer_backlog`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Class name.
    pub class: String,
    /// Why.
    pub reason: String,
}
