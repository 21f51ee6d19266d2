//! The spool's on-disk format: a segment header, then frames.
//!
//! ```text
//! segment = header frame*
//! header  = "WEIRSPL1" u16:version u16:header_len u64:first_index
//!           u64:origin u64:base_seq u64:base_us u8:class_len class
//!           u32:crc32c(everything before it)
//! frame   = u32:body_len u32:crc32c(body) body
//! body    = u8:flags varint:index-first_index zigzag:seq-base_seq
//!           zigzag:ingress_us-base_us [varint:origin if flags&1]
//!           keyfield payload
//! keyfield = varint:id varint:key_len key   if flags&2 (defines id)
//!          | varint:id                      if flags&4 (uses id)
//!          | varint:key_len key             otherwise
//! ```
//!
//! Integers are little-endian. Fields that repeat from record to record
//! (class, origin, the high bits of sequence number and time) live once in
//! the header and the frame carries deltas, and a key the segment already
//! holds is an id ([`super::keys`]), so a 256-byte reading costs about 20
//! bytes besides its payload: the issue's budget is 1.2 bytes on disk per
//! payload byte. Every frame carries its own index, so a corrupt frame can
//! be skipped without renumbering those after it.
//!
//! Version 1 (weir before the key table) is the same without flags 2 and
//! 4; it is still read, and a version 1 segment reopened after an upgrade
//! is appended to with full keys.

use bytes::{BufMut, Bytes};

use crate::record::NodeId;

/// First bytes of every segment file (the format version follows it).
pub const MAGIC: &[u8; 8] = b"WEIRSPL1";
/// The format version this code writes; it reads this and version 1.
pub const VERSION: u16 = 2;
/// Flag: the record's origin is not the header's.
const FOREIGN: u8 = 1;
/// Flag: the frame defines a key id.
const DEFINES: u8 = 2;
/// Flag: the frame uses a key id.
const USES: u8 = 4;
/// Longest class name a header holds (config names are short).
pub const MAX_CLASS_NAME: usize = 255;
/// Bytes of a frame's length and checksum.
pub const FRAME_PREFIX: usize = 8;
/// Longest frame body accepted when reading: larger lengths are corruption.
/// Records are bounded by their class queue's byte capacity, far below.
pub const MAX_BODY: usize = 64 << 20;
/// Shortest possible body: flags, three one-byte varints and a key length.
const MIN_BODY: usize = 5;

/// How a frame carries its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyField {
    /// In full, without an id (format version 1, or the table is full).
    Inline,
    /// In full, and it defines (or defines again) this id.
    Define(u32),
    /// Only this id, defined by an earlier frame of the segment.
    Use(u32),
}

/// What a segment's header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentHeader {
    /// Format version the segment's frames are written in.
    pub version: u16,
    /// Index of the first record appended to the segment.
    pub first_index: u64,
    /// The origin most records carry (this node).
    pub origin: NodeId,
    /// Sequence numbers are stored relative to this.
    pub base_seq: u64,
    /// Ingress times are stored relative to this (microseconds since the
    /// Unix epoch).
    pub base_us: u64,
    /// The latency class of every record in the segment.
    pub class: String,
}

/// Why a header cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// Fewer bytes than a header.
    #[error("shorter than a segment header")]
    Short,
    /// Not a weir spool segment.
    #[error("not a weir spool segment (bad magic)")]
    Magic,
    /// Written by a newer weir.
    #[error(
        "segment format version {0} is not supported (this weir reads versions 1 to {VERSION})"
    )]
    Version(u16),
    /// The checksum does not match.
    #[error("segment header checksum mismatch")]
    Checksum,
    /// A length field is out of range.
    #[error("segment header is malformed")]
    Malformed,
}

impl SegmentHeader {
    /// Bytes the encoded header takes.
    pub fn encoded_len(&self) -> usize {
        8 + 2 + 2 + 8 * 4 + 1 + self.class.len().min(MAX_CLASS_NAME) + 4
    }

