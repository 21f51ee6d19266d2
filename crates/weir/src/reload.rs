//! Hot reload: re-reads the config file (SIGHUP, `POST /reload` on the
//! admin listener, `weir reload`) and applies in place what a running weir
//! can change, without closing a connection or touching a queued record:
//! routes (the classifier is swapped whole), class bounds and shares (the
//! scheduler's PBTT restarts from them), queue capacities, the scheduler's
//! rates and windows, batching, compression, peers, the log level and the
//! drain deadline. A file that does not validate, or that changes something only
//! a restart can (see [`crate::config::reload`]), is refused whole with
//! every problem listed, and the running config stays.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch};
use weir_core::batching::BatchLimits;
use weir_core::scheduler::{capacities_for, ReconfigureError, SchedulerParams};

use crate::config::{self, CompressionSection, Config, ConfigError, Problem};
use crate::intake::Intake;
use crate::scheduler::Reconfigure;
use crate::security::Refresh;

/// The file a running config came from, as it was read.
#[derive(Debug, Clone)]
pub struct Source {
    /// Where it is.
    pub path: PathBuf,
    /// Its text when last applied.
    pub text: String,
}

/// Why a reload was refused; the running config is unchanged.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// weir was started without `--config`.
    #[error("weir runs on its embedded defaults (no --config): there is no file to re-read")]
    NoFile,
    /// The file cannot be read or does not validate.
    #[error("{0}")]
    Invalid(#[from] ConfigError),
    /// The file changes something only a restart can.
    #[error("{}", .0.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("\n"))]
    Restart(Vec<Problem>),
    /// A new peer cannot be reached as configured.
    #[error(transparent)]
    Peers(#[from] crate::peer::PeerError),
    /// The scheduler refused the new bounds or parameters.
    #[error("the scheduler refused the new settings: {0}")]
    Scheduler(#[from] ReconfigureError),
    /// weir is shutting down.
    #[error("weir is shutting down")]
    Stopped,
}

/// What a reload applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    /// The keys whose text changed (all of them applied).
    pub keys: Vec<String>,
    /// From reading the file to the last part applied.
    pub took: Duration,
}

/// The config in force and its file.
#[derive(Debug)]
struct Running {
    config: Config,
    source: Option<Source>,
}

/// Applies reloads to the running parts.
pub struct Reloader {
    running: tokio::sync::Mutex<Running>,
    /// Its queues and metrics are the ones a reload changes.
    intake: Arc<Intake>,
    scheduler: mpsc::Sender<Reconfigure>,
    compression: watch::Sender<CompressionSection>,
    /// Certificate, key, password, ACL and token files, re-read first.
    watched: std::sync::Mutex<Vec<Arc<dyn Refresh>>>,
    /// Peering, when on: its peers change in place.
    peering: std::sync::Mutex<Option<crate::peer::PeeringHandle>>,
}

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader").finish_non_exhaustive()
    }
}

/// The scheduler's parameters in `cfg`.
pub fn scheduler_params(cfg: &Config) -> SchedulerParams {
    SchedulerParams {
        scheme: cfg.scheduler.scheme,
        window: cfg.scheduler.window,
        processing_delay: cfg.scheduler.processing_delay,
        capacity: cfg.scheduler.uplink_bytes_per_sec,
        burst_bytes: cfg.scheduler.burst_bytes.map(|b| b as f64),
        limits: BatchLimits {
            max_records: cfg.scheduler.max_batch_records,
            max_bytes: cfg.scheduler.max_batch_bytes,
        },
        adaptive: cfg.batching.adaptive,
        reference: cfg.batching.reference.clone(),
        track_uplink: cfg.scheduler.track_uplink,
        mix_classes: cfg.scheduler.mix_classes,
        gather: cfg.batching.gather,
    }
}

/// The uplink estimate the egress starts from in `cfg`: tracked, what TCP
/// carries of `scheduler.uplink` (`payload_prior`); pinned, the link as the
/// operator gave it.
pub fn link_prior(cfg: &Config) -> weir_core::link_estimate::LinkEstimate {
    let nominal = weir_core::link_estimate::LinkEstimate {
        bytes_per_sec: cfg.scheduler.uplink_bytes_per_sec,
        per_transaction: cfg.scheduler.transaction_time,
    };
    match cfg.scheduler.track_uplink {
        true => weir_core::link_estimate::payload_prior(nominal),
        false => nominal,
    }
}

impl Reloader {
    /// Over the running parts, with `config` (read from `source`, if from a
    /// file) in force.
    pub fn new(
        config: Config,
        source: Option<Source>,
        intake: Arc<Intake>,
        scheduler: mpsc::Sender<Reconfigure>,
        compression: watch::Sender<CompressionSection>,
    ) -> Self {
        Reloader {
            running: tokio::sync::Mutex::new(Running { config, source }),
            intake,
            scheduler,
            compression,
            watched: std::sync::Mutex::new(Vec::new()),
            peering: std::sync::Mutex::new(None),
        }
    }

