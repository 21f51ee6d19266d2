//! Uplink characterisation: the bandwidth `Th_up` and the fixed
//! per-transaction time `T_sc` of Dzhagaryan and Milenkovic, "Models for
//! Evaluating Effective Throughputs for File Transfers in Mobile Computing"
//! (Eq. 1, 3, 5-6), estimated online from weir's own completed transactions.
//!
//! A transaction of `US` bytes takes `T = T_sc + US / Th_up` (Eq. 1), so the
//! points `(size, elapsed)` of recent transactions lie on a line whose
//! intercept is `T_sc` and whose slope is `1 / Th_up`. [`LinkEstimator`] keeps
//! the last [`WINDOW`] transactions in a fixed ring and fits that line with
//! the Theil–Sen estimator (median of pairwise slopes, then median of the
//! residual intercepts): it ignores up to ~29% of wild points, such as a
//! transaction that sat behind a retransmission timeout, which least squares
//! would follow.
//!
//! # When the window cannot separate the two unknowns
//! Transactions that all have (nearly) the same size fix one point of the
//! line, not its slope: any `T_sc` fits if the bandwidth moves with it. Then
//! the estimator keeps its *anchor* `T_sc` (the configured prior, or the last
//! `T_sc` a diverse window produced, which is newer information than the
//! prior) and fits only the bandwidth, as the median of
//! `size / (elapsed - T_sc)`. If transactions are even faster than the anchor
//! `T_sc` allows, the anchor is wrong and cannot be repaired from this data;
//! the estimator then attributes half of the median time to `T_sc`
//! ([`FALLBACK_FIXED_SHARE`]) rather than report a negative bandwidth.
//!
//! # Reading the paper
//! - Eq. 5, `Th_up = Th_uup / (1 - Th_uup * T_sc / US)`, written for two
//!   transfers, is the system of Eq. 6. It is linear in `Th_up` and in the
//!   product `Th_up * T_sc`, and equivalent to the straight line through the
//!   two points `(US, US / Th_uup)` that [`two_transfer_probe`] solves. The
//!   paper's own example (0.14 MB at 0.36 MB/s, 1.24 MB at 2.06 MB/s) gives
//!   `Th_up = 5.163 MB/s`, `T_sc = 0.3618 s` this way; the paper prints
//!   5.167 MB/s and 0.362 s, a rounding difference of its coefficients
//!   2.57 and 1.66 (see the tests).
//! - The paper measures `T_sc` as connection setup time for one file over
//!   ssh; weir's transactions reuse a connection, so here `T_sc` is whatever
//!   a transaction costs regardless of its size (round trip to the broker and
//!   its confirm, framing, scheduling).

use std::collections::VecDeque;
use std::time::Duration;

/// Transactions the estimators remember: enough for a robust fit (Theil–Sen
/// over 64 points tolerates ~18 outliers) while a refit, `64*63/2 = 2016`
/// pairwise slopes, stays in the microseconds on every transaction.
pub const WINDOW: usize = 64;

/// Pairwise slopes a full window produces.
const MAX_PAIRS: usize = WINDOW * (WINDOW - 1) / 2;

/// Two transactions count as having different sizes for the fit when they
/// differ by at least this fraction of the larger: closer sizes give slopes
/// dominated by timing noise.
pub const MIN_RELATIVE_SPREAD: f64 = 0.1;

/// Distinct-size pairs needed before the intercept (`T_sc`) is fitted rather
/// than held at the anchor: four transactions of four sizes, or 3+2 of two.
pub const MIN_DIVERSE_PAIRS: usize = 6;

/// Share of the distinct-size pairs whose slope must be positive for the
/// slope to count as measured. Where sizes are close and timing noise is
/// large (a broker's confirms arriving in bunches, a busy box's late
/// wake-ups), pairwise slopes scatter around zero and their median is
/// noise: read as a line, it has given 16 MB/s and 25 kB/s for a
/// 500 kB/s link within seconds of each other. Outliers alone (up to the
/// ~29 % Theil–Sen ignores) leave well over this share positive.
pub const MIN_AGREEING_SLOPES: f64 = 2.0 / 3.0;

/// Largest relative standard error of a fitted slope that still counts as
/// a measurement of the bandwidth ([`slope_error`]): within three of them,
/// 15 %. Transactions that differ by a few milliseconds of transfer, timed
/// with a millisecond of noise (a timer's granularity, a busy box's late
/// wake-up, a broker's bunched confirms), pass the diversity tests and
/// still give a line anywhere within tens of percent: in the JANUS lab
/// with `track_uplink`, `C_out` of lending nodes followed fits between 2.0
/// and 3.4 MB/s on a 2.25 MB/s uplink; with this test, between 2.1 and
/// 2.6 MB/s.
pub const MAX_SLOPE_ERROR: f64 = 0.05;

/// Share of the median transaction time attributed to `T_sc` when the
/// anchor `T_sc` alone exceeds the observed times: an even split, since the
/// data cannot say which way the error lies.
pub const FALLBACK_FIXED_SHARE: f64 = 0.5;

/// Lowest bandwidth an estimate reports (1 B/s): keeps every division by it
/// finite however bad the data.
pub const MIN_BYTES_PER_SEC: f64 = 1.0;

/// Highest bandwidth an estimate reports (10 TB/s, far past any uplink):
/// a transaction timed at zero must not yield infinity.
pub const MAX_BYTES_PER_SEC: f64 = 1e13;

/// Longest `T_sc` an estimate reports: a minute is already a broken link.
pub const MAX_PER_TRANSACTION: Duration = Duration::from_secs(60);

/// What a link can do: Eq. 1's two constants.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkEstimate {
    /// `Th_up`: bytes per second once a transaction is under way.
    pub bytes_per_sec: f64,
    /// `T_sc`: the fixed time of every transaction, whatever its size.
    pub per_transaction: Duration,
}

