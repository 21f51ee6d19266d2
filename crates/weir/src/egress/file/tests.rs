use std::time::Duration;

use weir_proto::segment;
use weir_proto::Encoding;

use super::*;

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("weir-file-sink-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

const NODE: NodeId = 7;

fn rolling(bytes: u64) -> Rolling {
    Rolling {
        bytes,
        age: Duration::from_secs(3600),
    }
}

/// A body of `len` bytes: placed as weir's encoder places it when `placed`
/// (`BODY_OFFSET` past a block boundary), anywhere else when not.
fn body(len: usize, fill: u8, placed: bool) -> bytes::Bytes {
    let mut v: Vec<u8> = Vec::with_capacity(len + 2 * BLOCK);
    let mut start = v.as_ptr().align_offset(BLOCK) + weir_proto::BODY_OFFSET;
    if !placed {
        start += 1;
    }
    v.resize(start, 0);
    v.extend((0..len).map(|i| fill.wrapping_add((i % 251) as u8)));
    let b = bytes::Bytes::from(v).slice(start..);
    assert_eq!(
        (b.as_ptr() as usize % BLOCK == weir_proto::BODY_OFFSET) || len == 0,
        placed || len == 0
    );
    b
}

fn batch(seq: u64, body: bytes::Bytes) -> EncodedBatch {
    EncodedBatch {
        seq,
        class: weir_core::ClassId(0),
        records: 1,
        node: NODE,
        body,
        encoding: Encoding::Identity,
    }
}

/// Every segment file of [`NODE`] in `dir` (sealed and open), sorted by
/// name.
fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_str().unwrap();
            segment::is_segment_name(name) && name.starts_with(&format!("{NODE}-"))
        })
        .collect();
    v.sort();
    v
}

/// (batch seq, body) of every frame in [`NODE`]'s segments in `dir`, in
/// name order.
fn frames(dir: &Path) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    for p in segments(dir) {
        let bytes = std::fs::read(&p).unwrap();
        let seg = segment::read(&bytes);
        assert!(seg.damaged.is_empty(), "{}: {:?}", p.display(), seg.damaged);
        out.extend(
            seg.frames
                .iter()
                .map(|f| (f.header.batch_seq, f.body.to_vec())),
        );
    }
    out
}

async fn send_all(sink: &mut FileSink, batches: &[EncodedBatch]) {
    let mut confirms = Vec::new();
    for b in batches {
        confirms.push(sink.send(b).await.unwrap());
    }
    for c in confirms {
        c.await.unwrap();
    }
}

