//! The pipe: how many bytes the egress keeps unconfirmed, and how large a
//! batch it asks the scheduler for, from what it measures.
//!
//! A sink confirms a batch a round trip after it was sent: the link's
//! propagation, and for a broker its work (RabbitMQ fsyncs a durable
//! queue's messages before it confirms them, tens of milliseconds). To
//! keep the destination busy, the bytes in flight must cover the
//! *bandwidth-delay product*: the rate it delivers at times that round
//! trip. A fixed window cannot: 8 batches of 64 KiB held a RabbitMQ on
//! loopback, confirming in 20-30 ms, to a third of what it takes.
//!
//! As BBR does for TCP, the pipe keeps two filters over its confirmations:
//! the highest *delivery rate* in the last [`RATE_WINDOW`] (bytes confirmed
//! over bins of at least [`RATE_BIN`], so that confirms that come in a
//! bunch do not read as a burst of rate) and the lowest *round trip* in the
//! last [`RTT_WINDOW`] (send to confirmation). The bytes allowed in flight
//! are [`PIPE_GAIN`] times their product: while in-flight bytes limit the
//! rate, each round trip's rate sample is the window over the round trip,
//! so the window doubles each round trip until the destination's round
//! trip grows instead (a queue: what the window was is then enough). At
//! least the delivery rate times the scheduler's *horizon*, too: what is
//! unconfirmed may take that long to clear ([`crate::admission`]), and a
//! broker whose confirms come in a cadence of their own (a durable
//! RabbitMQ queue's fsyncs, 10-30 ms apart, against a lowest round trip of
//! half a millisecond on loopback) needs more in flight than its lowest
//! round trip says: with twice the product alone, batches stayed under
//! 100 kB and a RabbitMQ on loopback took 114k records/s of 1 KiB. Never
//! below the prior's ([`Pipe::new`]), never above the memory's share
//! (`max_in_flight_bytes`).
//!
//! Batches are a [`BATCHES_PER_PIPE`]th of that, so that several are in
//! flight (one being confirmed while the next are carried), between
//! [`MIN_PIPE_BATCH`] and `max_batch_bytes`. The scheduler caps them
//! further to what the link carries within the horizon of the tightest
//! class ([`crate::admission::batch_cap`]): on a slow uplink a batch never
//! outgrows the latency bounds, whatever the pipe holds.

use std::collections::VecDeque;
use std::time::Duration;

use crate::link_estimate::{Extreme, LinkEstimate, WindowedExtreme};

/// Bytes in flight per byte of the bandwidth-delay product (BBR's
/// `cwnd_gain`).
pub const PIPE_GAIN: f64 = 2.0;

/// Batches the in-flight bytes are cut into.
pub const BATCHES_PER_PIPE: u64 = 4;

/// How long the delivery-rate maximum is remembered.
pub const RATE_WINDOW: Duration = Duration::from_secs(2);

/// Shortest span a delivery-rate sample is taken over.
pub const RATE_BIN: Duration = Duration::from_millis(100);

/// How long the round-trip minimum is remembered.
pub const RTT_WINDOW: Duration = Duration::from_secs(10);

/// Fewest bytes in flight: four batches of 64 KiB. Until the link shows
/// more, the pipe asks for batches of 64 KiB, 29 ms of the default 18 Mbit/s
/// uplink: with 512 KiB the batches on a 4G uplink were 128 KiB, capped by
/// the horizon at 79 kB (35 ms of the link), and in `weir-lab janus` (4G,
/// 640 B, PMRFS) 17.1 % of `ls` records were late, against none with
/// 64 KiB batches (a batch on the link ahead of an urgent record and the
/// urgent record's own both count against its bound).
pub const MIN_IN_FLIGHT_BYTES: u64 = 256 << 10;

/// Smallest batch the pipe asks for (the scheduler's caps may make it
/// smaller).
pub const MIN_PIPE_BATCH: u64 = 64 << 10;

/// Least relative change of the batch size that is published.
const PUBLISH_STEP: f64 = 0.125;

/// What the pipe noted of a batch when it was sent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sent {
    /// The last confirmation before the send (the send itself, from idle).
    delivered_at: Duration,
}

/// The pipe's measures and what follows from them (see the module docs).
#[derive(Debug, Clone)]
pub struct Pipe {
    delivered_at: Duration,
    /// The current bin of confirmed bytes: since when, how many.
    bin: (Duration, u64),
    bin_end: Duration,
    /// The bins of the last [`RATE_WINDOW`]: (end, bytes, span).
    bins: VecDeque<(Duration, u64, Duration)>,
    /// Their bytes and spans added up ([`Pipe::mean_rate`], read a few
    /// times a confirmation).
    binned: (u64, Duration),
    rate: WindowedExtreme,
    rtt: WindowedExtreme,
    floor: u64,
    max_in_flight: u64,
    max_batch: u64,
    in_flight: u64,
    batch: u64,
    published: u64,
    horizon: Duration,
}

