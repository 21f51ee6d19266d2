//! What a running weir can take from a changed config file (a reload) and
//! what needs a restart.
//!
//! Applied in place: routes (`[classify]`), class bounds, shares and queue
//! capacities, `[scheduler]` (but its scheme and transaction-time prior),
//! `[batching]`, `[compression]`, `peering.peers` (when peering is on),
//! `log.level` and `egress.drain_timeout`.
//! Everything else (listen addresses, the class list's names and order,
//! durability, the spool, the egress, peering, security file paths, the
//! node id, the log format) is wired into tasks, sockets and files as weir
//! starts, so a change to it refuses the whole reload, naming each key.
//!
//! Decided on the validated configs (so `"100ms"` and `"0.1s"` are no
//! change); the keys are named from the two TOML texts.

use std::collections::BTreeMap;

use super::{Config, Problem};

/// Top-level sections or keys a reload applies in place; `class[N]` keys
/// are listed in [`RELOADABLE_CLASS_KEYS`].
const RELOADABLE: &[&str] = &[
    "classify",
    "scheduler",
    "batching",
    "compression",
    "log.level",
    "egress.drain_timeout",
    "peering.peers",
];

/// Keys under [`RELOADABLE`] that still need a restart.
const NOT_RELOADABLE: &[&str] = &["scheduler.scheme", "scheduler.transaction_time"];

/// Keys of a `[[class]]` entry a reload applies in place.
const RELOADABLE_CLASS_KEYS: &[&str] =
    &["bound", "min_share", "capacity_records", "capacity_bytes"];

/// Why a changed key needs a restart.
const RESTART: &str =
    "changed, but this takes a restart (systemctl restart weir); the running config is kept whole";

/// The changes between the running config and a new one that need a
/// restart, each under its key; empty when `new` can be applied in place.
/// `old_text` and `new_text` are the files they came from (used to name
/// keys).
pub fn restart_needed(old: &Config, old_text: &str, new: &Config, new_text: &str) -> Vec<Problem> {
    if in_place(old, new) == *new {
        return Vec::new();
    }
    let names_kept = same_names(old, new);
    let mut problems: Vec<Problem> = changed_keys(old_text, new_text)
        .into_iter()
        .filter(|k| !reloadable(k, names_kept))
        .map(|path| Problem {
            message: match path.ends_with(".name") || !names_kept && path.starts_with("class") {
                true => format!("{RESTART} (class names, their number and order are queue, metric and spool names)"),
                false => RESTART.to_owned(),
            },
            path,
        })
        .collect();
    if problems.is_empty() {
        // The texts differ only where a default or another section decides
        // the value: name the sections that changed.
        problems = changed_sections(&in_place(old, new), new)
            .into_iter()
            .map(|path| Problem {
                path: path.to_owned(),
                message: RESTART.to_owned(),
            })
            .collect();
    }
    problems
}

/// The keys whose value differs between two config texts (a key present
/// in one only counts as changed). Texts that do not parse give none.
pub fn changed_keys(old_text: &str, new_text: &str) -> Vec<String> {
    let (Ok(old), Ok(new)) = (
        old_text.parse::<toml::Table>(),
        new_text.parse::<toml::Table>(),
    ) else {
        return Vec::new();
    };
    let (mut a, mut b) = (BTreeMap::new(), BTreeMap::new());
    flatten("", &toml::Value::Table(old), &mut a);
    flatten("", &toml::Value::Table(new), &mut b);
    let mut keys: Vec<String> = a
        .iter()
        .filter(|(k, v)| b.get(*k) != Some(*v))
        .map(|(k, _)| k.clone())
        .chain(b.keys().filter(|k| !a.contains_key(*k)).cloned())
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// Leaves of a TOML value by key path (`class[1].bound`); arrays of tables
/// are indexed, other arrays are one value.
fn flatten(prefix: &str, value: &toml::Value, out: &mut BTreeMap<String, toml::Value>) {
    let join = |k: &str| match prefix.is_empty() {
        true => k.to_owned(),
        false => format!("{prefix}.{k}"),
    };
    match value {
        toml::Value::Table(t) => {
            for (k, v) in t {
                flatten(&join(k), v, out);
            }
        }
        toml::Value::Array(items) if !items.is_empty() && items.iter().all(|v| v.is_table()) => {
            for (i, v) in items.iter().enumerate() {
                flatten(&format!("{prefix}[{i}]"), v, out);
            }
        }
        other => {
            out.insert(prefix.to_owned(), other.clone());
        }
    }
}

/// Whether a changed key is one a reload applies in place.
fn reloadable(key: &str, names_kept: bool) -> bool {
    let under = |prefix: &str| {
        key == prefix
            || key.starts_with(&format!("{prefix}."))
            || key.starts_with(&format!("{prefix}["))
    };
    if NOT_RELOADABLE.iter().any(|p| under(p)) {
        return false;
    }
    if RELOADABLE.iter().any(|p| under(p)) {
        return true;
    }
    // `class[N].bound` and the like, when the class list itself stays.
    match key.strip_prefix("class[").and_then(|k| k.split_once("].")) {
        Some((_, field)) => names_kept && RELOADABLE_CLASS_KEYS.contains(&field),
        None => false,
    }
}

/// Whether both configs have the same classes, by name, in order.
fn same_names(old: &Config, new: &Config) -> bool {
    old.classes.len() == new.classes.len()
        && old
            .classes
            .iter()
            .zip(new.classes.iter())
            .all(|((_, a), (_, b))| a.name == b.name)
}

/// `old` with everything a reload applies in place taken from `new`: equal
/// to `new` exactly when nothing else changed.
fn in_place(old: &Config, new: &Config) -> Config {
    let mut c = old.clone();
    if same_names(old, new) {
        c.classes = new.classes.clone();
        c.capacities = new.capacities.clone();
    }
    c.classifier = new.classifier.clone();
    c.scheduler = super::SchedulerConfig {
        scheme: old.scheduler.scheme,
        transaction_time: old.scheduler.transaction_time,
        ..new.scheduler.clone()
    };
    c.batching = new.batching.clone();
    c.compression = new.compression.clone();
    c.log.level = new.log.level.clone();
    c.egress.drain_timeout = new.egress.drain_timeout;
    if let (Some(p), Some(n)) = (c.peering.as_mut(), new.peering.as_ref()) {
        p.peers = n.peers.clone();
    }
    c
}

/// The sections in which two configs differ.
fn changed_sections(a: &Config, b: &Config) -> Vec<&'static str> {
    let mut out = Vec::new();
    let mut check = |changed: bool, name: &'static str| {
        if changed {
            out.push(name);
        }
    };
    check(a.node != b.node, "node");
    check(
        a.classes != b.classes || a.capacities != b.capacities || a.durability != b.durability,
        "class",
    );
    check(a.scheduler != b.scheduler, "scheduler");
    check(a.ingress != b.ingress, "ingress");
    check(a.egress != b.egress, "egress");
    check(a.spool != b.spool, "spool");
    check(a.admin != b.admin, "admin");
    check(a.peering != b.peering, "peering");
    check(a.log != b.log, "log");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
