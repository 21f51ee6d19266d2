//! What `weir consume` keeps and commits, whatever it reads from: the
//! options, the output file, the state file, and [`Commits`] (the
//! records read and not yet committed, and how to commit them).

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use base64::Engine;
use lapin::options::{BasicAckOptions, BasicRejectOptions};
use serde::{Deserialize, Serialize};
use weir_core::dedupe::{Dedupe, DedupeCounts, OriginSeen, Verdict};

/// Where a stream is read from when no state says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartOffset {
    /// The first message the stream holds.
    First,
    /// The last chunk written.
    Last,
    /// Only what is written from now on.
    Next,
    /// This offset.
    At(u64),
}

impl std::str::FromStr for StartOffset {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "first" => Ok(StartOffset::First),
            "last" => Ok(StartOffset::Last),
            "next" => Ok(StartOffset::Next),
            n => n.parse().map(StartOffset::At).map_err(|_| {
                format!("{s:?} is not first, last, next or an offset (a whole number)")
            }),
        }
    }
}

/// How payloads are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PayloadFormat {
    /// `"payload"`: standard base64, for any bytes.
    Base64,
    /// `"payload"`: the bytes as a UTF-8 string (invalid sequences are
    /// replaced by U+FFFD).
    Text,
}

/// What `weir consume` does.
#[derive(Debug, Clone)]
pub struct ConsumeOptions {
    /// `amqp://` or `amqps://` URL.
    pub url: String,
    /// Queue or stream to read.
    pub queue: String,
    /// The queue is a stream: read from an offset (`x-stream-offset`).
    pub stream: bool,
    /// Where a stream starts when the state has no offset.
    pub offset: StartOffset,
    /// Output file (appended to); stdout without it.
    pub output: Option<PathBuf>,
    /// State file: deduplication ranges, the output's committed length, a
    /// stream's offset.
    pub state: Option<PathBuf>,
    /// Messages delivered and not yet acknowledged, at most.
    pub prefetch: u16,
    /// How payloads are written.
    pub payload: PayloadFormat,
    /// Stop once no message has come for this long.
    pub idle_exit: Option<Duration>,
    /// Stop once this many records have been handed on (after the message
    /// that reaches it).
    pub max_records: Option<u64>,
    /// Gaps remembered per origin (`weir_core::dedupe`).
    pub window: usize,
    /// Largest decoded batch accepted.
    pub max_size: usize,
    /// Read this Kafka topic (`topic`, which holds no placeholder) from
    /// these brokers instead of RabbitMQ.
    pub kafka: Option<crate::config::KafkaEgress>,
}

/// What a run did (also in the state file, summed over runs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumeReport {
    /// Messages (batches) read.
    pub messages: u64,
    /// Records handed on.
    pub records: u64,
    /// Records dropped as duplicates.
    pub duplicates: u64,
    /// Records handed on that were older than the remembered window.
    pub unverified: u64,
    /// Messages that were not weir batches (rejected, or skipped on a
    /// stream).
    pub undecodable: u64,
}

/// The state file.
#[derive(Debug, Default, Serialize, Deserialize)]
struct State {
    /// Bytes of the output file that are committed.
    output_len: Option<u64>,
    /// The last stream offset committed.
    stream_offset: Option<u64>,
    /// Kafka: the next offset to read, per partition.
    #[serde(default)]
    kafka_offsets: std::collections::BTreeMap<i32, i64>,
    /// Totals over every run.
    report: ConsumeReport,
    /// Per origin: the floor and the seen runs `[start, end)`.
    origins: Vec<StoredOrigin>,
}

#[derive(Debug, Serialize, Deserialize)]
struct StoredOrigin {
    origin: u64,
    floor: u64,
    ranges: Vec<[u64; 2]>,
}

/// One line of output.
#[derive(Serialize)]
struct Line<'a> {
    origin: u64,
    seq: u64,
    class: &'a str,
    key: std::borrow::Cow<'a, str>,
    ingress_us: u64,
    /// The node whose batch carried it (differs from `origin` when a peer
    /// carried it).
    node: u64,
    payload: std::borrow::Cow<'a, str>,
}