impl Pipe {
    /// A pipe that starts from `prior`'s bandwidth-delay product (its
    /// bandwidth times its per-transaction time, times [`PIPE_GAIN`]), at
    /// least [`MIN_IN_FLIGHT_BYTES`], at most `max_in_flight` bytes in
    /// flight, with batches of at most `max_batch` bytes.
    pub fn new(prior: &LinkEstimate, max_in_flight: u64, max_batch: u64) -> Self {
        let max_in_flight = max_in_flight.max(1);
        let bdp = prior.bytes_per_sec * prior.per_transaction.as_secs_f64() * PIPE_GAIN;
        let floor = match bdp.is_finite() {
            true => (bdp as u64).max(MIN_IN_FLIGHT_BYTES),
            false => MIN_IN_FLIGHT_BYTES,
        }
        .min(max_in_flight);
        let mut pipe = Self {
            delivered_at: Duration::ZERO,
            bin: (Duration::ZERO, 0),
            bin_end: Duration::ZERO,
            bins: VecDeque::new(),
            binned: (0, Duration::ZERO),
            rate: WindowedExtreme::default(),
            rtt: WindowedExtreme::default(),
            floor,
            max_in_flight,
            max_batch: max_batch.max(1),
            in_flight: floor,
            batch: 0,
            published: 0,
            horizon: Duration::ZERO,
        };
        pipe.batch = pipe.batch_for(floor);
        pipe.published = pipe.batch;
        pipe
    }

    fn batch_for(&self, in_flight: u64) -> u64 {
        (in_flight / BATCHES_PER_PIPE)
            .max(MIN_PIPE_BATCH)
            .min(self.max_batch)
    }

    /// What is unconfirmed must clear the link within `horizon`
    /// ([`crate::admission::horizon`]): the pipe may hold the delivery
    /// rate times it, however short the round trip.
    pub fn set_horizon(&mut self, horizon: Duration) {
        self.horizon = horizon;
    }

    /// Bytes allowed in flight.
    pub fn in_flight_bytes(&self) -> u64 {
        self.in_flight
    }

    /// The batch size to ask the scheduler for.
    pub fn batch_bytes(&self) -> u64 {
        self.batch
    }

    /// How many batches of [`Pipe::batch_bytes`] fill the pipe, within
    /// `1..=window`.
    pub fn slots(&self, window: usize) -> usize {
        let n = self.in_flight.div_ceil(self.batch.max(1));
        usize::try_from(n)
            .unwrap_or(usize::MAX)
            .clamp(1, window.max(1))
    }

    /// The highest delivery rate in the window, bytes per second.
    pub fn delivery_rate(&self) -> Option<f64> {
        self.rate.best()
    }

    /// Bytes confirmed per second over the bins of the last
    /// [`RATE_WINDOW`] (0 before the first bin).
    pub fn mean_rate(&self) -> f64 {
        let (bytes, span) = self.binned;
        match span.is_zero() {
            true => 0.0,
            false => bytes as f64 / span.as_secs_f64(),
        }
    }

    /// The lowest round trip in the window.
    pub fn round_trip(&self) -> Option<Duration> {
        self.rtt.best().map(Duration::from_secs_f64)
    }

    /// A batch is sent at `now`; `idle`: nothing else is in flight (a rate
    /// bin it opens starts now, not at the last confirmation).
    pub fn sent(&mut self, now: Duration, idle: bool) -> Sent {
        if idle {
            self.delivered_at = now;
        }
        Sent {
            delivered_at: self.delivered_at,
        }
    }

    /// A batch of `bytes`, sent as `sent` says, is confirmed at `now`,
    /// `round_trip` after its send started. Returns the new batch size when
    /// it changed by more than an eighth.
    pub fn confirmed(
        &mut self,
        now: Duration,
        bytes: u64,
        sent: &Sent,
        round_trip: Duration,
    ) -> Option<u64> {
        // Rates over bins of at least RATE_BIN: a broker confirms in
        // bunches (a durable queue's fsyncs), and a rate between two
        // bunches reads several times what it carries (560 MB/s on
        // loopback, where 150 MB/s went). A bin starts at the last
        // confirmation before its first batch was sent (its send, from
        // idle), never before the last bin ended.
        if self.bin.1 == 0 {
            self.bin.0 = sent.delivered_at.max(self.bin_end);
        }
        self.bin.1 += bytes;
        let span = now.saturating_sub(self.bin.0);
        if span >= RATE_BIN {
            let rate = self.bin.1 as f64 / span.as_secs_f64();
            self.rate.push(now, rate, RATE_WINDOW, Extreme::Highest);
            self.bins.push_back((now, self.bin.1, span));
            self.binned = (self.binned.0 + self.bin.1, self.binned.1 + span);
            while let Some(&(t, bytes, span)) = self.bins.front() {
                if now.saturating_sub(t) <= RATE_WINDOW {
                    break;
                }
                self.bins.pop_front();
                self.binned = (self.binned.0 - bytes, self.binned.1 - span);
            }
            self.bin = (now, 0);
            self.bin_end = now;
        }
        if !round_trip.is_zero() {
            self.rtt
                .push(now, round_trip.as_secs_f64(), RTT_WINDOW, Extreme::Lowest);
        }
        self.delivered_at = now;
        if let (Some(rate), Some(rtt)) = (self.rate.best(), self.rtt.best()) {
            let horizon = match self.horizon == Duration::MAX {
                true => 0.0,
                false => self.horizon.as_secs_f64(),
            };
            // The horizon's share at the mean rate, not the highest bin's:
            // what is in flight must clear within it at what the
            // destination carries on average (bunched confirms make some
            // bins read twice that).
            let bdp = (rate * rtt * PIPE_GAIN).max(self.mean_rate() * horizon);
            self.in_flight = match bdp.is_finite() {
                true => (bdp as u64).clamp(self.floor, self.max_in_flight),
                false => self.max_in_flight,
            };
            self.batch = self.batch_for(self.in_flight);
        }
        let step = (self.batch as f64 - self.published as f64).abs() / self.published as f64;
        (step > PUBLISH_STEP).then(|| {
            self.published = self.batch;
            self.batch
        })
    }