impl LinkEstimate {
    /// Eq. 1: time of one transaction of `bytes` bytes, `T_sc + US / Th_up`.
    #[inline]
    pub fn transaction_secs(&self, bytes: f64) -> f64 {
        self.per_transaction.as_secs_f64() + bytes / self.bytes_per_sec
    }

    /// Eq. 3: effective throughput of an uncompressed transaction of `bytes`,
    /// `Th_uup = Th_up / (1 + Th_up * T_sc / US)`, in bytes per second
    /// (0 for an empty transaction, which moves nothing).
    #[inline]
    pub fn effective_throughput(&self, bytes: f64) -> f64 {
        if bytes > 0.0 {
            let th = self.bytes_per_sec;
            th / (1.0 + th * self.per_transaction.as_secs_f64() / bytes)
        } else {
            0.0
        }
    }

    /// The estimate with bandwidth and `T_sc` forced into the reportable
    /// ranges ([`MIN_BYTES_PER_SEC`]..=[`MAX_BYTES_PER_SEC`],
    /// 0..=[`MAX_PER_TRANSACTION`]); NaN bandwidth becomes the minimum.
    pub fn clamped(self) -> Self {
        let bw = if self.bytes_per_sec.is_nan() {
            MIN_BYTES_PER_SEC
        } else {
            self.bytes_per_sec
                .clamp(MIN_BYTES_PER_SEC, MAX_BYTES_PER_SEC)
        };
        LinkEstimate {
            bytes_per_sec: bw,
            per_transaction: self.per_transaction.min(MAX_PER_TRANSACTION),
        }
    }

    fn from_line(secs_per_byte: f64, fixed_secs: f64) -> Self {
        LinkEstimate {
            bytes_per_sec: 1.0 / secs_per_byte,
            per_transaction: secs_to_duration(
                fixed_secs.clamp(0.0, MAX_PER_TRANSACTION.as_secs_f64()),
            ),
        }
        .clamped()
    }
}

/// Why the link could not be characterised.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
pub enum LinkEstimateError {
    /// The two probe transfers must differ in size to separate `T_sc` from
    /// the bandwidth.
    #[error("probe transfers of {0} and {1} bytes: sizes must differ; send a second probe of a clearly different size")]
    SameSize(u64, u64),
    /// The larger probe finished no later than the smaller one: the link's
    /// timing was dominated by noise.
    #[error("the {larger}-byte probe was not slower than the {smaller}-byte probe; repeat the probe with a larger size difference")]
    NotSlower {
        /// Size of the smaller probe, bytes.
        smaller: u64,
        /// Size of the larger probe, bytes.
        larger: u64,
    },
    /// A prior or probe with no usable bandwidth (zero, negative, NaN or
    /// infinite).
    #[error("link bandwidth {0} B/s is not a positive finite number; configure the uplink rate, e.g. \"18Mbit/s\"")]
    BadBandwidth(f64),
}

/// Eq. 5-6: the paper's two-transfer method. Transfers of `size1` and `size2`
/// bytes that took `t1` and `t2` give the line `T = T_sc + US / Th_up`
/// through both points.
///
/// A slightly negative `T_sc` (timing noise on a link with almost no fixed
/// cost) is reported as zero, keeping the fitted bandwidth.
pub fn two_transfer_probe(
    size1: u64,
    t1: Duration,
    size2: u64,
    t2: Duration,
) -> Result<LinkEstimate, LinkEstimateError> {
    if size1 == size2 {
        return Err(LinkEstimateError::SameSize(size1, size2));
    }
    let ((s_small, t_small), (s_large, t_large)) = if size1 < size2 {
        ((size1, t1), (size2, t2))
    } else {
        ((size2, t2), (size1, t1))
    };
    let dt = t_large.as_secs_f64() - t_small.as_secs_f64();
    if dt <= 0.0 {
        return Err(LinkEstimateError::NotSlower {
            smaller: s_small,
            larger: s_large,
        });
    }
    let secs_per_byte = dt / (s_large - s_small) as f64;
    let fixed = t_small.as_secs_f64() - secs_per_byte * s_small as f64;
    Ok(LinkEstimate::from_line(secs_per_byte, fixed))
}

/// How the current estimate was obtained, for metrics and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FitKind {
    /// No transactions yet: the configured prior.
    Prior,
    /// Sizes too alike: `T_sc` held at the anchor, bandwidth fitted.
    BandwidthOnly,
    /// Both constants fitted by Theil–Sen.
    Full,
}

/// A fixed-capacity ring of `(x, y)` points, oldest overwritten first. The
/// fits do not care about order, so the live points are simply the first
/// `len` slots.
#[derive(Debug, Clone)]
pub(crate) struct Window {
    x: [f64; WINDOW],
    y: [f64; WINDOW],
    len: usize,
    next: usize,
}

impl Window {
    pub(crate) const fn new() -> Self {
        Window {
            x: [0.0; WINDOW],
            y: [0.0; WINDOW],
            len: 0,
            next: 0,
        }
    }

