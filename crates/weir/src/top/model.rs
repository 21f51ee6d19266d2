//! What `weir top` shows, computed from two scrapes of `/metrics` taken
//! `dt` apart: rates are differences of counters over `dt`, latency
//! percentiles come from the histogram buckets filled in between (so they
//! describe the last interval, not weir's whole life).

/// One series: its name, labels and value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name, with any `_total`/`_bucket` suffix.
    pub name: String,
    /// Labels in the order written.
    pub labels: Vec<(String, String)>,
    /// The value.
    pub value: f64,
}

impl Sample {
    /// The value of label `key`, if any.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Parses Prometheus/OpenMetrics text; lines it cannot read are skipped.
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(parse_line)
        .collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let (series, value) = line.trim().rsplit_once(' ')?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    let (name, labels) = match series.split_once('{') {
        None => (series, Vec::new()),
        Some((name, rest)) => (name, parse_labels(rest.strip_suffix('}')?)?),
    };
    Some(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// `k="v",k2="v2"` with `\"`, `\\` and `\n` escapes in values.
fn parse_labels(mut s: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    while !s.is_empty() {
        let (key, rest) = s.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                '"' => break i,
                c => value.push(c),
            }
        };
        out.push((key.trim_start_matches(',').to_owned(), value));
        s = rest[end + 1..].trim_start_matches(',');
    }
    Some(out)
}

/// One scrape, indexed.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    samples: Vec<Sample>,
}

impl Scrape {
    /// From the text of `/metrics`.
    pub fn new(text: &str) -> Self {
        Scrape {
            samples: parse(text),
        }
    }

    /// Series named `name`.
    fn series<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| s.name == name)
    }

    /// The value of `name` with label `key` = `value` (0 if absent).
    fn get(&self, name: &str, key: &str, value: &str) -> f64 {
        self.series(name)
            .find(|s| s.label(key) == Some(value))
            .map_or(0.0, |s| s.value)
    }

    /// The value of the unlabelled `name` (0 if absent).
    fn scalar(&self, name: &str) -> f64 {
        self.series(name)
            .find(|s| s.labels.is_empty())
            .map_or(0.0, |s| s.value)
    }

    /// Every value of label `key` on series `name`, in first-seen order.
    fn label_values(&self, name: &str, key: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for s in self.series(name) {
            if let Some(v) = s.label(key) {
                if !out.iter().any(|o| o == v) {
                    out.push(v.to_owned());
                }
            }
        }
        out
    }

    /// `(le, cumulative count)` of class `class`'s latency histogram.
    fn buckets(&self, class: &str) -> Vec<(f64, f64)> {
        let mut b: Vec<(f64, f64)> = self
            .series("weir_record_latency_seconds_bucket")
            .filter(|s| s.label("class") == Some(class))
            .filter_map(|s| {
                let le = match s.label("le")? {
                    "+Inf" => f64::INFINITY,
                    v => v.parse().ok()?,
                };
                Some((le, s.value))
            })
            .collect();
        b.sort_by(|x, y| x.0.total_cmp(&y.0));
        b
    }
}

/// One class's row.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassRow {
    /// Its name.
    pub name: String,
    /// Its latency bound, seconds.
    pub bound: f64,
    /// Records accepted per second.
    pub arrivals: f64,
    /// Records waiting in its queue.
    pub queued: f64,
    /// The token rate BWAllocator gives it, bytes/s.
    pub tokens: f64,
    /// Records confirmed per second.
    pub delivered: f64,
    /// Median latency of the records confirmed in the interval, seconds.
    pub p50: Option<f64>,
    /// 99th percentile, seconds.
    pub p99: Option<f64>,
    /// Records confirmed later than the bound, per second.
    pub late: f64,
    /// Late records since weir started.
    pub late_total: f64,
}

/// A peer's row.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerRow {
    /// Its node id.
    pub id: String,
    /// Spare it advertises, bytes/s.
    pub spare: f64,
    /// Shortage it advertises, bytes/s.
    pub shortage: f64,
    /// This node's records delivered through it, per second.
    pub via: f64,
}

