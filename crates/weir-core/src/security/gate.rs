//! Who may connect to the MQTT listener, and as whom: the decision at
//! CONNECT, from the password file ([`crate::security::passwd`]), the ACL file
//! ([`crate::security::acl`]), `allow_anonymous`, and a client certificate's name
//! when a TLS listener uses it as the username. Sans-IO: the caller reads
//! the files, terminates TLS and runs [`Gate::admit`] off the async
//! runtime (a `$7$` check is thousands of HMAC rounds).
//!
//! # The rules
//! - A certificate name, when the listener takes the username from it
//!   (`use_identity_as_username`), is the username; the password file is
//!   not consulted, as in Mosquitto.
//! - Otherwise, with a password file, a client that gives a username must
//!   give that user's password; a client without one is anonymous.
//! - Without a password file, a username a client gives is not verified,
//!   so weir treats the client as anonymous for the ACL (Mosquitto would
//!   apply that user's ACL section to whoever claims the name).
//! - An anonymous client connects only if `allow_anonymous`.
//! - An identifier that an ACL pattern would substitute must not contain
//!   `+`, `#` or `/` ([`AclFile::identity_problem`]).
//!
//! # gRPC ingress ([`StreamGate`])
//! A gRPC client is named by a bearer token (`authorization: Bearer <token>`,
//! looked up in a [`TokenFile`] of SHA-256 digests) or else by its verified
//! client certificate's CN. A token that is not in the file is refused even
//! if a certificate would do: a client that sends one means it. Without
//! either the client is anonymous. An allow list, when configured, names
//! the streams each identity may publish to (anonymous clients under the
//! name `""`); a stream pattern is a name, or a prefix ending in `*`.

use std::collections::HashMap;

use sha2::{Digest, Sha256};

use crate::security::acl::{AclFile, ClientAcl};
use crate::security::passwd::{read_lines, LineProblem, PasswordFile, Verdict};

/// What a connecting client presents.
#[derive(Debug, Clone, Copy, Default)]
pub struct Credentials<'a> {
    /// The CONNECT username; `None` when absent or empty.
    pub username: Option<&'a str>,
    /// The CONNECT password.
    pub password: Option<&'a [u8]>,
    /// The client id.
    pub client_id: &'a str,
    /// The verified client certificate's name, when this listener takes
    /// the username from it.
    pub certificate_name: Option<&'a str>,
}

/// Why a client may not connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// No username (or certificate name), and anonymous clients are not
    /// allowed.
    Anonymous,
    /// The username is not in the password file.
    UnknownUser(String),
    /// The password does not match (or is missing).
    WrongPassword(String),
    /// The listener takes the username from the certificate, which has
    /// no name to take.
    NoCertificateName,
    /// An identifier would widen an ACL pattern.
    Identifier(String),
    /// A bearer token that is not in the token file.
    UnknownToken,
}

impl Refused {
    /// A short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Refused::Anonymous => "anonymous",
            Refused::UnknownUser(_) => "unknown_user",
            Refused::WrongPassword(_) => "bad_password",
            Refused::NoCertificateName => "no_certificate_name",
            Refused::Identifier(_) => "bad_identifier",
            Refused::UnknownToken => "unknown_token",
        }
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Anonymous => write!(
                f,
                "no username, and anonymous clients are not allowed (allow_anonymous = false)"
            ),
            Refused::UnknownUser(u) => write!(f, "user {u:?} is not in the password file"),
            Refused::WrongPassword(u) => write!(f, "wrong or missing password for user {u:?}"),
            Refused::NoCertificateName => write!(
                f,
                "the client certificate has no subject CN to use as the username"
            ),
            Refused::Identifier(why) => f.write_str(why),
            Refused::UnknownToken => write!(f, "the bearer token is not in the token file"),
        }
    }
}

/// A client let in: its username (if any) and, with an ACL file, what it
/// may publish to.
#[derive(Debug, Clone)]
pub struct Admitted {
    /// The verified username; `None` for an anonymous client.
    pub username: Option<String>,
    /// `None`: no ACL file, every topic is allowed.
    pub acl: Option<ClientAcl>,
}

impl Admitted {
    /// Whether this client may publish to `topic`.
    pub fn may_publish(&self, topic: &str) -> bool {
        self.acl.as_ref().is_none_or(|acl| acl.may_publish(topic))
    }
}

