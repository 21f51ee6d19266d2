//! The per-batch compression choice: Dzhagaryan and Milenkovic, "Models for
//! Evaluating Effective Throughputs for File Transfers in Mobile Computing"
//! (Eq. 3 and the piping model, Eq. 19-20), fed by tables of what each codec
//! recently achieved on each kind of payload.
//!
//! For a batch of `US` uncompressed bytes the model predicts the effective
//! throughput (uncompressed bytes delivered per second) of sending it raw,
//! Eq. 3, and of compressing it with a codec whose compression ratio `CR`
//! and local compression throughput `Th_c` are known, while sending
//! (piping), Eq. 19-20:
//!
//! ```text
//! k       = Th_up / Th_c   if Th_c > Th_up, else 1                  (19)
//! Th_pipe = CR Th_up / (1 + CR Th_up (T_sc / US + k / Th_c))        (20)
//! ```
//!
//! `CR` and `Th_c` depend on the data and the CPU, so they are measured:
//! [`CompressionChooser`] keeps, per payload kind (a stream, topic or class
//! name), a [`CodecTable`] of exponentially weighted moving averages per
//! candidate codec (the paper's "data tables filled with historical data of
//! prior data transfers"), refreshed by compressing an occasional sample with
//! a codec not in use ([`CompressionChooser::sample_due`]): the first
//! [`SAMPLE_SLICE_BYTES`] of a batch, which itself goes with the chosen
//! codec, so a refresh never costs more than a slice's compression, however
//! slow the codec or large the batch. The averages are
//! kept of `1/CR` and `1/Th_c`, the quantities transfer time is linear in,
//! so averaging them averages time, not rates.
//!
//! [`CompressionChooser::choose`] never picks a codec it has not measured,
//! and picks compression only when it beats sending raw by [`MIN_GAIN`]: on
//! incompressible data (`CR` about 1) compression only costs time.
//!
//! # Reading the paper
//! - Eq. 19-20 and Eq. 3 are transcribed in DESIGN.md section 3 exactly as
//!   printed; no discrepancy. Eq. 19 leaves `Th_c = Th_up` open; both
//!   branches give `k = 1` there, so the model is continuous.
//! - Eq. 19 compares `Th_c` (uncompressed bytes/s) with `Th_up` (wire
//!   bytes/s), so the compression term is discounted as `Th_up / Th_c^2`
//!   once the CPU outruns the wire: an empirical fit, not a pipeline
//!   bound. It makes the prediction non-monotone in `Th_up` (a codec can
//!   predict lower throughput on a faster link when `Th_c` falls between
//!   the two rates), which the paper's own Table II shows for gzip -6
//!   (3.70 MB/s on 0.5 MB/s, 2.36 MB/s on 5 MB/s).
//! - Table II cannot be fitted by one `Th_c` for gzip -6: 3.70 MB/s on the
//!   0.5 MB/s link needs `Th_c` of about 10.2 MB/s, 2.36 MB/s on 5 MB/s
//!   about 2.6 MB/s, while pigz -6 (same ratio) reaches 17.11 MB/s there.
//!   Its raw row (0.53 MB/s on a 0.5 MB/s link) is above what Eq. 3 allows,
//!   so the shaped rate was a little above nominal. With `Th_c` back-solved
//!   from the 5 MB/s column, the model picks the measured winner on
//!   0.5 MB/s (xz -0) and predicts 11.5x over raw against the measured
//!   11.82x (see the tests).

use std::collections::HashMap;
use std::fmt;
use std::ops::RangeInclusive;
use std::str::FromStr;
use std::time::Duration;

use crate::link_estimate::LinkEstimate;

/// gzip (flate2) levels weir accepts; 0 would store uncompressed, which is
/// [`Codec::None`] with a header.
pub const GZIP_LEVELS: RangeInclusive<u8> = 1..=9;

/// zstd levels weir accepts: the library's positive levels.
pub const ZSTD_LEVELS: RangeInclusive<u8> = 1..=22;

/// Level of a bare `gzip`: gzip's own default.
pub const DEFAULT_GZIP_LEVEL: u8 = 6;

