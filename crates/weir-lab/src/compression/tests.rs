use super::payload::accel_csv;
use super::*;
use std::io::Read as _;

#[test]
fn payloads_are_deterministic_and_sized() {
    let a = accel_csv(10_000, 7);
    assert_eq!(a.len(), 10_000);
    assert_eq!(a, accel_csv(10_000, 7));
    assert_ne!(a, accel_csv(10_000, 8));
    let text = std::str::from_utf8(&a).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("timestamp,ax,ay,az"));
    let row: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(row.len(), 4);
    assert!(row[0].starts_with("2024-05-14 09:00:00.000"));
    assert!(
        row[2].parse::<f64>().unwrap() < -0.5,
        "gravity on y: {row:?}"
    );
    let r = random_bytes(1001, 3);
    assert_eq!(r.len(), 1001);
    assert_eq!(r, random_bytes(1001, 3));
}

#[test]
fn csv_compresses_and_random_does_not() {
    let csv = accel_csv(200_000, 1);
    let rnd = random_bytes(200_000, 1);
    let (c, _) = compress_timed(Codec::Zstd(3), &csv).unwrap();
    assert!(
        c * 2 < csv.len() as u64,
        "csv ratio {}",
        csv.len() as f64 / c as f64
    );
    let (r, _) = compress_timed(Codec::Gzip(6), &rnd).unwrap();
    assert!(r >= rnd.len() as u64, "random shrank to {r}");
}

fn streamed(codec: Codec, data: &[u8], chunk: usize) -> Vec<u8> {
    let mut enc = Encoder::new(codec, data.len() as u64).unwrap();
    let mut out = Vec::new();
    for piece in data.chunks(chunk) {
        out.extend(enc.push(piece).unwrap());
    }
    out.extend(enc.finish().unwrap());
    out
}

#[test]
fn streamed_output_decodes_to_the_input() {
    let data = accel_csv(300_000, 2);
    let gz = streamed(Codec::Gzip(6), &data, 10_000);
    let mut back = Vec::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_end(&mut back)
        .unwrap();
    assert_eq!(back, data);
    let zs = streamed(Codec::Zstd(3), &data, 10_000);
    assert_eq!(zstd::stream::decode_all(&zs[..]).unwrap(), data);
    assert_eq!(streamed(Codec::None, &data, 10_000), data);
    // About the size of weir's one-shot compression: nothing was
    // flushed early.
    let (one_shot, _) = compress_timed(Codec::Zstd(3), &data).unwrap();
    let diff = (zs.len() as f64 - one_shot as f64).abs();
    assert!(diff <= 0.01 * one_shot as f64, "{} vs {one_shot}", zs.len());
}

#[tokio::test]
async fn piped_transfer_sends_what_was_compressed() {
    let data = Arc::new(accel_csv(100_000, 3));
    let link = Link {
        per_transaction: Duration::from_millis(1),
        bytes_per_sec: 1e9,
    };
    let raw = piped_transfer(Arc::clone(&data), Codec::None, link, 8192)
        .await
        .unwrap();
    assert_eq!(raw.wire_bytes, 100_000);
    let z = piped_transfer(data, Codec::Zstd(1), link, 8192)
        .await
        .unwrap();
    assert!(z.wire_bytes < 50_000, "{z:?}");
    assert!(z.wall >= Duration::from_millis(1));
}
