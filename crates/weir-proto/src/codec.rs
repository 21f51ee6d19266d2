//! Encoding and decoding whole batches: what a cloud-side consumer calls on
//! the body of each AMQP message (or each batch file).
//!
//! The AMQP `content_type` is [`CONTENT_TYPE`]; `content_encoding` names the
//! compression ([`Encoding`]: `identity`, `gzip` or `zstd`). Decoding
//! enforces a cap on the decoded size so that a hostile or corrupt body
//! cannot exhaust memory: compressed bodies are decompressed as a stream
//! that stops one byte past the cap ([`DecodeError::TooLarge`]), so a
//! compression bomb costs at most the cap, never its expanded size.
//!
//! [`compress`] is the other half, used by weir's egress; it takes an
//! [`Encoding`] and a level rather than weir-core's `Codec`, so that a
//! consumer needs nothing but this crate.

use std::io::{self, Read, Write};

use bytes::Bytes;
use prost::Message;

use crate::pb;

/// AMQP `content_type` of a weir batch: protobuf `weir.v1.Batch`.
pub const CONTENT_TYPE: &str = "application/x-protobuf; proto=weir.v1.Batch";

/// Default cap on a decoded batch (64 MiB): far above any batch weir builds
/// by default (batches are capped at a few MiB) yet bounded.
pub const DEFAULT_MAX_DECODED: usize = 64 << 20;

/// Smallest zstd window (log2 bytes) a decoder accepts whatever the cap:
/// 8 MiB, what zstd's own encoder picks for levels up to 19 when it does not
/// know the input size, so frames from other producers still decode.
const ZSTD_MIN_WINDOW_LOG: u32 = 23;

/// Largest zstd window (log2 bytes) ever accepted (1 GiB, zstd's limit on
/// 32-bit targets), however large the cap.
const ZSTD_MAX_WINDOW_LOG: u32 = 30;

/// First allocation for a decompressed body, as a multiple of the
/// compressed size: batch records are alike, so ratios of 4 or more are
/// common; the buffer then doubles, never past the cap.
const EXPANSION_GUESS: usize = 4;

/// Smallest first allocation for a decompressed body.
const MIN_FIRST_READ: usize = 4096;

/// How a batch body is compressed (AMQP `content_encoding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// Not compressed.
    Identity,
    /// gzip (RFC 1952), one or more members.
    Gzip,
    /// zstd (RFC 8878), one or more frames.
    Zstd,
}

impl Encoding {
    /// Every encoding weir produces and decodes.
    pub const ALL: [Encoding; 3] = [Encoding::Identity, Encoding::Gzip, Encoding::Zstd];

    /// The `content_encoding` token.
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Identity => "identity",
            Encoding::Gzip => "gzip",
            Encoding::Zstd => "zstd",
        }
    }

    /// Parses a `content_encoding` token (case-insensitive, as HTTP content
    /// codings are); an absent or empty one is identity.
    pub fn parse(token: &str) -> Result<Encoding, DecodeError> {
        let t = token.trim();
        if t.is_empty() {
            return Ok(Encoding::Identity);
        }
        Encoding::ALL
            .into_iter()
            .find(|e| t.eq_ignore_ascii_case(e.as_str()))
            .ok_or_else(|| DecodeError::UnknownEncoding(t.to_string()))
    }

    /// The encoding of a body that came without a `content_encoding` (the
    /// MQTT sink's batch mode), told by its first bytes: gzip's and zstd's
    /// magic numbers, which a `weir.v1.Batch` (starting with field 1's tag,
    /// 0x08) never begins with.
    pub fn sniff(body: &[u8]) -> Encoding {
        if body.starts_with(&[0x1f, 0x8b]) {
            Encoding::Gzip
        } else if body.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Encoding::Zstd
        } else {
            Encoding::Identity
        }
    }
}

