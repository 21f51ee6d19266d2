//! Raw config to checked config: defaults filled in from
//! [`super::defaults`], every value checked, and every problem collected
//! with its key path before anything is reported (the shape of linkerd's
//! `env.rs`).
//!
//! Each section has one function taking its raw struct and returning its
//! checked type, or `None` after recording why; a new section is one more
//! function and one more line in [`validate`].

use std::cell::Cell;
use std::fmt::Display;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use weir_core::class::{ClassId, ClassSet, ClassSetError, LatencyClass, MAX_CLASSES};
use weir_core::classify::{Classifier, Rule, Source, TopicFilter};
use weir_core::queue::QueueCapacity;

use super::checked::*;
use super::defaults as d;
use super::raw::*;
use super::units::{HumanDuration, Rate, Size, Written};
use super::Problem;

/// Checks `raw`, returning the config or every problem found.
pub(super) fn validate(raw: RawConfig) -> Result<Config, Vec<Problem>> {
    let mut p = Problems::default();
    let node = node(&mut p, raw.node);
    let node_id = node.as_ref().map_or(d::NODE_ID, |n| n.id);
    let classes = classes(&mut p, raw.class);
    let classifier = classify(&mut p, raw.classify, &classes.names);
    let scheduler = scheduler(&mut p, raw.scheduler, &classes.bounds);
    let batching = batching(&mut p, raw.batching);
    let compression = compression(&mut p, raw.compression);
    let ingress = ingress(&mut p, raw.ingress, node_id);
    let egress = egress(&mut p, raw.egress);
    let admin = admin(&mut p, raw.admin);
    let peering = peering(&mut p, raw.peering, node_id);
    let log = log(&mut p, raw.log);
    if let Some(ingress) = &ingress {
        check_record_fits(&mut p, ingress, &classes.capacity_bytes);
    }
    if let (Some(ingress), Some(admin)) = (&ingress, &admin) {
        let peering = peering.as_ref().and_then(Option::as_ref);
        check_listeners(&mut p, ingress, admin, peering);
    }
    match (
        node,
        classes.set,
        classes.capacities,
        classifier,
        scheduler,
        (batching, compression, peering),
        ingress,
        egress,
        admin,
        log,
    ) {
        (
            Some(node),
            Some(classes),
            Some(capacities),
            Some(classifier),
            Some(scheduler),
            (Some(batching), Some(compression), Some(peering)),
            Some(ingress),
            Some(egress),
            Some(admin),
            Some(log),
        ) if p.0.is_empty() => Ok(Config {
            node,
            classes,
            capacities,
            classifier,
            scheduler,
            batching,
            compression,
            ingress,
            egress,
            admin,
            peering,
            log,
        }),
        _ => {
            debug_assert!(!p.0.is_empty(), "a section failed without saying why");
            Err(p.0)
        }
    }
}

/// The problems found so far, and helpers that check one value each: they
/// return the value (or its default) or `None` after recording a problem.
#[derive(Default)]
struct Problems(Vec<Problem>);

impl Problems {
    fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(Problem {
            path: path.into(),
            message: message.into(),
        });
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    /// A unit value with its text as written (or the default's).
    fn unit<T: Copy + Display>(
        &mut self,
        path: &str,
        written: Option<Written<T>>,
        default: T,
    ) -> Option<(T, String)> {
        match written {
            None => Some((default, default.to_string())),
            Some(Written {
                text,
                parsed: Ok(value),
            }) => Some((value, text)),
            Some(Written { parsed: Err(e), .. }) => {
                self.push(path, e.to_string());
                None
            }
        }
    }

    fn duration(
        &mut self,
        path: &str,
        written: Option<Written<HumanDuration>>,
        default: Duration,
    ) -> Option<Duration> {
        self.unit(path, written, HumanDuration(default))
            .map(|(v, _)| v.0)
    }

    fn positive_duration(
        &mut self,
        path: &str,
        written: Option<Written<HumanDuration>>,
        default: Duration,
    ) -> Option<Duration> {
        let (value, text) = self.unit(path, written, HumanDuration(default))?;
        if value.0.is_zero() {
            self.push(path, format!("{text:?} must be greater than zero"));
            return None;
        }
        Some(value.0)
    }

    /// A size in `1..=limit` bytes that fits a `usize`.
    fn positive_size(
        &mut self,
        path: &str,
        written: Option<Written<Size>>,
        default: u64,
        limit: u64,
    ) -> Option<usize> {
        let (value, text) = self.unit(path, written, Size(default))?;
        if value.0 == 0 {
            self.push(path, format!("{text:?} must be greater than zero"));
            return None;
        }
        if value.0 > limit {
            self.push(
                path,
                format!("{text:?} is more than the limit of {limit} bytes"),
            );
            return None;
        }
        match usize::try_from(value.0) {
            Ok(bytes) => Some(bytes),
            Err(_) => {
                self.push(path, format!("{text:?} is too large for this platform"));
                None
            }
        }
    }

    fn positive_rate(
        &mut self,
        path: &str,
        written: Option<Written<Rate>>,
        default: f64,
    ) -> Option<f64> {
        let (value, text) = self.unit(path, written, Rate::from_bytes_per_sec(default))?;
        if value.bytes_per_sec() <= 0.0 {
            self.push(path, format!("{text:?} must be greater than zero"));
            return None;
        }
        Some(value.bytes_per_sec())
    }

    /// An IP address and port to listen on (no host names: a listener binds
    /// an interface, not a name).
    fn socket_addr(&mut self, path: &str, text: &str) -> Option<SocketAddr> {
        match text.parse() {
            Ok(addr) => Some(addr),
            Err(_) => {
                self.push(
                    path,
                    format!(
                        "{text:?} is not an IP address and port; write e.g. \"0.0.0.0:1883\", \"127.0.0.1:9464\" or \"[::]:50051\""
                    ),
                );
                None
            }
        }
    }

