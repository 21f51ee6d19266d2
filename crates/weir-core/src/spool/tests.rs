//! A model of the whole log on a simulated disk: appends, group syncs,
//! releases, checkpoints and crashes that cut the unsynced tail at any
//! byte; recovery must yield every synced record not released as of the
//! last checkpoint, in order, and nothing that was never written.

use std::collections::BTreeSet;

use bytes::Bytes;
use proptest::prelude::*;

use super::*;

const SEGMENT_BYTES: u64 = 600;

/// Each record's key: three topics in turn, so segments define ids and use
/// them, and a segment reopened after a crash goes on using its ids.
fn key_of(index: u64) -> Bytes {
    Bytes::from(format!("plant/line/{}", index % 3))
}

#[derive(Debug, Clone)]
enum Op {
    Append(usize),
    Sync,
    Release(usize),
    Checkpoint,
    Crash(f64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0usize..200).prop_map(Op::Append),
        2 => Just(Op::Sync),
        3 => (0usize..64).prop_map(Op::Release),
        1 => Just(Op::Checkpoint),
        1 => (0.0f64..1.0).prop_map(Op::Crash),
    ]
}

/// The simulated disk and the writer's memory.
struct Sim {
    /// Segment files: bytes, and how many of them are durable.
    files: Vec<(Vec<u8>, usize)>,
    headers: Vec<SegmentHeader>,
    checkpoint: Option<Vec<u8>>,
    log: ClassLog,
    /// Index -> payload of every record ever appended.
    written: Vec<(u64, Bytes)>,
    synced: BTreeSet<u64>,
    released_at_checkpoint: BTreeSet<u64>,
    released_ever: BTreeSet<u64>,
}

impl Sim {
    fn new() -> Self {
        Sim {
            files: Vec::new(),
            headers: Vec::new(),
            checkpoint: None,
            log: ClassLog::new(
                Vec::new(),
                Released::new(0),
                SEGMENT_BYTES,
                u64::MAX,
                FullPolicy::Block,
            ),
            written: Vec::new(),
            synced: BTreeSet::new(),
            released_at_checkpoint: BTreeSet::new(),
            released_ever: BTreeSet::new(),
        }
    }

    fn append(&mut self, len: usize) {
        let payload = Bytes::from(vec![(self.written.len() % 251) as u8; len]);
        let frame_len = frame::max_frame_len(key_of(self.log.next_index()).len(), len) as u64;
        if self.log.needs_segment(frame_len) {
            // Sealing syncs the previous segment, as the relay does.
            if let Some(last) = self.files.last_mut() {
                last.1 = last.0.len();
                self.synced.extend(self.written.iter().map(|(i, _)| *i));
            }
            let header = SegmentHeader {
                version: frame::VERSION,
                first_index: self.log.next_index(),
                origin: 3,
                base_seq: 1000,
                base_us: 5000,
                class: "ls".into(),
            };
            let mut buf = Vec::new();
            header.encode(&mut buf);
            self.log.start_segment(buf.len() as u64);
            // The relay syncs a new segment's header (and the directory)
            // before appending to it.
            let hlen = buf.len();
            self.files.push((buf, hlen));
            self.headers.push(header);
        }
        let header = self.headers.last().unwrap().clone();
        let index = self.log.next_index();
        let f = Frame {
            index,
            origin: 3,
            seq: 1000 + index * 7,
            ingress_us: 5000 + index,
            key: key_of(index),
            payload: payload.clone(),
        };
        let file = &mut self.files.last_mut().unwrap().0;
        let before = file.len();
        let key = self.log.key_field(&f.key, before as u64);
        frame::encode(&header, &f.borrowed(), key, file);
        assert_eq!(self.log.append((file.len() - before) as u64), index);
        self.written.push((index, payload));
    }

    fn sync(&mut self) {
        if let Some(last) = self.files.last_mut() {
            last.1 = last.0.len();
        }
        self.synced.extend(self.written.iter().map(|(i, _)| *i));
    }

    fn release(&mut self, pick: usize) {
        let pending: Vec<u64> = self
            .written
            .iter()
            .map(|(i, _)| *i)
            .filter(|i| self.synced.contains(i) && !self.log.is_released(*i))
            .collect();
        if !pending.is_empty() {
            let i = pending[pick % pending.len()];
            assert!(self.log.release(i));
            self.released_ever.insert(i);
        }
        for s in self.log.take_deletable() {
            let at = self
                .headers
                .iter()
                .position(|h| h.first_index == s.first_index)
                .unwrap();
            self.files.remove(at);
            self.headers.remove(at);
        }
    }

    fn checkpoint(&mut self) {
        let c = Checkpoint::of(self.log.released());
        self.released_at_checkpoint = (0..c.low_water).chain(c.above.iter().copied()).collect();
        self.checkpoint = Some(c.encode());
    }

