//! The emulated uplink both experiments send over: a fixed time per
//! transaction plus its bytes over the bandwidth, one transaction at a time,
//! in real time (tokio sleeps). It is the model both papers measure against
//! (`T = T_sc + US / Th_up`, Eq. 1 of the piping paper; `T_cc` plus a
//! per-report slope in buffer-aided relaying), and the same arithmetic as
//! `weir`'s own `LinkProfile::transaction_time`.

use std::time::Duration;

use serde::Serialize;
use tokio::sync::mpsc;
use tokio::time::Instant;
use weir_core::link_estimate::LinkEstimate;

/// A link's fixed per-transaction time and bandwidth.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Link {
    /// `T_sc` / `T_cc`: what every transaction costs whatever its size.
    pub per_transaction: Duration,
    /// `Th_up` / `B`: bytes per second once a transaction is under way.
    pub bytes_per_sec: f64,
}

impl Link {
    /// How long a transaction of `bytes` takes.
    pub fn transaction_time(&self, bytes: u64) -> Duration {
        self.per_transaction + self.transfer_time(bytes)
    }

    /// How long `bytes` take on the wire, without the fixed cost.
    pub fn transfer_time(&self, bytes: u64) -> Duration {
        Duration::from_secs_f64(bytes as f64 / self.bytes_per_sec)
    }

    /// One whole transaction of `bytes`, in real time.
    pub async fn transact(&self, bytes: u64) {
        tokio::time::sleep(self.transaction_time(bytes)).await;
    }

    /// One transaction whose bytes arrive in chunks while it is under way
    /// (compression piped into the socket): each chunk goes on the wire as
    /// soon as it is handed over and the wire is free, and the fixed cost is
    /// paid once, after the last byte (the transaction's acknowledgement).
    /// Returns the bytes sent once `chunks` is closed.
    ///
    /// The wire keeps its own schedule (`free_at`): a chunk already waiting
    /// when the wire frees up starts at `free_at`, not when the timer
    /// happened to wake, so late wakeups do not add up over many chunks.
    pub async fn transact_streaming(&self, chunks: &mut mpsc::Receiver<Vec<u8>>) -> u64 {
        let mut free_at = Instant::now();
        let mut sent = 0u64;
        loop {
            let chunk = match chunks.try_recv() {
                Ok(c) => c,
                Err(mpsc::error::TryRecvError::Disconnected) => break,
                Err(mpsc::error::TryRecvError::Empty) => match chunks.recv().await {
                    // The wire sat idle until this chunk came.
                    Some(c) => {
                        free_at = free_at.max(Instant::now());
                        c
                    }
                    // The stream ended after the wire went idle.
                    None => {
                        free_at = free_at.max(Instant::now());
                        break;
                    }
                },
            };
            let len = chunk.len() as u64;
            free_at += self.transfer_time(len);
            sent += len;
            tokio::time::sleep_until(free_at).await;
        }
        tokio::time::sleep_until(free_at + self.per_transaction).await;
        sent
    }

    /// The link as the models see it.
    pub fn estimate(&self) -> LinkEstimate {
        LinkEstimate {
            bytes_per_sec: self.bytes_per_sec,
            per_transaction: self.per_transaction,
        }
    }

    /// The link for the JSON output.
    pub fn summary(&self) -> LinkSummary {
        LinkSummary::from(self.estimate())
    }
}

/// A link or link estimate as the JSON files show it.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct LinkSummary {
    /// Bytes per second.
    pub bytes_per_sec: f64,
    /// Fixed per-transaction time, milliseconds.
    pub per_transaction_ms: f64,
}

impl From<LinkEstimate> for LinkSummary {
    fn from(e: LinkEstimate) -> Self {
        LinkSummary {
            bytes_per_sec: crate::report::round(e.bytes_per_sec, 1),
            per_transaction_ms: crate::report::ms(e.per_transaction),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transaction_time_is_fixed_plus_size_over_bandwidth() {
        let link = Link {
            per_transaction: Duration::from_millis(100),
            bytes_per_sec: 1000.0,
        };
        assert_eq!(link.transaction_time(500), Duration::from_millis(600));
        assert_eq!(link.transaction_time(0), Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn streaming_pays_the_fixed_cost_once_and_the_bytes_in_order() {
        let link = Link {
            per_transaction: Duration::from_millis(100),
            bytes_per_sec: 1000.0,
        };
        let (tx, mut rx) = mpsc::channel(4);
        let start = Instant::now();
        tokio::spawn(async move {
            tx.send(vec![0; 200]).await.unwrap();
            // Handed over while the wire is busy: queues behind the first.
            tx.send(vec![0; 300]).await.unwrap();
        });
        let sent = link.transact_streaming(&mut rx).await;
        assert_eq!(sent, 500);
        assert_eq!(start.elapsed(), Duration::from_millis(600));
    }
}
