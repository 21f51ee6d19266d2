//! The generated `weir.v1` package. `bytes` fields are [`bytes::Bytes`], so
//! payloads move without copies.
#![allow(missing_docs, clippy::all)]

tonic::include_proto!("weir.v1");
