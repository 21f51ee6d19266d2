//! `[admin]`: the metrics listener, as written, checked, and its
//! validation. Its default is off.

use std::net::SocketAddr;

use serde::Deserialize;

use super::problems::Problems;

/// `[admin]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAdmin {
    pub listen: Option<String>,
}

/// `[admin]`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminConfig {
    /// Where to serve Prometheus metrics; `None` serves none.
    pub listen: Option<SocketAddr>,
}

/// `[admin]` checked, or `None` after recording why.
pub(crate) fn admin(p: &mut Problems, raw: RawAdmin) -> Option<AdminConfig> {
    match raw.listen {
        None => Some(AdminConfig { listen: None }),
        Some(text) => p
            .socket_addr("admin.listen", &text)
            .map(|addr| AdminConfig { listen: Some(addr) }),
    }
}
