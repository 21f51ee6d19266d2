//! Logging: `tracing` to stderr, filtered by the config's `[log] level`
//! (overridden by `RUST_LOG` when set), as text or JSON lines
//! (`log.format`). Under systemd (journald's `JOURNAL_STREAM` is set) text
//! lines carry no timestamp or colours, which journald adds or does not
//! want, and start with a syslog priority (`<3>` error ... `<7>` debug), so
//! `journalctl -p warning` works.

use std::fmt;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// The filter: the config's level (or `RUST_LOG`), with the noise of
/// dependencies turned down.
fn filter(level: &str) -> EnvFilter {
    EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"))
        // lapin logs every returned message with its whole body at warn;
        // weir reports returns itself (SinkError::Refused), once per batch.
        .add_directive(
            "lapin::returned_messages=error"
                .parse()
                .expect("a valid directive"),
        )
        // lapin gives up its own connection recovery with an ERROR
        // ("backoff attempts exhausted") on every broker restart; weir
        // reconnects itself and logs the outage at the level it deserves.
        .add_directive("lapin::io_loop=off".parse().expect("a valid directive"))
        // rustls warns of every client that sends an IP address as its
        // server name (mosquitto_pub does, for `-h 10.0.0.7`), once per
        // connection; failed handshakes are logged by weir itself.
        .add_directive("rustls::msgs=error".parse().expect("a valid directive"))
}

/// Whether stderr goes to journald (systemd sets `JOURNAL_STREAM`).
fn under_journald() -> bool {
    std::env::var_os("JOURNAL_STREAM").is_some()
}

/// Text lines with a syslog priority prefix, for journald.
struct Journald<F>(F);

impl<S, N, F> FormatEvent<S, N> for Journald<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let priority = match *event.metadata().level() {
            Level::ERROR => 3,
            Level::WARN => 4,
            Level::INFO => 6,
            Level::DEBUG | Level::TRACE => 7,
        };
        write!(writer, "<{priority}>")?;
        self.0.format_event(ctx, writer, event)
    }
}

/// Installs a new filter in the running subscriber (a reload of
/// `log.level`).
type SetFilter = Box<dyn Fn(EnvFilter) -> Result<(), String> + Send + Sync>;

/// The running subscriber's filter switch, once [`init`] has installed it.
static SET_FILTER: std::sync::OnceLock<SetFilter> = std::sync::OnceLock::new();

/// Installs the global subscriber; a second call is a no-op.
pub fn init(level: &str, format: LogFormat) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter(level))
        .with_writer(std::io::stderr);
    macro_rules! install {
        ($b:expr) => {{
            let b = $b.with_filter_reloading();
            let handle = b.reload_handle();
            if b.try_init().is_ok() {
                let _ = SET_FILTER.set(Box::new(move |f| {
                    handle.reload(f).map_err(|e| e.to_string())
                }));
            }
        }};
    }
    match format {
        LogFormat::Json => install!(builder.json().flatten_event(true)),
        LogFormat::Text if under_journald() => {
            install!(builder.with_ansi(false).event_format(Journald(
                tracing_subscriber::fmt::format()
                    .without_time()
                    .with_ansi(false),
            )))
        }
        LogFormat::Text => {
            install!(builder.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())))
        }
    }
}

/// Switches the running log filter to `level` (still overridden by
/// `RUST_LOG` when set). Without an installed subscriber (tests, the
/// library used on its own) there is nothing to switch.
pub fn set_level(level: &str) {
    if let Some(set) = SET_FILTER.get() {
        if let Err(e) = set(filter(level)) {
            tracing::warn!(error = %e, "log.level not applied");
        }
    }
}

/// How often the same refusal (a failed handshake from one address, a peer
/// speaking as another node) is logged: a client retrying every 100 ms
/// must not flood the log; the metrics count every one.
pub const REPEAT_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// Most distinct keys remembered by [`first_in_a_while`]; beyond it the
/// memory starts over (a scan from many addresses logs a little more, and
/// weir's memory stays bounded).
const REPEAT_KEYS: usize = 1024;

/// Whether an event under `key` should be logged now: the first time, and
/// then at most once per [`REPEAT_LOG_EVERY`].
pub fn first_in_a_while(key: &str) -> bool {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    use std::time::Instant;
    static SEEN: OnceLock<Mutex<HashMap<String, Instant>>> = OnceLock::new();
    let mut seen = SEEN
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let now = Instant::now();
    match seen.get(key) {
        Some(at) if now.duration_since(*at) < REPEAT_LOG_EVERY => false,
        _ => {
            if seen.len() >= REPEAT_KEYS {
                seen.clear();
            }
            seen.insert(key.to_owned(), now);
            true
        }
    }
}