/// Level of a bare `zstd`: zstd's own default.
pub const DEFAULT_ZSTD_LEVEL: u8 = 3;

/// The default candidate set: none, gzip 1/6/9, zstd 1/3/9/19.
pub const DEFAULT_CANDIDATES: [Codec; 8] = [
    Codec::None,
    Codec::Gzip(1),
    Codec::Gzip(6),
    Codec::Gzip(9),
    Codec::Zstd(1),
    Codec::Zstd(3),
    Codec::Zstd(9),
    Codec::Zstd(19),
];

/// Weight of a new observation in the moving averages: the last ~5
/// observations carry two thirds of the weight, so a change of payload shows
/// within a few batches while one odd batch moves the mean by a fifth.
pub const DEFAULT_EWMA_WEIGHT: f64 = 0.2;

/// Batches between samples of a codec not in use: with seven candidates each
/// is refreshed every ~200 batches, and a sample costs at most 1/32 of the
/// batches' compression work.
pub const DEFAULT_SAMPLE_EVERY_BATCHES: u32 = 32;

/// Longest time between samples when batches are rare, so tables of a quiet
/// stream do not go stale.
pub const DEFAULT_SAMPLE_EVERY: Duration = Duration::from_secs(30);

/// Predicted throughputs within this fraction of the best count as a tie,
/// which the fastest compressor wins: 5 % is about the model's error for
/// competitive codecs (piping paper: 1-10 %; weir's lab: 3-15 %).
pub const NEAR_TIE: f64 = 0.05;

/// A codec must beat sending raw by 2% to be chosen: predictions carry a few
/// percent of error, and a near-tie is not worth the CPU.
pub const MIN_GAIN: f64 = 1.02;

/// Payload kinds with their own table; further kinds share one overflow
/// table, so a flood of topic names cannot grow memory without bound.
pub const DEFAULT_MAX_KINDS: usize = 256;

/// Floor on a measured compression time: below a microsecond the clock, not
/// the codec, is measured.
const MIN_ELAPSED: Duration = Duration::from_micros(1);

/// Bounds on the stored compressed/uncompressed share: a zero share would
/// mean an infinite ratio; beyond 10 the "compressor" is broken.
const SHARE_RANGE: RangeInclusive<f64> = 1e-6..=10.0;

/// A compression codec and level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Codec {
    /// Send uncompressed.
    None,
    /// gzip (DEFLATE) at a level in [`GZIP_LEVELS`].
    Gzip(u8),
    /// zstd at a level in [`ZSTD_LEVELS`].
    Zstd(u8),
}

impl Codec {
    /// The AMQP `content_encoding` for this codec (`None` for raw).
    pub fn content_encoding(self) -> Option<&'static str> {
        match self {
            Codec::None => None,
            Codec::Gzip(_) => Some("gzip"),
            Codec::Zstd(_) => Some("zstd"),
        }
    }

    /// True for [`Codec::None`].
    #[inline]
    pub fn is_none(self) -> bool {
        matches!(self, Codec::None)
    }

    /// Checks the level against the codec's range.
    pub fn validate(self) -> Result<Self, CodecError> {
        let (name, level, range) = match self {
            Codec::None => return Ok(self),
            Codec::Gzip(l) => ("gzip", l, GZIP_LEVELS),
            Codec::Zstd(l) => ("zstd", l, ZSTD_LEVELS),
        };
        if range.contains(&level) {
            Ok(self)
        } else {
            Err(CodecError::LevelOutOfRange {
                codec: name,
                level: level.into(),
                min: *range.start(),
                max: *range.end(),
            })
        }
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Codec::None => f.write_str("none"),
            Codec::Gzip(l) => write!(f, "gzip-{l}"),
            Codec::Zstd(l) => write!(f, "zstd-{l}"),
        }
    }
}

