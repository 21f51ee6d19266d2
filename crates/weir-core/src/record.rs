//! The unit weir relays.

use bytes::Bytes;

use crate::class::ClassId;

/// Identifies a weir node; carried with every record so that the cloud side
/// can tell redirected records apart and count duplicates by
/// `(origin, seq)` (JANUS Section VI fault tolerance: sequence numbers).
pub type NodeId = u64;

/// One record: a payload from a device, with where and when it entered weir.
///
/// Cloning is cheap: the key and the payload are reference-counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The MQTT topic or gRPC stream name it arrived on.
    pub key: Bytes,
    /// Its latency class.
    pub class: ClassId,
    /// The node where it first entered a weir instance.
    pub origin: NodeId,
    /// Per-origin sequence number, strictly increasing at the origin.
    pub seq: u64,
    /// When it entered the origin, in microseconds since the Unix epoch.
    pub ingress_us: u64,
    /// The device's bytes, never re-encoded.
    pub payload: Bytes,
    /// Its index in this node's spool log of its class, once it is on
    /// disk there; `None` for records held in memory only and for records
    /// received from peers (their origin keeps them). Never sent on a wire.
    pub spool: Option<u64>,
}

/// Bytes a record occupies in a queue beyond its key and payload: the fixed
/// fields, as an estimate of in-memory and wire overhead for byte accounting.
pub const RECORD_OVERHEAD: usize = 32;

/// What the confirmation of a record needs once its batch is encoded (its
/// key and payload are then in the batch's body): its class, where and
/// when it entered weir, and its spool index. The egress holds these for
/// the batches it waits on, 48 bytes a record against a [`Record`]'s 112
/// and its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Receipt {
    /// [`Record::origin`].
    pub origin: NodeId,
    /// [`Record::seq`].
    pub seq: u64,
    /// [`Record::ingress_us`].
    pub ingress_us: u64,
    /// [`Record::spool`].
    pub spool: Option<u64>,
    /// [`Record::class`].
    pub class: ClassId,
}

impl From<&Record> for Receipt {
    fn from(r: &Record) -> Self {
        Receipt {
            origin: r.origin,
            seq: r.seq,
            ingress_us: r.ingress_us,
            spool: r.spool,
            class: r.class,
        }
    }
}

impl Record {
    /// Bytes this record counts for in queue capacity and token buckets.
    #[inline]
    pub fn size(&self) -> usize {
        self.key.len() + self.payload.len() + RECORD_OVERHEAD
    }
}