    /// Appends the encoded header to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        let name = &self.class.as_bytes()[..self.class.len().min(MAX_CLASS_NAME)];
        out.extend_from_slice(MAGIC);
        out.put_u16_le(self.version);
        out.put_u16_le(self.encoded_len() as u16);
        out.put_u64_le(self.first_index);
        out.put_u64_le(self.origin);
        out.put_u64_le(self.base_seq);
        out.put_u64_le(self.base_us);
        out.put_u8(name.len() as u8);
        out.extend_from_slice(name);
        let crc = crc32c::crc32c(&out[start..]);
        out.put_u32_le(crc);
    }

    /// Reads a header from the start of `bytes`; returns it and its length.
    pub fn decode(bytes: &[u8]) -> Result<(SegmentHeader, usize), HeaderError> {
        if bytes.len() < 12 {
            return Err(HeaderError::Short);
        }
        if &bytes[..8] != MAGIC {
            return Err(HeaderError::Magic);
        }
        let version = u16::from_le_bytes([bytes[8], bytes[9]]);
        if !(1..=VERSION).contains(&version) {
            return Err(HeaderError::Version(version));
        }
        let len = u16::from_le_bytes([bytes[10], bytes[11]]) as usize;
        if len < 12 + 32 + 1 + 4 {
            return Err(HeaderError::Malformed);
        }
        if bytes.len() < len {
            return Err(HeaderError::Short);
        }
        let crc = u32::from_le_bytes(bytes[len - 4..len].try_into().expect("4 bytes"));
        if crc32c::crc32c(&bytes[..len - 4]) != crc {
            return Err(HeaderError::Checksum);
        }
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let name_len = bytes[44] as usize;
        if 45 + name_len + 4 != len {
            return Err(HeaderError::Malformed);
        }
        let class = std::str::from_utf8(&bytes[45..45 + name_len])
            .map_err(|_| HeaderError::Malformed)?
            .to_owned();
        Ok((
            SegmentHeader {
                version,
                first_index: u64_at(12),
                origin: u64_at(20),
                base_seq: u64_at(28),
                base_us: u64_at(36),
                class,
            },
            len,
        ))
    }
}

/// One record as the spool stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Its position in its class's log.
    pub index: u64,
    /// Where it entered weir.
    pub origin: NodeId,
    /// Its sequence number at the origin.
    pub seq: u64,
    /// When it entered weir, microseconds since the Unix epoch.
    pub ingress_us: u64,
    /// MQTT topic or gRPC stream.
    pub key: Bytes,
    /// The device's bytes.
    pub payload: Bytes,
}

/// A record to encode: [`Frame`] with its key and payload borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameRef<'a> {
    pub index: u64,
    pub origin: NodeId,
    pub seq: u64,
    pub ingress_us: u64,
    pub key: &'a [u8],
    pub payload: &'a [u8],
}

impl Frame {
    /// The frame with its bytes borrowed, to encode.
    pub fn borrowed(&self) -> FrameRef<'_> {
        FrameRef {
            index: self.index,
            origin: self.origin,
            seq: self.seq,
            ingress_us: self.ingress_us,
            key: &self.key,
            payload: &self.payload,
        }
    }
}

/// Why the bytes at an offset are not a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The frame runs past the end of the bytes given: a torn write at the
    /// tail, or (mid-file) a corrupt length.
    #[error("frame runs past the end of the data")]
    Truncated,
    /// The length field is impossible.
    #[error("frame length {0} is out of range")]
    Length(u32),
    /// The body does not match its checksum.
    #[error("frame checksum mismatch")]
    Checksum,
    /// The checksum matches but the body does not parse.
    #[error("frame body is malformed")]
    Malformed,
    /// The frame uses a key id whose defining frame was lost (corrupt).
    #[error("frame uses key id {0}, whose definition is lost")]
    UnknownKey(u32),
}

/// Bytes the frame of a record with this key and payload takes, at most
/// (varints at their longest); used for quota checks before encoding.
pub fn max_frame_len(key: usize, payload: usize) -> usize {
    FRAME_PREFIX + 1 + 10 * 6 + key + payload
}

