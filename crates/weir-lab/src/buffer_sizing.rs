//! Output-buffer sizing for an IoT edge router: Khan, Shahzad and Butt,
//! "Sizing Buffers of IoT Edge Routers", EdgeSys 2018 (Eq. 1-5), beside the
//! two prior rules that paper compares against.
//!
//! The model: during a congestion event the router drops `l` packets spread
//! over `n` flows, so the number of drops one flow sees is
//! `D ~ Binom(l, 1/n)` ([`DropDistribution`], Eq. 1). Each TCP Reno flow
//! halves its window once per dropped packet; flows that lost nothing keep
//! growing, by one MSS per RTT if long (fraction `alpha`) or doubling if short
//! (Eq. 2). The buffer must be large enough that, `l/n` RTTs after the event,
//! the flows still offer the link capacity `C` (Eq. 3-4); Eq. 5 is the closed
//! form for that buffer `B`.
//!
//! # Units
//! The paper's windows are in bytes (long flows grow by one MSS per RTT, the
//! buffer drains "the last byte"), so `C * T`, `MSS` and `B` are all in bytes
//! here: capacity in bytes per second (as in `weir_core::queueing::token_bucket`), RTT as
//! a [`Duration`], MSS in bytes, every size returned in bytes.
//!
//! # Reading the paper
//! - `Psi = sum_{d=1}^{l/n} E[N_d] / 2^d` has a real upper limit when `n`
//!   does not divide `l`; the paper says nothing more. We sum over the integer
//!   `d` with `1 <= d <= l/n` (floor), and keep `2^(l/n)` real-valued, both as
//!   printed.
//! - Eq. 5 is implemented exactly as printed (DESIGN.md section 4 transcribes
//!   it faithfully). Solving Eq. 2-4 by hand instead gives the bracket
//!   `(1 - alpha) 2^(l/n - 1) + alpha` where Eq. 5 prints
//!   `(1 - alpha) 2^(l/n) - alpha`; the two agree only when `E[N_0] = 0`
//!   (a single flow) or the brackets happen to coincide (`alpha = 1/2` at
//!   `l/n = 2`). [`khan_buffer_size`] follows Eq. 5, the form the paper
//!   evaluates; [`khan_buffer_size_rederived`] is the hand-solved form, and
//!   the lab (`weir-lab buffers`) runs both over a shaped link.
//! - The paper gives no worked numbers, and its values of `l` were measured
//!   but not published, so the tests check the algebra against an independent
//!   exact-arithmetic evaluation rather than against the paper's figures.
//!   With the paper's own setup (40 Mbit/s, T = 40.04 ms, MSS 1460,
//!   n = 10..100, alpha 1 or 0.75) no `l` from 1 to `12 n` gives a size
//!   between 0 and Appenzeller's, although Figs. 7-8 describe sizes near or
//!   below it; most come out at several `C T`. Treat the output with care.
//! - The denominator of Eq. 5 is negative for many inputs (every input with
//!   `l < n` and `alpha >= 2/3`, for instance, where `Psi` is an empty sum);
//!   no buffer satisfies the model there, so [`khan_buffer_size`] returns an
//!   error instead of a number.

use std::num::NonZeroU64;
use std::time::Duration;

/// Terms of `Psi` past this `d` cannot change the sum: each is at most
/// `2^-d`, which underflows to zero in `f64` beyond `d = 1074`.
const PSI_MAX_TERMS: u64 = 1075;

/// What the buffer is sized for: the six parameters of Eq. 5.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BufferSizingInput {
    /// `C`: access-link capacity, in bytes per second (not bits).
    pub capacity_bytes_per_sec: f64,
    /// `n`: flows sending through the router during a congestion event.
    pub flows: u64,
    /// `MSS`: TCP maximum segment size, in bytes (MTU minus 40 in the paper).
    pub mss_bytes: u32,
    /// `T`: average round-trip time without queueing in this router.
    pub rtt: Duration,
    /// `alpha`: expected fraction (0..=1, not percent) of flows that are long,
    /// i.e. in congestion avoidance.
    pub long_flow_fraction: f64,
    /// `l`: packets the router drops per congestion event (measured).
    pub drops_per_event: u64,
}

