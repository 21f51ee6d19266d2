//! BWAllocator: JANUS Algorithm 2 and Eq. 22, generalised from the paper's
//! three classes (`ls`, `nm`, `lt`) to any number, most urgent first.
//!
//! Strict priority as in the paper: class 0 takes what it needs (up to
//! `C_out`), class 1 takes what it needs from the rest, and so on; whatever
//! is left once every demand is met goes back to class 0 (Algorithm 2 line
//! 11, `V_ls += freebw`). Classes that got less than they need produce a
//! shortage (a negative entry) in the [`BandwidthTuple`]; the leftover on
//! class 0 is the node's spare (a positive entry).
//!
//! One addition, off by default: a minimum share per class. Before strict
//! priority runs, class `c` is given `min(bw_c, min_share_c * C_out)`, so a
//! busy urgent class can no longer take the whole link from the classes
//! below it. JANUS names this starvation as its gap (Section VI, "Fairness":
//! its implementation "does not consider fairness scheduling among
//! different queues"). With every share at 0 the result is exactly the
//! paper's.

use crate::class::{ClassId, ClassSet};

use super::error::{non_negative, JanusError};

/// What one class saw over the last counting window (JANUS Algorithm 1
/// line 3 and Section IV-A).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ClassLoad {
    /// `Lambda_c`: units per second that arrived over the window.
    pub arrival_rate: f64,
    /// `Size(q_c)`: units waiting in the class queue at the window's end.
    pub backlog: f64,
}

impl ClassLoad {
    /// A load of `arrival_rate` units/s with `backlog` units queued.
    pub fn new(arrival_rate: f64, backlog: f64) -> Self {
        ClassLoad {
            arrival_rate,
            backlog,
        }
    }

    /// `s_c = t * Lambda_c + Size(q_c)` (Section IV-A): the volume passing
    /// through the queue over a window of `window_secs`. Negative or
    /// non-finite inputs count as 0.
    #[inline]
    pub fn volume(&self, window_secs: f64) -> f64 {
        non_negative(non_negative(self.arrival_rate) * window_secs + non_negative(self.backlog))
    }
}

/// Eq. 22 of JANUS: the rate class `c` needs so that what it holds now and
/// what will pile up over the next window clears within its bound,
/// `bw_c = (s_c + (Lambda_c - V_c) * t) / delta_c + V_c`.
///
/// The result is clamped to `>= 0`. A class holding more than it needs
/// (`V_c` well above `Lambda_c`) makes the projected accumulation
/// `(Lambda_c - V_c) * t` so negative that the formula goes below zero; a
/// negative rate means nothing physically, and fed to strict priority it
/// would *raise* the capacity left for the classes below past `C_out`. At 0
/// the class simply asks for nothing this window and its rate returns to
/// the pool; the next window's Eq. 1 estimate catches it if that was too
/// little (a `min_share` bounds how little it can get meanwhile).
///
/// Rewritten, `bw_c = V_c (1 - t / delta_c) + (s_c + Lambda_c t) / delta_c`:
/// with a window longer than the bound a *higher* current rate yields a
/// *lower* demand, so allocations can swing from window to window. A window
/// no longer than the smallest bound avoids that; at `t = delta_c` the
/// demand no longer depends on `V_c` at all.
#[inline]
pub fn demand(load: &ClassLoad, window_secs: f64, current_rate: f64, bound_secs: f64) -> f64 {
    let v = non_negative(current_rate);
    let s = load.volume(window_secs);
    let bw = (s + (non_negative(load.arrival_rate) - v) * window_secs) / bound_secs + v;
    // NaN (a zero bound with nothing queued) and negatives both mean "needs nothing".
    non_negative(bw.min(f64::MAX))
}

/// Per-class output rates `V_c`, most urgent first (JANUS Table II).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Allocation {
    /// `V_c` in units per second; never negative, summing to at most `C_out`.
    pub rates: Vec<f64>,
}

impl Allocation {
    /// `C_out / n` to every class: the starting point of Algorithm 1
    /// (Section V-A, "we evenly assign bandwidth to three queues").
    pub fn even(capacity: f64, classes: usize) -> Self {
        let each = if classes == 0 {
            0.0
        } else {
            non_negative(capacity) / classes as f64
        };
        let mut rates = vec![each; classes];
        fit_within(&mut rates, non_negative(capacity));
        Allocation { rates }
    }

