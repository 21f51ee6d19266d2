//! Password files in the format `mosquitto_passwd` writes, so an operator
//! can point weir at the file their Mosquitto already uses.
//!
//! ```text
//! user:$7$<iterations>$<salt, base64>$<hash, base64>   PBKDF2-HMAC-SHA512, 64-byte hash
//! user:$6$<salt, base64>$<hash, base64>                SHA-512(password || salt)
//! ```
//!
//! Base64 is the standard alphabet with padding; salts are 12 bytes
//! (Mosquitto 2.0) or 64 (2.1). Lines starting with `#` and blank lines are
//! skipped. Unlike Mosquitto, which drops a bad line with a log message,
//! every bad line is reported with its number, so the configuration check
//! can refuse the file (an entry silently dropped is a user locked out, or
//! worse, a typo nobody sees). Hashes are compared in constant time.
//!
//! Checking a `$7$` password costs `iterations` HMAC-SHA512 rounds: run it
//! off the async runtime.

use std::collections::HashMap;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use sha2::{Digest, Sha512};
use subtle::ConstantTimeEq;

/// Most PBKDF2 iterations accepted: more is a denial of service waiting
/// for the first login, not a password file.
pub const MAX_ITERATIONS: u32 = 10_000_000;

/// A stored password hash.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Hash {
    /// `$6$`: SHA-512 of the password then the salt.
    Sha512 { salt: Vec<u8>, hash: [u8; 64] },
    /// `$7$`: PBKDF2-HMAC-SHA512.
    Pbkdf2 {
        iterations: u32,
        salt: Vec<u8>,
        hash: [u8; 64],
    },
}

/// A bad line of a password file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineProblem {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong with it.
    pub message: String,
}

/// Reads the lines of a line-oriented file (password, ACL, token files):
/// blank lines and lines starting with `#` are skipped, each other line is
/// given to `read` trimmed, and every error it returns becomes a problem
/// naming its line.
pub fn read_lines(
    text: &str,
    mut read: impl FnMut(&str) -> Result<(), String>,
) -> Vec<LineProblem> {
    let mut problems = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Err(message) = read(line) {
            problems.push(LineProblem {
                line: i + 1,
                message,
            });
        }
    }
    problems
}

/// The users of a password file.
#[derive(Debug, Clone, Default)]
pub struct PasswordFile {
    users: HashMap<String, Hash>,
}

/// The outcome of a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// User known, password right.
    Allowed,
    /// User known, password wrong.
    WrongPassword,
    /// No such user in the file.
    UnknownUser,
}

impl PasswordFile {
    /// Reads a password file's text: the users, and every line that could
    /// not be read (those users are left out).
    pub fn parse(text: &str) -> (PasswordFile, Vec<LineProblem>) {
        let mut users = HashMap::new();
        let problems = read_lines(text, |line| {
            let (user, hash) = line
                .split_once(':')
                .ok_or("expected `user:$7$...` or `user:$6$...`")?;
            let (user, hash) = (user.trim(), hash.trim());
            if user.is_empty() {
                return Err("empty user name".into());
            }
            // Mosquitto ignores anything after a second ':'.
            let hash = hash.split(':').next().unwrap_or_default();
            let h = parse_hash(hash).map_err(|e| format!("user {user:?}: {e}"))?;
            if users.insert(user.to_owned(), h).is_some() {
                return Err(format!("user {user:?} appears twice"));
            }
            Ok(())
        });
        (PasswordFile { users }, problems)
    }

    /// Users in the file.
    pub fn len(&self) -> usize {
        self.users.len()
    }