/// Why a buffer size could not be computed.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
pub enum BufferSizingError {
    /// `C` is zero, negative, infinite or NaN.
    #[error(
        "buffer sizing: capacity_bytes_per_sec must be a positive, finite number of bytes per second, got {0}"
    )]
    Capacity(f64),
    /// `T` is zero.
    #[error("buffer sizing: rtt must be longer than zero")]
    ZeroRtt,
    /// `C * T` does not fit in an `f64`.
    #[error("buffer sizing: capacity times rtt overflows; check capacity_bytes_per_sec and rtt")]
    BandwidthDelayOverflow,
    /// `n = 0`.
    #[error("buffer sizing: flows (n) must be at least 1")]
    NoFlows,
    /// `MSS = 0`.
    #[error("buffer sizing: mss_bytes must be at least 1")]
    ZeroMss,
    /// `alpha` outside `0..=1` (or NaN).
    #[error("buffer sizing: long_flow_fraction (alpha) must be a fraction within 0..=1, got {0}")]
    LongFlowFraction(f64),
    /// `l = 0`: without drops there is no congestion event to size for.
    #[error(
        "buffer sizing: drops_per_event (l) must be at least 1; Eq. 5 sizes for a congestion event, which drops packets"
    )]
    NoDrops,
    /// Eq. 5's denominator is negative, so no buffer satisfies the model.
    #[error(
        "buffer sizing: Eq. 5 denominator is {denominator} (negative) for flows = {flows}, drops_per_event = {drops_per_event}, long_flow_fraction = {long_flow_fraction}; the model has no solution here: raise drops_per_event relative to flows or lower long_flow_fraction"
    )]
    NegativeDenominator {
        /// `Psi + E[N_0]((1 - alpha) 2^(l/n) - alpha)`.
        denominator: f64,
        /// `n`.
        flows: u64,
        /// `l`.
        drops_per_event: u64,
        /// `alpha`.
        long_flow_fraction: f64,
    },
    /// Eq. 5 gives a buffer too large for an `f64` (denominator zero or
    /// nearly so).
    #[error(
        "buffer sizing: Eq. 5 gives an unbounded buffer for flows = {flows}, drops_per_event = {drops_per_event}; its denominator is zero or nearly so"
    )]
    Unbounded {
        /// `n`.
        flows: u64,
        /// `l`.
        drops_per_event: u64,
    },
}

impl BufferSizingInput {
    /// Checks every parameter, reporting the first that is out of range.
    pub fn validate(&self) -> Result<(), BufferSizingError> {
        let c = self.capacity_bytes_per_sec;
        if !(c.is_finite() && c > 0.0) {
            return Err(BufferSizingError::Capacity(c));
        }
        if self.rtt.is_zero() {
            return Err(BufferSizingError::ZeroRtt);
        }
        if !self.bandwidth_delay_product_bytes().is_finite() {
            return Err(BufferSizingError::BandwidthDelayOverflow);
        }
        if self.flows == 0 {
            return Err(BufferSizingError::NoFlows);
        }
        if self.mss_bytes == 0 {
            return Err(BufferSizingError::ZeroMss);
        }
        if !(0.0..=1.0).contains(&self.long_flow_fraction) {
            return Err(BufferSizingError::LongFlowFraction(self.long_flow_fraction));
        }
        if self.drops_per_event == 0 {
            return Err(BufferSizingError::NoDrops);
        }
        Ok(())
    }

    /// `C * T` in bytes: the data in flight on an idle-queue path.
    pub fn bandwidth_delay_product_bytes(&self) -> f64 {
        self.capacity_bytes_per_sec * self.rtt.as_secs_f64()
    }

    /// The per-flow drop distribution `Binom(l, 1/n)` of Eq. 1.
    pub fn drop_distribution(&self) -> Result<DropDistribution, BufferSizingError> {
        let flows = NonZeroU64::new(self.flows).ok_or(BufferSizingError::NoFlows)?;
        Ok(DropDistribution::new(flows, self.drops_per_event))
    }
}

/// Eq. 1: drops one flow sees in a congestion event, `D ~ Binom(l, 1/n)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DropDistribution {
    flows: NonZeroU64,
    drops_per_event: u64,
}

impl DropDistribution {
    /// The distribution for `n` flows sharing `l` drops.
    pub fn new(flows: NonZeroU64, drops_per_event: u64) -> Self {
        DropDistribution {
            flows,
            drops_per_event,
        }
    }

