//! Records a receiver sent and a provider has not yet acknowledged
//! ([`InFlight`]).

use std::collections::HashMap;
use std::time::Duration;

use crate::record::{NodeId, Record};

/// `(origin, seq)`: a record's identity end to end.
pub type RecordKey = (NodeId, u64);

/// The identity of `record`.
#[inline]
pub fn key_of(record: &Record) -> RecordKey {
    (record.origin, record.seq)
}

/// Whether a sender takes back what it has in flight to a provider at
/// `now`: only when neither a heartbeat (`heard`: the provider is alive
/// in the sender's view) nor an acknowledgement on the stream (at
/// `last_ack`) came within `dead_after`. A provider shutting down stops
/// answering heartbeats but still delivers what it holds and acknowledges
/// it on the stream; taking those records back meanwhile sends them
/// twice. A provider killed or cut off sends neither.
pub fn provider_lost(
    heard: bool,
    last_ack: Option<Duration>,
    now: Duration,
    dead_after: Duration,
) -> bool {
    !heard && last_ack.is_none_or(|t| now.saturating_sub(t) >= dead_after)
}

/// Records sent to a provider and not yet settled. A record leaves only
/// when the provider acknowledges it (it has delivered it: the cloud
/// confirmed it, or a further provider did; see [`Custody`](crate::peer::Custody)) or when it is
/// taken back (refused, or the stream broke), so a provider that dies
/// mid-stream, even one that had already queued the record, loses nothing:
/// whatever it did not acknowledge is still here.
#[derive(Debug, Default)]
pub struct InFlight {
    pub(super) records: HashMap<RecordKey, Record>,
    bytes: usize,
}

impl InFlight {
    /// Nothing in flight.
    pub fn new() -> Self {
        Self::default()
    }

    /// Holds `record`, about to be sent. A record with the same identity
    /// already in flight is handed back: sending it twice at once would
    /// leave one copy untracked.
    pub fn sent(&mut self, record: Record) -> Result<(), Record> {
        let key = key_of(&record);
        if self.records.contains_key(&key) {
            return Err(record);
        }
        self.bytes += record.size();
        self.records.insert(key, record);
        Ok(())
    }

    /// The provider has it: forget it (returned for accounting). `None`
    /// for an unknown identity (a repeated or stray acknowledgement), which
    /// changes nothing.
    pub fn acked(&mut self, key: RecordKey) -> Option<Record> {
        self.take(key)
    }

    /// The provider refused it: hand it back to be queued here again.
    pub fn refused(&mut self, key: RecordKey) -> Option<Record> {
        self.take(key)
    }

    /// The stream broke: hand back everything unacknowledged, oldest first
    /// (by ingress time, then identity), so the caller can queue it again.
    pub fn take_all(&mut self) -> Vec<Record> {
        self.bytes = 0;
        let mut all: Vec<Record> = self.records.drain().map(|(_, r)| r).collect();
        all.sort_unstable_by_key(|r| (r.ingress_us, r.origin, r.seq));
        all
    }

    fn take(&mut self, key: RecordKey) -> Option<Record> {
        let r = self.records.remove(&key)?;
        self.bytes -= r.size();
        Some(r)
    }

    /// Records in flight.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// True when nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Bytes ([`Record::size`]) in flight.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}
