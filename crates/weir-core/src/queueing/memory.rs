//! The memory budget: what weir plans to hold in memory under a limit (a
//! cgroup's, or `node.memory_limit`), and the class queues sized so that
//! the plan fits. At the budget, ingress applies back-pressure (a full
//! queue withholds acknowledgements) instead of the kernel's OOM killer
//! ending the process and every record it held.
//!
//! The plan, for a limit `L`:
//! - [`HEADROOM`] of `L` is never planned: allocator fragmentation (freed
//!   records leave holes that are not returned at once), and what is not
//!   counted below (connection buffers beyond the base, TLS sessions).
//! - [`BASE_BYTES`]: the process at rest (code, runtime, threads' stacks,
//!   metrics, connection to the broker).
//! - the egress's batches in flight: built, encoded and compressed copies of
//!   up to a window of batches (the caller states the bytes).
//! - the rest goes to the class queues: each queue's configured capacity
//!   costs its bytes plus, per record slot, the record's in-memory
//!   bookkeeping ([`RECORD_MEMORY`]); when the sum does not fit, every
//!   queue is scaled down by the same factor, keeping their proportions.

use crate::queueing::queue::QueueCapacity;
use crate::record::{Record, RECORD_OVERHEAD};

/// Share of the limit left unplanned.
pub const HEADROOM: f64 = 0.25;

/// The process at rest: the release binary's resident memory idle, with the
/// default configuration and a connection to the broker, rounded up
/// (docs/durability.md, "A small box").
pub const BASE_BYTES: u64 = 16 << 20;

/// A queued record's memory beyond what [`Record::size`] counts: the
/// record itself in its queue slot, less the estimate already in
/// [`Record::size`].
pub const RECORD_MEMORY: u64 = (std::mem::size_of::<Record>() + std::mem::size_of::<usize>())
    .saturating_sub(RECORD_OVERHEAD) as u64;

/// An MQTT connection that has published: its read and write buffers and
/// session (measured: about 17 KiB idle, 23 KiB after a publish). The
/// plan does not reserve it (how many devices connect is not known at
/// start); [`connections_that_fit`] says how many the headroom holds.
pub const CONNECTION_BYTES: u64 = 24 << 10;

/// Connections whose buffers fit in half the headroom of `limit` (the
/// other half is for fragmentation): more than that may be allowed only
/// with memory the plan gives the queues.
pub fn connections_that_fit(limit: u64) -> u64 {
    (limit as f64 * HEADROOM) as u64 / 2 / CONNECTION_BYTES
}

/// The smallest queue a class is given however tight the budget: a few
/// records of a kilobyte.
pub const MIN_QUEUE: QueueCapacity = QueueCapacity {
    records: 16,
    bytes: 16 << 10,
};

/// What the budget derived.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The limit planned for (`None`: no limit; queues as configured).
    pub limit: Option<u64>,
    /// The queues to use, by class.
    pub queues: Vec<QueueCapacity>,
    /// What the configured queues would cost at capacity.
    pub configured_bytes: u64,
    /// What the queues to use cost at capacity.
    pub queue_bytes: u64,
    /// The queues' share of the limit (after headroom, base and in-flight
    /// batches).
    pub queue_budget: u64,
    /// The factor the configured queues were scaled by (1 when they fit).
    pub scale: f64,
    /// Everything planned: base, in-flight batches and queues.
    pub planned: u64,
}

impl Plan {
    /// Whether the limit leaves the queues less than their minimum: weir
    /// will run, with tiny queues, but the limit is too small for it.
    pub fn starved(&self) -> bool {
        self.limit.is_some() && self.queue_budget == 0
    }
}

/// What a queue of `c` costs at capacity.
pub fn queue_memory(c: &QueueCapacity) -> u64 {
    c.bytes as u64 + c.records as u64 * RECORD_MEMORY
}

/// The plan for `limit` with the `configured` queues and `in_flight` bytes
/// of the egress's batches.
pub fn plan(limit: Option<u64>, configured: &[QueueCapacity], in_flight: u64) -> Plan {
    let configured_bytes: u64 = configured.iter().map(queue_memory).sum();
    let Some(limit) = limit else {
        return Plan {
            limit: None,
            queues: configured.to_vec(),
            configured_bytes,
            queue_bytes: configured_bytes,
            queue_budget: u64::MAX,
            scale: 1.0,
            planned: BASE_BYTES + in_flight + configured_bytes,
        };
    };
    let usable = (limit as f64 * (1.0 - HEADROOM)) as u64;
    let queue_budget = usable.saturating_sub(BASE_BYTES + in_flight);
    let scale = if configured_bytes <= queue_budget {
        1.0
    } else {
        queue_budget as f64 / configured_bytes as f64
    };
    let queues: Vec<QueueCapacity> = configured
        .iter()
        .map(|c| QueueCapacity {
            records: ((c.records as f64 * scale) as usize)
                .max(MIN_QUEUE.records)
                .min(c.records),
            bytes: ((c.bytes as f64 * scale) as usize)
                .max(MIN_QUEUE.bytes)
                .min(c.bytes),
        })
        .collect();
    let queue_bytes = queues.iter().map(queue_memory).sum();
    Plan {
        limit: Some(limit),
        queues,
        configured_bytes,
        queue_bytes,
        queue_budget,
        scale,
        planned: BASE_BYTES + in_flight + queue_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn defaults() -> Vec<QueueCapacity> {
        vec![
            QueueCapacity {
                records: 65_536,
                bytes: 64 << 20,
            };
            3
        ]
    }

    #[test]
    fn without_a_limit_the_queues_are_as_configured() {
        let p = plan(None, &defaults(), MIB);
        assert_eq!(p.queues, defaults());
        assert_eq!(p.scale, 1.0);
        assert!(!p.starved());
    }

    #[test]
    fn a_small_box_gets_queues_that_fit_under_its_limit() {
        let p = plan(Some(64 * MIB), &defaults(), 2 * MIB);
        assert!(p.scale < 0.2, "{p:?}");
        // Everything planned stays under the limit less the headroom.
        assert!(p.planned <= 48 * MIB, "{p:?}");
        assert!(p.queue_bytes <= p.queue_budget);
        // The classes keep their proportions.
        assert!(p.queues.windows(2).all(|w| w[0] == w[1]));
        // A large box keeps the configured queues.
        let big = plan(Some(8 << 30), &defaults(), 2 * MIB);
        assert_eq!(big.queues, defaults());
        assert_eq!(big.scale, 1.0);
    }

    #[test]
    fn a_limit_under_the_base_starves_the_queues_to_their_minimum() {
        let p = plan(Some(8 * MIB), &defaults(), MIB);
        assert!(p.starved());
        assert!(p.queues.iter().all(|q| *q == MIN_QUEUE));
    }

    #[test]
    fn half_the_headroom_holds_the_connections() {
        // 64 MiB: 16 MiB of headroom, half of it for connections.
        assert_eq!(connections_that_fit(64 * MIB), 341);
        assert!(connections_that_fit(8 << 30) > 40_000);
    }

    #[test]
    fn uneven_queues_shrink_in_proportion() {
        let configured = [
            QueueCapacity {
                records: 1_000,
                bytes: 8 << 20,
            },
            QueueCapacity {
                records: 4_000,
                bytes: 32 << 20,
            },
        ];
        let p = plan(Some(40 * MIB), &configured, 0);
        let ratio = p.queues[1].bytes as f64 / p.queues[0].bytes as f64;
        assert!((ratio - 4.0).abs() < 0.01, "{p:?}");
        assert!(p.queue_bytes <= p.queue_budget);
    }
}
