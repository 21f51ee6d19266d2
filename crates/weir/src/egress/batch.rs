//! A batch as every sink sends it: encoded once into a `weir.v1.Batch`
//! body, then compressed or not.

use bytes::Bytes;
use weir_core::scheduler::OutBatch;
use weir_core::{ClassId, ClassSet, NodeId};
use weir_proto::{pb, Encoding};

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
pub fn encode(node: NodeId, classes: &ClassSet, batch: &OutBatch) -> EncodedBatch {
    let pb = pb::Batch {
        padding: Default::default(),
        node,
        batch_seq: batch.seq,
        created_us: unix_micros(),
        records: batch
            .records
            .iter()
            .map(|r| pb::Record {
                key: String::from_utf8_lossy(&r.key).into_owned(),
                class: classes.get(r.class).name.clone(),
                origin: r.origin,
                seq: r.seq,
                ingress_us: r.ingress_us,
                payload: r.payload.clone(),
            })
            .collect(),
    };
    EncodedBatch {
        seq: batch.seq,
        class: batch.class,
        records: batch.records.len(),
        node,
        body: weir_proto::encode_batch(&pb),
        encoding: Encoding::Identity,
    }
}
