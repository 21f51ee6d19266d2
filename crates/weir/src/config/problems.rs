//! What validation reports: [`Problem`], one thing wrong under its key
//! path, and [`Problems`], the collector every section's validation writes
//! to, with helpers that check one value each (units, listen addresses,
//! names). Every problem is collected before anything is reported (the
//! shape of linkerd's `env.rs`).

use std::fmt::{self, Display};
use std::net::SocketAddr;
use std::time::Duration;

use super::named::Named;
use super::units::{HumanDuration, Rate, Size, Written};

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

/// The problems found so far, and helpers that check one value each: they
/// return the value (or its default) or `None` after recording a problem.
#[derive(Default)]
pub(crate) struct Problems(pub(crate) Vec<Problem>);

impl Problems {
    /// Records that the value at `path` is wrong, and why.
    pub(crate) fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(Problem {
            path: path.into(),
            message: message.into(),
        });
    }

    /// How many problems so far; a section compares it before and after to
    /// tell whether it found any.
    /// `value` if it lies in `range`; else records "`v` is not within
    /// `lo..=hi`" at `path`, followed by `hint`, and gives `None`.
    pub(crate) fn within<T: PartialOrd + Display + Copy>(
        &mut self,
        path: &str,
        value: Option<T>,
        range: std::ops::RangeInclusive<T>,
        hint: &str,
    ) -> Option<T> {
        let v = value?;
        if range.contains(&v) {
            return Some(v);
        }
        self.push(
            path,
            format!(
                "{v} is not within {}..={}{hint}",
                range.start(),
                range.end()
            ),
        );
        None
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// A unit value with its text as written (or the default's).
    pub(crate) fn unit<T: Copy + Display>(
        &mut self,
        path: &str,
        written: Option<Written<T>>,
        default: T,
    ) -> Option<(T, String)> {
        match written {
            None => Some((default, default.to_string())),
            Some(Written {
                text,
                parsed: Ok(value),
            }) => Some((value, text)),
            Some(Written { parsed: Err(e), .. }) => {
                self.push(path, e.to_string());
                None
            }
        }
    }

    /// A duration, zero allowed, or its default.
    pub(crate) fn duration(
        &mut self,
        path: &str,
        written: Option<Written<HumanDuration>>,
        default: Duration,
    ) -> Option<Duration> {
        self.unit(path, written, HumanDuration(default))
            .map(|(v, _)| v.0)
    }

    /// A duration greater than zero, or its default.
    pub(crate) fn positive_duration(
        &mut self,
        path: &str,
        written: Option<Written<HumanDuration>>,
        default: Duration,
    ) -> Option<Duration> {
        let (value, text) = self.unit(path, written, HumanDuration(default))?;
        if value.0.is_zero() {
            self.push(path, format!("{text:?} must be greater than zero"));
            return None;
        }
        Some(value.0)
    }

    /// A size in `1..=limit` bytes that fits a `usize`.
    pub(crate) fn positive_size(
        &mut self,
        path: &str,
        written: Option<Written<Size>>,
        default: u64,
        limit: u64,
    ) -> Option<usize> {
        let bytes = self.positive_size_u64(path, written, default, limit)?;
        match usize::try_from(bytes) {
            Ok(bytes) => Some(bytes),
            Err(_) => {
                self.push(
                    path,
                    format!("{} is too large for this platform", Size(bytes)),
                );
                None
            }
        }
    }

    /// A size greater than zero and at most `limit`, or its default, in
    /// bytes as a `u64`: for sizes on disk, which a 32-bit platform holds
    /// as well as a 64-bit one.
    pub(crate) fn positive_size_u64(
        &mut self,
        path: &str,
        written: Option<Written<Size>>,
        default: u64,
        limit: u64,
    ) -> Option<u64> {
        let (value, text) = self.unit(path, written, Size(default))?;
        if value.0 == 0 {
            self.push(path, format!("{text:?} must be greater than zero"));
            return None;
        }
        if value.0 > limit {
            self.push(
                path,
                format!("{text:?} is more than the limit of {limit} bytes"),
            );
            return None;
        }
        Some(value.0)
    }

    /// A rate greater than zero, or its default (in bytes per second).
    pub(crate) fn positive_rate(
        &mut self,
        path: &str,
        written: Option<Written<Rate>>,
        default: f64,
    ) -> Option<f64> {
        let (value, text) = self.unit(path, written, Rate::from_bytes_per_sec(default))?;
        if value.bytes_per_sec() <= 0.0 {
            self.push(path, format!("{text:?} must be greater than zero"));
            return None;
        }
        Some(value.bytes_per_sec())
    }

    /// An IP address and port to listen on (no host names: a listener binds
    /// an interface, not a name).
    pub(crate) fn socket_addr(&mut self, path: &str, text: &str) -> Option<SocketAddr> {
        match text.parse() {
            Ok(addr) => Some(addr),
            Err(_) => {
                self.push(
                    path,
                    format!(
                        "{text:?} is not an IP address and port; write e.g. \"0.0.0.0:1883\", \"127.0.0.1:9464\" or \"[::]:50051\""
                    ),
                );
                None
            }
        }
    }

    /// One of the names of `E`, or its default.
    pub(crate) fn choice<E: Named>(
        &mut self,
        path: &str,
        what: &str,
        given: Option<String>,
        default: E,
    ) -> Option<E> {
        let Some(name) = given else {
            return Some(default);
        };
        let found = E::from_name(&name);
        if found.is_none() {
            self.push(
                path,
                format!("unknown {what} {name:?} (known: {})", E::NAMES.join(", ")),
            );
        }
        found
    }
}
