//! Topic access control lists in the format of Mosquitto's `acl_file`, so
//! an operator can reuse the file their broker already has.
//!
//! ```text
//! # before any `user` line: rules for clients without a username
//! topic read public/#
//! user alice
//! topic write plant/line1/#        # alice may publish under plant/line1
//! topic deny plant/line1/secret
//! topic readwrite alice/#          # `topic x` alone also means readwrite
//! pattern write devices/%u/#       # every client; %u username, %c client id
//! ```
//!
//! # How a publish is decided
//! weir only receives publishes, so only `write` matters (`read` rules are
//! accepted and never grant a publish):
//! 1. A topic under `$SYS` is never writable by a client.
//! 2. A `deny` rule of the client's list (its `user` section, or the
//!    anonymous list before the first `user` line) or a `deny` pattern that
//!    matches refuses it.
//! 3. A `write` or `readwrite` rule or pattern that matches allows it.
//! 4. Nothing matched: refused. An ACL file without rules refuses
//!    everything.
//!
//! Mosquitto checks a user's deny rules before its grants too, but lets a
//! pattern grant what a user rule denied; weir does not: a `deny` anywhere
//! wins.
//!
//! # Identifiers that cannot widen a pattern
//! A pattern `devices/%c/#` must not let a client called `+` or `a/b`
//! publish outside its own subtree (the mistake behind Mosquitto's
//! CVE-2017-7650). When a pattern uses `%c`, a client id containing `+`,
//! `#` or `/` is refused at CONNECT ([`AclFile::identity_problem`]); the
//! same for usernames and `%u`. A pattern with `%u` does not apply to a
//! client without a username.
//!
//! Each connection compiles its rules once ([`AclFile::for_client`]); a
//! publish is then checked against that short list.

use std::collections::HashMap;

use crate::classify::TopicFilter;
use crate::security::passwd::{read_lines, LineProblem};

/// Characters an identifier substituted into a pattern must not contain.
const PATTERN_UNSAFE: &[char] = &['+', '#', '/'];

/// What a rule grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Subscribe only: never grants a publish.
    Read,
    /// Publish.
    Write,
    /// Both.
    ReadWrite,
    /// Explicitly nothing; checked before any grant.
    Deny,
}

impl Access {
    fn parse(word: &str) -> Option<Access> {
        Some(match word {
            "read" => Access::Read,
            "write" => Access::Write,
            "readwrite" => Access::ReadWrite,
            "deny" => Access::Deny,
            _ => return None,
        })
    }

    fn grants_write(self) -> bool {
        matches!(self, Access::Write | Access::ReadWrite)
    }
}

/// One `topic` line, its filter checked.
#[derive(Debug, Clone)]
struct Rule {
    access: Access,
    filter: TopicFilter,
}

/// One `pattern` line; its filter is checked once substituted.
#[derive(Debug, Clone)]
struct Pattern {
    access: Access,
    text: String,
}

/// A parsed ACL file.
#[derive(Debug, Clone, Default)]
pub struct AclFile {
    anonymous: Vec<Rule>,
    users: HashMap<String, Vec<Rule>>,
    patterns: Vec<Pattern>,
}

/// The rules that apply to one connected client.
#[derive(Debug, Clone, Default)]
pub struct ClientAcl {
    deny: Vec<TopicFilter>,
    allow: Vec<TopicFilter>,
}

