//! Encoding a `weir.v1.Batch` straight from borrowed records: the egress's
//! hot path.
//!
//! [`encode_batch`](crate::encode_batch) takes an owned [`pb::Batch`](crate::pb::Batch),
//! which costs two `String`s and a `Record` per record before a byte is
//! written. [`encode_records`] writes the same bytes (prost's field order,
//! proto3 defaults left out; a test compares the two) from borrowed keys,
//! class names and payloads in one exact-size allocation, so each payload
//! is copied once, into the body.
//!
//! The body starts [`BODY_OFFSET`] bytes past a [`BODY_ALIGN`] boundary:
//! the file egress puts a segment frame's header
//! ([`crate::segment::HEADER_LEN`] bytes) in front of it, and everything
//! after the first block goes to an `O_DIRECT` write without being copied
//! again.

use std::borrow::Cow;

use bytes::Bytes;
use prost::encoding::{encoded_len_varint, WireType};

/// Alignment the body is placed against: the largest logical block size in
/// common use.
pub const BODY_ALIGN: usize = crate::segment::BLOCK;

/// Where an encoded body's first byte sits past a [`BODY_ALIGN`] boundary:
/// room for a segment frame's header.
pub const BODY_OFFSET: usize = crate::segment::HEADER_LEN;

/// One record as [`encode_records`] borrows it.
#[derive(Debug, Clone, Copy)]
pub struct RecordRef<'a> {
    /// The MQTT topic or gRPC stream name; bytes that are not UTF-8 are
    /// replaced (U+FFFD), as `String::from_utf8_lossy` does.
    pub key: &'a [u8],
    /// Its class name.
    pub class: &'a str,
    /// Origin node id.
    pub origin: u64,
    /// Per-origin sequence number.
    pub seq: u64,
    /// Ingress time, microseconds since the Unix epoch.
    pub ingress_us: u64,
    /// The device's bytes.
    pub payload: &'a [u8],
}

/// Bytes of a length-delimited field with `len` bytes of content, or 0 for
/// an empty one (proto3 leaves it out).
fn delimited_len(len: usize) -> usize {
    if len == 0 {
        0
    } else {
        1 + encoded_len_varint(len as u64) + len
    }
}

fn varint_field_len(v: u64) -> usize {
    if v == 0 {
        0
    } else {
        1 + encoded_len_varint(v)
    }
}

/// A field's key (number and wire type): one byte, as every field number
/// of `weir.v1.Batch` and `Record` is below 16.
#[inline]
fn put_key(buf: &mut Vec<u8>, tag: u32, wire: WireType) {
    debug_assert!(tag < 16);
    buf.push(((tag << 3) | wire as u32) as u8);
}

/// A varint, with one capacity check (prost's `encode_varint` pushes byte
/// by byte: 5 % of weir's CPU at 900k records/s).
#[inline]
fn put_varint(buf: &mut Vec<u8>, mut v: u64) {
    let mut tmp = [0u8; 10];
    let mut n = 0;
    while v >= 0x80 {
        tmp[n] = (v as u8) | 0x80;
        v >>= 7;
        n += 1;
    }
    tmp[n] = v as u8;
    buf.extend_from_slice(&tmp[..=n]);
}

fn put_delimited(buf: &mut Vec<u8>, tag: u32, bytes: &[u8]) {
    if !bytes.is_empty() {
        put_key(buf, tag, WireType::LengthDelimited);
        put_varint(buf, bytes.len() as u64);
        buf.extend_from_slice(bytes);
    }
}

fn put_varint_field(buf: &mut Vec<u8>, tag: u32, v: u64) {
    if v != 0 {
        put_key(buf, tag, WireType::Varint);
        put_varint(buf, v);
    }
}

/// Encoded length of one `weir.v1.Record` message (without its own tag and
/// length prefix).
fn record_len(key: &str, r: &RecordRef<'_>) -> usize {
    delimited_len(key.len())
        + delimited_len(r.class.len())
        + varint_field_len(r.origin)
        + varint_field_len(r.seq)
        + varint_field_len(r.ingress_us)
        + delimited_len(r.payload.len())
}

fn key_of<'a>(r: &RecordRef<'a>) -> Cow<'a, str> {
    String::from_utf8_lossy(r.key)
}