impl std::fmt::Display for Encoding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a body is not a readable batch.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// A `content_encoding` weir does not produce.
    #[error("unknown content encoding `{0}` (known: identity, gzip, zstd)")]
    UnknownEncoding(String),
    /// The body is, or decompresses to, more than the cap.
    #[error("batch is larger than the {limit}-byte cap on decoded batches (raise it, e.g. `weir decode --max-size`, if the sender is trusted)")]
    TooLarge {
        /// The cap in force.
        limit: usize,
    },
    /// The compressed stream is damaged, truncated, not in the encoding its
    /// `content_encoding` says, or (zstd) asks for a window beyond the cap.
    #[error("{encoding} body does not decompress: {source}")]
    Corrupt {
        /// The `content_encoding` token.
        encoding: &'static str,
        /// What the decompressor reported.
        #[source]
        source: io::Error,
    },
    /// Not a `weir.v1.Batch`.
    #[error("not a weir.v1.Batch protobuf: {0}")]
    Protobuf(#[from] prost::DecodeError),
}

/// Why a body could not be compressed (only resource exhaustion inside the
/// codec library; compressing into memory has no other failure).
#[derive(Debug, thiserror::Error)]
#[error("{encoding} compression at level {level} failed: {source}")]
pub struct CompressError {
    /// The `content_encoding` token.
    pub encoding: &'static str,
    /// The level asked for.
    pub level: i32,
    /// What the compressor reported.
    #[source]
    pub source: io::Error,
}

/// Serialises a batch (identity encoding).
pub fn encode_batch(batch: &pb::Batch) -> Bytes {
    Bytes::from(batch.encode_to_vec())
}

/// Compresses `body` with `encoding` at `level` (gzip 0..=9, clamped; zstd
/// as the library takes it, e.g. 1..=22). Identity returns a copy.
pub fn compress(body: &[u8], encoding: Encoding, level: i32) -> Result<Vec<u8>, CompressError> {
    let fail = |source| CompressError {
        encoding: encoding.as_str(),
        level,
        source,
    };
    match encoding {
        Encoding::Identity => Ok(body.to_vec()),
        Encoding::Gzip => {
            let level = flate2::Compression::new(level.clamp(0, 9) as u32);
            // Compressible batches shrink several-fold: a quarter avoids most
            // regrowth without reserving the whole input.
            let out = Vec::with_capacity(body.len() / 4 + 64);
            let mut enc = flate2::write::GzEncoder::new(out, level);
            enc.write_all(body).map_err(fail)?;
            enc.finish().map_err(fail)
        }
        // One-shot: the encoder knows the input size, so the frame records
        // it and the window is no larger than the input.
        Encoding::Zstd => zstd::bulk::compress(body, level).map_err(fail),
    }
}

/// Decompresses `body` per `encoding`, refusing output beyond `max_decoded`
/// bytes without producing it.
pub fn decompress(
    body: &[u8],
    encoding: Encoding,
    max_decoded: usize,
) -> Result<Bytes, DecodeError> {
    let corrupt = |source| DecodeError::Corrupt {
        encoding: encoding.as_str(),
        source,
    };
    match encoding {
        Encoding::Identity => {
            if body.len() > max_decoded {
                return Err(DecodeError::TooLarge { limit: max_decoded });
            }
            Ok(Bytes::copy_from_slice(body))
        }
        Encoding::Gzip => read_capped(
            flate2::bufread::MultiGzDecoder::new(body),
            body.len(),
            max_decoded,
        )
        .map_err(|e| e.or_else(corrupt)),
        Encoding::Zstd => {
            let mut dec = zstd::stream::read::Decoder::with_buffer(body).map_err(corrupt)?;
            // zstd allocates its window from the frame header before any
            // output exists: bound it by the cap too, so a tiny frame cannot
            // claim a huge window.
            dec.window_log_max(zstd_window_log(max_decoded))
                .map_err(corrupt)?;
            read_capped(dec, body.len(), max_decoded).map_err(|e| e.or_else(corrupt))
        }
    }
}

/// Decodes a batch body with its `content_encoding`, refusing any whose
/// decoded size exceeds `max_decoded` bytes.
pub fn decode_batch(
    body: &[u8],
    content_encoding: &str,
    max_decoded: usize,
) -> Result<pb::Batch, DecodeError> {
    match Encoding::parse(content_encoding)? {
        // No copy: decode straight from the body.
        Encoding::Identity => {
            if body.len() > max_decoded {
                return Err(DecodeError::TooLarge { limit: max_decoded });
            }
            Ok(pb::Batch::decode(body)?)
        }
        // Payloads become slices of the decompressed buffer.
        enc => Ok(pb::Batch::decode(decompress(body, enc, max_decoded)?)?),
    }
}

