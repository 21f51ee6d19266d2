//! Prometheus metrics of authentication and authorisation
//! (`weir_mqtt_auth_*`, `weir_tls_*`), registered with the rest of
//! [`super::Metrics`].

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The `reason` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Why.
    pub reason: String,
}

/// The `user` label; anonymous clients are `""`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UserLabel {
    /// The username.
    pub user: String,
}

/// The `listener` label: `mqtt-tls`, `grpc`, `peering`, `admin`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabel {
    /// Which listener.
    pub listener: String,
}

/// Refused connections and publishes.
#[derive(Default)]
pub struct SecurityMetrics {
    refused: Family<ReasonLabel, Counter>,
    denied: Family<UserLabel, Counter>,
    grpc_refused: Family<ReasonLabel, Counter>,
    grpc_denied: Family<UserLabel, Counter>,
    handshakes: Family<ListenerLabel, Counter>,
    failed_handshakes: Family<ListenerLabel, Counter>,
    connections: Gauge,
    connections_refused: Family<ReasonLabel, Counter>,
}

impl std::fmt::Debug for SecurityMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecurityMetrics").finish_non_exhaustive()
    }
}

impl SecurityMetrics {
    /// An MQTT CONNECT refused for `reason` (`bad_password`,
    /// `unknown_user`, `anonymous`, `bad_identifier`, ...).
    pub fn connect_refused(&self, reason: &str) {
        self.refused
            .get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// A PUBLISH the ACL refused, by the client's username.
    pub fn publish_denied(&self, user: Option<&str>) {
        self.denied
            .get_or_create(&UserLabel {
                user: user.unwrap_or_default().to_owned(),
            })
            .inc();
    }

    /// A gRPC call refused by authentication, for `reason`.
    pub fn grpc_refused(&self, reason: &str) {
        self.grpc_refused
            .get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// A gRPC publish the allow list refused, by the caller's identity.
    pub fn grpc_denied(&self, identity: Option<&str>) {
        self.grpc_denied
            .get_or_create(&UserLabel {
                user: identity.unwrap_or_default().to_owned(),
            })
            .inc();
    }

    /// An MQTT connection was let in.
    pub fn connection_opened(&self) {
        self.connections.inc();
    }

    /// An MQTT connection let in has ended.
    pub fn connection_closed(&self) {
        self.connections.dec();
    }

    /// An MQTT connection turned away before CONNECT, for `reason`
    /// (`max_connections`).
    pub fn connection_refused(&self, reason: &str) {
        self.connections_refused
            .get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// A TLS handshake on `listener` finished, or failed.
    pub fn handshake(&self, listener: &str, ok: bool) {
        let family = if ok {
            &self.handshakes
        } else {
            &self.failed_handshakes
        };
        family
            .get_or_create(&ListenerLabel {
                listener: listener.to_owned(),
            })
            .inc();
    }

    /// CONNECTs refused so far for `reason` (tests).
    pub fn connects_refused(&self, reason: &str) -> u64 {
        self.refused
            .get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            })
            .get()
    }

    /// Registers every metric in `registry` (prefix `weir_` comes from it).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "mqtt_connects_refused",
            "MQTT CONNECTs refused by authentication, by reason",
            self.refused.clone(),
        );
        registry.register(
            "mqtt_publishes_denied",
            "MQTT PUBLISHes the ACL refused (never queued), by username (\"\" anonymous)",
            self.denied.clone(),
        );
        registry.register(
            "mqtt_connections",
            "MQTT connections open (plain and TLS)",
            self.connections.clone(),
        );
        registry.register(
            "mqtt_connections_refused",
            "MQTT connections turned away before CONNECT, by reason (max_connections)",
            self.connections_refused.clone(),
        );
        registry.register(
            "grpc_calls_refused",
            "gRPC calls refused by authentication (UNAUTHENTICATED), by reason",
            self.grpc_refused.clone(),
        );
        registry.register(
            "grpc_publishes_denied",
            "gRPC publishes the allow list refused (PERMISSION_DENIED, never queued), by caller (\"\" anonymous)",
            self.grpc_denied.clone(),
        );
        registry.register(
            "tls_handshakes",
            "TLS handshakes completed, by listener",
            self.handshakes.clone(),
        );
        registry.register(
            "tls_handshake_failures",
            "TLS handshakes that failed or timed out (bad or missing client certificate, not TLS), by listener",
            self.failed_handshakes.clone(),
        );
    }
}
