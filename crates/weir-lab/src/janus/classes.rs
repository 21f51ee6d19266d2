//! The latency classes of the JANUS evaluation and their bounds.

/// The class names and their bounds (ms), in urgency order (JANUS's three
/// queues; bounds from DESIGN.md section 1).
pub(crate) const CLASSES: [(&str, u64); 3] = [("ls", 100), ("nm", 500), ("lt", 1000)];