    /// Eq. 1, `E[N_d] = C(l,d) (1/n)^d (1 - 1/n)^(l-d)`: the expected
    /// fraction of flows that lose exactly `d` packets (0 for `d > l`).
    pub fn expected_flows_with_drops(&self, d: u64) -> f64 {
        let l = self.drops_per_event;
        if d > l {
            return 0.0;
        }
        if self.flows.get() == 1 {
            // p = 1: the lone flow takes every drop (and ln q = -inf below).
            return if d == l { 1.0 } else { 0.0 };
        }
        (ln_binomial(l, d) + d as f64 * self.ln_p() + (l - d) as f64 * self.ln_q()).exp()
    }

    /// `E[N_0] = (1 - 1/n)^l`: the expected fraction of flows that lose nothing.
    pub fn expected_flows_without_drops(&self) -> f64 {
        self.expected_flows_with_drops(0)
    }

    /// `l / n`: mean drops per flow, and the RTTs after the event at which
    /// Eq. 4 asks the flows to fill the link again (the paper's `xi`).
    pub fn mean_drops_per_flow(&self) -> f64 {
        self.drops_per_event as f64 / self.flows.get() as f64
    }

    /// `Psi = sum_{d=1}^{floor(l/n)} E[N_d] / 2^d` (Eq. 5): the window the
    /// flows that lost packets keep, as a fraction of the pre-event window.
    pub fn psi(&self) -> f64 {
        let l = self.drops_per_event;
        let n = self.flows.get();
        let last = (l / n).min(PSI_MAX_TERMS);
        if n == 1 {
            // Only d = l has mass, and 1 <= l <= l/1 puts it in range.
            return if l == 0 {
                0.0
            } else if l <= PSI_MAX_TERMS {
                0.5f64.powi(l as i32)
            } else {
                0.0
            };
        }
        // ln E[N_d] by the recurrence E[N_d] = E[N_{d-1}] (l-d+1) / (d (n-1)),
        // in logs so that no factor overflows or underflows on its own.
        let ln_n_minus_1 = ((n - 1) as f64).ln();
        let mut ln_term = l as f64 * self.ln_q();
        let mut sum = 0.0;
        for d in 1..=last {
            ln_term += ((l - d + 1) as f64).ln() - (d as f64).ln() - ln_n_minus_1;
            sum += (ln_term - d as f64 * std::f64::consts::LN_2).exp();
        }
        sum
    }

    /// `E[N_0] 2^(l/n)`, formed in logs so that a huge `2^(l/n)` cannot
    /// meet an underflowed `E[N_0]` as `inf * 0`; it never exceeds 1.
    fn without_drops_times_growth(&self) -> f64 {
        if self.drops_per_event == 0 {
            return 1.0;
        }
        if self.flows.get() == 1 {
            return 0.0;
        }
        let l = self.drops_per_event as f64;
        (l * self.ln_q() + self.mean_drops_per_flow() * std::f64::consts::LN_2).exp()
    }

    /// `ln(1/n)`.
    fn ln_p(&self) -> f64 {
        -(self.flows.get() as f64).ln()
    }

    /// `ln(1 - 1/n)`, accurate for large `n`.
    fn ln_q(&self) -> f64 {
        (-1.0 / self.flows.get() as f64).ln_1p()
    }
}

/// `ln C(l, d)` as a sum of logs of the ratios `(l - k + i) / i`, which
/// neither overflows nor needs a log-gamma function.
fn ln_binomial(l: u64, d: u64) -> f64 {
    let k = d.min(l - d);
    (1..=k).map(|i| ((l - k + i) as f64 / i as f64).ln()).sum()
}