/// Everything on the screen.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    /// Per class, most urgent first.
    pub classes: Vec<ClassRow>,
    /// Uplink bandwidth estimate, bytes/s.
    pub bandwidth: f64,
    /// Per-transaction time estimate, seconds.
    pub per_transaction: f64,
    /// Batches confirmed per second.
    pub batches: f64,
    /// Wire bytes confirmed per second.
    pub wire_bytes: f64,
    /// The codec most batches were sent with in the interval.
    pub codec: Option<String>,
    /// Raw bytes over wire bytes in the interval.
    pub ratio: Option<f64>,
    /// Peers heard from within `dead_after`.
    pub peers_alive: f64,
    /// Per configured peer.
    pub peers: Vec<PeerRow>,
    /// Config reloads applied and refused since start.
    pub reloads: (f64, f64),
    /// Connected MQTT clients.
    pub mqtt_connections: f64,
}

/// The `q` quantile of the observations between two cumulative
/// histograms, interpolated within its bucket (the `+Inf` bucket answers
/// its lower edge); `None` without observations.
pub fn quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> Option<f64> {
    let counts: Vec<(f64, f64)> = after
        .iter()
        .map(|&(le, n)| {
            let was = before
                .iter()
                .find(|(l, _)| *l == le)
                .map_or(0.0, |(_, n)| *n);
            (le, (n - was).max(0.0))
        })
        .collect();
    let total = counts.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(le, n) in &counts {
        if n >= rank {
            if le.is_infinite() {
                return Some(lower.0);
            }
            let span = n - lower.1;
            let within = if span > 0.0 {
                (rank - lower.1) / span
            } else {
                1.0
            };
            return Some(lower.0 + (le - lower.0) * within);
        }
        lower = (le, n);
    }
    Some(lower.0)
}