/// Encodes a `weir.v1.Batch` (no padding) of `records`, each read through
/// `view`, into a body starting [`BODY_OFFSET`] bytes past a [`BODY_ALIGN`]
/// boundary. The bytes are what prost
/// encodes for the equivalent [`pb::Batch`](crate::pb::Batch).
pub fn encode_records<'a, T>(
    node: u64,
    batch_seq: u64,
    created_us: u64,
    records: &'a [T],
    view: impl Fn(&'a T) -> RecordRef<'a>,
) -> Bytes {
    let mut total =
        varint_field_len(node) + varint_field_len(batch_seq) + varint_field_len(created_us);
    // Each key checked as UTF-8 once, for both passes.
    let keys: Vec<Cow<'a, str>> = records.iter().map(|t| key_of(&view(t))).collect();
    for (t, key) in records.iter().zip(&keys) {
        // A record with every field at its default still takes its tag and
        // a zero length: prost writes repeated messages unconditionally.
        let len = record_len(key, &view(t));
        total += 1 + encoded_len_varint(len as u64) + len;
    }
    let mut buf: Vec<u8> = Vec::with_capacity(total + BODY_ALIGN - 1 + BODY_OFFSET);
    let start = buf.as_ptr().align_offset(BODY_ALIGN) + BODY_OFFSET;
    buf.resize(start, 0);
    put_varint_field(&mut buf, 1, node);
    put_varint_field(&mut buf, 2, batch_seq);
    put_varint_field(&mut buf, 3, created_us);
    for (t, key) in records.iter().zip(&keys) {
        let r = view(t);
        put_key(&mut buf, 4, WireType::LengthDelimited);
        put_varint(&mut buf, record_len(key, &r) as u64);
        put_delimited(&mut buf, 1, key.as_bytes());
        put_delimited(&mut buf, 2, r.class.as_bytes());
        put_varint_field(&mut buf, 3, r.origin);
        put_varint_field(&mut buf, 4, r.seq);
        put_varint_field(&mut buf, 5, r.ingress_us);
        put_delimited(&mut buf, 6, r.payload);
    }
    debug_assert_eq!(buf.len(), start + total);
    Bytes::from(buf).slice(start..)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use prost::Message;

    use super::*;
    use crate::pb;

    #[derive(Debug, Clone)]
    struct Owned {
        key: Vec<u8>,
        class: String,
        origin: u64,
        seq: u64,
        ingress_us: u64,
        payload: Vec<u8>,
    }

    fn owned() -> impl Strategy<Value = Owned> {
        (
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..40),
                "[a-z/+#é]{0,30}".prop_map(String::into_bytes),
            ],
            "[a-z]{0,6}",
            prop_oneof![Just(0u64), any::<u64>()],
            prop_oneof![Just(0u64), any::<u64>()],
            prop_oneof![Just(0u64), any::<u64>()],
            proptest::collection::vec(any::<u8>(), 0..300),
        )
            .prop_map(|(key, class, origin, seq, ingress_us, payload)| Owned {
                key,
                class,
                origin,
                seq,
                ingress_us,
                payload,
            })
    }

    fn view(o: &Owned) -> RecordRef<'_> {
        RecordRef {
            key: &o.key,
            class: &o.class,
            origin: o.origin,
            seq: o.seq,
            ingress_us: o.ingress_us,
            payload: &o.payload,
        }
    }

    proptest! {
        #[test]
        fn same_bytes_as_prost(
            node in prop_oneof![Just(0u64), any::<u64>()],
            seq in prop_oneof![Just(0u64), any::<u64>()],
            created in prop_oneof![Just(0u64), any::<u64>()],
            records in proptest::collection::vec(owned(), 0..20),
        ) {
            let pb = pb::Batch {
                node,
                batch_seq: seq,
                created_us: created,
                padding: Default::default(),
                records: records
                    .iter()
                    .map(|o| pb::Record {
                        key: String::from_utf8_lossy(&o.key).into_owned(),
                        class: o.class.clone(),
                        origin: o.origin,
                        seq: o.seq,
                        ingress_us: o.ingress_us,
                        payload: Bytes::copy_from_slice(&o.payload),
                    })
                    .collect(),
            };
            let ours = encode_records(node, seq, created, &records, view);
            prop_assert_eq!(&ours[..], &pb.encode_to_vec()[..]);
            prop_assert_eq!(ours.as_ptr() as usize % BODY_ALIGN, BODY_OFFSET);
            prop_assert_eq!(pb::Batch::decode(ours).unwrap(), pb);
        }
    }
}
