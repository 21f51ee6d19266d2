//! `weir top`: a terminal view of a running weir, read from its admin
//! listener's `/metrics` every second and drawn in 80x24 (usable over
//! SSH): per class arrivals, queue depth, token rate, latency p50/p99
//! against the bound and late records; the link estimate, the codec chosen
//! and its ratio; the peers' spare and shortage and what went through them.
//!
//! Without a terminal (piped into a file or another program) it prints
//! each frame as plain text instead, as `top -b` does.
//!
//! [`model`] turns two scrapes into a frame (pure); [`view`] draws it;
//! this file owns the terminal, the keyboard and the HTTP request.

pub mod model;
pub mod view;

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyModifiers};
use ratatui::Terminal;

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
    if !std::io::stdout().is_terminal() {
        return print_frames(&opts, first);
    }
    let mut terminal = ratatui::init();
    let result = run_on(&mut terminal, &opts, first);
    ratatui::restore();
    result
}

/// Without a terminal (output piped into a file or another program, as
/// `top -b` does): each refresh printed as the 80x24 frame's plain text
/// (its empty lines at the bottom left out), frames separated by a blank
/// line, until `frames`, or quietly once the reader has gone.
fn print_frames(opts: &TopOptions, first: String) -> std::io::Result<()> {
    let mut screen = Terminal::new(TestBackend::new(80, 24))?;
    let mut out = std::io::stdout().lock();
    let mut poller = Poller::new(opts, first);
    let mut frames = 0u64;
    loop {
        std::thread::sleep(poller.until_next());
        poller.refresh();
        screen.draw(|f| view::draw(f, f.area(), &poller.header, poller.shown.as_ref()))?;
        let text: String = screen
            .backend()
            .buffer()
            .content()
            .chunks(80)
            .map(|row| {
                row.iter()
                    .map(|c| c.symbol())
                    .collect::<String>()
                    .trim_end()
                    .to_owned()
                    + "\n"
            })
            .collect();
        match writeln!(out, "{}\n", text.trim_end()).and_then(|()| out.flush()) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            written => written?,
        }
        frames += 1;
        if opts.frames.is_some_and(|n| frames >= n) {
            return Ok(());
        }
    }
}

/// The scrapes behind the frames: the last one, and the frame drawn from
/// it and the one before.
struct Poller {
    addr: SocketAddr,
    interval: Duration,
    header: Header,
    last: (Instant, Scrape),
    shown: Option<model::Frame>,
    next: Instant,
}

impl Poller {
    fn new(opts: &TopOptions, first: String) -> Self {
        Poller {
            addr: opts.addr,
            interval: opts.interval,
            header: Header {
                source: format!("http://{}", opts.addr),
                interval: opts.interval.as_secs_f64(),
                error: None,
            },
            last: (Instant::now(), Scrape::new(&first)),
            shown: None,
            next: Instant::now() + opts.interval,
        }
    }

    /// How long until the next refresh is due.
    fn until_next(&self) -> Duration {
        self.next.saturating_duration_since(Instant::now())
    }

    /// Scrapes again: the frame shows what changed since the last scrape,
    /// or the header says why there is no new one.
    fn refresh(&mut self) {
        self.next += self.interval;
        match fetch(self.addr) {
            Ok(text) => {
                let now = (Instant::now(), Scrape::new(&text));
                self.shown = Some(frame(
                    &self.last.1,
                    &now.1,
                    now.0.duration_since(self.last.0).as_secs_f64(),
                ));
                self.last = now;
                self.header.error = None;
            }
            Err(e) => self.header.error = Some(format!("scrape failed: {e}")),
        }
    }
}

fn run_on(
    terminal: &mut ratatui::DefaultTerminal,
    opts: &TopOptions,
    first: String,
) -> std::io::Result<()> {
    let mut poller = Poller::new(opts, first);
    let mut frames = 0u64;
    loop {
        terminal.draw(|f| view::draw(f, f.area(), &poller.header, poller.shown.as_ref()))?;
        if opts.frames.is_some_and(|n| frames >= n) {
            return Ok(());
        }
        // Keys until the next refresh is due.
        loop {
            let wait = poller.until_next();
            if wait.is_zero() {
                break;
            }
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
        poller.refresh();
        frames += 1;
    }
}
