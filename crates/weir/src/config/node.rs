//! `[node]`: who this node is (its id and name), as written, its defaults,
//! checked, and its validation.

use serde::Deserialize;
use weir_core::record::NodeId;

use super::problems::Problems;

/// One node needs no id planning; nodes that peer must each set their own.
pub const NODE_ID: u64 = 1;

/// Short and recognisable in logs and metrics when nothing better is given.
pub const NODE_NAME: &str = "weir";

/// `[node]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawNode {
    pub id: Option<u64>,
    pub name: Option<String>,
}

/// `[node]`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    /// Origin id stamped on every record entering here; never 0.
    pub id: NodeId,
    /// Name for logs and metrics.
    pub name: String,
}

/// `[node]` checked, or `None` after recording why.
pub(crate) fn node(p: &mut Problems, raw: RawNode) -> Option<NodeConfig> {
    let before = p.len();
    let id = raw.id.unwrap_or(NODE_ID);
    if id == 0 {
        p.push(
            "node.id",
            "0 is reserved; give a positive id, unique among the nodes that peer",
        );
    }
    let name = raw.name.unwrap_or_else(|| NODE_NAME.to_owned());
    if name.trim().is_empty() {
        p.push("node.name", "must not be empty");
    }
    (p.len() == before).then_some(NodeConfig { id, name })
}
