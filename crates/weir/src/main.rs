//! The `weir` command line: run the relay, and the commands around it
//! (check or print a config, probe the link, consume and decode batches,
//! and `top`, `reload` and `health` against a running weir).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use weir::config::{self, Config, ConfigError};

/// Exit code for a configuration that cannot be used (as sysexits' EX_USAGE
/// family; the brief asks for 2).
const EXIT_BAD_CONFIG: u8 = 2;
/// Exit code for a runtime failure after a good start.
const EXIT_RUNTIME: u8 = 1;

#[derive(Parser)]
#[command(
    name = "weir",
    version,
    about = "Latency-aware edge relay: MQTT and gRPC in, AMQP out"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the relay. Without --config, the embedded defaults are used.
    Run {
        /// TOML config file.
        #[arg(short, long)]
        config: Option<PathBuf>,
    },
    /// Validate a config file, list every problem, and exit (0 valid, 2 not).
    CheckConfig {
        /// TOML config file.
        file: PathBuf,
    },
    /// Ask a running weir to reload its config file (POST /reload on its
    /// admin listener, which must be on): prints what was applied, or every
    /// problem if the file was refused (exit 1). Without an admin listener,
    /// send SIGHUP instead (`systemctl reload weir`).
    Reload {
        /// The running weir's config file (its admin.listen is used).
        #[arg(short, long, default_value = "/etc/weir/weir.toml")]
        config: PathBuf,
    },
    /// Exit 0 if a running weir answers on its admin listener's /healthz,
    /// 1 (saying why) if not: a container's health check, a monitoring
    /// probe.
    Health {
        /// The running weir's config file (its admin.listen is used).
        #[arg(short, long, default_value = "/etc/weir/weir.toml")]
        config: PathBuf,
        /// The admin listener to ask, instead of the config's.
        #[arg(long)]
        admin: Option<std::net::SocketAddr>,
    },
    /// A live view of a running weir in the terminal (80x24 is enough):
    /// per class arrivals, queue, token rate, latency p50/p99 against the
    /// bound and late records; the link, compression and peers. Reads the
    /// admin listener's /metrics every second. q quits.
    Top {
        /// The running weir's config file (its admin.listen is read).
        #[arg(short, long, default_value = "/etc/weir/weir.toml")]
        config: PathBuf,
        /// The admin listener to read, instead of the config's.
        #[arg(long)]
        admin: Option<std::net::SocketAddr>,
        /// Seconds between refreshes.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
        /// Exit after this many refreshes.
        #[arg(long)]
        frames: Option<u64>,
    },
    /// Print shell completions (bash, zsh, fish, elvish, powershell).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Write the man pages (weir.1 and one per subcommand), as the
    /// packages install them, into a directory.
    #[command(hide = true)]
    Manpages {
        /// Where to write them.
        dir: PathBuf,
    },
    /// Print the embedded default config (a commented starting point).
    PrintDefaultConfig,
    /// Measure the uplink once: two transfer sizes through the configured
    /// egress give its bandwidth and fixed per-transaction time (piping
    /// paper Eq. 5-6). Probe batches carry no records.
    ProbeLink {
        /// TOML config file (its egress and emulated link are probed);
        /// the embedded defaults without it.
        #[arg(short, long)]
        config: Option<PathBuf>,
        /// Padding bytes of the small transfer.
        #[arg(long, default_value_t = 1024)]
        small: u64,
        /// Padding bytes of the large transfer.
        #[arg(long, default_value_t = 256 * 1024)]
        large: u64,
    },
    /// Read weir's batches from a RabbitMQ queue or stream and hand each
    /// record on once, as JSON lines (stdout, or --output), deduplicated by
    /// (origin, seq); messages are acknowledged only after their records
    /// are written (and, with --state, the state stored). With --output
    /// and --state a restart, even after kill -9, hands no record on
    /// twice. The format: docs/consuming.md.
    Consume(ConsumeArgs),
    /// Print the records of the file egress's segment files (every batch
    /// in it), a single batch body, or an AMQP message body on stdin with
    /// `-`.
    Decode {
        /// Segment file, batch body file, or `-` for stdin.
        file: PathBuf,
        /// A batch body's content encoding (`identity`, `gzip`, `zstd`);
        /// segments carry each batch's own. By default taken from a
        /// `<node>-<seq>.<encoding>.weirbatch` name, else from the body's
        /// first bytes (gzip's or zstd's magic), else `identity`.
        #[arg(long)]
        encoding: Option<String>,
        /// Refuse batches that decode to more than this many bytes; a
        /// compressed body is expanded only up to this cap, so a
        /// compression bomb is refused, not inflated.
        #[arg(long, default_value_t = weir_proto::codec::DEFAULT_MAX_DECODED)]
        max_size: usize,
    },
}

