//! Which records of a class's log have been released (delivered, or handed
//! to a peer that confirmed delivery), as a low-water mark and a bitmap of
//! the releases above it.

use std::collections::VecDeque;

/// Released indices of one log: everything below [`Released::low_water`],
/// and a bitmap of out-of-order releases above it. Releases come nearly in
/// order (batches confirm in order; only peers and retries reorder), so the
/// bitmap stays as short as the records in flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    /// Index of bit 0 of `words[0]`; a multiple of 64.
    base: u64,
    /// Bit `i` of word `w`: index `base + 64 w + i` is released.
    words: VecDeque<u64>,
    /// Every index below this is released.
    low_water: u64,
}

impl Released {
    /// Nothing released at or above `low_water`.
    pub fn new(low_water: u64) -> Self {
        let base = low_water & !63;
        let mut words = VecDeque::new();
        if low_water > base {
            words.push_back((1u64 << (low_water - base)) - 1);
        }
        Released {
            base,
            words,
            low_water,
        }
    }

    /// Every index below this is released.
    pub fn low_water(&self) -> u64 {
        self.low_water
    }

    /// Whether `index` is released.
    pub fn is_released(&self, index: u64) -> bool {
        if index < self.low_water {
            return true;
        }
        let off = index - self.base;
        self.words
            .get((off / 64) as usize)
            .is_some_and(|w| w & (1 << (off % 64)) != 0)
    }

    /// Marks `index` released; returns whether it was not already.
    pub fn release(&mut self, index: u64) -> bool {
        if self.is_released(index) {
            return false;
        }
        let off = index - self.base;
        let word = (off / 64) as usize;
        if word >= self.words.len() {
            self.words.resize(word + 1, 0);
        }
        self.words[word] |= 1 << (off % 64);
        self.advance();
        true
    }

    /// Marks everything below `index` released (records dropped by
    /// policy); returns how many were not already.
    pub fn release_below(&mut self, index: u64) -> u64 {
        let mut newly = 0;
        while self.low_water < index {
            let off = self.low_water - self.base;
            let word = (off / 64) as usize;
            if word >= self.words.len() {
                // Nothing above is marked: jump.
                newly += index - self.low_water;
                self.words.clear();
                self.base = index & !63;
                if index > self.base {
                    self.words.push_back((1u64 << (index - self.base)) - 1);
                }
                self.low_water = index;
                break;
            }
            if self.words[word] & (1 << (off % 64)) == 0 {
                self.words[word] |= 1 << (off % 64);
                newly += 1;
            }
            self.advance();
        }
        newly
    }

    /// Indices above the low-water mark that are released, ascending: what
    /// a checkpoint records besides the mark.
    pub fn above(&self) -> impl Iterator<Item = u64> + '_ {
        self.words.iter().enumerate().flat_map(move |(w, &bits)| {
            (0..64)
                .filter(move |i| bits & (1 << i) != 0)
                .map(move |i| self.base + 64 * w as u64 + i)
                .filter(move |&i| i >= self.low_water)
        })
    }

    fn advance(&mut self) {
        while let Some(&front) = self.words.front() {
            if front == u64::MAX {
                self.words.pop_front();
                self.base += 64;
            } else {
                break;
            }
        }
        self.low_water = self.base + self.words.front().map_or(0, |w| w.trailing_ones() as u64);
        if self.words.len() == 1 && self.words[0] == 0 {
            self.words.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn in_order_releases_move_the_mark_and_keep_no_bitmap() {
        let mut r = Released::new(5);
        for i in 5..200 {
            assert!(r.release(i));
        }
        assert_eq!(r.low_water(), 200);
        assert!(r.words.len() <= 1);
        assert!(!r.release(7));
    }

    #[test]
    fn out_of_order_releases_wait_for_the_gap() {
        let mut r = Released::new(0);
        r.release(2);
        r.release(1);
        assert_eq!(r.low_water(), 0);
        assert_eq!(r.above().collect::<Vec<_>>(), vec![1, 2]);
        r.release(0);
        assert_eq!(r.low_water(), 3);
        assert_eq!(r.above().count(), 0);
    }

    proptest! {
        #[test]
        fn matches_a_set(start in 0u64..300, ops in proptest::collection::vec((0u64..400, any::<bool>()), 0..300)) {
            let mut r = Released::new(start);
            let mut set: std::collections::BTreeSet<u64> = (0..start).collect();
            for (i, below) in ops {
                if below {
                    let newly = r.release_below(i);
                    let before = set.len();
                    set.extend(0..i);
                    prop_assert_eq!(newly, (set.len() - before) as u64);
                } else {
                    prop_assert_eq!(r.release(i), set.insert(i));
                }
                let mark = (0..).find(|i| !set.contains(i)).unwrap();
                prop_assert_eq!(r.low_water(), mark);
                let above: Vec<u64> = set.range(mark..).copied().collect();
                prop_assert_eq!(r.above().collect::<Vec<_>>(), above);
                for i in 0..420 {
                    prop_assert_eq!(r.is_released(i), set.contains(&i));
                }
            }
        }
    }
}
