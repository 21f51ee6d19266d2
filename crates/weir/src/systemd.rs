//! Life under systemd (`contrib/systemd/weir.service`, `Type=notify`):
//! readiness once every listener is bound and the egress is connecting or
//! retrying, and a watchdog fed only while the scheduler loop is alive, so
//! a stuck scheduler gets weir restarted. Outside systemd (no
//! `NOTIFY_SOCKET`) all of this does nothing.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sd_notify::NotifyState;
use tokio_util::sync::CancellationToken;

/// How often the scheduler beats while it waits for the link (an uplink
/// outage is a wait, not a hang): well inside any sensible `WatchdogSec`.
pub const BEAT_EVERY: Duration = Duration::from_secs(1);

/// The scheduler's pulse: bumped on every turn of its loop, and every
/// [`BEAT_EVERY`] while it waits.
#[derive(Debug, Default, Clone)]
pub struct Heartbeat(Arc<AtomicU64>);

impl Heartbeat {
    /// One more turn.
    pub fn beat(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// Turns so far.
    pub fn count(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Whether [`ready`] has been said: the watchdog is fed only after it (a
/// start-up slower than half the watchdog period sent `WATCHDOG=1` before
/// `READY=1`).
static READY: AtomicBool = AtomicBool::new(false);

/// Tells systemd weir is up (no-op outside systemd).
pub fn ready() {
    if let Err(error) = sd_notify::notify(&[NotifyState::Ready]) {
        tracing::warn!(%error, "cannot tell systemd weir is ready (NOTIFY_SOCKET)");
    }
    READY.store(true, Ordering::Release);
}

/// Tells systemd weir is stopping.
pub fn stopping() {
    let _ = sd_notify::notify(&[NotifyState::Stopping]);
}

/// Feeds systemd's watchdog (`WatchdogSec`) at half its period, once
/// [`ready`] has been said, while the scheduler's `heart` keeps beating;
/// stops feeding it, saying why, when the scheduler has not turned for a
/// whole period. Returns at once when no watchdog is configured.
pub async fn watchdog(heart: Heartbeat, stop: CancellationToken) {
    let Some(period) = sd_notify::watchdog_enabled() else {
        return;
    };
    let mut tick = tokio::time::interval(period / 2);
    let mut last = heart.count();
    let mut quiet = Duration::ZERO;
    loop {
        // Cancel safety: both branches only wait.
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if !READY.load(Ordering::Acquire) {
            // Starting: systemd's start timeout covers this, not the
            // watchdog.
            continue;
        }
        let now = heart.count();
        if now != last {
            last = now;
            quiet = Duration::ZERO;
            let _ = sd_notify::notify(&[NotifyState::Watchdog]);
        } else {
            quiet += period / 2;
            if quiet >= period / 2 {
                tracing::error!(
                    silent_for = ?quiet,
                    "the scheduler loop has not run; not feeding systemd's watchdog, which will restart weir"
                );
            }
        }
    }
}