    pub(crate) fn push(&mut self, x: f64, y: f64) {
        self.x[self.next] = x;
        self.y[self.next] = y;
        self.next = (self.next + 1) % WINDOW;
        self.len = (self.len + 1).min(WINDOW);
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn xs(&self) -> &[f64] {
        &self.x[..self.len]
    }

    pub(crate) fn ys(&self) -> &[f64] {
        &self.y[..self.len]
    }

    /// A scratch copy of the x slots, for in-place medians.
    pub(crate) fn xs_copy(&self) -> [f64; WINDOW] {
        self.x
    }

    /// A scratch copy of the y slots, for in-place medians.
    pub(crate) fn ys_copy(&self) -> [f64; WINDOW] {
        self.y
    }
}

/// Median of `v` (reordered in place); NaN-free input assumed, empty gives
/// NaN.
pub(crate) fn median(v: &mut [f64]) -> f64 {
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    let mid = n / 2;
    let (lower, upper, _) = v.select_nth_unstable_by(mid, f64::total_cmp);
    let upper = *upper;
    if n % 2 == 1 {
        upper
    } else {
        let below = lower.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        0.5 * (below + upper)
    }
}

/// Theil–Sen line `y = slope * x + intercept` over the points whose `x`
/// differ enough ([`MIN_RELATIVE_SPREAD`]); `None` with fewer than
/// [`MIN_DIVERSE_PAIRS`] such pairs, or when fewer than
/// [`MIN_AGREEING_SLOPES`] of them rise (the slope is not measured). No allocation: the pairwise slopes live
/// on the stack (16 KiB for a full window).
pub(crate) fn theil_sen(xs: &[f64], ys: &[f64]) -> Option<(f64, f64)> {
    debug_assert_eq!(xs.len(), ys.len());
    debug_assert!(xs.len() <= WINDOW);
    let n = xs.len();
    let mut slopes = [0.0f64; MAX_PAIRS];
    let mut m = 0;
    for i in 0..n {
        for j in (i + 1)..n {
            let dx = xs[j] - xs[i];
            let scale = xs[i].abs().max(xs[j].abs());
            if dx != 0.0 && dx.abs() >= MIN_RELATIVE_SPREAD * scale {
                slopes[m] = (ys[j] - ys[i]) / dx;
                m += 1;
            }
        }
    }
    if m < MIN_DIVERSE_PAIRS {
        return None;
    }
    let rising = slopes[..m].iter().filter(|s| **s > 0.0).count();
    if (rising as f64) < MIN_AGREEING_SLOPES * m as f64 {
        return None;
    }
    let slope = median(&mut slopes[..m]);
    let mut resid = [0.0f64; WINDOW];
    for k in 0..n {
        resid[k] = ys[k] - slope * xs[k];
    }
    let intercept = median(&mut resid[..n]);
    (slope.is_finite() && intercept.is_finite()).then_some((slope, intercept))
}

/// The relative standard error of `slope` fitted to the points: the spread
/// of the residuals from the line (1.4826 times their median absolute
/// value, a robust standard deviation) over the rise the slope gives
/// across the sizes' standard deviation, times the square root of the
/// number of points (least squares' standard error, used as an estimate
/// for Theil–Sen's). Zero for points exactly on the line; infinite for a
/// slope that is not positive.
pub(crate) fn slope_error(xs: &[f64], ys: &[f64], slope: f64, intercept: f64) -> f64 {
    let n = xs.len();
    if n == 0 || slope <= 0.0 || !slope.is_finite() {
        return f64::INFINITY;
    }
    let mean = xs.iter().sum::<f64>() / n as f64;
    let sd_x = (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64).sqrt();
    let mut resid = [0.0f64; WINDOW];
    for k in 0..n {
        resid[k] = (ys[k] - slope * xs[k] - intercept).abs();
    }
    let sigma = 1.4826 * median(&mut resid[..n]);
    sigma / (slope * sd_x * (n as f64).sqrt())
}

/// Median of `(y - fixed) / x` over points with `x > 0`: the slope of a line
/// with a known intercept. `None` when no point has `x > 0`.
pub(crate) fn slope_through(xs: &[f64], ys: &[f64], fixed: f64) -> Option<f64> {
    let mut per = [0.0f64; WINDOW];
    let mut m = 0;
    for (x, y) in xs.iter().zip(ys) {
        if *x > 0.0 {
            per[m] = (y - fixed) / x;
            m += 1;
        }
    }
    (m > 0).then(|| median(&mut per[..m]))
}

/// Seconds as a `Duration`, saturating on infinities and NaN.
pub(crate) fn secs_to_duration(s: f64) -> Duration {
    if s.is_finite() && s >= 0.0 {
        Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX)
    } else if s.is_nan() || s < 0.0 {
        Duration::ZERO
    } else {
        Duration::MAX
    }
}

/// Online estimate of `Th_up` and `T_sc` from completed transactions.
///
/// Each [`observe`](Self::observe) refits (O([`WINDOW`]²), no allocation);
/// [`estimate`](Self::estimate) returns the cached result.
#[derive(Debug, Clone)]
pub struct LinkEstimator {
    prior: LinkEstimate,
    /// `T_sc` used when the window cannot fit it: the prior, then the last
    /// fitted value.
    anchor_secs: f64,
    window: Window,
    current: LinkEstimate,
    kind: FitKind,
}

impl LinkEstimator {
    /// Starts from the configured `prior` (e.g. the link's nominal rate and a
    /// round trip as `T_sc`).
    pub fn new(prior: LinkEstimate) -> Result<Self, LinkEstimateError> {
        let bw = prior.bytes_per_sec;
        if !(bw.is_finite() && bw > 0.0) {
            return Err(LinkEstimateError::BadBandwidth(bw));
        }
        let prior = prior.clamped();
        Ok(LinkEstimator {
            prior,
            anchor_secs: prior.per_transaction.as_secs_f64(),
            window: Window::new(),
            current: prior,
            kind: FitKind::Prior,
        })
    }

    /// Records a completed transaction of `bytes` that took `elapsed` (from
    /// the first byte handed to the link to its acknowledgement) and refits.
    /// A zero `elapsed` is a timing glitch and is ignored.
    pub fn observe(&mut self, bytes: u64, elapsed: Duration) {
        if elapsed.is_zero() {
            return;
        }
        self.window.push(bytes as f64, elapsed.as_secs_f64());
        self.refit();
    }