/// The CONNECT decision for one listener's users.
#[derive(Debug, Clone, Default)]
pub struct Gate {
    /// The password file, if configured.
    pub passwords: Option<PasswordFile>,
    /// The ACL file, if configured.
    pub acl: Option<AclFile>,
    /// Whether clients without a username may connect.
    pub allow_anonymous: bool,
}

impl Gate {
    /// Anyone may connect and publish anywhere.
    pub fn open() -> Gate {
        Gate {
            passwords: None,
            acl: None,
            allow_anonymous: true,
        }
    }

    /// Whether checking `c` may take long (a password hash to compute).
    pub fn costly(&self, c: &Credentials<'_>) -> bool {
        self.passwords.is_some() && c.certificate_name.is_none() && c.username.is_some()
    }

    /// Lets `c` in, or says why not.
    pub fn admit(&self, c: &Credentials<'_>) -> Result<Admitted, Refused> {
        let username = match (c.certificate_name, &self.passwords, c.username) {
            (Some(""), _, _) => return Err(Refused::NoCertificateName),
            (Some(name), _, _) => Some(name),
            (None, Some(passwords), Some(user)) => {
                match passwords.check(user, c.password.unwrap_or_default()) {
                    Verdict::Allowed => Some(user),
                    Verdict::UnknownUser => return Err(Refused::UnknownUser(user.to_owned())),
                    Verdict::WrongPassword => return Err(Refused::WrongPassword(user.to_owned())),
                }
            }
            // No username, or one nothing can verify: anonymous.
            (None, _, _) => None,
        };
        if username.is_none() && !self.allow_anonymous {
            return Err(Refused::Anonymous);
        }
        let acl = match &self.acl {
            None => None,
            Some(acl) => {
                if let Some(why) = acl.identity_problem(username, c.client_id) {
                    return Err(Refused::Identifier(why));
                }
                Some(acl.for_client(username, c.client_id))
            }
        };
        Ok(Admitted {
            username: username.map(str::to_owned),
            acl,
        })
    }
}

/// Bearer tokens for the gRPC ingress: lines `<name> <SHA-256 of the
/// token, 64 hex digits>` (`printf %s "$token" | sha256sum`). Only digests
/// are stored: a leaked file grants nothing, and tokens are long random
/// strings, so no slow hash is needed.
#[derive(Debug, Clone, Default)]
pub struct TokenFile {
    by_digest: HashMap<[u8; 32], String>,
}

impl TokenFile {
    /// Reads a token file's text: the tokens, and every line that could
    /// not be read.
    pub fn parse(text: &str) -> (TokenFile, Vec<LineProblem>) {
        let mut file = TokenFile::default();
        let problems = read_lines(text, |line| {
            let mut words = line.split_whitespace();
            let (Some(name), Some(digest), None) = (words.next(), words.next(), words.next())
            else {
                return Err("expected `<name> <sha256 hex of the token>`".into());
            };
            let digest = hex32(digest).ok_or_else(|| {
                format!(
                    "{name}: the digest must be 64 hex digits (printf %s \"$token\" | sha256sum)"
                )
            })?;
            if file.by_digest.values().any(|n| n == name) {
                return Err(format!("{name} appears twice"));
            }
            if file.by_digest.insert(digest, name.to_owned()).is_some() {
                return Err(format!("{name}: the same token as an earlier line"));
            }
            Ok(())
        });
        (file, problems)
    }

    /// The name of `token`, if the file has it.
    pub fn name(&self, token: &str) -> Option<&str> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        self.by_digest.get(&digest).map(String::as_str)
    }

    /// Tokens in the file.
    pub fn len(&self) -> usize {
        self.by_digest.len()
    }

    /// Whether the file has no tokens.
    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }
}

fn hex32(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// A stream pattern of an allow list: a name, or a prefix ending in `*`.
pub fn stream_matches(pattern: &str, stream: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => stream.starts_with(prefix),
        None => pattern == stream,
    }
}

/// Why a stream pattern is not one: a `*` anywhere but at the end.
pub fn stream_pattern_problem(pattern: &str) -> Option<String> {
    let body = pattern.strip_suffix('*').unwrap_or(pattern);
    body.contains('*')
        .then(|| format!("{pattern:?}: `*` may only end a pattern (a prefix), e.g. \"line1/*\""))
}

