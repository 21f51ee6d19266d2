//! Per-batch compression in the egress: the I/O half of the piping-model
//! choice whose decisions live in `weir_core::compression`.
//!
//! For each batch [`BatchCompressor::compress`]
//! 1. names the batch's payload kind (`compression.per`: its class, or its
//!    key);
//! 2. asks the chooser for the codec with the highest predicted effective
//!    throughput on the current link estimate (Eq. 20 against Eq. 3), and
//!    whether a sample of a codec not in use is due (the paper's
//!    "occasional sample");
//! 3. on tokio's blocking pool, compresses the first
//!    [`weir_core::compression::SAMPLE_SLICE_BYTES`] of the batch with the
//!    sampled codec (a refresh costs at most a slice's compression, never
//!    zstd-19 of a whole 1 MiB batch), then the batch with the chosen
//!    codec, timing each compression alone, and reports ratios and speeds
//!    back to the chooser's table.
//!
//! A compressed body that is not smaller than the protobuf is dropped and the
//! protobuf sent as `identity` (the observation still teaches the chooser that
//! the codec does not pay), so incompressible data never grows on the wire.
//! A batch is compressed once; retries resend the same body.

use std::borrow::Cow;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
pub use weir_core::compression::Decision;
use weir_core::compression::{ChooserConfig, Codec, CompressionChooser};
use weir_core::link_estimate::LinkEstimate;
use weir_core::ClassSet;
use weir_proto::Encoding;

use weir_core::scheduler::OutBatch;

use super::batch::EncodedBatch;
use crate::config::{CompressionSection, PayloadKind};
use crate::metrics::Metrics;

/// The wire encoding and level of a compressing codec; `None` for
/// [`Codec::None`].
pub fn wire_encoding(codec: Codec) -> Option<(Encoding, i32)> {
    match codec {
        Codec::None => None,
        Codec::Gzip(level) => Some((Encoding::Gzip, level.into())),
        Codec::Zstd(level) => Some((Encoding::Zstd, level.into())),
    }
}

/// The egress's compression state: the chooser and its per-kind tables.
#[derive(Debug)]
pub struct BatchCompressor {
    /// `None` when compression is off (or the config was refused).
    chooser: Option<CompressionChooser>,
    per: PayloadKind,
    /// The chooser's clock starts here (it takes durations, not instants).
    epoch: Instant,
}

impl BatchCompressor {
    /// Builds the chooser from `[compression]`; with `enabled = false` every
    /// batch is sent as `identity` and nothing is measured.
    pub fn new(cfg: &CompressionSection) -> Self {
        let chooser = cfg
            .enabled
            .then(|| {
                CompressionChooser::new(ChooserConfig {
                    candidates: cfg.candidates.clone(),
                    sample_every_batches: cfg.sample_every,
                    sample_every: cfg.sample_interval,
                    ..ChooserConfig::default()
                })
            })
            .and_then(|r| {
                // The config validator already checked these; a refusal
                // here is a bug, and sending raw is always correct.
                r.map_err(|errors| {
                    tracing::error!(
                        ?errors,
                        "compression settings refused; sending batches uncompressed"
                    );
                })
                .ok()
            });
        BatchCompressor {
            chooser,
            per: cfg.per,
            epoch: Instant::now(),
        }
    }

    /// True when batches may be compressed.
    pub fn enabled(&self) -> bool {
        self.chooser.is_some()
    }

    /// The payload kind of `batch`: the name of the class holding most of
    /// its bytes (a mixed batch is mostly the class that filled it), or
    /// with `per = "key"` the key of its first record. Batches may mix
    /// keys and classes, so the tables are an approximation: a batch is
    /// accounted to one kind, which is exact for the common case of one
    /// stream per class and close when a class's keys carry alike payloads.
    pub fn kind<'a>(&self, classes: &'a ClassSet, batch: &'a OutBatch) -> Cow<'a, str> {
        match (self.per, batch.records.first()) {
            (PayloadKind::Key, Some(first)) => String::from_utf8_lossy(&first.key),
            _ => {
                let class = batch
                    .class_runs()
                    .into_iter()
                    .max_by_key(|&(_, _, bytes)| bytes)
                    .map_or(batch.class, |(class, _, _)| class);
                Cow::Borrowed(classes.get(class).name.as_str())
            }
        }
    }

