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

/// A server configuration from `files`; `section` (e.g.
/// `ingress.mqtt.tls`) names the keys in problems. `alpn`: protocols to
/// offer (`h2` for gRPC).
pub fn server_config(
    section: &str,
    files: &TlsFiles,
    alpn: &[&[u8]],
) -> Result<ServerConfig, Vec<Problem>> {
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
    let (Some(chain), Some(key)) = (chain, key) else {
        return Err(problems);
    };
    if !problems.is_empty() {
        return Err(problems);
    }
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
    let mut config = builder.with_single_cert(chain, key).map_err(|e| {
        problem(
            format!("{section}.keyfile"),
            format!(
                "{} does not go with {}: {e}",
                files.keyfile.display(),
                files.certfile.display()
            ),
        )
    })?;
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
