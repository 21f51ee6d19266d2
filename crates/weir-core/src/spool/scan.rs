//! Reading a segment back after a restart: every intact frame in order,
//! corrupt stretches skipped, a torn tail found.

use bytes::Bytes;

use super::frame::{decode, Frame, FrameError, SegmentHeader};
use super::keys::SegmentKeys;

/// One step of a [`Scan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scanned {
    /// An intact frame at `offset` (from the start of the segment file).
    Frame {
        /// The record.
        frame: Frame,
        /// Where its frame starts.
        offset: usize,
        /// Its frame's length.
        len: usize,
    },
    /// Bytes `start..end` hold no intact frame, and an intact frame follows
    /// at `end`: corruption in the middle, skipped.
    Corrupt {
        /// First bad byte.
        start: usize,
        /// Where the next intact frame starts.
        end: usize,
        /// What was wrong at `start`.
        error: FrameError,
    },
    /// From `start` to the end there is no intact frame: a write torn by a
    /// crash (or corruption up to the end). The segment ends at `start`.
    Tail {
        /// First byte after the last intact frame.
        start: usize,
        /// What was wrong at `start`.
        error: FrameError,
    },
}

/// Walks the frames of one segment's bytes (header already read), in file
/// order, starting at `offset`.
#[derive(Debug)]
pub struct Scan<'a> {
    header: &'a SegmentHeader,
    bytes: Bytes,
    pos: usize,
    last_index: Option<u64>,
    done: bool,
    keys: SegmentKeys,
}

impl<'a> Scan<'a> {
    /// A scan of `bytes` (the whole segment file) from `offset` (the end of
    /// its header, or a frame boundary).
    pub fn new(header: &'a SegmentHeader, bytes: Bytes, offset: usize) -> Self {
        let keys = SegmentKeys::for_version(header.version);
        Scan::with_keys(header, bytes, offset, keys)
    }

    /// A scan from `offset` that already knows the key ids defined before
    /// it.
    pub fn with_keys(
        header: &'a SegmentHeader,
        bytes: Bytes,
        offset: usize,
        keys: SegmentKeys,
    ) -> Self {
        Scan {
            header,
            bytes,
            pos: offset,
            last_index: None,
            done: false,
            keys,
        }
    }

    /// The key table as learnt from the frames scanned.
    pub fn into_keys(self) -> SegmentKeys {
        self.keys
    }

    /// The first intact frame after `from` whose index follows the last one
    /// read and whose key resolves: requiring a matching checksum *and* a
    /// later index makes a false resynchronisation on random bytes
    /// practically impossible.
    fn resync(&self, from: usize) -> Option<usize> {
        (from + 1..self.bytes.len()).find(|&at| {
            match decode(self.header, &self.bytes.slice(at..)) {
                Ok((frame, _, key)) => {
                    frame.index >= self.header.first_index
                        && self.last_index.is_none_or(|last| frame.index > last)
                        && self.keys.can_resolve(key)
                }
                Err(_) => false,
            }
        })
    }
}

