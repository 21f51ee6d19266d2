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

/// The `class` and `reason` labels of records dropped by policy.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DropLabel {
    /// Class name.
    pub class: String,
    /// `full` (drop-newest), `evicted` (drop-oldest), `ttl`.
    pub reason: String,
}
