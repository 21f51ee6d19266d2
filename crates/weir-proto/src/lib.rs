//! weir-proto: weir's wire types and gRPC services, generated at build time
//! from `proto/weir/v1/*.proto` by protox + tonic-prost-build (no system
//! `protoc` needed), and the batch codec a cloud-side consumer uses.
//!
//! # Layout
//! - [`pb`]: the generated `weir.v1` messages and services.
//! - [`codec`]: [`codec::decode_batch`] / [`codec::encode_batch`] for AMQP
//!   message bodies and batch files, and [`codec::compress`] /
//!   [`codec::decompress`] for their `identity`, `gzip` and `zstd`
//!   encodings (decoding capped against compression bombs).
//! - [`writer`]: [`writer::encode_records`], the same body from borrowed
//!   records (the egress's hot path), placed for direct I/O.
//! - [`segment`]: the file egress's segment files (frames of batches) and
//!   their reader.
//! - [`FILE_DESCRIPTOR_SET`]: the encoded descriptors, for gRPC reflection.

pub mod codec;

pub mod pb;

pub mod segment;

pub mod writer;

pub use codec::{
    compress, decode_batch, decompress, encode_batch, CompressError, DecodeError, Encoding,
    CONTENT_TYPE,
};
pub use writer::{encode_records, RecordRef, BODY_ALIGN, BODY_OFFSET};

/// Encoded `FileDescriptorSet` of every weir proto, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/weir_descriptor.bin"));