    /// One of the names of `E`, or its default.
    fn choice<E: Named>(
        &mut self,
        path: &str,
        what: &str,
        given: Option<String>,
        default: E,
    ) -> Option<E> {
        let Some(name) = given else {
            return Some(default);
        };
        let found = E::from_name(&name);
        if found.is_none() {
            self.push(
                path,
                format!("unknown {what} {name:?} (known: {})", E::NAMES.join(", ")),
            );
        }
        found
    }

    /// A name or id that must not be empty and must fit an AMQP short
    /// string; `may_be_empty` for the default exchange.
    fn short_string(&mut self, path: &str, value: String, may_be_empty: bool) -> Option<String> {
        if value.is_empty() && !may_be_empty {
            self.push(path, "must not be empty");
            return None;
        }
        if value.len() > d::AMQP_SHORT_STRING_LIMIT {
            self.push(
                path,
                format!(
                    "is {} bytes long; AMQP allows at most {}",
                    value.len(),
                    d::AMQP_SHORT_STRING_LIMIT
                ),
            );
            return None;
        }
        Some(value)
    }
}

fn node(p: &mut Problems, raw: RawNode) -> Option<NodeConfig> {
    let before = p.len();
    let id = raw.id.unwrap_or(d::NODE_ID);
    if id == 0 {
        p.push(
            "node.id",
            "0 is reserved; give a positive id, unique among the nodes that peer",
        );
    }
    let name = raw.name.unwrap_or_else(|| d::NODE_NAME.to_owned());
    if name.trim().is_empty() {
        p.push("node.name", "must not be empty");
    }
    (p.len() == before).then_some(NodeConfig { id, name })
}

/// The classes, plus what other sections check against even when the
/// classes themselves are not valid.
struct Classes {
    set: Option<ClassSet>,
    capacities: Option<Vec<QueueCapacity>>,
    /// Names in file order, for resolving routes.
    names: Vec<String>,
    /// Bounds that parsed and are not zero, with their class names.
    bounds: Vec<(String, Duration)>,
    /// Byte capacities that parsed, with their class names.
    capacity_bytes: Vec<(String, usize)>,
}

fn classes(p: &mut Problems, raw: Option<Vec<RawClass>>) -> Classes {
    let Some(raw) = raw else {
        let set = ClassSet::janus_default();
        let capacity = QueueCapacity {
            records: d::CAPACITY_RECORDS as usize,
            bytes: d::CAPACITY_BYTES as usize,
        };
        let names: Vec<String> = set.iter().map(|(_, c)| c.name.clone()).collect();
        return Classes {
            capacities: Some(vec![capacity; set.len()]),
            bounds: set.iter().map(|(_, c)| (c.name.clone(), c.bound)).collect(),
            capacity_bytes: names.iter().map(|n| (n.clone(), capacity.bytes)).collect(),
            names,
            set: Some(set),
        };
    };

    let before = p.len();
    let mut list = Vec::with_capacity(raw.len());
    let mut bound_texts = Vec::with_capacity(raw.len());
    let mut capacities = Vec::with_capacity(raw.len());
    let mut bounds = Vec::new();
    let mut capacity_bytes = Vec::new();
    for (i, c) in raw.into_iter().enumerate() {
        let path = format!("class[{i}]");
        let name = c.name.unwrap_or_default();
        let bound = match c.bound {
            None => {
                p.push(
                    format!("{path}.bound"),
                    "missing; every class needs a latency bound, e.g. bound = \"100ms\"",
                );
                None
            }
            Some(written) => p.unit(
                &format!("{path}.bound"),
                Some(written),
                HumanDuration(Duration::ZERO),
            ),
        };
        let records = c.capacity_records.unwrap_or(d::CAPACITY_RECORDS);
        if records == 0 {
            p.push(
                format!("{path}.capacity_records"),
                "must be greater than zero",
            );
        } else if records > d::MAX_CAPACITY_RECORDS {
            p.push(
                format!("{path}.capacity_records"),
                format!(
                    "{records} is more than the limit of {}; the queue is allocated up front",
                    d::MAX_CAPACITY_RECORDS
                ),
            );
        }
        let bytes = p.positive_size(
            &format!("{path}.capacity_bytes"),
            c.capacity_bytes,
            d::CAPACITY_BYTES,
            u64::MAX,
        );
        if let Some(bytes) = bytes {
            capacity_bytes.push((name.clone(), bytes));
            capacities.push(QueueCapacity {
                records: records as usize,
                bytes,
            });
        }
        // A bound that is missing or did not parse is already reported: a
        // stand-in keeps ClassSet from reporting it again.
        let (bound, text) =
            bound.map_or((Duration::from_secs(1), String::new()), |(b, t)| (b.0, t));
        if !bound.is_zero() {
            bounds.push((name.clone(), bound));
        }
        bound_texts.push(text);
        list.push(LatencyClass {
            name,
            bound,
            min_share: c.min_share.unwrap_or(0.0),
        });
    }
    let names = list.iter().map(|c| c.name.clone()).collect();
    let set = match ClassSet::new(list.clone()) {
        Ok(set) => Some(set),
        Err(errors) => {
            class_set_problems(p, &list, &bound_texts, errors);
            None
        }
    };
    // ClassSet's findings came last: put every class problem in file order.
    p.0[before..].sort_by_key(|problem| class_problem_order(&problem.path));
    let ok = p.len() == before;
    Classes {
        set: set.filter(|_| ok),
        capacities: Some(capacities).filter(|_| ok),
        names,
        bounds,
        capacity_bytes,
    }
}