    /// The rate of one class (0 for a class this allocation does not have).
    #[inline]
    pub fn rate(&self, class: ClassId) -> f64 {
        self.rates.get(class.index()).copied().unwrap_or(0.0)
    }

    /// `V = sum V_c`, the node's total output rate.
    pub fn total(&self) -> f64 {
        self.rates.iter().sum()
    }

    /// Number of classes.
    pub fn len(&self) -> usize {
        self.rates.len()
    }

    /// True when there are no classes.
    pub fn is_empty(&self) -> bool {
        self.rates.is_empty()
    }
}

/// JANUS's bandwidth tuple `(b_ls, b_nm, b_lt)` for N classes (Section
/// V-B1): entry `c` is `V_c - bw_c`, negative for a shortage the node asks
/// neighbours to absorb, positive for spare it can lend.
///
/// After a reallocation only class 0 can hold spare (the leftover of
/// Algorithm 2 line 11): E2 of Fig. 4 with allocation `[18, 10, 2]`
/// advertises `[8, 0, 0]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BandwidthTuple(pub Vec<f64>);

impl BandwidthTuple {
    /// Shortages as positive amounts with their class, most urgent first
    /// (the classes PMRFS serves first).
    pub fn shortages(&self) -> impl Iterator<Item = (ClassId, f64)> + '_ {
        self.0
            .iter()
            .enumerate()
            .filter(|&(c, &b)| b < 0.0 && b.is_finite() && c <= u8::MAX as usize)
            .map(|(c, &b)| (ClassId(c as u8), -b))
    }

    /// Total spare: the sum of the positive entries, what the node offers.
    pub fn spare_total(&self) -> f64 {
        self.0.iter().map(|&b| non_negative(b)).sum()
    }

    /// Total shortage: the sum of the negative entries, as a positive amount.
    pub fn shortage_total(&self) -> f64 {
        self.0.iter().map(|&b| non_negative(-b)).sum()
    }

    /// The entries, most urgent class first.
    pub fn as_slice(&self) -> &[f64] {
        &self.0
    }
}

/// What [`BwAllocator`] decided for one window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reallocation {
    /// The new `V_c`.
    pub allocation: Allocation,
    /// `V_c - bw_c` per class: the node's request (negative) / offer
    /// (positive), Algorithm 2's `BWRequest`.
    pub tuple: BandwidthTuple,
    /// `bw_c` from Eq. 22 (clamped to `>= 0`), what each class asked for.
    pub demand: Vec<f64>,
}

/// JANUS Algorithm 2 (BWAllocator) for N classes with optional minimum
/// shares.
#[derive(Debug, Clone, PartialEq)]
pub struct BwAllocator {
    bounds_secs: Vec<f64>,
    min_shares: Vec<f64>,
}

/// Slack allowed on the sum of minimum shares, matching
/// [`ClassSet::new`]'s so that shares which round past 1.0 are accepted.
const SHARE_SUM_SLACK: f64 = 1e-9;

impl BwAllocator {
    /// An allocator for classes with these bounds `delta_c` (seconds) and
    /// minimum shares (fractions of `C_out`, 0 for the paper's behaviour).
    pub fn new(bounds_secs: Vec<f64>, min_shares: Vec<f64>) -> Result<Self, JanusError> {
        if bounds_secs.is_empty() {
            return Err(JanusError::NoClasses);
        }
        if min_shares.len() != bounds_secs.len() {
            return Err(JanusError::ClassCount {
                expected: bounds_secs.len(),
                got: min_shares.len(),
            });
        }
        if let Some((class, &bound)) = bounds_secs
            .iter()
            .enumerate()
            .find(|(_, b)| !(b.is_finite() && **b > 0.0))
        {
            return Err(JanusError::BadBound { class, bound });
        }
        if let Some((class, &share)) = min_shares
            .iter()
            .enumerate()
            .find(|(_, s)| !(0.0..=1.0).contains(*s))
        {
            return Err(JanusError::BadShare { class, share });
        }
        let sum: f64 = min_shares.iter().sum();
        if sum > 1.0 + SHARE_SUM_SLACK {
            return Err(JanusError::SharesExceedOne(sum));
        }
        Ok(BwAllocator {
            bounds_secs,
            min_shares,
        })
    }

    /// The allocator for a validated class set (its bounds and shares).
    pub fn from_classes(classes: &ClassSet) -> Self {
        // A ClassSet has already checked what `new` checks.
        BwAllocator {
            bounds_secs: classes.bounds_secs(),
            min_shares: classes.min_shares(),
        }
    }

