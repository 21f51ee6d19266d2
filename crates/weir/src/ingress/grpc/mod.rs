//! gRPC ingress: the `weir.v1.Ingress` service (unary `Publish`, bidi
//! `PublishStream`) on tonic, next to the standard `grpc.health.v1.Health`
//! service and server reflection (v1 and v1alpha), so that
//! `grpcurl -plaintext host:port list` works against weir.
//!
//! Each record is acknowledged only once it is in its class queue. A full
//! queue is answered with `RESOURCE_EXHAUSTED` at once on the unary call; on a
//! stream weir stops reading (HTTP/2 flow control pushes back to the client)
//! for up to [`STREAM_FULL_WAIT`] before ending the stream with
//! `RESOURCE_EXHAUSTED`. `docs/grpc.md` lists every status code and what a
//! client should do with it.
//!
//! # Layout
//! - this file: [`serve`] (tonic server, health, reflection,
//!   graceful shutdown) and [`GrpcError`].
//! - `service.rs`: the `Ingress` trait implementation and the per-stream task.
//! - `refusals.rs`: a wrapper that counts requests tonic refuses before weir's
//!   code sees them (undecodable or oversized messages) in
//!   `protocol_errors`.

mod refusals;
mod service;

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::server::NamedService;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;
use tonic_health::ServingStatus;
use tracing::{info, warn};
use weir_proto::pb::ingress_server::IngressServer;

use crate::config::GrpcIngress;
use crate::intake::Intake;
use crate::security::{tls, GrpcSecurity};

use refusals::CountRefusals;
use service::IngressService;

pub use service::{ACK_CHANNEL_CAPACITY, STREAM_FULL_WAIT};

/// After shutdown is requested, how long open calls get to finish before
/// [`serve`] returns anyway (a client that neither reads nor closes must not
/// hold weir's shutdown hostage).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// HTTP/2 keepalive ping interval: a device that vanished from a flaky edge
/// link is noticed (and its stream task ended) within about a minute rather
/// than at the next TCP timeout.
pub const HTTP2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);

/// How long a keepalive ping may go unanswered before the connection is
/// closed (tonic's own default, spelled out).
pub const HTTP2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Concurrent calls (streams) one connection may have open: tonic leaves
/// hyper's limit off, and each open `PublishStream` holds a task, an ack
/// buffer and up to one HTTP/2 window of unread data, so one client must not
/// open them without bound. 256 is above any sane device's need.
pub const MAX_CONCURRENT_STREAMS: u32 = 256;

/// The gRPC service name clients and health checks use.
pub const SERVICE_NAME: &str = <IngressServer<IngressService> as NamedService>::NAME;

/// Why the gRPC ingress could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum GrpcError {
    /// The embedded protobuf descriptors did not load into reflection (a
    /// build problem, not a user one).
    #[error("gRPC reflection cannot load weir's embedded descriptors: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The tonic server failed.
    #[error("gRPC ingress server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
}

/// Serves `weir.v1.Ingress`, health and reflection on `listener` until
/// `shutdown` is cancelled, then reports `NOT_SERVING`, stops accepting, and
/// gives open calls up to [`SHUTDOWN_GRACE`] to finish. The caller binds
/// `listener`, so a busy port is reported at startup and tests can use
/// port 0.
pub async fn serve(
    listener: TcpListener,
    cfg: GrpcIngress,
    ingress: Arc<Intake>,
    shutdown: CancellationToken,
) -> Result<(), GrpcError> {
    serve_secured(listener, cfg, GrpcSecurity::open(), ingress, shutdown).await
}

/// [`serve`] with `security`: over TLS when it has a TLS configuration
/// (each connection gets the one in force when it arrives), and callers
/// admitted by its gate.
pub async fn serve_secured(
    listener: TcpListener,
    cfg: GrpcIngress,
    security: GrpcSecurity,
    ingress: Arc<Intake>,
    shutdown: CancellationToken,
) -> Result<(), GrpcError> {
    let local = listener.local_addr().ok();
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(weir_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    // grpcurl and older tools still ask v1alpha first.
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(weir_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;

    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status(SERVICE_NAME, ServingStatus::Serving)
        .await;

    let streams = TaskTracker::new();
    let ingress_server = IngressServer::new(IngressService::new(
        ingress.clone(),
        shutdown.clone(),
        streams.clone(),
        security.gate.clone(),
    ))
    .max_decoding_message_size(cfg.max_message_size);
    let ingress_server = CountRefusals::new(ingress_server, ingress.metrics().clone());

    let signal = {
        let shutdown = shutdown.clone();
        let mut reporter = reporter.clone();
        async move {
            shutdown.cancelled().await;
            for name in [SERVICE_NAME, ""] {
                reporter
                    .set_service_status(name, ServingStatus::NotServing)
                    .await;
            }
            // Dropping the statuses ends every Health.Watch stream (after it
            // has delivered NOT_SERVING), which would otherwise keep its
            // connection, and so the graceful shutdown, open forever.
            for name in [SERVICE_NAME, ""] {
                reporter.clear_service_status(name).await;
            }
        }
    };

    let router = Server::builder()
        .http2_keepalive_interval(Some(HTTP2_KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(HTTP2_KEEPALIVE_TIMEOUT))
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(ingress_server);
    let server: std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>> = match &security.tls
    {
        None => {
            let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
            Box::pin(router.serve_with_incoming_shutdown(incoming, signal))
        }
        Some(config) => {
            let incoming = tls::incoming(
                listener,
                config.clone(),
                "grpc",
                ingress.metrics().clone(),
                shutdown.clone(),
            );
            Box::pin(router.serve_with_incoming_shutdown(incoming, signal))
        }
    };
    info!(addr = ?local, max_message_size = cfg.max_message_size, "gRPC ingress listening");

    tokio::pin!(server);
    let grace = async {
        shutdown.cancelled().await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    // Cancel safety: `server` is pinned outside the select and only dropped
    // when the grace period is over, which is the point of the branch; the
    // connection tasks tonic spawned end with the runtime.
    tokio::select! {
        done = &mut server => done?,
        _ = grace => warn!(
            grace = ?SHUTDOWN_GRACE,
            "gRPC calls still open after the shutdown grace period; closing anyway"
        ),
    }
    streams.close();
    // Stream tasks watch `shutdown`, so this wait is short; bounded anyway.
    if tokio::time::timeout(SHUTDOWN_GRACE, streams.wait())
        .await
        .is_err()
    {
        warn!(
            open = streams.len(),
            "gRPC stream tasks still running at exit"
        );
    }
    info!("gRPC ingress stopped");
    Ok(())
}