[[class]]
name = "ls"
bound = "100ms"
[[class]]
name = "nm"
bound = "500ms"

[classify]
default_class = "nm"
[[classify.route]]
mqtt = "plant/+/alarm"
class = "ls"

[ingress.mqtt]
listen = "127.0.0.1:1883"
"#;

    fn parse(text: &str) -> Config {
        super::super::parse(text, "test").unwrap()
    }

    fn check(new_text: &str) -> Vec<Problem> {
        restart_needed(&parse(BASE), BASE, &parse(new_text), new_text)
    }

    #[test]
    fn routes_bounds_and_scheduler_settings_apply_in_place() {
        let new = BASE
            .replace("\"500ms\"", "\"800ms\"")
            .replace("plant/+/alarm", "plant/#")
            + "\n[scheduler]\nwindow = \"50ms\"\n[compression]\nenabled = false\n[log]\nlevel = \"debug\"\n";
        assert_eq!(check(&new), vec![]);
        assert_ne!(parse(BASE), parse(&new), "it did change");
    }

    #[test]
    fn the_same_value_written_otherwise_is_no_change() {
        assert_eq!(check(&BASE.replace("\"100ms\"", "\"0.1s\"")), vec![]);
    }

    #[test]
    fn a_listen_address_needs_a_restart_and_is_named() {
        let p = check(&BASE.replace("127.0.0.1:1883", "127.0.0.1:1884"));
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].path, "ingress.mqtt.listen");
        assert!(p[0].message.contains("restart"), "{}", p[0].message);
    }

    #[test]
    fn a_renamed_class_needs_a_restart_even_beside_changes_that_reload() {
        let new = BASE
            .replace("name = \"ls\"", "name = \"urgent\"")
            .replace("class = \"ls\"", "class = \"urgent\"")
            .replace("\"500ms\"", "\"800ms\"");
        let p = check(&new);
        let paths: Vec<&str> = p.iter().map(|p| p.path.as_str()).collect();
        assert!(paths.contains(&"class[0].name"), "{paths:?}");
        assert!(!paths.contains(&"classify.route[0].class"), "{paths:?}");
    }

    #[test]
    fn the_scheme_and_durability_need_a_restart() {
        let new = format!("{BASE}\n[scheduler]\nscheme = \"native\"\n").replace(
            "bound = \"500ms\"",
            "bound = \"500ms\"\ndurability = \"spool\"",
        );
        let paths: Vec<String> = check(&new).into_iter().map(|p| p.path).collect();
        assert_eq!(paths, vec!["class[1].durability", "scheduler.scheme"]);
    }

    #[test]
    fn peers_reload_in_place_but_turning_peering_on_needs_a_restart() {
        let with = |peers: &str| {
            format!("{BASE}\n[peering]\nlisten = \"127.0.0.1:7070\"\npeers = [{peers}]\n")
        };
        let old = with("{ id = 2, addr = \"127.0.0.1:7071\" }");
        let new = with("{ id = 3, addr = \"127.0.0.1:7072\" }");
        assert_eq!(
            restart_needed(&parse(&old), &old, &parse(&new), &new),
            vec![]
        );
        let paths: Vec<String> = restart_needed(&parse(BASE), BASE, &parse(&new), &new)
            .into_iter()
            .map(|p| p.path)
            .collect();
        assert_eq!(paths, vec!["peering.listen"]);
    }

    #[test]
    fn keys_are_named_across_arrays_of_tables_and_added_sections() {
        let keys = changed_keys(
            BASE,
            &format!("{BASE}\n[admin]\nlisten = \"127.0.0.1:9100\"\n"),
        );
        assert_eq!(keys, vec!["admin.listen"]);
        let keys = changed_keys(BASE, &BASE.replace("plant/+/alarm", "x"));
        assert_eq!(keys, vec!["classify.route[0].mqtt"]);
    }
}