/// `weir consume`'s options.
#[derive(clap::Args)]
struct ConsumeArgs {
    /// A weir config whose [egress.amqp] gives the URL (the first of
    /// urls), the queue and whether it is a stream, or whose
    /// [egress.kafka] gives the brokers (with TLS and SASL) and the topic;
    /// the options below override it.
    #[arg(short, long)]
    config: Option<PathBuf>,
    /// Read from these Kafka brokers (comma-separated host:port) instead
    /// of RabbitMQ.
    #[arg(long, value_delimiter = ',')]
    kafka: Vec<String>,
    /// The Kafka topic to read.
    #[arg(long)]
    topic: Option<String>,
    /// The broker, e.g. amqp://guest:guest@127.0.0.1:5672/%2f.
    #[arg(long)]
    url: Option<String>,
    /// The queue or stream to read.
    #[arg(long)]
    queue: Option<String>,
    /// The queue is a stream (x-queue-type = stream): read from an
    /// offset.
    #[arg(long)]
    stream: bool,
    /// Where a stream starts without a stored offset: first, last, next
    /// or a number.
    #[arg(long, default_value = "first")]
    offset: weir::consume::StartOffset,
    /// Append JSON lines to this file instead of stdout.
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Keep the deduplication state, the output's committed length and
    /// a stream's offset in this file, to resume where it stopped.
    #[arg(long)]
    state: Option<PathBuf>,
    /// Messages delivered and not yet acknowledged, at most.
    #[arg(long, default_value_t = 64)]
    prefetch: u16,
    /// How payloads are written.
    #[arg(long, value_enum, default_value = "base64")]
    payload: weir::consume::PayloadFormat,
    /// Exit once no message has come for this long (e.g. 5s).
    #[arg(long)]
    idle_exit: Option<humantime::Duration>,
    /// Exit once this many records have been handed on.
    #[arg(long)]
    max_records: Option<u64>,
    /// Gaps in each origin's sequence numbers remembered at once;
    /// older records are handed on, counted as unverified.
    #[arg(long, default_value_t = weir_core::dedupe::DEFAULT_MAX_RANGES)]
    window: usize,
    /// Refuse batches that decode to more than this many bytes.
    #[arg(long, default_value_t = weir_proto::codec::DEFAULT_MAX_DECODED)]
    max_size: usize,
}

