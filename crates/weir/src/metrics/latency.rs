//! Delivery latency per class against its bound (`weir_record_latency_seconds`,
//! `weir_records_late_total`, `weir_class_bound_seconds`) and config reloads
//! (`weir_config_reload_total`): what `weir top` and the Grafana dashboard
//! show as "does every class meet its bound".
//!
//! Latency is from a record's ingress stamp (the wall clock when weir
//! accepted it) to the egress's confirmation. The histogram is recorded a
//! batch at a time with atomic adds (no lock per record, none per batch
//! after a class's first), so it costs the egress a few nanoseconds per
//! record.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;
use weir_core::{ClassId, ClassSet, Receipt};

use super::labels::ClassLabel;

/// Upper bounds of the latency buckets, seconds: fine around the usual
/// bounds (50 ms to 1 s) so a p99 read from them lands near the truth.
pub const LATENCY_BUCKETS: [f64; 20] = [
    0.001, 0.002, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5,
    2.0, 5.0, 10.0, 30.0,
];

/// A histogram of fixed buckets kept in atomics.
#[derive(Debug)]
pub struct LatencyHistogram {
    /// Per bucket (the last one is `+Inf`), not cumulative.
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum_us: AtomicU64::new(0),
        }
    }
}

impl LatencyHistogram {
    /// The bucket a latency of `us` microseconds falls in.
    fn bucket(us: u64) -> usize {
        let secs = us as f64 / 1e6;
        LATENCY_BUCKETS
            .iter()
            .position(|&le| secs <= le)
            .unwrap_or(LATENCY_BUCKETS.len())
    }

    /// Adds one observation of `us` microseconds.
    pub fn observe(&self, us: u64) {
        self.buckets[Self::bucket(us)].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// Adds observations counted per bucket.
    fn add(&self, counts: &[u64], sum_us: u64) {
        let mut n = 0;
        for (b, &c) in self.buckets.iter().zip(counts) {
            if c > 0 {
                b.fetch_add(c, Ordering::Relaxed);
                n += c;
            }
        }
        self.count.fetch_add(n, Ordering::Relaxed);
        self.sum_us.fetch_add(sum_us, Ordering::Relaxed);
    }
}

impl TypedMetric for LatencyHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for LatencyHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let buckets: Vec<(f64, u64)> = LATENCY_BUCKETS
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(self.buckets.iter().map(|b| b.load(Ordering::Relaxed)))
            .collect();
        // Count from the buckets, so the two always agree in one scrape.
        let count = buckets.iter().map(|(_, c)| c).sum();
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// The `result` label of reloads: `applied` or `refused`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// What became of the reload.
    pub result: String,
}

/// Where a batch spends its time on the way out (`weir_egress_stage_seconds`):
/// the evidence for where an urgent record's wait goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The batch's oldest record, from ingress to the egress taking the
    /// batch (queue wait, the scheduler's drain, the hand-off).
    Queued,
    /// From the egress offering the scheduler a batch to receiving it.
    Handoff,
    /// From receiving the batch to sending it (encoding, compression,
    /// waiting for the window or a retry).
    Prepare,
    /// The send itself (the emulated link's transfer time included).
    Send,
    /// From the send to the destination's confirmation.
    Confirm,
}

impl Stage {
    /// Every stage, in a batch's order.
    pub const ALL: [Stage; 5] = [
        Stage::Queued,
        Stage::Handoff,
        Stage::Prepare,
        Stage::Send,
        Stage::Confirm,
    ];

    /// The `stage` label.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Queued => "queued",
            Stage::Handoff => "handoff",
            Stage::Prepare => "prepare",
            Stage::Send => "send",
            Stage::Confirm => "confirm",
        }
    }
}

/// The `stage` label of `weir_egress_stage_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabel {
    /// [`Stage::name`].
    pub stage: &'static str,
}

/// Latency against the bounds, and reloads.
pub struct LatencyMetrics {
    stages: Family<StageLabel, LatencyHistogram>,
    names: Vec<ClassLabel>,
    bounds_us: Vec<AtomicU64>,
    latency: Family<ClassLabel, LatencyHistogram>,
    late: Family<ClassLabel, Counter>,
    bound: Family<ClassLabel, Gauge<f64, AtomicU64>>,
    reloads: Family<ResultLabel, Counter>,
}

impl std::fmt::Debug for LatencyMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatencyMetrics").finish_non_exhaustive()
    }
}

impl LatencyMetrics {
    /// For these classes and their bounds.
    pub fn new(classes: &ClassSet) -> Self {
        let m = LatencyMetrics {
            names: classes
                .iter()
                .map(|(_, c)| ClassLabel {
                    class: c.name.clone(),
                })
                .collect(),
            bounds_us: classes.iter().map(|_| AtomicU64::new(0)).collect(),
            latency: Family::default(),
            late: Family::default(),
            bound: Family::default(),
            reloads: Family::default(),
            stages: Family::default(),
        };
        m.set_bounds(classes);
        for s in Stage::ALL {
            let _ = m.stages.get_or_create(&StageLabel { stage: s.name() });
        }
        for l in &m.names {
            // Every class shows from the first scrape, at zero.
            let _ = m.latency.get_or_create(l);
            let _ = m.late.get_or_create(l);
        }
        for result in ["applied", "refused"] {
            // So that `increase()` sees the first reload of each kind.
            let _ = m.reloads.get_or_create(&ResultLabel {
                result: result.to_owned(),
            });
        }
        m
    }

