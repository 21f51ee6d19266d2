//! What every experiment hands back: a plain-text table for stdout, a JSON
//! file and an SVG plot in the output directory, and a progress bar on
//! stderr while it runs.
//!
//! The plots use plotters' SVG backend with its built-in text estimate (no
//! font files, no image libraries), so the lab builds anywhere weir does.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Plot width, pixels: wide enough for 49 batch sizes or 8 codec labels per
/// panel.
const WIDTH: u32 = 1000;

/// Plot height of a single chart, pixels.
const HEIGHT: u32 = 600;

/// Series colours, in order: distinguishable in print and for the common
/// forms of colour blindness (Okabe and Ito).
const PALETTE: [RGBColor; 6] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(230, 159, 0),
];

/// Grey for reference values taken from the papers.
const PAPER_GREY: RGBColor = RGBColor(120, 120, 120);

/// `x` rounded to `digits` decimals, for JSON that a reader can scan.
pub fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// A duration in milliseconds to 0.1 ms: finer than the emulated link's
/// timers resolve.
pub fn ms(d: Duration) -> f64 {
    round(d.as_secs_f64() * 1e3, 1)
}

/// The `p` quantile (0..=1) of ascending `sorted` values, nearest rank
/// (`None` when empty).
pub fn percentile<T: Copy + Into<f64>>(sorted: &[T], p: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let i = ((last as f64 * p).round() as usize).min(last);
    Some(sorted[i].into())
}

/// The mean of `xs` (NaN when empty).
pub fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

/// A plain-text table: first column left-aligned (names), the others
/// right-aligned (numbers).
#[derive(Debug, Clone, Default)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers.
    pub fn new<S: Into<String>>(headers: impl IntoIterator<Item = S>) -> Self {
        Table {
            headers: headers.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row; missing cells print empty, extra cells are kept.
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }

    /// The table as lines of text, a rule under the headers.
    pub fn render(&self) -> String {
        let cols = self
            .rows
            .iter()
            .map(Vec::len)
            .chain([self.headers.len()])
            .max()
            .unwrap_or(0);
        let mut width = vec![0usize; cols];
        for r in self.rows.iter().chain([&self.headers]) {
            for (w, c) in width.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        let mut out = String::new();
        let line = |out: &mut String, cells: &[String]| {
            let mut s = String::new();
            for (i, w) in width.iter().enumerate() {
                let c = cells.get(i).map_or("", String::as_str);
                if i > 0 {
                    s.push_str("  ");
                }
                if i == 0 {
                    let _ = write!(s, "{c:<w$}");
                } else {
                    let _ = write!(s, "{c:>w$}");
                }
            }
            out.push_str(s.trim_end());
            out.push('\n');
        };
        line(&mut out, &self.headers);
        let rule: usize = width.iter().sum::<usize>() + 2 * cols.saturating_sub(1);
        out.push_str(&"-".repeat(rule));
        out.push('\n');
        for r in &self.rows {
            line(&mut out, r);
        }
        out
    }
}

/// Where an experiment's files went.
#[derive(Debug, Clone)]
pub struct Outputs {
    /// The JSON results.
    pub json: PathBuf,
    /// The SVG plot.
    pub svg: PathBuf,
}

/// Writes `<out>/<name>.json` (pretty) and `<out>/<name>.svg`, creating
/// `out` if needed.
pub fn write_outputs(
    out: &Path,
    name: &str,
    json: &serde_json::Value,
    svg: &str,
) -> anyhow::Result<Outputs> {
    std::fs::create_dir_all(out)
        .with_context(|| format!("cannot create the output directory {}", out.display()))?;
    let paths = Outputs {
        json: out.join(format!("{name}.json")),
        svg: out.join(format!("{name}.svg")),
    };
    let mut text = serde_json::to_string_pretty(json)?;
    text.push('\n');
    std::fs::write(&paths.json, text)
        .with_context(|| format!("cannot write {}", paths.json.display()))?;
    std::fs::write(&paths.svg, svg)
        .with_context(|| format!("cannot write {}", paths.svg.display()))?;
    Ok(paths)
}

/// A progress bar on stderr; indicatif hides it when stderr is not a
/// terminal, so logs and CI output stay clean.
pub fn progress(len: u64, what: &str) -> ProgressBar {
    let style =
        ProgressStyle::with_template("{prefix:>12} [{bar:40}] {pos}/{len} {elapsed:>4} {wide_msg}")
            .expect("static template")
            .progress_chars("=> ");
    let bar = ProgressBar::new(len).with_style(style);
    bar.set_prefix(what.to_string());
    bar
}

/// One series of a [`LineChart`].
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// The points, in drawing order.
    pub points: Vec<(f64, f64)>,
}