/// Sort key of a `class[i].key` path: by class, then by key in file order;
/// problems with the whole list last.
fn class_problem_order(path: &str) -> (usize, usize) {
    const KEYS: [&str; 5] = [
        "name",
        "bound",
        "min_share",
        "capacity_records",
        "capacity_bytes",
    ];
    let parsed = path
        .strip_prefix("class[")
        .and_then(|rest| rest.split_once("]."))
        .and_then(|(i, key)| Some((i.parse().ok()?, KEYS.iter().position(|k| *k == key)?)));
    parsed.unwrap_or((usize::MAX, 0))
}

/// What to do about `class = []`.
const NO_CLASSES: &str = "at least one latency class is required; \
    remove `class = []` to get the JANUS defaults (ls, nm, lt)";

/// Gives each [`ClassSetError`] the key path of the class it is about.
/// `ClassSet::new` reports per-class errors in class order, so searching
/// from the class of the previous error finds the right one even when
/// names repeat.
fn class_set_problems(
    p: &mut Problems,
    classes: &[LatencyClass],
    bound_texts: &[String],
    errors: Vec<ClassSetError>,
) {
    let cursor = Cell::new(0);
    let find = |from: usize, pred: &dyn Fn(&LatencyClass) -> bool| {
        let found = (from..classes.len()).find(|&j| pred(&classes[j]));
        if let Some(j) = found {
            cursor.set(j);
        }
        found
    };
    let mut last_duplicate = 0;
    for error in errors {
        let (path, message) = match &error {
            ClassSetError::Empty => (None, NO_CLASSES.to_owned()),
            ClassSetError::TooMany(n) => (
                None,
                format!("{n} classes given, at most {MAX_CLASSES} are supported"),
            ),
            ClassSetError::EmptyName(i) => (
                find(*i, &|_| true).map(|j| format!("class[{j}].name")),
                "missing or empty; every class needs a unique name".to_owned(),
            ),
            ClassSetError::Duplicate(name) => {
                let first = classes.iter().position(|c| &c.name == name).unwrap_or(0);
                // At most one duplicate error per class: search past the
                // previous one.
                let found = find(first.max(last_duplicate) + 1, &|c| &c.name == name);
                last_duplicate = found.unwrap_or(last_duplicate);
                (
                    found.map(|j| format!("class[{j}].name")),
                    format!("{name:?} is already the name of class[{first}]"),
                )
            }
            ClassSetError::ZeroBound(name) => {
                let zero = |c: &LatencyClass| &c.name == name && c.bound.is_zero();
                match find(cursor.get(), &zero) {
                    Some(j) => (
                        Some(format!("class[{j}].bound")),
                        format!("{:?} must be greater than zero", bound_texts[j]),
                    ),
                    None => (None, error.to_string()),
                }
            }
            ClassSetError::BadShare(name, share) => {
                let bad = |c: &LatencyClass| &c.name == name && !(0.0..=1.0).contains(&c.min_share);
                (
                    find(cursor.get(), &bad).map(|j| format!("class[{j}].min_share")),
                    format!("{share} is not within 0.0..=1.0"),
                )
            }
            ClassSetError::SharesExceedOne(sum) => (
                None,
                format!(
                    "the min_share values add up to {}, more than 1.0; lower some of them",
                    (sum * 1e6).round() / 1e6
                ),
            ),
        };
        // Without a class to point at, the whole list is the culprit.
        p.push(path.unwrap_or_else(|| "class".to_owned()), message);
    }
}

fn classify(p: &mut Problems, raw: RawClassify, names: &[String]) -> Option<Classifier> {
    let before = p.len();
    let mut unique: Vec<&str> = Vec::with_capacity(names.len());
    for name in names {
        if !unique.contains(&name.as_str()) {
            unique.push(name);
        }
    }
    let known = unique.join(", ");
    let id_of = |name: &str| {
        names
            .iter()
            .position(|n| n == name)
            .filter(|&i| i < MAX_CLASSES)
            .map(|i| ClassId(i as u8))
    };
    let mut rules = Vec::with_capacity(raw.route.len());
    for (i, route) in raw.route.into_iter().enumerate() {
        let path = format!("classify.route[{i}]");
        let class = match route.class {
            None => {
                p.push(
                    format!("{path}.class"),
                    format!("missing; name the class these records go to (known: {known})"),
                );
                None
            }
            Some(name) => {
                let id = id_of(&name);
                if id.is_none() {
                    p.push(
                        format!("{path}.class"),
                        format!("unknown class {name:?} (known: {known})"),
                    );
                }
                id
            }
        };
        let source = match (route.mqtt, route.grpc) {
            (Some(_), Some(_)) => {
                p.push(
                    path,
                    "give exactly one of `mqtt` or `grpc`, not both; write two routes to send both to one class",
                );
                None
            }
            (None, None) => {
                p.push(
                    path,
                    "give one of mqtt = \"topic/filter\" or grpc = \"stream name\"",
                );
                None
            }
            (Some(filter), None) => match TopicFilter::parse(&filter) {
                Ok(filter) => Some(Source::MqttFilter(filter)),
                Err(e) => {
                    p.push(format!("{path}.mqtt"), e.to_string());
                    None
                }
            },
            (None, Some(stream)) if stream.is_empty() => {
                p.push(format!("{path}.grpc"), "must not be empty");
                None
            }
            (None, Some(stream)) => Some(Source::GrpcStream(stream)),
        };
        if let (Some(source), Some(class)) = (source, class) {
            rules.push(Rule { source, class });
        }
    }
    let default_class = match raw.default_class {
        Some(name) => {
            let id = id_of(&name);
            if id.is_none() {
                p.push(
                    "classify.default_class",
                    format!("unknown class {name:?} (known: {known})"),
                );
            }
            id
        }
        // The lowest-priority class: unknown traffic must not crowd out
        // what the operator marked urgent.
        None => names.len().checked_sub(1).and_then(|i| id_of(&names[i])),
    };
    if p.len() != before {
        return None;
    }
    let default_class = default_class?;
    match Classifier::new(rules, default_class) {
        Ok(classifier) => Some(classifier),
        Err(e) => {
            p.push("classify.route", e.to_string());
            None
        }
    }
}