/// A codec name that is not `none`, `gzip-<level>` or `zstd-<level>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// Not a known codec.
    #[error("unknown codec `{0}`: use none, gzip-<1..9> or zstd-<1..22> (e.g. \"zstd-3\")")]
    Unknown(String),
    /// The level is not a number.
    #[error("codec `{0}`: the level after `-` must be a number, e.g. \"gzip-6\"")]
    BadLevel(String),
    /// The level is outside the codec's range.
    #[error("{codec} level {level} is outside {min}..={max}")]
    LevelOutOfRange {
        /// Codec name.
        codec: &'static str,
        /// The level given.
        level: i64,
        /// Lowest level accepted.
        min: u8,
        /// Highest level accepted.
        max: u8,
    },
}

impl FromStr for Codec {
    type Err = CodecError;

    /// `none`, `gzip-6`, `zstd-3`; a bare `gzip` or `zstd` takes the codec's
    /// default level. Case-insensitive, surrounding blanks ignored.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let (name, level) = match t.split_once('-') {
            Some((n, l)) => (n, Some(l)),
            None => (t, None),
        };
        let level = match level {
            None => None,
            Some(l) => Some(
                l.parse::<i64>()
                    .map_err(|_| CodecError::BadLevel(s.to_string()))?,
            ),
        };
        let (make, default, range, canonical): (fn(u8) -> Codec, u8, _, &'static str) =
            if name.eq_ignore_ascii_case("none") && level.is_none() {
                return Ok(Codec::None);
            } else if name.eq_ignore_ascii_case("gzip") {
                (Codec::Gzip, DEFAULT_GZIP_LEVEL, GZIP_LEVELS, "gzip")
            } else if name.eq_ignore_ascii_case("zstd") {
                (Codec::Zstd, DEFAULT_ZSTD_LEVEL, ZSTD_LEVELS, "zstd")
            } else {
                return Err(CodecError::Unknown(s.to_string()));
            };
        match level {
            None => Ok(make(default)),
            Some(l) if l >= *range.start() as i64 && l <= *range.end() as i64 => Ok(make(l as u8)),
            Some(l) => Err(CodecError::LevelOutOfRange {
                codec: canonical,
                level: l,
                min: *range.start(),
                max: *range.end(),
            }),
        }
    }
}

/// Eq. 19: the share of the compression time that is not hidden behind
/// sending, `Th_up / Th_c` when compression outruns the link, else 1.
#[inline]
pub fn piping_k(compress_bytes_per_sec: f64, link_bytes_per_sec: f64) -> f64 {
    if compress_bytes_per_sec > link_bytes_per_sec {
        link_bytes_per_sec / compress_bytes_per_sec
    } else {
        1.0
    }
}

/// Eq. 20: effective throughput (uncompressed bytes/s) of compressing
/// `uncompressed` bytes at ratio `ratio` and `compress_bytes_per_sec` while
/// sending over `link`. Zero for an empty batch.
#[inline]
pub fn piping_throughput(
    ratio: f64,
    compress_bytes_per_sec: f64,
    link: &LinkEstimate,
    uncompressed: f64,
) -> f64 {
    if uncompressed <= 0.0 {
        return 0.0;
    }
    let th_up = link.bytes_per_sec;
    let k = piping_k(compress_bytes_per_sec, th_up);
    let cr_up = ratio * th_up;
    let per_byte = link.per_transaction.as_secs_f64() / uncompressed + k / compress_bytes_per_sec;
    cr_up / (1.0 + cr_up * per_byte)
}

/// Moving averages of one codec on one kind of payload.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CodecStats {
    /// EWMA of compressed / uncompressed bytes (`1 / CR`).
    compressed_share: f64,
    /// EWMA of compression seconds per uncompressed byte (`1 / Th_c`).
    secs_per_byte: f64,
    samples: u32,
    /// Batch counter when last observed or handed out as a sample.
    last_touch: Option<u64>,
}

impl CodecStats {
    const EMPTY: CodecStats = CodecStats {
        compressed_share: 1.0,
        secs_per_byte: 0.0,
        samples: 0,
        last_touch: None,
    };

    /// Average compression ratio `CR` (uncompressed / compressed), once
    /// observed.
    pub fn ratio(&self) -> Option<f64> {
        (self.samples > 0).then(|| 1.0 / self.compressed_share)
    }

