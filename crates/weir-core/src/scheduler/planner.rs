//! Per-class batch planning (buffer-aided relaying, [`crate::batching`]):
//! each window the planner re-plans every class from its arrivals, its
//! running mean record size and the link estimate, against
//! [`planning_bound`]; each confirmed transaction refines the class's
//! `L_up(s)` fit.

use std::time::Duration;

use crate::batching::{
    planning_bound, BatchLimits, BatchPlan, BatchSizer, ClassTraffic, PlanReason, ReferencePolicy,
};
use crate::class::{ClassId, ClassSet};
use crate::link_estimate::LinkEstimate;

/// Weight of a window's mean record size in its running average.
pub const RECORD_SIZE_EWMA: f64 = 0.2;

/// Longest single transaction the planner reckons with (an estimate that
/// says more is broken, not a plan).
const MAX_TRANSACTION: Duration = Duration::from_secs(3600);

/// Per-class batch planning state.
#[derive(Debug, Clone)]
pub struct Planner {
    sizers: Vec<BatchSizer>,
    reference: ReferencePolicy,
    /// Running mean record size per class, bytes.
    mean_size: Vec<f64>,
    plans: Vec<BatchPlan>,
    limits: BatchLimits,
}

impl Planner {
    /// A planner for `classes` classes that sends unbatched until the first
    /// window has measured something; `reference` is the `i` of Eq. 5-6 per
    /// class rank.
    pub fn new(classes: usize, limits: BatchLimits, reference: Vec<u32>) -> Self {
        Planner {
            sizers: (0..classes).map(|_| BatchSizer::new(limits)).collect(),
            reference: ReferencePolicy::ByRank(reference),
            mean_size: vec![0.0; classes],
            plans: vec![
                BatchPlan::unbatched(limits.max_bytes as u64, PlanReason::RateTooLow);
                classes
            ],
            limits,
        }
    }

    /// The plans in force, one per class.
    pub fn plans(&self) -> &[BatchPlan] {
        &self.plans
    }

    /// The batch sizer of `class`: its fitted `L_up(s)` (for reports).
    pub fn sizer(&self, class: ClassId) -> Option<&BatchSizer> {
        self.sizers.get(class.index())
    }

    /// One confirmed transaction of `records` records led by `class` that
    /// took `elapsed` on the link.
    pub fn observe(&mut self, class: ClassId, records: usize, elapsed: Duration) {
        if let Some(sizer) = self.sizers.get_mut(class.index()) {
            sizer.observe(u32::try_from(records).unwrap_or(u32::MAX), elapsed);
        }
    }

    /// Re-plans every class from the window's `arrivals` (records, bytes
    /// per class) over `window`, against [`planning_bound`].
    pub fn replan(
        &mut self,
        classes: &ClassSet,
        arrivals: &[(u64, u64)],
        window: Duration,
        link: &LinkEstimate,
    ) {
        let t = window.as_secs_f64();
        let largest_mean = self.mean_size.iter().copied().fold(0.0, f64::max);
        let single = Duration::from_secs_f64(
            link.transaction_secs(largest_mean)
                .clamp(0.0, MAX_TRANSACTION.as_secs_f64()),
        );
        for (rank, (class, c)) in classes.iter().enumerate() {
            let i = class.index();
            let (records, bytes) = arrivals[i];
            if records > 0 {
                let mean = bytes as f64 / records as f64;
                self.mean_size[i] = if self.mean_size[i] == 0.0 {
                    mean
                } else {
                    self.mean_size[i] + RECORD_SIZE_EWMA * (mean - self.mean_size[i])
                };
            }
            let traffic = ClassTraffic {
                arrival_rate: records as f64 / t,
                mean_record_bytes: self.mean_size[i],
                latency_bound: planning_bound(c.bound, link, self.limits.max_bytes as u64),
                reference: self.reference.reference(rank, c.bound, single),
            };
            self.plans[i] = self.sizers[i].plan(&traffic, link);
        }
    }
}