/// Who may call the gRPC ingress, and which streams each may publish to.
#[derive(Debug, Clone, Default)]
pub struct StreamGate {
    /// Bearer tokens, if configured.
    pub tokens: Option<TokenFile>,
    /// Identity to stream patterns; `None`: any admitted client, any
    /// stream.
    pub allow: Option<HashMap<String, Vec<String>>>,
    /// Whether clients with neither token nor certificate may call.
    pub allow_anonymous: bool,
}

impl StreamGate {
    /// Anyone may publish to any stream.
    pub fn open() -> StreamGate {
        StreamGate {
            tokens: None,
            allow: None,
            allow_anonymous: true,
        }
    }

    /// The caller's identity (`None`: anonymous), or why it is refused.
    /// `bearer`: the token of an `authorization: Bearer` header;
    /// `certificate_name`: the verified client certificate's CN.
    pub fn admit(
        &self,
        certificate_name: Option<&str>,
        bearer: Option<&str>,
    ) -> Result<Option<String>, Refused> {
        if let Some(token) = bearer {
            return match self.tokens.as_ref().and_then(|t| t.name(token)) {
                Some(name) => Ok(Some(name.to_owned())),
                None => Err(Refused::UnknownToken),
            };
        }
        match certificate_name {
            Some("") => Err(Refused::NoCertificateName),
            Some(name) => Ok(Some(name.to_owned())),
            None if self.allow_anonymous => Ok(None),
            None => Err(Refused::Anonymous),
        }
    }

