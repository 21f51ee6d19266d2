//! `[log]`: the `tracing` filter weir logs with and the line format, as
//! written, their defaults, checked, and their validation.

use serde::Deserialize;

use super::named::named_enum;
use super::problems::Problems;

named_enum! {
    /// How log lines are written.
    pub enum LogFormat {
        /// Human-readable lines (under systemd: without timestamps or
        /// colours, with a syslog priority prefix journald reads).
        Text = "text",
        /// One JSON object per line (log shippers).
        Json = "json",
    }
}

/// Lines for people; JSON is one key away for shippers.
pub const LOG_FORMAT: LogFormat = LogFormat::Text;

/// Operators want to see connections and errors, not every record.
pub const LOG_LEVEL: &str = "info";

/// `[log]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLog {
    pub level: Option<String>,
    pub format: Option<String>,
}

/// `[log]`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    /// A `tracing` filter: a level (`info`) or comma-separated
    /// `target=level` directives, each level checked.
    pub level: String,
    /// Text or JSON lines.
    pub format: LogFormat,
}

/// The levels `tracing` knows, lowest verbosity first.
const LOG_LEVELS: &[&str] = &["off", "error", "warn", "info", "debug", "trace"];

/// `[log]` checked, or `None` after recording why.
pub(crate) fn log(p: &mut Problems, raw: RawLog) -> Option<LogConfig> {
    let level = raw.level.unwrap_or_else(|| LOG_LEVEL.to_owned());
    let before = p.len();
    for directive in level.split(',').map(str::trim) {
        // `target=level` or a bare level; a target alone would log
        // everything of it, which is rarely meant, so it is refused.
        let lvl = directive.rsplit_once('=').map_or(directive, |(_, l)| l);
        if !LOG_LEVELS.contains(&lvl.to_ascii_lowercase().as_str()) {
            let within = if directive == level {
                String::new()
            } else {
                format!(" (in {level:?})")
            };
            p.push(
                "log.level",
                format!(
                    "{directive:?}{within} is not a level or target=level; levels: {}",
                    LOG_LEVELS.join(", ")
                ),
            );
        }
    }
    let format = p.choice("log.format", "format", raw.format, LOG_FORMAT);
    if p.len() != before {
        return None;
    }
    Some(LogConfig {
        level,
        format: format?,
    })
}