    /// The bounds in force (at start, and after a reload).
    pub fn set_bounds(&self, classes: &ClassSet) {
        for ((_, c), (us, l)) in classes.iter().zip(self.bounds_us.iter().zip(&self.names)) {
            us.store(c.bound.as_micros() as u64, Ordering::Relaxed);
            self.bound.get_or_create(l).set(c.bound.as_secs_f64());
        }
    }

    /// Records confirmed at wall-clock `now_us`: their latency from
    /// ingress, and whether it passed their class's bound.
    pub fn delivered(&self, records: &[Receipt], now_us: u64) {
        let classes = self.names.len();
        let mut counts = vec![[0u64; LATENCY_BUCKETS.len() + 1]; classes];
        let mut sums = vec![0u64; classes];
        let mut late = vec![0u64; classes];
        for r in records {
            let c = r.class.index();
            if c >= classes {
                continue;
            }
            let us = now_us.saturating_sub(r.ingress_us);
            counts[c][LatencyHistogram::bucket(us)] += 1;
            sums[c] += us;
            if us > self.bounds_us[c].load(Ordering::Relaxed) {
                late[c] += 1;
            }
        }
        for c in 0..classes {
            if sums[c] > 0 || counts[c].iter().any(|&n| n > 0) {
                let label = &self.names[c];
                self.latency.get_or_create(label).add(&counts[c], sums[c]);
                if late[c] > 0 {
                    self.late.get_or_create(label).inc_by(late[c]);
                }
            }
        }
    }

    /// A batch spent `d` in `stage`.
    pub fn stage(&self, stage: Stage, d: std::time::Duration) {
        self.stages
            .get_or_create(&StageLabel {
                stage: stage.name(),
            })
            .observe(d.as_micros().try_into().unwrap_or(u64::MAX));
    }

    /// Records of `class` confirmed later than its bound, so far.
    pub fn late_total(&self, class: ClassId) -> u64 {
        self.late.get_or_create(&self.names[class.index()]).get()
    }

    /// A config reload, applied or refused.
    pub fn reload(&self, applied: bool) {
        self.reloads
            .get_or_create(&ResultLabel {
                result: if applied { "applied" } else { "refused" }.to_owned(),
            })
            .inc();
    }

    /// Adds these metrics to `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "record_latency_seconds",
            "Time from a record's acceptance at ingress to its confirmation by the egress",
            self.latency.clone(),
        );
        registry.register(
            "records_late",
            "Records confirmed later than their class's bound",
            self.late.clone(),
        );
        registry.register(
            "class_bound_seconds",
            "Each class's latency bound in force",
            self.bound.clone(),
        );
        registry.register(
            "egress_stage_seconds",
            "Time batches spend in each stage of the egress: queued (oldest record, ingress to the egress), handoff (batch asked for to received), prepare (received to sent), send, confirm",
            self.stages.clone(),
        );
        registry.register(
            "config_reload",
            "Config reloads (SIGHUP, POST /reload), by result: applied or refused",
            self.reloads.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn record(class: u8, ingress_us: u64) -> Receipt {
        Receipt {
            class: ClassId(class),
            origin: 1,
            seq: 0,
            ingress_us,
            spool: None,
        }
    }

    #[test]
    fn latency_is_bucketed_and_late_records_counted_against_the_bound_in_force() {
        let classes = ClassSet::janus_default();
        let m = LatencyMetrics::new(&classes);
        let mut reg = Registry::with_prefix("weir");
        m.register(&mut reg);
        let now = 10_000_000;
        // ls (100 ms): 40 ms on time, 150 ms late; lt (1 s): 150 ms on time.
        m.delivered(
            &[
                record(0, now - 40_000),
                record(0, now - 150_000),
                record(2, now - 150_000),
            ],
            now,
        );
        assert_eq!(m.late_total(ClassId(0)), 1);
        assert_eq!(m.late_total(ClassId(2)), 0);
        let mut tighter = classes.iter().map(|(_, c)| c.clone()).collect::<Vec<_>>();
        tighter[2].bound = Duration::from_millis(100);
        m.set_bounds(&ClassSet::new(tighter).unwrap());
        m.delivered(&[record(2, now - 150_000)], now);
        assert_eq!(m.late_total(ClassId(2)), 1, "the new bound counts");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        assert!(
            text.contains("weir_record_latency_seconds_bucket{le=\"0.05\",class=\"ls\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("weir_record_latency_seconds_bucket{le=\"0.15\",class=\"ls\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("weir_record_latency_seconds_count{class=\"lt\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("weir_class_bound_seconds{class=\"lt\"} 0.1"),
            "{text}"
        );
    }
}