fn scheduler(
    p: &mut Problems,
    raw: RawScheduler,
    bounds: &[(String, Duration)],
) -> Option<SchedulerConfig> {
    let before = p.len();
    let tightest = bounds.iter().min_by_key(|(_, bound)| *bound);
    let scheme = p.choice("scheduler.scheme", "scheme", raw.scheme, d::SCHEME);
    let window = p.positive_duration("scheduler.window", raw.window, d::WINDOW);
    if let (Some(window), Some((class, bound))) = (window, tightest) {
        if window > *bound {
            p.push(
                "scheduler.window",
                format!(
                    "{} is longer than the bound of class {class:?} ({}); PBTT checks delays once per window and could not react before that bound passes; use at most {}",
                    HumanDuration(window),
                    HumanDuration(*bound),
                    HumanDuration(*bound),
                ),
            );
        }
    }
    let processing_delay = p.duration(
        "scheduler.processing_delay",
        raw.processing_delay,
        d::PROCESSING_DELAY,
    );
    if let (Some(delay), Some((class, bound))) = (processing_delay, tightest) {
        if delay >= *bound {
            p.push(
                "scheduler.processing_delay",
                format!(
                    "{} is not less than the bound of class {class:?} ({}); no record of that class could meet its bound",
                    HumanDuration(delay),
                    HumanDuration(*bound),
                ),
            );
        }
    }
    let uplink = p.positive_rate("scheduler.uplink", raw.uplink, d::UPLINK_BYTES_PER_SEC);
    let burst = p.positive_size("scheduler.burst", raw.burst, d::BURST_BYTES, u64::MAX);
    let max_batch_records = raw.max_batch_records.unwrap_or(d::MAX_BATCH_RECORDS);
    if max_batch_records == 0 {
        p.push("scheduler.max_batch_records", "must be greater than zero");
    } else if max_batch_records > d::MAX_CAPACITY_RECORDS {
        p.push(
            "scheduler.max_batch_records",
            format!(
                "{max_batch_records} is more than the limit of {}",
                d::MAX_CAPACITY_RECORDS
            ),
        );
    }
    let max_batch_bytes = p.positive_size(
        "scheduler.max_batch_bytes",
        raw.max_batch_bytes,
        d::MAX_BATCH_BYTES,
        u64::MAX,
    );
    let transaction_time = p.duration(
        "scheduler.transaction_time",
        raw.transaction_time,
        d::TRANSACTION_TIME,
    );
    if p.len() != before {
        return None;
    }
    Some(SchedulerConfig {
        transaction_time: transaction_time?,
        track_uplink: raw.track_uplink.unwrap_or(d::TRACK_UPLINK),
        mix_classes: raw.mix_classes.unwrap_or(d::MIX_CLASSES),
        scheme: scheme?,
        window: window?,
        processing_delay: processing_delay?,
        uplink_bytes_per_sec: uplink?,
        burst_bytes: burst?,
        // At most MAX_CAPACITY_RECORDS (2^24), so it fits any usize.
        max_batch_records: max_batch_records as usize,
        max_batch_bytes: max_batch_bytes?,
    })
}

fn batching(p: &mut Problems, raw: RawBatching) -> Option<BatchingSection> {
    let before = p.len();
    let reference = match raw.reference {
        None => d::BATCHING_REFERENCE.to_vec(),
        Some(list) => {
            if list.is_empty() {
                p.push(
                    "batching.reference",
                    "give at least one reference record (1 = never batch)",
                );
            }
            let mut out = Vec::with_capacity(list.len());
            for (i, r) in list.into_iter().enumerate() {
                match u32::try_from(r) {
                    Ok(v) if v >= 1 => out.push(v),
                    _ => p.push(
                        format!("batching.reference[{i}]"),
                        format!("{r} is not a record index: use 1 or more (1 = never batch)"),
                    ),
                }
            }
            out
        }
    };
    if p.len() != before {
        return None;
    }
    Some(BatchingSection {
        adaptive: raw.adaptive.unwrap_or(d::BATCHING_ADAPTIVE),
        reference,
    })
}