/// Where lines go, and how many bytes of a file are written.
enum Output {
    Stdout(BufWriter<std::io::Stdout>),
    File { out: BufWriter<File>, len: u64 },
}

impl Output {
    fn open(path: Option<&Path>, committed: Option<u64>) -> anyhow::Result<Output> {
        let Some(path) = path else {
            return Ok(Output::Stdout(BufWriter::new(std::io::stdout())));
        };
        let existed = path.exists();
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("opening the output {}", path.display()))?;
        if !existed {
            // Its name is synced before anything in it is committed: a
            // power cut must not take the file the state says holds what
            // was handed on.
            sync_dir_of(path)
                .with_context(|| format!("syncing the directory of {}", path.display()))?;
        }
        let mut len = file.metadata()?.len();
        if let Some(committed) = committed {
            if len < committed {
                bail!(
                    "the output {} holds {len} bytes but the state says {committed} were committed: it was changed or replaced; move the state file away to start over",
                    path.display()
                );
            }
            if len > committed {
                // Lines written after the last commit: their messages were
                // not acknowledged and come again.
                file.set_len(committed)
                    .with_context(|| format!("truncating {}", path.display()))?;
                len = committed;
            }
        }
        Ok(Output::File {
            out: BufWriter::with_capacity(1 << 16, file),
            len,
        })
    }

    fn write_line(&mut self, line: &[u8]) -> std::io::Result<()> {
        match self {
            Output::Stdout(o) => {
                o.write_all(line)?;
                o.write_all(b"\n")
            }
            Output::File { out, len } => {
                out.write_all(line)?;
                out.write_all(b"\n")?;
                *len += line.len() as u64 + 1;
                Ok(())
            }
        }
    }

    /// Bytes of a file output, written or not yet flushed.
    fn len(&self) -> Option<u64> {
        match self {
            Output::Stdout(_) => None,
            Output::File { len, .. } => Some(*len),
        }
    }

    /// Flushes (and for a file, syncs); the committed length.
    fn commit(&mut self) -> std::io::Result<Option<u64>> {
        match self {
            Output::Stdout(o) => o.flush().map(|()| None),
            Output::File { out, len } => {
                out.flush()?;
                out.get_ref().sync_data()?;
                Ok(Some(*len))
            }
        }
    }
}

/// Reads the state file, if it exists.
fn load_state(path: &Path) -> anyhow::Result<Option<State>> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .with_context(|| format!("reading the state {}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading the state {}", path.display())),
    }
}

/// Writes the state file by rename, synced.
fn store_state(path: &Path, state: &State) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = File::create(&tmp).with_context(|| format!("writing {}", tmp.display()))?;
    serde_json::to_writer(&mut f, state)?;
    f.sync_data()?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming onto {}", path.display()))?;
    sync_dir_of(path)?;
    Ok(())
}

/// Syncs the directory holding `path` (the current one for a bare name),
/// so that a name created or renamed in it survives a power cut.
fn sync_dir_of(path: &Path) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

/// What is read and not yet committed, and how to commit it.
pub(super) struct Commits {
    output: Output,
    dedupe: Dedupe,
    /// Totals of earlier runs (from the state).
    totals: ConsumeReport,
    /// This run's.
    pub(super) run: ConsumeReport,
    pub(super) stream_offset: Option<u64>,
    /// Kafka: the next offset to read, per partition.
    pub(super) kafka_offsets: std::collections::BTreeMap<i32, i64>,
    /// The last delivery tag not acknowledged.
    pending: Option<u64>,
    pub(super) pending_count: usize,
    state: Option<PathBuf>,
}

impl Commits {
    /// Where the last run stopped (`opts.state`), or a fresh start: the
    /// origins seen, the totals, the stream offset, and the output cut back
    /// to what was committed.
    pub(super) fn restore(opts: &ConsumeOptions) -> anyhow::Result<Commits> {
        let stored = match &opts.state {
            Some(p) => load_state(p)?,
            None => None,
        };
        if stored.is_some() && opts.output.is_none() {
            eprintln!("weir consume: resuming to stdout: lines written after the last commit before a crash may repeat; use --output for exactly once");
        }
        Commits::start(
            opts.output.as_deref(),
            opts.state.clone(),
            stored,
            opts.window,
        )
    }