/// The frame for the interval from `before` to `after`, `dt` seconds.
pub fn frame(before: &Scrape, after: &Scrape, dt: f64) -> Frame {
    let dt = dt.max(1e-3);
    let rate = |name: &str, key: &str, value: &str| {
        ((after.get(name, key, value) - before.get(name, key, value)) / dt).max(0.0)
    };
    let scalar_rate = |name: &str| ((after.scalar(name) - before.scalar(name)) / dt).max(0.0);
    let classes = after
        .label_values("weir_class_bound_seconds", "class")
        .into_iter()
        .map(|c| {
            let (b, a) = (before.buckets(&c), after.buckets(&c));
            ClassRow {
                bound: after.get("weir_class_bound_seconds", "class", &c),
                arrivals: rate("weir_records_accepted_total", "class", &c),
                queued: after.get("weir_class_queued_records", "class", &c),
                tokens: after.get("weir_class_allocated_bytes_per_second", "class", &c),
                delivered: rate("weir_records_forwarded_total", "class", &c),
                p50: quantile(&b, &a, 0.5),
                p99: quantile(&b, &a, 0.99),
                late: rate("weir_records_late_total", "class", &c),
                late_total: after.get("weir_records_late_total", "class", &c),
                name: c,
            }
        })
        .collect();
    let codec = after
        .label_values("weir_batches_encoded_total", "codec")
        .into_iter()
        .map(|c| {
            let n = rate("weir_batches_encoded_total", "codec", &c);
            (c, n)
        })
        .filter(|(_, n)| *n > 0.0)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(c, _)| c);
    let wire = scalar_rate("weir_egress_bytes_total");
    let raw = scalar_rate("weir_egress_raw_bytes_total");
    let peers = after
        .label_values("weir_peer_spare_bytes_per_second", "peer")
        .into_iter()
        .map(|p| PeerRow {
            spare: after.get("weir_peer_spare_bytes_per_second", "peer", &p),
            shortage: after.get("weir_peer_shortage_bytes_per_second", "peer", &p),
            via: rate("weir_peer_records_delivered_via_total", "peer", &p),
            id: p,
        })
        .collect();
    let reloads = |result: &str| after.get("weir_config_reload_total", "result", result);
    Frame {
        classes,
        bandwidth: after.scalar("weir_link_bandwidth_bytes_per_second"),
        per_transaction: after.scalar("weir_link_transaction_seconds"),
        batches: scalar_rate("weir_batches_confirmed_total"),
        wire_bytes: wire,
        codec,
        ratio: (wire > 0.0).then(|| raw / wire),
        peers_alive: after.scalar("weir_peers_alive"),
        peers,
        reloads: (reloads("applied"), reloads("refused")),
        mqtt_connections: after.scalar("weir_mqtt_connections"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn by_class(f: &Frame) -> BTreeMap<&str, &ClassRow> {
        f.classes.iter().map(|c| (c.name.as_str(), c)).collect()
    }

    fn text(accepted: u64, le_05: u64, le_2: u64, inf: u64, late: u64) -> String {
        format!(
            "# TYPE weir_class_bound_seconds gauge\n\
             weir_class_bound_seconds{{class=\"ls\"}} 0.1\n\
             weir_class_bound_seconds{{class=\"lt\"}} 1.0\n\
             weir_records_accepted_total{{class=\"ls\"}} {accepted}\n\
             weir_class_queued_records{{class=\"ls\"}} 7\n\
             weir_record_latency_seconds_bucket{{le=\"0.05\",class=\"ls\"}} {le_05}\n\
             weir_record_latency_seconds_bucket{{le=\"0.2\",class=\"ls\"}} {le_2}\n\
             weir_record_latency_seconds_bucket{{le=\"+Inf\",class=\"ls\"}} {inf}\n\
             weir_records_late_total{{class=\"ls\"}} {late}\n\
             weir_batches_encoded_total{{codec=\"zstd-3\"}} {accepted}\n\
             weir_batches_encoded_total{{codec=\"none\"}} 5\n\
             weir_egress_bytes_total 1000\n\
             weir_egress_raw_bytes_total 3000\n\
             weir_peer_spare_bytes_per_second{{peer=\"2\"}} 125000.0\n\
             weir_config_reload_total{{result=\"applied\"}} 2\n\
             weir_link_bandwidth_bytes_per_second 2250000.0\n"
        )
    }

    #[test]
    fn rates_and_percentiles_describe_the_interval() {
        let before = Scrape::new(&text(100, 10, 10, 10, 0));
        let after = Scrape::new(&text(300, 110, 200, 210, 100));
        let f = frame(&before, &after, 2.0);
        let c = by_class(&f);
        assert_eq!(c.len(), 2);
        let ls = c["ls"];
        assert_eq!(ls.bound, 0.1);
        assert_eq!(ls.arrivals, 100.0);
        assert_eq!(ls.queued, 7.0);
        assert_eq!(ls.late, 50.0);
        // 200 observations: 100 up to 50 ms, 90 in (50, 200] ms, 10 above.
        let p50 = ls.p50.unwrap();
        assert!((p50 - 0.05).abs() < 1e-9, "{p50}");
        let p99 = ls.p99.unwrap();
        assert!(
            (p99 - 0.2).abs() < 1e-9,
            "the +Inf bucket answers its lower edge: {p99}"
        );
        assert_eq!(c["lt"].p50, None, "nothing delivered");
        assert_eq!(f.codec.as_deref(), Some("zstd-3"));
        assert_eq!(f.ratio, None, "no bytes in the interval");
        assert_eq!(f.peers[0].spare, 125000.0);
        assert_eq!(f.reloads, (2.0, 0.0));
        assert_eq!(f.bandwidth, 2250000.0);
    }

    #[test]
    fn labels_with_escapes_parse() {
        let s = parse("m{a=\"x\\\"y\",b=\"1,2\"} 3\nbad line\n");
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].label("a"), Some("x\"y"));
        assert_eq!(s[0].label("b"), Some("1,2"));
        assert_eq!(s[0].value, 3.0);
    }
}