impl AclFile {
    /// Reads an ACL file's text: the rules, and every line that could not
    /// be read (those lines are left out, so a caller that goes on anyway
    /// grants less, never more).
    pub fn parse(text: &str) -> (AclFile, Vec<LineProblem>) {
        let mut acl = AclFile::default();
        // `None`: the anonymous list, before the first `user` line.
        let mut section: Option<String> = None;
        let problems = read_lines(text, |line| {
            let (keyword, rest) = match line.split_once(char::is_whitespace) {
                Some((k, rest)) => (k, rest.trim_start()),
                None => (line, ""),
            };
            match keyword {
                "user" => {
                    if rest.is_empty() {
                        // Rules below it must not fall into the previous
                        // section: give them a section nobody has.
                        section = Some(String::new());
                        return Err("`user` needs a name".into());
                    }
                    acl.users.entry(rest.to_owned()).or_default();
                    section = Some(rest.to_owned());
                    Ok(())
                }
                "topic" | "pattern" => {
                    let (access, filter) = match rest.split_once(char::is_whitespace) {
                        Some((word, filter)) if Access::parse(word).is_some() => {
                            (Access::parse(word), filter.trim_start())
                        }
                        _ if Access::parse(rest).is_some() => (None, ""),
                        _ => (Some(Access::ReadWrite), rest),
                    };
                    let access = access
                        .filter(|_| !filter.is_empty())
                        .ok_or_else(|| format!("`{keyword}` needs a topic filter"))?;
                    if keyword == "pattern" {
                        // Checked with placeholders filled in, so that a
                        // filter broken whatever the client is named is
                        // reported now.
                        let sample = filter.replace("%u", "u").replace("%c", "c");
                        TopicFilter::parse(&sample)
                            .map_err(|e| format!("pattern {filter:?}: {e}"))?;
                        acl.patterns.push(Pattern {
                            access,
                            text: filter.to_owned(),
                        });
                        return Ok(());
                    }
                    let filter =
                        TopicFilter::parse(filter).map_err(|e| format!("topic {filter:?}: {e}"))?;
                    let list = match &section {
                        None => &mut acl.anonymous,
                        Some(user) => acl.users.entry(user.clone()).or_default(),
                    };
                    list.push(Rule { access, filter });
                    Ok(())
                }
                other => Err(format!(
                    "unknown keyword {other:?} (expected user, topic or pattern)"
                )),
            }
        });
        acl.users.remove("");
        (acl, problems)
    }

    /// Why a client may not connect at all under this file: an identifier
    /// that a pattern would substitute contains `+`, `#` or `/`.
    pub fn identity_problem(&self, username: Option<&str>, client_id: &str) -> Option<String> {
        let uses = |placeholder: &str| self.patterns.iter().any(|p| p.text.contains(placeholder));
        if uses("%c") && client_id.contains(PATTERN_UNSAFE) {
            return Some(format!(
                "client id {client_id:?} contains +, # or /, which the ACL's %c patterns do not allow"
            ));
        }
        match username {
            Some(user) if uses("%u") && user.contains(PATTERN_UNSAFE) => Some(format!(
                "username {user:?} contains +, # or /, which the ACL's %u patterns do not allow"
            )),
            _ => None,
        }
    }

    /// The rules for a client: its user's list (or the anonymous list),
    /// and every pattern with its identifiers substituted.
    ///
    /// Call [`identity_problem`](Self::identity_problem) first; a pattern
    /// whose substitution would not be a valid filter is left out.
    pub fn for_client(&self, username: Option<&str>, client_id: &str) -> ClientAcl {
        let mut acl = ClientAcl::default();
        let own = match username {
            Some(user) => self.users.get(user).map(Vec::as_slice).unwrap_or_default(),
            None => &self.anonymous,
        };
        for rule in own {
            acl.push(rule.access, rule.filter.clone());
        }
        for pattern in &self.patterns {
            let text = match username {
                Some(user) => pattern.text.replace("%u", user),
                None if pattern.text.contains("%u") => continue,
                None => pattern.text.clone(),
            };
            let text = text.replace("%c", client_id);
            if let Ok(filter) = TopicFilter::parse(&text) {
                acl.push(pattern.access, filter);
            }
        }
        acl
    }
}

impl ClientAcl {
    fn push(&mut self, access: Access, filter: TopicFilter) {
        if access == Access::Deny {
            self.deny.push(filter);
        } else if access.grants_write() {
            self.allow.push(filter);
        }
    }

