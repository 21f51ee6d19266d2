//! The AMQP message of a batch: its headers and properties (the format is
//! in the parent module's docs), and the URL as shown in logs.

use lapin::types::{AMQPValue, FieldTable};
use lapin::uri::AMQPUri;
use lapin::BasicProperties;
use weir_core::NodeId;

use crate::egress::batch::EncodedBatch;

/// Header: the sending node's id.
pub const HEADER_NODE: &str = "weir-node";
/// Header: records in the batch.
pub const HEADER_RECORDS: &str = "weir-records";
/// Header: the per-node batch sequence number.
pub const HEADER_BATCH_SEQ: &str = "weir-batch-seq";
/// Header: the index of the most urgent class in the batch (0 is the most
/// urgent; a mixed batch holds others too).
pub const HEADER_CLASS: &str = "weir-class";
/// Header: when the batch was published, microseconds since the Unix epoch
/// (the sender's clock): with each record's `ingress_us`, a consumer can
/// tell the time a record spent in weir from the time it spent on the way.
pub const HEADER_SENT_US: &str = "weir-sent-us";
/// AMQP `app_id` of every message, so mixed queues show who published.
pub const APP_ID: &str = "weir";

/// Header `name` of a message as an unsigned number: a signed 64-bit
/// integer (AMQP type `l`, as weir and RabbitMQ's streams write them) that
/// is not negative; `None` when absent or of another type.
pub fn header_u64(properties: &BasicProperties, name: &str) -> Option<u64> {
    match properties.headers().as_ref()?.inner().get(name)? {
        AMQPValue::LongLongInt(v) => u64::try_from(*v).ok(),
        _ => None,
    }
}

/// The AMQP properties of a batch message (see the module docs).
pub(super) fn properties(batch: &EncodedBatch) -> BasicProperties {
    // Signed 64-bit for every header: see the module docs.
    let mut headers = FieldTable::default();
    headers.insert(
        HEADER_NODE.into(),
        AMQPValue::LongLongInt(batch.node as i64),
    );
    headers.insert(
        HEADER_RECORDS.into(),
        AMQPValue::LongLongInt(batch.records as i64),
    );
    headers.insert(
        HEADER_BATCH_SEQ.into(),
        AMQPValue::LongLongInt(batch.seq as i64),
    );
    headers.insert(
        HEADER_CLASS.into(),
        AMQPValue::LongLongInt(i64::from(batch.class.0)),
    );
    headers.insert(
        HEADER_SENT_US.into(),
        AMQPValue::LongLongInt(crate::clock::unix_micros() as i64),
    );
    let now = crate::clock::unix_secs();
    BasicProperties::default()
        .with_content_type(weir_proto::CONTENT_TYPE.into())
        .with_content_encoding(batch.encoding.as_str().into())
        .with_delivery_mode(2)
        .with_headers(headers)
        .with_message_id(message_id(batch.node, batch.seq).into())
        .with_timestamp(now)
        .with_app_id(APP_ID.into())
}

/// The `message_id` of a batch: unique per node and batch, so a consumer
/// can spot a re-published batch.
pub fn message_id(node: NodeId, seq: u64) -> String {
    format!("{node}-{seq}")
}

/// `url` with its password left out: `amqp://user@host:port/vhost`.
pub fn redacted_url(url: &str) -> String {
    match url.parse::<AMQPUri>() {
        Ok(uri) => format!(
            "{}://{}@{}:{}/{}",
            uri.scheme,
            uri.authority.userinfo.username,
            uri.authority.host,
            uri.authority.port,
            percent_encode_vhost(&uri.vhost)
        ),
        // Unparseable: show only the scheme, the rest may hold a password.
        Err(_) => {
            let scheme = url.split_once("://").map_or("?", |(s, _)| s);
            format!("{scheme}://<unparseable>")
        }
    }
}

/// The vhost as written in a URL (`/` is `%2f`).
fn percent_encode_vhost(vhost: &str) -> String {
    let mut out = String::with_capacity(vhost.len());
    for b in vhost.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02x}"));
        }
    }
    out
}