    /// Whether the file has no users.
    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    /// Whether `user` may log in with `password`.
    pub fn check(&self, user: &str, password: &[u8]) -> Verdict {
        let Some(stored) = self.users.get(user) else {
            return Verdict::UnknownUser;
        };
        let computed: [u8; 64] = match stored {
            Hash::Sha512 { salt, .. } => Sha512::new()
                .chain_update(password)
                .chain_update(salt)
                .finalize()
                .into(),
            Hash::Pbkdf2 {
                iterations, salt, ..
            } => {
                let mut out = [0u8; 64];
                pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, *iterations, &mut out);
                out
            }
        };
        let expected = match stored {
            Hash::Sha512 { hash, .. } | Hash::Pbkdf2 { hash, .. } => hash,
        };
        if bool::from(computed.ct_eq(expected)) {
            Verdict::Allowed
        } else {
            Verdict::WrongPassword
        }
    }
}

fn parse_hash(text: &str) -> Result<Hash, String> {
    let Some(rest) = text.strip_prefix('$') else {
        return Err("the hash must start with $7$ or $6$ (write it with mosquitto_passwd)".into());
    };
    let parts: Vec<&str> = rest.split('$').collect();
    let salt_of = |s: &str| -> Result<Vec<u8>, String> {
        let salt = STANDARD
            .decode(s)
            .map_err(|e| format!("salt is not base64 ({e})"))?;
        if salt.len() != 12 && salt.len() != 64 {
            return Err(format!("salt is {} bytes; expected 12 or 64", salt.len()));
        }
        Ok(salt)
    };
    let hash_of = |s: &str| -> Result<[u8; 64], String> {
        let hash = STANDARD
            .decode(s)
            .map_err(|e| format!("hash is not base64 ({e})"))?;
        hash.try_into()
            .map_err(|h: Vec<u8>| format!("hash is {} bytes; expected 64", h.len()))
    };
    match parts.as_slice() {
        ["6", salt, hash] => Ok(Hash::Sha512 {
            salt: salt_of(salt)?,
            hash: hash_of(hash)?,
        }),
        ["7", iterations, salt, hash] => {
            let iterations: u32 = iterations
                .parse()
                .map_err(|_| format!("iteration count {iterations:?} is not a number"))?;
            if !(1..=MAX_ITERATIONS).contains(&iterations) {
                return Err(format!(
                    "iteration count {iterations} is out of range (1 to {MAX_ITERATIONS})"
                ));
            }
            Ok(Hash::Pbkdf2 {
                iterations,
                salt: salt_of(salt)?,
                hash: hash_of(hash)?,
            })
        }
        [kind, ..] if kind.starts_with("argon2") => Err(
            "argon2id hashes (Mosquitto 2.1's default) are not supported; write the file with `mosquitto_passwd -H sha512-pbkdf2`".into(),
        ),
        ["6" | "7", ..] => Err("wrong number of $-separated fields".into()),
        [kind, ..] => Err(format!("unknown hash type ${kind}$; expected $7$ or $6$")),
        [] => Err("empty hash".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines from Mosquitto's own tests (`$6$`) and written by
    /// `mosquitto_passwd` 2.0.11 (`$7$`, the second with `-I 5`).
    const FILE: &str = "\
# a comment
test:$6$njERlZMi/7DzNB9E$iiavfuXvUm8iyDZArTy7smTxh07GXXOrOsqxfW6gkOYVXHGk+W+i/8d3xDxrMwEPygEBhoA8A/gjQC0N2M4Lkw==
empty:$6$o+53eGXtmlfHeYrg$FY7X9DNQ4uU1j0NiPmGOOSU05ZSzhqNmNhXIof/0nLpVb1zDhcRHdaC72E3YryH7dtTiG/r6jH6C8J+30cZBgA==
bob:$6$f/qgqtM2PGgcbUq8$mWepdNA9aeYeir0FRrU3p76YuSrr8AaWxGFRolFUICYbq0REq8/Fvb1fOdeHTCUpMjZHjaAZcdc1TOP0cd89BQ==

alice:$7$101$wL1TQahtSEUgkMH3$1moNF/c51w+5GDxYW+CPmoffW7GoUzg64SOCelzCmvFG4ZOFS/mDSgWqaixWYoCXaUcqmhsFh76fd8FCKrIupw==\r
carol:$7$5$3oNRR48Ow99rrz3a$PH9DixRDqfzHksuGdY8HyUSTyEClsVXw9iW839k90JtEusZBXbuw24R4iJ425Om2YaV39ztiu6zu/tk6HmN6vA==
";

    #[test]
    fn mosquitto_passwd_lines_verify() {
        let (f, problems) = PasswordFile::parse(FILE);
        assert_eq!(problems, vec![]);
        assert_eq!(f.len(), 5);
        for (user, pw) in [
            ("test", "test"),
            ("empty", ""),
            ("bob", "hunter2"),
            ("alice", "s3cret"),
            ("carol", "pw"),
        ] {
            assert_eq!(f.check(user, pw.as_bytes()), Verdict::Allowed, "{user}");
            assert_eq!(
                f.check(user, b"wrong"),
                Verdict::WrongPassword,
                "{user} with a wrong password"
            );
        }
        assert_eq!(f.check("alice", b"s3cret "), Verdict::WrongPassword);
        assert_eq!(f.check("mallory", b"s3cret"), Verdict::UnknownUser);
    }

    #[test]
    fn every_bad_line_is_named_and_authenticates_nobody() {
        // The malformed lines of Mosquitto's 09-pwfile-parse-invalid test,
        // and more.
        let text = "\
bad:
bad1:bad
bad2:$
bad3:$6
bad4:$6$
bad5:$6$njERlZMi/7DzNB9E
bad6:$5$njERlZMi/7DzNB9E$iiavfuXvUm8iyDZArTy7smTxh07GXXOrOsqxfW6gkOYVXHGk+W+i/8d3xDxrMwEPygEBhoA8A/gjQC0N2M4Lkw==
:$6$njERlZMi/7DzNB9E$iiavfuXvUm8iyDZArTy7smTxh07GXXOrOsqxfW6gkOYVXHGk+W+i/8d3xDxrMwEPygEBhoA8A/gjQC0N2M4Lkw==
bad7:$6$njER{ZMi/7DzNB9E$iiavfuXvUm8iyDZArTy7smTxh07GXXOrOsqxfW6gkOYVXHGk+W+i/8d3xDxrMwEPygEBhoA8A/gjQC0N2M4Lkw==
bad8:$7$0$wL1TQahtSEUgkMH3$1moNF/c51w+5GDxYW+CPmoffW7GoUzg64SOCelzCmvFG4ZOFS/mDSgWqaixWYoCXaUcqmhsFh76fd8FCKrIupw==
bad9:$7$99999999999$wL1TQahtSEUgkMH3$1moNF/c51w+5GDxYW+CPmoffW7GoUzg64SOCelzCmvFG4ZOFS/mDSgWqaixWYoCXaUcqmhsFh76fd8FCKrIupw==
bad10:$argon2id$v=19$m=4096,t=3,p=1$c2FsdA$aGFzaA
no colon here
";
        let (f, problems) = PasswordFile::parse(text);
        assert!(f.is_empty(), "{f:?}");
        let lines: Vec<usize> = problems.iter().map(|p| p.line).collect();
        assert_eq!(lines, (1..=13).collect::<Vec<_>>(), "{problems:#?}");
        assert!(problems[12 - 1].message.contains("argon2id"));
        assert!(problems[7 - 1].message.contains("unknown hash type $5$"));
        for user in ["bad", "bad1", "bad4", "bad7", ""] {
            assert_eq!(f.check(user, b"test"), Verdict::UnknownUser);
        }
    }

    #[test]
    fn a_user_listed_twice_is_a_problem() {
        let line = FILE.lines().nth(1).unwrap();
        let (f, problems) = PasswordFile::parse(&format!("{line}\n{line}\n"));
        assert_eq!(f.len(), 1);
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].line, 2);
        assert!(problems[0].message.contains("twice"));
    }
}