    /// The current estimate (cached; O(1)).
    #[inline]
    pub fn estimate(&self) -> LinkEstimate {
        self.current
    }

    /// How [`estimate`](Self::estimate) was obtained.
    pub fn fit_kind(&self) -> FitKind {
        self.kind
    }

    /// The configured prior.
    pub fn prior(&self) -> LinkEstimate {
        self.prior
    }

    /// Transactions in the window.
    pub fn len(&self) -> usize {
        self.window.len()
    }

    /// True before the first transaction.
    pub fn is_empty(&self) -> bool {
        self.window.len() == 0
    }

    fn refit(&mut self) {
        let (xs, ys) = (self.window.xs(), self.window.ys());
        if let Some((slope, intercept)) = theil_sen(xs, ys) {
            // A line within its timing noise is no measurement: hold
            // T_sc and say so (the egress publishes only full fits).
            if slope > 0.0 && slope_error(xs, ys, slope, intercept) <= MAX_SLOPE_ERROR {
                let fixed = intercept.clamp(0.0, MAX_PER_TRANSACTION.as_secs_f64());
                self.anchor_secs = fixed;
                self.current = LinkEstimate::from_line(slope, fixed);
                self.kind = FitKind::Full;
                return;
            }
        }
        // Too little size diversity (or a non-increasing line): hold T_sc.
        let mut fixed = self.anchor_secs;
        let slope = match slope_through(xs, ys, fixed) {
            Some(s) if s > 0.0 => Some(s),
            Some(_) => {
                let mut t = self.window.ys_copy();
                fixed = FALLBACK_FIXED_SHARE * median(&mut t[..self.window.len()]);
                slope_through(xs, ys, fixed).filter(|s| *s > 0.0)
            }
            None => {
                // Only empty transactions: they measure T_sc alone.
                let mut t = self.window.ys_copy();
                fixed = median(&mut t[..self.window.len()]);
                None
            }
        };
        let slope = slope.unwrap_or(1.0 / self.prior.bytes_per_sec);
        self.current = LinkEstimate::from_line(slope, fixed);
        self.kind = FitKind::BandwidthOnly;
    }
}

/// Confirmations of a busy link over which its rate is measured
/// ([`LinkTimer`]): enough to average out a broker's bunched confirms, few
/// enough to follow a changing link within seconds.
pub const BUSY_SPAN: usize = 16;

/// Fewest intervals between confirmations of a busy link before their
/// span says more than one transaction does.
pub const MIN_BUSY_SPAN: usize = 4;

/// Shortest time a busy link's rate is measured over: where the last
/// [`BUSY_SPAN`] confirmations came closer together than this (one
/// bunch: RabbitMQ confirmed 40 small batches within 0.3 ms after they
/// had queued 0.7 s behind a 1 Mbit/s link), the span reaches back to
/// the confirmations before them. Over the bunch alone, its bytes in no
/// time read as a link of 13-97 MB/s, and that fit was acted on.
pub const MIN_BUSY_TIME: Duration = Duration::from_millis(5);

/// Most confirmations of a busy period kept, to reach [`MIN_BUSY_TIME`]
/// back.
pub const MAX_BUSY: usize = 256;

/// How the link served each confirmed transaction: the time Eq. 1
/// charges it, and whether it was sent while the link was still busy with
/// earlier ones (saturated). Times are offsets from the egress's epoch.
///
/// A transaction sent once the link was free of the one before (that one
/// left the link `T_sc` before its confirmation) is timed from its send:
/// `T_sc + US / Th_up` as measured. One sent while the link was still busy
/// waited for it; the link carried it at the rate it carried the whole
/// busy period, measured over the last [`BUSY_SPAN`] confirmations, so its
/// time is `T_sc` plus its bytes at that rate. One confirmation alone would
/// not do: a broker confirms in bunches after its fsyncs, so the gap before
/// one confirmation is nothing or a whole fsync; and timing from the
/// previous confirmation, as weir did, counts a paced sender's idle gaps as
/// transfer (in the real-process JANUS lab, 1.8 MB/s on a 2.12 MB/s
/// uplink, and `C_out` followed it down).
#[derive(Debug, Clone, Default)]
pub struct LinkTimer {
    /// When the last transaction was confirmed.
    last_confirmed: Duration,
    /// The confirmations (time, bytes) of the link's current busy period.
    busy: VecDeque<(Duration, u64)>,
    /// One bit per recent confirmation (the last 64, newest lowest): sent
    /// behind others.
    saturated: u64,
}

impl LinkTimer {
    /// A transaction of `bytes` sent at `started` was confirmed `now`, with
    /// `t_sc` the fixed time in force; `link_time` is its time where the
    /// sink knows it (an emulated link, which counts as saturated
    /// throughout). Returns the time to charge it.
    pub fn confirmed(
        &mut self,
        started: Duration,
        now: Duration,
        t_sc: Duration,
        bytes: u64,
        link_time: Option<Duration>,
    ) -> Duration {
        let (elapsed, behind) = match link_time {
            Some(t) => (t, true),
            None => self.served(started, now, t_sc, bytes),
        };
        self.saturated = (self.saturated << 1) | u64::from(behind);
        self.last_confirmed = now;
        elapsed
    }

    /// Of the last 64 confirmations, how many were sent behind others.
    pub fn saturated(&self) -> u32 {
        self.saturated.count_ones()
    }

