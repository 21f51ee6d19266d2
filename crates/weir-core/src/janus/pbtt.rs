//! PBTT, Priority Based Throughput Throttle: JANUS Algorithm 1 with the
//! delay and throughput estimates of Eq. 1-3.
//!
//! Every counting window the caller hands in what each class saw
//! ([`ClassLoad`]); PBTT estimates each class's queuing delay
//! `d_c = s_c / V_c + epsilon` (Eq. 1) and, if any exceeds its bound
//! `delta_c`, reruns [`BwAllocator`] (Algorithm 2). Otherwise the allocation
//! stands (Algorithm 1 line 12, "return NULL").
//!
//! The node's [`BandwidthTuple`] is refreshed every window either way, since
//! it is what the node piggybacks on its heartbeat (Section V-B1). When the
//! allocation is kept, the node asks for nothing (in the paper only
//! BWAllocator issues `BWRequest`) and offers whatever each class holds
//! beyond its Eq. 22 demand.
//!
//! Two readings of the paper, both measured in the JANUS lab (docs/lab/janus.md):
//! - **`V_c` in Eq. 22 is the class's output rate** `tp_c = min(s_c/t, V_c)`
//!   (Eq. 2; Section III-B: "output rate is referred to as the outbound
//!   throughput"), not the rate allocated to it. With the allocated rate,
//!   Eq. 22 reads `V_c (1 - t/delta_c) + ...`, so an idle class "needs" most
//!   of whatever it was given: an idle node with an even split advertised
//!   0.95 of its 2.25 MB/s spare, and a busy node's `nm` kept 0.66 MB/s it
//!   never used while `lt` was short.
//! - **A projected shortage reallocates too.** Algorithm 1 reallocates when
//!   Eq. 1's delay estimate breaks a bound; that estimate ignores arrivals
//!   beyond the window, so a class whose input outruns its rate only trips
//!   it once its backlog alone takes `delta_c` to clear, i.e. once its
//!   records are already late. PBTT also reallocates when some class's
//!   Eq. 22 demand exceeds its allocation, which is the same test one
//!   window ahead; a node whose classes all fit still keeps its allocation.

use std::time::Duration;

use crate::class::ClassSet;

use super::allocator::{check_capacity, check_window, fit_within};
use super::allocator::{Allocation, BandwidthTuple, BwAllocator, ClassLoad};
use super::error::{non_negative, JanusError};
use super::redirect::{apply_grant, Grant};

/// A class's Eq. 22 demand may exceed its allocation by this fraction
/// before PBTT reallocates for it: measurement noise of one window does not
/// reshuffle the rates.
pub const PROJECTED_SLACK: f64 = 0.01;

/// Fixed parameters of one node's PBTT.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PbttConfig {
    /// `t`: the counting window, how often [`Pbtt::on_window`] is called.
    pub window: Duration,
    /// `epsilon` of Eq. 1: the node's own processing delay.
    pub processing_delay: Duration,
    /// `C_out`: outbound capacity in units per second (the link estimate).
    pub capacity: f64,
}

/// What one window of Algorithm 1 concluded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PbttDecision {
    /// True if some `d_c > delta_c` and BWAllocator ran.
    pub reallocated: bool,
    /// The allocation in force from now on (new or kept).
    pub allocation: Allocation,
    /// The node's request (negative) / offer (positive) per class.
    pub tuple: BandwidthTuple,
    /// `d_c` of Eq. 1 in seconds under the allocation the window ran with;
    /// infinite for a class with traffic and no rate.
    pub delays: Vec<f64>,
    /// Per class, whether `d_c > delta_c`.
    pub violated: Vec<bool>,
    /// `tp_c = min(s_c / t, V_c)` of Eq. 2-3, units per second, under the
    /// allocation the window ran with.
    pub throughput: Vec<f64>,
    /// `bw_c` of Eq. 22 (clamped to `>= 0`) with `V_c` = `tp_c`, the
    /// class's output rate over the window.
    pub demand: Vec<f64>,
}

impl PbttDecision {
    /// `tp = sum tp_c`, the node's throughput (Eq. 2).
    pub fn total_throughput(&self) -> f64 {
        self.throughput.iter().sum()
    }
}

/// JANUS Algorithm 1 for one node: its classes, window, capacity and the
/// current allocation.
#[derive(Debug, Clone)]
pub struct Pbtt {
    allocator: BwAllocator,
    window_secs: f64,
    epsilon_secs: f64,
    capacity: f64,
    allocation: Allocation,
    tuple: BandwidthTuple,
}

impl Pbtt {
    /// PBTT for these classes, starting from an even split of `C_out`
    /// (Section V-A) and an empty tuple.
    pub fn new(classes: &ClassSet, config: PbttConfig) -> Result<Self, JanusError> {
        Self::with_allocator(BwAllocator::from_classes(classes), config)
    }

