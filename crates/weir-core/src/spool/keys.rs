//! A segment's key table (format version 2): a key (MQTT topic, gRPC
//! stream) is written in full the first time a segment holds it, with a
//! small id, and later frames carry only the id. Devices publish to a few
//! topics over and over, and a 26-byte topic is a tenth of a 256-byte
//! reading: the table is what keeps the spool within its write budget.
//!
//! A frame that uses an id is whole only together with the frame that
//! defined it. So that a corrupt definition cannot cost more than a
//! bounded stretch of a segment, a key is defined again once
//! [`RESTATE_BYTES`] of the segment have passed since it last was; a frame
//! whose key cannot be resolved is treated like a corrupt one (skipped and
//! counted, never replayed with a wrong key).

use std::collections::HashMap;

use bytes::Bytes;

pub use super::frame::KeyField;
use super::frame::{Frame, FrameError};

/// Ids one segment hands out at most; further keys are written in full.
pub const MAX_KEYS: usize = 4096;
/// Key bytes one segment's table holds at most.
pub const MAX_KEY_BYTES: usize = 256 << 10;
/// A key is defined again once this many segment bytes have passed since
/// its last definition: the most a corrupt definition can cost.
pub const RESTATE_BYTES: u64 = 1 << 20;

/// One segment's key table: what the writer uses to choose each frame's
/// [`KeyField`], and what readers use to resolve [`KeyField::Use`].
#[derive(Debug, Clone, Default)]
pub struct SegmentKeys {
    /// The key of each id (`None`: its definition was lost to corruption).
    keys: Vec<Option<Bytes>>,
    /// Key bytes held.
    bytes: usize,
    /// The writer's side, for the segment being appended to: each key's id
    /// and the offset of its last definition. Built on first use, dropped
    /// when the segment is sealed.
    ids: Option<HashMap<Bytes, (u32, u64)>>,
    /// Whether frames may use ids (false in a version 1 segment).
    inline_only: bool,
}

impl SegmentKeys {
    /// An empty table for a segment of format `version`.
    pub fn for_version(version: u16) -> Self {
        SegmentKeys {
            inline_only: version < 2,
            ..SegmentKeys::default()
        }
    }

    /// Ids defined (including ones whose definition was lost).
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no id is defined.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// How the frame of a record with `key`, starting at byte `offset` of
    /// the segment, carries its key; remembers a definition. Called by the
    /// writer, in append order.
    pub fn field(&mut self, key: &[u8], offset: u64) -> KeyField {
        if self.inline_only || key.is_empty() {
            return KeyField::Inline;
        }
        let keys = &self.keys;
        let ids = self.ids.get_or_insert_with(|| {
            // A segment reopened after a restart: what it already defines,
            // each taken as defined at offset 0 (at most that far back).
            keys.iter()
                .enumerate()
                .filter_map(|(id, k)| Some((k.clone()?, (id as u32, 0))))
                .collect()
        });
        if let Some((id, last)) = ids.get_mut(key) {
            if offset.saturating_sub(*last) < RESTATE_BYTES {
                return KeyField::Use(*id);
            }
            *last = offset;
            return KeyField::Define(*id);
        }
        if self.keys.len() >= MAX_KEYS || self.bytes + key.len() > MAX_KEY_BYTES {
            return KeyField::Inline;
        }
        let id = self.keys.len() as u32;
        // A copy: the caller's key may be a slice of a large buffer.
        let owned = Bytes::copy_from_slice(key);
        ids.insert(owned.clone(), (id, offset));
        self.keys.push(Some(owned));
        self.bytes += key.len();
        KeyField::Define(id)
    }

    /// The key of `id`, if its definition is known.
    pub fn get(&self, id: u32) -> Option<&Bytes> {
        self.keys.get(id as usize)?.as_ref()
    }

    /// The segment will not be appended to again: drop the writer's map.
    pub fn seal(&mut self) {
        self.ids = None;
    }

    /// Whether a frame with `field` can be resolved now.
    pub fn can_resolve(&self, field: KeyField) -> bool {
        match field {
            KeyField::Inline | KeyField::Define(_) => true,
            KeyField::Use(id) => self.get(id).is_some(),
        }
    }

