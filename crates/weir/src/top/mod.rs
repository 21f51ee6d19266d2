//! `weir top`: a terminal view of a running weir, read from its admin
//! listener's `/metrics` every second and drawn in 80x24 (usable over
//! SSH): per class arrivals, queue depth, token rate, latency p50/p99
//! against the bound and late records; the link estimate, the codec chosen
//! and its ratio; the peers' spare and shortage and what went through them.
//!
//! [`model`] turns two scrapes into a frame (pure); [`view`] draws it;
//! this file owns the terminal, the keyboard and the HTTP request.

pub mod model;
pub mod view;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ratatui::crossterm::event::{self, Event, KeyCode, KeyModifiers};

use model::{frame, Scrape};
use view::Header;

/// How `weir top` runs.
#[derive(Debug, Clone)]
pub struct TopOptions {
    /// The admin listener.
    pub addr: SocketAddr,
    /// Between refreshes.
    pub interval: Duration,
    /// Exit after this many refreshes (for scripts and tests).
    pub frames: Option<u64>,
}

/// `GET /metrics` from `addr`, plain HTTP.
pub fn fetch(addr: SocketAddr) -> std::io::Result<String> {
    match crate::admin::request(addr, "GET", "/metrics", Duration::from_secs(5))? {
        (200, body) => Ok(body),
        (status, _) => Err(std::io::Error::other(format!(
            "http://{addr}/metrics answered {status}"
        ))),
    }
}

/// Runs until `q`, Esc or Ctrl-C (or `frames` refreshes).
pub fn run(opts: TopOptions) -> std::io::Result<()> {
    // Fail before taking the terminal over, with a message that says why.
    let first = fetch(opts.addr).map_err(|e| {
        std::io::Error::other(format!(
            "cannot read http://{}/metrics ({e}); is weir running with admin.listen = \"{}\"?",
            opts.addr, opts.addr
        ))
    })?;
    let mut terminal = ratatui::init();
    let result = run_on(&mut terminal, &opts, first);
    ratatui::restore();
    result
}

fn run_on(
    terminal: &mut ratatui::DefaultTerminal,
    opts: &TopOptions,
    first: String,
) -> std::io::Result<()> {
    let mut header = Header {
        source: format!("http://{}", opts.addr),
        interval: opts.interval.as_secs_f64(),
        error: None,
    };
    let mut last = (Instant::now(), Scrape::new(&first));
    let mut shown: Option<model::Frame> = None;
    let mut frames = 0u64;
    let mut next = Instant::now() + opts.interval;
    loop {
        terminal.draw(|f| view::draw(f, f.area(), &header, shown.as_ref()))?;
        if opts.frames.is_some_and(|n| frames >= n) {
            return Ok(());
        }
        // Keys until the next refresh is due.
        while let Some(wait) = next.checked_duration_since(Instant::now()) {
            if event::poll(wait)? {
                if let Event::Key(k) = event::read()? {
                    let ctrl_c =
                        k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                    if matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) || ctrl_c {
                        return Ok(());
                    }
                }
            }
        }
        next += opts.interval;
        match fetch(opts.addr) {
            Ok(text) => {
                let now = (Instant::now(), Scrape::new(&text));
                shown = Some(frame(
                    &last.1,
                    &now.1,
                    now.0.duration_since(last.0).as_secs_f64(),
                ));
                last = now;
                header.error = None;
            }
            Err(e) => header.error = Some(format!("scrape failed: {e}")),
        }
        frames += 1;
    }
}
