//! Replays every input under `fuzz/regressions/<target>/` (crashes the
//! fuzzers found, kept once fixed), `fuzz/seeds/<target>/` and the
//! minimised corpus `fuzz/corpus/<target>/` through the
//! entry points the fuzz targets call (`scripts/fuzz.sh`), so a fixed crash
//! stays fixed without a nightly toolchain.

use std::path::Path;

/// Every file in `fuzz/<dir>/<target>/`.
fn inputs(dir: &str, target: &str) -> Vec<(String, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz")
        .join(dir)
        .join(target);
    let Ok(entries) = std::fs::read_dir(&root) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.path().is_file())
        .map(|e| {
            (
                e.path().display().to_string(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

fn replay(target: &str, run: impl Fn(&[u8])) -> usize {
    let mut n = 0;
    for dir in ["regressions", "seeds", "corpus"] {
        for (name, data) in inputs(dir, target) {
            // Shown only when a replay fails: the input that did it.
            eprintln!("{target}: {name}");
            run(&data);
            n += 1;
        }
    }
    n
}

#[test]
fn mqtt_ingress() {
    assert!(
        replay("mqtt_ingress", weir::fuzzing::mqtt_ingress) > 0,
        "seeds exist"
    );
}

#[test]
fn config() {
    let n = replay("config", |data| {
        if let Ok(text) = std::str::from_utf8(data) {
            let _ = weir::config::parse(text, "fuzz.toml");
        }
    });
    assert!(n > 0);
}

#[test]
fn decode_batch() {
    let n = replay("decode_batch", |data| {
        for encoding in ["identity", "gzip", "zstd"] {
            if let Ok(batch) = weir_proto::decode_batch(data, encoding, 1 << 20) {
                let total: usize = batch.records.iter().map(|r| r.payload.len()).sum();
                assert!(total <= 1 << 20);
            }
        }
    });
    assert!(n > 0);
}

#[test]
fn peer_messages() {
    assert!(replay("peer_messages", weir::fuzzing::peer_messages) > 0);
}

#[test]
fn auth_files() {
    let n = replay("auth_files", |data| {
        if let Ok(text) = std::str::from_utf8(data) {
            weir::fuzzing::auth_files(text);
        }
    });
    assert!(n > 0);
}