/// Where `weir consume` reads: an AMQP URL, queue and whether it is a
/// stream, or a Kafka topic; from the options, else the config's egress.
fn consume_source(
    config: Option<&PathBuf>,
    url: Option<String>,
    queue: Option<String>,
    stream: bool,
    kafka: Vec<String>,
    topic: Option<String>,
) -> Result<(String, String, bool, Option<config::KafkaEgress>), String> {
    let sink = match config {
        Some(path) => match load(Some(path)) {
            Ok(cfg) => Some(cfg.egress.sink),
            Err(e) => {
                report(Some(path), &e);
                return Err(format!("{} is not a valid config", path.display()));
            }
        },
        None => None,
    };
    let (amqp, from_config) = match sink {
        Some(config::EgressSink::Amqp(a)) => (Some(a), None),
        Some(config::EgressSink::Kafka(k)) => (None, Some(k)),
        Some(config::EgressSink::File(_) | config::EgressSink::Mqtt(_)) => {
            return Err(format!(
                "{} has egress.kind = \"file\" or \"mqtt\"; weir decode reads segments and batch bodies; give an AMQP or Kafka config, --url and --queue, or --kafka and --topic",
                config.map_or(String::new(), |p| p.display().to_string())
            ))
        }
        None => (None, None),
    };
    if !kafka.is_empty() || from_config.is_some() {
        let mut k = match from_config {
            Some(k) if kafka.is_empty() => k,
            Some(mut k) => {
                k.brokers = kafka;
                k
            }
            None => config::KafkaEgress::plain(kafka, String::new()),
        };
        if let Some(t) = topic {
            k.topic = t;
        }
        if k.topic.is_empty() || k.topic_is_template() {
            return Err(format!(
                "which Kafka topic? {}; name one with --topic",
                if k.topic.is_empty() {
                    "none given".to_owned()
                } else {
                    format!("the config's topic {:?} is a template", k.topic)
                }
            ));
        }
        return Ok((String::new(), String::new(), false, Some(k)));
    }
    let url = url
        .or_else(|| amqp.as_ref().and_then(|a| a.urls.first().cloned()))
        .unwrap_or_else(|| config::AMQP_URL.to_owned());
    let queue = queue
        .or_else(|| amqp.as_ref().map(|a| a.queue.clone()))
        .unwrap_or_else(|| config::AMQP_QUEUE.to_owned());
    if queue.is_empty() {
        return Err("the config declares no queue (queue = \"\"); name one with --queue".into());
    }
    let stream = stream
        || amqp
            .as_ref()
            .is_some_and(|a| a.queue_type == config::QueueType::Stream);
    Ok((url, queue, stream, None))
}

fn decode(file: &std::path::Path, encoding: Option<String>, max_size: usize) -> anyhow::Result<()> {
    use anyhow::Context;
    use std::io::Read;
    use weir_proto::segment;
    let body = if file.as_os_str() == "-" {
        let mut b = Vec::new();
        std::io::stdin()
            .read_to_end(&mut b)
            .context("reading stdin")?;
        b
    } else {
        std::fs::read(file).with_context(|| format!("reading {}", file.display()))?
    };
    let mut out = std::io::stdout().lock();
    if encoding.is_none() && body.starts_with(&segment::MAGIC) {
        // A segment: every batch in it.
        let seg = segment::read(&body);
        for f in &seg.frames {
            let batch = weir_proto::decode_batch(f.body, f.header.encoding.as_str(), max_size)
                .with_context(|| {
                    format!(
                        "decoding the batch at offset {} of {}",
                        f.offset,
                        file.display()
                    )
                })?;
            print_batch(&mut out, &batch, Some(&f.header))?;
        }
        for r in &seg.damaged {
            eprintln!(
                "weir decode: {}: bytes {}..{} hold no intact batch (torn by a crash or damaged); skipped",
                file.display(),
                r.start,
                r.end
            );
        }
        return Ok(());
    }
    let encoding = encoding.unwrap_or_else(|| {
        // `<node>-<seq>.<encoding>.weirbatch`
        let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let parts: Vec<&str> = name.split('.').collect();
        match parts.as_slice() {
            [.., enc, "weirbatch"] if parts.len() >= 3 => (*enc).to_string(),
            // A body without a name that says (the MQTT egress's batch
            // mode): its first bytes do.
            _ => weir_proto::Encoding::sniff(&body).as_str().to_string(),
        }
    });
    let batch = weir_proto::decode_batch(&body, &encoding, max_size)
        .with_context(|| format!("decoding {}", file.display()))?;
    Ok(print_batch(&mut out, &batch, None)?)
}

