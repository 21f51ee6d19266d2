//! Pacing: when the next sends are due at a given rate, spread evenly or
//! per timer tick, and how many go into one write at most.

use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cli::Pacing;

/// Largest burst of publishes encoded into one write: enough to make the
/// per-syscall cost negligible, small enough to keep the window moving.
pub const MAX_BURST: usize = 256;

/// Sends are due at `rate` per second from `start`.
pub struct Pacer {
    start: Instant,
    rate: f64,
    pub sent: u64,
    pacing: Pacing,
}

/// Below this a wait for the next send is a thread sleep under `even`
/// pacing; longer waits use tokio's timer.
const EVEN_SLEEP_MAX: Duration = Duration::from_millis(2);

impl Pacer {
    pub fn new(rate: f64, pacing: Pacing) -> Pacer {
        Pacer {
            start: Instant::now(),
            rate,
            sent: 0,
            pacing,
        }
    }

    /// Waits until the next send is due, or `stop`.
    pub async fn wait(&self, stop: &CancellationToken) {
        let at = self.next_at();
        let left = at.saturating_duration_since(Instant::now());
        if self.pacing == Pacing::Even && left < EVEN_SLEEP_MAX {
            // tokio's timer has a 1 ms resolution, which would send in
            // bursts; a thread sleep (an hrtimer) spaces sends evenly. It
            // blocks this thread's runtime, which the publisher has to
            // itself; the yield lets the PUBACK reader run in between.
            std::thread::sleep(left);
            tokio::task::yield_now().await;
            return;
        }
        // Cancel safety: both branches only wait.
        tokio::select! {
            _ = tokio::time::sleep_until(at) => {}
            _ = stop.cancelled() => {}
        }
    }

    /// How many sends are due now.
    pub fn due(&self) -> u64 {
        let should = (self.start.elapsed().as_secs_f64() * self.rate) as u64;
        should.saturating_sub(self.sent)
    }

    /// When the next send is due.
    fn next_at(&self) -> Instant {
        self.start + Duration::from_secs_f64((self.sent + 1) as f64 / self.rate)
    }
}

/// Waits until sends are due (under `pacer`, if any) and the window has
/// room, then takes as many window permits as may go now: at least one,
/// at most [`MAX_BURST`], the sends due, and `left` (records still to
/// send, if limited). `None` once `stop` fires first.
pub async fn take_burst(
    pacer: Option<&Pacer>,
    window: &Semaphore,
    stop: &CancellationToken,
    left: Option<u64>,
) -> anyhow::Result<Option<u64>> {
    loop {
        if stop.is_cancelled() || left == Some(0) {
            return Ok(None);
        }
        let mut budget = MAX_BURST as u64;
        if let Some(p) = pacer {
            let due = p.due();
            if due == 0 {
                p.wait(stop).await;
                continue;
            }
            budget = budget.min(due);
        }
        if let Some(l) = left {
            budget = budget.min(l);
        }
        // Cancel safety: `acquire` is cancel safe; a permit is only used
        // (forgotten) once held.
        tokio::select! {
            p = window.acquire() => p?.forget(),
            _ = stop.cancelled() => return Ok(None),
        }
        let mut n = 1;
        while n < budget && window.try_acquire().map(|p| p.forget()).is_ok() {
            n += 1;
        }
        return Ok(Some(n));
    }
}
