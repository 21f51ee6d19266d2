//! Encoding and decoding whole batches: what a cloud-side consumer calls on
//! the body of each AMQP message (or each batch file).
//!
//! The AMQP `content_type` is [`CONTENT_TYPE`]; `content_encoding` names the
//! compression ([`Encoding`]). Decoding enforces a cap on the decoded size so
//! that a hostile or corrupt body cannot exhaust memory.

use bytes::Bytes;
use prost::Message;

use crate::pb;

/// AMQP `content_type` of a weir batch: protobuf `weir.v1.Batch`.
pub const CONTENT_TYPE: &str = "application/x-protobuf; proto=weir.v1.Batch";

/// Default cap on a decoded batch (64 MiB): far above any batch weir builds
/// by default (batches are capped at a few MiB) yet bounded.
pub const DEFAULT_MAX_DECODED: usize = 64 << 20;

/// How a batch body is compressed (AMQP `content_encoding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// Not compressed.
    Identity,
}

impl Encoding {
    /// The `content_encoding` token.
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Identity => "identity",
        }
    }

    /// Parses a `content_encoding` token; an absent or empty one is identity.
    pub fn parse(token: &str) -> Result<Encoding, DecodeError> {
        match token.trim() {
            "" | "identity" => Ok(Encoding::Identity),
            other => Err(DecodeError::UnknownEncoding(other.to_string())),
        }
    }
}

/// Why a body is not a readable batch.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// A `content_encoding` weir does not produce.
    #[error("unknown content encoding `{0}` (known: identity)")]
    UnknownEncoding(String),
    /// The body is larger than the cap.
    #[error("batch is larger than the {limit}-byte cap on decoded batches")]
    TooLarge {
        /// The cap in force.
        limit: usize,
    },
    /// Not a `weir.v1.Batch`.
    #[error("not a weir.v1.Batch protobuf: {0}")]
    Protobuf(#[from] prost::DecodeError),
}

/// Serialises a batch (identity encoding).
pub fn encode_batch(batch: &pb::Batch) -> Bytes {
    Bytes::from(batch.encode_to_vec())
}

/// Decodes a batch body with its `content_encoding`, refusing any whose
/// decoded size exceeds `max_decoded` bytes.
pub fn decode_batch(
    body: &[u8],
    content_encoding: &str,
    max_decoded: usize,
) -> Result<pb::Batch, DecodeError> {
    match Encoding::parse(content_encoding)? {
        Encoding::Identity => {
            if body.len() > max_decoded {
                return Err(DecodeError::TooLarge { limit: max_decoded });
            }
            Ok(pb::Batch::decode(body)?)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch() -> pb::Batch {
        pb::Batch {
            node: 7,
            batch_seq: 3,
            created_us: 1,
            records: vec![pb::Record {
                key: "factory/a".into(),
                class: "ls".into(),
                origin: 7,
                seq: 42,
                ingress_us: 5,
                payload: Bytes::from_static(&[0, 159, 146, 150, 255]),
            }],
        }
    }

    #[test]
    fn round_trip_keeps_raw_bytes() {
        let body = encode_batch(&batch());
        assert_eq!(decode_batch(&body, "identity", 1 << 20).unwrap(), batch());
        assert_eq!(decode_batch(&body, "", 1 << 20).unwrap(), batch());
    }

    #[test]
    fn refuses_unknown_encodings_oversized_and_garbage() {
        let body = encode_batch(&batch());
        assert!(matches!(
            decode_batch(&body, "br", 1 << 20),
            Err(DecodeError::UnknownEncoding(_))
        ));
        assert!(matches!(
            decode_batch(&body, "identity", 4),
            Err(DecodeError::TooLarge { limit: 4 })
        ));
        assert!(matches!(
            decode_batch(&[0xff, 0xff, 0xff], "identity", 1 << 20),
            Err(DecodeError::Protobuf(_))
        ));
    }
}
