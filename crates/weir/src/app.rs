//! Wiring: builds the queues, ingress, scheduler and egress from a validated
//! [`Config`], runs them, and shuts them down in order.
//!
//! Shutdown: stop accepting (listeners close, waiting enqueues give up),
//! let the scheduler drain every queue into the egress, let the egress
//! confirm every batch, all within a deadline; what the deadline cuts off is
//! logged with counts, never dropped silently.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use weir_core::queueing::queue::MultiLevelQueue;
use weir_core::scheduler::{self, OutBatch};

use crate::config::{Config, EgressSink, MqttListen, MqttMode};
use crate::egress::file::FileSink;
use crate::egress::link::{EmulatedLink, LinkProfile};
use crate::egress::{self, Sink};
use crate::handoff::LinkReady;
use crate::ingress;
use crate::intake::Intake;
use crate::metrics::Metrics;
use crate::security::{GrpcSecurity, MqttSecurity, Refresh};
use crate::spool::{SequenceLease, Spool};

/// Batches between the scheduler and the egress: at most one per free slot
/// of the egress's window of unconfirmed batches, each built when the egress
/// says a slot is free ([`LinkReady`]), so priority is decided at the last
/// moment. The channel holds the whole window, so the scheduler never finds
/// it full.
fn egress_channel(sink: &EgressSink) -> usize {
    match sink {
        EgressSink::Amqp(a) => a.max_in_flight.max(1),
        EgressSink::Kafka(k) => k.max_in_flight.max(1),
        EgressSink::Mqtt(m) => m.max_in_flight.clamp(1, 64),
        EgressSink::File(_) => 1,
    }
}

/// A sink's start-up refusal (a topology mismatch, a missing topic, a
/// broker refusing weir) as the config problem it is, under `key`.
fn refused(key: &str, message: String) -> AppError {
    AppError::Topology {
        problems: vec![crate::config::Problem {
            path: key.to_owned(),
            message,
        }],
    }
}

/// Completed transactions waiting for the scheduler's batch sizers; the
/// egress drops reports rather than wait when the scheduler lags.
const DELIVERED_CHANNEL: usize = 256;

/// Longest pause between retries of the file egress (the AMQP egress uses
/// `egress.amqp.reconnect_backoff_max`).
const EGRESS_RETRY_MAX: Duration = Duration::from_secs(5);

/// Most threads for blocking work (spool syncs, password hashing, file
/// reloads, compression samples).
const BLOCKING_THREADS: usize = 64;

/// A running weir.
pub struct App {
    /// Where the plain MQTT listener is bound (listen mode).
    pub mqtt_addr: Option<SocketAddr>,
    /// Where the MQTT-over-TLS listener is bound (`[ingress.mqtt.tls]`).
    pub mqtt_tls_addr: Option<SocketAddr>,
    /// Where the gRPC listener is bound.
    pub grpc_addr: Option<SocketAddr>,
    /// Where the admin listener is bound.
    pub admin_addr: Option<SocketAddr>,
    /// Peering, when `[peering]` is configured (its address, status, and a
    /// kill switch for failure experiments).
    pub peering: Option<crate::peer::PeeringHandle>,
    /// The shared ingress handle (tests and the lab enqueue through it).
    pub ingress: Arc<Intake>,
    stop: CancellationToken,
    abort: CancellationToken,
    listeners: TaskTracker,
    scheduler: JoinHandle<()>,
    egress: JoinHandle<()>,
    reloader: Arc<crate::reload::Reloader>,
}