    /// Whether the client may publish to `topic`.
    pub fn may_publish(&self, topic: &str) -> bool {
        if topic == "$SYS" || topic.starts_with("$SYS/") {
            return false;
        }
        if self.deny.iter().any(|f| f.matches(topic)) {
            return false;
        }
        self.allow.iter().any(|f| f.matches(topic))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "\
# anonymous clients
topic write public/#
topic read news/#

user alice
topic write plant/line1/#
topic deny plant/line1/secret
topic alice/#

user bob
topic readwrite plant/#

pattern write devices/%u/#
pattern write clients/%c/up
pattern deny devices/+/locked
";

    fn acl() -> AclFile {
        let (acl, problems) = AclFile::parse(FILE);
        assert_eq!(problems, vec![]);
        acl
    }

    #[test]
    fn users_anonymous_and_patterns_grant_what_they_say() {
        let acl = acl();
        let alice = acl.for_client(Some("alice"), "a1");
        assert!(alice.may_publish("plant/line1/temp"));
        assert!(alice.may_publish("plant/line1"), "# matches its parent");
        assert!(!alice.may_publish("plant/line1/secret"), "deny wins");
        assert!(alice.may_publish("alice/x"), "no access word: readwrite");
        assert!(!alice.may_publish("plant/line2/temp"));
        assert!(
            !alice.may_publish("public/x"),
            "anonymous rules are not hers"
        );
        assert!(alice.may_publish("devices/alice/t"), "%u pattern");
        assert!(!alice.may_publish("devices/bob/t"));
        assert!(alice.may_publish("clients/a1/up"), "%c pattern");
        assert!(!alice.may_publish("clients/a2/up"));

        let bob = acl.for_client(Some("bob"), "b1");
        assert!(bob.may_publish("plant/line1/secret"));
        assert!(!bob.may_publish("devices/bob/locked"), "deny pattern");

        let anon = acl.for_client(None, "x");
        assert!(anon.may_publish("public/a"));
        assert!(!anon.may_publish("news/a"), "read never grants a publish");
        assert!(
            !anon.may_publish("devices/x/t"),
            "%u patterns skip clients without a username"
        );
        assert!(anon.may_publish("clients/x/up"));

        let carol = acl.for_client(Some("carol"), "c");
        assert!(
            !carol.may_publish("public/a"),
            "a named user is not anonymous"
        );
        assert!(carol.may_publish("devices/carol/t"));
    }

    #[test]
    fn sys_topics_and_empty_files_refuse() {
        let (acl, problems) = AclFile::parse("topic write #\ntopic write $SYS/#\n");
        assert_eq!(problems, vec![]);
        let anon = acl.for_client(None, "x");
        assert!(anon.may_publish("a/b"));
        assert!(!anon.may_publish("$SYS/broker/x"));
        let (empty, _) = AclFile::parse("# nothing\n");
        assert!(!empty.for_client(None, "x").may_publish("a"));
        assert!(!empty.for_client(Some("u"), "x").may_publish("a"));
    }

    #[test]
    fn identifiers_that_would_widen_a_pattern_are_refused() {
        let acl = acl();
        for id in ["+", "#", "a/b", "x+"] {
            assert!(acl.identity_problem(Some("alice"), id).is_some(), "{id}");
            assert!(acl.identity_problem(Some(id), "c1").is_some(), "{id}");
        }
        assert_eq!(acl.identity_problem(Some("alice"), "c-1"), None);
        assert_eq!(acl.identity_problem(None, "c-1"), None);
        // Without patterns any identifier is fine.
        let (plain, _) = AclFile::parse("user a/b\ntopic write x\n");
        assert_eq!(plain.identity_problem(Some("a/b"), "#"), None);
        assert!(plain.for_client(Some("a/b"), "#").may_publish("x"));
    }

    #[test]
    fn bad_lines_are_named_and_grant_nothing() {
        let text = "\
topic write
topic write a/#/b
pattern write x/%u#
frobnicate x
user
topic write y
topic writ z
";
        let (acl, problems) = AclFile::parse(text);
        let lines: Vec<usize> = problems.iter().map(|p| p.line).collect();
        assert_eq!(lines, vec![1, 2, 3, 4, 5], "{problems:#?}");
        // `topic writ z` is a readwrite rule for the topic "writ z", as in
        // Mosquitto; it sits under the nameless `user`, so nobody has it.
        assert!(!acl.for_client(None, "c").may_publish("y"));
        assert!(!acl.for_client(None, "c").may_publish("writ z"));
        assert!(acl.users.is_empty());
    }
}
