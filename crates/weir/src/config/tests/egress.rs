//! The egress: broker addresses, AMQP endpoints, queue types, routing templates, batch caps and the window.

use super::*;

#[test]
fn amqp_endpoints_queue_types_and_routing_templates() {
    let ok = parse(
        r#"
[[class]]
name = "ls"
bound = "100ms"
[[class]]
name = "lt"
bound = "1s"
[egress]
kind = "amqp"
[egress.amqp]
urls = ["amqp://a:b@rabbit-1:5672/%2f", "amqps://a:b@rabbit-2:5671/%2f"]
url_order = "shuffle"
exchange = "weir"
exchange_type = "topic"
queue = ""
queue_type = "quorum"
queue_arguments = { x-max-length-bytes = 1000000, x-delivery-limit = 5, x-overflow = "reject-publish" }
routing_key = "weir.{node}.{class}"
blocked_failover_after = "5s"
"#,
        "amqp",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let EgressSink::Amqp(a) = ok.egress.sink else {
        panic!("amqp egress")
    };
    assert_eq!(a.urls.len(), 2);
    assert_eq!(a.url_order, UrlOrder::Shuffle);
    assert_eq!(a.queue_type, QueueType::Quorum);
    assert_eq!(a.routing_key_for(7, "ls"), "weir.7.ls");
    assert!(a.routing_key_is_template());
    assert_eq!(a.blocked_failover_after, Duration::from_secs(5));
    let args = a.declared_arguments();
    assert_eq!(
        args[0],
        (
            "x-queue-type".to_owned(),
            QueueArgument::Str("quorum".into())
        )
    );
    assert!(args.contains(&("x-delivery-limit".to_owned(), QueueArgument::Int(5))));
    assert!(a.queue_settings().contains("queue_type = \"quorum\""));

    // A classic queue is declared as weir always did, without x-queue-type.
    let plain = parse("[egress]\nkind = \"amqp\"\n[egress.amqp]\n", "plain").unwrap();
    let EgressSink::Amqp(p) = plain.egress.sink else {
        panic!("amqp egress")
    };
    assert_eq!(p.urls, vec![crate::config::AMQP_URL.to_owned()]);
    assert!(p.declared_arguments().is_empty());
    // The urgent lane is on unless turned off.
    assert!(p.urgent_lane);
    let off = parse(
        "[egress]\nkind = \"amqp\"\n[egress.amqp]\nurgent_lane = false\n",
        "off",
    )
    .unwrap();
    let EgressSink::Amqp(off) = off.egress.sink else {
        panic!("amqp egress")
    };
    assert!(!off.urgent_lane);

    let ps = problems(
        r#"
[egress]
kind = "amqp"
[egress.amqp]
url = "amqp://x:secret@h/%2f"
urls = ["amqp://x:secret@h/%2f"]
queue_type = "mirrored"
url_order = "random"
queue_arguments = { x-queue-type = "quorum", x-nested = { a = 1 } }
routing_key = "weir.{host}"
"#,
    );
    assert_problem(&ps, "egress.amqp.urls", "not both");
    assert_problem(&ps, "egress.amqp.queue_type", "\"mirrored\"");
    assert_problem(&ps, "egress.amqp.url_order", "\"random\"");
    assert_problem(
        &ps,
        "egress.amqp.queue_arguments.x-queue-type",
        "queue_type",
    );
    assert_problem(&ps, "egress.amqp.queue_arguments.x-nested", "table");
    assert_problem(
        &ps,
        "egress.amqp.routing_key",
        "placeholders are {node} and {class}",
    );
    assert!(!ps.iter().any(|p| p.message.contains("secret")));

    let ps = problems(
        "[egress]\nkind = \"amqp\"\n[egress.amqp]\nurls = [\"http://h\"]\nexchange = \"\"\nqueue = \"\"\nrouting_key = \"{class}\"\n",
    );
    assert_problem(&ps, "egress.amqp.urls[0]", "must start with amqp://");
    assert_problem(&ps, "egress.amqp.queue", "default exchange");
    assert_problem(&ps, "egress.amqp.routing_key", "named exchange");
    let long = "x".repeat(240);
    let ps = problems(&format!(
        "[egress]\nkind = \"amqp\"\n[egress.amqp]\nurls = []\nrouting_key = \"{long}.{{node}}\"\n"
    ));
    assert_problem(&ps, "egress.amqp.urls", "at least one");
    assert_problem(&ps, "egress.amqp.routing_key", "renders up to");
}

#[test]
fn batch_caps_and_the_window_may_be_left_to_weir() {
    let c = parse(
        r#"
        [scheduler]
        burst = "auto"
        max_batch_records = "auto"
        max_batch_bytes = "auto"
        [egress]
        kind = "amqp"
        [egress.amqp]
        url = "amqp://guest:guest@127.0.0.1:5672/%2f"
        max_in_flight = "auto"
        "#,
        "auto.toml",
    )
    .unwrap();
    assert_eq!(c.scheduler.burst_bytes, None);
    assert_eq!(c.scheduler.max_batch_records, 65_536);
    assert_eq!(c.scheduler.max_batch_bytes, 4 << 20);
    match &c.egress.sink {
        crate::config::EgressSink::Amqp(a) => assert_eq!(a.max_in_flight, 64),
        other => panic!("{other:?}"),
    }
    let set = parse(
        "[scheduler]\nburst = \"64KiB\"\nmax_batch_records = 1024\nmax_batch_bytes = \"64KiB\"\n",
        "set.toml",
    )
    .unwrap();
    assert_eq!(set.scheduler.burst_bytes, Some(65_536));
    assert_eq!(set.scheduler.max_batch_records, 1024);
    assert_eq!(set.scheduler.max_batch_bytes, 65_536);
    let ps = problems(
        r#"
        [scheduler]
        burst = "automatic"
        max_batch_records = "many"
        max_batch_bytes = "0"
        [egress]
        kind = "amqp"
        [egress.amqp]
        url = "amqp://guest:guest@127.0.0.1:5672/%2f"
        max_in_flight = 0
        "#,
    );
    assert_problem(&ps, "scheduler.burst", "\"auto\"");
    assert_problem(&ps, "scheduler.max_batch_records", "whole number");
    assert_problem(&ps, "scheduler.max_batch_bytes", "greater than zero");
    assert_problem(&ps, "egress.amqp.max_in_flight", "out of range");
}

#[test]
fn broker_addresses() {
    let c = parse(
        "[ingress.mqtt]\nmode = \"subscribe\"\nbroker = \"[::1]:1884\"\n",
        "t",
    )
    .unwrap();
    let Some(MqttIngress {
        mode: MqttMode::Subscribe(sub),
        ..
    }) = c.ingress.mqtt
    else {
        panic!("subscribe mode expected");
    };
    assert_eq!(sub.broker.host, "::1");
    assert_eq!(sub.broker.port, 1884);
    assert_eq!(sub.broker.to_string(), "[::1]:1884");
    assert_eq!(sub.client_id, "weir-1");
    assert_eq!(sub.topics[0].as_str(), "#");

    for bad in [
        "broker",
        ":1883",
        "host:0",
        "host:99999",
        "::1:1883",
        "a b:1",
    ] {
        let text = format!("[ingress.mqtt]\nmode = \"subscribe\"\nbroker = {bad:?}\n");
        assert_problem(&problems(&text), "ingress.mqtt.broker", bad);
    }
}

#[test]
fn kafka_brokers_topics_security_and_message_size() {
    let ok = parse(
        r#"
[[class]]
name = "ls"
bound = "100ms"
[[class]]
name = "lt"
bound = "1s"
[egress]
kind = "kafka"
[egress.kafka]
brokers = ["b-1.msk.example:9096", "b-2.msk.example:9096"]
topic = "site7.{class}"
tls = true
sasl_mechanism = "scram-sha-512"
username = "weir"
password = "secret"
max_in_flight = 8
"#,
        "kafka",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let EgressSink::Kafka(k) = &ok.egress.sink else {
        panic!("kafka egress")
    };
    assert_eq!(k.brokers.len(), 2);
    assert_eq!(k.topic_for(7, "ls"), "site7.ls");
    assert_eq!(
        k.tls,
        Some(KafkaTls {
            files: ClientFiles::default()
        })
    );
    let sasl = k.sasl.as_ref().unwrap();
    assert_eq!(sasl.mechanism, SaslMechanism::ScramSha512);
    assert!(
        !format!("{sasl:?}").contains("secret"),
        "the password is not logged"
    );
    assert_eq!(k.max_in_flight, 8);
    assert_eq!(k.max_message_bytes, 1 << 20);
    // Batches and records left at their defaults are cut to fit a message.
    assert_eq!(ok.scheduler.max_batch_bytes as u64, k.max_batch_bytes());
    let mqtt = ok.ingress.mqtt.as_ref().unwrap();
    assert_eq!(mqtt.max_packet_size as u64, k.max_record_bytes());
    assert!(ok.ingress.grpc.as_ref().unwrap().max_message_size as u64 <= k.max_record_bytes());

    let ps = problems(
        r#"
[ingress.mqtt]
max_packet_size = "1MiB"
[scheduler]
max_batch_bytes = "2MiB"
[egress]
kind = "kafka"
[egress.kafka]
brokers = ["nohost", ":9092"]
topic = "bad topic/{node}"
sasl_mechanism = "plain"
username = "u"
password = "p"
max_in_flight = 0
"#,
    );
    assert_problem(&ps, "egress.kafka.brokers[0]", "is not host:port");
    assert_problem(&ps, "egress.kafka.brokers[1]", "is not host:port");
    assert_problem(&ps, "egress.kafka.topic", "not a Kafka topic name");
    assert_problem(&ps, "egress.kafka.sasl_mechanism", "needs tls = true");
    assert_problem(&ps, "egress.kafka.max_in_flight", "out of range");

    let ps = problems(
        r#"
[egress]
kind = "kafka"
[egress.kafka]
topic = "t.{cls}"
sasl_mechanism = "scram-sha-256"
username = "u"
"#,
    );
    assert_problem(&ps, "egress.kafka.topic", "not a placeholder");
    assert_problem(
        &ps,
        "egress.kafka.password",
        "needs a username and a password",
    );

    // A client certificate: with its key, never with tls = false.
    let ps = problems(
        r#"
[egress]
kind = "kafka"
[egress.kafka]
tls = false
cert_file = "/nonexistent/client.pem"
key_file = "/nonexistent/client.key"
"#,
    );
    assert_problem(&ps, "egress.kafka.cert_file", "is not a readable file");
    assert_problem(&ps, "egress.kafka.key_file", "is not a readable file");
    assert_problem(&ps, "egress.kafka.tls", "false, but ca_file, cert_file");
    let ps = problems(
        r#"
[egress]
kind = "kafka"
[egress.kafka]
cert_file = "/nonexistent/client.pem"
"#,
    );
    assert_problem(
        &ps,
        "egress.kafka.key_file",
        "cert_file needs its private key",
    );

    // Sizes the file sets itself that a Kafka message cannot carry.
    let ps = problems(
        r#"
[ingress.mqtt]
max_packet_size = "1MiB"
[scheduler]
max_batch_bytes = "2MiB"
[egress]
kind = "kafka"
[egress.kafka]
"#,
    );
    assert_problem(
        &ps,
        "ingress.mqtt.max_packet_size",
        "larger than a record one message can carry",
    );
    assert_problem(
        &ps,
        "scheduler.max_batch_bytes",
        "larger than one message holds",
    );
    assert_problem(
        &problems("[egress]\nkind = \"kafka\""),
        "egress.kafka",
        "needs an [egress.kafka] section",
    );
    assert_problem(
        &problems("[egress]\nkind = \"file\"\n[egress.kafka]\n"),
        "egress.kafka",
        "egress.kind is \"file\"",
    );
}

#[test]
fn mqtt_brokers_modes_certificates_and_payload_limit() {
    let ok = parse(
        r#"
[egress]
kind = "mqtt"
[egress.mqtt]
broker = "mqtts://a1b2c3-ats.iot.eu-west-1.amazonaws.com"
mode = "batch"
topic = "site/{node}/{class}"
"#,
        "mqtt",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let EgressSink::Mqtt(m) = &ok.egress.sink else {
        panic!("mqtt egress")
    };
    assert!(m.tls);
    assert_eq!(m.broker.port, 8883, "mqtts's port by default");
    assert_eq!(m.client_id, "weir-1");
    assert_eq!(m.mode, MqttEgressMode::Batch);
    assert_eq!(m.topic_for(7, "ls"), "site/7/ls");
    assert_eq!(m.max_payload, 128 * 1024, "AWS IoT Core's limit by default");
    assert_eq!(m.max_in_flight, 100);
    // Batches and default ingress limits cut to one publish.
    assert_eq!(ok.scheduler.max_batch_bytes as u64, m.max_batch_bytes());
    assert!(ok.ingress.mqtt.as_ref().unwrap().max_packet_size as u64 <= m.max_record_bytes());

    let ps = problems(
        r#"
[egress]
kind = "mqtt"
[egress.mqtt]
broker = "tcp://broker:1883"
mode = "stream"
topic = "weir/#"
topic_prefix = "a/+/"
cert_file = "/nonexistent/cert.pem"
max_in_flight = 0
"#,
    );
    assert_problem(&ps, "egress.mqtt.broker", "mqtt://host[:port]");
    assert_problem(&ps, "egress.mqtt.mode", "unknown mode \"stream\"");
    assert_problem(&ps, "egress.mqtt.topic", "no wildcard");
    assert_problem(&ps, "egress.mqtt.topic_prefix", "no wildcard");
    assert_problem(&ps, "egress.mqtt.cert_file", "not a readable file");
    assert_problem(&ps, "egress.mqtt.key_file", "missing");
    assert_problem(&ps, "egress.mqtt.max_in_flight", "out of range");
    let ps = problems(
        "[egress]\nkind = \"mqtt\"\n[egress.mqtt]\nbroker = \"mqtt://cloud.example:1883\"\nusername = \"u\"\npassword = \"p\"",
    );
    assert_problem(&ps, "egress.mqtt.password", "in the clear");
}