/// One batch's line and its records' lines.
fn print_batch(
    out: &mut impl std::io::Write,
    batch: &weir_proto::pb::Batch,
    frame: Option<&weir_proto::segment::FrameHeader>,
) -> std::io::Result<()> {
    write!(
        out,
        "batch node={} seq={} created_us={} records={}",
        batch.node,
        batch.batch_seq,
        batch.created_us,
        batch.records.len()
    )?;
    if let Some(h) = frame {
        write!(
            out,
            " written_us={} encoding={} bytes={}",
            h.written_us,
            h.encoding.as_str(),
            h.len
        )?;
    }
    writeln!(out)?;
    for r in &batch.records {
        writeln!(
            out,
            "origin={} seq={} class={} key={:?} ingress_us={} bytes={} payload=\"{}\"",
            r.origin,
            r.seq,
            r.class,
            r.key,
            r.ingress_us,
            r.payload.len(),
            r.payload.escape_ascii()
        )?;
    }
    Ok(())
}

/// `weir consume`: the options, with the config's `[egress.amqp]` where
/// one is given.
fn consume(args: ConsumeArgs) -> ExitCode {
    let ConsumeArgs {
        config,
        kafka,
        topic,
        url,
        queue,
        stream,
        offset,
        output,
        state,
        prefetch,
        payload,
        idle_exit,
        max_records,
        window,
        max_size,
    } = args;
    let (url, queue, stream, kafka) =
        match consume_source(config.as_ref(), url, queue, stream, kafka, topic) {
            Ok(source) => source,
            Err(why) => {
                eprintln!("weir consume: {why}");
                return ExitCode::from(EXIT_BAD_CONFIG);
            }
        };
    let opts = weir::consume::ConsumeOptions {
        url,
        queue,
        stream,
        offset,
        output,
        state,
        prefetch,
        payload,
        idle_exit: idle_exit.map(Into::into),
        max_records,
        window,
        max_size,
        kafka,
    };
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("weir consume: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_RUNTIME);
        }
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let result = rt.block_on(async {
        let signals = stop.clone();
        tokio::spawn(async move {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
            }
            signals.cancel();
        });
        weir::consume::run(opts, stop).await
    });
    match result {
        Ok(r) => {
            eprintln!(
                "weir consume: {} messages, {} records handed on, {} duplicates dropped, {} unverified, {} undecodable",
                r.messages, r.records, r.duplicates, r.unverified, r.undecodable
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("weir consume: {e:#}");
            ExitCode::from(EXIT_RUNTIME)
        }
    }
}

/// Whether `e` is a write to a pipe whose reader has gone.
fn broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// `weir top`.
fn top(
    path: &PathBuf,
    admin: Option<std::net::SocketAddr>,
    interval: f64,
    frames: Option<u64>,
) -> ExitCode {
    let addr = match admin.map_or_else(|| admin_addr(path), Ok) {
        Ok(a) => a,
        Err(code) => return code,
    };
    if !(interval.is_finite() && interval >= 0.1) {
        eprintln!("weir top: --interval must be at least 0.1 (seconds)");
        return ExitCode::from(EXIT_BAD_CONFIG);
    }
    let opts = weir::top::TopOptions {
        addr,
        interval: std::time::Duration::from_secs_f64(interval),
        frames,
    };
    match weir::top::run(opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("weir top: {e}");
            ExitCode::from(EXIT_RUNTIME)
        }
    }
}

/// `weir health`: GET /healthz from the admin listener.
fn health(path: &PathBuf, admin: Option<std::net::SocketAddr>) -> ExitCode {
    let addr = match admin.map_or_else(|| admin_addr(path), Ok) {
        Ok(a) => a,
        Err(code) => return code,
    };
    match weir::admin::request(addr, "GET", "/healthz", std::time::Duration::from_secs(5)) {
        Ok((200, _)) => ExitCode::SUCCESS,
        Ok((status, body)) => {
            eprintln!(
                "weir health: http://{addr}/healthz answered {status}: {}",
                body.trim()
            );
            ExitCode::from(EXIT_RUNTIME)
        }
        Err(e) => {
            eprintln!("weir health: no answer from http://{addr}/healthz: {e}");
            ExitCode::from(EXIT_RUNTIME)
        }
    }
}

