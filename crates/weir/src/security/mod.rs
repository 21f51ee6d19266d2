//! The files behind weir's security settings: TLS certificates and keys,
//! the MQTT password and ACL files. They are read at start-up, where
//! anything wrong stops weir like a bad config (`weir check-config` and
//! `weir run` list every problem and exit 2), and again whenever they
//! change (`watch.rs`), so a certificate is rotated or a user added
//! without a restart. The decisions themselves (who is let in, what they
//! may publish) are `weir_core::security::gate` and `weir_core::security::acl`.
//!
//! - `tls.rs`: rustls server configurations from PEM files.
//! - `watch.rs`: values rebuilt when their files change.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::ServerConfig;
use weir_core::security::acl::AclFile;
use weir_core::security::gate::{Gate, StreamGate, TokenFile};
use weir_core::security::passwd::{LineProblem, PasswordFile};

use crate::config::{Config, GrpcAuth, GrpcIngress, MqttAuth, MqttListen, MqttMode, Problem};

pub mod tls;
pub mod watch;

pub use watch::{Refresh, Watched};

/// What a listener needs: who may connect and what they may do (`gate`:
/// the MQTT password and ACL files, or the gRPC token file and allow
/// list), and its TLS configuration, each rebuilt when its files change.
#[derive(Debug)]
pub struct ListenerSecurity<G> {
    /// The decision, from the listener's credential files.
    pub gate: Arc<Watched<G>>,
    /// The TLS listener's server configuration.
    pub tls: Option<Arc<Watched<ServerConfig>>>,
}

// Not derived: a derive would ask `G: Clone`, and only the `Arc`s are cloned.
impl<G> Clone for ListenerSecurity<G> {
    fn clone(&self) -> Self {
        ListenerSecurity {
            gate: Arc::clone(&self.gate),
            tls: self.tls.clone(),
        }
    }
}

/// The MQTT listeners' (plain and TLS): the password and ACL files.
pub type MqttSecurity = ListenerSecurity<Gate>;

/// The gRPC listener's: the token file and the allow list (TLS with ALPN
/// `h2`).
pub type GrpcSecurity = ListenerSecurity<StreamGate>;

impl<G: Send + Sync + 'static> ListenerSecurity<G> {
    /// The gate and the TLS configuration as loaded, or every problem of
    /// either.
    fn assemble(
        gate: Result<Watched<G>, Vec<Problem>>,
        tls: Option<Result<Arc<Watched<ServerConfig>>, Vec<Problem>>>,
    ) -> Result<Self, Vec<Problem>> {
        match (gate, tls.transpose()) {
            (Ok(gate), Ok(tls)) => Ok(ListenerSecurity {
                gate: Arc::new(gate),
                tls,
            }),
            (gate, tls) => Err(gate.err().into_iter().chain(tls.err()).flatten().collect()),
        }
    }

    /// The files to keep watching.
    pub fn watched(&self) -> Vec<Arc<dyn Refresh>> {
        let mut items: Vec<Arc<dyn Refresh>> = vec![self.gate.clone()];
        if let Some(tls) = &self.tls {
            items.push(tls.clone());
        }
        items
    }
}

impl ListenerSecurity<Gate> {
    /// Reads the files `listen` names.
    pub fn load(listen: &MqttListen) -> Result<Self, Vec<Problem>> {
        let auth = listen.auth.clone();
        let mut paths: Vec<PathBuf> = Vec::new();
        paths.extend(auth.password_file.clone());
        paths.extend(auth.acl_file.clone());
        let gate = Watched::new("MQTT password and ACL files", paths, move || gate(&auth));
        let tls = listen
            .tls
            .as_ref()
            .map(|t| server_tls("MQTT TLS certificate", "ingress.mqtt.tls", &t.files, &[]));
        Self::assemble(gate, tls)
    }

    /// No TLS; anyone may connect and publish anywhere.
    pub fn open() -> Self {
        let gate = Watched::new("open", Vec::new(), || Ok(Gate::open()));
        Self::assemble(gate, None).expect("no files to read")
    }
}

impl ListenerSecurity<StreamGate> {
    /// Reads the files `cfg` names.
    pub fn load(cfg: &GrpcIngress) -> Result<Self, Vec<Problem>> {
        let auth = cfg.auth.clone();
        let paths: Vec<PathBuf> = auth.tokens_file.iter().cloned().collect();
        let gate = Watched::new("gRPC token file", paths, move || stream_gate(&auth));
        let tls = cfg
            .tls
            .as_ref()
            .map(|files| server_tls("gRPC TLS certificate", "ingress.grpc.tls", files, &[b"h2"]));
        Self::assemble(gate, tls)
    }

    /// No TLS; anyone may publish to any stream.
    pub fn open() -> Self {
        Self::load(&GrpcIngress {
            listen: ([127, 0, 0, 1], 0).into(),
            max_message_size: 0,
            tls: None,
            auth: GrpcAuth::open(),
        })
        .unwrap_or_else(|_| unreachable!("no files to read"))
    }
}

