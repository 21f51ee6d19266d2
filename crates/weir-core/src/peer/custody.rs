//! A provider's custody of forwarded records until its egress delivers them
//! ([`Custody`]).

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use super::in_flight::RecordKey;

/// One Forward stream on a provider, as [`Custody`] tells them apart.
pub type StreamId = u64;

/// Forwarded records a provider holds for the senders that gave them: each
/// is acknowledged to the stream that sent it only once it has been
/// delivered (confirmed by the cloud, or by a further provider), so a
/// provider that dies with records in its queues loses nothing its senders
/// forgot. The caller holds a record *before* it enqueues it, so that a
/// delivery racing the enqueue still finds it, and releases a stream's
/// records when the stream ends (its sender takes them back then).
///
/// A record held again by another stream is owed to every stream that
/// sent it: an acknowledgement only says the record reached the cloud,
/// which is true for each of them. Two cases send a record twice: its
/// sender took it back and sent it again on a newer stream (the older one
/// has ended or will, and an acknowledgement there is ignored), and a
/// record that travelled on and came back, e.g. from E1 to E2, on to E3
/// and back to E2 while E2 still held it for E1. Owed only to the latest
/// stream, as weir first did, the second case left E1 never acknowledged:
/// it took the record back when its stream ended and the cloud got it
/// twice (the JANUS lab counted 12-213 such duplicates in some runs).
#[derive(Debug, Default)]
pub struct Custody {
    /// Undelivered records and the first stream each is owed to.
    held: HashMap<RecordKey, StreamId>,
    /// The other streams a record is owed to, in the rare case of more than
    /// one (kept apart so that the common case allocates nothing).
    also: HashMap<RecordKey, Vec<StreamId>>,
    /// Per stream: records held (undelivered) and delivered records whose
    /// acknowledgement is not yet sent.
    streams: HashMap<StreamId, Owed>,
    /// Records delivered and not yet acknowledged, all streams.
    due: usize,
}

/// What a provider owes one stream.
#[derive(Debug, Default)]
pub(crate) struct Owed {
    held: usize,
    delivered: Vec<RecordKey>,
}

impl Custody {
    /// Nothing held.
    pub fn new() -> Self {
        Self::default()
    }

    /// Holds `key` for `stream` until it is delivered (as well as for any
    /// other stream holding it already).
    pub fn hold(&mut self, key: RecordKey, stream: StreamId) {
        match self.held.entry(key) {
            Entry::Vacant(v) => {
                v.insert(stream);
            }
            Entry::Occupied(o) => {
                if *o.get() == stream {
                    return;
                }
                let others = self.also.entry(key).or_default();
                if others.contains(&stream) {
                    return;
                }
                others.push(stream);
            }
        }
        self.owed(stream).held += 1;
    }

    /// Stops owing `key` to its first stream: another one it is owed to
    /// takes that place, if any.
    fn drop_first(&mut self, key: RecordKey) {
        match self.also.get_mut(&key).and_then(Vec::pop) {
            Some(next) => {
                self.held.insert(key, next);
                if self.also.get(&key).is_some_and(Vec::is_empty) {
                    self.also.remove(&key);
                }
            }
            None => {
                self.held.remove(&key);
            }
        }
    }

    /// `key` did not make it into the queue after all (refused at enqueue):
    /// nothing is owed for it to `stream`. No-op unless `stream` holds it.
    pub fn unhold(&mut self, key: RecordKey, stream: StreamId) {
        match self.held.get(&key) {
            Some(&first) if first == stream => self.drop_first(key),
            Some(_) => {
                let Some(others) = self.also.get_mut(&key) else {
                    return;
                };
                let Some(i) = others.iter().position(|&s| s == stream) else {
                    return;
                };
                others.swap_remove(i);
                if others.is_empty() {
                    self.also.remove(&key);
                }
            }
            None => return,
        }
        self.owed(stream).held -= 1;
        self.tidy(stream);
    }

    /// These records were delivered: each one held is owed an
    /// acknowledgement on its stream from now on. Keys not held (this
    /// node's own records, or a stream that ended) are ignored. Returns
    /// how many were held.
    pub fn delivered(&mut self, keys: impl IntoIterator<Item = RecordKey>) -> usize {
        if self.held.is_empty() {
            return 0;
        }
        let mut n = 0;
        for key in keys {
            let Some(first) = self.held.remove(&key) else {
                continue;
            };
            let others = if self.also.is_empty() {
                None
            } else {
                self.also.remove(&key)
            };
            for stream in std::iter::once(first).chain(others.into_iter().flatten()) {
                let owed = self.owed(stream);
                owed.held -= 1;
                owed.delivered.push(key);
                self.due += 1;
            }
            n += 1;
        }
        n
    }

    /// Up to `max` delivered records of `stream` to acknowledge now, in the
    /// order they were delivered; they are no longer owed.
    pub fn take_delivered(&mut self, stream: StreamId, max: usize) -> Vec<RecordKey> {
        let Some(owed) = self.streams.get_mut(&stream) else {
            return Vec::new();
        };
        let n = owed.delivered.len().min(max);
        let out: Vec<RecordKey> = owed.delivered.drain(..n).collect();
        self.due -= out.len();
        self.tidy(stream);
        out
    }

    /// True while `stream` is owed anything: records not yet delivered, or
    /// acknowledgements not yet taken.
    pub fn owes(&self, stream: StreamId) -> bool {
        self.streams.contains_key(&stream)
    }

    /// Records held for `stream`, not yet delivered.
    pub fn held_by(&self, stream: StreamId) -> usize {
        self.streams.get(&stream).map_or(0, |o| o.held)
    }

    /// `stream` ended: its sender takes back what was not acknowledged, so
    /// nothing is owed to it any more (records still queued here will be
    /// delivered anyway, and the cloud may see them twice). Returns how
    /// many records were held or delivered without an acknowledgement.
    pub fn release(&mut self, stream: StreamId) -> usize {
        let Some(owed) = self.streams.remove(&stream) else {
            return 0;
        };
        if owed.held > 0 {
            self.also.retain(|_, others| {
                others.retain(|&s| s != stream);
                !others.is_empty()
            });
            let firsts: Vec<RecordKey> = self
                .held
                .iter()
                .filter(|&(_, &s)| s == stream)
                .map(|(&k, _)| k)
                .collect();
            for key in firsts {
                self.drop_first(key);
            }
        }
        self.due -= owed.delivered.len();
        owed.held + owed.delivered.len()
    }

    /// Records held, not yet delivered, all streams.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Records delivered whose acknowledgement is not yet taken, all
    /// streams.
    pub fn due(&self) -> usize {
        self.due
    }

    fn owed(&mut self, stream: StreamId) -> &mut Owed {
        self.streams.entry(stream).or_default()
    }

    /// Forgets a stream once nothing is owed to it.
    fn tidy(&mut self, stream: StreamId) {
        if self
            .streams
            .get(&stream)
            .is_some_and(|o| o.held == 0 && o.delivered.is_empty())
        {
            self.streams.remove(&stream);
        }
    }
}