    /// Completes a decoded frame: learns a definition (`frame.key` holds
    /// the key), or fills in the key of an id. An id with no known
    /// definition is [`FrameError::UnknownKey`].
    pub fn resolve(&mut self, frame: &mut Frame, field: KeyField) -> Result<(), FrameError> {
        match field {
            KeyField::Inline => Ok(()),
            KeyField::Define(id) => {
                let id = id as usize;
                if id >= MAX_KEYS {
                    return Err(FrameError::Malformed);
                }
                if self.keys.len() <= id {
                    self.keys.resize(id + 1, None);
                }
                if self.keys[id].as_ref() != Some(&frame.key) {
                    self.bytes += frame.key.len();
                    // A copy: `frame.key` is a slice of a read buffer.
                    self.keys[id] = Some(Bytes::copy_from_slice(&frame.key));
                }
                Ok(())
            }
            KeyField::Use(id) => {
                frame.key = self.get(id).ok_or(FrameError::UnknownKey(id))?.clone();
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_defined_once_then_used_and_defined_again_after_restate_bytes() {
        let mut t = SegmentKeys::for_version(2);
        assert_eq!(t.field(b"a/b", 100), KeyField::Define(0));
        assert_eq!(t.field(b"c", 200), KeyField::Define(1));
        assert_eq!(t.field(b"a/b", 300), KeyField::Use(0));
        assert_eq!(t.field(b"a/b", 100 + RESTATE_BYTES), KeyField::Define(0));
        assert_eq!(t.field(b"a/b", 200 + RESTATE_BYTES), KeyField::Use(0));
        assert_eq!(t.field(b"", 300), KeyField::Inline);
        assert_eq!(
            SegmentKeys::for_version(1).field(b"a/b", 0),
            KeyField::Inline
        );
    }

    #[test]
    fn the_table_is_bounded_in_ids_and_bytes() {
        let mut t = SegmentKeys::for_version(2);
        for i in 0..MAX_KEYS {
            assert_eq!(
                t.field(format!("k{i}").as_bytes(), 0),
                KeyField::Define(i as u32)
            );
        }
        assert_eq!(t.field(b"one-more", 0), KeyField::Inline);
        let mut t = SegmentKeys::for_version(2);
        let big = vec![b'x'; MAX_KEY_BYTES];
        assert_eq!(t.field(&big, 0), KeyField::Define(0));
        assert_eq!(t.field(b"y", 0), KeyField::Inline);
    }

    #[test]
    fn a_reopened_segment_keeps_its_ids_and_restates_them() {
        let mut w = SegmentKeys::for_version(2);
        w.field(b"a", 0);
        w.field(b"b", 10);
        // What a reader rebuilds from the frames.
        let mut r = SegmentKeys::for_version(2);
        for (id, k) in [(0u32, "a"), (1, "b")] {
            let mut f = frame(k);
            r.resolve(&mut f, KeyField::Define(id)).unwrap();
        }
        assert_eq!(r.field(b"b", 20), KeyField::Use(1));
        assert_eq!(r.field(b"b", RESTATE_BYTES), KeyField::Define(1));
        assert_eq!(r.field(b"new", RESTATE_BYTES + 40), KeyField::Define(2));
    }

    #[test]
    fn an_id_without_its_definition_does_not_resolve() {
        let mut r = SegmentKeys::for_version(2);
        let mut f = frame("");
        assert!(!r.can_resolve(KeyField::Use(3)));
        assert_eq!(
            r.resolve(&mut f, KeyField::Use(3)),
            Err(FrameError::UnknownKey(3))
        );
        let mut d = frame("t");
        r.resolve(&mut d, KeyField::Define(3)).unwrap();
        assert!(!r.can_resolve(KeyField::Use(2)));
        r.resolve(&mut f, KeyField::Use(3)).unwrap();
        assert_eq!(f.key, Bytes::from_static(b"t"));
    }

    fn frame(key: &str) -> Frame {
        Frame {
            index: 0,
            origin: 0,
            seq: 0,
            ingress_us: 0,
            key: Bytes::copy_from_slice(key.as_bytes()),
            payload: Bytes::new(),
        }
    }
}
