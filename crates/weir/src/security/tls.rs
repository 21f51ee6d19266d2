//! rustls server configurations from PEM files: the server's chain and
//! key, and optionally the CA that client certificates must chain to.
//! One crypto provider (ring) for the whole binary. PEM is read with
//! `rustls-pki-types` (`rustls-pemfile` is archived).

use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::{Problem, TlsFiles};

/// The crypto provider every TLS endpoint of weir uses.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn problem(path: String, message: String) -> Vec<Problem> {
    vec![Problem { path, message }]
}

/// The certificates in a PEM file, at least one.
pub fn certificates(
    key: &str,
    file: &std::path::Path,
) -> Result<Vec<CertificateDer<'static>>, Vec<Problem>> {
    let certs = CertificateDer::pem_file_iter(file)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| {
            problem(
                key.to_owned(),
                format!("{}: cannot read PEM certificates: {e}", file.display()),
            )
        })?;
    if certs.is_empty() {
        return Err(problem(
            key.to_owned(),
            format!("{}: no PEM certificate in it", file.display()),
        ));
    }
    Ok(certs)
}

/// The keys of a sink's TLS files, in the order `ca_file`, `cert_file`,
/// `key_file` (`["egress.kafka.ca_file", ...]`).
pub type SinkKeys = [&'static str; 3];

/// The TLS client configuration a sink connects to its broker with (the
/// Kafka and MQTT sinks): the broker checked against `files.ca_file` or
/// the system's CAs, the client certificate presented when given. An
/// error names the key of `keys` to change, with what is wrong.
pub fn sink_client_config(
    keys: SinkKeys,
    files: &crate::config::ClientFiles,
) -> Result<rustls::ClientConfig, (&'static str, String)> {
    let [ca_key, cert_key, key_key] = keys;
    let roots = service_roots(ca_key, files.ca_file.as_deref()).map_err(|m| (ca_key, m))?;
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| (ca_key, e.to_string()))?
        .with_root_certificates(roots);
    let Some((cert, key)) = &files.client_cert else {
        return Ok(builder.with_no_client_auth());
    };
    let chain = certificates(cert_key, cert).map_err(|p| {
        let message = p.into_iter().map(|p| p.message).collect::<Vec<_>>();
        (cert_key, message.join("; "))
    })?;
    let key_der = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| (key_key, format!("{}: {e}", key.display())))?;
    builder.with_client_auth_cert(chain, key_der).map_err(|e| {
        (
            key_key,
            format!("{} does not go with {}: {e}", key.display(), cert.display()),
        )
    })
}

/// The CAs a cloud service's certificate is checked against (the Kafka
/// and MQTT sinks): the certificates in `ca_file`, or without one the
/// system's. `key` names the setting in errors.
pub fn service_roots(
    key: &str,
    ca_file: Option<&std::path::Path>,
) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let certs = certificates(key, path).map_err(|problems| {
                problems
                    .into_iter()
                    .map(|p| p.message)
                    .collect::<Vec<_>>()
                    .join("; ")
            })?;
            for cert in certs {
                roots
                    .add(cert)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                return Err(format!(
                    "no CA certificates found on this system; set {key}"
                ));
            }
        }
    }
    Ok(roots)
}

/// The certificate chain, private key and (with a `cafile`) trusted roots
/// that `files` name, or every problem with them under `section`'s keys.
#[allow(clippy::type_complexity)]
fn read_files(
    section: &str,
    files: &TlsFiles,
) -> Result<
    (
        Vec<CertificateDer<'static>>,
        PrivateKeyDer<'static>,
        Option<RootCertStore>,
    ),
    Vec<Problem>,
> {
    let mut problems = Vec::new();
    let chain = certificates(&format!("{section}.certfile"), &files.certfile)
        .map_err(|p| problems.extend(p))
        .ok();
    let key = PrivateKeyDer::from_pem_file(&files.keyfile)
        .map_err(|e| {
            problems.push(Problem {
                path: format!("{section}.keyfile"),
                message: format!(
                    "{}: cannot read a PEM private key (PKCS#8, PKCS#1 or SEC1): {e}",
                    files.keyfile.display()
                ),
            })
        })
        .ok();
    let roots = match &files.cafile {
        None => None,
        Some(ca) => match certificates(&format!("{section}.cafile"), ca) {
            Ok(certs) => {
                let mut roots = RootCertStore::empty();
                for cert in certs {
                    if let Err(e) = roots.add(cert) {
                        problems.push(Problem {
                            path: format!("{section}.cafile"),
                            message: format!("{}: not a usable CA certificate: {e}", ca.display()),
                        });
                    }
                }
                Some(roots)
            }
            Err(p) => {
                problems.extend(p);
                None
            }
        },
    };
    match (chain, key) {
        (Some(chain), Some(key)) if problems.is_empty() => Ok((chain, key, roots)),
        _ => Err(problems),
    }
}

