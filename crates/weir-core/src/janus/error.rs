//! [`JanusError`], and the guard that keeps counters from turning an
//! allocation negative or NaN; every JANUS module uses both.

/// Why a JANUS computation could not run: bad parameters, never load.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum JanusError {
    /// No latency class given.
    #[error("at least one latency class is required")]
    NoClasses,
    /// Per-class inputs whose length differs from the number of classes.
    #[error("expected one value per latency class ({expected}), got {got}: pass a value for every class, most urgent first")]
    ClassCount {
        /// Number of classes configured.
        expected: usize,
        /// Number of values passed.
        got: usize,
    },
    /// A latency bound that is zero, negative or not finite.
    #[error("latency bound of class #{class} is {bound} s: it must be a finite, positive number of seconds")]
    BadBound {
        /// Index of the class.
        class: usize,
        /// The bound given, in seconds.
        bound: f64,
    },
    /// A minimum share outside 0..=1.
    #[error("min_share of class #{class} is {share}: it must be within 0.0..=1.0")]
    BadShare {
        /// Index of the class.
        class: usize,
        /// The share given.
        share: f64,
    },
    /// Minimum shares that add up to more than the whole link.
    #[error("the min_share of all classes add up to {0}, more than 1.0: lower some of them")]
    SharesExceedOne(f64),
    /// An outbound capacity that is negative or not finite.
    #[error("outbound capacity {0} is not a finite, non-negative rate")]
    BadCapacity(f64),
    /// A counting window that is zero, negative or not finite.
    #[error("counting window {0} s is not a finite, positive number of seconds")]
    BadWindow(f64),
    /// A scheme or strategy name that is not one of the known names.
    #[error("unknown scheme `{0}`: use one of native, qm-only, none, pmrfs, random, random:<seed>, fcfs, lrfs, best-fit")]
    UnknownScheme(String),
}

/// `x` if it is a finite positive number, else 0: rates, backlogs and
/// amounts from counters must never turn an allocation negative or NaN.
#[inline]
pub(crate) fn non_negative(x: f64) -> f64 {
    if x.is_finite() && x > 0.0 {
        x
    } else {
        0.0
    }
}
