//! Draws a [`Frame`] in 80x24: a header, the class table (the part that
//! answers "does every class meet its bound"), the link and compression,
//! and the peers. A class whose p99 passes its bound, or with late records
//! in the interval, is shown in red.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table};

use super::model::Frame;

/// What the header says besides the frame.
#[derive(Debug, Clone)]
pub struct Header {
    /// Where the metrics come from.
    pub source: String,
    /// Seconds between refreshes.
    pub interval: f64,
    /// The last scrape's error, if it failed.
    pub error: Option<String>,
}

/// `1234567` as `1.2M`.
pub fn si(v: f64) -> String {
    let a = v.abs();
    if !v.is_finite() {
        "-".to_owned()
    } else if a >= 1e9 {
        format!("{:.1}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else if a >= 10.0 || v == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// Seconds as `850us`, `45ms`, `1.2s`.
pub fn duration(secs: f64) -> String {
    if secs < 1e-3 {
        format!("{:.0}us", secs * 1e6)
    } else if secs < 10e-3 {
        format!("{:.1}ms", secs * 1e3)
    } else if secs < 1.0 {
        format!("{:.0}ms", secs * 1e3)
    } else {
        format!("{secs:.1}s")
    }
}

/// Draws `frame` into `area`.
pub fn draw(f: &mut ratatui::Frame, area: Rect, header: &Header, frame: Option<&Frame>) {
    let classes = frame.map_or(1, |fr| fr.classes.len()) as u16;
    let peers = frame.map_or(0, |fr| fr.peers.len()) as u16;
    let [top, table, link, peer_area] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(classes + 3),
        Constraint::Length(4),
        Constraint::Min(if peers > 0 { 3 } else { 0 }),
    ])
    .areas(area);
    let title = format!(
        "weir top  {}  every {}  q: quit",
        header.source,
        duration(header.interval)
    );
    let top_line = match &header.error {
        Some(e) => Line::from(vec![
            Span::raw(title),
            Span::styled(format!("  {e}"), Style::default().fg(Color::Red)),
        ]),
        None => Line::from(Span::styled(
            title,
            Style::default().add_modifier(Modifier::BOLD),
        )),
    };
    f.render_widget(Paragraph::new(top_line), top);
    let Some(fr) = frame else {
        f.render_widget(
            Paragraph::new("waiting for a second scrape...")
                .block(Block::default().borders(Borders::ALL).title("classes")),
            table,
        );
        return;
    };

    draw_classes(f, table, fr);
    draw_link(f, link, fr);
    if !fr.peers.is_empty() {
        draw_peers(f, peer_area, fr);
    }
}

/// The per-class table: a row per class, red where p99 is over the bound
/// or records were late.
fn draw_classes(f: &mut ratatui::Frame, table: Rect, fr: &Frame) {
    let head = Row::new(
        [
            "class",
            "bound",
            "in/s",
            "queued",
            "tokens B/s",
            "out/s",
            "p50",
            "p99",
            "late/s",
            "late",
        ]
        .map(|h| Cell::from(h).style(Style::default().add_modifier(Modifier::BOLD))),
    );
    let rows = fr.classes.iter().map(|c| {
        let over = c.p99.is_some_and(|p| p > c.bound) || c.late > 0.0;
        let style = if over {
            Style::default().fg(Color::Red)
        } else {
            Style::default()
        };
        let ms = |v: Option<f64>| v.map_or("-".to_owned(), duration);
        Row::new(vec![
            c.name.clone(),
            duration(c.bound),
            si(c.arrivals),
            si(c.queued),
            si(c.tokens),
            si(c.delivered),
            ms(c.p50),
            ms(c.p99),
            si(c.late),
            si(c.late_total),
        ])
        .style(style)
    });
    let widths = [
        Constraint::Length(8),
        Constraint::Length(6),
        Constraint::Length(7),
        Constraint::Length(7),
        Constraint::Length(10),
        Constraint::Length(7),
        Constraint::Length(6),
        Constraint::Length(6),
        Constraint::Length(6),
        Constraint::Length(6),
    ];
    f.render_widget(
        Table::new(rows, widths)
            .header(head)
            .column_spacing(1)
            .block(Block::default().borders(Borders::ALL).title("classes")),
        table,
    );
}

/// The link pane: the estimate, the batches, compression, clients.
fn draw_link(f: &mut ratatui::Frame, link: Rect, fr: &Frame) {
    let lines = vec![
        Line::from(format!(
            "uplink {}B/s  per transaction {}  batches {}/s  wire {}B/s",
            si(fr.bandwidth),
            duration(fr.per_transaction),
            si(fr.batches),
            si(fr.wire_bytes),
        )),
        Line::from(format!(
            "compression {}  ratio {}  mqtt clients {}  reloads {} ok, {} refused",
            fr.codec.as_deref().unwrap_or("-"),
            fr.ratio.map_or("-".to_owned(), |r| format!("{r:.2}x")),
            si(fr.mqtt_connections),
            si(fr.reloads.0),
            si(fr.reloads.1),
        )),
    ];
    f.render_widget(
        Paragraph::new(lines).block(Block::default().borders(Borders::ALL).title("link")),
        link,
    );
}

/// The peers pane: each peer's spare and shortage and what went through it.
fn draw_peers(f: &mut ratatui::Frame, peer_area: Rect, fr: &Frame) {
    let head = Row::new(
        ["peer", "spare B/s", "shortage B/s", "via/s"]
            .map(|h| Cell::from(h).style(Style::default().add_modifier(Modifier::BOLD))),
    );
    let rows = fr
        .peers
        .iter()
        .map(|p| Row::new(vec![p.id.clone(), si(p.spare), si(p.shortage), si(p.via)]));
    let widths = [
        Constraint::Length(8),
        Constraint::Length(12),
        Constraint::Length(14),
        Constraint::Length(8),
    ];
    f.render_widget(
        Table::new(rows, widths).header(head).block(
            Block::default()
                .borders(Borders::ALL)
                .title(format!("peers ({} alive)", si(fr.peers_alive))),
        ),
        peer_area,
    );
}

#[cfg(test)]
mod tests {
    use super::super::model::{frame, Scrape};
    use super::*;
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    #[test]
    fn every_class_fits_an_80x24_terminal() {
        let text = "weir_class_bound_seconds{class=\"ls\"} 0.1\n\
                    weir_class_bound_seconds{class=\"nm\"} 0.5\n\
                    weir_class_bound_seconds{class=\"lt\"} 1.0\n\
                    weir_peer_spare_bytes_per_second{peer=\"2\"} 1250000\n\
                    weir_peer_spare_bytes_per_second{peer=\"3\"} 0\n";
        let fr = frame(&Scrape::new(text), &Scrape::new(text), 1.0);
        let mut t = Terminal::new(TestBackend::new(80, 24)).unwrap();
        let header = Header {
            source: "127.0.0.1:9464".into(),
            interval: 1.0,
            error: None,
        };
        t.draw(|f| draw(f, f.area(), &header, Some(&fr))).unwrap();
        let screen: String = t
            .backend()
            .buffer()
            .content()
            .chunks(80)
            .map(|row| row.iter().map(|c| c.symbol()).collect::<String>() + "\n")
            .collect();
        for needle in [
            "ls ", "nm ", "lt ", "100ms", "p99", "uplink", "spare", "1.2M",
        ] {
            assert!(screen.contains(needle), "{needle:?} missing:\n{screen}");
        }
    }

    #[test]
    fn numbers_read_at_a_glance() {
        assert_eq!(si(1_234_567.0), "1.2M");
        assert_eq!(si(12_345.0), "12k");
        assert_eq!(si(0.0), "0");
        assert_eq!(duration(0.0451), "45ms");
        assert_eq!(duration(0.0045), "4.5ms");
        assert_eq!(duration(1.5), "1.5s");
    }
}
