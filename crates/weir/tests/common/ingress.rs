//! One ingress without an `App`: an [`Intake`] over the JANUS classes and
//! queues of given capacities, for the tests that drive a listener (MQTT,
//! gRPC) and read its class queues directly.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use weir::intake::Intake;
use weir::metrics::Metrics;
use weir_core::classify::{Classifier, Rule, Source, TopicFilter};
use weir_core::queueing::queue::{MultiLevelQueue, QueueCapacity};
use weir_core::{ClassId, ClassSet, NodeId, Record};

/// The JANUS classes (`ClassSet::janus_default`, and the order every test
/// config lists them in): latency-sensitive...
pub const LS: ClassId = ClassId(0);
/// ...normal...
pub const NM: ClassId = ClassId(1);
/// ...and latency-tolerant.
pub const LT: ClassId = ClassId(2);

/// A class queue no test fills.
pub fn roomy() -> QueueCapacity {
    QueueCapacity {
        records: 10_000,
        bytes: 64 << 20,
    }
}

/// A rule routing MQTT topics matching `filter` to `class`.
pub fn mqtt_rule(filter: &str, class: ClassId) -> Rule {
    Rule {
        source: Source::MqttFilter(TopicFilter::parse(filter).expect("valid filter")),
        class,
    }
}

/// A rule routing the gRPC stream `name` to `class`.
pub fn grpc_rule(name: &str, class: ClassId) -> Rule {
    Rule {
        source: Source::GrpcStream(name.into()),
        class,
    }
}

/// An intake of node `node` over the JANUS classes: `rules`, then
/// `default`; class queues of `capacities` (ls, nm, lt); stopping with
/// `shutdown`.
pub fn intake(
    node: NodeId,
    rules: Vec<Rule>,
    default: ClassId,
    capacities: [QueueCapacity; 3],
    shutdown: CancellationToken,
) -> Arc<Intake> {
    let classes = ClassSet::janus_default();
    let classifier = Classifier::new(rules, default).expect("valid rules");
    let metrics = Arc::new(Metrics::new(&classes));
    Arc::new(Intake::new(
        node,
        classes,
        classifier,
        Arc::new(MultiLevelQueue::new(&capacities)),
        1,
        shutdown,
        metrics,
    ))
}

/// Every record now queued in `class`, oldest first.
pub fn take_all(ingress: &Intake, class: ClassId) -> Vec<Record> {
    let queue = ingress.queues().class(class);
    std::iter::from_fn(|| queue.pop()).collect()
}