/// A labelled point drawn on top of a [`LineChart`] (the model's choice, a
/// paper's measurement).
#[derive(Debug, Clone)]
pub struct Mark {
    /// Text next to the point.
    pub label: String,
    /// Where.
    pub x: f64,
    /// Where.
    pub y: f64,
    /// Grey for the papers' numbers, a strong colour for weir's.
    pub paper: bool,
}

/// A horizontal reference line across a [`LineChart`].
#[derive(Debug, Clone)]
pub struct HLine {
    /// Legend text.
    pub name: String,
    /// Height.
    pub y: f64,
    /// Grey for the papers' numbers.
    pub paper: bool,
}

/// Lines with points, reference lines and marks, axes from zero.
#[derive(Debug, Clone, Default)]
pub struct LineChart {
    /// Caption.
    pub title: String,
    /// X axis description.
    pub x_label: String,
    /// Y axis description.
    pub y_label: String,
    /// Data series.
    pub series: Vec<Series>,
    /// Horizontal reference lines.
    pub hlines: Vec<HLine>,
    /// Labelled points.
    pub marks: Vec<Mark>,
}

/// Renders a [`LineChart`] as an SVG document.
pub fn line_chart_svg(c: &LineChart) -> anyhow::Result<String> {
    let xs = c
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .chain(c.marks.iter().map(|m| m.x));
    let ys = c
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .chain(c.marks.iter().map(|m| m.y))
        .chain(c.hlines.iter().map(|h| h.y));
    let (x_lo, x_hi) = bounds(xs);
    let (_, y_hi) = bounds(ys);
    let x_pad = ((x_hi - x_lo) * 0.03).max(0.5);
    let (x_lo, x_hi) = (x_lo - x_pad, x_hi + x_pad);
    let y_hi = if y_hi > 0.0 { y_hi * 1.1 } else { 1.0 };

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(&c.title, ("sans-serif", 22))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(x_lo..x_hi, 0f64..y_hi)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc(&c.x_label)
            .y_desc(&c.y_label)
            .x_label_formatter(&|v| tick(*v))
            .y_label_formatter(&|v| tick(*v))
            .draw()
            .map_err(plot_err)?;
        for (i, s) in c.series.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            chart
                .draw_series(LineSeries::new(
                    s.points.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(plot_err)?
                .label(&s.name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            chart
                .draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(plot_err)?;
        }
        // The papers' lines first, so weir's stay visible where they
        // coincide.
        let hlines = c
            .hlines
            .iter()
            .enumerate()
            .filter(|(_, h)| h.paper)
            .chain(c.hlines.iter().enumerate().filter(|(_, h)| !h.paper));
        for (i, h) in hlines {
            let color = if h.paper {
                PAPER_GREY
            } else {
                PALETTE[(c.series.len() + i) % PALETTE.len()]
            };
            chart
                .draw_series(LineSeries::new(
                    [(x_lo, h.y), (x_hi, h.y)],
                    color.stroke_width(2),
                ))
                .map_err(plot_err)?
                .label(&h.name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
        for m in &c.marks {
            let color = if m.paper { PAPER_GREY } else { BLACK };
            // Labels of marks in the right half grow leftwards, so they stay
            // inside the plot.
            let right = m.x > (x_lo + x_hi) / 2.0;
            let (h, dx) = if right {
                (HPos::Right, -10)
            } else {
                (HPos::Left, 10)
            };
            let font =
                TextStyle::from(("sans-serif", 14).into_font()).pos(Pos::new(h, VPos::Bottom));
            chart
                .draw_series(std::iter::once(
                    EmptyElement::at((m.x, m.y))
                        + Cross::new((0, 0), 7, color.stroke_width(3))
                        + Text::new(m.label.clone(), (dx, -8), font),
                ))
                .map_err(plot_err)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}

/// One panel of [`bar_panels_svg`]: a bar per category, optionally a dot
/// per category (a prediction) and one highlighted bar.
#[derive(Debug, Clone, Default)]
pub struct BarPanel {
    /// Panel caption.
    pub title: String,
    /// Category labels under the bars.
    pub categories: Vec<String>,
    /// Bar heights.
    pub bars: Vec<f64>,
    /// Dots drawn over the bars (`None`: no dot).
    pub dots: Vec<Option<f64>>,
    /// The bar drawn in the accent colour (the chooser's pick).
    pub highlight: Option<usize>,
    /// The bar labelled "best" (the oracle).
    pub best: Option<usize>,
}

/// Renders panels of bars side by side, `cols` per row, as an SVG document;
/// `title` should say what the bars and dots are.
pub fn bar_panels_svg(
    title: &str,
    y_label: &str,
    panels: &[BarPanel],
    cols: usize,
) -> anyhow::Result<String> {
    let cols = cols.max(1);
    let rows = panels.len().div_ceil(cols).max(1);
    let mut svg = String::new();
    {
        let root =
            SVGBackend::with_string(&mut svg, (WIDTH, 80 + 360 * rows as u32)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let root = root.titled(title, ("sans-serif", 20)).map_err(plot_err)?;
        for (area, p) in root.split_evenly((rows, cols)).iter().zip(panels) {
            let n = p.categories.len().max(1);
            let (_, top) = bounds(
                p.bars
                    .iter()
                    .copied()
                    .chain(p.dots.iter().flatten().copied()),
            );
            let top = if top > 0.0 { top * 1.2 } else { 1.0 };
            let mut chart = ChartBuilder::on(area)
                .caption(&p.title, ("sans-serif", 16))
                .margin(10)
                .x_label_area_size(30)
                .y_label_area_size(60)
                .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..top)
                .map_err(plot_err)?;
            let cats = p.categories.clone();
            let label = move |x: &f64| {
                let i = x.round();
                if (x - i).abs() < 1e-6 && i >= 0.0 {
                    cats.get(i as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            };
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(n)
                .x_label_formatter(&label)
                .y_label_formatter(&|v| tick(*v))
                .y_desc(y_label)
                .draw()
                .map_err(plot_err)?;
            chart
                .draw_series(p.bars.iter().enumerate().map(|(i, &v)| {
                    let color = if p.highlight == Some(i) {
                        PALETTE[1]
                    } else {
                        PALETTE[0]
                    };
                    let x = i as f64;
                    Rectangle::new([(x - 0.35, 0.0), (x + 0.35, v)], color.filled())
                }))
                .map_err(plot_err)?;
            chart
                .draw_series(
                    p.dots.iter().enumerate().filter_map(|(i, d)| {
                        d.map(|v| Circle::new((i as f64, v), 4, BLACK.filled()))
                    }),
                )
                .map_err(plot_err)?;
            if let Some(i) = p.best {
                let dot = p.dots.get(i).copied().flatten().unwrap_or(0.0);
                let v = p.bars.get(i).copied().unwrap_or(0.0).max(dot);
                chart
                    .draw_series(std::iter::once(Text::new(
                        "best",
                        (i as f64 - 0.3, v + top * 0.06),
                        ("sans-serif", 13),
                    )))
                    .map_err(plot_err)?;
            }
        }
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}

/// An axis tick: at most two decimals, no trailing zeros (`8000`, `2.5`).
fn tick(v: f64) -> String {
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.into()
    }
}

/// Lowest and highest finite value (0, 0 when there is none).
fn bounds(xs: impl Iterator<Item = f64>) -> (f64, f64) {
    xs.filter(|x| x.is_finite())
        .fold(None, |acc: Option<(f64, f64)>, x| {
            Some(acc.map_or((x, x), |(lo, hi)| (lo.min(x), hi.max(x))))
        })
        .unwrap_or((0.0, 0.0))
}

/// plotters' errors borrow nothing but are not all `Sync`: keep the text.
fn plot_err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow::anyhow!("cannot draw the plot: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let xs: Vec<f64> = (1..=101).map(f64::from).collect();
        assert_eq!(percentile(&xs, 0.5), Some(51.0));
        assert_eq!(percentile(&xs, 0.99), Some(100.0));
        assert_eq!(percentile(&xs, 1.0), Some(101.0));
        assert_eq!(percentile(&[7u32], 0.99), Some(7.0));
        assert_eq!(percentile::<f64>(&[], 0.5), None);
    }

    #[test]
    fn table_aligns_names_left_and_numbers_right() {
        let mut t = Table::new(["run", "ms"]);
        t.row(["fifs", "7650.2"]);
        t.row(["batch 25", "786"]);
        let text = t.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "run           ms");
        assert_eq!(lines[1], "----------------");
        assert_eq!(lines[2], "fifs      7650.2");
        assert_eq!(lines[3], "batch 25     786");
    }

    #[test]
    fn table_tolerates_ragged_rows() {
        let mut t = Table::new(["a"]);
        t.row(["x", "yy"]);
        t.row(Vec::<String>::new());
        let text = t.render();
        assert_eq!(text.lines().count(), 4);
        assert!(text.lines().nth(2).unwrap().ends_with("yy"));
    }

    #[test]
    fn rounding_helpers() {
        assert_eq!(round(1.23456, 2), 1.23);
        assert_eq!(round(-2.5, 0), -3.0);
        assert_eq!(ms(Duration::from_micros(123_456)), 123.5);
        assert_eq!(mean(&[1.0, 2.0, 6.0]), 3.0);
        assert!(mean(&[]).is_nan());
        assert_eq!(bounds([3.0, f64::NAN, -1.0].into_iter()), (-1.0, 3.0));
        assert_eq!(bounds(std::iter::empty()), (0.0, 0.0));
        assert_eq!(tick(8000.0), "8000");
        assert_eq!(tick(2.5), "2.5");
        assert_eq!(tick(0.126), "0.13");
        assert_eq!(tick(-0.001), "0");
    }

    #[test]
    fn line_chart_is_an_svg_with_its_legend() {
        let chart = LineChart {
            title: "wall-clock".into(),
            x_label: "batch".into(),
            y_label: "ms".into(),
            series: vec![Series {
                name: "fixed size".into(),
                points: vec![(2.0, 4000.0), (25.0, 800.0), (50.0, 900.0)],
            }],
            hlines: vec![HLine {
                name: "FIFS".into(),
                y: 7600.0,
                paper: false,
            }],
            marks: vec![Mark {
                label: "chosen".into(),
                x: 29.0,
                y: 830.0,
                paper: false,
            }],
        };
        let svg = line_chart_svg(&chart).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..60]);
        for text in ["wall-clock", "fixed size", "FIFS", "chosen"] {
            assert!(svg.contains(text), "{text} missing");
        }
    }

    #[test]
    fn bar_panels_label_categories_and_the_best_bar() {
        let panel = BarPanel {
            title: "csv @ 0.5 MB/s".into(),
            categories: vec!["none".into(), "gzip-1".into(), "zstd-3".into()],
            bars: vec![0.5, 2.0, 2.5],
            dots: vec![Some(0.5), None, Some(2.4)],
            highlight: Some(2),
            best: Some(2),
        };
        let svg =
            bar_panels_svg("effective throughput", "MB/s", &[panel.clone(), panel], 2).unwrap();
        for text in [
            "effective throughput",
            "csv @ 0.5 MB/s",
            "gzip-1",
            "zstd-3",
            "best",
        ] {
            assert!(svg.contains(text), "{text} missing");
        }
    }

    #[test]
    fn outputs_land_in_the_directory() {
        let dir = std::env::temp_dir().join(format!("weir-lab-report-{}", std::process::id()));
        let out = write_outputs(&dir, "x", &serde_json::json!({"a": 1}), "<svg/>").unwrap();
        let back: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&out.json).unwrap()).unwrap();
        assert_eq!(back["a"], 1);
        assert_eq!(std::fs::read_to_string(&out.svg).unwrap(), "<svg/>");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
