//! `weir decode` on compressed batches: gzip and zstd batch files decode
//! (the encoding read from the file name, or `--encoding` for stdin), and a
//! compression bomb is refused at the cap instead of expanded; a reader
//! that closes the pipe early ends it quietly.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use bytes::Bytes;
use common::process::WEIR;
use common::tmp;
use weir_proto::{compress, encode_batch, pb, Encoding};

fn batch() -> pb::Batch {
    pb::Batch {
        padding: Default::default(),
        node: 7,
        batch_seq: 1,
        created_us: 1,
        records: (0..100u64)
            .map(|i| pb::Record {
                key: "accel".into(),
                class: "nm".into(),
                origin: 7,
                seq: i,
                ingress_us: 10 + i,
                payload: Bytes::from(format!("2026-11-22T10:00:00.{i:03},0.0123,-0.9876,9.81\n")),
            })
            .collect(),
    }
}

/// A body that decompresses to `frames` MiB of zeros: one compressed MiB
/// repeated (zstd frames and gzip members may be concatenated), so the
/// test never holds the expanded size either.
fn bomb(encoding: Encoding, frames: usize) -> Vec<u8> {
    let one = compress(&vec![0u8; 1 << 20], encoding, 9).unwrap();
    one.repeat(frames)
}

#[test]
fn compressed_batch_files_decode_by_their_name() {
    let dir = tmp("decode-files");
    let body = encode_batch(&batch());
    for enc in [Encoding::Gzip, Encoding::Zstd] {
        let file = dir.join(format!("7-00000000000000000001.{}.weirbatch", enc.as_str()));
        std::fs::write(&file, compress(&body, enc, 3).unwrap()).unwrap();
        let out = Command::new(WEIR)
            .args(["decode", file.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{enc}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("records=100"), "{text}");
        assert!(text.contains("2026-11-22T10:00:00.042,0.0123"), "{text}");
    }
    // On stdin the encoding is given.
    let mut child = Command::new(WEIR)
        .args(["decode", "-", "--encoding", "zstd"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&compress(&body, Encoding::Zstd, 1).unwrap())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("records=100"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_compression_bomb_is_refused_at_the_cap() {
    let dir = tmp("decode-bomb");
    // 1 GiB of zeros for zstd, 256 MiB for gzip (DEFLATE's ratio is ~1000:1).
    for (enc, mib) in [(Encoding::Zstd, 1024), (Encoding::Gzip, 256)] {
        let body = bomb(enc, mib);
        assert!(body.len() < mib << 20 >> 6, "{enc}: {} bytes", body.len());
        let file = dir.join(format!("1-00000000000000000002.{}.weirbatch", enc.as_str()));
        std::fs::write(&file, &body).unwrap();
        for cap in [Some(1 << 20), None] {
            let mut cmd = Command::new(WEIR);
            cmd.args(["decode", file.to_str().unwrap()]);
            if let Some(c) = cap {
                cmd.args(["--max-size", &c.to_string()]);
            }
            let out = cmd.output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{enc} {cap:?}: {err}");
            let limit = cap.unwrap_or(weir_proto::codec::DEFAULT_MAX_DECODED);
            assert!(
                err.contains(&format!("larger than the {limit}-byte cap")),
                "{enc} {cap:?}: {err}"
            );
            assert!(
                err.contains(file.to_str().unwrap()),
                "names the file: {err}"
            );
            assert!(out.stdout.is_empty(), "nothing printed for a refused batch");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn decode_into_a_reader_that_goes_away_ends_quietly() {
    // `weir decode FILE | head`: the reader closes the pipe after a line,
    // and weir stops with success and nothing on stderr, as filters do.
    let dir = tmp("decode-pipe");
    let mut big = batch();
    big.records = (0..20_000u64)
        .map(|i| pb::Record {
            seq: i,
            ..big.records[0].clone()
        })
        .collect();
    let file = dir.join("7-00000000000000000001.gzip.weirbatch");
    std::fs::write(
        &file,
        compress(&encode_batch(&big), Encoding::Gzip, 3).unwrap(),
    )
    .unwrap();
    let mut child = Command::new(WEIR)
        .args(["decode", file.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut first,
    )
    .unwrap();
    assert!(first.contains("records=20000"), "{first}");
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {}: {err}", out.status);
    assert!(err.is_empty(), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
