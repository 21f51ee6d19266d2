//! A batch as every sink sends it: encoded once into a `weir.v1.Batch`
//! body, then compressed or not.

use bytes::Bytes;
use weir_core::scheduler::OutBatch;
use weir_core::{ClassId, ClassSet, NodeId};
use weir_proto::{Encoding, RecordRef};

use crate::clock::unix_micros;

/// A batch encoded for the wire, as every sink sends it.
#[derive(Debug, Clone)]
pub struct EncodedBatch {
    /// Per-node batch sequence number.
    pub seq: u64,
    /// The most urgent class among the records.
    pub class: ClassId,
    /// Records in the batch.
    pub records: usize,
    /// The sending node.
    pub node: NodeId,
    /// The `weir.v1.Batch` body, encoded as `encoding` says.
    pub body: Bytes,
    /// Compression of `body`.
    pub encoding: Encoding,
}

/// Encodes records into a `weir.v1.Batch` body (identity encoding; [`run`](crate::egress::run)
/// then compresses it when the chooser says it pays).
///
/// The body is written straight from the records (no intermediate
/// `pb::Batch`) and starts [`weir_proto::BODY_OFFSET`] bytes past a
/// [`weir_proto::BODY_ALIGN`] boundary, where the file egress wants it.
pub fn encode(node: NodeId, classes: &ClassSet, batch: &OutBatch) -> EncodedBatch {
    let body = weir_proto::encode_records(node, batch.seq, unix_micros(), &batch.records, |r| {
        RecordRef {
            key: &r.key,
            class: &classes.get(r.class).name,
            origin: r.origin,
            seq: r.seq,
            ingress_us: r.ingress_us,
            payload: &r.payload,
        }
    });
    EncodedBatch {
        seq: batch.seq,
        class: batch.class,
        records: batch.records.len(),
        node,
        body,
        encoding: Encoding::Identity,
    }
}