    fn served(
        &mut self,
        started: Duration,
        now: Duration,
        t_sc: Duration,
        bytes: u64,
    ) -> (Duration, bool) {
        let free_of_the_one_before = self.last_confirmed.saturating_sub(t_sc);
        let behind = started < free_of_the_one_before;
        if !behind {
            self.busy.clear();
        }
        self.busy.push_back((now, bytes));
        if self.busy.len() > MAX_BUSY {
            self.busy.pop_front();
        }
        if behind && self.busy.len() > MIN_BUSY_SPAN {
            // The last BUSY_SPAN intervals, or more to span MIN_BUSY_TIME.
            let mut i = self.busy.len().saturating_sub(BUSY_SPAN + 1);
            while i > 0 && now.saturating_sub(self.busy[i].0) < MIN_BUSY_TIME {
                i -= 1;
            }
            let first = self.busy[i].0;
            let carried: u64 = self.busy.iter().skip(i + 1).map(|b| b.1).sum();
            let span = now.saturating_sub(first);
            if carried > 0 && !span.is_zero() {
                return (t_sc + span.mul_f64(bytes as f64 / carried as f64), true);
            }
        }
        (
            now.saturating_sub(started.max(free_of_the_one_before)),
            behind,
        )
    }
}

/// The share of a link's nominal rate that carries what a sender writes
/// to a TCP socket over IPv4 and Ethernet: 1,448 bytes of segment payload
/// (the MSS with TCP timestamps) per 1,514-byte frame. The operator's
/// `scheduler.uplink` is the link's nominal rate (what its contract says,
/// what `tc` shapes); the estimator measures batch bytes, so its prior is
/// this share of it ([`payload_prior`]). Without it an idle node started
/// (and, without evidence of a saturated link, stayed) 4.6 % above what
/// its link could carry: in the real-process JANUS lab the busy nodes' and
/// providers' `tbf` queues reached 100-150 kB in the first second of load,
/// and with `C_out` 1.5 % under the link they took seconds to drain, so
/// most late `ls` records of a run came in its first 2.5 s.
pub const PAYLOAD_SHARE: f64 = 1448.0 / 1514.0;

/// The estimator's prior for a link of `nominal` rate: its bandwidth in
/// what TCP carries ([`PAYLOAD_SHARE`]), `T_sc` as configured.
pub fn payload_prior(nominal: LinkEstimate) -> LinkEstimate {
    LinkEstimate {
        bytes_per_sec: nominal.bytes_per_sec * PAYLOAD_SHARE,
        per_transaction: nominal.per_transaction,
    }
}

/// Transactions among the last [`WINDOW`] that must have been sent while
/// the link was still busy with earlier ones before a fit may put the
/// bandwidth below the configured prior ([`to_act_on`]).
pub const MIN_SATURATED: u32 = 8;

/// Transactions among the last [`WINDOW`] that must have been sent while
/// the link was still busy before a fit may put the bandwidth more than
/// [`ABOVE_PRIOR`] above the prior ([`to_act_on`]).
pub const MIN_SATURATED_ABOVE: u32 = 48;

/// How far above the prior a fit may put the bandwidth on less evidence
/// than [`MIN_SATURATED_ABOVE`]: the fit's own jitter.
pub const ABOVE_PRIOR: f64 = 0.02;

/// The estimate to act on (`C_out`, the spare a node advertises to its
/// peers) from a `fit`, the configured `prior` and how many of the last
/// [`WINDOW`] transactions were `saturated` (sent behind others).
///
/// Transactions that each had the link to themselves time the whole round
/// trip, and a broker's confirm costs more for more bytes (it writes and
/// syncs them): such a fit is a lower bound of what the link carries when
/// kept busy. An idle node measured that way advertised 0.4-1.7 MB/s of
/// a 2.25 MB/s uplink in the real-process JANUS lab. So without evidence
/// of a saturated link the bandwidth stays at least the operator's prior
/// (`scheduler.uplink`); once the link has been seen saturated the fit
/// stands lower.
///
/// Higher, it needs more: a fit more than [`ABOVE_PRIOR`] above the prior
/// stands only once [`MIN_SATURATED_ABOVE`] of the last [`WINDOW`]
/// transactions were saturated, and the prior's bandwidth is acted on
/// until then. The first fits of a link that has just become busy (a
/// provider taking its first redirected records, any node at a step of
/// load) rest on few transactions of similar sizes, and in the
/// real-process JANUS lab they read up to 1.5 times the shaped rate: the
/// node set `C_out` there, filled its `tbf` queue and advertised spare it
/// did not have, and most late `ls` records of a run came in its first
/// 2.5 s. A prior set too low is still corrected, after 48 busy
/// transactions (half a second on a busy 4G link). `T_sc` is the fit's
/// either way.
pub fn to_act_on(fit: LinkEstimate, prior: LinkEstimate, saturated: u32) -> LinkEstimate {
    if fit.bytes_per_sec > prior.bytes_per_sec * (1.0 + ABOVE_PRIOR)
        && saturated < MIN_SATURATED_ABOVE
    {
        return LinkEstimate {
            bytes_per_sec: prior.bytes_per_sec,
            per_transaction: fit.per_transaction,
        };
    }
    if saturated >= MIN_SATURATED {
        return fit;
    }
    LinkEstimate {
        bytes_per_sec: fit.bytes_per_sec.max(prior.bytes_per_sec),
        per_transaction: fit.per_transaction,
    }
}

/// How long the round-trip floor is remembered ([`QueueWatch`]): as BBR's
/// `min_rtt` window, long enough that a link kept busy for a while still
/// has a floor from before, short enough to follow a route that changed.
pub const FLOOR_WINDOW: Duration = Duration::from_secs(10);

/// Confirmations over which [`QueueWatch`] takes the median excess round
/// trip: enough to see through a broker's bunched confirms.
pub const QUEUE_SPAN: usize = 16;