fn compression(p: &mut Problems, raw: RawCompression) -> Option<CompressionSection> {
    use weir_core::compression::{Codec, DEFAULT_CANDIDATES};
    let before = p.len();
    let candidates = match raw.candidates {
        None => DEFAULT_CANDIDATES.to_vec(),
        Some(names) => {
            if names.is_empty() {
                p.push(
                    "compression.candidates",
                    "give at least one codec (e.g. [\"none\"]), or set enabled = false",
                );
            }
            let mut out = Vec::with_capacity(names.len());
            for (i, name) in names.iter().enumerate() {
                match name
                    .parse::<Codec>()
                    .map_err(|e| e.to_string())
                    .and_then(|c| c.validate().map_err(|e| e.to_string()))
                {
                    Ok(c) if out.contains(&c) => p.push(
                        format!("compression.candidates[{i}]"),
                        format!("{name:?} is listed twice"),
                    ),
                    Ok(c) => out.push(c),
                    Err(e) => p.push(
                        format!("compression.candidates[{i}]"),
                        format!("{e} (known: none, gzip-1..gzip-9, zstd-1..zstd-22)"),
                    ),
                }
            }
            out
        }
    };
    let per = p.choice(
        "compression.per",
        "payload kind",
        raw.per,
        d::COMPRESSION_PER,
    );
    let sample_every = match raw.sample_every {
        None => Some(d::COMPRESSION_SAMPLE_EVERY),
        Some(n) => match u32::try_from(n) {
            Ok(v) if v >= 1 => Some(v),
            _ => {
                p.push(
                    "compression.sample_every",
                    format!("{n} is not a number of batches: use 1 or more"),
                );
                None
            }
        },
    };
    let sample_interval = p.positive_duration(
        "compression.sample_interval",
        raw.sample_interval,
        d::COMPRESSION_SAMPLE_INTERVAL,
    );
    if p.len() != before {
        return None;
    }
    Some(CompressionSection {
        enabled: raw.enabled.unwrap_or(d::COMPRESSION_ENABLED),
        candidates,
        per: per?,
        sample_every: sample_every?,
        sample_interval: sample_interval?,
    })
}

fn ingress(p: &mut Problems, raw: RawIngress, node_id: u64) -> Option<IngressConfig> {
    let mqtt = mqtt(p, raw.mqtt, node_id);
    let grpc = grpc(p, raw.grpc);
    let (mqtt, grpc) = (mqtt?, grpc?);
    if mqtt.is_none() && grpc.is_none() {
        p.push(
            "ingress",
            "both ingress.mqtt and ingress.grpc are disabled; enable at least one",
        );
        return None;
    }
    Some(IngressConfig { mqtt, grpc })
}

/// `Some(None)` when valid but disabled.
fn mqtt(p: &mut Problems, raw: RawMqtt, node_id: u64) -> Option<Option<MqttIngress>> {
    const PATH: &str = "ingress.mqtt";
    let before = p.len();
    let enabled = raw.enabled.unwrap_or(d::INGRESS_ENABLED);
    let mode = raw.mode.as_deref().unwrap_or(d::MQTT_MODE);
    let mode = match mode {
        "listen" => {
            let subscribe_only = [
                ("broker", raw.broker.is_some()),
                ("client_id", raw.client_id.is_some()),
                ("topics", raw.topics.is_some()),
                ("qos", raw.qos.is_some()),
            ];
            for (key, _) in subscribe_only.iter().filter(|(_, given)| *given) {
                p.push(
                    format!("{PATH}.{key}"),
                    "only used when mode = \"subscribe\"; remove it or set ingress.mqtt.mode = \"subscribe\"",
                );
            }
            let listen = raw.listen.as_deref().unwrap_or(d::MQTT_LISTEN);
            p.socket_addr(&format!("{PATH}.listen"), listen)
                .map(|addr| MqttMode::Listen { addr })
        }
        "subscribe" => {
            if raw.listen.is_some() {
                p.push(
                    format!("{PATH}.listen"),
                    "only used when mode = \"listen\"; remove it or set ingress.mqtt.mode = \"listen\"",
                );
            }
            subscribe(p, raw.broker, raw.client_id, raw.topics, raw.qos, node_id)
                .map(MqttMode::Subscribe)
        }
        other => {
            p.push(
                format!("{PATH}.mode"),
                format!("unknown mode {other:?} (known: listen, subscribe)"),
            );
            None
        }
    };
    let max_packet_size = p.positive_size(
        &format!("{PATH}.max_packet_size"),
        raw.max_packet_size,
        d::MQTT_MAX_PACKET_SIZE,
        d::MQTT_MAX_PACKET_LIMIT,
    );
    let qos0_when_full = p.choice(
        &format!("{PATH}.qos0_when_full"),
        "policy",
        raw.qos0_when_full,
        d::QOS0_WHEN_FULL,
    );
    if p.len() != before {
        return None;
    }
    let ingress = MqttIngress {
        mode: mode?,
        max_packet_size: max_packet_size?,
        qos0_when_full: qos0_when_full?,
    };
    Some(enabled.then_some(ingress))
}

fn subscribe(
    p: &mut Problems,
    broker: Option<String>,
    client_id: Option<String>,
    topics: Option<Vec<String>>,
    qos: Option<i64>,
    node_id: u64,
) -> Option<MqttSubscribe> {
    let before = p.len();
    let broker = broker.unwrap_or_else(|| d::MQTT_BROKER.to_owned());
    let broker = match parse_broker(&broker) {
        Ok(addr) => Some(addr),
        Err(why) => {
            p.push("ingress.mqtt.broker", format!("{broker:?}: {why}"));
            None
        }
    };
    let client_id = client_id.unwrap_or_else(|| format!("weir-{node_id}"));
    if client_id.is_empty() {
        p.push(
            "ingress.mqtt.client_id",
            "must not be empty; leave it out for \"weir-<node.id>\"",
        );
    }
    let topics = topics.unwrap_or_else(|| d::MQTT_TOPICS.iter().map(|t| t.to_string()).collect());
    if topics.is_empty() {
        p.push(
            "ingress.mqtt.topics",
            "subscribe to at least one topic filter, e.g. [\"#\"]",
        );
    }
    let mut filters = Vec::with_capacity(topics.len());
    for (i, topic) in topics.iter().enumerate() {
        match TopicFilter::parse(topic) {
            Ok(filter) => filters.push(filter),
            Err(e) => p.push(format!("ingress.mqtt.topics[{i}]"), e.to_string()),
        }
    }
    let qos = match qos {
        None => Some(d::MQTT_QOS),
        Some(0) => Some(SubscribeQos::AtMostOnce),
        Some(1) => Some(SubscribeQos::AtLeastOnce),
        Some(2) => {
            p.push(
                "ingress.mqtt.qos",
                "QoS 2 is not supported (records are deduplicated downstream by origin and sequence number); use 1",
            );
            None
        }
        Some(other) => {
            p.push(
                "ingress.mqtt.qos",
                format!("{other} is not an MQTT QoS; use 0 or 1"),
            );
            None
        }
    };
    if p.len() != before {
        return None;
    }
    Some(MqttSubscribe {
        broker: broker?,
        client_id,
        topics: filters,
        qos: qos?,
    })
}

