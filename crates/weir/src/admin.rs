//! The admin listener: Prometheus metrics at `/metrics`, liveness at
//! `/healthz`, over HTTP or, with `[admin.tls]`, HTTPS.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use futures::StreamExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::security::{tls, Watched};

/// Content type of the Prometheus/OpenMetrics text format.
const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

async fn metrics(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)], m.render())
}

/// Serves until `shutdown` fires.
pub async fn serve(
    listener: TcpListener,
    metrics_registry: Arc<Metrics>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(metrics_registry);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

/// [`serve`] over TLS with the configuration in force when each
/// connection arrives.
pub async fn serve_tls(
    listener: TcpListener,
    config: Arc<Watched<rustls::ServerConfig>>,
    metrics_registry: Arc<Metrics>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let local = listener.local_addr()?;
    let incoming = tls::incoming(
        listener,
        config,
        "admin",
        metrics_registry.clone(),
        shutdown.clone(),
    );
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(metrics_registry);
    axum::serve(TlsListener { incoming, local }, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

/// Established TLS connections, for axum.
struct TlsListener {
    incoming: ReceiverStream<std::io::Result<TlsStream<TcpStream>>>,
    local: SocketAddr,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.incoming.next().await {
                Some(Ok(stream)) => {
                    let peer = stream.get_ref().0.peer_addr().unwrap_or(self.local);
                    return (stream, peer);
                }
                Some(Err(_)) => continue,
                // Shutting down: the graceful shutdown ends the server.
                None => std::future::pending().await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