/// The plain-HTTP admin address of the weir running with config `path`
/// (an unspecified address means this host), or the exit code after
/// saying why there is none.
fn admin_addr(path: &PathBuf) -> Result<std::net::SocketAddr, ExitCode> {
    let cfg = load(Some(path)).map_err(|e| {
        report(Some(path), &e);
        ExitCode::from(EXIT_BAD_CONFIG)
    })?;
    let Some(mut addr) = cfg.admin.listen else {
        eprintln!(
            "weir: admin.listen is off in {}; turn it on (e.g. \"127.0.0.1:9464\") to use this command",
            path.display()
        );
        return Err(ExitCode::from(EXIT_RUNTIME));
    };
    if cfg.admin.tls.is_some() {
        eprintln!(
            "weir: the admin listener at {addr} uses TLS, which this command does not speak yet"
        );
        return Err(ExitCode::from(EXIT_RUNTIME));
    }
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    Ok(addr)
}

/// `weir reload`: POST /reload to the admin listener of the weir running
/// with `path`.
fn reload(path: &PathBuf) -> ExitCode {
    let addr = match admin_addr(path) {
        Ok(a) => a,
        Err(code) => {
            eprintln!(
                "weir reload: send SIGHUP instead (systemctl reload weir, or kill -HUP <pid>)"
            );
            return code;
        }
    };
    let answer = weir::admin::request(addr, "POST", "/reload", std::time::Duration::from_secs(60));
    match answer {
        Ok((status, body)) => {
            print!("{body}");
            match status {
                200 => ExitCode::SUCCESS,
                _ => ExitCode::from(1),
            }
        }
        Err(e) => {
            eprintln!(
                "weir reload: cannot reach weir's admin listener at {addr} (admin.listen): {e}"
            );
            ExitCode::from(EXIT_RUNTIME)
        }
    }
}

/// The config, validated.
fn load(path: Option<&PathBuf>) -> Result<Config, ConfigError> {
    match path {
        Some(p) => config::load(p),
        None => config::parse(config::DEFAULT_CONFIG, "<embedded defaults>"),
    }
}

/// The config, validated, with the files it names (certificates, keys,
/// password, ACL and token files) read and checked too; `weir run` reads
/// them once, as it starts.
fn load_checked(path: Option<&PathBuf>) -> Result<Config, ConfigError> {
    let cfg = load(path)?;
    let problems = weir::security::check(&cfg);
    if problems.is_empty() {
        Ok(cfg)
    } else {
        Err(ConfigError::Invalid(problems))
    }
}

/// Prints a config error naming the file (TOML and I/O errors name it
/// already; validation problems are listed under it).
fn report(path: Option<&PathBuf>, e: &ConfigError) {
    match (e, path) {
        (ConfigError::Invalid(_), Some(p)) => eprintln!("{}: {e}", p.display()),
        _ => eprintln!("{e}"),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::PrintDefaultConfig => {
            print!("{}", config::DEFAULT_CONFIG);
            ExitCode::SUCCESS
        }
        Command::Decode {
            file,
            encoding,
            max_size,
        } => match decode(&file, encoding, max_size) {
            Ok(()) => ExitCode::SUCCESS,
            // The reader went away (`weir decode ... | head`): done, as
            // other filters are.
            Err(e) if broken_pipe(&e) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("weir decode: {e:#}");
                ExitCode::from(EXIT_RUNTIME)
            }
        },
        Command::ProbeLink {
            config,
            small,
            large,
        } => probe_link(config.as_ref(), small, large),
        Command::CheckConfig { file } => check_config(&file),
        Command::Reload { config } => reload(&config),
        Command::Health { config, admin } => health(&config, admin),
        Command::Consume(args) => consume(args),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "weir", &mut std::io::stdout());
            ExitCode::SUCCESS
        }
        Command::Manpages { dir } => {
            use clap::CommandFactory;
            match clap_mangen::generate_to(Cli::command(), &dir) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("weir manpages: {}: {e}", dir.display());
                    ExitCode::from(EXIT_RUNTIME)
                }
            }
        }
        Command::Top {
            config,
            admin,
            interval,
            frames,
        } => top(&config, admin, interval, frames),
        Command::Run { config } => run(config.as_ref()),
    }
}

