use super::config::{config_text, split_amqp};
use super::node::{log_events, metric, metric_sum, snmp_value};
use super::*;
use crate::janus::{Cell, ALL_SCHEMES};
use clap::Parser;
use std::time::Duration;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    a: Args,
}

#[test]
fn every_node_gets_a_valid_config_with_its_peers_on_the_lan() {
    let a = Cli::parse_from(["x"]).a;
    assert_eq!(a.schemes, ["native", "qm-only", "pmrfs"]);
    assert_eq!(a.record_bytes, [256, 480, 640, 720, 1024]);
    assert!(!a.pin_uplink);
    for scheme in ALL_SCHEMES {
        let cell = Cell {
            scheme: scheme.into(),
            network: "4g".into(),
            lt_rate: 5000,
            record_bytes: 640,
        };
        let text = config_text(
            3,
            Path::new("/tmp/x"),
            &cell,
            2_250_000.0,
            &a,
            "amqp://guest:guest@10.251.3.1:5700/%2f",
            "q",
        );
        let cfg = weir::config::parse(&text, "test").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cfg.scheduler.scheme.to_string(), scheme);
        assert!(cfg.scheduler.track_uplink);
        assert_eq!(cfg.scheduler.uplink_bytes_per_sec, 2_250_000.0);
        assert!(
            cfg.egress.link.is_none(),
            "the uplink is real, not emulated"
        );
        let peering = cfg.peering.expect("peering on");
        assert_eq!(peering.peers.len(), 3);
        assert!(peering.peers.iter().all(|p| p.id != 3));
    }
    // The urgent lane is weir's default unless given (and then the
    // same on every node).
    let lane = |on: Option<&'static str>| {
        let mut args = vec!["x"];
        if let Some(on) = on {
            args.extend(["--urgent-lane", on]);
        }
        let a = Cli::parse_from(args).a;
        let cell = Cell {
            scheme: "pmrfs".into(),
            network: "4g".into(),
            lt_rate: 5000,
            record_bytes: 720,
        };
        let text = config_text(1, Path::new("/tmp/x"), &cell, 2.25e6, &a, "amqp://h/", "q");
        match weir::config::parse(&text, "test").unwrap().egress.sink {
            weir::config::EgressSink::Amqp(amqp) => amqp.urgent_lane,
            other => panic!("{other:?}"),
        }
    };
    assert!(lane(None));
    assert!(!lane(Some("false")));
    assert!(lane(Some("true")));
}

#[test]
fn the_defaults_config_is_the_default_config_but_for_addresses_and_routes() {
    let cell = Cell {
        scheme: "pmrfs".into(),
        network: "100Mbit/s@5ms".into(),
        lt_rate: 5000,
        record_bytes: 256,
    };
    let parse = |args: &[&str]| {
        let a = Cli::parse_from(args).a;
        let text = config_text(1, Path::new("/tmp/x"), &cell, 12.5e6, &a, "amqp://h/", "q");
        weir::config::parse(&text, "test").unwrap_or_else(|e| panic!("{e}\n{text}"))
    };
    let plain = weir::config::parse(weir::config::DEFAULT_CONFIG, "default").unwrap();
    let cfg = parse(&["x", "--defaults"]);
    // What the lab must not change: the scheduler, the classes, the
    // compression, the egress's window.
    assert_eq!(cfg.scheduler, plain.scheduler);
    assert_eq!(cfg.classes, plain.classes);
    assert_eq!(cfg.compression, plain.compression);
    assert!(cfg.peering.is_none());
    let amqp = |c: &weir::config::Config| match &c.egress.sink {
        weir::config::EgressSink::Amqp(a) => a.max_in_flight,
        other => panic!("{other:?}"),
    };
    // The tuned keys, when given.
    let tuned = parse(&[
        "x",
        "--defaults",
        "--max-batch-bytes",
        "256KiB",
        "--max-in-flight",
        "2",
    ]);
    assert_eq!(tuned.scheduler.max_batch_bytes, 256 << 10);
    assert_eq!(amqp(&tuned), 2);
    assert_ne!(amqp(&cfg), 2);
    // Any rate and delay as a network.
    let p = janus::preset("100Mbit/s@5ms").unwrap();
    assert_eq!(
        (p.bytes_per_sec, p.delay),
        (12.5e6, Duration::from_millis(5))
    );
    assert!(janus::preset("100Mbit@5ms").is_err());
    assert!(janus::preset("5g").is_err());
}

