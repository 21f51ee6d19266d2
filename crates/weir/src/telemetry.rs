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
        );
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}