    /// Picks up from `stored` (a state file's contents), or starts afresh:
    /// the origins seen, the totals, the stream offset, and the output cut
    /// back to what was committed. A first run with a state file (`state`
    /// given, nothing `stored`) saves its state before anything is read,
    /// with the output's length as committed: without it, a crash after
    /// the first commit synced the output but before its state was written
    /// would leave lines in the output that no state accounts for, and
    /// their messages, never acknowledged, would be handed on again.
    fn start(
        output: Option<&Path>,
        state: Option<PathBuf>,
        stored: Option<State>,
        window: usize,
    ) -> anyhow::Result<Commits> {
        let fresh = stored.is_none();
        let mut dedupe = Dedupe::new(window);
        let mut totals = ConsumeReport::default();
        let (mut stream_offset, mut committed_len) = (None, None);
        let mut kafka_offsets = Default::default();
        if let Some(s) = stored {
            dedupe.restore(
                s.origins.into_iter().map(|o| {
                    (
                        o.origin,
                        OriginSeen {
                            floor: o.floor,
                            ranges: o.ranges.into_iter().map(|[a, b]| (a, b)).collect(),
                        },
                    )
                }),
                DedupeCounts::default(),
            );
            totals = s.report;
            stream_offset = s.stream_offset;
            kafka_offsets = s.kafka_offsets;
            committed_len = s.output_len;
        }
        let c = Commits {
            output: Output::open(output, committed_len)?,
            dedupe,
            totals,
            run: ConsumeReport::default(),
            stream_offset,
            kafka_offsets,
            pending: None,
            pending_count: 0,
            state,
        };
        if fresh {
            c.save(c.output.len())?;
        }
        Ok(c)
    }

    /// One message: its batch's records not seen before written as lines
    /// (`line` is the buffer for one), or, if it holds no weir batch, the
    /// message rejected (skipped on a stream). It is acknowledged at the
    /// next commit.
    pub(super) async fn take(
        &mut self,
        channel: &lapin::Channel,
        delivery: &lapin::message::Delivery,
        opts: &ConsumeOptions,
        line: &mut Vec<u8>,
    ) -> anyhow::Result<()> {
        self.run.messages += 1;
        let offset = crate::egress::amqp::header_u64(&delivery.properties, "x-stream-offset");
        let encoding = delivery
            .properties
            .content_encoding()
            .as_ref()
            .map(|s| s.to_string())
            .unwrap_or_default();
        let tag = delivery.delivery_tag;
        match weir_proto::decode_batch(&delivery.data, &encoding, opts.max_size) {
            Ok(batch) => self.write_records(&batch, opts.payload, line)?,
            Err(e) => {
                self.run.undecodable += 1;
                eprintln!(
                    "weir consume: message {tag} is not a weir batch ({e}); {}",
                    if opts.stream {
                        "skipped"
                    } else {
                        "rejected (to the dead-letter exchange, if the queue has one)"
                    }
                );
                if !opts.stream {
                    // Ack what came before it first: a reject is not
                    // "multiple".
                    self.commit(channel).await?;
                    channel
                        .basic_reject(tag, BasicRejectOptions { requeue: false })
                        .await?;
                    if offset.is_some() {
                        self.stream_offset = offset;
                    }
                    return Ok(());
                }
            }
        }
        if offset.is_some() {
            self.stream_offset = offset;
        }
        self.pending = Some(tag);
        self.pending_count += 1;
        Ok(())
    }

    /// Writes a line for each record of `batch` not seen before.
    pub(super) fn write_records(
        &mut self,
        batch: &weir_proto::pb::Batch,
        format: PayloadFormat,
        line: &mut Vec<u8>,
    ) -> anyhow::Result<()> {
        let engine = base64::engine::general_purpose::STANDARD;
        for r in &batch.records {
            match self.dedupe.admit(r.origin, r.seq) {
                Verdict::Duplicate => {
                    self.run.duplicates += 1;
                    continue;
                }
                Verdict::Unverified => self.run.unverified += 1,
                Verdict::New => {}
            }
            self.run.records += 1;
            let payload = match format {
                PayloadFormat::Base64 => engine.encode(&r.payload).into(),
                PayloadFormat::Text => String::from_utf8_lossy(&r.payload),
            };
            line.clear();
            serde_json::to_writer(
                &mut *line,
                &Line {
                    origin: r.origin,
                    seq: r.seq,
                    class: &r.class,
                    key: std::borrow::Cow::Borrowed(r.key.as_str()),
                    ingress_us: r.ingress_us,
                    node: batch.node,
                    payload,
                },
            )?;
            self.output.write_line(line).context("writing the output")?;
        }
        Ok(())
    }

