//! weir's configuration: a TOML file, parsed into raw types, then validated
//! into checked types with every problem collected and reported together,
//! each under its key path (`class[1].bound: "0ms" must be greater than
//! zero`).
//!
//! Every key is optional; an empty file gives the defaults, which
//! `config/default.toml` spells out and [`DEFAULT_CONFIG`] embeds. Unknown
//! keys are refused, so a typo never silently falls back to a default.
//!
//! # Layout
//! - `checked.rs`: [`Config`] and its sections, what the rest of weir reads.
//! - `raw.rs`: the file as written (serde, `deny_unknown_fields`).
//! - `validate.rs`: raw to checked, collecting every problem.
//! - `defaults.rs`: every default, each with why it has that value.
//! - `units.rs`: [`HumanDuration`], [`Size`] and [`Rate`] in human units.
//! - `tests.rs`: the shipped examples parse; errors name their keys.

mod checked;
pub mod defaults;
mod raw;
pub mod units;
mod validate;

#[cfg(test)]
mod tests;

use std::fmt;
use std::path::{Path, PathBuf};

pub use checked::{
    AdminConfig, AmqpEgress, BatchingSection, BrokerAddr, CompressionSection, Config, EgressConfig,
    EgressSink, ExchangeType, FileEgress, GrpcIngress, IngressConfig, LinkEmulation, LinkPreset,
    LogConfig, MqttIngress, MqttMode, MqttSubscribe, NodeConfig, PayloadKind, PeerConfig,
    PeeringConfig, Qos0WhenFull, SchedulerConfig, SchemeName, SubscribeQos,
};
pub use units::{HumanDuration, Rate, Size, UnitError};

/// The shipped default configuration, the file weir documents its keys in.
pub const DEFAULT_CONFIG: &str = include_str!("../../../../config/default.toml");

/// Reads and validates the config file at `path`.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: path.to_owned(),
        source,
    })?;
    parse(&text, &path.display().to_string())
}

/// Parses and validates config `text`; `origin` (a file name, or something
/// like `"<default>"`) is named in TOML errors.
pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
    let raw: raw::RawConfig = toml::from_str(text).map_err(|e| ConfigError::Toml {
        origin: origin.to_owned(),
        location: e.span().map(|span| Location::of(text, span.start)),
        message: e.message().trim_end().to_owned(),
    })?;
    validate::validate(raw).map_err(ConfigError::Invalid)
}

/// Why a config could not be loaded. weir exits with status 2 on any of
/// these.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// Not TOML, or a value of the wrong type or an unknown key.
    #[error("{origin}{}: {message}", location.map(|l| format!(":{l}")).unwrap_or_default())]
    Toml {
        /// The file name or other origin given to [`parse`].
        origin: String,
        /// Where in the text, when toml knows.
        location: Option<Location>,
        /// toml's description (names the unknown key or expected type).
        message: String,
    },
    /// Well-formed but wrong: every problem found, in file order by section.
    #[error("{}", Problems(.0))]
    Invalid(Vec<Problem>),
}

/// A 1-based line and column in the config text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    /// Line, from 1.
    pub line: usize,
    /// Column in characters, from 1.
    pub column: usize,
}

impl Location {
    /// The location of byte `offset` of `text`.
    fn of(text: &str, offset: usize) -> Location {
        let before = &text[..floor_char_boundary(text, offset)];
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        Location {
            line: before.matches('\n').count() + 1,
            column: before[line_start..].chars().count() + 1,
        }
    }
}

/// The largest char boundary of `text` at or before `offset`.
fn floor_char_boundary(text: &str, offset: usize) -> usize {
    let mut i = offset.min(text.len());
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// One thing wrong with a config: where (a key path such as
/// `classify.route[3].class`) and what, with how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Key path of the offending value, or of the section it belongs to.
    pub path: String,
    /// What is wrong and what to do.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Every problem, one per line, under a count.
struct Problems<'a>(&'a [Problem]);

impl fmt::Display for Problems<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        write!(
            f,
            "invalid configuration ({n} problem{}):",
            if n == 1 { "" } else { "s" }
        )?;
        for problem in self.0 {
            write!(f, "\n  {problem}")?;
        }
        Ok(())
    }
}