    /// PBTT around an existing allocator (its bounds and shares).
    pub fn with_allocator(allocator: BwAllocator, config: PbttConfig) -> Result<Self, JanusError> {
        let window_secs = config.window.as_secs_f64();
        check_window(window_secs)?;
        check_capacity(config.capacity)?;
        let n = allocator.len();
        Ok(Pbtt {
            allocator,
            window_secs,
            epsilon_secs: config.processing_delay.as_secs_f64(),
            capacity: config.capacity,
            allocation: Allocation::even(config.capacity, n),
            tuple: BandwidthTuple(vec![0.0; n]),
        })
    }

    /// Algorithm 1 for the window just ended: estimate delays (Eq. 1) and
    /// throughput (Eq. 2-3), reallocate (Algorithm 2) if a bound is broken,
    /// and refresh the tuple.
    pub fn on_window(&mut self, loads: &[ClassLoad]) -> Result<PbttDecision, JanusError> {
        let n = self.allocator.len();
        if loads.len() != n {
            return Err(JanusError::ClassCount {
                expected: n,
                got: loads.len(),
            });
        }
        let t = self.window_secs;
        let mut delays = Vec::with_capacity(n);
        let mut violated = Vec::with_capacity(n);
        let mut throughput = Vec::with_capacity(n);
        for ((load, &v), &bound) in loads
            .iter()
            .zip(&self.allocation.rates)
            .zip(self.allocator.bounds_secs())
        {
            let s = load.volume(t);
            let d = if s <= 0.0 {
                // Nothing to send: no queuing, only processing.
                self.epsilon_secs
            } else if v > 0.0 {
                s / v + self.epsilon_secs
            } else {
                f64::INFINITY
            };
            delays.push(d);
            violated.push(d > bound);
            throughput.push((s / t).min(v));
        }

        // Eq. 22 against what each class actually put out (see the module
        // docs).
        let demand = self.allocator.demands(loads, t, &throughput)?;
        let projected_short = demand
            .iter()
            .zip(&self.allocation.rates)
            .any(|(bw, v)| *bw > v * (1.0 + PROJECTED_SLACK));
        let reallocated = projected_short || violated.iter().any(|&v| v);
        if reallocated {
            let r = self
                .allocator
                .allocate_demand(demand.clone(), self.capacity)?;
            self.allocation = r.allocation;
            self.tuple = r.tuple;
        } else {
            // Within bounds: offer what each class holds beyond its need,
            // ask for nothing.
            self.tuple = BandwidthTuple(
                self.allocation
                    .rates
                    .iter()
                    .zip(&demand)
                    .map(|(v, bw)| non_negative(v - bw))
                    .collect(),
            );
        }

        Ok(PbttDecision {
            reallocated,
            allocation: self.allocation.clone(),
            tuple: self.tuple.clone(),
            delays,
            violated,
            throughput,
            demand,
        })
    }

    /// A new link estimate `C_out`: the allocation is rescaled in proportion
    /// (an all-zero allocation restarts from the even split), so its sum
    /// never exceeds the new capacity.
    ///
    /// Spare in the tuple follows the change of its class's rate and never
    /// goes below 0; shortages are left for the next window to recompute,
    /// so the node never advertises spare it no longer has.
    pub fn set_capacity(&mut self, capacity: f64) -> Result<(), JanusError> {
        check_capacity(capacity)?;
        let old = std::mem::take(&mut self.allocation.rates);
        let total: f64 = old.iter().sum();
        let mut rates = if total > 0.0 {
            let scale = capacity / total;
            old.iter().map(|v| non_negative(v * scale)).collect()
        } else {
            Allocation::even(capacity, old.len()).rates
        };
        fit_within(&mut rates, capacity);
        for ((b, before), after) in self.tuple.0.iter_mut().zip(&old).zip(&rates) {
            if *b > 0.0 {
                *b = non_negative(*b + (after - before));
            }
        }
        self.allocation.rates = rates;
        self.capacity = capacity;
        Ok(())
    }

    /// Provider side of a grant (Fig. 4, Algorithm 3 `BWReserve`): move the
    /// granted amount from spare into the granted class's rate; returns the
    /// amount actually reserved (at most the spare left).
    pub fn apply_grant(&mut self, grant: &Grant) -> f64 {
        apply_grant(&mut self.allocation, &mut self.tuple, grant)
    }

    /// The allocation in force.
    pub fn allocation(&self) -> &Allocation {
        &self.allocation
    }

    /// The tuple of the last window (after any grants applied since).
    pub fn tuple(&self) -> &BandwidthTuple {
        &self.tuple
    }

    /// `C_out` in units per second.
    pub fn capacity(&self) -> f64 {
        self.capacity
    }

    /// The allocator (bounds and shares) PBTT calls.
    pub fn allocator(&self) -> &BwAllocator {
        &self.allocator
    }

