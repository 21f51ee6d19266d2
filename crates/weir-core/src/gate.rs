//! Who may connect to the MQTT listener, and as whom: the decision at
//! CONNECT, from the password file ([`crate::passwd`]), the ACL file
//! ([`crate::acl`]), `allow_anonymous`, and a client certificate's name
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

use crate::acl::{AclFile, ClientAcl};
use crate::passwd::{PasswordFile, Verdict};

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
}