/// A queue on the link ([`QueueWatch::queued`]): the recent round trips'
/// median more than this above the floor. Above timing noise: idle nodes
/// in the real-process JANUS lab (4G, RabbitMQ) showed medians of 2-5 ms;
/// nodes whose `tbf` queue held 20-40 kB (10-17 ms), 11-25 ms.
pub const QUEUE_EVIDENCE: Duration = Duration::from_millis(8);

/// Most entries a [`WindowedExtreme`] keeps (a monotonic run of samples
/// within its window); past it the oldest go first.
const EXTREME_ENTRIES: usize = 4096;

/// Which extreme a [`WindowedExtreme`] keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extreme {
    /// The highest sample of the window.
    Highest,
    /// The lowest sample of the window.
    Lowest,
}

/// The highest or lowest sample of a sliding time window (BBR's `max_bw`
/// and `min_rtt` filters): a monotonic queue whose front is the window's
/// best, each sample pushed and popped once.
#[derive(Debug, Clone, Default)]
pub struct WindowedExtreme {
    /// (when, value), the front the best.
    samples: VecDeque<(Duration, f64)>,
}

impl WindowedExtreme {
    /// Adds `value` at `now`; samples older than `window` leave.
    pub fn push(&mut self, now: Duration, value: f64, window: Duration, keep: Extreme) {
        let beaten = |v: f64| match keep {
            Extreme::Highest => v <= value,
            Extreme::Lowest => v >= value,
        };
        while self.samples.back().is_some_and(|(_, v)| beaten(*v)) {
            self.samples.pop_back();
        }
        self.samples.push_back((now, value));
        while self.samples.len() > EXTREME_ENTRIES
            || self
                .samples
                .front()
                .is_some_and(|(t, _)| now.saturating_sub(*t) > window)
        {
            self.samples.pop_front();
        }
    }

    /// The window's best, if it holds a sample.
    pub fn best(&self) -> Option<f64> {
        self.samples.front().map(|(_, v)| *v)
    }
}

/// Whether the link holds a queue, from the round trips of confirmed
/// transactions (send to confirmation): the recent median against the
/// lowest round trip of transactions of about the same size within
/// [`FLOOR_WINDOW`], the round trip of an empty link for that size.
///
/// A sender paced below its link (`C_out` under what the link carries)
/// never fills it, and every measure of the link's rate taken from its
/// confirmations then reads the sender's rate: the estimate follows
/// `C_out` and `C_out` the estimate ([`Climb`]). A queue is what shows the
/// link, not the sender, set the pace.
///
/// Round trips are compared within size classes (batches of
/// `2^(k-1)..2^k` bytes), with nothing subtracted: no rate to be wrong
/// about. Subtracting each transaction's bytes at a nominal rate instead
/// reads false queues wherever the link is faster than that rate: a large
/// batch's transfer at the nominal rate is far more than its own, the
/// floor it sets far too low, and every smaller batch reads as queued
/// (tens of milliseconds on an idle 100 Mbit/s link under the 18 Mbit/s
/// prior, which kept the climb back towards the prior from ever starting
/// there: docs/lab/link-sweep.md).
#[derive(Debug, Clone, Default)]
pub struct QueueWatch {
    /// The lowest round trip of each size class within [`FLOOR_WINDOW`],
    /// in seconds.
    floors: Vec<WindowedExtreme>,
    /// The last [`QUEUE_SPAN`] round trips above their size class's floor.
    recent: VecDeque<f64>,
    /// Their median, kept as each confirmation comes (read twice a
    /// confirmation: the gauge and [`QueueWatch::queued`]).
    queue: Duration,
}

impl QueueWatch {
    /// A transaction of `bytes` confirmed at `now`, `round_trip` after it
    /// was sent.
    pub fn confirmed(&mut self, now: Duration, round_trip: Duration, bytes: u64) {
        let class = (u64::BITS - bytes.leading_zeros()) as usize;
        if self.floors.len() <= class {
            self.floors.resize_with(class + 1, WindowedExtreme::default);
        }
        let raw = round_trip.as_secs_f64();
        let floor = &mut self.floors[class];
        floor.push(now, raw, FLOOR_WINDOW, Extreme::Lowest);
        self.recent
            .push_back((raw - floor.best().unwrap_or(raw)).max(0.0));
        if self.recent.len() > QUEUE_SPAN {
            self.recent.pop_front();
        }
        self.queue = secs_to_duration(span_median(&self.recent));
    }

    /// Whether the link is quiet: on a full span, the queue is at most
    /// [`QUEUE_EVIDENCE`]. The bandwidth probe's test
    /// ([`crate::delivery::probe`]).
    pub fn quiet(&self) -> bool {
        self.recent.len() >= QUEUE_SPAN && self.queue <= QUEUE_EVIDENCE
    }

    /// The median round trip above its size class's floor over the last
    /// [`QUEUE_SPAN`] confirmations: the link's queue, in time.
    pub fn queue(&self) -> Duration {
        self.queue
    }

    /// Whether the link holds a queue: [`QueueWatch::queue`] over
    /// [`QUEUE_EVIDENCE`], on a full span.
    pub fn queued(&self) -> bool {
        self.recent.len() >= QUEUE_SPAN && self.queue() > QUEUE_EVIDENCE
    }
}

/// The median of up to [`QUEUE_SPAN`] values.
fn span_median(values: &VecDeque<f64>) -> f64 {
    let mut v = [0.0f64; QUEUE_SPAN + 1];
    let n = values.len().min(QUEUE_SPAN + 1);
    for (slot, r) in v.iter_mut().zip(values) {
        *slot = *r;
    }
    median(&mut v[..n])
}