/// The key does not belong to the certificate (or rustls refused the pair).
fn mismatch(section: &str, files: &TlsFiles, e: rustls::Error) -> Vec<Problem> {
    problem(
        format!("{section}.keyfile"),
        format!(
            "{} does not go with {}: {e}",
            files.keyfile.display(),
            files.certfile.display()
        ),
    )
}

/// A server configuration from `files`; `section` (e.g.
/// `ingress.mqtt.tls`) names the keys in problems. `alpn`: protocols to
/// offer (`h2` for gRPC).
pub fn server_config(
    section: &str,
    files: &TlsFiles,
    alpn: &[&[u8]],
) -> Result<ServerConfig, Vec<Problem>> {
    let (chain, key, roots) = read_files(section, files)?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| problem(section.to_owned(), e.to_string()))?;
    let builder = match roots {
        None => builder.with_no_client_auth(),
        Some(roots) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider());
            let verifier = if files.require_certificate {
                verifier
            } else {
                verifier.allow_unauthenticated()
            };
            let verifier = verifier.build().map_err(|e| {
                problem(
                    format!("{section}.cafile"),
                    format!("{}: {e}", files.cafile.as_ref().expect("roots").display()),
                )
            })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| mismatch(section, files, e))?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// The subject CN of a verified client certificate; `Some("")` when the
/// certificate has none (so the caller can refuse it by name).
pub fn common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let cn = parsed
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default();
    Some(cn.to_owned())
}

/// How long a TLS client may take to finish its handshake (the MQTT
/// listener's CONNECT deadline, for the same reasons: slow links, and no
/// idle sockets piling up).
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Connections waiting for the server (tonic) to take them.
const ACCEPTED_QUEUE: usize = 64;

/// Accepts TCP connections on `listener` and completes their TLS
/// handshakes, each in its own task (a slow client delays nobody), with
/// the configuration in force when it arrived; yields the established
/// streams (for tonic's `serve_with_incoming`) until `shutdown`. Failed
/// handshakes are logged and counted under `label`.
pub fn incoming(
    listener: tokio::net::TcpListener,
    config: Arc<super::watch::Watched<ServerConfig>>,
    label: &'static str,
    metrics: Arc<crate::metrics::Metrics>,
    shutdown: tokio_util::sync::CancellationToken,
) -> tokio_stream::wrappers::ReceiverStream<
    std::io::Result<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>,
> {
    let (tx, rx) = tokio::sync::mpsc::channel(ACCEPTED_QUEUE);
    tokio::spawn(async move {
        loop {
            // Cancel safety: `accept` is cancel safe; `cancelled` only waits.
            let (tcp, peer) = tokio::select! {
                _ = shutdown.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(error) => {
                        tracing::warn!(%error, listener = label, "accepting a connection failed; retrying");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = tokio_rustls::TlsAcceptor::from(config.get());
            let (tx, metrics, shutdown) = (tx.clone(), metrics.clone(), shutdown.clone());
            tokio::spawn(async move {
                // Cancel safety: a handshake cut off drops a connection
                // that has carried nothing yet.
                let outcome = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    h = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)) => h,
                };
                match outcome {
                    Ok(Ok(stream)) => {
                        metrics.security.handshake(label, true);
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(error)) => {
                        metrics.security.handshake(label, false);
                        if crate::telemetry::first_in_a_while(&format!("tls {label} {}", peer.ip()))
                        {
                            tracing::info!(%peer, %error, listener = label, "TLS handshake failed; connection closed (repeats from this address are counted, logged once a minute)");
                        }
                    }
                    Err(_) => {
                        metrics.security.handshake(label, false);
                        if crate::telemetry::first_in_a_while(&format!("tls {label} {}", peer.ip()))
                        {
                            tracing::info!(%peer, listener = label, "no TLS handshake in time; connection closed");
                        }
                    }
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// The DNS name a node's certificate carries (as a subjectAltName) to
/// prove its node id: `<id>.node.weir`.
pub fn node_name(id: u64) -> String {
    format!("{id}.node.weir")
}

/// The node id a certificate proves: its one DNS subjectAltName of the
/// form `<id>.node.weir`. `None` when it has none, or several.
pub fn node_id(cert: &CertificateDer<'_>) -> Option<u64> {
    use x509_parser::extensions::GeneralName;
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let san = parsed.subject_alternative_name().ok()??;
    let mut ids = san
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::DNSName(dns) => dns.strip_suffix(".node.weir")?.parse::<u64>().ok(),
            _ => None,
        });
    let id = ids.next()?;
    ids.next().is_none().then_some(id)
}

/// A client configuration that trusts only `files.cafile` and presents
/// `files.certfile` (mutual TLS between nodes), offering HTTP/2.
pub fn client_config(
    section: &str,
    files: &TlsFiles,
) -> Result<rustls::ClientConfig, Vec<Problem>> {
    let (chain, key, roots) = read_files(section, files)?;
    let roots = roots.unwrap_or_else(RootCertStore::empty);
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| problem(section.to_owned(), e.to_string()))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| mismatch(section, files, e))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}
