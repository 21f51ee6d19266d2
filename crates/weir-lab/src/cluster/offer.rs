//! What each node's `weir-load offer` reported, read from its report
//! file.

use std::path::Path;

use anyhow::Context;
use serde_json::Value;

use crate::janus::CLASSES;

/// What one node's `weir-load offer` reported: per class (in [`CLASSES`]
/// order) offered, sent and acknowledged.
#[derive(Debug, Default, Clone)]
pub(super) struct Offered {
    pub(super) offered: [u64; 3],
    pub(super) sent: [u64; 3],
    pub(super) acked: [u64; 3],
    pub(super) seconds: f64,
    pub(super) errors: Vec<String>,
}

pub(super) fn read_offer(path: &Path) -> anyhow::Result<Offered> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("weir-load wrote no report at {}", path.display()))?;
    let v: Value = serde_json::from_str(&text)?;
    let mut o = Offered {
        seconds: v["seconds"].as_f64().unwrap_or(0.0),
        ..Offered::default()
    };
    for c in v["classes"].as_array().into_iter().flatten() {
        let Some(i) = CLASSES.iter().position(|(n, _)| c["class"] == *n) else {
            continue;
        };
        o.offered[i] = c["offered"].as_u64().unwrap_or(0);
        o.sent[i] = c["sent"].as_u64().unwrap_or(0);
        o.acked[i] = c["acked"].as_u64().unwrap_or(0);
        if let Some(e) = c["error"].as_str() {
            o.errors.push(format!("{}: {e}", CLASSES[i].0));
        }
    }
    Ok(o)
}
