//! Which latency class a record belongs to, from the MQTT topic or gRPC
//! stream name it arrived on.
//!
//! The operator lists rules in config order; the first rule that matches
//! wins and a record no rule matches goes to the default class (JANUS leaves
//! stream-to-class assignment to the operator, Section III).
//!
//! MQTT topic filters follow MQTT 3.1.1 section 4.7: levels are separated by
//! `/` and may be empty; `+` matches exactly one whole level; `#` matches the
//! parent level and any number of levels below it and must be the last level,
//! alone in it; a filter starting with a wildcard does not match topics
//! starting with `$` (such as `$SYS/...`), so `#` alone does not swallow
//! broker-internal topics.
//!
//! # Layout
//! - [`TopicFilter`]: a validated MQTT topic filter and its matcher.
//! - [`Classifier`]: the ordered rules, with a hash-map fast path for rules
//!   without wildcards that still honours config order.
//! - [`ClassifyError`]: why a filter or a rule list was refused.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use crate::class::ClassId;

/// Longest topic filter MQTT can carry: its strings are prefixed by a
/// two-byte length (MQTT 3.1.1 section 1.5.3).
pub const MAX_TOPIC_LEN: usize = 65_535;

/// Why a topic filter or a list of rules was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClassifyError {
    /// MQTT 3.1.1 section 4.7.3: a filter is at least one character long.
    #[error("a topic filter must not be empty (use \"#\" to match every topic)")]
    EmptyFilter,
    /// Longer than [`MAX_TOPIC_LEN`] bytes.
    #[error("topic filter is {0} bytes long; MQTT allows at most {MAX_TOPIC_LEN}")]
    FilterTooLong(usize),
    /// MQTT 3.1.1 section 4.7.3: no U+0000 in topics.
    #[error("topic filter {0:?} contains a NUL character, which MQTT forbids")]
    NulInFilter(String),
    /// `#` somewhere other than the last level (`a/#/b`).
    #[error("topic filter {0:?}: `#` must be the last level (as in \"a/b/#\")")]
    MultiLevelNotLast(String),
    /// A wildcard sharing its level with other characters (`a/b+`, `a#`).
    #[error(
        "topic filter {filter:?}: `{wildcard}` must occupy a whole level (as in \"a/{wildcard}\")"
    )]
    WildcardNotAlone {
        /// The filter as given.
        filter: String,
        /// `+` or `#`.
        wildcard: char,
    },
    /// A gRPC rule with an empty stream name, which no stream can have.
    #[error("rule #{rule}: the gRPC stream name must not be empty")]
    EmptyGrpcStream {
        /// Index of the rule in the list given to [`Classifier::new`].
        rule: usize,
    },
}

/// One level of a parsed [`TopicFilter`].
#[derive(Debug, Clone, PartialEq, Eq)]
enum Level {
    /// Matches a topic level equal to this text.
    Exact(Box<str>),
    /// `+`: any one level, including an empty one.
    Single,
    /// `#`: this level and all below, or none (always the last level).
    Multi,
}

/// A validated MQTT topic filter (MQTT 3.1.1 section 4.7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicFilter {
    text: String,
    levels: Vec<Level>,
}

impl TopicFilter {
    /// Parses and validates `filter` (see the module docs for the rules).
    pub fn parse(filter: &str) -> Result<Self, ClassifyError> {
        if filter.is_empty() {
            return Err(ClassifyError::EmptyFilter);
        }
        if filter.len() > MAX_TOPIC_LEN {
            return Err(ClassifyError::FilterTooLong(filter.len()));
        }
        if filter.contains('\0') {
            return Err(ClassifyError::NulInFilter(filter.to_owned()));
        }
        let parts: Vec<&str> = filter.split('/').collect();
        let last = parts.len() - 1;
        let mut levels = Vec::with_capacity(parts.len());
        for (i, part) in parts.into_iter().enumerate() {
            let level = match part {
                "+" => Level::Single,
                "#" if i == last => Level::Multi,
                "#" => return Err(ClassifyError::MultiLevelNotLast(filter.to_owned())),
                _ => {
                    if let Some(wildcard) = part.chars().find(|c| matches!(c, '+' | '#')) {
                        return Err(ClassifyError::WildcardNotAlone {
                            filter: filter.to_owned(),
                            wildcard,
                        });
                    }
                    Level::Exact(part.into())
                }
            };
            levels.push(level);
        }
        Ok(TopicFilter {
            text: filter.to_owned(),
            levels,
        })
    }

