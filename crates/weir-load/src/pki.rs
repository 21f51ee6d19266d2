//! The PKI of a TLS run: a CA and a P-256 server certificate for
//! 127.0.0.1, made with `openssl` as in docs/security.md, the client
//! configuration that trusts it, and the weir settings that serve it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use anyhow::{ensure, Context};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

/// The files of the run's PKI.
#[derive(Debug, Clone)]
pub struct Pki {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .context("running openssl (install it: apt-get install openssl)")?;
    ensure!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

impl Pki {
    /// A CA and a P-256 server certificate for 127.0.0.1 in `dir`.
    pub fn create(dir: &Path) -> anyhow::Result<Pki> {
        std::fs::create_dir_all(dir)?;
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut ca = vec!["req", "-x509"];
        ca.extend(ec);
        ca.extend([
            "-days",
            "2",
            "-subj",
            "/CN=weir-load CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ]);
        openssl(dir, &ca)?;
        let mut csr = vec!["req"];
        csr.extend(ec);
        csr.extend([
            "-subj",
            "/CN=localhost",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ]);
        openssl(dir, &csr)?;
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        )?;
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-days",
                "2",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-extfile",
                "server.ext",
                "-out",
                "server.pem",
            ],
        )?;
        Ok(Pki {
            ca: dir.join("ca.pem"),
            cert: dir.join("server.pem"),
            key: dir.join("server.key"),
        })
    }

    /// A client configuration trusting the run's CA only.
    pub fn client_config(&self) -> anyhow::Result<Arc<rustls::ClientConfig>> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(&self.ca)? {
            roots.add(cert?)?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Arc::new(config))
    }

    /// `--set` entries giving weir an MQTT-over-TLS listener on `port`.
    pub fn weir_settings(&self, port: u16) -> Vec<String> {
        vec![
            format!("ingress.mqtt.tls.listen=\"127.0.0.1:{port}\""),
            format!("ingress.mqtt.tls.certfile=\"{}\"", self.cert.display()),
            format!("ingress.mqtt.tls.keyfile=\"{}\"", self.key.display()),
        ]
    }
}
