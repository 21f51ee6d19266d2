//! Exponential backoff for every task that retries: the wait before the
//! next attempt after a failure doubles from `initial` up to `max`, and
//! starts from `initial` again once something works. The delivery
//! machine's retries, the AMQP egress's reconnects and the MQTT
//! subscriber's reconnects all use it; [`Retry`] adds the time of the next
//! attempt, for the Kafka and MQTT sinks' reconnects.

use std::time::Duration;

/// The wait before the next attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Waits of `initial`, doubled after each failure up to `max` (at
    /// least `initial`).
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max: max.max(initial),
            next: initial,
        }
    }

    /// An attempt failed: how long to wait before the next one (the wait
    /// after that doubles, within `max`).
    pub fn failed(&mut self) -> Duration {
        let wait = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        wait
    }

    /// Something worked: the next failure waits `initial` again.
    pub fn reset(&mut self) {
        self.next = self.initial;
    }

    /// The wait the next failure gets.
    pub fn next_wait(&self) -> Duration {
        self.next
    }
}

/// When a connection may be tried again: a [`Backoff`] and the earliest
/// moment of the next attempt, on any clock (`I` is an instant).
#[derive(Debug, Clone, Copy)]
pub struct Retry<I> {
    backoff: Backoff,
    at: Option<I>,
}

impl<I: Copy + std::ops::Add<Duration, Output = I>> Retry<I> {
    /// Attempts at once until one fails; then waits as [`Backoff::new`].
    pub fn new(initial: Duration, max: Duration) -> Self {
        Retry {
            backoff: Backoff::new(initial, max),
            at: None,
        }
    }

    /// An attempt failed (or a connection was lost) at `now`.
    pub fn failed(&mut self, now: I) {
        self.at = Some(now + self.backoff.failed());
    }

    /// An attempt worked: the next may come at once, and a later failure
    /// waits the initial time again.
    pub fn succeeded(&mut self) {
        self.backoff.reset();
        self.at = None;
    }

    /// Not before this moment, if at all.
    pub fn not_before(&self) -> Option<I> {
        self.at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn waits_double_up_to_the_cap_and_start_over_after_a_success() {
        let mut b = Backoff::new(MS * 100, MS * 500);
        let waits: Vec<Duration> = (0..5).map(|_| b.failed()).collect();
        assert_eq!(waits, [MS * 100, MS * 200, MS * 400, MS * 500, MS * 500]);
        b.reset();
        assert_eq!(b.next_wait(), MS * 100);
        assert_eq!(b.failed(), MS * 100);
    }

    #[test]
    fn a_cap_below_the_first_wait_is_the_first_wait() {
        let mut b = Backoff::new(MS * 100, MS * 10);
        assert_eq!(b.failed(), MS * 100);
        assert_eq!(b.failed(), MS * 100);
    }

    #[test]
    fn a_retry_waits_after_failures_and_not_after_a_success() {
        let t0 = std::time::Instant::now();
        let mut r = Retry::new(MS * 100, MS * 300);
        assert_eq!(r.not_before(), None);
        r.failed(t0);
        assert_eq!(r.not_before(), Some(t0 + MS * 100));
        r.failed(t0 + MS * 100);
        assert_eq!(r.not_before(), Some(t0 + MS * 300));
        r.failed(t0 + MS * 300);
        assert_eq!(r.not_before(), Some(t0 + MS * 600), "capped at 300 ms");
        r.succeeded();
        assert_eq!(r.not_before(), None);
        r.failed(t0);
        assert_eq!(r.not_before(), Some(t0 + MS * 100));
    }
}