    /// Average compression throughput `Th_c` (uncompressed bytes/s), once
    /// observed.
    pub fn compress_bytes_per_sec(&self) -> Option<f64> {
        (self.samples > 0).then(|| 1.0 / self.secs_per_byte)
    }

    /// Observations so far (saturating).
    pub fn samples(&self) -> u32 {
        self.samples
    }
}

/// The historical data of one payload kind: a [`CodecStats`] per candidate,
/// plus the sampling clock.
#[derive(Debug, Clone, PartialEq)]
pub struct CodecTable {
    entries: Vec<(Codec, CodecStats)>,
    /// Batches seen (calls to `sample_due`).
    batch: u64,
    last_sample_batch: u64,
    last_sample_at: Option<Duration>,
    /// Multiplies `sample_every_batches` (1, 2, 4, .. up to
    /// [`MAX_SAMPLE_BACKOFF`]): doubled each time a sample is due and the
    /// choice has not changed since the one before, reset when it has.
    backoff: u32,
    /// The codec chosen when the last periodic sample was taken.
    choice_at_sample: Option<Codec>,
}

impl CodecTable {
    fn new(candidates: &[Codec]) -> Self {
        CodecTable {
            entries: candidates.iter().map(|c| (*c, CodecStats::EMPTY)).collect(),
            batch: 0,
            last_sample_batch: 0,
            last_sample_at: None,
            backoff: 1,
            choice_at_sample: None,
        }
    }

    /// The current multiple of `sample_every_batches` between samples.
    pub fn sample_backoff(&self) -> u32 {
        self.backoff
    }

    /// The stats of `codec`, if it is a candidate.
    pub fn stats(&self, codec: Codec) -> Option<&CodecStats> {
        self.entries
            .iter()
            .find(|(c, _)| *c == codec)
            .map(|(_, s)| s)
    }

    /// Every candidate with its stats, in candidate order.
    pub fn iter(&self) -> impl Iterator<Item = (Codec, &CodecStats)> {
        self.entries.iter().map(|(c, s)| (*c, s))
    }
}

/// What the chooser picked for a batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    /// The codec to compress the batch with.
    pub codec: Codec,
    /// Its predicted effective throughput, uncompressed bytes/s (Eq. 20, or
    /// Eq. 3 for `none` and for an unmeasured fallback).
    pub predicted_throughput: f64,
    /// Eq. 3: the prediction for sending the batch raw.
    pub uncompressed_throughput: f64,
}

/// Tunables of the chooser.
#[derive(Debug, Clone, PartialEq)]
pub struct ChooserConfig {
    /// Codecs to choose among, in tie-break order.
    pub candidates: Vec<Codec>,
    /// Weight of a new observation in the moving averages, in `(0, 1]`.
    pub ewma_weight: f64,
    /// Batches between samples of a codec not in use.
    pub sample_every_batches: u32,
    /// Longest time between samples.
    pub sample_every: Duration,
    /// Factor by which a codec must beat raw (`>= 1`).
    pub min_gain: f64,
    /// Payload kinds with their own table.
    pub max_kinds: usize,
}

impl Default for ChooserConfig {
    fn default() -> Self {
        ChooserConfig {
            candidates: DEFAULT_CANDIDATES.to_vec(),
            ewma_weight: DEFAULT_EWMA_WEIGHT,
            sample_every_batches: DEFAULT_SAMPLE_EVERY_BATCHES,
            sample_every: DEFAULT_SAMPLE_EVERY,
            min_gain: MIN_GAIN,
            max_kinds: DEFAULT_MAX_KINDS,
        }
    }
}