/// `host:port`, `[v6-address]:port`.
fn parse_broker(text: &str) -> Result<BrokerAddr, &'static str> {
    const HOW: &str = "expected host:port, e.g. \"127.0.0.1:1883\" or \"broker.local:1883\"";
    if text.contains("://") {
        return Err("give host:port without a scheme, e.g. \"127.0.0.1:1883\"");
    }
    let (host, port) = text.rsplit_once(':').ok_or(HOW)?;
    let host = match host.strip_prefix('[') {
        Some(v6) => v6
            .strip_suffix(']')
            .ok_or("an IPv6 address needs its closing bracket, e.g. \"[::1]:1883\"")?,
        None if host.contains(':') => {
            return Err("write an IPv6 address in brackets, e.g. \"[::1]:1883\"")
        }
        None => host,
    };
    if host.is_empty() {
        return Err(HOW);
    }
    if host.contains(|c: char| c.is_whitespace() || c == '/') {
        return Err("the host contains a space or a slash");
    }
    match port.parse::<u16>() {
        Ok(0) | Err(_) => Err("the port must be a number from 1 to 65535"),
        Ok(port) => Ok(BrokerAddr {
            host: host.to_owned(),
            port,
        }),
    }
}

/// `Some(None)` when valid but disabled.
fn grpc(p: &mut Problems, raw: RawGrpc) -> Option<Option<GrpcIngress>> {
    let before = p.len();
    let enabled = raw.enabled.unwrap_or(d::INGRESS_ENABLED);
    let listen = raw.listen.as_deref().unwrap_or(d::GRPC_LISTEN);
    let listen = p.socket_addr("ingress.grpc.listen", listen);
    let max_message_size = p.positive_size(
        "ingress.grpc.max_message_size",
        raw.max_message_size,
        d::GRPC_MAX_MESSAGE_SIZE,
        d::GRPC_MAX_MESSAGE_LIMIT,
    );
    if p.len() != before {
        return None;
    }
    let ingress = GrpcIngress {
        listen: listen?,
        max_message_size: max_message_size?,
    };
    Some(enabled.then_some(ingress))
}

fn egress(p: &mut Problems, raw: RawEgress) -> Option<EgressConfig> {
    let before = p.len();
    let kind = raw.kind.as_deref().unwrap_or(d::EGRESS_KIND);
    let file_given = raw.file.is_some();
    let amqp_given = raw.amqp.is_some();
    let file = raw.file.map(|f| file_egress(p, f));
    let amqp = raw.amqp.map(|a| amqp_egress(p, a));
    let sink = match kind {
        "file" => {
            if amqp_given {
                p.push(
                    "egress.amqp",
                    "given, but egress.kind is \"file\"; set egress.kind = \"amqp\" to publish to RabbitMQ, or remove [egress.amqp]",
                );
            }
            let default = || {
                Some(FileEgress {
                    dir: PathBuf::from(d::EGRESS_DIR),
                })
            };
            file.unwrap_or_else(default).map(EgressSink::File)
        }
        "amqp" => {
            if file_given {
                p.push(
                    "egress.file",
                    "given, but egress.kind is \"amqp\"; set egress.kind = \"file\" to write files, or remove [egress.file]",
                );
            }
            match amqp {
                Some(amqp) => amqp.map(EgressSink::Amqp),
                None => {
                    p.push(
                        "egress.amqp",
                        "missing; egress.kind = \"amqp\" needs an [egress.amqp] section with at least its url",
                    );
                    None
                }
            }
        }
        other => {
            p.push(
                "egress.kind",
                format!("unknown kind {other:?} (known: file, amqp)"),
            );
            None
        }
    };
    let link = match raw.link {
        None => Some(None),
        Some(raw) => link(p, raw).map(Some),
    };
    if p.len() != before {
        return None;
    }
    Some(EgressConfig {
        sink: sink?,
        link: link?,
    })
}

fn file_egress(p: &mut Problems, raw: RawFileEgress) -> Option<FileEgress> {
    let dir = raw.dir.unwrap_or_else(|| d::EGRESS_DIR.to_owned());
    if dir.is_empty() {
        p.push(
            "egress.file.dir",
            "must not be empty; use \".\" for the working directory",
        );
        return None;
    }
    Some(FileEgress {
        dir: PathBuf::from(dir),
    })
}