/// A TLS server configuration from `files`, rebuilt when they change.
pub fn server_tls(
    what: &str,
    section: &'static str,
    files: &crate::config::TlsFiles,
    alpn: &'static [&'static [u8]],
) -> Result<Arc<Watched<ServerConfig>>, Vec<Problem>> {
    let files = files.clone();
    let mut paths = vec![files.certfile.clone(), files.keyfile.clone()];
    paths.extend(files.cafile.clone());
    Watched::new(what, paths, move || {
        tls::server_config(section, &files, alpn)
    })
    .map(Arc::new)
}

/// What peering needs for mutual TLS: the server side (peers' client
/// certificates verified against the CA) and the client side (this node's
/// certificate presented, peers' verified), both rebuilt when the files
/// change.
#[derive(Debug, Clone)]
pub struct PeerSecurity {
    /// For the peer service.
    pub server: Arc<Watched<ServerConfig>>,
    /// For connections to peers.
    pub client: Arc<Watched<rustls::ClientConfig>>,
}

impl PeerSecurity {
    /// Reads `[peering.tls]`'s files.
    pub fn load(files: &crate::config::TlsFiles) -> Result<Self, Vec<Problem>> {
        let mut problems = Vec::new();
        let server = server_tls("peering TLS (server)", "peering.tls", files, &[b"h2"])
            .map_err(|p| problems.extend(p))
            .ok();
        let client = {
            let files = files.clone();
            let mut paths = vec![files.certfile.clone(), files.keyfile.clone()];
            paths.extend(files.cafile.clone());
            Watched::new("peering TLS (client)", paths, move || {
                tls::client_config("peering.tls", &files)
            })
            .map(Arc::new)
        };
        match (server, client) {
            (Some(server), Ok(client)) if problems.is_empty() => {
                Ok(PeerSecurity { server, client })
            }
            // Both read the same files: report them once.
            (_, Err(p)) if problems.is_empty() => Err(p),
            _ => Err(problems),
        }
    }

    /// The files to keep watching.
    pub fn watched(&self) -> Vec<Arc<dyn Refresh>> {
        vec![self.server.clone(), self.client.clone()]
    }
}

/// Reads every file `cfg` names, as start-up would; the problems found.
pub fn check(cfg: &Config) -> Vec<Problem> {
    let mut problems = Vec::new();
    if let Some(m) = &cfg.ingress.mqtt {
        if let MqttMode::Listen(listen) = &m.mode {
            if let Err(p) = MqttSecurity::load(listen) {
                problems.extend(p);
            }
        }
    }
    if let Some(g) = &cfg.ingress.grpc {
        if let Err(p) = GrpcSecurity::load(g) {
            problems.extend(p);
        }
    }
    if let Some(files) = &cfg.admin.tls {
        if let Err(p) = server_tls("admin TLS certificate", "admin.tls", files, &[]) {
            problems.extend(p);
        }
    }
    if let Some(files) = cfg.peering.as_ref().and_then(|p| p.tls.as_ref()) {
        if let Err(p) = PeerSecurity::load(files) {
            problems.extend(p);
        }
    }
    problems
}

/// The gRPC gate `auth` describes, its token file read.
fn stream_gate(auth: &GrpcAuth) -> Result<StreamGate, Vec<Problem>> {
    let tokens = match &auth.tokens_file {
        None => None,
        Some(f) => Some(lines("ingress.grpc.tokens_file", f, TokenFile::parse)?),
    };
    Ok(StreamGate {
        tokens,
        allow: auth
            .allow
            .as_ref()
            .map(|a| a.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
        allow_anonymous: auth.allow_anonymous,
    })
}

/// Reads a file of lines that `parse` checks, each bad line a problem
/// under `key`.
fn lines<T>(
    key: &str,
    file: &Path,
    parse: impl Fn(&str) -> (T, Vec<LineProblem>),
) -> Result<T, Vec<Problem>> {
    let text = std::fs::read_to_string(file).map_err(|e| {
        vec![Problem {
            path: key.to_owned(),
            message: format!("{}: {e}", file.display()),
        }]
    })?;
    let (value, bad) = parse(&text);
    if bad.is_empty() {
        return Ok(value);
    }
    Err(bad
        .into_iter()
        .map(|b| Problem {
            path: key.to_owned(),
            message: format!("{}:{}: {}", file.display(), b.line, b.message),
        })
        .collect())
}

/// The gate `auth` describes, its files read.
fn gate(auth: &MqttAuth) -> Result<Gate, Vec<Problem>> {
    let mut problems = Vec::new();
    let passwords = auth.password_file.as_ref().and_then(|f| {
        lines("ingress.mqtt.password_file", f, PasswordFile::parse)
            .map_err(|p| problems.extend(p))
            .ok()
    });
    if let (Some(p), Some(f)) = (&passwords, &auth.password_file) {
        if p.is_empty() {
            problems.push(Problem {
                path: "ingress.mqtt.password_file".into(),
                message: format!(
                    "{}: no users in it (add one with `mosquitto_passwd {} <user>`)",
                    f.display(),
                    f.display()
                ),
            });
        }
    }
    let acl = auth.acl_file.as_ref().and_then(|f| {
        lines("ingress.mqtt.acl_file", f, AclFile::parse)
            .map_err(|p| problems.extend(p))
            .ok()
    });
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(Gate {
        passwords,
        acl,
        allow_anonymous: auth.allow_anonymous,
    })
}
