use std::path::{Path, PathBuf};
use std::time::Duration;

use proptest::prelude::*;
use weir_core::class::{ClassId, ClassSet};
use weir_core::janus::redirect::Strategy;
use weir_core::janus::scheme::Scheme;
use weir_core::queueing::queue::QueueCapacity;

use super::*;

/// `config/` at the top of the repository.
fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config")
}

fn problems(text: &str) -> Vec<Problem> {
    match parse(text, "test.toml") {
        Err(ConfigError::Invalid(problems)) => problems,
        other => panic!("expected validation problems, got {other:?}"),
    }
}

/// Asserts that some problem sits at `path` and mentions `needle`.
fn assert_problem(problems: &[Problem], path: &str, needle: &str) {
    assert!(
        problems
            .iter()
            .any(|p| p.path == path && p.message.contains(needle)),
        "no problem at {path} mentioning {needle:?} in:\n{}",
        problems
            .iter()
            .map(|p| format!("  {p}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

fn toml_error(text: &str) -> (Option<Location>, String) {
    match parse(text, "test.toml") {
        Err(ConfigError::Toml {
            location, message, ..
        }) => (location, message),
        other => panic!("expected a TOML error, got {other:?}"),
    }
}

#[test]
fn every_shipped_example_validates() {
    let mut checked = Vec::new();
    for entry in std::fs::read_dir(examples_dir()).expect("config/ exists") {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            if let Err(e) = load(&path) {
                panic!("{} does not validate:\n{e}", path.display());
            }
            checked.push(path.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    checked.sort();
    for expected in [
        "default.toml",
        "five-classes.toml",
        "mosquitto-subscribe.toml",
        "three-classes-amqp.toml",
        "walkthrough.toml",
    ] {
        assert!(checked.iter().any(|c| c == expected), "{expected} missing");
    }
}

#[test]
fn default_config_spells_out_the_defaults() {
    let shipped = parse(DEFAULT_CONFIG, "<default>").unwrap();
    let empty = parse("", "<empty>").unwrap();
    assert_eq!(shipped, empty);
}

#[test]
fn a_gather_of_zero_turns_gathering_off() {
    let c = parse("[batching]\ngather = \"0s\"\n", "test.toml").unwrap();
    assert_eq!(c.batching.gather, Duration::ZERO);
    let c = parse("", "test.toml").unwrap();
    assert_eq!(c.batching.gather, Duration::from_millis(2));
    assert_eq!(
        crate::reload::scheduler_params(&c).gather,
        Duration::from_millis(2)
    );
}

#[test]
fn empty_file_gives_the_defaults() {
    let c = parse("", "<empty>").unwrap();
    assert_eq!(c.node.id, 1);
    assert_eq!(c.node.name, "weir");
    assert_eq!(c.classes, ClassSet::janus_default());
    assert_eq!(
        c.capacities,
        vec![
            QueueCapacity {
                records: 16_384,
                bytes: 8 << 20
            };
            3
        ]
    );
    assert_eq!(c.capacity(ClassId(2)).records, 16_384);
    assert_eq!(c.classifier.default_class(), ClassId(2));
    assert!(c.classifier.rules().is_empty());
    assert_eq!(c.scheduler.scheme, Scheme::Janus(Strategy::Pmrfs));
    assert_eq!(c.scheduler.window, Duration::from_millis(100));
    assert_eq!(c.scheduler.processing_delay, Duration::from_millis(1));
    assert_eq!(c.scheduler.uplink_bytes_per_sec, 2_250_000.0);
    assert_eq!(c.scheduler.burst_bytes, None, "auto");
    assert_eq!(c.scheduler.max_batch_records, 65_536);
    assert_eq!(c.scheduler.max_batch_bytes, 4 << 20);
    let mqtt = c.ingress.mqtt.as_ref().unwrap();
    assert_eq!(
        mqtt.mode,
        MqttMode::Listen(MqttListen::plain("127.0.0.1:1883".parse().unwrap()))
    );
    assert_eq!(mqtt.max_packet_size, 1 << 20);
    assert_eq!(mqtt.qos0_when_full, Qos0WhenFull::Block);
    let grpc = c.ingress.grpc.as_ref().unwrap();
    assert_eq!(grpc.listen, "127.0.0.1:50051".parse().unwrap());
    assert_eq!(grpc.max_message_size, 4 << 20);
    assert_eq!(
        c.egress.sink,
        EgressSink::File(FileEgress {
            dir: "weir-out".into(),
            segment_bytes: 64 << 20,
            segment_age: Duration::from_secs(10),
        })
    );
    assert_eq!(c.egress.link, None);
    assert_eq!(c.admin.listen, None);
    assert_eq!(c.log.level, "info");
}

#[test]
fn subscribe_example_reads_as_written() {
    let c = load(&examples_dir().join("mosquitto-subscribe.toml")).unwrap();
    let Some(MqttIngress {
        mode: MqttMode::Subscribe(sub),
        ..
    }) = &c.ingress.mqtt
    else {
        panic!("subscribe mode expected");
    };
    assert_eq!(sub.broker.to_string(), "127.0.0.1:1883");
    assert_eq!(sub.client_id, "weir-edge-1");
    assert_eq!(sub.topics.len(), 2);
    assert_eq!(sub.qos, SubscribeQos::AtLeastOnce);
    assert!(c.ingress.grpc.is_none());
    let EgressSink::Amqp(amqp) = &c.egress.sink else {
        panic!("amqp egress expected");
    };
    assert_eq!(amqp.exchange_type, ExchangeType::Direct);
    assert_eq!(amqp.confirm_timeout, Duration::from_secs(10));
    assert_eq!(amqp.connect_timeout, Duration::from_secs(10));
    assert_eq!(
        c.classifier.classify_mqtt("factory/l1/vibration"),
        ClassId(0)
    );
    assert_eq!(c.classifier.classify_mqtt("factory/l1/alarm"), ClassId(0));
    assert_eq!(
        c.classifier.classify_mqtt("factory/l1/temperature"),
        ClassId(1)
    );
    assert_eq!(
        c.classifier.classify_mqtt("building/3/occupancy"),
        ClassId(2)
    );
}

#[test]
fn three_class_example_routes_in_order() {
    let c = load(&examples_dir().join("three-classes-amqp.toml")).unwrap();
    let alarm = c.classes.id_of("alarm").unwrap();
    let telemetry = c.classes.id_of("telemetry").unwrap();
    let bulk = c.classes.id_of("bulk").unwrap();
    assert_eq!(c.classifier.classify_mqtt("site/7/alarm/fire"), alarm);
    assert_eq!(c.classifier.classify_mqtt("site/7/power"), telemetry);
    assert_eq!(c.classifier.classify_mqtt("elsewhere"), bulk);
    assert_eq!(c.classifier.classify_grpc("camera-events"), alarm);
    assert_eq!(c.classifier.classify_grpc("unknown"), bulk);
    assert_eq!(
        c.capacity(alarm),
        QueueCapacity {
            records: 8192,
            bytes: 8 << 20
        }
    );
    assert_eq!(c.capacity(telemetry).bytes, 8 << 20);
    let link = c.egress.link.unwrap();
    assert_eq!(link.preset, Some(LinkPreset::FourG));
    assert_eq!(link.delay, Duration::from_millis(50));
    assert_eq!(link.bandwidth_bytes_per_sec, 18e6 / 8.0);
}

#[test]
fn five_class_example_keeps_its_shares() {
    let c = load(&examples_dir().join("five-classes.toml")).unwrap();
    assert_eq!(c.classes.len(), 5);
    assert_eq!(c.classes.min_shares(), vec![0.2, 0.1, 0.1, 0.05, 0.05]);
    assert_eq!(c.scheduler.processing_delay, Duration::from_micros(500));
    let link = c.egress.link.unwrap();
    assert_eq!(link.preset, None);
    assert_eq!(link.bandwidth_bytes_per_sec, 97_500.0);
}

#[test]
fn default_class_is_the_last_class() {
    let c = parse(
        r#"
        [[class]]
        name = "fast"
        bound = "10ms"
        [[class]]
        name = "slow"
        bound = "1s"
        [scheduler]
        window = "10ms"
        "#,
        "t",
    )
    .unwrap();
    assert_eq!(c.classifier.default_class(), ClassId(1));
}

#[test]
fn every_mistake_is_reported_with_its_key_path() {
    let ps = problems(
        r#"
        [node]
        id = 0

        [[class]]
        name = "ls"
        bound = "100ms"
        min_share = 0.7

        [[class]]
        name = "nm"
        bound = "0ms"
        capacity_records = 0

        [[class]]
        name = "ls"
        bound = "5xs"
        min_share = 0.6
        capacity_bytes = "0"

        [[class]]
        name = "bad"
        bound = "1s"
        min_share = 1.5

        [classify]
        default_class = "nope"

        [[classify.route]]
        mqtt = "a/#/b"
        class = "ls"

        [[classify.route]]
        mqtt = "a"
        grpc = "b"
        class = "ls"

        [[classify.route]]
        grpc = "x"

        [[classify.route]]
        grpc = "y"
        class = "foo"

        [scheduler]
        scheme = "pmfrs"
        window = "200ms"
        uplink = "18Mbps/x"
        burst = "0"
        max_batch_records = 0

        [ingress.mqtt]
        broker = "127.0.0.1:1883"
        qos = 2
        max_packet_size = "1GiB"
        qos0_when_full = "maybe"

        [ingress.grpc]
        listen = "localhost:50051"

        [batching]
        gather = "2 fortnights"

        [egress]
        kind = "file"

        [egress.amqp]
        url = "http://user:secret@host/"
        connect_timeout = "0s"

        [egress.link]
        preset = "4g"
        delay = "10ms"

        [admin]
        listen = "0.0.0.0:1883"

        [log]
        level = "infoo"
        "#,
    );
    assert_problem(&ps, "node.id", "0 is reserved");
    assert_problem(&ps, "class[1].bound", "\"0ms\" must be greater than zero");
    assert_problem(&ps, "class[1].capacity_records", "greater than zero");
    assert_problem(&ps, "class[2].name", "already the name of class[0]");
    assert_problem(&ps, "class[2].bound", "invalid duration \"5xs\"");
    assert_problem(&ps, "class[2].capacity_bytes", "greater than zero");
    assert_problem(&ps, "class[3].min_share", "1.5 is not within 0.0..=1.0");
    assert_problem(&ps, "class", "add up to");
    assert_problem(&ps, "classify.default_class", "unknown class \"nope\"");
    assert_problem(&ps, "classify.route[0].mqtt", "`#` must be the last level");
    assert_problem(&ps, "classify.route[1]", "exactly one of `mqtt` or `grpc`");
    assert_problem(&ps, "classify.route[2].class", "missing");
    assert_problem(
        &ps,
        "classify.route[3].class",
        "unknown class \"foo\" (known: ls, nm, bad)",
    );
    assert_problem(&ps, "scheduler.scheme", "unknown scheme \"pmfrs\"");
    assert_problem(
        &ps,
        "scheduler.window",
        "longer than the bound of class \"ls\"",
    );
    assert_problem(&ps, "scheduler.uplink", "invalid rate \"18Mbps/x\"");
    assert_problem(&ps, "scheduler.burst", "greater than zero");
    assert_problem(&ps, "scheduler.max_batch_records", "greater than zero");
    assert_problem(&ps, "batching.gather", "invalid duration");
    assert_problem(
        &ps,
        "ingress.mqtt.broker",
        "only used when mode = \"subscribe\"",
    );
    assert_problem(
        &ps,
        "ingress.mqtt.qos",
        "only used when mode = \"subscribe\"",
    );
    assert_problem(&ps, "ingress.mqtt.max_packet_size", "more than the limit");
    assert_problem(
        &ps,
        "ingress.mqtt.qos0_when_full",
        "unknown policy \"maybe\"",
    );
    assert_problem(&ps, "ingress.grpc.listen", "not an IP address and port");
    assert_problem(&ps, "egress.amqp", "egress.kind is \"file\"");
    assert_problem(&ps, "egress.amqp.url", "must start with amqp://");
    assert_problem(&ps, "egress.amqp.connect_timeout", "");
    assert_problem(&ps, "egress.link", "not both");
    assert_problem(&ps, "log.level", "\"infoo\"");
    assert!(
        !ps.iter().any(|p| p.message.contains("secret")),
        "an AMQP password leaked into an error message"
    );

    // Display: a count, then one problem per line.
    let text = ConfigError::Invalid(ps.clone()).to_string();
    let mut lines = text.lines();
    assert_eq!(
        lines.next().unwrap(),
        format!("invalid configuration ({} problems):", ps.len())
    );
    assert_eq!(lines.count(), ps.len());
    assert!(text.contains("\n  class[1].bound: \"0ms\" must be greater than zero"));
}

#[test]
fn mode_and_kind_specific_sections() {
    let ps = problems(
        r#"
        [ingress.mqtt]
        mode = "subscribe"
        listen = "0.0.0.0:1883"
        broker = "mqtt://broker:1883"
        topics = []
        client_id = ""

        [egress]
        kind = "amqp"

        [egress.file]
        dir = ""
        "#,
    );
    assert_problem(
        &ps,
        "ingress.mqtt.listen",
        "only used when mode = \"listen\"",
    );
    assert_problem(&ps, "ingress.mqtt.broker", "without a scheme");
    assert_problem(&ps, "ingress.mqtt.topics", "at least one topic filter");
    assert_problem(&ps, "ingress.mqtt.client_id", "must not be empty");
    assert_problem(&ps, "egress.file", "egress.kind is \"amqp\"");
    assert_problem(&ps, "egress.file.dir", "must not be empty");
    assert_problem(&ps, "egress.amqp", "needs an [egress.amqp] section");

    let ps = problems(
        r#"
        [ingress.mqtt]
        mode = "subscribe"
        broker = "[::1:1883"
        topics = ["ok/#", "bad+"]
        qos = 7
        [egress]
        kind = "pulsar"
        [egress.link]
        bandwidth = "0bit/s"
        delay = "1ms"
        "#,
    );
    assert_problem(&ps, "ingress.mqtt.broker", "closing bracket");
    assert_problem(&ps, "ingress.mqtt.topics[1]", "must occupy a whole level");
    assert_problem(&ps, "ingress.mqtt.qos", "7 is not an MQTT QoS");
    assert_problem(
        &ps,
        "egress.kind",
        "unknown kind \"pulsar\" (known: file, amqp, kafka, mqtt)",
    );
    assert_problem(&ps, "egress.link.bandwidth", "greater than zero");

    let ps = problems("[egress.link]\nbandwidth = \"1Mbit/s\"\n[ingress.mqtt]\nmode = \"bridge\"");
    assert_problem(&ps, "egress.link.delay", "missing");
    assert_problem(&ps, "ingress.mqtt.mode", "unknown mode \"bridge\"");
    assert_problem(&problems("[egress.link]\n"), "egress.link", "give a preset");
    assert_problem(
        &problems("[egress.link]\npreset = \"5g\""),
        "egress.link.preset",
        "unknown preset \"5g\" (known: wifi, 4g, 3g)",
    );
}

#[test]
fn cross_section_checks() {
    // A record as large as an ingress takes must fit the smallest queue.
    let ps = problems(
        r#"
        [[class]]
        name = "tiny"
        bound = "100ms"
        capacity_bytes = "64KiB"
        "#,
    );
    assert_problem(
        &ps,
        "ingress.mqtt.max_packet_size",
        "class \"tiny\" (64KiB)",
    );
    assert_problem(&ps, "ingress.grpc.max_message_size", "class \"tiny\"");

    // Listeners on one port clash; port 0 never does.
    let ps =
        problems("[ingress.grpc]\nlisten = \"127.0.0.1:1883\"\n[admin]\nlisten = \"[::]:1883\"");
    assert_problem(
        &ps,
        "ingress.grpc.listen",
        "clashes with ingress.mqtt.listen",
    );
    assert!(!ps.iter().any(|p| p.path == "admin.listen"));
    parse(
        "[ingress.mqtt]\nlisten = \"127.0.0.1:0\"\n[ingress.grpc]\nlisten = \"127.0.0.1:0\"",
        "t",
    )
    .unwrap();

    // processing_delay must leave room within the tightest bound.
    assert_problem(
        &problems("[scheduler]\nprocessing_delay = \"100ms\""),
        "scheduler.processing_delay",
        "not less than the bound of class \"ls\"",
    );

    // No ingress at all.
    assert_problem(
        &problems("[ingress.mqtt]\nenabled = false\n[ingress.grpc]\nenabled = false"),
        "ingress",
        "enable at least one",
    );
}

#[test]
fn class_list_problems() {
    assert_problem(
        &problems("class = []"),
        "class",
        "at least one latency class",
    );
    let many: String = (0..17)
        .map(|i| format!("[[class]]\nname = \"c{i}\"\nbound = \"1s\"\n"))
        .collect();
    assert_problem(&problems(&many), "class", "17 classes given, at most 16");
    let ps = problems("[[class]]\nbound = \"1s\"\n[[class]]\nname = \"x\"\n");
    assert_problem(&ps, "class[0].name", "missing or empty");
    assert_problem(&ps, "class[1].bound", "missing");
    // A name used three times: each repeat is reported at its own index.
    let ps = problems(
        "[[class]]\nname = \"a\"\nbound = \"1s\"\n[[class]]\nname = \"a\"\nbound = \"1s\"\n[[class]]\nname = \"a\"\nbound = \"0s\"\n",
    );
    assert_problem(&ps, "class[1].name", "already the name of class[0]");
    assert_problem(&ps, "class[2].name", "already the name of class[0]");
    assert_problem(&ps, "class[2].bound", "must be greater than zero");
}

#[test]
fn unknown_keys_are_refused_by_name() {
    let (location, message) = toml_error("[node]\nidd = 3\n");
    assert!(message.contains("idd"), "{message}");
    assert_eq!(location.map(|l| l.line), Some(2));

    let (_, message) = toml_error("[batchng]\nsize = 3\n");
    assert!(message.contains("batchng"), "{message}");

    let (location, message) = toml_error("[[classify.route]]\nmqtt = \"a\"\nclas = \"ls\"\n");
    assert!(message.contains("clas"), "{message}");
    assert_eq!(location, Some(Location { line: 3, column: 1 }));

    let (_, message) = toml_error("[ingress.mqtt]\nport = 1883\n");
    assert!(message.contains("port"), "{message}");
}

#[test]
fn toml_errors_carry_origin_and_position() {
    let err = parse("[node]\nid = \n", "edge.toml").unwrap_err();
    let ConfigError::Toml { location, .. } = &err else {
        panic!("expected a TOML error, got {err:?}");
    };
    assert_eq!(location.unwrap().line, 2);
    assert!(err.to_string().starts_with("edge.toml:2:"), "{err}");

    // Wrong type.
    let (location, _) = toml_error("[node]\nname = 5\n");
    assert_eq!(location.unwrap().line, 2);
}

#[test]
fn io_errors_name_the_file() {
    let missing = Path::new("/nonexistent/weir.toml");
    let err = load(missing).unwrap_err();
    assert!(matches!(err, ConfigError::Io { .. }));
    assert!(err.to_string().contains("/nonexistent/weir.toml"), "{err}");
}

proptest! {
    #[test]
    fn durations_round_trip(nanos in 0u64..(1 << 50)) {
        let d = HumanDuration(Duration::from_nanos(nanos));
        prop_assert_eq!(d.to_string().parse::<HumanDuration>(), Ok(d));
    }

    #[test]
    fn sizes_round_trip(bytes in any::<u64>(), shift in 0u32..40) {
        for size in [Size(bytes), Size((bytes >> 24) << shift)] {
            prop_assert_eq!(size.to_string().parse::<Size>(), Ok(size));
        }
    }

    #[test]
    fn rates_round_trip(bytes_per_sec in 0.0f64..1e12) {
        let back = Rate::from_bytes_per_sec(bytes_per_sec)
            .to_string()
            .parse::<Rate>()
            .unwrap()
            .bytes_per_sec();
        prop_assert!((back - bytes_per_sec).abs() <= bytes_per_sec * 1e-12);
    }
}

#[test]
fn spool_keys_parse_and_every_bad_one_is_named() {
    let cfg = parse(
        "[[class]]\nname = \"ls\"\nbound = \"100ms\"\ndurability = \"spool\"\non_full = \"drop-oldest\"\nttl = \"1h\"\nspool_max_bytes = \"32MiB\"\n\
         [[class]]\nname = \"lt\"\nbound = \"1s\"\n\
         [spool]\ndir = \"/tmp/x\"\nsync = \"interval\"\nwindow_bytes = \"8MiB\"\ncommit_delay = \"5ms\"",
        "spool",
    )
    .unwrap();
    assert_eq!(cfg.spool.commit_delay, std::time::Duration::from_millis(5));
    assert!(cfg.spooled());
    assert_eq!(cfg.durability[0].durability, Durability::Spool);
    assert_eq!(cfg.durability[0].on_full, OnFull::DropOldest);
    assert_eq!(
        cfg.durability[0].ttl,
        Some(std::time::Duration::from_secs(3600))
    );
    assert_eq!(cfg.durability[0].max_bytes, 32 << 20);
    assert_eq!(cfg.durability[1].durability, Durability::Memory);
    assert_eq!(cfg.spool.sync, SyncMode::Interval);
    // A spooled class's memory queue is its window.
    assert_eq!(cfg.memory_capacities()[0].bytes, 8 << 20);
    assert_eq!(cfg.memory_capacities()[1].bytes, cfg.capacities[1].bytes);

    let p = problems(
        "[[class]]\nname = \"ls\"\nbound = \"100ms\"\ndurability = \"disk\"\non_full = \"wait\"\nttl = \"0s\"\n\
         [spool]\nsync = \"sometimes\"\nsegment_bytes = \"100\"\ncommit_delay = \"2s\"",
    );
    assert_problem(&p, "spool.commit_delay", "too long");
    assert_problem(&p, "class[0].durability", "unknown durability \"disk\"");
    assert_problem(&p, "class[0].on_full", "unknown policy \"wait\"");
    assert_problem(&p, "class[0].ttl", "greater than zero");
    assert_problem(&p, "spool.sync", "unknown sync mode");
    assert_problem(&p, "spool.segment_bytes", "too small");

    // A packet larger than a spooled class's memory window never fits.
    let p = problems(
        "[[class]]\nname = \"ls\"\nbound = \"100ms\"\ndurability = \"spool\"\n[spool]\nwindow_bytes = \"64KiB\"",
    );
    assert_problem(&p, "ingress.mqtt.max_packet_size", "spool.window_bytes");
}

#[test]
fn worker_threads_default_to_one_per_core_at_most_four() {
    let c = parse("", "t").unwrap();
    assert_eq!(c.node.workers(2), 2);
    assert_eq!(c.node.workers(4), 4);
    assert_eq!(c.node.workers(64), 4);
    let c = parse("[node]\nworker_threads = 8\n", "t").unwrap();
    assert_eq!(c.node.workers(2), 8);
    let ps = problems("[node]\nworker_threads = 0\n");
    assert_problem(&ps, "node.worker_threads", "not within 1..=256");
}

#[test]
fn cpu_priority_is_off_by_default_and_checked() {
    let c = parse("", "t").unwrap();
    assert!(!c.node.priority.is_set());
    let c = parse("[node]\nnice = -10\nrealtime_priority = 10\n", "t").unwrap();
    assert_eq!(c.node.priority.nice, Some(-10));
    assert_eq!(c.node.priority.realtime, Some(10));
    let ps = problems("[node]\nnice = -21\nrealtime_priority = 0\n");
    assert_problem(&ps, "node.nice", "not within -20..=19");
    assert_problem(&ps, "node.realtime_priority", "not within 1..=99");
    let ps = problems("[node]\nrealtime_priority = 100\n");
    assert_problem(&ps, "node.realtime_priority", "not within 1..=99");
}

mod egress;
mod peering;
mod security;
mod units;