    /// Whether `identity` may publish to `stream`.
    pub fn may_publish(&self, identity: Option<&str>, stream: &str) -> bool {
        let Some(allow) = &self.allow else {
            return true;
        };
        allow
            .get(identity.unwrap_or_default())
            .is_some_and(|patterns| patterns.iter().any(|p| stream_matches(p, stream)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `bob:hunter2`, as in `passwd`'s tests.
    const PASSWD: &str = "bob:$6$f/qgqtM2PGgcbUq8$mWepdNA9aeYeir0FRrU3p76YuSrr8AaWxGFRolFUICYbq0REq8/Fvb1fOdeHTCUpMjZHjaAZcdc1TOP0cd89BQ==\n";
    const ACL: &str = "topic write anon/#\nuser bob\ntopic write bob/#\nuser dev-7\ntopic write dev7/#\npattern write c/%c/#\n";

    fn gate(allow_anonymous: bool) -> Gate {
        Gate {
            passwords: Some(PasswordFile::parse(PASSWD).0),
            acl: Some(AclFile::parse(ACL).0),
            allow_anonymous,
        }
    }

    fn creds<'a>(user: Option<&'a str>, pw: Option<&'a [u8]>) -> Credentials<'a> {
        Credentials {
            username: user,
            password: pw,
            client_id: "c1",
            certificate_name: None,
        }
    }

    #[test]
    fn passwords_decide_and_the_acl_follows_the_user() {
        let g = gate(false);
        let bob = g.admit(&creds(Some("bob"), Some(b"hunter2"))).unwrap();
        assert_eq!(bob.username.as_deref(), Some("bob"));
        assert!(bob.may_publish("bob/x") && bob.may_publish("c/c1/x"));
        assert!(!bob.may_publish("anon/x"));
        assert_eq!(
            g.admit(&creds(Some("bob"), Some(b"nope"))).unwrap_err(),
            Refused::WrongPassword("bob".into())
        );
        assert_eq!(
            g.admit(&creds(Some("bob"), None)).unwrap_err().reason(),
            "bad_password"
        );
        assert_eq!(
            g.admit(&creds(Some("eve"), Some(b"hunter2"))).unwrap_err(),
            Refused::UnknownUser("eve".into())
        );
        assert_eq!(g.admit(&creds(None, None)).unwrap_err(), Refused::Anonymous);
        let anon = gate(true).admit(&creds(None, None)).unwrap();
        assert!(anon.may_publish("anon/x") && !anon.may_publish("bob/x"));
    }

    #[test]
    fn a_certificate_name_is_the_username() {
        let g = gate(false);
        let c = Credentials {
            username: Some("bob"),
            password: Some(b"wrong"),
            client_id: "c1",
            certificate_name: Some("dev-7"),
        };
        let dev = g.admit(&c).unwrap();
        assert_eq!(dev.username.as_deref(), Some("dev-7"));
        assert!(dev.may_publish("dev7/t") && !dev.may_publish("bob/t"));
        let nameless = Credentials {
            certificate_name: Some(""),
            ..c
        };
        assert_eq!(g.admit(&nameless).unwrap_err(), Refused::NoCertificateName);
    }

    #[test]
    fn unverified_usernames_are_anonymous_and_identifiers_are_checked() {
        let g = Gate {
            passwords: None,
            acl: Some(AclFile::parse(ACL).0),
            allow_anonymous: true,
        };
        let claimed = g.admit(&creds(Some("bob"), None)).unwrap();
        assert_eq!(claimed.username, None);
        assert!(
            !claimed.may_publish("bob/x"),
            "bob's rules need bob's password"
        );
        assert!(claimed.may_publish("anon/x"));
        let hostile = Credentials {
            client_id: "#",
            ..creds(None, None)
        };
        assert_eq!(g.admit(&hostile).unwrap_err().reason(), "bad_identifier");
        let open = Gate::open().admit(&hostile).unwrap();
        assert!(open.may_publish("anything/at/all"));
    }

    #[test]
    fn grpc_tokens_and_certificates_name_the_caller_and_the_allow_list_binds_them() {
        // sha256("tok-gw1") and sha256("tok-gw2").
        let d1 = "1e5f3ed05b52f02d4b0c8bb7b24e5f37d2f9aeb5b7cc5e1e1f1b9b01f4a0a4c1";
        let text = format!(
            "# gateways\ngw1 {}\ngw2 {}\nbad zz\n",
            hex(&Sha256::digest(b"tok-gw1")),
            hex(&Sha256::digest(b"tok-gw2"))
        );
        let (tokens, problems) = TokenFile::parse(&format!("{text}gw1 {d1}\n"));
        assert_eq!(
            problems.iter().map(|p| p.line).collect::<Vec<_>>(),
            vec![4, 5]
        );
        assert_eq!(tokens.len(), 2);
        let gate = StreamGate {
            tokens: Some(tokens),
            allow: Some(HashMap::from([
                (
                    "gw1".to_owned(),
                    vec!["line1/*".to_owned(), "alarms".to_owned()],
                ),
                ("dev-9".to_owned(), vec!["*".to_owned()]),
                ("".to_owned(), vec!["public".to_owned()]),
            ])),
            allow_anonymous: false,
        };
        let gw1 = gate.admit(None, Some("tok-gw1")).unwrap();
        assert_eq!(gw1.as_deref(), Some("gw1"));
        assert!(gate.may_publish(gw1.as_deref(), "line1/temp"));
        assert!(gate.may_publish(gw1.as_deref(), "alarms"));
        assert!(!gate.may_publish(gw1.as_deref(), "alarms2"));
        assert!(!gate.may_publish(gw1.as_deref(), "line2/temp"));
        let gw2 = gate.admit(Some("dev-9"), Some("tok-gw2")).unwrap();
        assert_eq!(
            gw2.as_deref(),
            Some("gw2"),
            "a token wins over the certificate"
        );
        assert!(
            !gate.may_publish(gw2.as_deref(), "line1/x"),
            "gw2 is not listed"
        );
        assert_eq!(
            gate.admit(Some("dev-9"), Some("nope")),
            Err(Refused::UnknownToken)
        );
        let dev = gate.admit(Some("dev-9"), None).unwrap();
        assert!(gate.may_publish(dev.as_deref(), "anything"));
        assert_eq!(gate.admit(None, None), Err(Refused::Anonymous));
        let open = StreamGate {
            allow_anonymous: true,
            ..gate.clone()
        };
        assert_eq!(open.admit(None, None), Ok(None));
        assert!(open.may_publish(None, "public") && !open.may_publish(None, "alarms"));
        assert!(StreamGate::open().may_publish(None, "x"));
        assert_eq!(
            stream_pattern_problem("a*b"),
            Some("\"a*b\": `*` may only end a pattern (a prefix), e.g. \"line1/*\"".into())
        );
        assert_eq!(stream_pattern_problem("a/*"), None);
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}
