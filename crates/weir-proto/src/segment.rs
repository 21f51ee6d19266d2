//! Segment files: the file egress's format, batches appended one after
//! another in frames, and the reader that `weir decode`, tests and the lab
//! use.
//!
//! A segment is a sequence of frames, each starting on a [`BLOCK`]
//! boundary:
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `WRF1` |
//! | 4 | body encoding: 0 identity, 1 gzip, 2 zstd |
//! | 5..8 | zero |
//! | 8..12 | body length, u32 little-endian |
//! | 12..16 | CRC-32C of bytes 16..32 and the body, u32 little-endian |
//! | 16..24 | the batch's per-node sequence number, u64 little-endian |
//! | 24..32 | when the frame was written, microseconds since the Unix epoch, u64 little-endian |
//! | 32.. | the `weir.v1.Batch` body, as its encoding says |
//!
//! then zeros up to the next [`BLOCK`] boundary. The padding lets a
//! writer bypass the page cache (`O_DIRECT` wants block-aligned offsets),
//! and lets a reader find the next frame after a damaged one: it looks at
//! each later block boundary for a header whose length fits and whose CRC
//! holds.
//!
//! Zeros after the last intact frame are blocks not written (yet); a frame
//! whose CRC does not hold is damaged (torn by a power cut while it was
//! written, or corrupted on disk) and skipped.

use std::ops::Range;

use crate::codec::Encoding;

/// Frame alignment in the file: the largest logical block size in common
/// use.
pub const BLOCK: usize = 4096;

/// Bytes of a frame header.
pub const HEADER_LEN: usize = 32;

/// Magic at the start of every frame.
pub const MAGIC: [u8; 4] = *b"WRF1";

/// File name extension of a sealed segment (`<node>-<first batch seq, 20
/// digits>.weirseg`); the segment being written carries [`OPEN_SUFFIX`]
/// after it.
pub const EXTENSION: &str = "weirseg";

/// Suffix of the segment being written (`….weirseg.open`).
pub const OPEN_SUFFIX: &str = ".open";

/// The largest body a frame holds (its length field is 32 bits).
pub const MAX_BODY: usize = u32::MAX as usize;

/// What a frame header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// The body's encoding.
    pub encoding: Encoding,
    /// The body's length.
    pub len: usize,
    /// The batch's per-node sequence number.
    pub batch_seq: u64,
    /// When the frame was written, microseconds since the Unix epoch.
    pub written_us: u64,
}

fn encoding_byte(e: Encoding) -> u8 {
    match e {
        Encoding::Identity => 0,
        Encoding::Gzip => 1,
        Encoding::Zstd => 2,
    }
}

fn encoding_of(b: u8) -> Option<Encoding> {
    match b {
        0 => Some(Encoding::Identity),
        1 => Some(Encoding::Gzip),
        2 => Some(Encoding::Zstd),
        _ => None,
    }
}

/// Bytes a frame with a body of `len` bytes takes in the file, padding
/// included.
pub fn frame_len(len: usize) -> usize {
    (HEADER_LEN + len).div_ceil(BLOCK) * BLOCK
}

impl FrameHeader {
    /// The header of a frame carrying `body`, its CRC computed.
    ///
    /// # Panics
    /// If `body` is longer than [`MAX_BODY`] or its length differs from
    /// `self.len`.
    pub fn encode(&self, body: &[u8]) -> [u8; HEADER_LEN] {
        assert_eq!(body.len(), self.len, "the header's length is the body's");
        let len = u32::try_from(self.len).expect("a frame body fits in 32 bits");
        let mut h = [0u8; HEADER_LEN];
        h[0..4].copy_from_slice(&MAGIC);
        h[4] = encoding_byte(self.encoding);
        h[8..12].copy_from_slice(&len.to_le_bytes());
        h[16..24].copy_from_slice(&self.batch_seq.to_le_bytes());
        h[24..32].copy_from_slice(&self.written_us.to_le_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c(&h[16..32]), body);
        h[12..16].copy_from_slice(&crc.to_le_bytes());
        h
    }
}

/// One frame as read from a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// Where the frame starts in the file.
    pub offset: usize,
    /// Its header.
    pub header: FrameHeader,
    /// Its body (decode with [`crate::decode_batch`] and
    /// `header.encoding`).
    pub body: &'a [u8],
}