/// Why weir could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// A listener could not be bound.
    #[error("cannot listen for {what} on {addr} (is another program using it? change `{key}`): {source}")]
    Bind {
        /// What would have listened.
        what: &'static str,
        /// The configured address.
        addr: SocketAddr,
        /// The config key that sets it.
        key: &'static str,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The file egress could not start in its directory (not creatable,
    /// or another process writes this node's segments there).
    #[error("cannot write segments in {} (egress.file.dir): {source}", dir.display())]
    BatchDir {
        /// The configured directory.
        dir: std::path::PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// Peering could not start.
    #[error(transparent)]
    Peering(#[from] crate::peer::PeerError),
    /// The drain deadline (`egress.drain_timeout`) passed with records of
    /// `memory` classes undelivered.
    #[error("shutdown left records of memory classes undelivered (lost): {}; raise egress.drain_timeout or use durability = \"spool\"", lost.iter().map(|(c, n)| format!("{c}: {n}")).collect::<Vec<_>>().join(", "))]
    Undelivered {
        /// Class name and records lost.
        lost: Vec<(String, u64)>,
    },
    /// The spool could not be opened.
    #[error(transparent)]
    Spool {
        /// What failed.
        #[from]
        source: crate::spool::SpoolError,
    },
    /// A certificate, key, password or ACL file cannot be used.
    #[error("{}", problems.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("; "))]
    Security {
        /// Every problem, under the key naming the file.
        problems: Vec<crate::config::Problem>,
    },
    /// RabbitMQ refused the configured exchange or queue (it exists with
    /// other settings, or the user may not declare it).
    #[error("{}", problems.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("; "))]
    Topology {
        /// The problem, under the key to change.
        problems: Vec<crate::config::Problem>,
    },
    /// `node.nice` or `node.realtime_priority` could not be applied.
    #[error(transparent)]
    Priority(#[from] crate::priority::PriorityError),
    /// The async runtime or a signal handler could not be set up.
    #[error("cannot {what}: {source}")]
    Runtime {
        /// What failed.
        what: &'static str,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

impl AppError {
    /// The config problems behind this error, when it is one: a file the
    /// config names (certificate, key, password, ACL, token) that cannot be
    /// used.
    pub fn config_problems(&self) -> Option<&[crate::config::Problem]> {
        match self {
            AppError::Security { problems }
            | AppError::Topology { problems }
            | AppError::Peering(crate::peer::PeerError::Tls { problems }) => Some(problems),
            _ => None,
        }
    }
}

/// Says at start-up who may connect over MQTT, as Mosquitto 2.0 does.
fn announce_mqtt_auth(l: &MqttListen) {
    let addrs: Vec<SocketAddr> = l
        .addr
        .into_iter()
        .chain(l.tls.as_ref().map(|t| t.listen))
        .collect();
    let certificates = l.tls.as_ref().is_some_and(|t| t.files.require_certificate);
    if l.auth.password_file.is_none() && !certificates {
        if addrs.iter().all(|a| a.ip().is_loopback()) {
            tracing::info!(
                "MQTT: no authentication configured, so listening on loopback only; set ingress.mqtt.password_file (and acl_file) to accept devices from the network"
            );
        } else {
            tracing::warn!(
                "MQTT: allow_anonymous = true on a listener other hosts can reach: anyone on the network may publish"
            );
        }
    } else if l.auth.allow_anonymous {
        tracing::info!(
            "MQTT: anonymous clients allowed beside authenticated ones (allow_anonymous = true)"
        );
    }
    if l.auth.acl_file.is_none() && (l.auth.password_file.is_some() || certificates) {
        tracing::info!("MQTT: no acl_file: every authenticated client may publish to any topic");
    }
}

/// Binds `addr` for `what`, read back as bound (port 0 picks one).
async fn bind(
    addr: SocketAddr,
    what: &'static str,
    key: &'static str,
) -> Result<(TcpListener, SocketAddr), AppError> {
    let err = |source| AppError::Bind {
        what,
        addr,
        key,
        source,
    };
    let l = TcpListener::bind(addr).await.map_err(err)?;
    let local = l.local_addr().map_err(err)?;
    Ok((l, local))
}

fn spawn_egress<S: Sink>(
    sink: S,
    link: Option<LinkProfile>,
    rx: mpsc::Receiver<OutBatch>,
    ctx: egress::EgressContext,
) -> JoinHandle<()> {
    match link {
        Some(profile) => tokio::spawn(egress::run(EmulatedLink::new(profile, sink), rx, ctx)),
        None => tokio::spawn(egress::run(sink, rx, ctx)),
    }
}

/// The certificate, key, password, ACL and token files behind the
/// listeners, loaded before anything starts.
struct Security {
    mqtt: Option<MqttSecurity>,
    grpc: Option<GrpcSecurity>,
    admin_tls: Option<Arc<crate::security::Watched<rustls::ServerConfig>>>,
}

impl Security {
    fn load(cfg: &Config) -> Result<Security, AppError> {
        let problems = |problems| AppError::Security { problems };
        let mqtt = match cfg.ingress.mqtt.as_ref().map(|m| &m.mode) {
            Some(MqttMode::Listen(l)) => Some(MqttSecurity::load(l).map_err(problems)?),
            _ => None,
        };
        let grpc = match &cfg.ingress.grpc {
            Some(g) => Some(GrpcSecurity::load(g).map_err(problems)?),
            None => None,
        };
        let admin_tls = match &cfg.admin.tls {
            Some(files) => Some(
                crate::security::server_tls("admin TLS certificate", "admin.tls", files, &[])
                    .map_err(problems)?,
            ),
            None => None,
        };
        Ok(Security {
            mqtt,
            grpc,
            admin_tls,
        })
    }
}

/// The class queues, sized to the memory weir may use (said in the log),
/// and the metrics, which read the queues' lengths when scraped.
fn queues_and_metrics(
    cfg: &Config,
    memory_limit: Option<&crate::memory::Limit>,
) -> (Arc<MultiLevelQueue>, Arc<Metrics>) {
    let memory_plan = crate::memory::plan(cfg, memory_limit);
    let described = crate::memory::describe(&memory_plan, cfg.node.memory_limit, memory_limit);
    if memory_plan.starved() {
        tracing::warn!("{described}");
    } else {
        tracing::info!("{described}");
    }
    if let Some(w) = crate::memory::connections_warning(cfg, memory_limit) {
        tracing::warn!("{w}");
    }
    let queues = Arc::new(scheduler::queues_for(
        cfg.scheduler.scheme,
        &memory_plan.queues,
    ));
    let metrics = Arc::new(Metrics::new(&cfg.classes));
    {
        // Queue lengths are read when scraped, never a window late.
        let queues = Arc::clone(&queues);
        metrics.on_render(move |m| {
            for (class, q) in queues.iter() {
                m.set_queued(class, q.len());
            }
        });
    }
    (queues, metrics)
}

/// The intake with its spool, and where batch numbers start.
struct Opened {
    ingress: Arc<Intake>,
    spool: Option<Arc<Spool>>,
    batch_lease: Option<SequenceLease>,
    first_batch_seq: u64,
}

/// The intake over `queues`, with the spool when a class uses it (its
/// recovered records reach the queues here, before any listener opens)
/// and the sequence-number leases in `spool.dir`: record and batch numbers
/// start above the last lease and the clock, so a restarted node never
/// reuses an (origin, seq) or a batch number the cloud has seen, even at a
/// restored clock; without a lease, from the clock alone.
fn open_intake(
    cfg: &Config,
    queues: &Arc<MultiLevelQueue>,
    metrics: &Arc<Metrics>,
    stop: &CancellationToken,
) -> Result<Opened, AppError> {
    let seed = crate::clock::unix_micros();
    let intake = Intake::new(
        cfg.node.id,
        cfg.classes.clone(),
        cfg.classifier.clone(),
        Arc::clone(queues),
        seed,
        stop.clone(),
        Arc::clone(metrics),
    );
    let (spool, lease) = if cfg.spooled() {
        let spool_error = |source| AppError::Spool { source };
        let (spool, recovered) = Spool::open(
            &cfg.spool,
            &cfg.classes,
            &cfg.durability,
            Arc::clone(queues),
            intake.arrivals_handle(),
            Arc::clone(metrics),
        )
        .map_err(spool_error)?;
        let lease = SequenceLease::open(&cfg.spool.dir, seed).map_err(|source| {
            spool_error(crate::spool::SpoolError::Dir {
                path: cfg.spool.dir.clone(),
                source,
            })
        })?;
        tracing::info!(
            dir = %cfg.spool.dir.display(),
            sync = %cfg.spool.sync,
            recovered = recovered.records.iter().sum::<u64>(),
            corrupt = recovered.corrupt,
            torn_bytes = recovered.torn_bytes,
            quarantined = recovered.quarantined,
            "spool open"
        );
        (Some(Arc::new(spool)), Some(lease))
    } else {
        // No class is spooled: the lease still lives in spool.dir, so
        // that record ids never repeat across restarts.
        (None, SequenceLease::open_alone(&cfg.spool.dir, seed))
    };
    // Batch numbers (a batch file's name, an AMQP message_id) from a lease
    // beside the records', where there is one: a restart at a restored
    // clock must not overwrite a batch file nor have a consumer drop a
    // batch as one it has seen.
    let batch_lease = lease.as_ref().and_then(|_| {
        SequenceLease::open_batches(&cfg.spool.dir, seed)
            .map_err(|e| tracing::warn!(dir = %cfg.spool.dir.display(), error = %e, "no batch sequence-number lease: batch numbers start from the clock"))
            .ok()
    });
    let first_batch_seq = batch_lease.as_ref().map_or(seed, SequenceLease::peek);
    Ok(Opened {
        ingress: Arc::new(intake.with_spool(spool.clone(), lease)),
        spool,
        batch_lease,
        first_batch_seq,
    })
}

/// Who hears of each confirmed batch besides the scheduler: peering (its
/// custody of lent records) and the spool (which releases the records).
fn delivery_observers(
    peering: Option<&crate::peer::Peering>,
    spool: Option<&Arc<Spool>>,
) -> Vec<Arc<dyn egress::DeliveryObserver>> {
    let peering = peering.map(|p| p.deliveries() as Arc<dyn egress::DeliveryObserver>);
    let spool =
        spool.map(|s| Arc::new(SpoolRelease(Arc::clone(s))) as Arc<dyn egress::DeliveryObserver>);
    peering.into_iter().chain(spool).collect()
}

/// The scheduler's ends of the channels to and from the egress.
struct EgressWires {
    batches: mpsc::Sender<OutBatch>,
    ready: LinkReady,
    link: tokio::sync::watch::Receiver<weir_core::link_estimate::LinkEstimate>,
    delivered: mpsc::Receiver<weir_core::scheduler::Delivered>,
    compression: tokio::sync::watch::Sender<crate::config::CompressionSection>,
    horizon: tokio::sync::watch::Sender<Duration>,
    batch_bytes: tokio::sync::watch::Receiver<u64>,
}

impl EgressWires {
    /// What the scheduler is fed (with peering's port and the reloads'
    /// channel), the batches' channel, the link's permits, and where a
    /// reload sends the compression settings.
    fn feedback(
        self,
        peer: Option<crate::handoff::PeerPort>,
        reconfigure: mpsc::Receiver<crate::scheduler::Reconfigure>,
    ) -> (
        crate::scheduler::Feedback,
        mpsc::Sender<OutBatch>,
        LinkReady,
        tokio::sync::watch::Sender<crate::config::CompressionSection>,
    ) {
        let feedback = crate::scheduler::Feedback {
            link: self.link,
            delivered: self.delivered,
            peer,
            reconfigure,
            horizon: self.horizon,
            batch_bytes: self.batch_bytes,
        };
        (feedback, self.batches, self.ready, self.compression)
    }
}

/// Starts the configured egress (a broker that refuses the configured
/// queue stops weir here, before anything is accepted) and returns its
/// task with the scheduler's ends of the channels between them.
async fn start_egress(
    cfg: &Config,
    observers: Vec<Arc<dyn egress::DeliveryObserver>>,
    metrics: &Arc<Metrics>,
    memory_limit: Option<&crate::memory::Limit>,
    abort: CancellationToken,
) -> Result<(JoinHandle<()>, EgressWires), AppError> {
    let (tx, rx) = mpsc::channel(egress_channel(&cfg.egress.sink));
    let ready: LinkReady = Arc::default();
    let link = cfg.egress.link.as_ref().map(|l| LinkProfile {
        bytes_per_sec: l.bandwidth_bytes_per_sec,
        delay: l.delay,
    });
    let link_prior = crate::reload::link_prior(cfg);
    let (link_tx, link_rx) = tokio::sync::watch::channel(link_prior);
    let (delivered_tx, delivered_rx) = mpsc::channel(DELIVERED_CHANNEL);
    let (compression_tx, compression_rx) = tokio::sync::watch::channel(cfg.compression.clone());
    // The scheduler sets the horizon at its start (weir_core::admission).
    let (horizon_tx, horizon_rx) = tokio::sync::watch::channel(Duration::MAX);
    // The egress's pipe publishes the batch size it asks for at its start.
    let (batch_bytes_tx, batch_bytes_rx) =
        tokio::sync::watch::channel(cfg.scheduler.max_batch_bytes as u64);
    let ctx = egress::EgressContext {
        node: cfg.node.id,
        classes: cfg.classes.clone(),
        ready: Arc::clone(&ready),
        delivered: Some(delivered_tx),
        observers,
        compression: compression_rx,
        link_prior,
        link: link_tx,
        batch_bytes: batch_bytes_tx,
        max_in_flight_bytes: crate::memory::pipe_bytes(memory_limit),
        max_batch_bytes: cfg.scheduler.max_batch_bytes as u64,
        metrics: Arc::clone(metrics),
        // A broker's reconnect pacing is the operator's to set.
        retry_max: match &cfg.egress.sink {
            EgressSink::Amqp(a) => a.reconnect_backoff_max,
            EgressSink::Kafka(k) => k.reconnect_backoff_max,
            EgressSink::Mqtt(m) => m.reconnect_backoff_max,
            EgressSink::File(_) => EGRESS_RETRY_MAX,
        },
        abort,
        horizon: horizon_rx,
        // Beside RabbitMQ's window of unconfirmed batches (a file sink has
        // no window).
        urgent_lane: matches!(&cfg.egress.sink, EgressSink::Amqp(a) if a.urgent_lane),
        // The MQTT sink's records mode publishes records, not the body.
        compress: !matches!(&cfg.egress.sink, EgressSink::Mqtt(m) if m.mode == crate::config::MqttEgressMode::Records),
    };
    let egress = match &cfg.egress.sink {
        EgressSink::File(f) => {
            let sink = FileSink::new(f, cfg.node.id).map_err(|source| AppError::BatchDir {
                dir: f.dir.clone(),
                source,
            })?;
            spawn_egress(sink, link, rx, ctx)
        }
        EgressSink::Amqp(a) => {
            let mut sink = egress::amqp::AmqpSink::new(a.clone(), cfg.node.id)
                .with_classes(&cfg.classes)
                .with_metrics(Arc::clone(&metrics.amqp));
            sink.start().await.map_err(|e| refused(e.key, e.message))?;
            spawn_egress(sink, link, rx, ctx)
        }
        EgressSink::Mqtt(m) => {
            let mut sink = egress::mqtt::MqttSink::new(m.clone(), cfg.node.id, &cfg.classes);
            sink.start().await.map_err(|e| refused(e.key, e.message))?;
            spawn_egress(sink, link, rx, ctx)
        }
        EgressSink::Kafka(k) => {
            let mut sink = egress::kafka::KafkaSink::new(k.clone(), cfg.node.id, &cfg.classes);
            sink.start().await.map_err(|e| refused(e.key, e.message))?;
            spawn_egress(sink, link, rx, ctx)
        }
    };
    let wires = EgressWires {
        batches: tx,
        ready,
        link: link_rx,
        delivered: delivered_rx,
        compression: compression_tx,
        horizon: horizon_tx,
        batch_bytes: batch_bytes_rx,
    };
    Ok((egress, wires))
}

/// What every listener task is started with.
struct Tasks<'a> {
    ingress: &'a Arc<Intake>,
    stop: &'a CancellationToken,
    tracker: &'a TaskTracker,
}

/// The MQTT ingress: listeners (plain and TLS) in listen mode, or the
/// subscriber; where the listeners are bound.
async fn start_mqtt(
    cfg: &Config,
    security: &Security,
    tasks: &Tasks<'_>,
    watched: &mut Vec<Arc<dyn Refresh>>,
) -> Result<(Option<SocketAddr>, Option<SocketAddr>), AppError> {
    let Some(m) = &cfg.ingress.mqtt else {
        return Ok((None, None));
    };
    let l = match &m.mode {
        MqttMode::Listen(l) => l,
        MqttMode::Subscribe(sub) => {
            tasks.tracker.spawn(ingress::mqtt::subscribe::run(
                m.clone(),
                sub.clone(),
                Arc::clone(tasks.ingress),
                tasks.stop.clone(),
            ));
            return Ok((None, None));
        }
    };
    let mut bound = ingress::mqtt::listen::Listeners::default();
    let (mut plain, mut tls) = (None, None);
    if let Some(addr) = l.addr {
        let (listener, local) = bind(addr, "MQTT", "ingress.mqtt.listen").await?;
        plain = Some(local);
        bound.plain = Some(listener);
    }
    if let Some(t) = &l.tls {
        let (listener, local) = bind(t.listen, "MQTT over TLS", "ingress.mqtt.tls.listen").await?;
        tls = Some(local);
        bound.tls = Some(listener);
        bound.use_identity_as_username = t.use_identity_as_username;
    }
    announce_mqtt_auth(l);
    let security = security.mqtt.clone().expect("loaded for listen mode");
    watched.extend(security.watched());
    tasks.tracker.spawn(ingress::mqtt::listen::serve_secured(
        bound,
        m.clone(),
        security,
        Arc::clone(tasks.ingress),
        tasks.stop.clone(),
    ));
    Ok((plain, tls))
}

/// The gRPC ingress, when on; where it is bound.
async fn start_grpc(
    cfg: &Config,
    security: &Security,
    tasks: &Tasks<'_>,
    watched: &mut Vec<Arc<dyn Refresh>>,
) -> Result<Option<SocketAddr>, AppError> {
    let Some(g) = &cfg.ingress.grpc else {
        return Ok(None);
    };
    let (l, local) = bind(g.listen, "gRPC", "ingress.grpc.listen").await?;
    let security = security.grpc.clone().expect("loaded when gRPC is on");
    watched.extend(security.watched());
    let (g, ing, stop) = (g.clone(), Arc::clone(tasks.ingress), tasks.stop.clone());
    tasks.tracker.spawn(async move {
        if let Err(e) = ingress::grpc::serve_secured(l, g, security, ing, stop).await {
            tracing::error!(error = %e, "gRPC ingress stopped");
        }
    });
    Ok(Some(local))
}

/// The admin endpoint (metrics, health, reload), when configured; where
/// it is bound.
async fn start_admin(
    cfg: &Config,
    security: &Security,
    state: crate::admin::AdminState,
    tasks: &Tasks<'_>,
    watched: &mut Vec<Arc<dyn Refresh>>,
) -> Result<Option<SocketAddr>, AppError> {
    let Some(addr) = cfg.admin.listen else {
        return Ok(None);
    };
    let (l, local) = bind(addr, "the admin endpoint", "admin.listen").await?;
    let tls = security.admin_tls.clone();
    if let Some(tls) = &tls {
        watched.push(tls.clone());
    }
    let stop = tasks.stop.clone();
    tasks.tracker.spawn(async move {
        let served = match tls {
            Some(tls) => crate::admin::serve_tls(l, tls, state, stop).await,
            None => crate::admin::serve(l, state, stop).await,
        };
        if let Err(e) = served {
            tracing::error!(error = %e, "admin endpoint stopped");
        }
    });
    Ok(Some(local))
}

impl App {
    /// Binds every listener and starts every task, in the order that keeps
    /// weir from accepting what it cannot keep or send: the security files
    /// (a bad one stops weir first), the queues and the spool (recovered
    /// records reach the queues before any listener opens), peering's
    /// socket, the egress, the scheduler, then the listeners and peering.
    pub async fn start(cfg: Config) -> Result<App, AppError> {
        let security = Security::load(&cfg)?;
        let memory_limit = crate::memory::resolve(cfg.node.memory_limit);
        let (queues, metrics) = queues_and_metrics(&cfg, memory_limit.as_ref());
        let stop = CancellationToken::new();
        let abort = CancellationToken::new();
        let opened = open_intake(&cfg, &queues, &metrics, &stop)?;
        let ingress = Arc::clone(&opened.ingress);

        // Peering binds first (it accepts nothing until it starts, below):
        // the egress reports deliveries to it, the scheduler publishes its
        // PBTT state to it, and the scheduler stops only once peering has
        // handed back every record it lent to a peer.
        let mut peering = match &cfg.peering {
            Some(p) => Some(crate::peer::Peering::bind(p.clone()).await?),
            None => None,
        };
        // Egress next, so nothing is accepted that cannot be sent.
        let observers = delivery_observers(peering.as_ref(), opened.spool.as_ref());
        let limit = memory_limit.as_ref();
        let (egress, wires) = start_egress(&cfg, observers, &metrics, limit, abort.clone()).await?;

        let scheduler_stop = peering
            .as_ref()
            .map_or_else(|| stop.clone(), |p| p.scheduler_stop());
        let (reconfigure_tx, reconfigure_rx) = mpsc::channel(1);
        let heart = crate::systemd::Heartbeat::default();
        let (feedback, batches, ready, compression) = wires.feedback(
            peering.as_mut().and_then(|p| p.scheduler_port()),
            reconfigure_rx,
        );
        let scheduler = tokio::spawn(crate::scheduler::run(
            crate::reload::scheduler_params(&cfg),
            opened.first_batch_seq,
            opened.batch_lease,
            feedback,
            Arc::clone(&ingress),
            batches,
            ready,
            scheduler_stop,
            abort.clone(),
            heart.clone(),
        ));
        let reloader = Arc::new(crate::reload::Reloader::new(
            cfg.clone(),
            None,
            Arc::clone(&ingress),
            reconfigure_tx,
            compression,
        ));
        let listeners = TaskTracker::new();
        listeners.spawn(crate::systemd::watchdog(heart, stop.clone()));
        // Certificate, key, password, ACL and token files in force,
        // refreshed when they change (and on SIGHUP).
        let mut watched: Vec<Arc<dyn Refresh>> = Vec::new();
        let tasks = Tasks {
            ingress: &ingress,
            stop: &stop,
            tracker: &listeners,
        };
        let (mqtt_addr, mqtt_tls_addr) = start_mqtt(&cfg, &security, &tasks, &mut watched).await?;
        let grpc_addr = start_grpc(&cfg, &security, &tasks, &mut watched).await?;
        let admin = crate::admin::AdminState {
            metrics: Arc::clone(&metrics),
            reloader: Some(Arc::clone(&reloader)),
        };
        let admin_addr = start_admin(&cfg, &security, admin, &tasks, &mut watched).await?;
        let peering = match peering {
            Some(p) => Some(p.start(
                cfg.scheduler.scheme,
                Arc::clone(&ingress),
                stop.clone(),
                abort.clone(),
                &listeners,
            )?),
            None => None,
        };
        if let Some(p) = &peering {
            watched.extend(p.watched());
            reloader.set_peering(p.clone());
            let p = p.clone();
            metrics.on_render(move |_| p.publish_adverts());
        }
        listeners.spawn(crate::security::watch::watch(watched.clone(), stop.clone()));
        listeners.close();
        reloader.watch(watched);
        let app = App {
            mqtt_addr,
            mqtt_tls_addr,
            grpc_addr,
            admin_addr,
            peering,
            ingress,
            stop,
            abort,
            listeners,
            scheduler,
            egress,
            reloader,
        };
        tracing::info!(
            node = cfg.node.id,
            scheme = %cfg.scheduler.scheme,
            mqtt = ?app.mqtt_addr,
            mqtt_tls = ?app.mqtt_tls_addr,
            grpc = ?app.grpc_addr,
            admin = ?app.admin_addr,
            peering = ?app.peering.as_ref().map(|p| p.local_addr()),
            "weir started"
        );
        Ok(app)
    }

    /// Re-reads the certificate, key, password, ACL and token files and the
    /// config file, and applies the config in place or refuses it whole
    /// (see [`crate::reload`]).
    pub async fn reload(&self) -> Result<crate::reload::Applied, crate::reload::ReloadError> {
        self.reloader.reload().await
    }

    /// The reloads' entry point.
    pub fn reloader(&self) -> &Arc<crate::reload::Reloader> {
        &self.reloader
    }

    /// A token that, when cancelled, starts the same shutdown as
    /// [`App::shutdown`] (used for signals).
    pub fn stop_token(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Resolves once a stop has been requested.
    pub async fn stopped(&self) {
        self.stop.cancelled().await
    }

    /// Stops accepting, drains the queues through the egress, and returns
    /// once everything is confirmed or `deadline` has passed, with what was
    /// left undelivered.
    pub async fn shutdown(mut self, deadline: Duration) -> Shutdown {
        self.stop.cancel();
        let abort = self.abort.clone();
        let (scheduler, egress) = (&mut self.scheduler, &mut self.egress);
        let listeners = &self.listeners;
        let drain = async {
            listeners.wait().await;
            let _ = (&mut *scheduler).await;
            let _ = (&mut *egress).await;
        };
        let clean = tokio::time::timeout(deadline, drain).await.is_ok();
        if !clean {
            abort.cancel();
            tracing::error!(?deadline, "shutdown deadline passed (egress.drain_timeout)");
            // Both count what they hold as undelivered, then return at once.
            if !scheduler.is_finished() {
                let _ = (&mut *scheduler).await;
            }
            if !egress.is_finished() {
                let _ = (&mut *egress).await;
            }
        }
        if let Some(spool) = self.ingress.spool().cloned() {
            // Appends already taken are written and synced; undelivered
            // records stay on disk for the next start.
            let _ = tokio::task::spawn_blocking(move || spool.close()).await;
        }
        let in_memory = self.ingress.metrics().undelivered_by_class();
        let spooled = self
            .ingress
            .spool()
            .map(|s| s.unreleased())
            .unwrap_or_default();
        let mut report = Shutdown::default();
        for (i, &n) in in_memory.iter().enumerate() {
            let class = weir_core::ClassId(i as u8);
            let on_disk = self.ingress.spool().is_some_and(|s| s.spools(class));
            if n > 0 && !on_disk {
                report
                    .lost
                    .push((self.ingress.class_name(class).to_owned(), n));
            }
        }
        for (i, &n) in spooled.iter().enumerate() {
            if n > 0 {
                report.kept.push((
                    self.ingress
                        .class_name(weir_core::ClassId(i as u8))
                        .to_owned(),
                    n,
                ));
            }
        }
        for (class, records) in &report.lost {
            tracing::error!(
                class = %class,
                records,
                "records of a memory class undelivered at shutdown: lost (raise egress.drain_timeout, or use durability = \"spool\")"
            );
        }
        for (class, records) in &report.kept {
            tracing::info!(
                class = %class,
                records,
                "undelivered records kept in the spool for the next start"
            );
        }
        if clean {
            tracing::info!("shut down cleanly");
        }
        report
    }
}

/// What a shutdown left undelivered, per class name.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Shutdown {
    /// Records of `memory` classes still in memory when the drain deadline
    /// passed: lost.
    pub lost: Vec<(String, u64)>,
    /// Records of `spool` classes not yet delivered: on disk, sent after
    /// the next start.
    pub kept: Vec<(String, u64)>,
}

/// Tells the spool which records the egress delivered.
#[derive(Debug)]
struct SpoolRelease(Arc<Spool>);

impl egress::DeliveryObserver for SpoolRelease {
    fn delivered(&self, records: &[weir_core::Receipt]) {
        self.0.release(records);
    }
}

/// Runs weir until SIGINT or SIGTERM, then shuts down cleanly.
/// `source` is the file `cfg` was read from (SIGHUP re-reads it); without
/// one, SIGHUP re-reads only the files the config names.
pub fn run_until_signal(
    cfg: Config,
    source: Option<crate::reload::Source>,
) -> Result<(), AppError> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let workers = cfg.node.workers(cores);
    // Before the runtime, so every thread it starts inherits it.
    crate::priority::apply(&cfg.node.priority)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .worker_threads(workers)
        // Blocking work is file and password-hash work: a few threads at
        // a time, not tokio's 512.
        .max_blocking_threads(BLOCKING_THREADS)
        .thread_name("weir")
        .build()
        .map_err(|source| AppError::Runtime {
            what: "start the async runtime",
            source,
        })?;
    rt.block_on(async {
        tracing::info!(workers, cores, "async runtime");
        let app = App::start(cfg).await?;
        if let Some(source) = source {
            app.reloader().set_source(source).await;
        }
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|source| AppError::Runtime {
                what: "install the SIGTERM handler",
                source,
            })?;
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .map_err(|source| AppError::Runtime {
                what: "install the SIGHUP handler",
                source,
            })?;
        // Every listener is bound, the egress connects (or retries) on its
        // own, and the signals weir handles are caught: ready.
        crate::systemd::ready();
        loop {
            // Cancel safety: every branch only waits for an event.
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {
                    tracing::info!("SIGINT: shutting down");
                    break;
                }
                _ = term.recv() => {
                    tracing::info!("SIGTERM: shutting down");
                    break;
                }
                _ = hup.recv() => {
                    tracing::info!("SIGHUP: reloading");
                    // Logged and counted by the reloader, either way.
                    let _ = app.reload().await;
                }
                _ = app.stopped() => break,
            }
        }
        crate::systemd::stopping();
        // The drain deadline in force (a reload may have changed it).
        let drain = app.reloader().config().await.egress.drain_timeout;
        let left = app.shutdown(drain).await;
        if left.lost.is_empty() {
            Ok(())
        } else {
            Err(AppError::Undelivered { lost: left.lost })
        }
    })
}
