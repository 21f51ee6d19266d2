//! Why a config could not be loaded ([`ConfigError`]), and where in the
//! text a TOML error is ([`Location`]).

use std::fmt;
use std::path::PathBuf;

use super::problems::Problem;

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
        /// The file name or other origin given to [`parse`](super::parse).
        origin: String,
        /// Where in the text, when toml knows.
        location: Option<Location>,
        /// toml's description (names the unknown key or expected type).
        message: String,
    },
    /// Well-formed but wrong: every problem found, in file order by section.
    #[error("{}", ProblemList(.0))]
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
    pub(crate) fn of(text: &str, offset: usize) -> Location {
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

/// Every problem, one per line, under a count.
struct ProblemList<'a>(&'a [Problem]);

impl fmt::Display for ProblemList<'_> {
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