    /// The filter as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// True when the filter has no wildcard, so it matches exactly one topic:
    /// itself.
    pub fn is_exact(&self) -> bool {
        self.levels.iter().all(|l| matches!(l, Level::Exact(_)))
    }

    /// Whether `topic` (a topic name, taken literally) matches this filter.
    pub fn matches(&self, topic: &str) -> bool {
        // Section 4.7.2: a leading wildcard does not match `$` topics.
        if topic.starts_with('$') && !matches!(self.levels[0], Level::Exact(_)) {
            return false;
        }
        let mut topic_levels = topic.split('/');
        for level in &self.levels {
            match level {
                // `#` also matches the parent level alone ("a/#" matches "a").
                Level::Multi => return true,
                Level::Single => {
                    if topic_levels.next().is_none() {
                        return false;
                    }
                }
                Level::Exact(want) => match topic_levels.next() {
                    Some(got) if got == &**want => {}
                    _ => return false,
                },
            }
        }
        topic_levels.next().is_none()
    }
}

impl FromStr for TopicFilter {
    type Err = ClassifyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TopicFilter::parse(s)
    }
}

impl fmt::Display for TopicFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// What a rule matches on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Records published on MQTT topics matching this filter.
    MqttFilter(TopicFilter),
    /// Records sent on the gRPC stream with exactly this name.
    GrpcStream(String),
}

/// One classification rule: records from `source` go to `class`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// What the rule matches.
    pub source: Source,
    /// The class matching records are put in.
    pub class: ClassId,
}

/// Maps topics and stream names to classes: the first matching rule in
/// config order wins, anything unmatched goes to the default class.
///
/// Rules without wildcards (every gRPC rule, and MQTT filters with neither
/// `+` nor `#`) are looked up in hash maps; wildcard filters are tried in
/// order, but only those listed before the exact hit, so an earlier wildcard
/// rule still beats a later exact one.
#[derive(Debug, Clone, PartialEq)]
pub struct Classifier {
    rules: Vec<Rule>,
    default_class: ClassId,
    /// Exact MQTT filter text to the index of the first rule with it.
    mqtt_exact: HashMap<Box<str>, usize>,
    /// Indices of the wildcard MQTT rules, ascending.
    mqtt_wildcard: Vec<usize>,
    /// gRPC stream name to the class of the first rule naming it.
    grpc: HashMap<Box<str>, ClassId>,
}

impl Classifier {
    /// Builds the lookup tables for `rules` (in priority order) with
    /// `default_class` for records no rule matches.
    ///
    /// The class ids are not checked against a class set: the caller (the
    /// config validation) resolves names to ids.
    pub fn new(rules: Vec<Rule>, default_class: ClassId) -> Result<Self, ClassifyError> {
        let mut mqtt_exact = HashMap::new();
        let mut mqtt_wildcard = Vec::new();
        let mut grpc = HashMap::new();
        for (i, rule) in rules.iter().enumerate() {
            match &rule.source {
                Source::MqttFilter(filter) if filter.is_exact() => {
                    mqtt_exact.entry(filter.as_str().into()).or_insert(i);
                }
                Source::MqttFilter(_) => mqtt_wildcard.push(i),
                Source::GrpcStream(name) if name.is_empty() => {
                    return Err(ClassifyError::EmptyGrpcStream { rule: i });
                }
                Source::GrpcStream(name) => {
                    grpc.entry(name.as_str().into()).or_insert(rule.class);
                }
            }
        }
        Ok(Classifier {
            rules,
            default_class,
            mqtt_exact,
            mqtt_wildcard,
            grpc,
        })
    }