/// `weir probe-link`.
fn probe_link(config: Option<&PathBuf>, small: u64, large: u64) -> ExitCode {
    let cfg = match load(config) {
        Ok(c) => c,
        Err(e) => {
            report(config, &e);
            return ExitCode::from(EXIT_BAD_CONFIG);
        }
    };
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("weir probe-link: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_RUNTIME);
        }
    };
    match rt.block_on(weir::egress::probe::probe_link(&cfg, small, large)) {
        Ok(r) => {
            println!(
                "small {} B in {:.1} ms, large {} B in {:.1} ms",
                r.small.0,
                r.small.1.as_secs_f64() * 1e3,
                r.large.0,
                r.large.1.as_secs_f64() * 1e3
            );
            println!(
                "uplink {:.0} bytes/s ({:.3} Mbit/s), per-transaction time {:.1} ms",
                r.estimate.bytes_per_sec,
                r.estimate.bytes_per_sec * 8.0 / 1e6,
                r.estimate.per_transaction.as_secs_f64() * 1e3
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("weir probe-link: {e:#}");
            ExitCode::from(EXIT_RUNTIME)
        }
    }
}

/// `weir check-config`.
fn check_config(file: &PathBuf) -> ExitCode {
    match load_checked(Some(file)) {
        Ok(cfg) => {
            // Not a config error (space may free before weir starts), but
            // what the operator should know now.
            let warning = cfg
                .spooled()
                .then(|| weir::spool::check_space(&cfg.spool))
                .flatten();
            if let Some(w) = &warning {
                eprintln!("{}: warning: {w}", file.display());
            }
            // What the memory limit makes of the queues, as start-up will
            // derive it (on this machine, in this cgroup).
            let limit = weir::memory::resolve(cfg.node.memory_limit);
            let plan = weir::memory::plan(&cfg, limit.as_ref());
            println!(
                "{}",
                weir::memory::describe(&plan, cfg.node.memory_limit, limit.as_ref())
            );
            println!("{}: ok", file.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            report(Some(file), &e);
            ExitCode::from(EXIT_BAD_CONFIG)
        }
    }
}

/// `weir run`: the config file (or the embedded defaults), then the relay
/// until a signal stops it.
fn run(config: Option<&PathBuf>) -> ExitCode {
    let loaded = match config {
        Some(path) => config::load_text(path).map(|(c, text)| {
            let source = weir::reload::Source {
                path: path.clone(),
                text,
            };
            (c, Some(source))
        }),
        None => load(None).map(|c| (c, None)),
    };
    let (cfg, source) = match loaded {
        Ok(c) => c,
        Err(e) => {
            report(config, &e);
            return ExitCode::from(EXIT_BAD_CONFIG);
        }
    };
    weir::telemetry::init(&cfg.log.level, cfg.log.format);
    match weir::app::run_until_signal(cfg, source) {
        Ok(()) => ExitCode::SUCCESS,
        // A certificate, key, password, ACL or token file that cannot be
        // used is a config problem, read as weir starts.
        Err(e) => match e.config_problems() {
            Some(problems) => {
                report(config, &ConfigError::Invalid(problems.to_vec()));
                ExitCode::from(EXIT_BAD_CONFIG)
            }
            None => {
                eprintln!("weir: {e:#}");
                ExitCode::from(EXIT_RUNTIME)
            }
        },
    }
}
