use super::link::explain_broker;
use super::message::properties;
use super::*;
use crate::config::{ExchangeType, UrlOrder};
use lapin::types::{AMQPValue, ShortString};
use weir_core::ClassId;
use weir_proto::Encoding;

#[test]
fn a_queue_type_of_none_is_called_classic() {
    let said = "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': received the value 'quorum' of type 'longstr' but current is none";
    let explained = explain_broker(said);
    assert!(explained.starts_with(said), "{explained}");
    assert!(explained.contains("exists as classic"), "{explained}");
    let other = "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'q'";
    assert_eq!(explain_broker(other), other);
}

#[test]
fn redacted_url_never_shows_the_password() {
    let shown = redacted_url("amqp://weir:s3cr%2Fet@rabbit.example:5671/edge?heartbeat=10");
    assert_eq!(shown, "amqp://weir@rabbit.example:5671/edge");
    assert!(!shown.contains("s3cr"));
    assert_eq!(
        redacted_url("amqp://guest:guest@127.0.0.1:5672/%2f"),
        "amqp://guest@127.0.0.1:5672/%2f"
    );
    let bad = redacted_url("amqp://user:hunter2@host:notaport/");
    assert!(!bad.contains("hunter2"), "{bad}");
}

#[test]
fn ipv6_literal_hosts_are_refused_not_rewritten() {
    let mut cfg = config("amqp://weir:hunter2@[::1]:5672/%2f");
    let err = Target::new(&cfg, 1, None).err().expect("refused");
    assert!(err.contains("IPv6") && !err.contains("hunter2"), "{err}");
    cfg.urls = vec!["amqp://weir:hunter2@rabbit.example:5672/%2f".into()];
    assert!(Target::new(&cfg, 1, None).is_ok());
}

fn config(url: &str) -> AmqpEgress {
    AmqpEgress {
        urls: vec![url.into()],
        url_order: UrlOrder::InOrder,
        exchange: "weir".into(),
        exchange_type: ExchangeType::Direct,
        queue: "weir.batches".into(),
        queue_type: crate::config::QueueType::Classic,
        queue_arguments: Vec::new(),
        routing_key: "weir.batches".into(),
        blocked_failover_after: Duration::from_secs(30),
        confirm_timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(1),
        reconnect_backoff_max: Duration::from_secs(1),
        max_in_flight: 4,
        urgent_lane: false,
    }
}

#[test]
fn debug_output_hides_the_password() {
    let sink = AmqpSink::new(config("amqp://weir:hunter2@127.0.0.1:5672/%2f"), 1);
    let shown = format!("{sink:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains("amqp://weir@127.0.0.1:5672/%2f"), "{shown}");
}

#[test]
fn properties_carry_format_and_headers() {
    let batch = EncodedBatch {
        seq: 9,
        class: ClassId(2),
        records: 3,
        node: 7,
        body: bytes::Bytes::from_static(b"x"),
        encoding: Encoding::Identity,
    };
    let p = properties(&batch);
    assert_eq!(
        p.content_type().as_ref().map(ShortString::as_str),
        Some(weir_proto::CONTENT_TYPE)
    );
    assert_eq!(
        p.content_encoding().as_ref().map(ShortString::as_str),
        Some("identity")
    );
    assert_eq!(*p.delivery_mode(), Some(2));
    assert_eq!(
        p.message_id().as_ref().map(ShortString::as_str),
        Some("7-9")
    );
    let headers = p.headers().as_ref().expect("headers set");
    let get = |k: &str| headers.inner().get(k).cloned();
    assert_eq!(get(HEADER_NODE), Some(AMQPValue::LongLongInt(7)));
    assert_eq!(get(HEADER_RECORDS), Some(AMQPValue::LongLongInt(3)));
    assert_eq!(get(HEADER_BATCH_SEQ), Some(AMQPValue::LongLongInt(9)));
    assert_eq!(get(HEADER_CLASS), Some(AMQPValue::LongLongInt(2)));
}