/// Why the bytes at a block boundary are not a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotAFrame {
    /// All zeros, or past the end: no frame was written here (yet).
    Unwritten,
    /// Something else: a torn or corrupted frame.
    Damaged,
}

/// The frame at `offset`, or why there is none.
pub fn frame_at(buf: &[u8], offset: usize) -> Result<Frame<'_>, NotAFrame> {
    let Some(h) = buf.get(offset..offset + HEADER_LEN) else {
        return if buf.len() <= offset || buf[offset..].iter().all(|&b| b == 0) {
            Err(NotAFrame::Unwritten)
        } else {
            Err(NotAFrame::Damaged)
        };
    };
    if h.iter().all(|&b| b == 0) {
        return Err(NotAFrame::Unwritten);
    }
    if h[0..4] != MAGIC || h[5..8] != [0, 0, 0] {
        return Err(NotAFrame::Damaged);
    }
    let encoding = encoding_of(h[4]).ok_or(NotAFrame::Damaged)?;
    let word = |r: Range<usize>| u32::from_le_bytes(h[r].try_into().expect("4 bytes"));
    let long = |r: Range<usize>| u64::from_le_bytes(h[r].try_into().expect("8 bytes"));
    let len = word(8..12) as usize;
    let body_at = offset + HEADER_LEN;
    let body = buf.get(body_at..body_at + len).ok_or(NotAFrame::Damaged)?;
    let crc = crc32c::crc32c_append(crc32c::crc32c(&h[16..32]), body);
    if crc != word(12..16) {
        return Err(NotAFrame::Damaged);
    }
    Ok(Frame {
        offset,
        header: FrameHeader {
            encoding,
            len,
            batch_seq: long(16..24),
            written_us: long(24..32),
        },
        body,
    })
}

/// A segment's contents: its frames in file order, and the byte ranges
/// skipped because they held no intact frame.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Segment<'a> {
    /// Every intact frame.
    pub frames: Vec<Frame<'a>>,
    /// Ranges skipped: before an intact frame, or at the end unless all
    /// zeros.
    pub damaged: Vec<Range<usize>>,
    /// Where the frames end: the end of the last intact frame (a writer
    /// that reopens the segment appends here; what follows is unwritten or
    /// torn).
    pub end: usize,
}

/// Reads every intact frame of a segment. Where there is none (a damaged
/// frame, or blocks not written), the reader looks for the next intact one
/// at each later block boundary; skipped bytes are reported as damaged
/// unless nothing intact follows them and they are all zeros (the unwritten
/// end of a segment).
pub fn read(buf: &[u8]) -> Segment<'_> {
    let mut seg = Segment::default();
    let mut at = 0;
    let mut skipped_from = None;
    while at < buf.len() {
        match frame_at(buf, at) {
            Ok(frame) => {
                if let Some(from) = skipped_from.take() {
                    seg.damaged.push(from..at);
                }
                at += frame_len(frame.header.len);
                seg.end = at.min(buf.len());
                seg.frames.push(frame);
            }
            Err(_) => {
                skipped_from.get_or_insert(at);
                at += BLOCK;
            }
        }
    }
    if let Some(from) = skipped_from {
        // Nothing intact after it: zeros are blocks not written (yet),
        // anything else a torn or corrupted tail.
        if buf[from..].iter().any(|&b| b != 0) {
            seg.damaged.push(from..buf.len());
        }
    }
    seg
}

