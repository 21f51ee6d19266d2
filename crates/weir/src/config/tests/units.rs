//! Durations, sizes and rates as written in the file.

use super::*;

#[test]
fn durations() {
    let d = |s: &str| s.parse::<HumanDuration>().map(HumanDuration::get);
    assert_eq!(d("50ms"), Ok(Duration::from_millis(50)));
    assert_eq!(d("1.5s"), Ok(Duration::from_millis(1500)));
    assert_eq!(d("2m"), Ok(Duration::from_secs(120)));
    assert_eq!(d("1h 30m"), Ok(Duration::from_secs(5400)));
    assert_eq!(d("500us"), Ok(Duration::from_micros(500)));
    assert_eq!(d("0ms"), Ok(Duration::ZERO));
    for bad in ["-5ms", "5", "fast", "", "5 parsecs", "1.5.5s"] {
        let err = d(bad).unwrap_err();
        assert_eq!(err.kind, "duration");
        assert!(err.to_string().starts_with("invalid duration"), "{err}");
    }
    assert!(d("-5ms").unwrap_err().reason.contains("negative"));
    assert!(d("5").unwrap_err().reason.contains("needs a unit"));

    assert_eq!(HumanDuration(Duration::from_millis(50)).to_string(), "50ms");
    assert_eq!(
        HumanDuration(Duration::from_millis(1500)).to_string(),
        "1s 500ms"
    );
    assert_eq!(HumanDuration(Duration::ZERO).to_string(), "0s");
}

#[test]
fn sizes() {
    let s = |t: &str| t.parse::<Size>().map(Size::bytes);
    assert_eq!(s("4MiB"), Ok(4 << 20));
    assert_eq!(s("64KiB"), Ok(64 << 10));
    assert_eq!(s("512"), Ok(512));
    assert_eq!(s("1MB"), Ok(1_000_000));
    assert_eq!(s("1.5KiB"), Ok(1536));
    assert_eq!(s("2 GiB"), Ok(2 << 30));
    for bad in ["-5", "4XB", "", "MiB", "four", "1.2.3KiB", "1.5"] {
        let err = s(bad).unwrap_err();
        assert_eq!(err.kind, "size", "{bad}");
    }
    assert_eq!(Size(64 << 10).to_string(), "64KiB");
    assert_eq!(Size(4 << 20).to_string(), "4MiB");
    assert_eq!(Size(5_000_000).to_string(), "5MB");
    assert_eq!(Size(1_000_001).to_string(), "1000001B");
    assert_eq!(Size(0).to_string(), "0B");
}

#[test]
fn rates() {
    let r = |t: &str| t.parse::<Rate>().map(Rate::bytes_per_sec);
    assert_eq!(r("18Mbit/s"), Ok(2_250_000.0));
    assert_eq!(r("780kbit/s"), Ok(97_500.0));
    assert_eq!(r("200Mbit/s"), Ok(25_000_000.0));
    assert_eq!(r("5MB/s"), Ok(5_000_000.0));
    assert_eq!(r("1MiB/s"), Ok(1_048_576.0));
    assert_eq!(r("100B/s"), Ok(100.0));
    assert_eq!(r("8bit/s"), Ok(1.0));
    assert_eq!(r("1.5 Gbit/s"), Ok(187_500_000.0));
    assert_eq!(r("10mbit/s"), Ok(1_250_000.0));
    for bad in [
        "18Mbps/x",
        "18Mbps",
        "18Mb/s",
        "-5Mbit/s",
        "Mbit/s",
        "5",
        "5 furlongs/s",
        "",
        "1.2.3Mbit/s",
        "5MiBit/s",
    ] {
        let err = r(bad).unwrap_err();
        assert_eq!(err.kind, "rate", "{bad}");
    }
    assert!(r("18Mb/s").unwrap_err().reason.contains("bits or bytes"));

    assert_eq!(
        Rate::from_bytes_per_sec(2_250_000.0).to_string(),
        "18Mbit/s"
    );
    assert_eq!(Rate::from_bytes_per_sec(97_500.0).to_string(), "780kbit/s");
    assert_eq!(Rate::from_bytes_per_sec(12.5).to_string(), "100bit/s");
    assert_eq!(Rate::from_bytes_per_sec(0.0).to_string(), "0bit/s");
}

#[test]
fn units_deserialize_from_toml() {
    #[derive(serde::Deserialize)]
    struct Units {
        d: HumanDuration,
        s: Size,
        n: Size,
        r: Rate,
    }
    let u: Units = toml::from_str("d = \"1.5s\"\ns = \"4MiB\"\nn = 512\nr = \"18Mbit/s\"").unwrap();
    assert_eq!(u.d.get(), Duration::from_millis(1500));
    assert_eq!(u.s.bytes(), 4 << 20);
    assert_eq!(u.n.bytes(), 512);
    assert_eq!(u.r.bytes_per_sec(), 2_250_000.0);
    let err = toml::from_str::<Units>("d = \"-5ms\"\ns = \"1\"\nn = 1\nr = \"1bit/s\"")
        .err()
        .unwrap();
    assert!(err.message().contains("negative"), "{err}");
}
