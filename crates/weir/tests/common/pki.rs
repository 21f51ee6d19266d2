//! A test PKI made with the `openssl` command an operator would use
//! (docs/security.md shows the same commands): CAs, server certificates
//! for 127.0.0.1, client certificates with a CN.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `openssl` with `args` in `dir`; panics with its output if it fails.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run openssl ({e}); install openssl"));
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A certificate and its key, PEM files.
#[derive(Debug, Clone)]
pub struct Pair {
    /// The certificate.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
}

/// A certificate authority in `dir`, named `name` (its files are
/// `<name>.pem` and `<name>.key`).
#[derive(Debug, Clone)]
pub struct Ca {
    dir: PathBuf,
    name: String,
    /// The CA's certificate and key.
    pub pair: Pair,
}

impl Ca {
    /// A new self-signed CA (P-256).
    pub fn new(dir: &Path, name: &str) -> Ca {
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-days",
                "30",
                "-subj",
                &format!("/CN={name}"),
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.pem"),
            ],
        );
        Ca {
            dir: dir.to_owned(),
            name: name.to_owned(),
            pair: Pair {
                cert: dir.join(format!("{name}.pem")),
                key: dir.join(format!("{name}.key")),
            },
        }
    }

    /// A certificate for subject CN `cn` with the X.509 extensions `ext`
    /// (`openssl x509 -extfile` syntax), in `<file>.pem` / `<file>.key`.
    pub fn issue(&self, file: &str, cn: &str, ext: &str) -> Pair {
        let d = &self.dir;
        std::fs::write(d.join(format!("{file}.ext")), ext).unwrap();
        openssl(
            d,
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-subj",
                &format!("/CN={cn}"),
                "-keyout",
                &format!("{file}.key"),
                "-out",
                &format!("{file}.csr"),
            ],
        );
        openssl(
            d,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{file}.csr"),
                "-days",
                "30",
                "-CA",
                &format!("{}.pem", self.name),
                "-CAkey",
                &format!("{}.key", self.name),
                "-CAcreateserial",
                "-extfile",
                &format!("{file}.ext"),
                "-out",
                &format!("{file}.pem"),
            ],
        );
        Pair {
            cert: d.join(format!("{file}.pem")),
            key: d.join(format!("{file}.key")),
        }
    }

    /// A server certificate for 127.0.0.1 and localhost.
    pub fn server(&self, file: &str) -> Pair {
        self.issue(
            file,
            "localhost",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        )
    }

    /// A client certificate whose CN is `cn`.
    pub fn client(&self, file: &str, cn: &str) -> Pair {
        self.issue(file, cn, "extendedKeyUsage=clientAuth\n")
    }
}