/// Eq. 5 of Khan et al.: the smallest output buffer, in bytes, that keeps
/// the access link busy through a congestion event.
///
/// ```text
/// B = (C T [1 - Psi - E[N_0]((1-alpha) 2^(l/n) - alpha)] - alpha l MSS E[N_0])
///     / (Psi + E[N_0]((1-alpha) 2^(l/n) - alpha))
/// ```
///
/// A negative result is clamped to 0: it means the flows that lost nothing
/// regrow enough to refill `C T` on their own, so the model asks for no
/// buffer, and a negative buffer has no meaning. A negative denominator is an
/// error ([`BufferSizingError::NegativeDenominator`]): there `W_a` shrinks as
/// `B` grows, and no buffer satisfies Eq. 4. A zero denominator, or one so
/// small that `B` overflows, is [`BufferSizingError::Unbounded`].
pub fn khan_buffer_size(input: &BufferSizingInput) -> Result<f64, BufferSizingError> {
    input.validate()?;
    let drops = input.drop_distribution()?;
    let alpha = input.long_flow_fraction;
    let e0 = drops.expected_flows_without_drops();
    let psi = drops.psi();
    let denominator = psi + (1.0 - alpha) * drops.without_drops_times_growth() - alpha * e0;
    if denominator.is_nan() || denominator < 0.0 {
        return Err(BufferSizingError::NegativeDenominator {
            denominator,
            flows: input.flows,
            drops_per_event: input.drops_per_event,
            long_flow_fraction: alpha,
        });
    }
    let ct = input.bandwidth_delay_product_bytes();
    let mss = f64::from(input.mss_bytes);
    let numerator = ct * (1.0 - denominator) - alpha * input.drops_per_event as f64 * mss * e0;
    let buffer = numerator / denominator;
    if !buffer.is_finite() {
        return Err(BufferSizingError::Unbounded {
            flows: input.flows,
            drops_per_event: input.drops_per_event,
        });
    }
    Ok(buffer.max(0.0))
}

/// Eq. 3-4 of Khan et al. solved for `B` by hand: the buffer at which the
/// average window `W_a` of Eq. 2, `l/n` RTTs after the event, again fills
/// `C T` (`n W_a = C T`, with `n W_b = B + C T`).
///
/// ```text
/// K = Psi + E[N_0]((1-alpha) 2^(l/n - 1) + alpha)
/// B = (C T (1 - K) - alpha l MSS E[N_0]) / K
/// ```
///
/// It differs from the printed Eq. 5 ([`khan_buffer_size`]) only in the
/// bracket: `2^(l/n - 1) + alpha` where Eq. 5 prints `2^(l/n) - alpha`.
/// `K` is never negative, so unlike Eq. 5 this form always has a solution;
/// a negative `B` is clamped to 0 as there. The lab runs both
/// (docs/lab/buffers.md).
pub fn khan_buffer_size_rederived(input: &BufferSizingInput) -> Result<f64, BufferSizingError> {
    input.validate()?;
    let drops = input.drop_distribution()?;
    let alpha = input.long_flow_fraction;
    let e0 = drops.expected_flows_without_drops();
    let k = drops.psi() + (1.0 - alpha) * drops.without_drops_times_growth() / 2.0 + alpha * e0;
    let ct = input.bandwidth_delay_product_bytes();
    let mss = f64::from(input.mss_bytes);
    let buffer = (ct * (1.0 - k) - alpha * input.drops_per_event as f64 * mss * e0) / k;
    if !buffer.is_finite() {
        return Err(BufferSizingError::Unbounded {
            flows: input.flows,
            drops_per_event: input.drops_per_event,
        });
    }
    Ok(buffer.max(0.0))
}

/// Appenzeller et al. (SIGCOMM 2004), `C T / sqrt(n)` bytes for `n` long
/// flows; below one flow it is sized as one, the rule of thumb.
pub fn appenzeller(capacity_bytes_per_sec: f64, rtt: Duration, long_flows: f64) -> f64 {
    rule_of_thumb(capacity_bytes_per_sec, rtt) / long_flows.max(1.0).sqrt()
}

/// The rule of thumb (Villamizar and Song 1994), `C T` bytes: one
/// bandwidth-delay product.
pub fn rule_of_thumb(capacity_bytes_per_sec: f64, rtt: Duration) -> f64 {
    capacity_bytes_per_sec * rtt.as_secs_f64()
}

/// The three buffer sizes, in bytes, for one input (what the tests check
/// the formulas against; the experiment computes each where it needs it).
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BufferSizes {
    /// Eq. 5 of Khan et al. ([`khan_buffer_size`]).
    pub khan: f64,
    /// [`appenzeller`] over the long flows `alpha n`, as the paper compares
    /// it (Appenzeller's `n` counts long-lived flows only).
    pub appenzeller: f64,
    /// [`rule_of_thumb`], `C T`.
    pub rule_of_thumb: f64,
}