    /// The same bounds with every minimum share at 0: the paper's Algorithm 2.
    pub fn strict(bounds_secs: Vec<f64>) -> Result<Self, JanusError> {
        let shares = vec![0.0; bounds_secs.len()];
        Self::new(bounds_secs, shares)
    }

    /// Number of classes.
    pub fn len(&self) -> usize {
        self.bounds_secs.len()
    }

    /// Always false: an allocator has at least one class.
    pub fn is_empty(&self) -> bool {
        self.bounds_secs.is_empty()
    }

    /// `delta_c` of every class, in seconds.
    pub fn bounds_secs(&self) -> &[f64] {
        &self.bounds_secs
    }

    /// The minimum share of every class.
    pub fn min_shares(&self) -> &[f64] {
        &self.min_shares
    }

    /// Eq. 22 for every class, given the loads, the window `t` and the
    /// current allocation `V`.
    pub fn demands(
        &self,
        loads: &[ClassLoad],
        window_secs: f64,
        current: &[f64],
    ) -> Result<Vec<f64>, JanusError> {
        self.check_len(loads.len())?;
        self.check_len(current.len())?;
        check_window(window_secs)?;
        Ok(loads
            .iter()
            .zip(current)
            .zip(&self.bounds_secs)
            .map(|((load, &v), &bound)| demand(load, window_secs, v, bound))
            .collect())
    }

    /// Algorithm 2 in full: Eq. 22 demands from the loads, then
    /// [`allocate_demand`](Self::allocate_demand).
    pub fn allocate(
        &self,
        loads: &[ClassLoad],
        window_secs: f64,
        current: &[f64],
        capacity: f64,
    ) -> Result<Reallocation, JanusError> {
        let demand = self.demands(loads, window_secs, current)?;
        self.allocate_demand(demand, capacity)
    }

    /// Algorithm 2 lines 4-25 given the demands `bw_c`: minimum shares
    /// first, then strict priority, then the leftover to class 0.
    ///
    /// The rates are never negative and their sum never exceeds `capacity`.
    pub fn allocate_demand(
        &self,
        demand: Vec<f64>,
        capacity: f64,
    ) -> Result<Reallocation, JanusError> {
        self.check_len(demand.len())?;
        check_capacity(capacity)?;
        let mut demand = demand;
        demand.iter_mut().for_each(|d| *d = non_negative(*d));

        let n = demand.len();
        let mut rates = vec![0.0; n];
        let mut tuple = vec![0.0; n];
        let mut remaining = capacity;

        // Reserved shares, only up to what the class asks for: a share is a
        // floor under demand, never a grant to an idle class.
        for c in 0..n {
            let reserve = demand[c].min(self.min_shares[c] * capacity).min(remaining);
            rates[c] = reserve;
            remaining = non_negative(remaining - reserve);
        }

        // Strict priority over what the reservations left.
        for c in 0..n {
            let needed = non_negative(demand[c] - rates[c]);
            if needed <= remaining {
                // Set exactly, so a satisfied class reports 0, not rounding residue.
                rates[c] = demand[c];
                remaining = non_negative(remaining - needed);
            } else {
                rates[c] += remaining;
                tuple[c] = -(needed - remaining);
                remaining = 0.0;
            }
        }

        // Algorithm 2 line 11: V_ls += freebw; that leftover is the spare.
        rates[0] += remaining;
        tuple[0] += remaining;

        let before = rates.clone();
        fit_within(&mut rates, capacity);
        for c in 0..n {
            // Whatever rounding trimmed off a rate is no longer spare (or is
            // more shortage).
            tuple[c] -= before[c] - rates[c];
        }

        Ok(Reallocation {
            allocation: Allocation { rates },
            tuple: BandwidthTuple(tuple),
            demand,
        })
    }

    fn check_len(&self, got: usize) -> Result<(), JanusError> {
        if got == self.len() {
            Ok(())
        } else {
            Err(JanusError::ClassCount {
                expected: self.len(),
                got,
            })
        }
    }
}

/// `Ok` for a finite, non-negative outbound capacity.
pub(crate) fn check_capacity(capacity: f64) -> Result<(), JanusError> {
    if capacity.is_finite() && capacity >= 0.0 {
        Ok(())
    } else {
        Err(JanusError::BadCapacity(capacity))
    }
}

