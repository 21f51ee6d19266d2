//! Per-batch compression in the egress: the I/O half of the piping-model
//! choice whose decisions live in `weir_core::compression`.
//!
//! For each batch [`BatchCompressor::compress`]
//! 1. names the batch's payload kind (`compression.per`: its class, or its
//!    key);
//! 2. asks the chooser whether a sample is due; if so the batch is
//!    compressed with the sampled codec and *that* output is sent (the
//!    paper's "occasional sample": refreshing a table costs one batch's
//!    compression with a codec that may be slower or looser than the best,
//!    bounded by the sampling rate, about 1 batch in `sample_every`, rather
//!    than a second compression of every sampled batch);
//! 3. otherwise asks the chooser for the codec with the highest predicted
//!    effective throughput on the current link estimate (Eq. 20 against
//!    Eq. 3);
//! 4. compresses on tokio's blocking pool, timing the compression alone, and
//!    reports ratio and speed back to the chooser's table.
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
                sampled: false,
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
        if decision.sampled {
            metrics.compression_sampled();
        }
        if let Some(p) = decision.predicted {
            metrics.set_compression_predicted(p);
        }
        let Some((encoding, level)) = wire_encoding(decision.codec) else {
            metrics.encoded(Codec::None);
            return encoded;
        };
        let body = encoded.body.clone();
        // Compression is CPU work of up to tens of milliseconds (zstd-19 on
        // a large batch): never on a reactor thread. The time is measured
        // inside the closure, so it is the codec's, not the queueing's.
        let result = tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            weir_proto::compress(&body, encoding, level).map(|z| (z, started.elapsed()))
        })
        .await;
        let (compressed, elapsed) = match result {
            Ok(Ok(done)) => done,
            Ok(Err(e)) => {
                tracing::warn!(batch = encoded.seq, codec = %decision.codec, error = %e, "compression failed; sending the batch uncompressed");
                metrics.encoded(Codec::None);
                return encoded;
            }
            Err(e) => {
                tracing::error!(batch = encoded.seq, codec = %decision.codec, error = %e, "compression task failed; sending the batch uncompressed");
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
            sampled = decision.sampled,
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
        // The first three batches sample gzip-1, zstd-1, zstd-3; from then
        // on the slow link makes the chooser compress every batch.
        assert_eq!(
            encodings[..3],
            [Encoding::Gzip, Encoding::Zstd, Encoding::Zstd]
        );
        assert!(
            encodings.iter().all(|e| *e != Encoding::Identity),
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
        // Only samples (which may shave the framing) are compressed: every
        // batch the chooser decided goes raw.
        let raw = metrics.encoded_total(Codec::None);
        assert!(raw >= 30 - samples_total(&metrics), "{raw} raw batches");
        assert!(raw > 15, "{raw} raw batches");
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