/// Whether `name` is a segment file's name (sealed or open).
pub fn is_segment_name(name: &str) -> bool {
    let sealed = name.strip_suffix(OPEN_SUFFIX).unwrap_or(name);
    sealed
        .strip_suffix(EXTENSION)
        .is_some_and(|n| n.ends_with('.'))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn append(file: &mut Vec<u8>, seq: u64, body: &[u8], encoding: Encoding) {
        let h = FrameHeader {
            encoding,
            len: body.len(),
            batch_seq: seq,
            written_us: 1_700_000_000_000_000 + seq,
        };
        let start = file.len();
        file.extend_from_slice(&h.encode(body));
        file.extend_from_slice(body);
        file.resize(start + frame_len(body.len()), 0);
    }

    #[test]
    fn frames_read_back_in_order_with_their_headers() {
        let mut file = Vec::new();
        let bodies: Vec<Vec<u8>> = [0usize, 1, BLOCK - HEADER_LEN, BLOCK, 3 * BLOCK + 5]
            .iter()
            .map(|&n| (0..n).map(|i| (i % 251) as u8).collect())
            .collect();
        for (i, b) in bodies.iter().enumerate() {
            append(&mut file, 10 + i as u64, b, Encoding::Zstd);
        }
        assert_eq!(file.len() % BLOCK, 0);
        let seg = read(&file);
        assert!(seg.damaged.is_empty());
        assert_eq!(seg.end, file.len());
        assert_eq!(seg.frames.len(), bodies.len());
        for (i, (f, b)) in seg.frames.iter().zip(&bodies).enumerate() {
            assert_eq!(f.body, &b[..]);
            assert_eq!(f.header.batch_seq, 10 + i as u64);
            assert_eq!(f.header.written_us, 1_700_000_000_000_010 + i as u64);
            assert_eq!(f.header.encoding, Encoding::Zstd);
            assert_eq!(f.offset % BLOCK, 0);
        }
    }

    #[test]
    fn a_torn_tail_ends_the_segment_after_the_last_intact_frame() {
        let mut file = Vec::new();
        append(&mut file, 1, &[7; 5000], Encoding::Identity);
        let end = file.len();
        append(&mut file, 2, &[8; 9000], Encoding::Identity);
        // The power went out halfway through the second frame's body.
        file.truncate(end + 3000);
        let seg = read(&file);
        assert_eq!(seg.frames.len(), 1);
        assert_eq!(seg.end, end);
        assert_eq!(seg.damaged, vec![end..file.len()]);
        // Zeros after it (preallocated, or written as a hole) are not damage.
        let mut zeros = file[..end].to_vec();
        zeros.resize(end + 3 * BLOCK, 0);
        let seg = read(&zeros);
        assert_eq!((seg.frames.len(), seg.end), (1, end));
        assert!(seg.damaged.is_empty());
    }

    #[test]
    fn a_damaged_frame_is_skipped_and_the_next_one_found() {
        let mut file = Vec::new();
        append(&mut file, 1, &[1; 100], Encoding::Identity);
        let second = file.len();
        append(&mut file, 2, &[2; 3 * BLOCK], Encoding::Gzip);
        let third = file.len();
        append(&mut file, 3, &[3; 10], Encoding::Identity);
        file[second + HEADER_LEN + 2 * BLOCK] ^= 0x40;
        let seg = read(&file);
        let seqs: Vec<u64> = seg.frames.iter().map(|f| f.header.batch_seq).collect();
        assert_eq!(seqs, [1, 3]);
        assert_eq!(seg.damaged, vec![second..third]);
        // A zeroed header in the middle (a frame never written while a
        // later one was) is skipped the same way.
        file[second..second + HEADER_LEN].fill(0);
        let seqs: Vec<u64> = read(&file)
            .frames
            .iter()
            .map(|f| f.header.batch_seq)
            .collect();
        assert_eq!(seqs, [1, 3]);
    }

    #[test]
    fn segment_names_are_told_from_others() {
        assert!(is_segment_name("7-00000000000000000001.weirseg"));
        assert!(is_segment_name("7-00000000000000000001.weirseg.open"));
        assert!(!is_segment_name(
            "7-00000000000000000001.identity.weirbatch"
        ));
        assert!(!is_segment_name("weirseg"));
        assert!(!is_segment_name("x.weirseg.tmp"));
    }

    proptest! {
        /// Whatever bytes a segment holds, reading it never panics, and
        /// every frame it returns is intact and block-aligned.
        #[test]
        fn any_bytes_read_without_panicking(
            bodies in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..9000), 0..5),
            flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
        ) {
            let mut file = Vec::new();
            for (i, b) in bodies.iter().enumerate() {
                append(&mut file, i as u64, b, Encoding::Identity);
            }
            for (at, x) in &flips {
                if !file.is_empty() {
                    let i = at.index(file.len());
                    file[i] ^= x;
                }
            }
            let seg = read(&file);
            for f in &seg.frames {
                prop_assert_eq!(f.offset % BLOCK, 0);
                prop_assert_eq!(frame_at(&file, f.offset), Ok(*f));
            }
            if flips.is_empty() {
                prop_assert_eq!(seg.frames.len(), bodies.len());
            }
        }
    }
}