    /// Cuts the unsynced tail of the last file at `cut` of its length,
    /// recovers, and checks what comes back.
    fn crash(&mut self, cut: f64) -> Result<(), TestCaseError> {
        if let Some((bytes, synced)) = self.files.last_mut() {
            let keep = *synced + ((bytes.len() - *synced) as f64 * cut) as usize;
            bytes.truncate(keep);
        }
        let released = self
            .checkpoint
            .as_deref()
            .and_then(Checkpoint::decode)
            .map(|c| c.released())
            .unwrap_or_else(|| Released::new(0));
        let mut metas = Vec::new();
        let mut tables = Vec::new();
        let mut recovered = Vec::new();
        let n = self.files.len();
        for (k, (bytes, _)) in self.files.iter_mut().enumerate() {
            let (header, hlen) = SegmentHeader::decode(bytes).expect("headers are synced");
            let mut end = header.first_index;
            let mut valid = bytes.len();
            let mut scan = Scan::new(&header, Bytes::copy_from_slice(bytes), hlen);
            for s in &mut scan {
                match s {
                    Scanned::Frame { frame, .. } => {
                        prop_assert_eq!(&frame.key, &key_of(frame.index));
                        end = frame.index + 1;
                        if !released.is_released(frame.index) {
                            recovered.push((frame.index, frame.payload));
                        }
                    }
                    Scanned::Corrupt { .. } => prop_assert!(false, "no corruption was injected"),
                    Scanned::Tail { start, .. } => {
                        prop_assert_eq!(k, n - 1, "only the last segment has a torn tail");
                        valid = start;
                    }
                }
            }
            tables.push((header.first_index, scan.into_keys()));
            bytes.truncate(valid);
            metas.push(SegmentMeta {
                first_index: header.first_index,
                end_index: end,
                bytes: valid as u64,
            });
        }
        // Every durable record never released is back; nothing released as
        // of the last checkpoint is; one released since may come back (a
        // duplicate, which consumers drop by (origin, seq)); records
        // written after the last sync come back only as the oldest of them,
        // intact. All in order.
        let required: Vec<u64> = self
            .written
            .iter()
            .map(|(i, _)| *i)
            .filter(|i| self.synced.contains(i) && !self.released_ever.contains(i))
            .collect();
        let back: BTreeSet<u64> = recovered.iter().map(|(i, _)| *i).collect();
        for i in &required {
            prop_assert!(back.contains(i), "durable record {} lost", i);
        }
        prop_assert!(recovered.windows(2).all(|w| w[0].0 < w[1].0));
        let unsynced: Vec<u64> = self
            .written
            .iter()
            .map(|(i, _)| *i)
            .filter(|i| !self.synced.contains(i))
            .collect();
        let mut extra = Vec::new();
        for (i, payload) in &recovered {
            prop_assert!(
                !self.released_at_checkpoint.contains(i),
                "released record {} replayed",
                i
            );
            let original = &self
                .written
                .iter()
                .find(|(w, _)| w == i)
                .expect("never written")
                .1;
            prop_assert_eq!(payload, original);
            if !self.synced.contains(i) {
                extra.push(*i);
            }
        }
        prop_assert_eq!(&extra[..], &unsynced[..extra.len()]);
        let extra: Vec<(u64, Bytes)> = extra.iter().map(|i| (*i, Bytes::new())).collect();
        // The writer restarts from what is on disk.
        let extra_indices: BTreeSet<u64> = extra.iter().map(|(i, _)| *i).collect();
        self.written
            .retain(|(i, _)| back.contains(i) || self.released_at_checkpoint.contains(i));
        self.synced.extend(extra_indices);
        self.released_ever = self.released_at_checkpoint.clone();
        for f in &mut self.files {
            f.1 = f.0.len();
        }
        self.log = ClassLog::new(metas, released, SEGMENT_BYTES, u64::MAX, FullPolicy::Block);
        for (segment, keys) in tables {
            self.log.restore_keys(segment, keys);
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn recovery_yields_exactly_the_synced_unreleased_records(ops in proptest::collection::vec(op(), 1..120)) {
        let mut sim = Sim::new();
        for op in ops {
            match op {
                Op::Append(len) => sim.append(len),
                Op::Sync => sim.sync(),
                Op::Release(k) => sim.release(k),
                Op::Checkpoint => sim.checkpoint(),
                Op::Crash(cut) => sim.crash(cut)?,
            }
        }
        sim.crash(0.5)?;
    }
}

#[test]
fn a_checkpoint_is_a_few_bytes_per_run_and_version_1_is_still_read() {
    // Three batches of 500 confirmed ahead of the one below them.
    let mut r = Released::new(1000);
    for run in [1500..2000, 2500..3000, 3001..3500] {
        for i in run {
            r.release(i);
        }
    }
    let c = Checkpoint::of(&r);
    let bytes = c.encode();
    assert!(bytes.len() <= 40, "{} bytes", bytes.len());
    assert_eq!(Checkpoint::decode(&bytes), Some(c.clone()));
    // The format weir wrote before: every index, 8 bytes each.
    let mut v1 = b"WEIRCKP1".to_vec();
    v1.extend_from_slice(&1000u64.to_le_bytes());
    v1.extend_from_slice(&(c.above.len() as u32).to_le_bytes());
    for i in &c.above {
        v1.extend_from_slice(&i.to_le_bytes());
    }
    let crc = crc32c::crc32c(&v1);
    v1.extend_from_slice(&crc.to_le_bytes());
    assert_eq!(Checkpoint::decode(&v1), Some(c));
}

#[test]
fn checkpoints_round_trip_and_damage_reads_as_none() {
    let mut r = Released::new(10);
    r.release(12);
    r.release(70);
    let c = Checkpoint::of(&r);
    assert_eq!(c.above, vec![12, 70]);
    let bytes = c.encode();
    assert_eq!(Checkpoint::decode(&bytes), Some(c.clone()));
    assert_eq!(c.released(), r);
    for i in 0..bytes.len() {
        let mut bad = bytes.clone();
        bad[i] ^= 4;
        assert_eq!(Checkpoint::decode(&bad), None, "flip at {i}");
    }
    assert_eq!(Checkpoint::decode(&bytes[..bytes.len() - 1]), None);
}
