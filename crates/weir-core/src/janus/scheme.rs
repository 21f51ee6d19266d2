//! The node-level schemes JANUS compares in Section VII, selectable so that
//! weir can be run as each of them for comparison.
//!
//! - Native: one FIFO queue, no classes; everything shares `C_out` in
//!   arrival order.
//! - QM-only: the multi-level queues with PBTT and BWAllocator (Algorithms
//!   1-2), no redirection (the QJUMP-like baseline).
//! - JANUS: QM-only plus redirection with a matcher: PMRFS (Algorithm 3) or
//!   one of its baselines.
//!
//! Config names: `native`, `qm-only` (also `none`, i.e. no matcher),
//! `pmrfs`, `random` (or `random:<seed>`), `fcfs`, `lrfs`, `best-fit`.

use std::fmt;
use std::str::FromStr;

use crate::class::ClassId;

use super::error::JanusError;
use super::redirect::Strategy;

/// How a node schedules its outbound traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// One FIFO queue, no classes, no reallocation, no redirection.
    Native,
    /// Per-class queues and reallocation (Algorithms 1-2), no redirection.
    QmOnly,
    /// Per-class queues, reallocation, and redirection by this matcher.
    Janus(Strategy),
}

impl Default for Scheme {
    /// Full JANUS with PMRFS, the paper's proposal.
    fn default() -> Self {
        Scheme::Janus(Strategy::Pmrfs)
    }
}

impl Scheme {
    /// True if records are queued per latency class (QM-only and JANUS).
    pub const fn uses_classes(self) -> bool {
        !matches!(self, Scheme::Native)
    }

    /// True if PBTT reallocates per-class rates (QM-only and JANUS).
    pub const fn reallocates(self) -> bool {
        self.uses_classes()
    }

    /// The matcher, if this scheme redirects overflow to neighbours.
    pub const fn redirects(self) -> Option<Strategy> {
        match self {
            Scheme::Janus(s) => Some(s),
            Scheme::Native | Scheme::QmOnly => None,
        }
    }

    /// The queue a record of `class` goes to: its own, or the single FIFO
    /// (class 0) under Native.
    pub const fn queue_for(self, class: ClassId) -> ClassId {
        if self.uses_classes() {
            class
        } else {
            ClassId(0)
        }
    }

    /// The config name (`native`, `qm-only`, or the matcher's name).
    pub const fn name(self) -> &'static str {
        match self {
            Scheme::Native => "native",
            Scheme::QmOnly => "qm-only",
            Scheme::Janus(s) => s.name(),
        }
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scheme::Janus(s) => s.fmt(f),
            other => f.write_str(other.name()),
        }
    }
}

impl FromStr for Scheme {
    type Err = JanusError;

    /// Parses a config name; `none` (no matcher) means QM-only.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "native" => Ok(Scheme::Native),
            "qm-only" | "none" => Ok(Scheme::QmOnly),
            other => other.parse().map(Scheme::Janus),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::janus::redirect::DEFAULT_RANDOM_SEED;

    #[test]
    fn names_parse_to_the_schemes() {
        let cases = [
            ("native", Scheme::Native),
            ("qm-only", Scheme::QmOnly),
            ("none", Scheme::QmOnly),
            ("pmrfs", Scheme::Janus(Strategy::Pmrfs)),
            (
                "random",
                Scheme::Janus(Strategy::Random {
                    seed: DEFAULT_RANDOM_SEED,
                }),
            ),
            ("random:3", Scheme::Janus(Strategy::Random { seed: 3 })),
            ("fcfs", Scheme::Janus(Strategy::Fcfs)),
            ("lrfs", Scheme::Janus(Strategy::Lrfs)),
            ("best-fit", Scheme::Janus(Strategy::BestFit)),
        ];
        for (name, scheme) in cases {
            assert_eq!(name.parse::<Scheme>(), Ok(scheme), "{name}");
            if name != "none" {
                assert_eq!(scheme.to_string(), name);
            }
        }
        assert_eq!(
            "qm_only".parse::<Scheme>(),
            Err(JanusError::UnknownScheme("qm_only".into()))
        );
    }

    #[test]
    fn helpers_describe_each_scheme() {
        assert!(!Scheme::Native.uses_classes());
        assert!(!Scheme::Native.reallocates());
        assert_eq!(Scheme::Native.redirects(), None);
        assert_eq!(Scheme::Native.queue_for(ClassId(2)), ClassId(0));
        assert!(Scheme::QmOnly.uses_classes());
        assert_eq!(Scheme::QmOnly.redirects(), None);
        assert_eq!(Scheme::QmOnly.queue_for(ClassId(2)), ClassId(2));
        let janus = Scheme::default();
        assert!(janus.reallocates());
        assert_eq!(janus.redirects(), Some(Strategy::Pmrfs));
        assert_eq!(janus.name(), "pmrfs");
    }
}