fn amqp_egress(p: &mut Problems, raw: RawAmqp) -> Option<AmqpEgress> {
    const PATH: &str = "egress.amqp";
    let before = p.len();
    let url = raw.url.unwrap_or_else(|| d::AMQP_URL.to_owned());
    if !(url.starts_with("amqp://") || url.starts_with("amqps://")) {
        // The URL may hold a password: show only its scheme.
        let scheme = url.split_once("://").map_or("no scheme", |(s, _)| s);
        p.push(
            format!("{PATH}.url"),
            format!(
                "must start with amqp:// or amqps:// (found {scheme:?}), e.g. \"amqp://guest:guest@127.0.0.1:5672/%2f\""
            ),
        );
    }
    let exchange = raw.exchange.unwrap_or_else(|| d::AMQP_EXCHANGE.to_owned());
    let exchange = p.short_string(&format!("{PATH}.exchange"), exchange, true);
    let exchange_type = p.choice(
        &format!("{PATH}.exchange_type"),
        "exchange type",
        raw.exchange_type,
        ExchangeType::from_name(d::AMQP_EXCHANGE_TYPE).expect("the default is a known type"),
    );
    let queue = raw.queue.unwrap_or_else(|| d::AMQP_QUEUE.to_owned());
    let queue = p.short_string(&format!("{PATH}.queue"), queue, false);
    let routing_key = raw
        .routing_key
        .unwrap_or_else(|| d::AMQP_ROUTING_KEY.to_owned());
    let routing_key = p.short_string(&format!("{PATH}.routing_key"), routing_key, true);
    let confirm_timeout = p.positive_duration(
        &format!("{PATH}.confirm_timeout"),
        raw.confirm_timeout,
        d::AMQP_CONFIRM_TIMEOUT,
    );
    let reconnect_backoff_max = p.positive_duration(
        &format!("{PATH}.reconnect_backoff_max"),
        raw.reconnect_backoff_max,
        d::AMQP_RECONNECT_BACKOFF_MAX,
    );
    if p.len() != before {
        return None;
    }
    Some(AmqpEgress {
        url,
        exchange: exchange?,
        exchange_type: exchange_type?,
        queue: queue?,
        routing_key: routing_key?,
        confirm_timeout: confirm_timeout?,
        reconnect_backoff_max: reconnect_backoff_max?,
    })
}

fn link(p: &mut Problems, raw: RawLink) -> Option<LinkEmulation> {
    const PATH: &str = "egress.link";
    let presets = LinkPreset::NAMES.join(", ");
    match (raw.preset, raw.bandwidth, raw.delay) {
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
            p.push(PATH, "give either preset or bandwidth and delay, not both");
            None
        }
        (Some(name), None, None) => {
            let preset = LinkPreset::from_name(&name);
            match preset {
                Some(preset) => Some(LinkEmulation {
                    preset: Some(preset),
                    bandwidth_bytes_per_sec: preset.bandwidth_bytes_per_sec(),
                    delay: preset.delay(),
                }),
                None => {
                    p.push(
                        format!("{PATH}.preset"),
                        format!("unknown preset {name:?} (known: {presets})"),
                    );
                    None
                }
            }
        }
        (None, None, None) => {
            p.push(
                PATH,
                format!("give a preset ({presets}) or both bandwidth and delay"),
            );
            None
        }
        (None, Some(_), None) => {
            p.push(
                format!("{PATH}.delay"),
                "missing; with bandwidth give delay too, e.g. delay = \"50ms\"",
            );
            None
        }
        (None, None, Some(_)) => {
            p.push(
                format!("{PATH}.bandwidth"),
                "missing; with delay give bandwidth too, e.g. bandwidth = \"18Mbit/s\"",
            );
            None
        }
        (None, Some(bandwidth), Some(delay)) => {
            let bandwidth = p.positive_rate(&format!("{PATH}.bandwidth"), Some(bandwidth), 0.0);
            let delay = p.duration(&format!("{PATH}.delay"), Some(delay), Duration::ZERO);
            Some(LinkEmulation {
                preset: None,
                bandwidth_bytes_per_sec: bandwidth?,
                delay: delay?,
            })
        }
    }
}

fn admin(p: &mut Problems, raw: RawAdmin) -> Option<AdminConfig> {
    match raw.listen {
        None => Some(AdminConfig { listen: None }),
        Some(text) => p
            .socket_addr("admin.listen", &text)
            .map(|addr| AdminConfig { listen: Some(addr) }),
    }
}

