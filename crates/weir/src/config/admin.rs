//! `[admin]`: the metrics listener, as written, checked, and its
//! validation. Its default is off; given, it is served over TLS when
//! `[admin.tls]` is (optionally asking for client certificates).

use std::net::SocketAddr;

use serde::Deserialize;

use super::problems::Problems;
use super::tls::{tls, RawTls, TlsFiles};

/// `[admin]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAdmin {
    pub listen: Option<String>,
    pub tls: Option<RawTls>,
}

/// `[admin]`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminConfig {
    /// Where to serve Prometheus metrics; `None` serves none.
    pub listen: Option<SocketAddr>,
    /// HTTPS instead of HTTP.
    pub tls: Option<TlsFiles>,
}

/// `[admin]` checked, or `None` after recording why.
pub(crate) fn admin(p: &mut Problems, raw: RawAdmin) -> Option<AdminConfig> {
    let before = p.len();
    let listen = raw
        .listen
        .as_deref()
        .map(|text| p.socket_addr("admin.listen", text));
    let tls = raw
        .tls
        .and_then(|t| tls(p, "admin.tls", t, &[]).map(|t| t.files));
    if tls.is_some() && listen.is_none() {
        p.push(
            "admin.tls",
            "given without admin.listen; the admin endpoint is off unless admin.listen is set",
        );
    }
    if p.len() != before {
        return None;
    }
    Some(AdminConfig {
        listen: listen.flatten(),
        tls,
    })
}
