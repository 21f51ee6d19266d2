//! `[[class]]`, the latency classes in priority order, and `[classify]`,
//! which class each MQTT topic or gRPC stream goes to: as written, their
//! defaults, and their validation. Their checked types are weir-core's
//! [`ClassSet`], [`QueueCapacity`] and [`Classifier`].

use std::cell::Cell;
use std::time::Duration;

use serde::Deserialize;
use weir_core::class::{ClassId, ClassSet, ClassSetError, LatencyClass, MAX_CLASSES};
use weir_core::classify::{Classifier, Rule, Source, TopicFilter};
use weir_core::queueing::queue::QueueCapacity;

use super::problems::Problems;
use super::spool::{class_durability, default_durability, ClassDurability, RawDurability};
use super::units::{HumanDuration, Size, Written};

/// At JANUS's evaluation rate of 5k records/s this holds about 3 s of
/// backlog per class (three times the least urgent default bound): a
/// queue's records beyond its bound are late whatever their number, and a
/// longer outage is the spool's (`durability = "spool"`).
pub const CAPACITY_RECORDS: u64 = 16_384;

/// 8 MiB per class: the two bounds bind together at 512-byte records, and
/// 8 MiB is near four seconds of the default 18 Mbit/s uplink, beyond the
/// least urgent default bound. The three default classes' queues stay
/// under 24 MiB, so that weir at full rate stays near 64 MiB (256 B
/// records) to 96 MiB (1 KiB) with the default config, which a Raspberry
/// Pi class box can spare beside its other work (docs/benchmarks.md,
/// "Memory at full rate").
pub const CAPACITY_BYTES: u64 = 8 * 1024 * 1024;

/// A typo such as an extra digit must not let a queue grow to gigabytes;
/// 16 Mi records is far beyond any sensible backlog.
pub const MAX_CAPACITY_RECORDS: u64 = 1 << 24;

/// One `[[class]]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawClass {
    pub name: Option<String>,
    pub bound: Option<Written<HumanDuration>>,
    pub min_share: Option<f64>,
    pub capacity_records: Option<u64>,
    pub capacity_bytes: Option<Written<Size>>,
    pub durability: Option<String>,
    pub spool_max_bytes: Option<Written<Size>>,
    pub on_full: Option<String>,
    pub ttl: Option<Written<HumanDuration>>,
}

/// The classes, plus what other sections check against even when the
/// classes themselves are not valid.
pub(crate) struct Classes {
    pub(crate) set: Option<ClassSet>,
    pub(crate) capacities: Option<Vec<QueueCapacity>>,
    /// Names in file order, for resolving routes.
    pub(crate) names: Vec<String>,
    /// Bounds that parsed and are not zero, with their class names.
    pub(crate) bounds: Vec<(String, Duration)>,
    /// Byte capacities that parsed, with their class names.
    pub(crate) capacity_bytes: Vec<(String, usize)>,
    /// Durability per class, in class order.
    pub(crate) durability: Option<Vec<ClassDurability>>,
}

/// `[[class]]` checked (the JANUS defaults when absent), with what the
/// other sections check against.
pub(crate) fn classes(p: &mut Problems, raw: Option<Vec<RawClass>>) -> Classes {
    let Some(raw) = raw else {
        let set = ClassSet::janus_default();
        let capacity = QueueCapacity {
            records: CAPACITY_RECORDS as usize,
            bytes: CAPACITY_BYTES as usize,
        };
        let names: Vec<String> = set.iter().map(|(_, c)| c.name.clone()).collect();
        return Classes {
            capacities: Some(vec![capacity; set.len()]),
            bounds: set.iter().map(|(_, c)| (c.name.clone(), c.bound)).collect(),
            capacity_bytes: names.iter().map(|n| (n.clone(), capacity.bytes)).collect(),
            durability: Some(vec![default_durability(); set.len()]),
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
    let mut durability = Vec::new();
    for (i, c) in raw.into_iter().enumerate() {
        let path = format!("class[{i}]");
        let durable = class_durability(
            p,
            &path,
            RawDurability {
                durability: c.durability,
                spool_max_bytes: c.spool_max_bytes,
                on_full: c.on_full,
                ttl: c.ttl,
            },
        );
        durability.extend(durable);
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
        let records = c.capacity_records.unwrap_or(CAPACITY_RECORDS);
        if records == 0 {
            p.push(
                format!("{path}.capacity_records"),
                "must be greater than zero",
            );
        } else if records > MAX_CAPACITY_RECORDS {
            p.push(
                format!("{path}.capacity_records"),
                format!(
                    "{records} is more than the limit of {}; the queue is allocated up front",
                    MAX_CAPACITY_RECORDS
                ),
            );
        }
        let bytes = p.positive_size(
            &format!("{path}.capacity_bytes"),
            c.capacity_bytes,
            CAPACITY_BYTES,
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
        durability: Some(durability).filter(|_| ok),
    }
}

/// Sort key of a `class[i].key` path: by class, then by key in file order;
/// problems with the whole list last.
fn class_problem_order(path: &str) -> (usize, usize) {
    const KEYS: [&str; 9] = [
        "name",
        "bound",
        "min_share",
        "capacity_records",
        "capacity_bytes",
        "durability",
        "spool_max_bytes",
        "on_full",
        "ttl",
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

/// `[classify]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawClassify {
    pub default_class: Option<String>,
    #[serde(default)]
    pub route: Vec<RawRoute>,
}

/// One `[[classify.route]]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRoute {
    pub mqtt: Option<String>,
    pub grpc: Option<String>,
    pub class: Option<String>,
}

/// `[classify]` checked against the class `names`, or `None` after
/// recording why.
pub(crate) fn classify(p: &mut Problems, raw: RawClassify, names: &[String]) -> Option<Classifier> {
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
