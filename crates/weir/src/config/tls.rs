//! TLS tables (`[ingress.mqtt.tls]`, `[ingress.grpc.tls]`, ...) as
//! written and checked, and the rule every listener follows: one that
//! other hosts can reach needs authentication or an explicit
//! `allow_anonymous = true` (as Mosquitto 2.0 decided). The key names are
//! Mosquitto's (`certfile`, `keyfile`, `cafile`, `require_certificate`,
//! `use_identity_as_username`), so an operator's broker config reads the
//! same here. The files are read at start-up by `crate::security`, which
//! reports a file that cannot be used under the key that names it.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use super::problems::Problems;

/// A TLS table as written. Not every section uses every key; the section
/// says which apply.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTls {
    pub listen: Option<String>,
    pub certfile: Option<PathBuf>,
    pub keyfile: Option<PathBuf>,
    pub cafile: Option<PathBuf>,
    pub require_certificate: Option<bool>,
    pub use_identity_as_username: Option<bool>,
}

/// The files a TLS server presents and verifies clients with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain, the server's own certificate first.
    pub certfile: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub keyfile: PathBuf,
    /// PEM certificates of the CAs that client certificates must chain to;
    /// without it clients are not asked for a certificate.
    pub cafile: Option<PathBuf>,
    /// Refuse clients without a certificate that chains to `cafile`.
    pub require_certificate: bool,
}

/// The keys a TLS table holds beside its files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Extra {
    /// Its own `listen` address (MQTT over TLS beside plain TCP).
    Listen,
    /// The client certificate's CN as the MQTT username.
    Identity,
}

/// A TLS table checked: its files, and the extra keys the section allows
/// (`None` when not given or not allowed, after recording why).
pub(crate) struct CheckedTls {
    pub files: TlsFiles,
    pub listen: Option<String>,
    pub use_identity_as_username: bool,
}

/// `path` (e.g. `ingress.mqtt.tls`) checked, allowing the `extra` keys,
/// or `None` after recording why.
pub(crate) fn tls(
    p: &mut Problems,
    path: &str,
    raw: RawTls,
    extra: &[Extra],
) -> Option<CheckedTls> {
    let before = p.len();
    let refuse = |p: &mut Problems, key: &str, given: bool| {
        if given {
            p.push(
                format!("{path}.{key}"),
                "not used in this section; remove it",
            );
        }
    };
    if !extra.contains(&Extra::Listen) {
        refuse(p, "listen", raw.listen.is_some());
    }
    if !extra.contains(&Extra::Identity) {
        refuse(
            p,
            "use_identity_as_username",
            raw.use_identity_as_username.is_some(),
        );
    }
    let mut file = |key: &str, given: Option<PathBuf>| match given {
        Some(f) if f.as_os_str().is_empty() => {
            p.push(format!("{path}.{key}"), "must not be empty");
            None
        }
        Some(f) => Some(f),
        None => {
            p.push(
                format!("{path}.{key}"),
                "missing: TLS needs the server's certificate chain (certfile) and private key (keyfile), both PEM",
            );
            None
        }
    };
    let certfile = file("certfile", raw.certfile);
    let keyfile = file("keyfile", raw.keyfile);
    if raw
        .cafile
        .as_ref()
        .is_some_and(|f| f.as_os_str().is_empty())
    {
        p.push(format!("{path}.cafile"), "must not be empty");
    }
    let require_certificate = raw.require_certificate.unwrap_or(false);
    if require_certificate && raw.cafile.is_none() {
        p.push(
            format!("{path}.require_certificate"),
            format!("needs {path}.cafile, the CA certificates client certificates must chain to"),
        );
    }
    let use_identity_as_username = raw.use_identity_as_username.unwrap_or(false);
    if use_identity_as_username && !require_certificate {
        p.push(
            format!("{path}.use_identity_as_username"),
            format!("needs {path}.require_certificate = true (every client must then present a certificate to take its name from)"),
        );
    }
    if p.len() != before {
        return None;
    }
    Some(CheckedTls {
        files: TlsFiles {
            certfile: certfile?,
            keyfile: keyfile?,
            cafile: raw.cafile,
            require_certificate,
        },
        listen: raw.listen,
        use_identity_as_username,
    })
}

/// A listener other hosts can reach must authenticate its clients, unless
/// the operator says otherwise with `allow_anonymous = true`.
///
/// `authenticates` names how this listener would authenticate, if it
/// does; `anonymous_key` is the key that opens it to anyone; `how` says
/// what to set instead.
pub(crate) fn check_exposed(
    p: &mut Problems,
    listen_key: &str,
    addr: SocketAddr,
    authenticates: bool,
    allow_anonymous: Option<bool>,
    anonymous_key: &str,
    how: &str,
) {
    if addr.ip().is_loopback() || authenticates || allow_anonymous == Some(true) {
        return;
    }
    p.push(
        listen_key,
        format!(
            "{addr} can be reached from other hosts, but no authentication is configured for it; \
             {how}, or set {anonymous_key} = true to accept any client; \
             or listen on 127.0.0.1 (without authentication weir listens on loopback only)"
        ),
    );
}

/// The files a sink presents and checks its broker with (`ca_file`,
/// `cert_file`, `key_file` of `[egress.mqtt]` and `[egress.kafka]`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientFiles {
    /// PEM CA certificates the broker's must chain to; `None`: the
    /// system's.
    pub ca_file: Option<PathBuf>,
    /// The client certificate chain and its key (mutual TLS).
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

impl ClientFiles {
    /// Whether any file is given.
    pub fn any(&self) -> bool {
        self.ca_file.is_some() || self.client_cert.is_some()
    }
}

/// A sink's `ca_file`, `cert_file` and `key_file` under `path`, checked:
/// each a readable file, the certificate and its key given together.
pub(crate) fn client_files(
    p: &mut Problems,
    path: &str,
    ca_file: Option<String>,
    cert_file: Option<String>,
    key_file: Option<String>,
) -> ClientFiles {
    let mut file = |key: &str, given: Option<String>| -> Option<PathBuf> {
        let f = PathBuf::from(given.filter(|f| !f.is_empty())?);
        if !f.is_file() {
            p.push(
                format!("{path}.{key}"),
                format!("{} is not a readable file", f.display()),
            );
        }
        Some(f)
    };
    let ca_file = file("ca_file", ca_file);
    let cert_file = file("cert_file", cert_file);
    let key_file = file("key_file", key_file);
    let client_cert = match (cert_file, key_file) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        (Some(_), None) => {
            p.push(
                format!("{path}.key_file"),
                "missing: cert_file needs its private key (PEM)",
            );
            None
        }
        (None, Some(_)) => {
            p.push(
                format!("{path}.cert_file"),
                "missing: key_file needs its certificate chain (PEM)",
            );
            None
        }
    };
    ClientFiles {
        ca_file,
        client_cert,
    }
}
