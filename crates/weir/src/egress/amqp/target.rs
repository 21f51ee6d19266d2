//! The destination as configured: the endpoints in the order they are
//! tried, the exchange, queue and routing keys.

use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::uri::AMQPUri;
use lapin::ExchangeKind;
use weir_core::{ClassSet, NodeId};

use super::message::redacted_url;
use crate::config::{AmqpEgress, ExchangeType, QueueArgument, UrlOrder};

/// A broker the egress may connect to.
pub(super) struct Endpoint {
    /// Holds the password, so it is never printed.
    pub(super) uri: AMQPUri,
    /// The URL without its password.
    pub(super) shown: String,
}

/// The parsed destination.
pub(super) struct Target {
    /// In the order they are tried (shuffled once with `url_order =
    /// "shuffle"`).
    pub(super) endpoints: Vec<Endpoint>,
    pub(super) exchange: ShortString,
    pub(super) kind: ExchangeKind,
    pub(super) queue: ShortString,
    pub(super) queue_arguments: FieldTable,
    /// The routing key of a batch, by the index of its most urgent class.
    pub(super) keys: Vec<ShortString>,
}

impl Target {
    pub(super) fn new(
        cfg: &AmqpEgress,
        node: NodeId,
        classes: Option<&ClassSet>,
    ) -> Result<Target, String> {
        let mut endpoints = cfg
            .urls
            .iter()
            .enumerate()
            .map(|(i, url)| Endpoint::new(cfg, i, url))
            .collect::<Result<Vec<_>, _>>()?;
        if endpoints.is_empty() {
            return Err("egress.amqp.urls: no endpoint".to_owned());
        }
        if cfg.url_order == UrlOrder::Shuffle {
            shuffle(&mut endpoints, node);
        }
        let short = |key: &str, value: &str| {
            ShortString::try_new(value).map_err(|e| format!("egress.amqp.{key}: {e}"))
        };
        let names: Vec<String> = match classes {
            Some(c) => c.iter().map(|(_, c)| c.name.clone()).collect(),
            // Without the class set, the index stands for the name.
            None => (0..=u8::MAX).map(|i| i.to_string()).collect(),
        };
        let keys = names
            .iter()
            .map(|c| short("routing_key", &cfg.routing_key_for(node, c)))
            .collect::<Result<Vec<_>, _>>()?;
        let mut queue_arguments = FieldTable::default();
        for (k, v) in cfg.declared_arguments() {
            queue_arguments.insert(short("queue_arguments", &k)?, amqp_value(v));
        }
        Ok(Target {
            endpoints,
            exchange: short("exchange", &cfg.exchange)?,
            kind: match cfg.exchange_type {
                ExchangeType::Direct => ExchangeKind::Direct,
                ExchangeType::Fanout => ExchangeKind::Fanout,
                ExchangeType::Topic => ExchangeKind::Topic,
                ExchangeType::Headers => ExchangeKind::Headers,
            },
            queue: short("queue", &cfg.queue)?,
            queue_arguments,
            keys,
        })
    }

    /// The routing key of a batch whose most urgent class is `class`.
    pub(super) fn key(&self, class: weir_core::ClassId) -> &ShortString {
        let i = class.index().min(self.keys.len() - 1);
        &self.keys[i]
    }

    /// The distinct routing keys this node publishes with, for bindings.
    pub(super) fn distinct_keys(&self) -> Vec<&ShortString> {
        let mut keys: Vec<&ShortString> = Vec::new();
        for k in &self.keys {
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        keys
    }
}

impl Endpoint {
    pub(super) fn new(cfg: &AmqpEgress, i: usize, url: &str) -> Result<Endpoint, String> {
        let key = if cfg.urls.len() == 1 {
            "egress.amqp.url".to_owned()
        } else {
            format!("egress.amqp.urls[{i}]")
        };
        let shown = redacted_url(url);
        let mut uri: AMQPUri = url
            .parse()
            .map_err(|e| format!("{key} ({shown}) is not a valid AMQP URL: {e}"))?;
        // amq-protocol-uri reads only domain hosts: an IPv6 literal would
        // silently become `localhost`.
        let authority = url
            .split_once("://")
            .map_or("", |(_, rest)| rest.split(['/', '?']).next().unwrap_or(""));
        if authority
            .rsplit('@')
            .next()
            .is_some_and(|h| h.starts_with('['))
        {
            return Err(format!(
                "{key} ({shown}): IPv6 address literals are not supported by the AMQP client (it would connect to localhost); use a host name"
            ));
        }
        // Bound the TCP connect inside lapin's I/O thread too, so an
        // abandoned attempt to a black-holed host does not linger.
        if uri.query.connection_timeout.is_none() {
            uri.query.connection_timeout = Some(
                cfg.connect_timeout
                    .as_millis()
                    .try_into()
                    .unwrap_or(u64::MAX),
            );
        }
        Ok(Endpoint { uri, shown })
    }
}

/// Shuffles the endpoints, seeded by the node id and the clock, so a fleet
/// started together still spreads over the cluster.
pub(super) fn shuffle(endpoints: &mut [Endpoint], node: NodeId) {
    let mut x = node ^ crate::clock::unix_micros() ^ 0x9e37_79b9_7f4a_7c15;
    for i in (1..endpoints.len()).rev() {
        // xorshift64
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let j = (x % (i as u64 + 1)) as usize;
        endpoints.swap(i, j);
    }
}

/// A queue argument as the AMQP field of its kind.
pub(super) fn amqp_value(v: QueueArgument) -> AMQPValue {
    match v {
        QueueArgument::Int(i) => AMQPValue::LongLongInt(i),
        QueueArgument::Float(f) => AMQPValue::Double(f),
        QueueArgument::Bool(b) => AMQPValue::Boolean(b),
        QueueArgument::Str(s) => AMQPValue::LongString(s.into()),
    }
}
