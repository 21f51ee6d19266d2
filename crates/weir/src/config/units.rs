//! Human units in config files: durations (`"50ms"`, `"1.5s"`), sizes
//! (`"4MiB"`, `"64KiB"`, `"512"`) and rates (`"18Mbit/s"`, `"5MB/s"`).
//!
//! Each is a newtype that deserializes from a string, parses with
//! [`FromStr`] and displays back in a form that parses to the same value.
//! [`Written`] keeps a value that failed to parse together with its text, so
//! that validation reports it alongside every other problem instead of
//! stopping at the first.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

/// Why a unit value did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind} {text:?}: {reason}")]
pub struct UnitError {
    /// `duration`, `size` or `rate`.
    pub kind: &'static str,
    /// The text as written.
    pub text: String,
    /// What is wrong with it and how to write it instead.
    pub reason: String,
}

impl UnitError {
    fn new(kind: &'static str, text: &str, reason: impl Into<String>) -> Self {
        UnitError {
            kind,
            text: text.to_owned(),
            reason: reason.into(),
        }
    }
}

/// A duration such as `"50ms"`, `"1.5s"` or `"1m 30s"` (humantime syntax;
/// note `m` is minutes and `M` months).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HumanDuration(pub Duration);

impl HumanDuration {
    /// The duration.
    pub fn get(self) -> Duration {
        self.0
    }
}

impl FromStr for HumanDuration {
    type Err = UnitError;

    fn from_str(s: &str) -> Result<Self, UnitError> {
        let text = s.trim();
        if text.starts_with('-') {
            return Err(UnitError::new(
                "duration",
                s,
                "durations cannot be negative",
            ));
        }
        if let Ok(secs) = text.parse::<f64>() {
            if secs.is_finite() {
                return Err(UnitError::new(
                    "duration",
                    s,
                    format!("a duration needs a unit, e.g. \"{text}s\" or \"{text}ms\""),
                ));
            }
        }
        humantime::parse_duration(text)
            .map(HumanDuration)
            .map_err(|e| {
                UnitError::new(
                    "duration",
                    s,
                    format!("{e}; write e.g. \"50ms\", \"1.5s\", \"2m\""),
                )
            })
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_zero() {
            return f.write_str("0s");
        }
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

/// A size in bytes such as `"64KiB"`, `"4MiB"`, `"1.5MB"` or `"512"`
/// (bytesize syntax; `K`/`M`/`G` are decimal, `Ki`/`Mi`/`Gi` binary).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Size(pub u64);

impl Size {
    /// The size in bytes.
    pub fn bytes(self) -> u64 {
        self.0
    }
}

impl FromStr for Size {
    type Err = UnitError;

    fn from_str(s: &str) -> Result<Self, UnitError> {
        let text = s.trim();
        let (number, _) = split_number(text);
        if number.is_empty() {
            return Err(UnitError::new(
                "size",
                s,
                "expected a non-negative number of bytes with an optional unit, e.g. \"512\", \"64KiB\", \"4MiB\"",
            ));
        }
        if number.parse::<f64>().is_err() {
            return Err(UnitError::new(
                "size",
                s,
                format!("{number:?} is not a number"),
            ));
        }
        text.parse::<bytesize::ByteSize>()
            .map(|b| Size(b.as_u64()))
            .map_err(|_| {
                UnitError::new(
                    "size",
                    s,
                    "unknown unit; use B, kB, MB, GB (decimal) or KiB, MiB, GiB (binary), e.g. \"64KiB\"",
                )
            })
    }
}

impl fmt::Display for Size {
    /// The largest unit that divides the size exactly, binary first:
    /// `"64KiB"`, `"5MB"`, `"1000001B"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(u64, &str); 8] = [
            (1 << 40, "TiB"),
            (1 << 30, "GiB"),
            (1 << 20, "MiB"),
            (1 << 10, "KiB"),
            (1_000_000_000_000, "TB"),
            (1_000_000_000, "GB"),
            (1_000_000, "MB"),
            (1_000, "kB"),
        ];
        if self.0 != 0 {
            for (factor, unit) in UNITS {
                if self.0.is_multiple_of(factor) {
                    return write!(f, "{}{unit}", self.0 / factor);
                }
            }
        }
        write!(f, "{}B", self.0)
    }
}

/// A data rate, kept in bytes per second. Bit rates use decimal prefixes as
/// networking does (`"18Mbit/s"` is 18 000 000 bits/s); byte rates take
/// decimal (`"5MB/s"`) or binary (`"1MiB/s"`) prefixes.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Rate(f64);

/// Units a [`Rate`] accepts before the `/s`, with bytes per second each.
const RATE_UNITS: &[(&str, f64)] = &[
    ("bit", 1.0 / 8.0),
    ("kbit", 1e3 / 8.0),
    ("Kbit", 1e3 / 8.0),
    ("Mbit", 1e6 / 8.0),
    ("mbit", 1e6 / 8.0),
    ("Gbit", 1e9 / 8.0),
    ("gbit", 1e9 / 8.0),
    ("Tbit", 1e12 / 8.0),
    ("B", 1.0),
    ("kB", 1e3),
    ("KB", 1e3),
    ("MB", 1e6),
    ("GB", 1e9),
    ("TB", 1e12),
    ("KiB", 1024.0),
    ("MiB", 1_048_576.0),
    ("GiB", 1_073_741_824.0),
    ("TiB", 1_099_511_627_776.0),
];