    /// Output, then state, then acknowledgements: a crash between two
    /// steps re-reads messages, never loses or repeats a record.
    pub(super) async fn commit(&mut self, channel: &lapin::Channel) -> anyhow::Result<()> {
        let Some(tag) = self.pending.take() else {
            return Ok(());
        };
        self.commit_local()?;
        channel
            .basic_ack(tag, BasicAckOptions { multiple: true })
            .await
            .context("acknowledging")?;
        Ok(())
    }

    /// Writes (and for a file, syncs) the output, then the state; what
    /// was read since the last commit is then committed.
    pub(super) fn commit_local(&mut self) -> anyhow::Result<()> {
        let len = self.output.commit().context("writing the output")?;
        self.save(len)?;
        self.pending_count = 0;
        Ok(())
    }
}

impl Commits {
    /// Writes the state file, if there is one, with `output_len` as the
    /// output's committed length.
    pub(super) fn save(&self, output_len: Option<u64>) -> anyhow::Result<()> {
        let Some(path) = &self.state else {
            return Ok(());
        };
        let mut report = self.totals;
        add(&mut report, &self.run);
        let state = State {
            output_len,
            stream_offset: self.stream_offset,
            kafka_offsets: self.kafka_offsets.clone(),
            report,
            origins: self
                .dedupe
                .origins()
                .map(|(origin, s)| StoredOrigin {
                    origin,
                    floor: s.floor,
                    ranges: s.ranges.iter().map(|(&a, &b)| [a, b]).collect(),
                })
                .collect(),
        };
        store_state(path, &state)
    }
}

fn add(total: &mut ConsumeReport, run: &ConsumeReport) {
    total.messages += run.messages;
    total.records += run.records;
    total.duplicates += run.duplicates;
    total.unverified += run.unverified;
    total.undecodable += run.undecodable;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_parse_as_written() {
        assert_eq!("first".parse(), Ok(StartOffset::First));
        assert_eq!("next".parse(), Ok(StartOffset::Next));
        assert_eq!("42".parse(), Ok(StartOffset::At(42)));
        assert!("soon".parse::<StartOffset>().is_err());
    }

    #[test]
    fn a_restart_truncates_uncommitted_lines_and_refuses_a_shorter_file() {
        let dir = std::env::temp_dir().join(format!("weir-consume-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("out.jsonl");
        std::fs::write(&path, b"committed\nnot committed\n").unwrap();
        let out = Output::open(Some(&path), Some(10)).unwrap();
        drop(out);
        assert_eq!(std::fs::read(&path).unwrap(), b"committed\n");
        let err = Output::open(Some(&path), Some(100)).err().expect("refused");
        assert!(err.to_string().contains("was changed or replaced"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_crash_before_the_first_state_drops_what_that_run_wrote() {
        let dir = std::env::temp_dir().join(format!("weir-consume-first-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (path, state) = (dir.join("out.jsonl"), dir.join("state.json"));
        // What the file held before weir consume was pointed at it stays.
        std::fs::write(&path, b"earlier\n").unwrap();
        let mut first = Commits::start(Some(&path), Some(state.clone()), None, 64).unwrap();
        first.output.write_line(b"read").unwrap();
        // The first commit syncs the output; the process dies before it
        // writes the state.
        first.output.commit().unwrap();
        drop(first);
        let stored = load_state(&state).unwrap().expect("written before reading");
        assert_eq!(stored.output_len, Some(8));
        drop(Commits::start(Some(&path), Some(state), Some(stored), 64).unwrap());
        assert_eq!(std::fs::read(&path).unwrap(), b"earlier\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