impl Iterator for Scan<'_> {
    type Item = Scanned;

    fn next(&mut self) -> Option<Scanned> {
        if self.done || self.pos >= self.bytes.len() {
            return None;
        }
        let at = self.pos;
        let error = match decode(self.header, &self.bytes.slice(at..)) {
            Ok((mut frame, len, key))
                if frame.index >= self.header.first_index
                    && self.last_index.is_none_or(|last| frame.index > last) =>
            {
                match self.keys.resolve(&mut frame, key) {
                    Ok(()) => {
                        self.pos += len;
                        self.last_index = Some(frame.index);
                        return Some(Scanned::Frame {
                            frame,
                            offset: at,
                            len,
                        });
                    }
                    // Its key's definition was lost: as good as corrupt.
                    Err(e) => e,
                }
            }
            // Intact but out of order: a stale frame from a reused file
            // would look like this; never replay it.
            Ok(_) => FrameError::Malformed,
            Err(e) => e,
        };
        match self.resync(at) {
            Some(end) => {
                self.pos = end;
                Some(Scanned::Corrupt {
                    start: at,
                    end,
                    error,
                })
            }
            None => {
                self.done = true;
                Some(Scanned::Tail { start: at, error })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::frame::encode;
    use super::*;

    fn header() -> SegmentHeader {
        SegmentHeader {
            version: super::super::frame::VERSION,
            first_index: 10,
            origin: 1,
            base_seq: 100,
            base_us: 1_000,
            class: "nm".into(),
        }
    }

    /// Frames 10, 11, ...: even ones keyed "even", odd ones "odd" (so the
    /// first two define their ids and later ones use them).
    fn segment(n: u64) -> (Vec<u8>, Vec<usize>) {
        let h = header();
        let mut buf = Vec::new();
        h.encode(&mut buf);
        let mut keys = SegmentKeys::for_version(h.version);
        let mut offsets = Vec::new();
        for i in 0..n {
            offsets.push(buf.len());
            let f = frame(i);
            let field = keys.field(&f.key, buf.len() as u64);
            encode(&h, &f.borrowed(), field, &mut buf);
        }
        (buf, offsets)
    }

    fn frame(i: u64) -> Frame {
        Frame {
            index: 10 + i,
            origin: 1,
            seq: 100 + i,
            ingress_us: 1_000 + i,
            key: Bytes::from_static(if i.is_multiple_of(2) { b"even" } else { b"odd" }),
            payload: Bytes::from(vec![i as u8; 40 + i as usize]),
        }
    }

    fn indices(scan: Scan) -> (Vec<u64>, Vec<Scanned>) {
        let mut ok = Vec::new();
        let mut bad = Vec::new();
        for s in scan {
            match s {
                Scanned::Frame { frame, .. } => ok.push(frame.index),
                other => bad.push(other),
            }
        }
        (ok, bad)
    }

    #[test]
    fn a_torn_tail_ends_the_segment_at_the_last_intact_frame() {
        let (buf, offsets) = segment(5);
        let h = header();
        let cut = offsets[4] + 7;
        let bytes = Bytes::copy_from_slice(&buf[..cut]);
        let (ok, bad) = indices(Scan::new(&h, bytes, offsets[0]));
        assert_eq!(ok, vec![10, 11, 12, 13]);
        assert_eq!(
            bad,
            vec![Scanned::Tail {
                start: offsets[4],
                error: FrameError::Truncated
            }]
        );
    }

    #[test]
    fn a_corrupt_frame_in_the_middle_is_skipped_and_the_rest_kept() {
        let (mut buf, offsets) = segment(6);
        let h = header();
        buf[offsets[2] + 20] ^= 0xff;
        let (ok, bad) = indices(Scan::new(&h, Bytes::from(buf), offsets[0]));
        assert_eq!(ok, vec![10, 11, 13, 14, 15]);
        assert_eq!(
            bad,
            vec![Scanned::Corrupt {
                start: offsets[2],
                end: offsets[3],
                error: FrameError::Checksum
            }]
        );
    }

    #[test]
    fn frames_come_back_with_their_keys_and_a_lost_definition_costs_only_its_users() {
        let (buf, offsets) = segment(7);
        let h = header();
        let all: Vec<Frame> = Scan::new(&h, Bytes::from(buf.clone()), offsets[0])
            .map(|s| match s {
                Scanned::Frame { frame, .. } => frame,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(all, (0..7).map(frame).collect::<Vec<_>>());
        // The frame defining "even" (index 10) is damaged: the frames that
        // use it are skipped with it, the "odd" ones are kept.
        let mut bad = buf.clone();
        bad[offsets[0] + 12] ^= 0xff;
        let (ok, skipped) = indices(Scan::new(&h, Bytes::from(bad), offsets[0]));
        assert_eq!(ok, vec![11, 13, 15]);
        assert!(skipped
            .iter()
            .all(|s| matches!(s, Scanned::Corrupt { .. } | Scanned::Tail { .. })));
        // A scan from the middle resolves ids with the table learnt before.
        let mut first = Scan::new(&h, Bytes::from(buf.clone()), offsets[0]);
        first.next();
        first.next();
        let keys = first.into_keys();
        let rest: Vec<u64> = Scan::with_keys(&h, Bytes::from(buf.clone()), offsets[2], keys)
            .map(|s| match s {
                Scanned::Frame { frame, .. } => frame.index,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(rest, vec![12, 13, 14, 15, 16]);
        let (ok, _) = indices(Scan::new(&h, Bytes::from(buf), offsets[2]));
        assert!(ok.is_empty(), "ids without their definitions: {ok:?}");
    }

    #[test]
    fn a_zeroed_tail_after_a_crash_is_a_tail_not_records() {
        let (mut buf, offsets) = segment(3);
        buf.extend_from_slice(&[0u8; 4096]);
        let h = header();
        let (ok, bad) = indices(Scan::new(&h, Bytes::from(buf), offsets[0]));
        assert_eq!(ok, vec![10, 11, 12]);
        assert!(matches!(bad[..], [Scanned::Tail { .. }]));
    }
}
