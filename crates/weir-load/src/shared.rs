//! What the publishers, the consumer and the runs share: the run's
//! environment, the counters, unique names and threads of their own.

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::sync::oneshot;

/// How long draining (in-flight PUBACKs, then the consumer catching up)
/// may take after the load stops before the run counts as failed.
pub const DRAIN_PATIENCE: Duration = Duration::from_secs(60);

/// What every run needs.
pub struct Env {
    pub weir_bin: PathBuf,
    pub amqp: String,
    /// What weir publishes to, when not `amqp`.
    pub amqp_urls: Vec<String>,
    /// The queue type weir declares and the consumer reads.
    pub queue_type: crate::cli::QueueTypeArg,
    /// weir delivers to this Kafka broker instead of RabbitMQ, into a
    /// topic of the run's own.
    pub kafka: Option<String>,
    /// weir publishes each record to this MQTT broker instead (the MQTT
    /// egress, records mode), under a topic prefix of the run's own.
    pub mqtt_egress: Option<std::net::SocketAddr>,
    pub keep: bool,
    pub clk_tck: f64,
}

/// A name unique to this process.
pub fn unique(tag: &str) -> String {
    format!("weir-load-{}-{tag}", std::process::id())
}

/// Counters shared by the publisher, the consumer and the control loop.
#[derive(Default)]
pub struct Counters {
    /// Records handed to the wire; also the source of sequence numbers.
    pub sent: AtomicU64,
    /// Records acknowledged (PUBACK, or publisher confirm when direct).
    pub acked: AtomicU64,
    /// Records seen by the consumer.
    pub consumed: AtomicU64,
    /// AMQP messages seen by the consumer.
    pub messages: AtomicU64,
    /// Why the consumer stopped, if it failed (e.g. RabbitMQ restarted by
    /// another program), so that waits end at once with the reason.
    pub consumer_failed: std::sync::Mutex<Option<String>>,
    /// Set over the measured part: publishers then keep the time from
    /// each PUBLISH to its PUBACK.
    pub measuring: std::sync::atomic::AtomicBool,
    /// PUBLISH-to-PUBACK times over the measured part, microseconds.
    pub ack_latency_us: std::sync::Mutex<Vec<u64>>,
}

impl Counters {
    /// Fails if the consumer has.
    pub fn check_consumer(&self) -> anyhow::Result<()> {
        let failed = self.consumer_failed.lock().expect("not poisoned");
        match failed.as_ref() {
            Some(why) => bail!("the RabbitMQ consumer failed: {why}"),
            None => Ok(()),
        }
    }

    /// Starts (or stops) keeping PUBACK times.
    pub fn measure(&self, on: bool) {
        self.measuring.store(on, Ordering::Relaxed);
    }

    /// The PUBACK times kept so far, taken out.
    pub fn take_ack_latencies(&self) -> Vec<u64> {
        std::mem::take(&mut *self.ack_latency_us.lock().expect("not poisoned"))
    }

    pub fn get(&self) -> (u64, u64, u64) {
        (
            self.acked.load(Ordering::Relaxed),
            self.consumed.load(Ordering::Relaxed),
            self.messages.load(Ordering::Relaxed),
        )
    }
}

/// Runs `make()`'s future on a new thread with its own single-threaded
/// runtime, named so that `/proc/self/task` can attribute its CPU.
pub fn on_thread<T, F, Fut>(name: &str, make: F) -> impl Future<Output = anyhow::Result<T>> + Send
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = anyhow::Result<T>>,
{
    let (tx, rx) = oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let result = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("cannot start a runtime")
                .and_then(|rt| rt.block_on(make()));
            let _ = tx.send(result);
        });
    let name = name.to_string();
    async move {
        spawned.with_context(|| format!("cannot start thread {name}"))?;
        rx.await
            .with_context(|| format!("thread {name} panicked"))?
    }
}
