//! Counts requests tonic refuses before weir's handler runs.
//!
//! On a unary call tonic decodes the request itself; a message that does not
//! decode (`INTERNAL`), is over the size limit (`OUT_OF_RANGE`) or uses a
//! compression weir does not accept (`UNIMPLEMENTED`) is answered without
//! ever reaching [`super::service`], so only the response shows it: a
//! trailers-only response whose headers carry `grpc-status`. weir's own
//! handler never answers with these three codes, so counting them here
//! counts exactly tonic's refusals. Streams report decode errors to the
//! handler, which counts them itself.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codegen::http::{Request, Response};
use tonic::codegen::{BoxFuture, Service};
use tonic::server::NamedService;
use tonic::transport::server::TcpConnectInfo;
use tonic::Code;
use tracing::warn;

use crate::metrics::Metrics;

/// Wraps a tonic service and counts its refusals in `protocol_errors`.
#[derive(Debug, Clone)]
pub(crate) struct CountRefusals<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S> CountRefusals<S> {
    /// Counts `inner`'s refusals in `metrics`.
    pub(crate) fn new(inner: S, metrics: Arc<Metrics>) -> Self {
        CountRefusals { inner, metrics }
    }
}

impl<S: NamedService> NamedService for CountRefusals<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<Request<Body>> for CountRefusals<S>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Response<Body>, Infallible>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let peer = req
            .extensions()
            .get::<TcpConnectInfo>()
            .and_then(TcpConnectInfo::remote_addr)
            .or_else(|| {
                req.extensions()
                    .get::<tonic::transport::server::TlsConnectInfo<TcpConnectInfo>>()
                    .and_then(|i| i.get_ref().remote_addr())
            });
        // A cheap reference-counted clone, kept only to name the method in logs.
        let uri = req.uri().clone();
        let metrics = self.metrics.clone();
        let response = self.inner.call(req);
        Box::pin(async move {
            let response = response.await?;
            // tonic's own reading of the trailers-only status: the code,
            // and the message percent-decoded (as the client will see it).
            let status = tonic::Status::from_header_map(response.headers());
            if let Some(status) = status.filter(|s| {
                matches!(
                    s.code(),
                    Code::Internal | Code::OutOfRange | Code::Unimplemented
                )
            }) {
                metrics.protocol_errors.inc();
                warn!(
                    peer = ?peer,
                    method = uri.path(),
                    code = ?status.code(),
                    message = status.message(),
                    "gRPC request refused"
                );
            }
            Ok(response)
        })
    }
}
