//! Deduplication of records by `(origin, seq)` with bounded memory, for
//! consumers of weir's batches (`weir consume`).
//!
//! weir delivers at least once: a batch whose confirm was lost is published
//! again, a spooled record whose release was not yet on disk when weir
//! crashed is sent again after the restart, and a record a peer carried may
//! come back from its origin when the peer dies. Every record carries its
//! origin node and a sequence number that the origin never reuses, so a
//! consumer hands each `(origin, seq)` on once.
//!
//! Sequence numbers of one origin do not arrive in order: classes overtake
//! each other (an urgent record leaves before a bulk record taken in
//! earlier), peers carry some, a restart replays the spool. So a plain
//! high-water mark would drop late records as duplicates. Instead each
//! origin keeps the set of numbers seen as disjoint ranges, which merge as
//! the gaps fill: in steady state a handful of ranges per origin. The gaps
//! open at once are bounded (`max_ranges` per origin); past the bound the
//! lowest range is forgotten and the origin's floor rises to its end. A
//! record below the floor cannot be told apart and is handed on as
//! [`Verdict::Unverified`] (counted): the consumer may see it twice, but
//! never loses it.

use std::collections::{BTreeMap, HashMap};

use crate::record::NodeId;

/// Ranges of sequence numbers kept per origin by default: 16,384 gaps
/// (256 KiB at most per origin), more than a spool replay or a class a
/// minute behind opens at edge rates.
pub const DEFAULT_MAX_RANGES: usize = 16_384;

/// What to do with a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not seen before: hand it on.
    New,
    /// Seen before: drop it.
    Duplicate,
    /// Below what is remembered for its origin: hand it on, it may be a
    /// duplicate.
    Unverified,
}

/// What one origin's numbers look like: everything below `floor` is
/// forgotten; `ranges` maps the start of each run of seen numbers to its
/// end (exclusive), runs disjoint and not adjacent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OriginSeen {
    /// Numbers below this are not remembered.
    pub floor: u64,
    /// Seen numbers at or above `floor`: start -> end (exclusive).
    pub ranges: BTreeMap<u64, u64>,
}

/// Counts of what [`Dedupe::admit`] said.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DedupeCounts {
    /// Records handed on.
    pub new: u64,
    /// Records dropped as duplicates.
    pub duplicates: u64,
    /// Records handed on without being able to tell.
    pub unverified: u64,
}

/// The deduplicator: per origin, the numbers seen.
#[derive(Debug, Clone)]
pub struct Dedupe {
    origins: HashMap<NodeId, OriginSeen>,
    max_ranges: usize,
    counts: DedupeCounts,
}

impl Dedupe {
    /// A deduplicator keeping at most `max_ranges` runs per origin (at
    /// least 1).
    pub fn new(max_ranges: usize) -> Dedupe {
        Dedupe {
            origins: HashMap::new(),
            max_ranges: max_ranges.max(1),
            counts: DedupeCounts::default(),
        }
    }

    /// Whether `(origin, seq)` is new; remembers it.
    pub fn admit(&mut self, origin: NodeId, seq: u64) -> Verdict {
        let seen = self.origins.entry(origin).or_default();
        let verdict = seen.admit(seq, self.max_ranges);
        match verdict {
            Verdict::New => self.counts.new += 1,
            Verdict::Duplicate => self.counts.duplicates += 1,
            Verdict::Unverified => self.counts.unverified += 1,
        }
        verdict
    }

    /// What was said so far.
    pub fn counts(&self) -> DedupeCounts {
        self.counts
    }

    /// Every origin's state, to be stored (`weir consume --state`).
    pub fn origins(&self) -> impl Iterator<Item = (NodeId, &OriginSeen)> {
        self.origins.iter().map(|(o, s)| (*o, s))
    }

    /// Restores a stored state (and its counts).
    pub fn restore(
        &mut self,
        origins: impl IntoIterator<Item = (NodeId, OriginSeen)>,
        counts: DedupeCounts,
    ) {
        self.origins = origins.into_iter().collect();
        self.counts = counts;
    }