    /// Everything unconfirmed was lost (a failure): the next send starts
    /// an interval afresh.
    pub fn restart(&mut self) {
        self.delivered_at = Duration::ZERO;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn prior() -> LinkEstimate {
        LinkEstimate {
            bytes_per_sec: 2.25e6,
            per_transaction: MS * 50,
        }
    }

    /// A destination that confirms each batch `rtt` after it was sent,
    /// carrying at most `rate` bytes per second, fed back to back within
    /// the pipe's window; returns the pipe after `seconds`.
    fn run(rate: f64, rtt: Duration, seconds: u64) -> Pipe {
        let mut pipe = Pipe::new(&prior(), 64 << 20, 4 << 20);
        let mut now = Duration::ZERO;
        let mut free_at = Duration::ZERO;
        let mut flight: VecDeque<(Duration, Duration, u64, Sent)> = VecDeque::new();
        let mut in_flight = 0u64;
        while now < Duration::from_secs(seconds) {
            while in_flight < pipe.in_flight_bytes() {
                let b = pipe.batch_bytes();
                let s = pipe.sent(now, flight.is_empty());
                free_at = free_at.max(now) + Duration::from_secs_f64(b as f64 / rate);
                flight.push_back((free_at + rtt, now, b, s));
                in_flight += b;
            }
            let (at, started, b, s) = flight.pop_front().unwrap();
            now = at;
            in_flight -= b;
            pipe.confirmed(now, b, &s, now - started);
        }
        pipe
    }

    #[test]
    fn a_fast_pipe_with_a_long_round_trip_gets_its_bandwidth_delay_product() {
        // 100 MB/s confirmed 20 ms after: 2 MB in the pipe.
        let p = run(100e6, MS * 20, 5);
        let bdp = 100e6 * 0.02;
        let rate = p.delivery_rate().unwrap();
        assert!(rate > 0.9 * 100e6, "delivering {rate:.0} B/s");
        assert!(
            p.in_flight_bytes() as f64 >= 1.5 * bdp,
            "{} bytes in flight for a {bdp} B product",
            p.in_flight_bytes()
        );
        assert!(p.batch_bytes() > MIN_PIPE_BATCH);
    }

    #[test]
    fn a_slow_uplink_keeps_the_floor() {
        // 1 Mbit/s behind 200 ms: 25 kB of product, under the floor. (Run
        // within one RTT_WINDOW: this model has no LinkClock, so its queue
        // stands, and once the empty pipe's round trip is forgotten the
        // queue's would count as the product.)
        let p = run(125e3, MS * 200, 8);
        assert_eq!(
            p.in_flight_bytes(),
            Pipe::new(&prior(), 64 << 20, 4 << 20).in_flight_bytes()
        );
        assert_eq!(
            p.batch_bytes(),
            MIN_PIPE_BATCH.max(p.in_flight_bytes() / BATCHES_PER_PIPE)
        );
    }

    #[test]
    fn the_memory_share_caps_the_pipe() {
        let mut p = Pipe::new(&prior(), 1 << 20, 4 << 20);
        let s = p.sent(Duration::ZERO, true);
        p.confirmed(MS * 100, 1 << 30, &s, MS * 100);
        assert_eq!(p.in_flight_bytes(), 1 << 20);
        assert_eq!(p.batch_bytes(), 256 << 10);
    }

    #[test]
    fn bunched_confirms_do_not_read_as_a_burst_of_rate() {
        // Ten batches sent 10 ms apart, all confirmed at the same instant:
        // the rate is over the sending interval, not zero time.
        let mut p = Pipe::new(&prior(), 64 << 20, 4 << 20);
        let sent: Vec<Sent> = (0..10u32).map(|i| p.sent(MS * 10 * i, i == 0)).collect();
        for s in &sent {
            p.confirmed(MS * 120, 100_000, s, MS * 30);
        }
        let rate = p.delivery_rate().unwrap();
        assert!(rate <= 1e6 / 0.09 * 1.01, "{rate:.0} B/s");
    }
}