    /// Picks the codec for a batch of `body_len` protobuf bytes of `kind`
    /// (counts one batch on the kind's sampling clock; see
    /// [`CompressionChooser::decide`]).
    pub fn decide(&mut self, kind: &str, body_len: usize, link: &LinkEstimate) -> Decision {
        let now = self.epoch.elapsed();
        match self.chooser.as_mut() {
            Some(chooser) => chooser.decide(kind, body_len as u64, link, now),
            None => Decision {
                codec: Codec::None,
                sample: None,
                predicted: None,
            },
        }
    }

    /// Records one compression in `kind`'s table.
    pub fn observe(
        &mut self,
        kind: &str,
        codec: Codec,
        uncompressed: usize,
        compressed: usize,
        elapsed: Duration,
    ) {
        if let Some(chooser) = self.chooser.as_mut() {
            chooser.observe(kind, codec, uncompressed as u64, compressed as u64, elapsed);
        }
    }

    /// Decides, compresses (off the reactor) and observes one batch:
    /// returns `encoded` with its body and encoding replaced when
    /// compression shrank it. `encoded` must hold the identity protobuf.
    pub async fn compress(
        &mut self,
        mut encoded: EncodedBatch,
        kind: &str,
        link: &LinkEstimate,
        metrics: &Metrics,
    ) -> EncodedBatch {
        debug_assert_eq!(encoded.encoding, Encoding::Identity);
        let decision = self.decide(kind, encoded.body.len(), link);
        if let Some(p) = decision.predicted {
            metrics.set_compression_predicted(p);
        }
        let sample = decision.sample.and_then(|c| Some((c, wire_encoding(c)?)));
        let chosen = wire_encoding(decision.codec);
        if sample.is_none() && chosen.is_none() {
            metrics.encoded(Codec::None);
            return encoded;
        }
        let body = encoded.body.clone();
        // Compression is CPU work of up to tens of milliseconds (zstd-19 on
        // a large batch): never on a reactor thread. Each time is measured
        // inside the closure, so it is the codec's, not the queueing's.
        let timed = |body: &[u8], (encoding, level): (weir_proto::Encoding, i32)| {
            let started = std::time::Instant::now();
            weir_proto::compress(body, encoding, level).map(|z| (z, started.elapsed()))
        };
        let result = tokio::task::spawn_blocking(move || {
            let sampled = sample.map(|(codec, wire)| {
                let slice = &body[..body.len().min(weir_core::compression::SAMPLE_SLICE_BYTES)];
                (codec, slice.len(), timed(slice, wire))
            });
            (sampled, chosen.map(|wire| (wire.0, timed(&body, wire))))
        })
        .await;
        let (sampled, chosen) = match result {
            Ok(done) => done,
            Err(e) => {
                tracing::error!(batch = encoded.seq, codec = %decision.codec, error = %e, "compression task failed; sending the batch uncompressed");
                metrics.encoded(Codec::None);
                return encoded;
            }
        };
        if let Some((codec, len, outcome)) = sampled {
            metrics.compression_sampled();
            match outcome {
                Ok((z, elapsed)) => self.observe(kind, codec, len, z.len(), elapsed),
                Err(e) => {
                    tracing::warn!(batch = encoded.seq, codec = %codec, error = %e, "compression sample failed");
                }
            }
        }
        let (encoding, compressed, elapsed) = match chosen {
            Some((encoding, Ok((compressed, elapsed)))) => (encoding, compressed, elapsed),
            Some((_, Err(e))) => {
                tracing::warn!(batch = encoded.seq, codec = %decision.codec, error = %e, "compression failed; sending the batch uncompressed");
                metrics.encoded(Codec::None);
                return encoded;
            }
            None => {
                metrics.encoded(Codec::None);
                return encoded;
            }
        };
        let uncompressed = encoded.body.len();
        self.observe(
            kind,
            decision.codec,
            uncompressed,
            compressed.len(),
            elapsed,
        );
        tracing::trace!(
            batch = encoded.seq,
            codec = %decision.codec,
            sampled = ?decision.sample,
            uncompressed,
            compressed = compressed.len(),
            micros = elapsed.as_micros() as u64,
            "batch compressed"
        );
        if compressed.len() >= uncompressed {
            metrics.encoded(Codec::None);
            return encoded;
        }
        metrics.encoded(decision.codec);
        encoded.body = Bytes::from(compressed);
        encoded.encoding = encoding;
        encoded
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_core::{ClassId, Record};

    fn section(enabled: bool, candidates: Vec<Codec>, per: PayloadKind) -> CompressionSection {
        CompressionSection {
            enabled,
            candidates,
            per,
            sample_every: 4,
            sample_interval: Duration::from_secs(3600),
        }
    }

    fn slow_link() -> LinkEstimate {
        LinkEstimate {
            bytes_per_sec: 50e3,
            per_transaction: Duration::from_millis(20),
        }
    }

    fn record(key: &str, payload: Bytes) -> Record {
        Record {
            key: Bytes::copy_from_slice(key.as_bytes()),
            class: ClassId(1),
            origin: 1,
            seq: 0,
            ingress_us: 0,
            payload,
            spool: None,
        }
    }

    fn out_batch(seq: u64, records: Vec<Record>) -> OutBatch {
        OutBatch {
            seq,
            class: ClassId(1),
            records,
        }
    }

    fn csv_batch(seq: u64) -> OutBatch {
        out_batch(
            seq,
            (0..400)
                .map(|i| {
                    record(
                        "accel",
                        Bytes::from(format!(
                            "2026-11-22T10:00:00.{:03},0.0{:03},-0.98{:02},9.81\n",
                            i % 1000,
                            i % 997,
                            i % 89
                        )),
                    )
                })
                .collect(),
        )
    }

    fn samples_total(metrics: &Metrics) -> u64 {
        metrics
            .render()
            .lines()
            .find_map(|l| l.strip_prefix("weir_compression_samples_total "))
            .expect("the samples counter is exported")
            .parse()
            .unwrap()
    }

    /// Random payloads of 4 KiB: the protobuf framing around them (keys,
    /// class names, sequence numbers) is under 1% and the only part that
    /// compresses.
    fn noise_batch(seq: u64, state: &mut u64) -> OutBatch {
        out_batch(
            seq,
            (0..16)
                .map(|_| {
                    let p: Vec<u8> = (0..4096)
                        .map(|_| {
                            *state ^= *state << 13;
                            *state ^= *state >> 7;
                            *state ^= *state << 17;
                            *state as u8
                        })
                        .collect();
                    record("noise", Bytes::from(p))
                })
                .collect(),
        )
    }

    #[test]
    fn kinds_follow_the_config() {
        let classes = ClassSet::janus_default();
        let b = out_batch(
            1,
            vec![record("a/b", Bytes::new()), record("c", Bytes::new())],
        );
        let by_class = BatchCompressor::new(&section(true, vec![Codec::None], PayloadKind::Class));
        assert_eq!(by_class.kind(&classes, &b), "nm");
        let by_key = BatchCompressor::new(&section(true, vec![Codec::None], PayloadKind::Key));
        assert_eq!(by_key.kind(&classes, &b), "a/b");
        // An empty batch falls back to its class.
        assert_eq!(by_key.kind(&classes, &out_batch(2, vec![])), "nm");
    }

    #[tokio::test]
    async fn disabled_sends_identity_and_measures_nothing() {
        let classes = ClassSet::janus_default();
        let metrics = Metrics::new(&classes);
        let mut c = BatchCompressor::new(&section(
            false,
            weir_core::compression::DEFAULT_CANDIDATES.to_vec(),
            PayloadKind::Class,
        ));
        assert!(!c.enabled());
        for seq in 0..10 {
            let b = csv_batch(seq);
            let e = crate::egress::encode(1, &classes, &b);
            let body = e.body.clone();
            let out = c.compress(e, "nm", &slow_link(), &metrics).await;
            assert_eq!(out.encoding, Encoding::Identity);
            assert_eq!(out.body, body);
        }
        assert_eq!(metrics.encoded_total(Codec::None), 10);
    }

    #[tokio::test]
    async fn compressible_batches_are_sampled_then_compressed_and_decode() {
        let classes = ClassSet::janus_default();
        let metrics = Metrics::new(&classes);
        let candidates = vec![Codec::None, Codec::Gzip(1), Codec::Zstd(1), Codec::Zstd(3)];
        let mut c = BatchCompressor::new(&section(true, candidates.clone(), PayloadKind::Class));
        let mut encodings = Vec::new();
        for seq in 0..20 {
            let b = csv_batch(seq);
            let e = crate::egress::encode(1, &classes, &b);
            let body = e.body.clone();
            let out = c.compress(e, "nm", &slow_link(), &metrics).await;
            let back = weir_proto::decompress(&out.body, out.encoding, 1 << 24).unwrap();
            assert_eq!(back, body, "batch {seq} round trips");
            encodings.push(out.encoding);
        }
        // The first three batches sample gzip-1, zstd-1, zstd-3 (the first
        // goes raw: nothing is measured yet); from the second on, the slow
        // link makes the chooser compress every batch.
        assert_eq!(encodings[0], Encoding::Identity);
        assert!(
            encodings[1..].iter().all(|e| *e != Encoding::Identity),
            "{encodings:?}"
        );
        let table = c.chooser.as_ref().unwrap().table("nm").unwrap();
        for codec in &candidates[1..] {
            let st = table.stats(*codec).unwrap();
            assert!(st.samples() > 0, "{codec} measured");
            assert!(st.ratio().unwrap() > 3.0, "{codec}: {st:?}");
        }
        let total: u64 = candidates.iter().map(|c| metrics.encoded_total(*c)).sum();
        assert_eq!(total, 20);
        // Three first samples, then one every 4 batches.
        let samples = samples_total(&metrics);
        assert!((4..=3 + 20 / 4).contains(&samples), "{samples}");
    }

    #[tokio::test]
    async fn a_sample_is_a_slice_and_the_batch_goes_with_the_choice() {
        let classes = ClassSet::janus_default();
        let metrics = Metrics::new(&classes);
        let candidates = vec![Codec::None, Codec::Gzip(9), Codec::Zstd(19)];
        let mut c = BatchCompressor::new(&section(true, candidates, PayloadKind::Class));
        // A LAN: sending raw beats any compression of the 4000-line CSV
        // (180 kB, 3x the sample slice), which shrinks several-fold.
        let lan = LinkEstimate {
            bytes_per_sec: 1e10,
            per_transaction: Duration::from_micros(100),
        };
        let big = || {
            let mut b = csv_batch(0);
            let more: Vec<Record> = (0..9).flat_map(|_| b.records.clone()).collect();
            b.records.extend(more);
            b
        };
        for seq in 0..8 {
            let mut b = big();
            b.seq = seq;
            let e = crate::egress::encode(1, &classes, &b);
            assert!(e.body.len() > 2 * weir_core::compression::SAMPLE_SLICE_BYTES);
            let out = c.compress(e, "nm", &lan, &metrics).await;
            assert_eq!(out.encoding, Encoding::Identity, "batch {seq}");
        }
        // Both slow codecs were measured (and found to shrink the data),
        // yet no batch went compressed.
        let table = c.chooser.as_ref().unwrap().table("nm").unwrap();
        for codec in [Codec::Gzip(9), Codec::Zstd(19)] {
            let st = table.stats(codec).unwrap();
            assert!(
                st.samples() > 0 && st.ratio().unwrap() > 3.0,
                "{codec}: {st:?}"
            );
        }
        assert_eq!(metrics.encoded_total(Codec::None), 8);
        assert!(samples_total(&metrics) >= 2);
    }

    #[tokio::test]
    async fn incompressible_batches_stay_identity() {
        let classes = ClassSet::janus_default();
        let metrics = Metrics::new(&classes);
        let mut c = BatchCompressor::new(&section(
            true,
            weir_core::compression::DEFAULT_CANDIDATES.to_vec(),
            PayloadKind::Class,
        ));
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        for seq in 0..30 {
            let b = noise_batch(seq, &mut state);
            let e = crate::egress::encode(1, &classes, &b);
            let body = e.body.clone();
            let out = c.compress(e, "nm", &slow_link(), &metrics).await;
            let back = weir_proto::decompress(&out.body, out.encoding, 1 << 24).unwrap();
            assert_eq!(back, body, "batch {seq} round trips");
            // Whatever the codec, the body never grows.
            assert!(out.body.len() <= body.len());
        }
        // Samples are measured on a slice and never sent: every batch goes
        // raw, as the chooser decided.
        assert_eq!(metrics.encoded_total(Codec::None), 30);
        assert!(samples_total(&metrics) >= 7, "every codec sampled");
        // And the chooser has learnt that nothing pays.
        let choice = c
            .chooser
            .as_ref()
            .unwrap()
            .choose("nm", 16 << 10, &slow_link());
        assert_eq!(choice.codec, Codec::None);
    }

    #[test]
    fn wire_encodings_carry_the_level() {
        assert_eq!(wire_encoding(Codec::None), None);
        assert_eq!(wire_encoding(Codec::Gzip(9)), Some((Encoding::Gzip, 9)));
        assert_eq!(wire_encoding(Codec::Zstd(19)), Some((Encoding::Zstd, 19)));
    }
}