/// `Some(None)` when valid and off (no `listen`).
fn peering(p: &mut Problems, raw: RawPeering, node_id: u64) -> Option<Option<PeeringConfig>> {
    const PATH: &str = "peering";
    let before = p.len();
    let listen = raw
        .listen
        .as_deref()
        .map(|text| p.socket_addr(&format!("{PATH}.listen"), text));
    if raw.listen.is_none() && !raw.peers.is_empty() {
        p.push(
            format!("{PATH}.listen"),
            "missing; peers are only used by a node that serves the peer protocol too, e.g. listen = \"0.0.0.0:7070\"",
        );
    }
    let heartbeat = p.positive_duration(
        &format!("{PATH}.heartbeat"),
        raw.heartbeat,
        d::PEER_HEARTBEAT,
    );
    let dead_after = p.positive_duration(
        &format!("{PATH}.dead_after"),
        raw.dead_after,
        d::PEER_DEAD_AFTER,
    );
    let lease = p.positive_duration(&format!("{PATH}.lease"), raw.lease, d::PEER_LEASE);
    if let (Some(heartbeat), Some(dead_after)) = (heartbeat, dead_after) {
        if dead_after <= heartbeat {
            p.push(
                format!("{PATH}.dead_after"),
                format!(
                    "{} must be longer than peering.heartbeat ({}), or a live peer is declared gone between two heartbeats; a few heartbeats is usual",
                    HumanDuration(dead_after),
                    HumanDuration(heartbeat)
                ),
            );
        }
    }
    if let (Some(heartbeat), Some(lease)) = (heartbeat, lease) {
        if lease <= heartbeat {
            p.push(
                format!("{PATH}.lease"),
                format!(
                    "{} must be longer than peering.heartbeat ({}): receivers renew their reservations once per heartbeat",
                    HumanDuration(lease),
                    HumanDuration(heartbeat)
                ),
            );
        }
    }
    let mut peers: Vec<PeerConfig> = Vec::with_capacity(raw.peers.len());
    let mut seen: Vec<(u64, usize)> = Vec::with_capacity(raw.peers.len());
    for (i, peer) in raw.peers.into_iter().enumerate() {
        let path = format!("{PATH}.peers[{i}]");
        let id = match peer.id {
            None => {
                p.push(format!("{path}.id"), "missing; give the peer's node.id");
                None
            }
            Some(0) => {
                p.push(
                    format!("{path}.id"),
                    "0 is reserved; give the peer's node.id",
                );
                None
            }
            Some(id) if id == node_id => {
                p.push(
                    format!("{path}.id"),
                    format!("{id} is this node's own node.id; list only the other nodes"),
                );
                None
            }
            Some(id) => {
                match seen.iter().find(|(other, _)| *other == id) {
                    Some((_, first)) => {
                        p.push(
                        format!("{path}.id"),
                        format!("{id} is already the id of {PATH}.peers[{first}]; node ids are unique"),
                    );
                        None
                    }
                    None => {
                        seen.push((id, i));
                        Some(id)
                    }
                }
            }
        };
        let addr = match peer.addr {
            None => {
                p.push(
                    format!("{path}.addr"),
                    "missing; give the peer's peering.listen as host:port, e.g. \"10.0.0.2:7070\"",
                );
                None
            }
            Some(text) => match parse_broker(&text) {
                Ok(addr) => Some(addr),
                Err(why) => {
                    p.push(format!("{path}.addr"), format!("{text:?}: {why}"));
                    None
                }
            },
        };
        if let (Some(id), Some(addr)) = (id, addr) {
            peers.push(PeerConfig { id, addr });
        }
    }
    if p.len() != before {
        return None;
    }
    let Some(listen) = listen else {
        return Some(None);
    };
    Some(Some(PeeringConfig {
        listen: listen?,
        peers,
        heartbeat: heartbeat?,
        dead_after: dead_after?,
        lease: lease?,
    }))
}

/// The levels `tracing` knows, lowest verbosity first.
const LOG_LEVELS: &[&str] = &["off", "error", "warn", "info", "debug", "trace"];

fn log(p: &mut Problems, raw: RawLog) -> Option<LogConfig> {
    let level = raw.level.unwrap_or_else(|| d::LOG_LEVEL.to_owned());
    let before = p.len();
    for directive in level.split(',').map(str::trim) {
        // `target=level` or a bare level; a target alone would log
        // everything of it, which is rarely meant, so it is refused.
        let lvl = directive.rsplit_once('=').map_or(directive, |(_, l)| l);
        if !LOG_LEVELS.contains(&lvl.to_ascii_lowercase().as_str()) {
            let within = if directive == level {
                String::new()
            } else {
                format!(" (in {level:?})")
            };
            p.push(
                "log.level",
                format!(
                    "{directive:?}{within} is not a level or target=level; levels: {}",
                    LOG_LEVELS.join(", ")
                ),
            );
        }
    }
    (p.len() == before).then_some(LogConfig { level })
}

/// A record as large as an ingress accepts must fit every class queue, or
/// it is refused as oversized however empty the queue is.
fn check_record_fits(p: &mut Problems, ingress: &IngressConfig, capacities: &[(String, usize)]) {
    let Some((class, smallest)) = capacities.iter().min_by_key(|(_, bytes)| *bytes) else {
        return;
    };
    let limits = [
        (
            "ingress.mqtt.max_packet_size",
            ingress.mqtt.as_ref().map(|m| m.max_packet_size),
        ),
        (
            "ingress.grpc.max_message_size",
            ingress.grpc.as_ref().map(|g| g.max_message_size),
        ),
    ];
    for (path, limit) in limits {
        if let Some(limit) = limit.filter(|limit| limit > smallest) {
            p.push(
                path,
                format!(
                    "{} is larger than the capacity_bytes of class {class:?} ({}); a record that large could never be queued; lower this or raise the capacity",
                    Size(limit as u64),
                    Size(*smallest as u64),
                ),
            );
        }
    }
}

/// Two enabled listeners on one port (port 0 picks a free one, so never
/// conflicts).
fn check_listeners(
    p: &mut Problems,
    ingress: &IngressConfig,
    admin: &AdminConfig,
    peering: Option<&PeeringConfig>,
) {
    let mqtt = ingress.mqtt.as_ref().and_then(|m| match m.mode {
        MqttMode::Listen { addr } => Some(addr),
        MqttMode::Subscribe(_) => None,
    });
    let listeners = [
        ("ingress.mqtt.listen", mqtt),
        (
            "ingress.grpc.listen",
            ingress.grpc.as_ref().map(|g| g.listen),
        ),
        ("admin.listen", admin.listen),
        ("peering.listen", peering.map(|p| p.listen)),
    ];
    let listeners: Vec<(&str, SocketAddr)> = listeners
        .into_iter()
        .filter_map(|(path, addr)| addr.map(|a| (path, a)))
        .filter(|(_, addr)| addr.port() != 0)
        .collect();
    for (i, (path, addr)) in listeners.iter().enumerate() {
        let clash = listeners[..i].iter().find(|(_, other)| {
            other.port() == addr.port()
                && other.is_ipv4() == addr.is_ipv4()
                && (other.ip() == addr.ip()
                    || other.ip().is_unspecified()
                    || addr.ip().is_unspecified())
        });
        if let Some((other_path, other)) = clash {
            p.push(
                *path,
                format!(
                    "{addr} clashes with {other_path} ({other}); give each listener its own port"
                ),
            );
        }
    }
}