/// Appends the frame of `frame` to `out`, relative to `header`, carrying
/// its key as `key` says ([`super::keys::SegmentKeys::field`]; always
/// [`KeyField::Inline`] in a version 1 segment).
pub fn encode(header: &SegmentHeader, frame: &FrameRef<'_>, key: KeyField, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0u8; FRAME_PREFIX]);
    let foreign = frame.origin != header.origin;
    let key = if header.version < 2 {
        KeyField::Inline
    } else {
        key
    };
    let flags = match key {
        KeyField::Inline => 0,
        KeyField::Define(_) => DEFINES,
        KeyField::Use(_) => USES,
    };
    out.put_u8(flags | if foreign { FOREIGN } else { 0 });
    put_varint(out, frame.index.wrapping_sub(header.first_index));
    put_varint(out, zigzag(frame.seq.wrapping_sub(header.base_seq) as i64));
    put_varint(
        out,
        zigzag(frame.ingress_us.wrapping_sub(header.base_us) as i64),
    );
    if foreign {
        put_varint(out, frame.origin);
    }
    match key {
        KeyField::Inline => {}
        KeyField::Define(id) | KeyField::Use(id) => put_varint(out, u64::from(id)),
    }
    if !matches!(key, KeyField::Use(_)) {
        put_varint(out, frame.key.len() as u64);
        out.extend_from_slice(frame.key);
    }
    out.extend_from_slice(frame.payload);
    let body_len = (out.len() - start - FRAME_PREFIX) as u32;
    let crc = crc32c::crc32c(&out[start + FRAME_PREFIX..]);
    out[start..start + 4].copy_from_slice(&body_len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// Reads the frame at the start of `bytes`; returns it, its length and how
/// it carries its key. `key` and `payload` are slices of `bytes` (no
/// copy); with [`KeyField::Use`] the key is empty until resolved
/// ([`super::keys::SegmentKeys::resolve`]).
pub fn decode(
    header: &SegmentHeader,
    bytes: &Bytes,
) -> Result<(Frame, usize, KeyField), FrameError> {
    if bytes.len() < FRAME_PREFIX {
        return Err(FrameError::Truncated);
    }
    let body_len = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"));
    if (body_len as usize) < MIN_BODY || body_len as usize > MAX_BODY {
        return Err(FrameError::Length(body_len));
    }
    let total = FRAME_PREFIX + body_len as usize;
    if bytes.len() < total {
        return Err(FrameError::Truncated);
    }
    let crc = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
    let body = &bytes[FRAME_PREFIX..total];
    if crc32c::crc32c(body) != crc {
        return Err(FrameError::Checksum);
    }
    let mut at = 1;
    let flags = body[0];
    let mut next = || -> Result<u64, FrameError> {
        let (v, n) = get_varint(&body[at..]).ok_or(FrameError::Malformed)?;
        at += n;
        Ok(v)
    };
    let index = header.first_index.wrapping_add(next()?);
    let seq = header.base_seq.wrapping_add(unzigzag(next()?) as u64);
    let ingress_us = header.base_us.wrapping_add(unzigzag(next()?) as u64);
    let origin = if flags & FOREIGN != 0 {
        next()?
    } else {
        header.origin
    };
    let known = if header.version < 2 {
        FOREIGN
    } else {
        FOREIGN | DEFINES | USES
    };
    if flags & !known != 0 || flags & (DEFINES | USES) == DEFINES | USES {
        return Err(FrameError::Malformed);
    }
    let field = if flags & (DEFINES | USES) == 0 {
        KeyField::Inline
    } else {
        let id = u32::try_from(next()?).map_err(|_| FrameError::Malformed)?;
        if flags & DEFINES != 0 {
            KeyField::Define(id)
        } else {
            KeyField::Use(id)
        }
    };
    let key_len = match field {
        KeyField::Use(_) => 0,
        _ => next()? as usize,
    };
    if key_len > body.len() - at {
        return Err(FrameError::Malformed);
    }
    let key = bytes.slice(FRAME_PREFIX + at..FRAME_PREFIX + at + key_len);
    let payload = bytes.slice(FRAME_PREFIX + at + key_len..total);
    Ok((
        Frame {
            index,
            origin,
            seq,
            ingress_us,
            key,
            payload,
        },
        total,
        field,
    ))
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(crate) fn get_varint(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        v |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return Some((v, i + 1));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> SegmentHeader {
        SegmentHeader {
            version: VERSION,
            first_index: 1000,
            origin: 7,
            base_seq: 1_700_000_000_000_000,
            base_us: 1_700_000_000_000_000,
            class: "ls".into(),
        }
    }

    fn frame(index: u64, seq: u64, origin: NodeId) -> Frame {
        Frame {
            index,
            origin,
            seq,
            ingress_us: 1_700_000_000_500_000,
            key: Bytes::from_static(b"plant/line1/temp"),
            payload: Bytes::from(vec![0xab; 256]),
        }
    }

    #[test]
    fn header_round_trips_and_detects_damage() {
        let mut buf = Vec::new();
        header().encode(&mut buf);
        assert_eq!(buf.len(), header().encoded_len());
        assert_eq!(SegmentHeader::decode(&buf), Ok((header(), buf.len())));
        let mut bad = buf.clone();
        bad[30] ^= 1;
        assert_eq!(SegmentHeader::decode(&bad), Err(HeaderError::Checksum));
        bad = buf.clone();
        bad[0] = b'X';
        assert_eq!(SegmentHeader::decode(&bad), Err(HeaderError::Magic));
        bad = buf.clone();
        bad[8] = 9;
        assert_eq!(SegmentHeader::decode(&bad), Err(HeaderError::Version(9)));
        assert_eq!(SegmentHeader::decode(&buf[..20]), Err(HeaderError::Short));
    }

    #[test]
    fn frames_round_trip_including_seq_below_base_and_foreign_origin() {
        let h = header();
        for f in [
            frame(1000, h.base_seq + 5, 7),
            frame(1001, h.base_seq - 3, 7),
            frame(1002, u64::MAX, 99),
            frame(u64::MAX, 0, 0),
        ] {
            for key in [KeyField::Inline, KeyField::Define(3), KeyField::Use(300)] {
                let mut buf = Vec::new();
                encode(&h, &f.borrowed(), key, &mut buf);
                let bytes = Bytes::from(buf);
                let mut want = f.clone();
                if matches!(key, KeyField::Use(_)) {
                    want.key = Bytes::new();
                }
                assert_eq!(decode(&h, &bytes), Ok((want, bytes.len(), key)));
            }
        }
    }

    #[test]
    fn a_version_1_segment_is_read_and_written_with_full_keys() {
        let h = SegmentHeader {
            version: 1,
            ..header()
        };
        let mut buf = Vec::new();
        h.encode(&mut buf);
        assert_eq!(SegmentHeader::decode(&buf), Ok((h.clone(), buf.len())));
        let f = frame(1000, h.base_seq, 7);
        let mut buf = Vec::new();
        encode(&h, &f.borrowed(), KeyField::Use(1), &mut buf);
        let bytes = Bytes::from(buf);
        assert_eq!(
            decode(&h, &bytes),
            Ok((f.clone(), bytes.len(), KeyField::Inline))
        );
        // Key flags in a version 1 segment are damage.
        let mut buf = Vec::new();
        encode(&header(), &f.borrowed(), KeyField::Define(0), &mut buf);
        assert_eq!(decode(&h, &Bytes::from(buf)), Err(FrameError::Malformed));
    }

    #[test]
    fn framing_of_a_256_byte_reading_stays_within_the_write_budget() {
        let h = header();
        // A segment 100,000 frames and 40 s in.
        let f = Frame {
            ingress_us: h.base_us + 40_000_000,
            ..frame(101_000, h.base_seq + 100_000, 7)
        };
        let mut buf = Vec::new();
        encode(&h, &f.borrowed(), KeyField::Inline, &mut buf);
        let overhead = buf.len() - f.payload.len() - f.key.len();
        assert!(overhead <= 24, "{overhead} bytes of framing");
        // With the key an id, everything besides the payload.
        let mut buf = Vec::new();
        encode(&h, &f.borrowed(), KeyField::Use(40), &mut buf);
        let overhead = buf.len() - f.payload.len();
        assert!(overhead <= 22, "{overhead} bytes besides the payload");
    }

    #[test]
    fn every_damaged_byte_is_detected() {
        let h = header();
        let mut buf = Vec::new();
        encode(
            &h,
            &frame(1000, h.base_seq, 7).borrowed(),
            KeyField::Define(2),
            &mut buf,
        );
        for i in 0..buf.len() {
            let mut bad = buf.clone();
            bad[i] ^= 0x10;
            let bad = Bytes::from(bad);
            assert!(decode(&h, &bad).is_err(), "flip at {i} not detected");
        }
        for cut in 0..buf.len() {
            let torn = Bytes::copy_from_slice(&buf[..cut]);
            assert!(decode(&h, &torn).is_err(), "cut at {cut} not detected");
        }
    }
}