#[test]
fn amqp_urls_split_around_the_address() {
    assert_eq!(
        split_amqp("amqp://guest:guest@127.0.0.1:5672/%2f").unwrap(),
        (
            "amqp://guest:guest@".to_string(),
            "127.0.0.1:5672".to_string(),
            "/%2f".to_string()
        )
    );
    assert_eq!(
        split_amqp("amqp://rabbit").unwrap(),
        (
            "amqp://".to_string(),
            "rabbit:5672".to_string(),
            String::new()
        )
    );
    assert!(split_amqp("amqps://x").is_err());
}

#[test]
fn log_events_are_warnings_and_take_backs_marked_if_at_shutdown() {
    let dir = std::env::temp_dir().join(format!("weir-lab-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("weir.log");
    let during = "2026-11-27T05:45:59Z  INFO weir::app: async runtime workers=2\n\
        2026-11-27T05:46:01Z  WARN weir::egress: delivery failed; retrying\n\
        2026-11-27T05:46:02Z  INFO weir::peer::client: provider gone; taking back its unacknowledged records provider=4\n";
    let after = "2026-11-27T05:46:20Z ERROR weir::peer: at shutdown\n";
    std::fs::write(&path, format!("{during}{after}")).unwrap();
    let events = log_events(&path, during.len() as u64);
    assert_eq!(events.len(), 3, "{events:?}");
    assert!(events[0].0.contains("delivery failed") && !events[0].1);
    assert!(events[1].0.contains("taking back") && !events[1].1);
    assert!(events[2].0.contains("at shutdown") && events[2].1);
    assert!(log_events(&path, u64::MAX).iter().all(|e| !e.1));
    assert!(log_events(&dir.join("missing.log"), 100).is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn retransmits_are_read_from_the_tcp_table() {
    let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\n\
                Tcp: RtoAlgorithm ActiveOpens RetransSegs InErrs\nTcp: 1 12 345 0\n";
    assert_eq!(snmp_value(snmp, "Tcp:", "RetransSegs"), Some(345));
    assert_eq!(snmp_value(snmp, "Tcp:", "OutRsts"), None);
    assert_eq!(snmp_value(snmp, "Udp:", "RetransSegs"), None);
}

#[test]
fn metrics_are_read_by_exact_series() {
    let text = "# HELP x\nweir_peers_alive 3\nweir_peers_alive_total 9\nweir_class_allocated_bytes_per_second{class=\"ls\"} 12.5\n";
    assert_eq!(metric(text, "weir_peers_alive"), Some(3.0));
    assert_eq!(
        metric(text, "weir_class_allocated_bytes_per_second{class=\"ls\"}"),
        Some(12.5)
    );
    assert_eq!(metric(text, "weir_missing"), None);
    let text = "weir_r_total{class=\"ls\"} 2\nweir_r_total{class=\"lt\"} 5\nweir_r_total_x 7\n";
    assert_eq!(metric_sum(text, "weir_r_total"), 7.0);
}

#[test]
fn late_records_are_blamed_on_weir_its_link_or_a_shared_stall() {
    use super::row::{blame, Blame, Late};
    let late = |ms: u64, origin: u64, in_weir: f64| Late {
        at_us: ms * 1000,
        origin,
        in_weir_ms: Some(in_weir),
    };
    // The way usually takes 60 ms of the 100 ms bound.
    let records = [
        // 45 ms in weir: with the way at its usual time, late anyway.
        late(1_000, 1, 45.0),
        // Three nodes late within 20 ms, each briefly in weir: a stall of
        // what they share.
        late(2_000, 1, 3.0),
        late(2_010, 2, 2.0),
        late(2_015, 3, 4.0),
        // One node alone: its own link's queue.
        late(3_000, 4, 5.0),
        late(3_005, 4, 6.0),
        // No publish time: counted as weir's.
        Late {
            at_us: 4_000_000,
            origin: 2,
            in_weir_ms: None,
        },
    ];
    let b = blame(&records, 100.0, 60.0);
    assert_eq!(
        b,
        Blame {
            in_weir: 2,
            own_link: 2,
            cloud: 3
        }
    );
    assert_eq!(b.weir(), 4);
    // Two origins are not enough for a shared stall.
    let b = blame(&records[1..3], 100.0, 60.0);
    assert_eq!((b.own_link, b.cloud), (2, 0));
}