    /// A classifier without rules: everything goes to `default_class`.
    pub fn everything_to(default_class: ClassId) -> Self {
        Classifier::new(Vec::new(), default_class).expect("no rules, nothing to refuse")
    }

    /// The rules, in priority order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The class of records no rule matches.
    pub fn default_class(&self) -> ClassId {
        self.default_class
    }

    /// The class of a record published on MQTT topic `topic`.
    pub fn classify_mqtt(&self, topic: &str) -> ClassId {
        let exact = self.mqtt_exact.get(topic).copied();
        // Only wildcard rules listed before the exact hit can beat it.
        let before = exact.unwrap_or(usize::MAX);
        for &i in self.mqtt_wildcard.iter().take_while(|&&i| i < before) {
            let rule = &self.rules[i];
            if let Source::MqttFilter(filter) = &rule.source {
                if filter.matches(topic) {
                    return rule.class;
                }
            }
        }
        match exact {
            Some(i) => self.rules[i].class,
            None => self.default_class,
        }
    }

    /// The class of a record sent on the gRPC stream named `stream`.
    pub fn classify_grpc(&self, stream: &str) -> ClassId {
        self.grpc.get(stream).copied().unwrap_or(self.default_class)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn f(s: &str) -> TopicFilter {
        TopicFilter::parse(s).unwrap()
    }

    fn mqtt(filter: &str, class: u8) -> Rule {
        Rule {
            source: Source::MqttFilter(f(filter)),
            class: ClassId(class),
        }
    }

    fn grpc(name: &str, class: u8) -> Rule {
        Rule {
            source: Source::GrpcStream(name.into()),
            class: ClassId(class),
        }
    }

    #[test]
    fn valid_filters_from_the_spec() {
        for s in [
            "sport/tennis/player1/#",
            "sport/#",
            "#",
            "+",
            "+/tennis/#",
            "sport/+/player1",
            "/+",
            "+/+",
            "/",
            "//",
            "a//b",
            "$SYS/#",
            "sport/tennis/player1",
        ] {
            assert_eq!(f(s).as_str(), s);
            assert_eq!(f(s).to_string(), s);
        }
        assert!(f("a/b").is_exact());
        assert!(f("/").is_exact());
        assert!(!f("a/+").is_exact());
        assert!(!f("#").is_exact());
    }

    #[test]
    fn invalid_filters_from_the_spec() {
        assert_eq!(TopicFilter::parse(""), Err(ClassifyError::EmptyFilter));
        assert_eq!(
            TopicFilter::parse("sport/tennis#"),
            Err(ClassifyError::WildcardNotAlone {
                filter: "sport/tennis#".into(),
                wildcard: '#'
            })
        );
        assert_eq!(
            TopicFilter::parse("sport/tennis/#/ranking"),
            Err(ClassifyError::MultiLevelNotLast(
                "sport/tennis/#/ranking".into()
            ))
        );
        assert_eq!(
            TopicFilter::parse("sport+"),
            Err(ClassifyError::WildcardNotAlone {
                filter: "sport+".into(),
                wildcard: '+'
            })
        );
        assert!(TopicFilter::parse("#/a").is_err());
        assert!(TopicFilter::parse("a/++").is_err());
        assert!(TopicFilter::parse("a/+#").is_err());
        assert!(matches!(
            TopicFilter::parse("a\0b"),
            Err(ClassifyError::NulInFilter(_))
        ));
        let long = "a".repeat(MAX_TOPIC_LEN + 1);
        assert_eq!(
            TopicFilter::parse(&long),
            Err(ClassifyError::FilterTooLong(MAX_TOPIC_LEN + 1))
        );
        assert!(TopicFilter::parse(&long[1..]).is_ok());
        assert!("a/#/b".parse::<TopicFilter>().is_err());
    }

    #[test]
    fn multi_level_wildcard() {
        let filter = f("sport/tennis/player1/#");
        assert!(filter.matches("sport/tennis/player1"));
        assert!(filter.matches("sport/tennis/player1/ranking"));
        assert!(filter.matches("sport/tennis/player1/score/wimbledon"));
        assert!(filter.matches("sport/tennis/player1/"));
        assert!(!filter.matches("sport/tennis/player2"));
        assert!(!filter.matches("sport/tennis"));

        assert!(f("sport/#").matches("sport"));
        assert!(f("#").matches("sport/tennis"));
        assert!(f("#").matches("/"));
        assert!(f("#").matches(""));
    }

    #[test]
    fn single_level_wildcard() {
        let filter = f("sport/tennis/+");
        assert!(filter.matches("sport/tennis/player1"));
        assert!(filter.matches("sport/tennis/player2"));
        assert!(!filter.matches("sport/tennis/player1/ranking"));
        assert!(filter.matches("sport/tennis/"));

        let filter = f("sport/+");
        assert!(!filter.matches("sport"));
        assert!(filter.matches("sport/"));

        assert!(f("+/+").matches("/finance"));
        assert!(f("/+").matches("/finance"));
        assert!(!f("+").matches("/finance"));
        assert!(f("+").matches(""));
        assert!(f("+/tennis/#").matches("sport/tennis/player1"));
        assert!(f("+/tennis/#").matches("sport/tennis"));
        assert!(!f("+/tennis/#").matches("sport/golf"));
    }

    #[test]
    fn empty_levels_are_levels() {
        assert!(f("a//b").matches("a//b"));
        assert!(!f("a//b").matches("a/b"));
        assert!(f("a/+/b").matches("a//b"));
        assert!(f("/a").matches("/a"));
        assert!(!f("/a").matches("a"));
        assert!(!f("a/").matches("a"));
    }

    #[test]
    fn dollar_topics_escape_leading_wildcards() {
        assert!(!f("#").matches("$SYS/broker/clients"));
        assert!(!f("+/monitor/Clients").matches("$SYS/monitor/Clients"));
        assert!(f("$SYS/#").matches("$SYS/monitor/Clients"));
        assert!(f("$SYS/monitor/+").matches("$SYS/monitor/Clients"));
        assert!(f("$SYS").matches("$SYS"));
        // Only the first character of the topic counts.
        assert!(f("#").matches("a/$SYS"));
        assert!(f("+/+").matches("a/$b"));
    }

    #[test]
    fn exact_filters_are_case_and_byte_exact() {
        assert!(f("ACCOUNTS").matches("ACCOUNTS"));
        assert!(!f("ACCOUNTS").matches("Accounts"));
        assert!(!f("a/b").matches("a/b "));
    }

    #[test]
    fn first_matching_rule_wins() {
        let c = Classifier::new(
            vec![
                mqtt("factory/+/vibration", 0),
                mqtt("factory/line1/vibration", 2),
                mqtt("factory/#", 1),
                mqtt("factory/line1/temp", 0),
                grpc("cooling", 2),
                grpc("cooling", 0),
            ],
            ClassId(2),
        )
        .unwrap();
        // The earlier wildcard beats the later exact rule.
        assert_eq!(c.classify_mqtt("factory/line1/vibration"), ClassId(0));
        // The earlier wildcard `factory/#` beats the later exact rule.
        assert_eq!(c.classify_mqtt("factory/line1/temp"), ClassId(1));
        assert_eq!(c.classify_mqtt("factory"), ClassId(1));
        assert_eq!(c.classify_mqtt("warehouse/temp"), ClassId(2));
        assert_eq!(c.classify_grpc("cooling"), ClassId(2));
        assert_eq!(c.classify_grpc("heating"), ClassId(2));
        // MQTT rules do not apply to gRPC and the other way round.
        assert_eq!(c.classify_grpc("factory/line1/temp"), ClassId(2));
        assert_eq!(c.classify_mqtt("cooling"), ClassId(2));
        assert_eq!(c.rules().len(), 6);
        assert_eq!(c.default_class(), ClassId(2));
    }

    #[test]
    fn exact_rule_before_wildcard_wins() {
        let c = Classifier::new(
            vec![mqtt("a/b", 0), mqtt("a/+", 1), mqtt("a/b", 2)],
            ClassId(3),
        )
        .unwrap();
        assert_eq!(c.classify_mqtt("a/b"), ClassId(0));
        assert_eq!(c.classify_mqtt("a/c"), ClassId(1));
        assert_eq!(c.classify_mqtt("a"), ClassId(3));
    }

    #[test]
    fn no_rules_means_default() {
        let c = Classifier::everything_to(ClassId(1));
        assert_eq!(c.classify_mqtt("x"), ClassId(1));
        assert_eq!(c.classify_grpc("x"), ClassId(1));
    }

    #[test]
    fn empty_grpc_name_is_refused() {
        let err = Classifier::new(vec![mqtt("#", 0), grpc("", 1)], ClassId(0)).unwrap_err();
        assert_eq!(err, ClassifyError::EmptyGrpcStream { rule: 1 });
    }

    /// The matcher again, written differently (recursion over levels), so the
    /// property test compares two independent readings of section 4.7.
    fn reference_matches(filter: &str, topic: &str) -> bool {
        fn go(f: &[&str], t: &[&str]) -> bool {
            match (f.first(), t.first()) {
                (Some(&"#"), _) => true,
                (None, None) => true,
                (None, Some(_)) | (Some(_), None) => false,
                (Some(&"+"), Some(_)) => go(&f[1..], &t[1..]),
                (Some(a), Some(b)) => a == b && go(&f[1..], &t[1..]),
            }
        }
        if topic.starts_with('$') && (filter.starts_with('+') || filter.starts_with('#')) {
            return false;
        }
        let f: Vec<&str> = filter.split('/').collect();
        let t: Vec<&str> = topic.split('/').collect();
        go(&f, &t)
    }

    /// The classifier as the spec reads: scan every rule in order.
    fn linear_scan(
        rules: &[Rule],
        default: ClassId,
        mqtt_topic: Option<&str>,
        stream: Option<&str>,
    ) -> ClassId {
        rules
            .iter()
            .find(|r| match (&r.source, mqtt_topic, stream) {
                (Source::MqttFilter(f), Some(t), _) => f.matches(t),
                (Source::GrpcStream(s), _, Some(name)) => s == name,
                _ => false,
            })
            .map_or(default, |r| r.class)
    }

    fn level() -> impl Strategy<Value = String> {
        prop::sample::select(vec!["a", "b", "", "$s", "cd"]).prop_map(str::to_owned)
    }

    fn topic() -> impl Strategy<Value = String> {
        prop::collection::vec(level(), 1..5).prop_map(|l| l.join("/"))
    }

    fn filter() -> impl Strategy<Value = String> {
        let filter_level = prop_oneof![3 => level(), 1 => Just("+".to_owned())];
        (prop::collection::vec(filter_level, 1..5), any::<bool>())
            .prop_map(|(mut l, multi)| {
                if multi {
                    l.push("#".to_owned());
                }
                l.join("/")
            })
            .prop_filter("MQTT filters are not empty", |s| !s.is_empty())
    }

    fn rule() -> impl Strategy<Value = Rule> {
        prop_oneof![
            3 => (filter(), 0u8..4).prop_map(|(s, c)| mqtt(&s, c)),
            1 => ("[ab]{1,2}", 0u8..4).prop_map(|(s, c)| grpc(&s, c)),
        ]
    }

    proptest! {
        #[test]
        fn matcher_agrees_with_reference(filter in filter(), topic in topic()) {
            prop_assert_eq!(f(&filter).matches(&topic), reference_matches(&filter, &topic));
        }

        #[test]
        fn fast_path_equals_linear_scan(
            rules in prop::collection::vec(rule(), 0..12),
            topics in prop::collection::vec(topic(), 1..20),
            streams in prop::collection::vec("[ab]{1,2}", 1..5),
        ) {
            let default = ClassId(9);
            let c = Classifier::new(rules.clone(), default).unwrap();
            for t in &topics {
                prop_assert_eq!(c.classify_mqtt(t), linear_scan(&rules, default, Some(t), None));
            }
            for s in &streams {
                prop_assert_eq!(c.classify_grpc(s), linear_scan(&rules, default, None, Some(s)));
            }
        }
    }
}
