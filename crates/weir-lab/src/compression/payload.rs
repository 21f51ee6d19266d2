//! The payloads, generated deterministically from a seed: timestamped
//! accelerometer CSV rows and incompressible random bytes.

/// A generated payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload {
    /// Timestamped accelerometer CSV rows.
    AccelCsv,
    /// Seeded random bytes.
    Random,
}

impl Payload {
    /// Both payloads, in table order.
    pub const ALL: [Payload; 2] = [Payload::AccelCsv, Payload::Random];

    /// The name in tables, JSON and the chooser's kind.
    pub fn name(self) -> &'static str {
        match self {
            Payload::AccelCsv => "accel-csv",
            Payload::Random => "random",
        }
    }

    /// `bytes` bytes of this payload from `seed`.
    pub fn generate(self, bytes: usize, seed: u64) -> Vec<u8> {
        match self {
            Payload::AccelCsv => accel_csv(bytes, seed),
            Payload::Random => random_bytes(bytes, seed),
        }
    }
}

/// Deterministic pseudo-random numbers (splitmix64): the payloads must be
/// the same on every run and every machine.
#[derive(Debug, Clone)]
pub struct SplitMix(pub u64);

impl SplitMix {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Normal with standard deviation `sd` (Box–Muller).
    pub fn normal(&mut self, sd: f64) -> f64 {
        let u = 1.0 - self.unit();
        let v = self.unit();
        sd * (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

/// `bytes` seeded random bytes: incompressible.
pub fn random_bytes(bytes: usize, seed: u64) -> Vec<u8> {
    let mut rng = SplitMix(seed);
    let mut out = Vec::with_capacity(bytes + 8);
    while out.len() < bytes {
        out.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    out.truncate(bytes);
    out
}

/// `bytes` of accelerometer CSV sampled at 100 Hz (values in g, three
/// decimals, like a chest-belt monitor's export): spells of sitting (still,
/// tiny noise), walking (about 2 steps/s) and driving (vibration), 20 to
/// 120 s each. Cut at exactly `bytes`.
pub fn accel_csv(bytes: usize, seed: u64) -> Vec<u8> {
    use std::f64::consts::TAU;
    let mut rng = SplitMix(seed ^ 0xACCE_1C5F);
    let mut out = Vec::with_capacity(bytes + 64);
    out.extend_from_slice(b"timestamp,ax,ay,az\n");
    let mut t_ms: u64 = 9 * 3_600_000;
    let mut left = 0u32;
    let mut activity = 0u8;
    let mut tilt = (0.0, 0.0);
    let mut step_hz = 1.9;
    let mut line = String::with_capacity(64);
    while out.len() < bytes {
        if left == 0 {
            activity = (rng.next_u64() % 3) as u8;
            left = 2_000 + (rng.next_u64() % 10_000) as u32;
            tilt = (rng.normal(0.05), rng.normal(0.05));
            step_hz = 1.7 + 0.5 * rng.unit();
        }
        left -= 1;
        let t = t_ms as f64 / 1e3;
        let (ax, ay, az) = match activity {
            0 => (
                0.02 + tilt.0 + rng.normal(0.004),
                -0.98 + rng.normal(0.004),
                0.15 + tilt.1 + rng.normal(0.004),
            ),
            1 => (
                0.05 + tilt.0 + 0.25 * (TAU * step_hz * t).sin() + rng.normal(0.04),
                -0.98 + 0.35 * (2.0 * TAU * step_hz * t + 0.7).sin() + rng.normal(0.05),
                0.12 + tilt.1 + 0.15 * (TAU * step_hz * t + 1.9).sin() + rng.normal(0.03),
            ),
            _ => (
                0.03 + tilt.0 + 0.05 * (0.2 * t).sin() + rng.normal(0.02),
                -0.97 + rng.normal(0.02),
                0.2 + tilt.1 + rng.normal(0.02),
            ),
        };
        let (h, m, s, ms) = (
            t_ms / 3_600_000 % 24,
            t_ms / 60_000 % 60,
            t_ms / 1000 % 60,
            t_ms % 1000,
        );
        line.clear();
        use std::fmt::Write as _;
        let _ = writeln!(
            line,
            "2024-05-14 {h:02}:{m:02}:{s:02}.{ms:03},{ax:.3},{ay:.3},{az:.3}"
        );
        out.extend_from_slice(line.as_bytes());
        t_ms += 10;
    }
    out.truncate(bytes);
    out
}