/// Why a [`ChooserConfig`] was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ChooserConfigError {
    /// No candidates.
    #[error("compression candidates are empty; list at least \"none\"")]
    NoCandidates,
    /// A candidate listed twice.
    #[error("compression candidate `{0}` is listed twice")]
    Duplicate(Codec),
    /// A candidate with a bad level.
    #[error("compression candidate `{0}`: {1}")]
    Level(Codec, CodecError),
    /// EWMA weight outside `(0, 1]`.
    #[error("compression ewma_weight {0} is not within (0, 1]")]
    Weight(f64),
    /// Gain factor below 1 or not finite.
    #[error("compression min_gain {0} must be a finite number >= 1")]
    Gain(f64),
    /// Zero batches between samples.
    #[error("compression sample_every_batches must be at least 1")]
    SampleEvery,
    /// No room for any kind.
    #[error("compression max_kinds must be at least 1")]
    MaxKinds,
}

/// Largest multiple of `sample_every_batches` between samples once they
/// keep confirming the choice (32 x 64 = 2,048 batches by default): on
/// incompressible data at hundreds of thousands of records per second, a
/// sample of a slow level every 32 batches costs a noticeable share of a
/// core for nothing. The time trigger (`sample_every`) is not stretched,
/// so a change in the data is still noticed within it.
pub const MAX_SAMPLE_BACKOFF: u32 = 64;

/// A sample compresses at most this many bytes of its batch: enough for
/// the codec's ratio and speed per byte on this kind of payload, and a
/// bounded cost. A whole 1 MiB batch through zstd-19 took a few hundred
/// milliseconds of a core and a compression context of about 30 MiB (the
/// largest part of weir's peak RSS at full rate); 64 KiB takes a
/// sixteenth of the time and a few MiB.
pub const SAMPLE_SLICE_BYTES: usize = 64 * 1024;

/// What [`CompressionChooser::decide`] picked for one batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    /// The codec the batch is sent with: the highest predicted effective
    /// throughput.
    pub codec: Codec,
    /// A codec not in use whose table is due for a refresh: run it on the
    /// first [`SAMPLE_SLICE_BYTES`] of the batch, observe, and send the
    /// batch with `codec` all the same.
    pub sample: Option<Codec>,
    /// The predicted effective throughput of `codec` (uncompressed
    /// bytes/s).
    pub predicted: Option<f64>,
}

/// Per-batch codec choice from per-kind tables (module docs).
#[derive(Debug, Clone)]
pub struct CompressionChooser {
    config: ChooserConfig,
    has_none: bool,
    kinds: HashMap<Box<str>, CodecTable>,
    /// Shared by kinds beyond `max_kinds`.
    overflow: CodecTable,
    /// What an unseen kind looks like.
    blank: CodecTable,
}

