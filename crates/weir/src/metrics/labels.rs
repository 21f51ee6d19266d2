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