    /// `t` in seconds.
    pub fn window_secs(&self) -> f64 {
        self.window_secs
    }

    /// `epsilon` in seconds.
    pub fn processing_delay_secs(&self) -> f64 {
        self.epsilon_secs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::class::ClassId;

    fn pbtt(capacity: f64) -> Pbtt {
        Pbtt::new(
            &ClassSet::janus_default(),
            PbttConfig {
                window: Duration::from_secs(1),
                processing_delay: Duration::from_millis(10),
                capacity,
            },
        )
        .unwrap()
    }

    #[test]
    fn starts_from_an_even_split() {
        let p = pbtt(30.0);
        assert_eq!(p.allocation().rates, vec![10.0, 10.0, 10.0]);
        assert_eq!(p.tuple(), &BandwidthTuple(vec![0.0; 3]));
    }

    #[test]
    fn keeps_the_allocation_while_every_bound_holds() {
        let mut p = pbtt(30.0);
        // d_ls = 0.5 / 10 + 0.01 = 0.06 <= 0.1; d_nm = 2 / 10 + 0.01 <= 0.5;
        // d_lt = 5 / 10 + 0.01 <= 1.
        let loads = [
            ClassLoad::new(0.5, 0.0),
            ClassLoad::new(2.0, 0.0),
            ClassLoad::new(5.0, 0.0),
        ];
        let d = p.on_window(&loads).unwrap();
        assert!(!d.reallocated);
        assert_eq!(d.violated, vec![false; 3]);
        assert_eq!(d.allocation.rates, vec![10.0, 10.0, 10.0]);
        assert!((d.delays[0] - 0.06).abs() < 1e-12);
        assert_eq!(d.throughput, vec![0.5, 2.0, 5.0]);
        assert_eq!(d.total_throughput(), 7.5);
        // Eq. 22 with V_c = tp_c: bw_ls = 0.5 / 0.1 + 0.5 = 5.5; bw_nm = 2 / 0.5 + 2 = 6;
        // bw_lt = 5 / 1 + 5 = 10, within its 10. No request; spare is V - bw.
        assert_eq!(d.demand, vec![5.5, 6.0, 10.0]);
        assert_eq!(d.tuple, BandwidthTuple(vec![4.5, 4.0, 0.0]));
        assert_eq!(p.tuple().shortages().count(), 0);
    }

    #[test]
    fn an_idle_class_needs_its_output_not_its_allocation() {
        // The idle node of the JANUS lab: a large even split, little traffic.
        let mut p = Pbtt::new(
            &ClassSet::janus_default(),
            PbttConfig {
                window: Duration::from_millis(100),
                processing_delay: Duration::ZERO,
                capacity: 3000.0,
            },
        )
        .unwrap();
        let loads = [ClassLoad::new(10.0, 0.0); 3];
        let d = p.on_window(&loads).unwrap();
        assert!(!d.reallocated);
        // bw_c = Lambda t / delta_c + Lambda: 20, 12 and 11. With the allocated
        // 1000 as V_c, nm alone would "need" 0.8 * 1000 + 4 = 804.
        let expected = [20.0, 12.0, 11.0];
        for (got, want) in d.demand.iter().zip(expected) {
            assert!((got - want).abs() < 1e-9, "{:?}", d.demand);
        }
        assert!((d.tuple.spare_total() - (3000.0 - 43.0)).abs() < 1e-9);
    }

    #[test]
    fn a_projected_shortage_reallocates_before_a_bound_breaks() {
        let mut p = pbtt(30.0);
        // d_lt = 8 / 10 + 0.01 <= 1, yet Eq. 22 wants (8 + 0) / 1 + 8 = 16:
        // at 10/s the class falls behind by 2 records every second.
        let loads = [
            ClassLoad::default(),
            ClassLoad::default(),
            ClassLoad::new(8.0, 0.0),
        ];
        let d = p.on_window(&loads).unwrap();
        assert_eq!(d.violated, vec![false; 3]);
        assert!(d.reallocated);
        assert_eq!(d.demand, vec![0.0, 0.0, 16.0]);
        // lt gets its 16; the leftover goes to ls (Algorithm 2 line 11).
        assert_eq!(d.allocation.rates, vec![14.0, 0.0, 16.0]);
        assert_eq!(d.tuple, BandwidthTuple(vec![14.0, 0.0, 0.0]));
        // Within the slack, the allocation stands.
        let loads = [
            ClassLoad::default(),
            ClassLoad::default(),
            ClassLoad::new(8.05, 0.0),
        ];
        assert!(!p.on_window(&loads).unwrap().reallocated);
    }

    #[test]
    fn a_projected_shortage_beyond_capacity_is_requested() {
        let mut p = pbtt(12.0);
        p.allocation.rates = vec![0.0, 0.0, 12.0];
        // d_lt = 10 / 12 <= 1, but bw_lt = 10 + 10 = 20 > C_out.
        let loads = [
            ClassLoad::default(),
            ClassLoad::default(),
            ClassLoad::new(10.0, 0.0),
        ];
        let d = p.on_window(&loads).unwrap();
        assert_eq!(d.violated, vec![false; 3]);
        assert!(d.reallocated);
        assert_eq!(d.allocation.rates, vec![0.0, 0.0, 12.0]);
        assert_eq!(
            d.tuple.shortages().collect::<Vec<_>>(),
            vec![(ClassId(2), 8.0)]
        );
    }

    #[test]
    fn reallocates_when_a_bound_breaks() {
        let mut p = pbtt(30.0);
        // d_ls = 5 / 10 + 0.01 > 0.1.
        let loads = [
            ClassLoad::new(5.0, 0.0),
            ClassLoad::new(2.0, 0.0),
            ClassLoad::new(5.0, 0.0),
        ];
        let d = p.on_window(&loads).unwrap();
        assert!(d.reallocated);
        assert_eq!(d.violated, vec![true, false, false]);
        // bw_ls = 5 / 0.1 + 5 = 55; bw_nm = 2 / 0.5 + 2 = 6; bw_lt = 5 / 1 + 5 = 10.
        // Strict priority: ls takes all 30, the rest is requested.
        assert_eq!(d.demand, vec![55.0, 6.0, 10.0]);
        assert_eq!(d.allocation.rates, vec![30.0, 0.0, 0.0]);
        assert_eq!(d.tuple, BandwidthTuple(vec![-25.0, -6.0, -10.0]));
        assert_eq!(p.allocation(), &d.allocation);
    }

    #[test]
    fn a_class_with_traffic_and_no_rate_has_infinite_delay() {
        let mut p = pbtt(0.0);
        let loads = [
            ClassLoad::default(),
            ClassLoad::new(1.0, 0.0),
            ClassLoad::default(),
        ];
        let d = p.on_window(&loads).unwrap();
        assert_eq!(d.delays[0], 0.01);
        assert_eq!(d.delays[1], f64::INFINITY);
        assert!(d.reallocated);
        // No capacity at all (tp = 0): the whole need, (1 + (1 - 0) * 1) / 0.5 + 0 = 4,
        // is a shortage.
        assert_eq!(
            d.tuple.shortages().collect::<Vec<_>>(),
            vec![(ClassId(1), 4.0)]
        );
    }

    #[test]
    fn set_capacity_rescales_and_never_overshoots() {
        let mut p = pbtt(30.0);
        p.set_capacity(15.0).unwrap();
        assert_eq!(p.allocation().rates, vec![5.0, 5.0, 5.0]);
        p.set_capacity(0.1).unwrap();
        assert!(p.allocation().total() <= 0.1);
        p.set_capacity(0.0).unwrap();
        assert_eq!(p.allocation().total(), 0.0);
        p.set_capacity(9.0).unwrap();
        assert_eq!(p.allocation().rates, vec![3.0, 3.0, 3.0]);
        assert_eq!(p.set_capacity(-1.0), Err(JanusError::BadCapacity(-1.0)));
    }

    #[test]
    fn set_capacity_moves_spare_with_the_rate() {
        let mut p = pbtt(30.0);
        // E2 of Fig. 4: allocation [18, 10, 2] offering [8, 0, 0].
        p.allocation.rates = vec![18.0, 10.0, 2.0];
        p.tuple = BandwidthTuple(vec![8.0, 0.0, 0.0]);
        p.set_capacity(60.0).unwrap();
        assert_eq!(p.allocation().rates, vec![36.0, 20.0, 4.0]);
        assert_eq!(p.tuple(), &BandwidthTuple(vec![26.0, 0.0, 0.0]));
        // Halving from 30: ls drops by 9, more than its spare of 8.
        p.set_capacity(15.0).unwrap();
        assert_eq!(p.allocation().rates, vec![9.0, 5.0, 1.0]);
        assert_eq!(p.tuple(), &BandwidthTuple(vec![0.0, 0.0, 0.0]));
    }

    #[test]
    fn wrong_number_of_loads_is_an_error() {
        let mut p = pbtt(30.0);
        assert_eq!(
            p.on_window(&[ClassLoad::default()]),
            Err(JanusError::ClassCount {
                expected: 3,
                got: 1
            })
        );
    }

    #[test]
    fn bad_config_is_an_error() {
        let err = Pbtt::new(
            &ClassSet::janus_default(),
            PbttConfig {
                window: Duration::ZERO,
                processing_delay: Duration::ZERO,
                capacity: 1.0,
            },
        )
        .unwrap_err();
        assert_eq!(err, JanusError::BadWindow(0.0));
    }
}