impl CompressionChooser {
    /// Validates `config`, reporting every problem.
    pub fn new(config: ChooserConfig) -> Result<Self, Vec<ChooserConfigError>> {
        let mut errors = Vec::new();
        if config.candidates.is_empty() {
            errors.push(ChooserConfigError::NoCandidates);
        }
        for (i, c) in config.candidates.iter().enumerate() {
            if let Err(e) = c.validate() {
                errors.push(ChooserConfigError::Level(*c, e));
            }
            if config.candidates[..i].contains(c) {
                errors.push(ChooserConfigError::Duplicate(*c));
            }
        }
        if !(config.ewma_weight > 0.0 && config.ewma_weight <= 1.0) {
            errors.push(ChooserConfigError::Weight(config.ewma_weight));
        }
        if !(config.min_gain.is_finite() && config.min_gain >= 1.0) {
            errors.push(ChooserConfigError::Gain(config.min_gain));
        }
        if config.sample_every_batches == 0 {
            errors.push(ChooserConfigError::SampleEvery);
        }
        if config.max_kinds == 0 {
            errors.push(ChooserConfigError::MaxKinds);
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        let blank = CodecTable::new(&config.candidates);
        Ok(CompressionChooser {
            has_none: config.candidates.contains(&Codec::None),
            kinds: HashMap::new(),
            overflow: blank.clone(),
            blank,
            config,
        })
    }

    /// The candidate codecs, in tie-break order.
    pub fn candidates(&self) -> &[Codec] {
        &self.config.candidates
    }

    /// The table of `kind`, if anything was recorded for it.
    pub fn table(&self, kind: &str) -> Option<&CodecTable> {
        self.kinds
            .get(kind)
            .or_else(|| self.is_full().then_some(&self.overflow))
    }

    fn is_full(&self) -> bool {
        self.kinds.len() >= self.config.max_kinds
    }

    fn table_or_blank(&self, kind: &str) -> &CodecTable {
        self.table(kind).unwrap_or(&self.blank)
    }

    fn table_mut(&mut self, kind: &str) -> &mut CodecTable {
        if self.kinds.contains_key(kind) {
            return self.kinds.get_mut(kind).expect("just checked");
        }
        if self.is_full() {
            return &mut self.overflow;
        }
        self.kinds
            .entry(kind.into())
            .or_insert_with(|| self.blank.clone())
    }

    /// Records one compression of `uncompressed` bytes of `kind` into
    /// `compressed` bytes that took `elapsed` of CPU time. Call it for every
    /// compression weir performs, chosen or sampled. Observations of `none`,
    /// of codecs outside the candidate set and of empty input are ignored.
    pub fn observe(
        &mut self,
        kind: &str,
        codec: Codec,
        uncompressed: u64,
        compressed: u64,
        elapsed: Duration,
    ) {
        if codec.is_none() || uncompressed == 0 || !self.config.candidates.contains(&codec) {
            return;
        }
        let w = self.config.ewma_weight;
        let us = uncompressed as f64;
        let share = (compressed as f64 / us).clamp(*SHARE_RANGE.start(), *SHARE_RANGE.end());
        let secs_per_byte = elapsed.max(MIN_ELAPSED).as_secs_f64() / us;
        let table = self.table_mut(kind);
        let now = table.batch;
        let (_, st) = table
            .entries
            .iter_mut()
            .find(|(c, _)| *c == codec)
            .expect("candidates checked above");
        if st.samples == 0 {
            st.compressed_share = share;
            st.secs_per_byte = secs_per_byte;
        } else {
            st.compressed_share += w * (share - st.compressed_share);
            st.secs_per_byte += w * (secs_per_byte - st.secs_per_byte);
        }
        st.samples = st.samples.saturating_add(1);
        st.last_touch = Some(now);
    }

    /// Predicted effective throughput of `codec` for a batch of
    /// `batch_bytes` of `kind` (Eq. 3 for `none`, Eq. 20 otherwise); `None`
    /// for a codec not yet measured on this kind or not a candidate.
    pub fn predict(
        &self,
        kind: &str,
        codec: Codec,
        batch_bytes: u64,
        link: &LinkEstimate,
    ) -> Option<f64> {
        if codec.is_none() {
            return self
                .has_none
                .then(|| link.effective_throughput(batch_bytes as f64));
        }
        let st = self.table_or_blank(kind).stats(codec)?;
        Some(piping_throughput(
            st.ratio()?,
            st.compress_bytes_per_sec()?,
            link,
            batch_bytes as f64,
        ))
    }

    /// The codec with the highest predicted effective throughput for a batch
    /// of `batch_bytes` of `kind` on `link`. Compression must beat raw by
    /// `min_gain`; unmeasured codecs are never picked. Without `none` among
    /// the candidates, an unmeasured set falls back to the first candidate.
    /// O(candidates), no allocation.
    pub fn choose(&self, kind: &str, batch_bytes: u64, link: &LinkEstimate) -> Choice {
        let us = batch_bytes as f64;
        let raw = link.effective_throughput(us);
        let table = self.table_or_blank(kind);
        let mut best: Option<(Codec, f64)> = None;
        for (codec, st) in &table.entries {
            if codec.is_none() || st.samples == 0 {
                continue;
            }
            let tp = piping_throughput(1.0 / st.compressed_share, 1.0 / st.secs_per_byte, link, us);
            if best.is_none_or(|(_, b)| tp > b) {
                best = Some((*codec, tp));
            }
        }
        // Among codecs predicted within NEAR_TIE of the best, the cheapest
        // compressor wins: the prediction rests on a compression speed
        // measured earlier, and a slow codec loses most when the CPU gets
        // busier than when it was sampled (a shared edge box), while a fast
        // one barely notices.
        if let Some((_, top)) = best {
            let mut cheapest: Option<(Codec, f64, f64)> = None;
            for (codec, st) in &table.entries {
                if codec.is_none() || st.samples == 0 {
                    continue;
                }
                let tp =
                    piping_throughput(1.0 / st.compressed_share, 1.0 / st.secs_per_byte, link, us);
                if tp >= top * (1.0 - NEAR_TIE)
                    && cheapest.is_none_or(|(_, _, spb)| st.secs_per_byte < spb)
                {
                    cheapest = Some((*codec, tp, st.secs_per_byte));
                }
            }
            best = cheapest.map(|(c, tp, _)| (c, tp)).or(best);
        }
        let choice = |codec, predicted_throughput| Choice {
            codec,
            predicted_throughput,
            uncompressed_throughput: raw,
        };
        match best {
            Some((codec, tp)) if !self.has_none || tp >= self.config.min_gain * raw => {
                choice(codec, tp)
            }
            _ if self.has_none => choice(Codec::None, raw),
            // No `none` and nothing measured: the first candidate, assumed
            // to neither help nor cost until measured.
            _ => choice(self.config.candidates[0], raw),
        }
    }

    /// Call once per batch of `kind`: a codec to compress a sample of this
    /// batch with (off the hot path, reporting through
    /// [`observe`](Self::observe)) so the table stays fresh, or `None`.
    /// Candidates never measured come first, one per batch; after that the
    /// least recently measured one, every `sample_every_batches` batches or
    /// `sample_every` of time, whichever comes first. The codec in use is
    /// observed on every batch, so it is never the stalest.
    pub fn sample_due(&mut self, kind: &str, now: Duration) -> Option<Codec> {
        let every_batches = u64::from(self.config.sample_every_batches);
        let every = self.config.sample_every;
        let table = self.table_mut(kind);
        table.batch += 1;
        let compressing = || {
            table
                .entries
                .iter()
                .enumerate()
                .filter(|(_, (c, _))| !c.is_none())
        };
        let pick = compressing()
            .find(|(_, (_, st))| st.last_touch.is_none())
            .map(|(i, _)| i)
            .or_else(|| {
                let due = table.batch - table.last_sample_batch
                    >= every_batches * u64::from(table.backoff)
                    || table
                        .last_sample_at
                        .is_none_or(|at| now.saturating_sub(at) >= every);
                due.then(|| {
                    compressing()
                        .min_by_key(|(_, (_, st))| st.last_touch)
                        .map(|(i, _)| i)
                })
                .flatten()
            })?;
        let batch = table.batch;
        table.entries[pick].1.last_touch = Some(batch);
        table.last_sample_batch = batch;
        table.last_sample_at = Some(now);
        Some(table.entries[pick].0)
    }

    /// The codec for one batch of `batch_bytes` of `kind` at `now`: a
    /// sample when one is due ([`Self::sample_due`]), else the best
    /// prediction ([`Self::choose`]). Samples back off: each time one is
    /// due and the choice is the same as at the last one, the batches
    /// between samples double, up to [`MAX_SAMPLE_BACKOFF`] times
    /// `sample_every_batches`; a changed choice resets them.
    pub fn decide(
        &mut self,
        kind: &str,
        batch_bytes: u64,
        link: &LinkEstimate,
        now: Duration,
    ) -> Decision {
        let choice = self.choose(kind, batch_bytes, link);
        let sample = self.sample_due(kind, now);
        if sample.is_some() {
            let table = self.table_mut(kind);
            let measured_all = table
                .entries
                .iter()
                .all(|(c, st)| c.is_none() || st.last_touch.is_some());
            if measured_all {
                table.backoff = match table.choice_at_sample {
                    Some(c) if c == choice.codec => (table.backoff * 2).min(MAX_SAMPLE_BACKOFF),
                    _ => 1,
                };
                table.choice_at_sample = Some(choice.codec);
            }
        }
        Decision {
            codec: choice.codec,
            sample: sample.filter(|c| *c != choice.codec),
            predicted: Some(choice.predicted_throughput),
        }
    }
}

#[cfg(test)]
mod tests;