    /// Runs remembered in all, for memory accounting.
    pub fn ranges(&self) -> usize {
        self.origins.values().map(|s| s.ranges.len()).sum()
    }
}

impl OriginSeen {
    fn admit(&mut self, seq: u64, max_ranges: usize) -> Verdict {
        if seq < self.floor {
            return Verdict::Unverified;
        }
        // The run starting at or before `seq`, if any.
        let before = self.ranges.range(..=seq).next_back().map(|(&s, &e)| (s, e));
        if let Some((_, end)) = before {
            if seq < end {
                return Verdict::Duplicate;
            }
        }
        let next = seq.checked_add(1);
        let after = next.and_then(|n| self.ranges.get(&n).copied());
        match (before, after) {
            (Some((start, end)), Some(after_end)) if end == seq => {
                // Fills the gap between two runs: they become one.
                self.ranges.remove(&seq.wrapping_add(1));
                self.ranges.insert(start, after_end);
            }
            (Some((start, end)), _) if end == seq => {
                self.ranges.insert(start, seq.saturating_add(1));
            }
            (_, Some(after_end)) => {
                self.ranges.remove(&seq.wrapping_add(1));
                self.ranges.insert(seq, after_end);
            }
            _ => {
                self.ranges.insert(seq, seq.saturating_add(1));
            }
        }
        while self.ranges.len() > max_ranges {
            let (_, end) = self.ranges.pop_first().expect("more than one");
            self.floor = end;
        }
        Verdict::New
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    #[test]
    fn a_copy_is_dropped_and_late_records_are_not() {
        let mut d = Dedupe::new(8);
        // The urgent class overtakes: 5 and 6 first, 1..=4 later.
        for seq in [5, 6, 1, 2, 3, 4] {
            assert_eq!(d.admit(1, seq), Verdict::New, "{seq}");
        }
        for seq in [1, 4, 6] {
            assert_eq!(d.admit(1, seq), Verdict::Duplicate, "{seq}");
        }
        assert_eq!(d.admit(2, 1), Verdict::New, "origins are apart");
        assert_eq!(d.ranges(), 2, "1..=6 merged into one run, one for origin 2");
        assert_eq!(
            d.counts(),
            DedupeCounts {
                new: 7,
                duplicates: 3,
                unverified: 0
            }
        );
    }

    #[test]
    fn past_the_bound_the_oldest_gap_is_forgotten_not_guessed() {
        let mut d = Dedupe::new(2);
        for seq in [10, 20, 30] {
            d.admit(1, seq);
        }
        // Three runs for a bound of two: the lowest (10) is forgotten.
        assert_eq!(d.ranges(), 2);
        assert_eq!(d.admit(1, 5), Verdict::Unverified, "below the floor");
        assert_eq!(d.admit(1, 10), Verdict::Unverified, "forgotten");
        assert_eq!(d.admit(1, 15), Verdict::New, "above the floor, unseen");
        assert_eq!(d.admit(1, 20), Verdict::Duplicate);
    }

    proptest! {
        /// Whatever the order and the copies, with room for every gap each
        /// number is handed on exactly once; with a bound, never lost
        /// (handed on at least once) and memory stays within the bound.
        #[test]
        fn every_record_is_handed_on_once(
            seqs in proptest::collection::vec(0u64..300, 1..600),
            max in 1usize..64,
        ) {
            let mut roomy = Dedupe::new(usize::MAX);
            let mut bounded = Dedupe::new(max);
            let mut handed = HashSet::new();
            let mut handed_bounded = HashSet::new();
            for &s in &seqs {
                if roomy.admit(9, s) == Verdict::New {
                    prop_assert!(handed.insert(s), "{s} handed on twice");
                }
                if bounded.admit(9, s) != Verdict::Duplicate {
                    handed_bounded.insert(s);
                }
                prop_assert!(bounded.ranges() <= max);
            }
            let all: HashSet<u64> = seqs.iter().copied().collect();
            prop_assert_eq!(&handed, &all);
            prop_assert_eq!(&handed_bounded, &all, "the bounded one lost none");
        }
    }
}
