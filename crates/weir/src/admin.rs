//! The admin listener: Prometheus metrics at `/metrics`, liveness at
//! `/healthz`, and `POST /reload` (from loopback addresses only) to reload
//! the config file, over HTTP or, with `[admin.tls]`, HTTPS.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::connect_info::Connected;
use axum::extract::{ConnectInfo, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::serve::IncomingStream;
use axum::Router;
use futures::StreamExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::reload::Reloader;
use crate::security::{tls, Watched};

/// One plain-HTTP request to an admin listener, blocking (`weir top`,
/// `weir reload`): the status code and the body. HTTP/1.0, so the body is
/// never chunked and ends with the connection; `timeout` bounds the wait
/// for the answer.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    timeout: std::time::Duration,
) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(2))?;
    s.set_read_timeout(Some(timeout))?;
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Length: 0\r\n\r\n"
    )?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)?;
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other(format!("no HTTP answer from {addr}{path}")))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no HTTP status from {addr}{path}")))?;
    Ok((status, body.to_owned()))
}

/// Content type of the Prometheus/OpenMetrics text format.
const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the admin endpoint serves from.
#[derive(Debug, Clone)]
pub struct AdminState {
    /// The metrics rendered at `/metrics`.
    pub metrics: Arc<Metrics>,
    /// Reloads for `POST /reload`; none answers 404.
    pub reloader: Option<Arc<Reloader>>,
}

async fn metrics(State(s): State<AdminState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)],
        s.metrics.render(),
    )
}

/// `POST /reload`: 200 with the keys applied, 409 with every problem when
/// refused (the running config stays), 403 from other hosts.
async fn reload(
    State(s): State<AdminState>,
    ConnectInfo(Peer(peer)): ConnectInfo<Peer>,
) -> (StatusCode, String) {
    if !peer.ip().is_loopback() {
        return (
            StatusCode::FORBIDDEN,
            "reload is accepted from this host (a loopback address) only\n".to_owned(),
        );
    }
    let Some(r) = s.reloader else {
        return (StatusCode::NOT_FOUND, "no reloads here\n".to_owned());
    };
    match r.reload().await {
        Ok(a) if a.keys.is_empty() => (StatusCode::OK, "reloaded: no change\n".to_owned()),
        Ok(a) => (
            StatusCode::OK,
            format!(
                "reloaded in {:.1} ms: {}\n",
                a.took.as_secs_f64() * 1e3,
                a.keys.join(", ")
            ),
        ),
        Err(e) => (
            StatusCode::CONFLICT,
            format!("reload refused, the running config stays:\n{e}\n"),
        ),
    }
}

/// The address a request came from, over either listener.
#[derive(Debug, Clone, Copy)]
struct Peer(SocketAddr);

impl Connected<IncomingStream<'_, TcpListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, TcpListener>) -> Self {
        Peer(*stream.remote_addr())
    }
}

impl Connected<IncomingStream<'_, TlsListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, TlsListener>) -> Self {
        Peer(*stream.remote_addr())
    }
}

/// The routes, over any listener.
fn router(state: AdminState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/reload", post(reload))
        .with_state(state)
}

/// Serves until `shutdown` fires.
pub async fn serve(
    listener: TcpListener,
    state: AdminState,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = router(state).into_make_service_with_connect_info::<Peer>();
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

/// [`serve`] over TLS with the configuration in force when each
/// connection arrives.
pub async fn serve_tls(
    listener: TcpListener,
    config: Arc<Watched<rustls::ServerConfig>>,
    state: AdminState,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let local = listener.local_addr()?;
    let incoming = tls::incoming(
        listener,
        config,
        "admin",
        state.metrics.clone(),
        shutdown.clone(),
    );
    let app = router(state).into_make_service_with_connect_info::<Peer>();
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