#[cfg(test)]
impl BufferSizes {
    /// All three sizes, or the first reason the input is unusable.
    pub fn compute(input: &BufferSizingInput) -> Result<Self, BufferSizingError> {
        let khan = khan_buffer_size(input)?;
        let c = input.capacity_bytes_per_sec;
        let long_flows = input.long_flow_fraction * input.flows as f64;
        Ok(BufferSizes {
            khan,
            appenzeller: appenzeller(c, input.rtt, long_flows),
            rule_of_thumb: rule_of_thumb(c, input.rtt),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The paper's NS-3 setup (Section 5): 40 Mbit/s access link, RTT
    /// 2 x (20 us + 20 ms), MTU 1500 so MSS = 1460.
    fn paper_setup(flows: u64, drops_per_event: u64, alpha: f64) -> BufferSizingInput {
        BufferSizingInput {
            capacity_bytes_per_sec: 40e6 / 8.0,
            flows,
            mss_bytes: 1460,
            rtt: Duration::from_micros(40_040),
            long_flow_fraction: alpha,
            drops_per_event,
        }
    }

    fn dist(n: u64, l: u64) -> DropDistribution {
        DropDistribution::new(NonZeroU64::new(n).unwrap(), l)
    }

    fn assert_rel(actual: f64, expected: f64, tol: f64) {
        let err = ((actual - expected) / expected).abs();
        assert!(err <= tol, "{actual} vs {expected}: relative error {err}");
    }

    #[test]
    fn eq1_sums_to_one() {
        for (n, l) in [
            (1, 5),
            (2, 1),
            (2, 2000),
            (10, 25),
            (40, 80),
            (100, 500),
            (7, 0),
        ] {
            let d = dist(n, l);
            let total: f64 = (0..=l).map(|k| d.expected_flows_with_drops(k)).sum();
            assert!((total - 1.0).abs() < 1e-9, "n={n} l={l}: {total}");
        }
    }

    #[test]
    fn eq1_mean_is_l_over_n() {
        // Section 4: xi = sum_d d E[N_d] = l/n.
        for (n, l) in [(3, 10), (40, 80), (100, 250)] {
            let d = dist(n, l);
            let mean: f64 = (0..=l)
                .map(|k| k as f64 * d.expected_flows_with_drops(k))
                .sum();
            assert_rel(mean, d.mean_drops_per_flow(), 1e-9);
        }
    }

    #[test]
    fn eq1_small_cases_by_hand() {
        let d = dist(4, 2);
        assert_rel(d.expected_flows_with_drops(0), 9.0 / 16.0, 1e-15);
        assert_rel(d.expected_flows_with_drops(1), 6.0 / 16.0, 1e-15);
        assert_rel(d.expected_flows_with_drops(2), 1.0 / 16.0, 1e-15);
        assert_eq!(d.expected_flows_with_drops(3), 0.0);
        assert_eq!(dist(1, 3).expected_flows_without_drops(), 0.0);
        assert_eq!(dist(1, 3).expected_flows_with_drops(3), 1.0);
        assert_eq!(dist(5, 0).expected_flows_without_drops(), 1.0);
    }

    #[test]
    fn psi_floors_l_over_n() {
        // l/n = 2.5: Psi = E[N_1]/2 + E[N_2]/4 only.
        let d = dist(10, 25);
        let by_hand = d.expected_flows_with_drops(1) / 2.0 + d.expected_flows_with_drops(2) / 4.0;
        assert_rel(d.psi(), by_hand, 1e-14);
        // l < n: empty sum.
        assert_eq!(dist(40, 39).psi(), 0.0);
        assert_eq!(dist(1, 3).psi(), 0.125);
        assert_eq!(dist(1, 0).psi(), 0.0);
    }

    #[test]
    fn large_l_stays_finite() {
        for (n, l) in [(2, 100_000), (3, 5_000), (1, 5_000), (1_000_000, 10)] {
            let d = dist(n, l);
            for v in [
                d.psi(),
                d.expected_flows_without_drops(),
                d.without_drops_times_growth(),
            ] {
                assert!(
                    v.is_finite() && (0.0..=1.0).contains(&v),
                    "n={n} l={l}: {v}"
                );
            }
        }
    }

    #[test]
    fn eq5_matches_exact_reference() {
        // Reference values: Eq. 5 evaluated in Python with exact rationals
        // (fractions.Fraction) for E[N_0] and Psi, float only for 2^(l/n).
        let cases = [
            (
                40,
                80,
                0.75,
                0.13193780538690283,
                0.2038486802493239,
                596_319.671_790_945_9,
            ),
            (
                40,
                80,
                1.0,
                0.13193780538690283,
                0.2038486802493239,
                2_369_504.021_601_001,
            ),
            (
                10,
                25,
                0.75,
                0.07178979876918526,
                0.1661800897434844,
                726_720.357_818_765_4,
            ),
            (
                10,
                25,
                0.0,
                0.07178979876918526,
                0.1661800897434844,
                149_625.993_382_182,
            ),
            (
                100,
                250,
                0.75,
                0.08105851616218146,
                0.16670091994632896,
                606_952.239_292_427_8,
            ),
        ];
        for (n, l, alpha, e0, psi, b) in cases {
            let input = paper_setup(n, l, alpha);
            let d = input.drop_distribution().unwrap();
            assert_rel(d.expected_flows_without_drops(), e0, 1e-12);
            assert_rel(d.psi(), psi, 1e-12);
            assert_rel(khan_buffer_size(&input).unwrap(), b, 1e-9);
        }
    }

    /// Eq. 2 evaluated directly: the average window `xi` RTTs after the
    /// event, for a pre-event window `w_b`.
    fn eq2_window(i: &BufferSizingInput, w_b: f64, xi: u64) -> f64 {
        let d = i.drop_distribution().unwrap();
        let a = i.long_flow_fraction;
        let mss = f64::from(i.mss_bytes);
        let grown = a * (w_b + xi as f64 * mss) + (1.0 - a) * 2f64.powi(xi as i32 - 1) * w_b;
        let shrunk: f64 = (1..=xi)
            .map(|k| w_b / 2f64.powi(k as i32) * d.expected_flows_with_drops(k))
            .sum();
        grown * d.expected_flows_without_drops() + shrunk
    }

    #[test]
    fn rederived_size_satisfies_eq2_to_4_and_printed_eq5_does_not() {
        // l a multiple of n, so xi = l/n is whole and Eq. 2 needs no reading.
        for (n, l, alpha) in [
            (10, 20, 0.75),
            (20, 40, 0.25),
            (40, 120, 0.75),
            (10, 30, 0.0),
        ] {
            let i = paper_setup(n, l, alpha);
            let ct = i.bandwidth_delay_product_bytes();
            let xi = l / n;
            // Eq. 3 gives W_b from B; Eq. 4 asks n W_a = C T.
            let refill = |b: f64| n as f64 * eq2_window(&i, (b + ct) / n as f64, xi) / ct;
            let b = khan_buffer_size_rederived(&i).unwrap();
            assert!(b > 0.0, "n {n} l {l}: {b}");
            assert_rel(refill(b), 1.0, 1e-9);
            if let Ok(printed) = khan_buffer_size(&i) {
                assert!(
                    (refill(printed) - 1.0).abs() > 1e-3,
                    "n {n} l {l}: printed Eq. 5 fits too"
                );
            }
        }
    }

    #[test]
    fn single_flow_single_drop_is_rule_of_thumb() {
        // n = 1, l = 1: the flow halves its window, E[N_0] = 0, Psi = 1/2, and
        // Eq. 5 gives B = C T, the classic single-Reno-flow result. Here Eq. 5
        // and a hand solution of Eq. 2-4 agree, as E[N_0] = 0.
        for alpha in [0.0, 0.5, 1.0] {
            let input = paper_setup(1, 1, alpha);
            let ct = input.bandwidth_delay_product_bytes();
            assert_rel(khan_buffer_size(&input).unwrap(), ct, 1e-12);
            // Two drops quarter the window: B + C T = 4 C T.
            let twice = BufferSizingInput {
                drops_per_event: 2,
                ..input
            };
            assert_rel(khan_buffer_size(&twice).unwrap(), 3.0 * ct, 1e-12);
        }
    }

    #[test]
    fn prior_rules() {
        let rtt = Duration::from_millis(40);
        assert_rel(rule_of_thumb(5e6, rtt), 200_000.0, 1e-12);
        assert_rel(appenzeller(5e6, rtt, 100.0), 20_000.0, 1e-12);
        assert_rel(appenzeller(5e6, rtt, 4.0), 100_000.0, 1e-12);
        assert_rel(appenzeller(5e6, rtt, 0.0), 200_000.0, 1e-12);
    }

    #[test]
    fn buffer_sizes_bundle() {
        let input = paper_setup(40, 80, 0.75);
        let sizes = BufferSizes::compute(&input).unwrap();
        assert_eq!(sizes.khan, khan_buffer_size(&input).unwrap());
        assert_rel(sizes.rule_of_thumb, 200_200.0, 1e-12);
        // 30 long flows out of 40.
        assert_rel(sizes.appenzeller, 200_200.0 / 30f64.sqrt(), 1e-12);
    }

    #[test]
    fn negative_denominator_is_an_error() {
        // alpha = 1 and l < n: Psi = 0, denominator = -E[N_0].
        let input = paper_setup(40, 20, 1.0);
        match khan_buffer_size(&input) {
            Err(BufferSizingError::NegativeDenominator { denominator, .. }) => {
                let e0 = input
                    .drop_distribution()
                    .unwrap()
                    .expected_flows_without_drops();
                assert_rel(denominator, -e0, 1e-12);
            }
            other => panic!("expected NegativeDenominator, got {other:?}"),
        }
    }

    #[test]
    fn negative_numerator_clamps_to_zero() {
        // A tiny C T against alpha l MSS E[N_0]: the regrowth alone fills it.
        let input = BufferSizingInput {
            capacity_bytes_per_sec: 1_000.0,
            rtt: Duration::from_millis(10),
            ..paper_setup(40, 80, 0.75)
        };
        assert_eq!(khan_buffer_size(&input).unwrap(), 0.0);
    }

    #[test]
    fn validation_errors() {
        let ok = paper_setup(40, 80, 0.75);
        assert_eq!(ok.validate(), Ok(()));
        let cases = [
            (
                BufferSizingInput { flows: 0, ..ok },
                BufferSizingError::NoFlows,
            ),
            (
                BufferSizingInput {
                    drops_per_event: 0,
                    ..ok
                },
                BufferSizingError::NoDrops,
            ),
            (
                BufferSizingInput { mss_bytes: 0, ..ok },
                BufferSizingError::ZeroMss,
            ),
            (
                BufferSizingInput {
                    rtt: Duration::ZERO,
                    ..ok
                },
                BufferSizingError::ZeroRtt,
            ),
            (
                BufferSizingInput {
                    capacity_bytes_per_sec: 0.0,
                    ..ok
                },
                BufferSizingError::Capacity(0.0),
            ),
            (
                BufferSizingInput {
                    capacity_bytes_per_sec: -1.0,
                    ..ok
                },
                BufferSizingError::Capacity(-1.0),
            ),
            (
                BufferSizingInput {
                    capacity_bytes_per_sec: f64::INFINITY,
                    ..ok
                },
                BufferSizingError::Capacity(f64::INFINITY),
            ),
            (
                BufferSizingInput {
                    capacity_bytes_per_sec: f64::MAX,
                    rtt: Duration::from_secs(10),
                    ..ok
                },
                BufferSizingError::BandwidthDelayOverflow,
            ),
            (
                BufferSizingInput {
                    long_flow_fraction: 1.5,
                    ..ok
                },
                BufferSizingError::LongFlowFraction(1.5),
            ),
            (
                BufferSizingInput {
                    long_flow_fraction: -0.1,
                    ..ok
                },
                BufferSizingError::LongFlowFraction(-0.1),
            ),
        ];
        for (input, want) in cases {
            assert_eq!(input.validate(), Err(want));
            assert_eq!(khan_buffer_size(&input), Err(want));
            assert_eq!(BufferSizes::compute(&input), Err(want));
        }
        let nan = BufferSizingInput {
            long_flow_fraction: f64::NAN,
            ..ok
        };
        assert!(matches!(
            nan.validate(),
            Err(BufferSizingError::LongFlowFraction(a)) if a.is_nan()
        ));
        let nan = BufferSizingInput {
            capacity_bytes_per_sec: f64::NAN,
            ..ok
        };
        assert!(matches!(nan.validate(), Err(BufferSizingError::Capacity(c)) if c.is_nan()));
    }

    #[test]
    fn unbounded_is_an_error() {
        // n = 1: B = C T (2^l - 1). At l = 2000, Psi = 2^-2000 underflows and
        // the denominator reads as zero; at l = 1020, Psi = 2^-1020 is
        // representable but B overflows.
        for l in [2_000, 1_020] {
            assert_eq!(
                khan_buffer_size(&paper_setup(1, l, 1.0)),
                Err(BufferSizingError::Unbounded {
                    flows: 1,
                    drops_per_event: l
                })
            );
        }
        // n = 1, l = 1000: 2e5 * 2^1000 still fits.
        assert!(khan_buffer_size(&paper_setup(1, 1_000, 1.0)).unwrap() > 1e306);
    }

    proptest! {
        #[test]
        fn eq1_is_a_distribution(n in 1u64..500, l in 0u64..600) {
            let d = dist(n, l);
            let total: f64 = (0..=l).map(|k| d.expected_flows_with_drops(k)).sum();
            prop_assert!((total - 1.0).abs() < 1e-9);
            let psi = d.psi();
            // Psi weights part of the mass of D >= 1 by at most 1/2.
            prop_assert!((0.0..=0.5 * (1.0 - d.expected_flows_without_drops()) + 1e-12).contains(&psi));
        }

        /// Eq. 5 depends on C and T only through C T, and is homogeneous of
        /// degree one in (C T, MSS).
        #[test]
        fn eq5_scales_with_bdp_and_mss(
            n in 1u64..200, ratio in 1u64..6, alpha in 0.0f64..=1.0, k in 1u32..8,
        ) {
            let base = paper_setup(n, n * ratio, alpha);
            let Ok(b) = khan_buffer_size(&base) else { return Ok(()) };
            let halved_c_doubled_t = BufferSizingInput {
                capacity_bytes_per_sec: base.capacity_bytes_per_sec / 2.0,
                rtt: base.rtt * 2,
                ..base
            };
            let b2 = khan_buffer_size(&halved_c_doubled_t).unwrap();
            prop_assert!((b2 - b).abs() <= 1e-9 * b.max(1.0));
            let scaled = BufferSizingInput {
                capacity_bytes_per_sec: base.capacity_bytes_per_sec * f64::from(k),
                mss_bytes: base.mss_bytes * k,
                ..base
            };
            let bk = khan_buffer_size(&scaled).unwrap();
            prop_assert!((bk - f64::from(k) * b).abs() <= 1e-9 * bk.max(1.0));
        }

        /// dB/dMSS = -alpha l E[N_0] / denominator <= 0: a larger MSS never
        /// asks for more buffer.
        #[test]
        fn eq5_non_increasing_in_mss(
            n in 1u64..200, l in 1u64..1000, alpha in 0.0f64..=1.0, mss in 1u32..9000,
        ) {
            let small = BufferSizingInput { mss_bytes: mss, ..paper_setup(n, l, alpha) };
            let big = BufferSizingInput { mss_bytes: mss + 500, ..small };
            if let (Ok(a), Ok(b)) = (khan_buffer_size(&small), khan_buffer_size(&big)) {
                prop_assert!(b <= a * (1.0 + 1e-12));
            }
        }

        /// Section 5 observes that more short flows (lower alpha) give a
        /// smaller buffer. The algebra guarantees it whenever l MSS <= C T:
        /// dB/dalpha has the sign of E[N_0]((2^(l/n) + 1) C T
        /// - l MSS (Psi + E[N_0] 2^(l/n))), and the denominator only grows as
        /// alpha falls, so a solvable alpha keeps every smaller alpha solvable.
        #[test]
        fn eq5_grows_with_long_flow_fraction(
            n in 1u64..200, l in 1u64..130, lo in 0.0f64..=1.0, hi in 0.0f64..=1.0,
        ) {
            let (lo, hi) = if lo <= hi { (lo, hi) } else { (hi, lo) };
            let high = paper_setup(n, l, hi);
            prop_assume!(f64::from(high.mss_bytes) * l as f64 <= high.bandwidth_delay_product_bytes());
            if let Ok(b_hi) = khan_buffer_size(&high) {
                let b_lo = khan_buffer_size(&paper_setup(n, l, lo)).unwrap();
                prop_assert!(b_lo <= b_hi * (1.0 + 1e-9) + 1e-9);
            }
        }
    }
}