/// How to write a rate, for error messages.
const RATE_HINT: &str =
    "write e.g. \"18Mbit/s\", \"780kbit/s\" (bits, decimal) or \"5MB/s\", \"1MiB/s\" (bytes)";

impl Rate {
    /// A rate of `bytes_per_sec` bytes per second.
    pub fn from_bytes_per_sec(bytes_per_sec: f64) -> Self {
        Rate(bytes_per_sec)
    }

    /// The rate in bytes per second.
    pub fn bytes_per_sec(self) -> f64 {
        self.0
    }
}

impl FromStr for Rate {
    type Err = UnitError;

    fn from_str(s: &str) -> Result<Self, UnitError> {
        let text = s.trim();
        let (number, rest) = split_number(text);
        if number.is_empty() {
            return Err(UnitError::new(
                "rate",
                s,
                format!("expected a non-negative number and a unit; {RATE_HINT}"),
            ));
        }
        let value: f64 = number
            .parse()
            .map_err(|_| UnitError::new("rate", s, format!("{number:?} is not a number")))?;
        let unit = rest.trim_start();
        let Some(unit) = unit.strip_suffix("/s") else {
            return Err(UnitError::new(
                "rate",
                s,
                format!("a rate ends in \"/s\"; {RATE_HINT}"),
            ));
        };
        if matches!(unit, "b" | "kb" | "Kb" | "Mb" | "Gb" | "Tb") {
            return Err(UnitError::new(
                "rate",
                s,
                format!(
                    "\"{unit}\" could mean bits or bytes; write \"{}bit/s\" or \"{}B/s\"",
                    &unit[..unit.len() - 1],
                    unit[..unit.len() - 1].to_uppercase()
                ),
            ));
        }
        let Some(&(_, factor)) = RATE_UNITS.iter().find(|(name, _)| *name == unit) else {
            return Err(UnitError::new(
                "rate",
                s,
                format!("unknown unit \"{unit}/s\"; {RATE_HINT}"),
            ));
        };
        let bytes_per_sec = value * factor;
        if !bytes_per_sec.is_finite() {
            return Err(UnitError::new("rate", s, "too large"));
        }
        Ok(Rate(bytes_per_sec))
    }
}

impl fmt::Display for Rate {
    /// In bits per second with the largest decimal prefix that keeps the
    /// number at least 1 (`"18Mbit/s"`); the number is printed in full so
    /// that it parses back to the same rate.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bits = self.0 * 8.0;
        for (factor, prefix) in [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")] {
            if bits >= factor {
                return write!(f, "{}{prefix}bit/s", bits / factor);
            }
        }
        write!(f, "{bits}bit/s")
    }
}

/// Splits `"18.5Mbit/s"` into `("18.5", "Mbit/s")`: the leading run of ASCII
/// digits and dots, and the rest. A sign is not part of the number, so
/// negative values are refused by every caller.
fn split_number(text: &str) -> (&str, &str) {
    let end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    text.split_at(end)
}

/// Text of a unit value, from a TOML string or, for convenience, a bare
/// number (`capacity_bytes = 512`); the unit type's parser decides whether
/// a bare number is acceptable.
struct TextVisitor;

impl Visitor<'_> for TextVisitor {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string with a unit, such as \"50ms\", \"4MiB\" or \"18Mbit/s\"")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_owned())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
        Ok(v.to_string())
    }
}

macro_rules! deserialize_from_str {
    ($($ty:ty),*) => {$(
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_any(TextVisitor)?
                    .parse()
                    .map_err(de::Error::custom)
            }
        }
    )*};
}

deserialize_from_str!(HumanDuration, Size, Rate);

/// A setting weir can choose itself: `"auto"`, or a value as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auto<T> {
    /// weir chooses (and documents how).
    Auto,
    /// As written.
    Set(T),
}

impl<T: FromStr<Err = UnitError>> FromStr for Auto<T> {
    type Err = UnitError;

    fn from_str(s: &str) -> Result<Self, UnitError> {
        match s.trim() {
            "auto" => Ok(Auto::Auto),
            other => other.parse().map(Auto::Set).map_err(|mut e: UnitError| {
                e.reason = format!("{} (or \"auto\")", e.reason);
                e
            }),
        }
    }
}

impl<T: fmt::Display> fmt::Display for Auto<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Auto::Auto => f.write_str("auto"),
            Auto::Set(v) => v.fmt(f),
        }
    }
}

/// A whole number as written (a count of records or batches).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Count(pub u64);

impl FromStr for Count {
    type Err = UnitError;

    fn from_str(s: &str) -> Result<Self, UnitError> {
        s.trim()
            .parse()
            .map(Count)
            .map_err(|_| UnitError::new("count", s, "expected a whole number, e.g. 64"))
    }
}

impl fmt::Display for Count {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A unit value as written in the file: its text, and the parsed value or
/// why it did not parse. Raw config types hold these so that a bad unit is
/// one more problem in the list rather than the end of parsing.
#[derive(Debug, Clone, PartialEq)]
pub struct Written<T> {
    /// The text as written.
    pub text: String,
    /// The parsed value or the parse error.
    pub parsed: Result<T, UnitError>,
}

impl<'de, T: FromStr<Err = UnitError>> Deserialize<'de> for Written<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = d.deserialize_any(TextVisitor)?;
        let parsed = text.parse();
        Ok(Written { text, parsed })
    }
}