/// The zstd window limit (log2 bytes) for a cap: the smallest power of two
/// holding the cap, within [`ZSTD_MIN_WINDOW_LOG`]..=[`ZSTD_MAX_WINDOW_LOG`].
fn zstd_window_log(max_decoded: usize) -> u32 {
    let ceil_log2 = usize::BITS - max_decoded.saturating_sub(1).leading_zeros();
    ceil_log2.clamp(ZSTD_MIN_WINDOW_LOG, ZSTD_MAX_WINDOW_LOG)
}

/// A read failure: the cap was passed, or the decompressor failed.
enum Capped {
    TooLarge(usize),
    Io(io::Error),
}

impl Capped {
    fn or_else(self, io: impl FnOnce(io::Error) -> DecodeError) -> DecodeError {
        match self {
            Capped::TooLarge(limit) => DecodeError::TooLarge { limit },
            Capped::Io(e) => io(e),
        }
    }
}

/// Reads `r` to its end into a buffer that never grows past `max + 1`
/// bytes: the reader is cut off one byte past the cap, and the buffer grows
/// by doubling, each step bounded by what is left of the cap.
fn read_capped(r: impl Read, compressed_len: usize, max: usize) -> Result<Bytes, Capped> {
    let limit = max.saturating_add(1);
    let mut r = r.take(limit as u64);
    let first = compressed_len
        .saturating_mul(EXPANSION_GUESS)
        .max(MIN_FIRST_READ)
        .min(limit);
    let mut out = Vec::with_capacity(first);
    loop {
        if out.len() == out.capacity() {
            if out.len() >= limit {
                break;
            }
            let grow = out.len().max(MIN_FIRST_READ).min(limit - out.len());
            out.reserve_exact(grow);
        }
        let room = out.capacity() - out.len();
        // `read_to_end` on a reader limited to the spare capacity fills it
        // without reallocating (its probe reads find the limit reached).
        let n = (&mut r)
            .take(room as u64)
            .read_to_end(&mut out)
            .map_err(Capped::Io)?;
        if n < room {
            break;
        }
    }
    if out.len() > max {
        return Err(Capped::TooLarge(max));
    }
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    /// Records the largest single allocation made by a thread while armed,
    /// so a test can show a decode never allocated the expanded size.
    struct Tracking;

    thread_local! {
        static ARMED: Cell<bool> = const { Cell::new(false) };
        static LARGEST: Cell<usize> = const { Cell::new(0) };
    }

    fn note(size: usize) {
        // `try_with`: allocations also happen while a thread's locals are
        // being torn down.
        let _ = ARMED.try_with(|armed| {
            if armed.get() {
                let _ = LARGEST.try_with(|m| m.set(m.get().max(size)));
            }
        });
    }

    // SAFETY: every call is forwarded unchanged to the system allocator.
    unsafe impl GlobalAlloc for Tracking {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            note(layout.size());
            unsafe { System.alloc(layout) }
        }
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            note(layout.size());
            unsafe { System.alloc_zeroed(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            unsafe { System.dealloc(ptr, layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            note(new_size);
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }

    #[global_allocator]
    static ALLOCATOR: Tracking = Tracking;

    /// Runs `f` and returns its result with the largest allocation it made
    /// on this thread.
    fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
        LARGEST.with(|m| m.set(0));
        ARMED.with(|a| a.set(true));
        let out = f();
        ARMED.with(|a| a.set(false));
        (out, LARGEST.with(Cell::get))
    }

    fn batch() -> pb::Batch {
        pb::Batch {
            padding: Default::default(),
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

    /// A batch of sensor-CSV rows, as compressible as real telemetry.
    fn sensor_batch(rows: usize) -> pb::Batch {
        pb::Batch {
            padding: Default::default(),
            node: 1,
            batch_seq: 9,
            created_us: 2,
            records: (0..rows)
                .map(|i| pb::Record {
                    key: "accel".into(),
                    class: "nm".into(),
                    origin: 1,
                    seq: i as u64,
                    ingress_us: 1_000 + i as u64,
                    payload: Bytes::from(format!(
                        "2026-11-22T10:00:{:02}.{:03},0.{:04},-0.98{:02},9.81\n",
                        i % 60,
                        i % 1000,
                        (i * 7) % 10_000,
                        i % 100
                    )),
                })
                .collect(),
        }
    }

    /// `n` bytes of zeros streamed through `w` in 64 KiB writes, so the
    /// input never exists in memory at once.
    fn write_zeros(w: &mut impl Write, n: usize) {
        let chunk = [0u8; 64 << 10];
        let mut left = n;
        while left > 0 {
            let k = left.min(chunk.len());
            w.write_all(&chunk[..k]).unwrap();
            left -= k;
        }
    }

    #[test]
    fn round_trip_keeps_raw_bytes() {
        let body = encode_batch(&batch());
        assert_eq!(decode_batch(&body, "identity", 1 << 20).unwrap(), batch());
        assert_eq!(decode_batch(&body, "", 1 << 20).unwrap(), batch());
    }

    #[test]
    fn every_encoding_and_level_round_trips() {
        let b = sensor_batch(500);
        let body = encode_batch(&b);
        for (enc, levels) in [
            (Encoding::Identity, vec![0]),
            (Encoding::Gzip, vec![0, 1, 6, 9]),
            (Encoding::Zstd, vec![1, 3, 9, 19]),
        ] {
            for level in levels {
                let z = compress(&body, enc, level).unwrap();
                if enc != Encoding::Identity && level > 0 {
                    assert!(z.len() * 3 < body.len(), "{enc} {level}: {}", z.len());
                }
                assert_eq!(decode_batch(&z, enc.as_str(), 1 << 20).unwrap(), b);
                assert_eq!(decompress(&z, enc, body.len()).unwrap(), body);
                // Tokens are case-insensitive.
                let upper = enc.as_str().to_ascii_uppercase();
                assert_eq!(decode_batch(&z, &upper, 1 << 20).unwrap(), b);
            }
        }
        // Empty bodies too (an empty batch encodes to nothing).
        for enc in Encoding::ALL {
            let z = compress(&[], enc, 3).unwrap();
            assert!(decompress(&z, enc, 0).unwrap().is_empty(), "{enc}");
        }
    }

    #[test]
    fn concatenated_members_and_frames_decode_whole() {
        let body = encode_batch(&sensor_batch(50));
        let (a, b) = body.split_at(body.len() / 3);
        for enc in [Encoding::Gzip, Encoding::Zstd] {
            let mut z = compress(a, enc, 3).unwrap();
            z.extend(compress(b, enc, 3).unwrap());
            assert_eq!(decompress(&z, enc, 1 << 20).unwrap(), body, "{enc}");
        }
    }

    #[test]
    fn the_cap_is_exact() {
        let body = encode_batch(&sensor_batch(100));
        for enc in Encoding::ALL {
            let z = compress(&body, enc, 1).unwrap();
            assert!(decode_batch(&z, enc.as_str(), body.len()).is_ok(), "{enc}");
            assert!(
                matches!(
                    decode_batch(&z, enc.as_str(), body.len() - 1),
                    Err(DecodeError::TooLarge { limit }) if limit == body.len() - 1
                ),
                "{enc}"
            );
        }
    }

    #[test]
    fn refuses_unknown_encodings_oversized_and_garbage() {
        let body = encode_batch(&batch());
        let unknown = decode_batch(&body, "br", 1 << 20).unwrap_err();
        assert!(matches!(&unknown, DecodeError::UnknownEncoding(t) if t == "br"));
        assert!(unknown.to_string().contains("identity, gzip, zstd"));
        assert!(matches!(
            decode_batch(&body, "identity", 4),
            Err(DecodeError::TooLarge { limit: 4 })
        ));
        assert!(matches!(
            decode_batch(&[0xff, 0xff, 0xff], "identity", 1 << 20),
            Err(DecodeError::Protobuf(_))
        ));
        // Garbage, and a valid identity body labelled compressed.
        for enc in ["gzip", "zstd"] {
            for junk in [&[0xffu8, 0xff, 0xff, 0x00, 0x12][..], &body[..]] {
                let e = decode_batch(junk, enc, 1 << 20).unwrap_err();
                assert!(
                    matches!(&e, DecodeError::Corrupt { encoding, .. } if *encoding == enc),
                    "{enc}: {e:?}"
                );
            }
        }
        // A truncated stream.
        let big = encode_batch(&sensor_batch(200));
        for enc in [Encoding::Gzip, Encoding::Zstd] {
            let z = compress(&big, enc, 3).unwrap();
            let e = decode_batch(&z[..z.len() / 2], enc.as_str(), 1 << 20).unwrap_err();
            assert!(matches!(e, DecodeError::Corrupt { .. }), "{enc}: {e:?}");
        }
        // Well-formed compression of something that is not a batch.
        let z = compress(&[0xff; 64], Encoding::Zstd, 3).unwrap();
        assert!(matches!(
            decode_batch(&z, "zstd", 1 << 20),
            Err(DecodeError::Protobuf(_))
        ));
    }

    #[test]
    fn a_zstd_bomb_is_refused_without_expanding_it() {
        // 1 GiB of zeros at level 19, streamed: a body of a few tens of KiB.
        const GIB: usize = 1 << 30;
        let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 19).unwrap();
        write_zeros(&mut enc, GIB);
        let bomb = enc.finish().unwrap();
        assert!(bomb.len() < 1 << 20, "{}", bomb.len());
        let cap = 1 << 20;
        let (r, largest) = largest_allocation(|| decode_batch(&bomb, "zstd", cap));
        assert!(
            matches!(r, Err(DecodeError::TooLarge { limit }) if limit == cap),
            "{r:?}"
        );
        // Nothing near the expanded size was ever asked for (and the
        // tracker does see large allocations).
        assert!(largest <= cap + 1, "largest allocation {largest}");
        let (v, seen) = largest_allocation(|| vec![0u8; 3 * cap]);
        assert!(seen >= v.len());
        // The default cap refuses it as well.
        assert!(matches!(
            decode_batch(&bomb, "zstd", DEFAULT_MAX_DECODED),
            Err(DecodeError::TooLarge { .. })
        ));
    }

    #[test]
    fn a_gzip_bomb_is_refused_without_expanding_it() {
        // DEFLATE tops out near 1000:1, so 256 MiB already makes the point.
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(9));
        write_zeros(&mut enc, 256 << 20);
        let bomb = enc.finish().unwrap();
        let cap = 1 << 20;
        let (r, largest) = largest_allocation(|| decode_batch(&bomb, "gzip", cap));
        assert!(
            matches!(r, Err(DecodeError::TooLarge { limit }) if limit == cap),
            "{r:?}"
        );
        assert!(
            largest <= cap + 1 + (64 << 10),
            "largest allocation {largest}"
        );
    }

    #[test]
    fn a_zstd_frame_claiming_a_huge_window_is_refused() {
        // A small frame whose header asks for a 128 MiB window: the decoder
        // would allocate it before producing a byte.
        let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        enc.window_log(27).unwrap();
        enc.include_contentsize(false).unwrap();
        write_zeros(&mut enc, 1 << 20);
        let frame = enc.finish().unwrap();
        assert!(matches!(
            decompress(&frame, Encoding::Zstd, 4 << 20),
            Err(DecodeError::Corrupt {
                encoding: "zstd",
                ..
            })
        ));
        // With a cap that allows such a window it decodes.
        assert_eq!(
            decompress(&frame, Encoding::Zstd, 128 << 20).unwrap().len(),
            1 << 20
        );
    }

    #[test]
    fn window_limits_follow_the_cap() {
        assert_eq!(zstd_window_log(0), ZSTD_MIN_WINDOW_LOG);
        assert_eq!(zstd_window_log(1 << 20), ZSTD_MIN_WINDOW_LOG);
        assert_eq!(zstd_window_log(DEFAULT_MAX_DECODED), 26);
        assert_eq!(zstd_window_log((64 << 20) + 1), 27);
        assert_eq!(zstd_window_log(usize::MAX), ZSTD_MAX_WINDOW_LOG);
    }

    #[test]
    fn a_body_tells_its_encoding_by_its_first_bytes() {
        let batch = encode_batch(&crate::pb::Batch {
            node: 3,
            ..Default::default()
        });
        for enc in Encoding::ALL {
            let body = compress(&batch, enc, 3).unwrap();
            assert_eq!(Encoding::sniff(&body), enc);
        }
    }
}