/// `Ok` for a finite, positive counting window.
pub(crate) fn check_window(window_secs: f64) -> Result<(), JanusError> {
    if window_secs.is_finite() && window_secs > 0.0 {
        Ok(())
    } else {
        Err(JanusError::BadWindow(window_secs))
    }
}

/// Trims non-negative `rates` until `rates.iter().sum() <= capacity` holds
/// exactly: subtraction chains can round the sum a few ulps past
/// `C_out`, and a token bucket set from it would then overrun the link.
///
/// Each step lowers the largest rate by the excess (at least one ulp), and
/// float addition is monotone, so the sum falls every step and reaches
/// `capacity` (at worst all rates 0) in practice within one or two steps.
pub(crate) fn fit_within(rates: &mut [f64], capacity: f64) {
    loop {
        let total: f64 = rates.iter().sum();
        if total <= capacity {
            return;
        }
        let excess = total - capacity;
        let Some(largest) = rates.iter_mut().max_by(|a, b| a.total_cmp(b)) else {
            return;
        };
        let trimmed = *largest - excess;
        *largest = if trimmed < *largest {
            non_negative(trimmed)
        } else {
            non_negative(largest.next_down())
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn janus3() -> BwAllocator {
        BwAllocator::strict(vec![0.1, 0.5, 1.0]).unwrap()
    }

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| (x - y).abs() <= 1e-9 * (1.0 + x.abs().max(y.abs())))
    }

    #[test]
    fn eq22_matches_hand_computation() {
        // s = 1 * 50 + 10 = 60; bw = (60 + (50 - 20) * 1) / 0.5 + 20 = 200.
        let load = ClassLoad::new(50.0, 10.0);
        assert_eq!(load.volume(1.0), 60.0);
        assert_eq!(demand(&load, 1.0, 20.0, 0.5), 200.0);
    }

    #[test]
    fn eq22_is_clamped_at_zero_for_an_overprovisioned_class() {
        // (0 + (0 - 10) * 1) / 0.1 + 10 = -90: needs nothing, not "minus 90".
        assert_eq!(demand(&ClassLoad::new(0.0, 0.0), 1.0, 10.0, 0.1), 0.0);
        assert_eq!(demand(&ClassLoad::new(f64::NAN, -3.0), 1.0, 0.0, 0.1), 0.0);
    }

    #[test]
    fn all_fit_leftover_goes_to_the_top_class() {
        // Fig. 4's E2: needs [10, 10, 2] of 30, ends at [18, 10, 2] offering [8, 0, 0].
        let r = janus3()
            .allocate_demand(vec![10.0, 10.0, 2.0], 30.0)
            .unwrap();
        assert_eq!(r.allocation.rates, vec![18.0, 10.0, 2.0]);
        assert_eq!(r.tuple, BandwidthTuple(vec![8.0, 0.0, 0.0]));
        assert_eq!(r.tuple.spare_total(), 8.0);
        assert_eq!(r.tuple.shortages().count(), 0);
    }

    #[test]
    fn lt_short_requests_only_lt() {
        // Fig. 4's E1: needs [10, 10, 15] of 30, ends at [10, 10, 10] asking [0, 0, -5].
        let r = janus3()
            .allocate_demand(vec![10.0, 10.0, 15.0], 30.0)
            .unwrap();
        assert_eq!(r.allocation.rates, vec![10.0, 10.0, 10.0]);
        assert_eq!(r.tuple, BandwidthTuple(vec![0.0, 0.0, -5.0]));
        assert_eq!(
            r.tuple.shortages().collect::<Vec<_>>(),
            vec![(ClassId(2), 5.0)]
        );
    }

    #[test]
    fn nm_short_takes_the_rest_and_lt_gets_nothing() {
        // Algorithm 2 lines 18-19: V_nm = C - V_ls, V_lt = 0, request (0, V_nm - bw_nm, -bw_lt).
        let r = janus3()
            .allocate_demand(vec![10.0, 25.0, 5.0], 30.0)
            .unwrap();
        assert_eq!(r.allocation.rates, vec![10.0, 20.0, 0.0]);
        assert_eq!(r.tuple, BandwidthTuple(vec![0.0, -5.0, -5.0]));
        assert_eq!(r.tuple.shortage_total(), 10.0);
    }

    #[test]
    fn ls_alone_exceeding_capacity_takes_everything() {
        // Algorithm 2 lines 23-24: V = (C, 0, 0), request (C - bw_ls, -bw_nm, -bw_lt).
        let r = janus3()
            .allocate_demand(vec![40.0, 5.0, 5.0], 30.0)
            .unwrap();
        assert_eq!(r.allocation.rates, vec![30.0, 0.0, 0.0]);
        assert_eq!(r.tuple, BandwidthTuple(vec![-10.0, -5.0, -5.0]));
    }

    #[test]
    fn five_classes_in_strict_priority() {
        let a = BwAllocator::strict(vec![0.05, 0.1, 0.5, 1.0, 5.0]).unwrap();
        let r = a
            .allocate_demand(vec![10.0, 20.0, 30.0, 40.0, 50.0], 75.0)
            .unwrap();
        assert_eq!(r.allocation.rates, vec![10.0, 20.0, 30.0, 15.0, 0.0]);
        assert_eq!(r.tuple, BandwidthTuple(vec![0.0, 0.0, 0.0, -25.0, -50.0]));
        let r = a
            .allocate_demand(vec![1.0, 2.0, 3.0, 4.0, 5.0], 75.0)
            .unwrap();
        assert_eq!(r.allocation.rates, vec![61.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(r.tuple, BandwidthTuple(vec![60.0, 0.0, 0.0, 0.0, 0.0]));
    }

    #[test]
    fn min_shares_prevent_starvation() {
        let strict = janus3();
        let shared = BwAllocator::new(vec![0.1, 0.5, 1.0], vec![0.0, 0.2, 0.1]).unwrap();
        let demand = vec![100.0, 50.0, 50.0];
        // Paper: ls takes the whole link, nm and lt starve.
        let r = strict.allocate_demand(demand.clone(), 30.0).unwrap();
        assert_eq!(r.allocation.rates, vec![30.0, 0.0, 0.0]);
        // With shares: nm keeps 20% of C, lt 10%, ls the rest.
        let r = shared.allocate_demand(demand, 30.0).unwrap();
        assert!(close(&r.allocation.rates, &[21.0, 6.0, 3.0]));
        assert!(close(&r.tuple.0, &[-79.0, -44.0, -47.0]));
    }

    #[test]
    fn min_share_is_not_reserved_for_an_idle_class() {
        let a = BwAllocator::new(vec![0.1, 0.5, 1.0], vec![0.0, 0.5, 0.0]).unwrap();
        let r = a.allocate_demand(vec![40.0, 0.0, 5.0], 30.0).unwrap();
        assert_eq!(r.allocation.rates, vec![30.0, 0.0, 0.0]);
        // A share below the class's demand still leaves the rest to strict priority.
        let r = a.allocate_demand(vec![10.0, 5.0, 5.0], 30.0).unwrap();
        assert_eq!(r.allocation.rates, vec![20.0, 5.0, 5.0]);
    }

    #[test]
    fn allocate_runs_eq22_then_algorithm_2() {
        let a = janus3();
        let loads = [
            ClassLoad::new(5.0, 0.0),
            ClassLoad::new(10.0, 0.0),
            ClassLoad::new(0.0, 0.0),
        ];
        // bw_ls = (5 + (5 - 10)) / 0.1 + 10 = 10; bw_nm = (10 + 0) / 0.5 + 10 = 30;
        // bw_lt = (0 - 10) / 1 + 10 = 0.
        let r = a.allocate(&loads, 1.0, &[10.0, 10.0, 10.0], 30.0).unwrap();
        assert_eq!(r.demand, vec![10.0, 30.0, 0.0]);
        assert_eq!(r.allocation.rates, vec![10.0, 20.0, 0.0]);
        assert_eq!(r.tuple, BandwidthTuple(vec![0.0, -10.0, 0.0]));
    }

    #[test]
    fn bad_parameters_are_errors_not_panics() {
        assert_eq!(BwAllocator::strict(vec![]), Err(JanusError::NoClasses));
        assert_eq!(
            BwAllocator::strict(vec![0.1, 0.0]),
            Err(JanusError::BadBound {
                class: 1,
                bound: 0.0
            })
        );
        assert!(matches!(
            BwAllocator::new(vec![0.1, 1.0], vec![0.7, 0.6]),
            Err(JanusError::SharesExceedOne(_))
        ));
        assert_eq!(
            BwAllocator::new(vec![0.1], vec![1.5]),
            Err(JanusError::BadShare {
                class: 0,
                share: 1.5
            })
        );
        let a = janus3();
        assert_eq!(
            a.allocate_demand(vec![1.0], 10.0),
            Err(JanusError::ClassCount {
                expected: 3,
                got: 1
            })
        );
        assert!(matches!(
            a.allocate_demand(vec![1.0; 3], f64::NAN),
            Err(JanusError::BadCapacity(_))
        ));
        assert_eq!(
            a.allocate(&[ClassLoad::default(); 3], 0.0, &[0.0; 3], 1.0),
            Err(JanusError::BadWindow(0.0))
        );
    }

    #[test]
    fn from_classes_uses_bounds_and_shares() {
        let a = BwAllocator::from_classes(&ClassSet::janus_default());
        assert_eq!(a.bounds_secs(), &[0.1, 0.5, 1.0]);
        assert_eq!(a.min_shares(), &[0.0, 0.0, 0.0]);
    }

    #[test]
    fn fit_within_removes_rounding_excess() {
        let mut rates = vec![0.1, 0.2, 0.3 + 1e-16];
        fit_within(&mut rates, 0.6);
        assert!(rates.iter().sum::<f64>() <= 0.6);
        assert!(rates.iter().all(|&r| r >= 0.0));
    }

    /// Algorithm 2 transcribed line by line for three classes.
    fn paper_algorithm_2(bw: [f64; 3], c: f64) -> ([f64; 3], [f64; 3]) {
        if bw[0] <= c {
            let ls = bw[0];
            if bw[1] <= c - ls {
                let nm = bw[1];
                if bw[2] <= c - ls - nm {
                    let lt = bw[2];
                    let free = c - ls - nm - lt;
                    ([ls + free, nm, lt], [free, 0.0, 0.0])
                } else {
                    let lt = c - ls - nm;
                    ([ls, nm, lt], [0.0, 0.0, lt - bw[2]])
                }
            } else {
                let nm = c - ls;
                ([ls, nm, 0.0], [0.0, nm - bw[1], -bw[2]])
            }
        } else {
            ([c, 0.0, 0.0], [c - bw[0], -bw[1], -bw[2]])
        }
    }

    fn shares_strategy(n: usize) -> impl Strategy<Value = Vec<f64>> {
        prop::collection::vec(0.0f64..1.0, n).prop_map(|raw| {
            let sum: f64 = raw.iter().sum::<f64>() * 1.5;
            if sum <= 1.0 {
                raw
            } else {
                raw.iter().map(|s| s / sum).collect()
            }
        })
    }

    proptest! {
        #[test]
        fn zero_shares_reproduce_the_paper(
            bw in prop::array::uniform3(0.0f64..1e6),
            c in 0.0f64..2e6,
        ) {
            let r = janus3().allocate_demand(bw.to_vec(), c).unwrap();
            let (v, t) = paper_algorithm_2(bw, c);
            prop_assert!(close(&r.allocation.rates, &v), "{:?} vs {:?}", r.allocation.rates, v);
            prop_assert!(close(&r.tuple.0, &t), "{:?} vs {:?}", r.tuple.0, t);
        }

        #[test]
        fn allocations_stay_within_capacity(
            (loads, current, bounds, shares) in (1usize..=16).prop_flat_map(|n| (
                prop::collection::vec((0.0f64..1e7, 0.0f64..1e7), n),
                prop::collection::vec(0.0f64..1e7, n),
                prop::collection::vec(1e-3f64..10.0, n),
                shares_strategy(n),
            )),
            window in 1e-3f64..10.0,
            capacity in 0.0f64..1e8,
        ) {
            let a = BwAllocator::new(bounds, shares.clone()).unwrap();
            let loads: Vec<ClassLoad> =
                loads.into_iter().map(|(l, q)| ClassLoad::new(l, q)).collect();
            let r = a.allocate(&loads, window, &current, capacity).unwrap();
            prop_assert!(r.allocation.rates.iter().all(|&v| v >= 0.0 && v.is_finite()));
            prop_assert!(r.allocation.total() <= capacity);
            for (c, share) in shares.iter().enumerate() {
                let bw = r.demand[c];
                let v = r.allocation.rates[c];
                prop_assert!(bw >= 0.0);
                let slack = 1e-9 * (1.0 + capacity + bw);
                // The tuple is V - bw.
                prop_assert!((r.tuple.0[c] - (v - bw)).abs() <= slack);
                // Every class keeps its share of what it asked for.
                prop_assert!(v + slack >= bw.min(share * capacity));
                // Only the top class ever holds more than it asked for.
                if c > 0 {
                    prop_assert!(v <= bw + slack);
                }
            }
        }
    }
}