/// How fast the bandwidth acted on climbs back towards the prior while the
/// link holds no queue ([`Climb`]): this share of itself per second.
///
/// A share of itself, not of the prior: on a link far under the prior
/// (1 Mbit/s under the default 18 Mbit/s), a climb at a fifth of the prior
/// a second rose by a fifth of the link within 50 ms of the queue's
/// clearing, ahead of anything the confirmations could show, and the
/// queue it built took seconds to drain (in the link sweep, 81 of 108
/// late `ls` records of a run came in the two seconds after one such
/// climb).
pub const CLIMB_PER_SEC: f64 = 0.2;

/// The estimate acted on (`C_out`, the spare advertised to peers): what
/// [`to_act_on`] makes of each full fit (any fit while the link holds a
/// queue, [`QueueWatch::queued`]; under the prior, never more than
/// [`DELIVERED_AHEAD`] of the rate delivered, [`Climb::observe`]), and,
/// while it holds none, never less than a climb back towards the prior at
/// [`CLIMB_PER_SEC`], nor than [`DELIVERED_FLOOR`] of the mean delivery
/// rate of the last seconds (up to the prior).
///
/// Once a low fit is acted on, the node sends at that rate and its link
/// never fills: every later transaction is timed at the rate it was sent
/// at, the fits read the same or a little less (tokens lost, pauses), and
/// nothing brings the estimate back up. In the real-process JANUS lab a
/// provider whose first busy fits read half its link (taken while its load
/// rose, from round trips that grew with its first batches) stayed under
/// 0.75 of it for 8 s; runs where one node did so were the ones under 95 %
/// of the limit at 1 KiB. The climb is the probe: with no queue, the rate
/// rises until the link shows one (or the prior is reached), and then the
/// fits, taken from a link that sets the pace, stand.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Climb {
    value: LinkEstimate,
    at: Duration,
    /// What [`Climb::observe`] last returned (the prior at first).
    published: LinkEstimate,
}

impl Climb {
    /// Acting on `prior` from `now`.
    pub fn new(prior: LinkEstimate, now: Duration) -> Self {
        Self {
            value: prior,
            at: now,
            published: prior,
        }
    }

    /// The estimate acted on.
    pub fn value(&self) -> LinkEstimate {
        self.value
    }

    /// A transaction confirmed at `now`, with `fit` the estimator's full
    /// fit if it has one, `saturated` as [`to_act_on`] takes it and
    /// `queued` whether the link holds a queue. Returns the estimate to act
    /// on.
    pub fn update(
        &mut self,
        now: Duration,
        fit: Option<LinkEstimate>,
        prior: LinkEstimate,
        saturated: u32,
        queued: bool,
    ) -> LinkEstimate {
        let seen = Seen {
            saturated,
            queued,
            carried: 0.0,
            delivered: 0.0,
        };
        self.update_at_least(now, fit, prior, seen)
    }

    /// [`Climb::update`] with what else was `seen`: never under what the
    /// link has shown it carries where that is above the prior
    /// ([`Seen::carried`]: [`CarriedBound`], and rates the bandwidth probe
    /// proved), and with no queue never under [`DELIVERED_FLOOR`] of the
    /// rate delivered ([`Seen::delivered`]), up to the prior.
    pub fn update_at_least(
        &mut self,
        now: Duration,
        fit: Option<LinkEstimate>,
        prior: LinkEstimate,
        seen: Seen,
    ) -> LinkEstimate {
        let mut next = fit.map_or(self.value, |f| to_act_on(f, prior, seen.saturated));
        if !seen.queued && next.bytes_per_sec < prior.bytes_per_sec {
            let dt = now.saturating_sub(self.at).as_secs_f64();
            // Never under what the link delivered lately either: a fit
            // acted on in a moment's queue (or read from the sender's own
            // pace) is no reason to climb back over seconds. At 100 Mbit/s,
            // 5 ms from the broker, one such fit put the estimate at a
            // quarter of the prior, and the climb took the rest of the run,
            // with a quarter of `ls` late. The mean over seconds, not the
            // highest bin: on a 1 Mbit/s link a bunch of confirmations made
            // one bin read 744 kB/s, and lifted to that the link queued a
            // second.
            let climbed = (self.value.bytes_per_sec * (1.0 + CLIMB_PER_SEC * dt))
                .max(DELIVERED_FLOOR * seen.delivered)
                .min(prior.bytes_per_sec);
            next.bytes_per_sec = next.bytes_per_sec.max(climbed);
        }
        // Only above the prior: below it, the fits and the climb find the
        // link ([`CarriedBound`] says why a sample there is no floor).
        if seen.carried.is_finite() && seen.carried > prior.bytes_per_sec {
            next.bytes_per_sec = next.bytes_per_sec.max(seen.carried);
        }
        self.value = next;
        self.at = now;
        next
    }

    /// A transaction confirmed at `now` with the estimator's `fit`
    /// (`full`: a full fit, not one with `T_sc` held) and what else was
    /// `seen`: [`Climb::update_at_least`],
    /// and the estimate to publish if there is one to publish.
    ///
    /// Only a window of varied sizes separates `T_sc` from bandwidth; small
    /// alike batches (an idle link) say little about the bandwidth, and
    /// acting on them would shrink `C_out` and the spare a node offers its
    /// peers, so a fit with `T_sc` held is not acted on. With a queue on
    /// the link, though, the batches went out back to back and were timed
    /// at the rate the link carried them ([`LinkTimer`]): that fit's
    /// bandwidth is the link's, and acting on it is what drains the queue
    /// (in the real-process lab, a node sending batches of alike sizes at
    /// 480 B records kept `C_out` at the prior, above what its link
    /// carried, and its `tbf` queue grew to 100 kB). A fit acted on is
    /// published; a climb alone once it has risen [`CLIMB_STEP`] above what
    /// was last published (the scheduler is not woken for every
    /// confirmation).
    pub fn observe(
        &mut self,
        now: Duration,
        fit: LinkEstimate,
        full: bool,
        prior: LinkEstimate,
        seen: Seen,
    ) -> Option<LinkEstimate> {
        let acted = (full || seen.queued).then(|| {
            let mut acted = fit;
            // Under the prior, a fit lifts the estimate no further than a
            // little above what the sender delivered.
            let ahead = (DELIVERED_AHEAD * seen.delivered).max(self.value.bytes_per_sec);
            if seen.delivered > 0.0 && ahead < prior.bytes_per_sec {
                acted.bytes_per_sec = acted.bytes_per_sec.min(ahead);
            }
            acted
        });
        let next = self.update_at_least(now, acted, prior, seen);
        let risen = next.bytes_per_sec > self.published.bytes_per_sec * (1.0 + CLIMB_STEP);
        (acted.is_some() || risen).then(|| {
            self.published = next;
            next
        })
    }
}

