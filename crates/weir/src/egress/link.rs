//! An emulated uplink for experiments on one machine: each transaction
//! costs a fixed delay plus its size over the bandwidth, one transaction at a
//! time, before the real sink sees it. The presets are JANUS Table III.

use std::time::Duration;

use super::batch::EncodedBatch;
use super::sink::{Confirm, Sink, SinkError};

/// A link's bandwidth and per-transaction delay.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkProfile {
    /// Bytes per second.
    pub bytes_per_sec: f64,
    /// Fixed time per transaction (`T_sc` of the piping model, `T_cc` of
    /// buffer-aided relaying).
    pub delay: Duration,
}

impl LinkProfile {
    /// JANUS Table III WiFi: 5 ms, 200 Mbit/s.
    pub const WIFI: LinkProfile = LinkProfile {
        bytes_per_sec: 200e6 / 8.0,
        delay: Duration::from_millis(5),
    };
    /// JANUS Table III 4G: 50 ms, 18 Mbit/s.
    pub const FOUR_G: LinkProfile = LinkProfile {
        bytes_per_sec: 18e6 / 8.0,
        delay: Duration::from_millis(50),
    };
    /// JANUS Table III 3G: 100 ms, 780 kbit/s.
    pub const THREE_G: LinkProfile = LinkProfile {
        bytes_per_sec: 780e3 / 8.0,
        delay: Duration::from_millis(100),
    };

    /// A preset by name: `wifi`, `4g`, `3g`.
    pub fn preset(name: &str) -> Option<LinkProfile> {
        match name {
            "wifi" => Some(Self::WIFI),
            "4g" => Some(Self::FOUR_G),
            "3g" => Some(Self::THREE_G),
            _ => None,
        }
    }

    /// How long a transaction of `bytes` takes on this link.
    pub fn transaction_time(&self, bytes: usize) -> Duration {
        let transfer = if self.bytes_per_sec > 0.0 {
            Duration::from_secs_f64(bytes as f64 / self.bytes_per_sec)
        } else {
            Duration::MAX
        };
        self.delay.saturating_add(transfer)
    }
}

/// A [`Sink`] behind an emulated link.
#[derive(Debug)]
pub struct EmulatedLink<S> {
    profile: LinkProfile,
    inner: S,
}

impl<S: Sink> EmulatedLink<S> {
    /// Wraps `inner`.
    pub fn new(profile: LinkProfile, inner: S) -> Self {
        EmulatedLink { profile, inner }
    }
}

impl<S: Sink> Sink for EmulatedLink<S> {
    /// Transactions on the emulated link are serial: each send holds the
    /// link for its transaction time before the real sink sees the batch.
    async fn send(&mut self, batch: &EncodedBatch) -> Result<Confirm, SinkError> {
        tokio::time::sleep(self.profile.transaction_time(batch.body.len())).await;
        self.inner.send(batch).await
    }

    fn window(&self) -> usize {
        self.inner.window()
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    /// The send sleeps out the transfer before handing the batch on.
    fn carried_on_send(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_follow_janus_table_three() {
        let g3 = LinkProfile::preset("3g").unwrap();
        // 97,500 bytes at 780 kbit/s take one second, plus 100 ms.
        assert_eq!(g3.transaction_time(97_500), Duration::from_millis(1100));
        assert_eq!(
            LinkProfile::preset("4g").unwrap().delay,
            Duration::from_millis(50)
        );
        assert!(LinkProfile::preset("5g").is_none());
    }
}
