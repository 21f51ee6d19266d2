use super::*;
use clap::Parser;

#[test]
fn own_links_limit_caps_each_node_at_its_uplink() {
    // Two busy nodes over their 1000/s uplinks, two idle ones below.
    let own = own_links_limit([5000.0, 3000.0, 90.0, 90.0], 1000.0);
    assert_eq!(own, 2180.0);
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    a: Args,
}

#[test]
fn every_scheme_and_network_gives_valid_weir_config() {
    let a = Cli::parse_from(["x"]).a;
    assert_eq!(a.schemes.len(), 7);
    assert_eq!(a.grid.networks, ["4g"]);
    assert_eq!(a.grid.lt_rates, [5000]);
    assert_eq!(a.record_bytes, [640]);
    let ports = [1000, 1001, 1002, 1003];
    for scheme in ALL_SCHEMES {
        for network in ["wifi", "4g", "3g"] {
            let cell = Cell {
                scheme: scheme.into(),
                network: network.into(),
                lt_rate: 5000,
                record_bytes: 640,
            };
            for serial_delay in [false, true] {
                let a = Args {
                    serial_delay,
                    ..a.clone()
                };
                let text = config_text(2, &ports, Path::new("/tmp/x"), &cell, &a).unwrap();
                let cfg = weir::config::parse(&text, "test").unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(cfg.scheduler.scheme.to_string(), scheme);
                assert_eq!(cfg.scheduler.track_uplink, a.track_uplink);
                let link = cfg.egress.link.unwrap();
                assert_eq!(link.delay.is_zero(), !serial_delay);
                assert_eq!(
                    cfg.scheduler.uplink_bytes_per_sec,
                    link.bandwidth_bytes_per_sec
                );
            }
        }
    }
}

#[test]
fn the_paper_has_every_scheme_on_every_network() {
    for scheme in ALL_SCHEMES {
        for network in ["wifi", "4g", "3g"] {
            let p = paper(scheme, network);
            assert!(p["classes"]["lt"]["latency_ms_mean"].as_f64().unwrap() > 0.0);
        }
    }
    assert_eq!(
        paper("pmrfs", "4g")["classes"]["ls"]["latency_ms_mean"],
        1580.0
    );
    assert_eq!(
        paper("qm-only", "4g")["classes"]["lt"]["violation_pct"],
        15.5
    );
}