/// What the egress has seen of the link besides the fit, as
/// [`Climb::observe`] takes it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Seen {
    /// Of the last [`WINDOW`] transactions, how many were sent behind
    /// others ([`LinkTimer::saturated`]).
    pub saturated: u32,
    /// Whether the link holds a queue ([`QueueWatch::queued`]).
    pub queued: bool,
    /// What transactions showed the link carries ([`CarriedBound::bound`]).
    pub carried: f64,
    /// The sender's mean delivery rate over the last seconds, bytes per
    /// second (0 unknown): with a queue on the link, what the link carries.
    pub delivered: f64,
}

/// How far above the sender's mean delivery rate (or the estimate acted
/// on, if higher) a fit may lift an estimate under the prior
/// ([`Climb::observe`]). A fit from the last few dozen transactions
/// scatters: at 4 Mbit/s 5 ms from the broker, under a queue, fits of
/// 1.3-19.7 MB/s on a link carrying 480 kB/s, from round trips bunched by
/// the broker's fsyncs; at 4 Mbit/s 50 ms away, without one, fits of
/// 560-710 kB/s. Acting on one that read high filled the link's queue at
/// once (45 % of `ls` late at 50 ms). The rate delivered over seconds is
/// what the link carried, or what the sender had to send; past a little
/// above it, the climb finds the link. Over the prior [`to_act_on`] and
/// the floors rule instead: on loopback the fits run far ahead of the rate
/// delivered, and the estimate must too for the pipe to grow.
pub const DELIVERED_AHEAD: f64 = 1.1;

/// The share of the sender's mean delivery rate under which the estimate
/// acted on does not fall while the link holds no queue
/// ([`Climb::observe`]), up to the prior; the climb goes on from there.
pub const DELIVERED_FLOOR: f64 = 0.9;

/// How long [`CarriedBound`] remembers its highest sample.
pub const CARRIED_WINDOW: Duration = Duration::from_secs(10);

/// A lower bound of the link's bandwidth that no timing artefact can
/// inflate: a transaction of `bytes` confirmed `round_trip` after its send
/// began crossed the link within that round trip, so the link carries at
/// least `bytes / round_trip` (more where a propagation delay or a
/// broker's work is in the round trip, or other bytes shared the link).
/// The highest such sample of the last [`CARRIED_WINDOW`] is a floor for
/// the estimate acted on ([`Climb::update_at_least`]) where it is above
/// the prior.
///
/// Without it a node paced by its own estimate never shows its link to be
/// faster: with the default 18 Mbit/s prior and a RabbitMQ on loopback,
/// token-paced batches of 2 kB went one per millisecond, each timed at the
/// rate it was sent at, and a durable queue's confirm cadence (10-30 ms)
/// read as a queue on the link, so nothing lifted `C_out` above the prior:
/// 1,970 records/s of 1 KiB. Those same batches each crossed the link in
/// under half a millisecond, which says the link carries at least 5 MB/s;
/// acting on that lets tokens gather larger batches, whose round trips say
/// more, until the link's own time (or the broker's) shows in the round
/// trip.
///
/// Below the prior it is no floor. A shaper's token bucket lets a burst of
/// its size cross at line rate, and where the bucket holds more than the
/// link carries in a round trip a small batch crosses in one round trip
/// whatever the rate: on a 1 Mbit/s link 5 ms from the broker, with the
/// lab's `tbf` bucket of 3,028 bytes (the link carries 597 in a round
/// trip), batches of 1-1.5 kB read 142-310 kB/s on a link carrying
/// 119.5 kB/s; held for the window, that floor sent a fifth to half more
/// than the link carried and 84 % of the urgent class came late. Below the
/// prior the estimator's fits and the climb back towards the prior find
/// the link; above it, a sample takes more bytes in a round trip than a
/// bucket holds (10.7 kB within 5 ms over the default 18 Mbit/s prior).
#[derive(Debug, Clone, Default)]
pub struct CarriedBound {
    /// The highest bytes per second.
    samples: WindowedExtreme,
}

impl CarriedBound {
    /// A transaction of `bytes` confirmed at `now`, `round_trip` after its
    /// send began.
    pub fn confirmed(&mut self, now: Duration, bytes: u64, round_trip: Duration) {
        if round_trip.is_zero() || bytes == 0 {
            return;
        }
        let rate = bytes as f64 / round_trip.as_secs_f64();
        self.samples
            .push(now, rate, CARRIED_WINDOW, Extreme::Highest);
    }

    /// The highest bandwidth the link has shown within the window, bytes
    /// per second (0 without a sample).
    pub fn bound(&self) -> f64 {
        self.samples.best().unwrap_or(0.0)
    }
}

/// Least relative rise of the climb published on its own, without a fit
/// acted on ([`Climb::observe`]).
pub const CLIMB_STEP: f64 = 0.005;

#[cfg(test)]
pub(crate) mod tests;
