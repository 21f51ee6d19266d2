//! The AMQP egress's own metrics (`weir_egress_amqp_*`): which endpoint is
//! in use, failovers, broker alarms (`connection.blocked`) and the ways a
//! publish fails (nack, return, timeout).

use std::sync::Mutex;
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicI64, AtomicU64};

/// The `endpoint` label: a broker URL without its password.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabel {
    /// `amqp://user@host:port/vhost`.
    pub endpoint: String,
}

/// The `reason` label of a broker alarm, as RabbitMQ words it (`low on
/// memory`, `low on disk`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// The broker's reason.
    pub reason: String,
}

/// `weir_egress_amqp_*`.
#[derive(Debug, Default)]
pub struct AmqpMetrics {
    endpoint: Family<EndpointLabel, Gauge<i64, AtomicI64>>,
    failovers: Counter,
    blocked: Gauge<i64, AtomicI64>,
    blocks: Family<ReasonLabel, Counter>,
    blocked_seconds: Gauge<f64, AtomicU64>,
    /// Publishes RabbitMQ negatively confirmed (`basic.nack`).
    pub nacks: Counter,
    /// Publishes RabbitMQ returned as unroutable (`basic.return`).
    pub returns: Counter,
    /// Publishes or confirms that took longer than `confirm_timeout`.
    pub timeouts: Counter,
    /// Declarations the broker refused (`PRECONDITION_FAILED`, access).
    pub declare_failures: Counter,
    /// When the connection in use was blocked, and the seconds blocked
    /// before that.
    block: Mutex<BlockClock>,
}

#[derive(Debug, Default)]
struct BlockClock {
    since: Option<Instant>,
    total: f64,
}

impl AmqpMetrics {
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "egress_amqp_endpoint",
            "1 for the RabbitMQ endpoint the egress is connected to, 0 for the others",
            self.endpoint.clone(),
        );
        registry.register(
            "egress_amqp_failovers",
            "Connections made to another endpoint than the one before (node lost, or blocked longer than blocked_failover_after)",
            self.failovers.clone(),
        );
        registry.register(
            "egress_amqp_blocked",
            "1 while RabbitMQ blocks the egress connection (connection.blocked: a memory or disk alarm)",
            self.blocked.clone(),
        );
        registry.register(
            "egress_amqp_blocks",
            "Times RabbitMQ blocked the egress connection, by the broker's reason",
            self.blocks.clone(),
        );
        registry.register(
            "egress_amqp_blocked_seconds",
            "Seconds the egress connection has spent blocked by RabbitMQ, in total (a counter)",
            self.blocked_seconds.clone(),
        );
        registry.register(
            "egress_amqp_nacks",
            "Batches RabbitMQ nacked (could not store); each is published again after a backoff",
            self.nacks.clone(),
        );
        registry.register(
            "egress_amqp_returns",
            "Batches RabbitMQ returned as unroutable (no queue bound for the routing key); each is published again after a backoff",
            self.returns.clone(),
        );
        registry.register(
            "egress_amqp_timeouts",
            "Publishes or confirms that took longer than egress.amqp.confirm_timeout (the connection is dropped and the batch published again)",
            self.timeouts.clone(),
        );
        registry.register(
            "egress_amqp_declare_failures",
            "Connections whose declarations RabbitMQ refused (an existing exchange or queue with other settings, or no permission)",
            self.declare_failures.clone(),
        );
    }

    /// The endpoints, all shown as not in use.
    pub fn endpoints(&self, endpoints: &[String]) {
        for e in endpoints {
            self.endpoint
                .get_or_create(&EndpointLabel {
                    endpoint: e.clone(),
                })
                .set(0);
        }
    }

    /// Connected to `endpoint` (`failover`: another than the last one).
    pub fn connected(&self, endpoint: &str, failover: bool) {
        self.endpoint
            .get_or_create(&EndpointLabel {
                endpoint: endpoint.to_owned(),
            })
            .set(1);
        if failover {
            self.failovers.inc();
        }
    }

    /// The connection to `endpoint` is gone; a block on it ends with it.
    pub fn disconnected(&self, endpoint: &str) {
        self.endpoint
            .get_or_create(&EndpointLabel {
                endpoint: endpoint.to_owned(),
            })
            .set(0);
        self.unblocked();
    }

    /// RabbitMQ blocked the connection, saying why.
    pub fn blocked(&self, reason: &str) {
        let mut clock = self.block.lock().unwrap_or_else(|e| e.into_inner());
        if clock.since.is_none() {
            clock.since = Some(Instant::now());
            self.blocked.set(1);
            self.blocks
                .get_or_create(&ReasonLabel {
                    reason: reason.to_owned(),
                })
                .inc();
        }
    }

    /// RabbitMQ unblocked the connection (or it closed).
    pub fn unblocked(&self) {
        let mut clock = self.block.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(since) = clock.since.take() {
            clock.total += since.elapsed().as_secs_f64();
            self.blocked.set(0);
            self.blocked_seconds.set(clock.total);
        }
    }

    /// Brings the blocked time up to now (run at every scrape).
    pub fn refresh(&self) {
        let clock = self.block.lock().unwrap_or_else(|e| e.into_inner());
        let running = clock.since.map_or(0.0, |s| s.elapsed().as_secs_f64());
        self.blocked_seconds.set(clock.total + running);
    }

    /// Whether the connection is blocked now.
    pub fn is_blocked(&self) -> bool {
        self.blocked.get() == 1
    }

    /// 1 when connected to `endpoint` (shown without password), else 0.
    pub fn endpoint_in_use(&self, endpoint: &str) -> i64 {
        self.endpoint
            .get_or_create(&EndpointLabel {
                endpoint: endpoint.to_owned(),
            })
            .get()
    }

    /// Blocks RabbitMQ gave `reason` for, so far.
    pub fn blocks_total(&self, reason: &str) -> u64 {
        self.blocks
            .get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            })
            .get()
    }

    /// Seconds spent blocked, up to now.
    pub fn blocked_seconds(&self) -> f64 {
        self.refresh();
        self.blocked_seconds.get()
    }

    /// Connections made to another endpoint so far.
    pub fn failovers_total(&self) -> u64 {
        self.failovers.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocked_time_adds_up_over_blocks_and_counts_each_reason() {
        let m = AmqpMetrics::default();
        m.blocked("low on memory");
        m.blocked("low on memory"); // still the same block
        std::thread::sleep(std::time::Duration::from_millis(20));
        m.refresh();
        let during = m.blocked_seconds.get();
        assert!(during >= 0.02, "{during}");
        assert!(m.is_blocked());
        m.unblocked();
        assert!(!m.is_blocked());
        let after = m.blocked_seconds.get();
        assert!(after >= during);
        m.refresh();
        assert_eq!(m.blocked_seconds.get(), after, "not blocked: no time runs");
        m.blocked("low on disk");
        m.disconnected("amqp://guest@h:5672/%2f");
        assert!(!m.is_blocked(), "a closed connection is not blocked");
        let count = |r: &str| {
            m.blocks
                .get_or_create(&ReasonLabel {
                    reason: r.to_owned(),
                })
                .get()
        };
        assert_eq!((count("low on memory"), count("low on disk")), (1, 1));
    }
}
