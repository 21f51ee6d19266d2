//! Latency classes: JANUS (Wen et al., IEEE TSC 2023) Section III and Table I.
//!
//! JANUS uses three classes (`ls` 0-100 ms, `nm` 100-500 ms, `lt` 500-1000 ms)
//! and leaves their number and thresholds to the operator; weir accepts any
//! number, ordered by priority (index 0 is the most urgent).

use std::time::Duration;

/// Most classes a [`ClassSet`] may hold; [`ClassId`] is a `u8` and the
/// per-class arrays on hot paths stay small.
pub const MAX_CLASSES: usize = 16;

/// Index of a class in its [`ClassSet`]; lower is more urgent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClassId(pub u8);

impl ClassId {
    /// The class index as a `usize`, for indexing per-class arrays.
    #[inline]
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// One latency class: a name and its latency bound `delta_c` (JANUS Eq. 1's
/// threshold), plus the minimum share of the outbound capacity it keeps even
/// when higher classes want everything (JANUS names starvation as its gap;
/// `0.0` reproduces the paper).
#[derive(Debug, Clone, PartialEq)]
pub struct LatencyClass {
    /// Name used in configs, metrics labels and the batch wire format.
    pub name: String,
    /// `delta_c`: the end-to-end latency bound the class must meet.
    pub bound: Duration,
    /// Fraction of `C_out` (0.0..=1.0) reserved for this class when it has
    /// demand; the shares of all classes sum to at most 1.
    pub min_share: f64,
}

impl LatencyClass {
    /// A class with no minimum share (the paper's strict priority).
    pub fn new(name: impl Into<String>, bound: Duration) -> Self {
        LatencyClass {
            name: name.into(),
            bound,
            min_share: 0.0,
        }
    }
}

/// Why a list of classes cannot be a [`ClassSet`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ClassSetError {
    /// No class given.
    #[error("at least one latency class is required")]
    Empty,
    /// More than [`MAX_CLASSES`].
    #[error("{0} latency classes given, at most {MAX_CLASSES} are supported")]
    TooMany(usize),
    /// Two classes with one name.
    #[error("latency class `{0}` is defined twice")]
    Duplicate(String),
    /// A class with an empty name.
    #[error("latency class #{0} has an empty name")]
    EmptyName(usize),
    /// A zero latency bound.
    #[error("latency class `{0}` has a zero latency bound")]
    ZeroBound(String),
    /// A minimum share outside 0..=1.
    #[error("latency class `{0}` has min_share {1}, which is not within 0.0..=1.0")]
    BadShare(String, f64),
    /// Shares that add up to more than the whole link.
    #[error("the min_share of all latency classes add up to {0}, more than 1.0")]
    SharesExceedOne(f64),
}

/// The node's latency classes in priority order (index 0 first).
#[derive(Debug, Clone, PartialEq)]
pub struct ClassSet {
    classes: Vec<LatencyClass>,
}

impl ClassSet {
    /// Validates and orders nothing: the given order *is* the priority order.
    pub fn new(classes: Vec<LatencyClass>) -> Result<Self, Vec<ClassSetError>> {
        let mut errors = Vec::new();
        if classes.is_empty() {
            errors.push(ClassSetError::Empty);
        }
        if classes.len() > MAX_CLASSES {
            errors.push(ClassSetError::TooMany(classes.len()));
        }
        let mut share_sum = 0.0;
        for (i, c) in classes.iter().enumerate() {
            if c.name.is_empty() {
                errors.push(ClassSetError::EmptyName(i));
            }
            if classes[..i].iter().any(|o| o.name == c.name) {
                errors.push(ClassSetError::Duplicate(c.name.clone()));
            }
            if c.bound.is_zero() {
                errors.push(ClassSetError::ZeroBound(c.name.clone()));
            }
            if !(0.0..=1.0).contains(&c.min_share) {
                errors.push(ClassSetError::BadShare(c.name.clone(), c.min_share));
            } else {
                share_sum += c.min_share;
            }
        }
        if share_sum > 1.0 + 1e-9 {
            errors.push(ClassSetError::SharesExceedOne(share_sum));
        }
        if errors.is_empty() {
            Ok(ClassSet { classes })
        } else {
            Err(errors)
        }
    }

    /// JANUS Table I: `ls` 100 ms, `nm` 500 ms, `lt` 1000 ms.
    pub fn janus_default() -> Self {
        ClassSet::new(vec![
            LatencyClass::new("ls", Duration::from_millis(100)),
            LatencyClass::new("nm", Duration::from_millis(500)),
            LatencyClass::new("lt", Duration::from_millis(1000)),
        ])
        .expect("the JANUS default classes are valid")
    }

    /// Number of classes.
    pub fn len(&self) -> usize {
        self.classes.len()
    }

    /// Always false: a valid set has at least one class.
    pub fn is_empty(&self) -> bool {
        self.classes.is_empty()
    }

    /// The class with this id.
    pub fn get(&self, id: ClassId) -> &LatencyClass {
        &self.classes[id.index()]
    }

    /// The id of the class with this name.
    pub fn id_of(&self, name: &str) -> Option<ClassId> {
        self.classes
            .iter()
            .position(|c| c.name == name)
            .map(|i| ClassId(i as u8))
    }

    /// Classes with their ids, most urgent first.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (ClassId, &LatencyClass)> {
        self.classes
            .iter()
            .enumerate()
            .map(|(i, c)| (ClassId(i as u8), c))
    }

    /// Latency bounds in seconds, most urgent first (the `delta_c` vector).
    pub fn bounds_secs(&self) -> Vec<f64> {
        self.classes.iter().map(|c| c.bound.as_secs_f64()).collect()
    }

    /// Minimum shares, most urgent first.
    pub fn min_shares(&self) -> Vec<f64> {
        self.classes.iter().map(|c| c.min_share).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn janus_defaults_match_table_one() {
        let set = ClassSet::janus_default();
        assert_eq!(set.len(), 3);
        assert_eq!(set.id_of("ls"), Some(ClassId(0)));
        assert_eq!(set.get(ClassId(1)).bound, Duration::from_millis(500));
        assert_eq!(set.bounds_secs(), vec![0.1, 0.5, 1.0]);
    }

    #[test]
    fn every_problem_is_reported() {
        let mut bad = LatencyClass::new("a", Duration::ZERO);
        bad.min_share = 0.8;
        let mut dup = LatencyClass::new("a", Duration::from_millis(1));
        dup.min_share = 0.7;
        let errs = ClassSet::new(vec![
            bad,
            dup,
            LatencyClass::new("", Duration::from_secs(1)),
        ])
        .unwrap_err();
        assert!(errs.contains(&ClassSetError::ZeroBound("a".into())));
        assert!(errs.contains(&ClassSetError::Duplicate("a".into())));
        assert!(errs.contains(&ClassSetError::EmptyName(2)));
        assert!(errs
            .iter()
            .any(|e| matches!(e, ClassSetError::SharesExceedOne(_))));
        assert_eq!(
            ClassSet::new(vec![]).unwrap_err(),
            vec![ClassSetError::Empty]
        );
    }
}
