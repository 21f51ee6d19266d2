//! Logging: `tracing` to stderr, filtered by the config's `[log] level`
//! (overridden by `RUST_LOG` when set).

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber; a second call is a no-op.
pub fn init(level: &str) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"))
        // lapin logs every returned message with its whole body at warn;
        // weir reports returns itself (SinkError::Refused), once per batch.
        .add_directive(
            "lapin::returned_messages=error"
                .parse()
                .expect("a valid directive"),
        )
        // rustls warns of every client that sends an IP address as its
        // server name (mosquitto_pub does, for `-h 10.0.0.7`), once per
        // connection; failed handshakes are logged by weir itself.
        .add_directive("rustls::msgs=error".parse().expect("a valid directive"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
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