#[tokio::test]
async fn batches_of_every_length_and_placement_read_back_in_order() {
    let dir = tempdir("lengths");
    let lens = [
        0,
        1,
        100,
        BLOCK - HEADER_LEN - 1,
        BLOCK - HEADER_LEN,
        BLOCK - HEADER_LEN + 1,
        BLOCK,
        3 * BLOCK + 17,
        1 << 20,
    ];
    let mut batches = Vec::new();
    for placed in [true, false] {
        for &len in &lens {
            let seq = batches.len() as u64 + 1;
            batches.push(batch(seq, body(len, seq as u8, placed)));
        }
    }
    let mut sink = FileSink::with_rolling(&dir, NODE, rolling(1 << 30)).unwrap();
    send_all(&mut sink, &batches).await;
    // Confirmed means readable, before the segment is sealed.
    let open = segments(&dir);
    assert_eq!(open.len(), 1);
    assert!(open[0].to_str().unwrap().ends_with(".weirseg.open"));
    let want: Vec<(u64, Vec<u8>)> = batches.iter().map(|b| (b.seq, b.body.to_vec())).collect();
    assert!(frames(&dir) == want);
    drop(sink);
    // Stopping seals it under the first batch's number.
    assert_eq!(segments(&dir), vec![segment_path(&dir, NODE, 1, false)]);
    assert!(frames(&dir) == want);
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn segments_roll_at_their_size_and_sealed_ones_hold_only_confirmed_batches() {
    let dir = tempdir("roll");
    let batches: Vec<EncodedBatch> = (10..40)
        .map(|seq| batch(seq, body(5000 + seq as usize * 100, seq as u8, true)))
        .collect();
    let mut sink = FileSink::with_rolling(&dir, NODE, rolling(64 << 10)).unwrap();
    send_all(&mut sink, &batches).await;
    let want: Vec<(u64, Vec<u8>)> = batches.iter().map(|b| (b.seq, b.body.to_vec())).collect();
    let got = frames(&dir);
    let seqs = |v: &[(u64, Vec<u8>)]| v.iter().map(|(s, _)| *s).collect::<Vec<_>>();
    assert_eq!(seqs(&got), seqs(&want), "{:?}", segments(&dir));
    assert!(got == want);
    let segs = segments(&dir);
    assert!(segs.len() > 3, "{segs:?}");
    for p in &segs[..segs.len() - 1] {
        let name = p.file_name().unwrap().to_str().unwrap();
        assert!(name.ends_with(".weirseg"), "{name}");
        // Named after its first batch, and cut just past the size.
        let bytes = std::fs::read(p).unwrap();
        let seg = segment::read(&bytes);
        assert_eq!(
            *p,
            segment_path(&dir, NODE, seg.frames[0].header.batch_seq, false)
        );
        assert!(bytes.len() as u64 >= 64 << 10);
        assert!((bytes.len() as u64) < (64 << 10) + 16 * BLOCK as u64);
    }
    drop(sink);
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn an_idle_segment_is_sealed_at_its_age() {
    let dir = tempdir("age");
    let mut sink = FileSink::with_rolling(
        &dir,
        NODE,
        Rolling {
            bytes: 1 << 30,
            age: Duration::from_millis(100),
        },
    )
    .unwrap();
    send_all(&mut sink, &[batch(5, body(300, 1, true))]).await;
    // Nothing more is sent: the writer seals it by itself.
    let sealed = segment_path(&dir, NODE, 5, false);
    let give_up = std::time::Instant::now() + Duration::from_secs(30);
    while !sealed.exists() {
        assert!(std::time::Instant::now() < give_up, "{:?}", segments(&dir));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(segments(&dir), vec![sealed]);
    // The next batch starts the next segment.
    send_all(&mut sink, &[batch(6, body(300, 2, true))]).await;
    assert_eq!(segments(&dir).len(), 2);
    drop(sink);
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn a_segment_left_open_is_sealed_at_its_last_intact_batch_on_start() {
    let dir = tempdir("recover");
    // A crash: two batches confirmed in an open segment, a third torn.
    let mut file = Vec::new();
    for (seq, len) in [(3u64, 700usize), (4, 9000), (5, 20_000)] {
        let b = vec![seq as u8; len];
        let h = FrameHeader {
            encoding: Encoding::Identity,
            len,
            batch_seq: seq,
            written_us: 1,
        };
        let start = file.len();
        file.extend_from_slice(&h.encode(&b));
        file.extend_from_slice(&b);
        file.resize(start + segment::frame_len(len), 0);
    }
    let intact = segment::frame_len(700) + segment::frame_len(9000);
    file.truncate(intact + 5000);
    std::fs::write(segment_path(&dir, NODE, 3, true), &file).unwrap();
    // Another node's open segment, and an empty one of this node's.
    std::fs::write(segment_path(&dir, NODE + 1, 1, true), &file).unwrap();
    std::fs::write(segment_path(&dir, NODE, 9, true), vec![0u8; 8192]).unwrap();

    let sink = FileSink::with_rolling(&dir, NODE, rolling(1 << 30)).unwrap();
    let sealed = segment_path(&dir, NODE, 3, false);
    assert_eq!(std::fs::metadata(&sealed).unwrap().len(), intact as u64);
    assert_eq!(
        frames(&dir)
            .iter()
            .filter(|(seq, _)| *seq < 9)
            .map(|(s, _)| *s)
            .collect::<Vec<_>>(),
        vec![3, 4]
    );
    assert!(!segment_path(&dir, NODE, 9, true).exists());
    assert!(segment_path(&dir, NODE + 1, 1, true).exists());
    drop(sink);
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn one_writer_per_node_and_directory() {
    let dir = tempdir("lock");
    let sink = FileSink::with_rolling(&dir, NODE, rolling(1 << 30)).unwrap();
    let again = FileSink::with_rolling(&dir, NODE, rolling(1 << 30)).unwrap_err();
    assert_eq!(again.kind(), std::io::ErrorKind::WouldBlock);
    assert!(again.to_string().contains("another process"), "{again}");
    let other = FileSink::with_rolling(&dir, NODE + 1, rolling(1 << 30)).unwrap();
    drop((sink, other));
    let _ = FileSink::with_rolling(&dir, NODE, rolling(1 << 30)).unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

/// A fresh power-cut filesystem (weir-faultfs) under a temporary
/// directory, and the segment directory on it.
fn on_faultfs(name: &str) -> (PathBuf, weir_faultfs::Mounted, PathBuf) {
    let dir = tempdir(name);
    let at = dir.join("fs");
    std::fs::create_dir_all(&at).unwrap();
    let fs = weir_faultfs::mount(&at, 256 << 20)
        .expect("this test needs root and /dev/fuse to mount its fault-injecting filesystem");
    let out = at.join("out");
    (dir, fs, out)
}

async fn outcomes(sink: &mut FileSink, batches: &[EncodedBatch]) -> Vec<Result<(), String>> {
    let mut confirms = Vec::new();
    for b in batches {
        confirms.push(sink.send(b).await.unwrap());
    }
    let mut out = Vec::new();
    for c in confirms {
        out.push(c.await.map_err(|e| e.to_string()));
    }
    out
}

#[tokio::test]
async fn a_failed_write_or_sync_fails_the_batches_after_it_until_it_is_sent_again() {
    use weir_faultfs::Op;
    let (dir, fs, out) = on_faultfs("fail");
    let mut sink = FileSink::with_rolling(&out, NODE, rolling(1 << 30)).unwrap();
    let b = |seq: u64| batch(seq, body(3000 + seq as usize, seq as u8, true));
    send_all(&mut sink, &[b(1)]).await;

    for op in [Op::Write, Op::Fsync] {
        let first = if op == Op::Write { 2 } else { 5 };
        fs.fail(op, libc::EIO, 1, Some("weirseg"));
        let got = outcomes(&mut sink, &[b(first), b(first + 1), b(first + 2)]).await;
        assert!(got.iter().all(Result::is_err), "{op:?}: {got:?}");
        // Sent again from the failed one, as the delivery loop does: a new
        // segment, starting with it.
        send_all(&mut sink, &[b(first), b(first + 1), b(first + 2)]).await;
        assert!(
            segment_path(&out, NODE, first, true).exists(),
            "{op:?}: {:?}",
            segments(&out)
        );
    }
    drop(sink);
    let seqs: Vec<u64> = frames(&out).iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5, 6, 7]);
    // No segment is left open, and the one whose sync failed holds only
    // what was confirmed before it.
    assert!(segments(&out)
        .iter()
        .all(|p| p.extension().is_some_and(|e| e == "weirseg")));
    drop(fs);
    std::fs::remove_dir_all(dir).unwrap();
}

/// A new directory, its segment and the batches confirmed in it are all
/// still there after a power cut (the directory is synced into its
/// parent).
#[tokio::test]
async fn confirmed_batches_and_their_new_directory_survive_a_power_cut() {
    let (dir, fs, out) = on_faultfs("power");
    let mut sink = FileSink::with_rolling(&out, NODE, rolling(1 << 30)).unwrap();
    let batches: Vec<EncodedBatch> = (1..=5)
        .map(|seq| batch(seq, body(2000 * seq as usize, seq as u8, seq % 2 == 0)))
        .collect();
    send_all(&mut sink, &batches).await;
    fs.power_cut(weir_faultfs::Cut::Clean);
    let want: Vec<(u64, Vec<u8>)> = batches.iter().map(|b| (b.seq, b.body.to_vec())).collect();
    assert!(out.exists(), "the directory is gone");
    assert!(frames(&out) == want);
    drop(sink);
    drop(fs);
    std::fs::remove_dir_all(dir).unwrap();
}