    /// Peering, once started: a reload changes its peers.
    pub fn set_peering(&self, peering: crate::peer::PeeringHandle) {
        *self.peering.lock().expect("not poisoned") = Some(peering);
    }

    /// Installs `peers` in the running peering, if any and if they changed.
    fn apply_peers(&self, old: &Config, new: &Config) -> Result<(), ReloadError> {
        let (Some(o), Some(n)) = (&old.peering, &new.peering) else {
            return Ok(());
        };
        if o.peers == n.peers {
            return Ok(());
        }
        let peering = self.peering.lock().expect("not poisoned").clone();
        if let Some(p) = peering {
            p.set_peers(n.peers.clone())?;
        }
        Ok(())
    }

    /// The files a reload re-reads before the config.
    pub fn watch(&self, files: Vec<Arc<dyn Refresh>>) {
        *self.watched.lock().expect("not poisoned") = files;
    }

    /// Re-reads every certificate, key, password, ACL and token file now
    /// rather than at the next look; a file that does not load leaves its
    /// previous version in force. Returns how many changed.
    pub async fn refresh_files(&self) -> usize {
        let items = self.watched.lock().expect("not poisoned").clone();
        tokio::task::spawn_blocking(move || items.iter().filter(|i| i.refresh()).count())
            .await
            .unwrap_or(0)
    }

    /// The config in force.
    pub async fn config(&self) -> Config {
        self.running.lock().await.config.clone()
    }

    /// Names the file to reload from (weir started from a file that was
    /// read elsewhere).
    pub async fn set_source(&self, source: Source) {
        self.running.lock().await.source = Some(source);
    }

    /// Re-reads the config file and applies it, or refuses it whole; the
    /// outcome is counted and logged either way.
    pub async fn reload(&self) -> Result<Applied, ReloadError> {
        let changed = self.refresh_files().await;
        if changed > 0 {
            tracing::info!(
                changed,
                "certificate, key, password, ACL or token files re-read"
            );
        }
        let result = self.try_reload().await;
        if let Err(ReloadError::NoFile) = result {
            tracing::info!(
                "no config file (embedded defaults): only the files it names were re-read"
            );
            return result;
        }
        self.intake.metrics().latency.reload(result.is_ok());
        match &result {
            Ok(a) if a.keys.is_empty() => {
                tracing::info!("config reloaded: no change");
            }
            Ok(a) => tracing::info!(
                keys = %a.keys.join(", "),
                took_ms = a.took.as_secs_f64() * 1e3,
                "config reloaded"
            ),
            Err(e) => tracing::error!("config reload refused, the running config stays:\n{e}"),
        }
        result
    }

    async fn try_reload(&self) -> Result<Applied, ReloadError> {
        // One reload at a time, in order.
        let mut running = self.running.lock().await;
        let Some(source) = &running.source else {
            return Err(ReloadError::NoFile);
        };
        let started = Instant::now();
        let (new, text) = config::load_text(&source.path)?;
        let problems = config::reload::restart_needed(&running.config, &source.text, &new, &text);
        if !problems.is_empty() {
            return Err(ReloadError::Restart(problems));
        }
        let keys = config::reload::changed_keys(&source.text, &text);
        // The parts that can still refuse first: the peers (an address a
        // client cannot be built for), then the scheduler (bounds PBTT
        // refuses), which puts the old peers back if it refuses.
        self.apply_peers(&running.config, &new)?;
        let (done, answer) = oneshot::channel();
        let sent = self
            .scheduler
            .send(Reconfigure {
                params: scheduler_params(&new),
                classes: new.classes.clone(),
                done,
            })
            .await;
        let answered = match sent {
            Ok(()) => answer.await.map_err(|_| ReloadError::Stopped),
            Err(_) => Err(ReloadError::Stopped),
        };
        if let Err(e) = answered.and_then(|r| r.map_err(ReloadError::from)) {
            let _ = self.apply_peers(&new, &running.config);
            return Err(e);
        }
        // Sized to the memory limit as start-up sizes them.
        let limit = crate::memory::resolve(new.node.memory_limit);
        self.intake.queues().set_capacities(&capacities_for(
            new.scheduler.scheme,
            &crate::memory::capacities(&new, limit.as_ref()),
        ));
        self.intake.set_classifier(new.classifier.clone());
        self.intake.metrics().latency.set_bounds(&new.classes);
        // The chooser keeps what it measured unless its settings changed.
        self.compression.send_if_modified(|c| {
            let changed = *c != new.compression;
            if changed {
                *c = new.compression.clone();
            }
            changed
        });
        if new.log.level != running.config.log.level {
            crate::telemetry::set_level(&new.log.level);
        }
        let path = source.path.clone();
        running.config = new;
        running.source = Some(Source { path, text });
        Ok(Applied {
            keys,
            took: started.elapsed(),
        })
    }
}
