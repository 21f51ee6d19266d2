//! The spool's threads against each other: a writer filling segments
//! while the reader refills a small queue from disk and a consumer
//! releases what it takes.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use weir_core::queueing::queue::{MultiLevelQueue, QueueCapacity};
use weir_core::{ClassId, ClassSet, Receipt, Record};

use super::{Appended, Spool};
use crate::config::{ClassDurability, Durability, OnFull, SpoolConfig, SyncMode};
use crate::metrics::Metrics;

fn config(dir: &std::path::Path) -> SpoolConfig {
    SpoolConfig {
        dir: dir.to_path_buf(),
        max_bytes: 1 << 30,
        // Small segments: the reader crosses many segment boundaries while
        // the writer keeps starting new ones.
        segment_bytes: 64 << 10,
        // A real sync per group: a window in which the writer has started a
        // segment that the group's completion has not yet made durable.
        sync: SyncMode::Group,
        sync_interval: Duration::from_secs(1),
        commit_delay: Duration::from_millis(1),
        min_free_bytes: 0,
        window_bytes: 16 << 10,
    }
}

fn durability(classes: &ClassSet) -> Vec<ClassDurability> {
    (0..classes.len())
        .map(|i| ClassDurability {
            durability: if i == 0 {
                Durability::Spool
            } else {
                Durability::Memory
            },
            max_bytes: u64::MAX,
            on_full: OnFull::Block,
            ttl: None,
        })
        .collect()
}

/// Five topics in turn: frames define key ids and use them, and the
/// records read back from disk must get theirs back.
fn key_of(seq: u64) -> Bytes {
    Bytes::from(format!("plant/line/{}/temperature", seq % 5))
}

fn record(seq: u64) -> Record {
    Record {
        key: key_of(seq),
        class: ClassId(0),
        origin: 7,
        seq,
        ingress_us: 1_700_000_000_000_000 + seq,
        payload: Bytes::from(vec![(seq % 251) as u8; 200]),
        spool: None,
    }
}

/// Every appended record reaches the queue, through the writer or read
/// back from disk, while segments roll over under the reader: none is
/// skipped, and once all are released the log is empty.
#[test]
fn a_backlog_read_back_across_segment_switches_loses_nothing() {
    let dir = std::env::temp_dir().join(format!("weir-spool-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let classes = ClassSet::janus_default();
    let queues = Arc::new(MultiLevelQueue::new(
        &(0..classes.len())
            .map(|_| QueueCapacity {
                records: 64,
                bytes: 16 << 10,
            })
            .collect::<Vec<_>>(),
    ));
    let (spool, _) = Spool::open(
        &config(&dir),
        &classes,
        &durability(&classes),
        Arc::clone(&queues),
        Arc::default(),
        Arc::new(Metrics::new(&classes)),
    )
    .unwrap();
    let spool = Arc::new(spool);
    const N: u64 = 30_000;
    let consumer = {
        let (spool, queues) = (Arc::clone(&spool), Arc::clone(&queues));
        std::thread::spawn(move || {
            let mut seen = BTreeSet::new();
            let mut wrong_keys = 0u64;
            let deadline = Instant::now() + Duration::from_secs(20);
            while (seen.len() as u64) < N && Instant::now() < deadline {
                let mut batch = Vec::new();
                while let Some(r) = queues.pop_strict_priority() {
                    batch.push(r);
                    if batch.len() == 32 {
                        break;
                    }
                }
                if batch.is_empty() {
                    spool.notify_space();
                    std::thread::sleep(Duration::from_micros(200));
                    continue;
                }
                seen.extend(batch.iter().map(|r| r.seq));
                wrong_keys += batch.iter().filter(|r| r.key != key_of(r.seq)).count() as u64;
                let receipts: Vec<Receipt> = batch.iter().map(Receipt::from).collect();
                spool.release(&receipts);
                spool.notify_space();
            }
            (seen, wrong_keys)
        })
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut tickets = Vec::new();
        for seq in 0..N {
            match spool.append(record(seq), None).await.unwrap() {
                Appended::Pending(t) => tickets.push(t),
                Appended::Dropped => panic!("block never drops"),
            }
            // Groups of a few hundred, as concurrent publishers make.
            if tickets.len() == 300 {
                for t in tickets.drain(..) {
                    assert!(t.durable().await);
                }
            }
        }
    });
    let (seen, wrong_keys) = consumer.join().unwrap();
    assert_eq!(wrong_keys, 0, "records came back with another key");
    let missing: Vec<u64> = (0..N).filter(|s| !seen.contains(s)).take(10).collect();
    assert!(
        missing.is_empty(),
        "{} of {N} records never reached the queue, e.g. {missing:?}",
        N - seen.len() as u64
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while spool.unreleased()[0] > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(spool.unreleased()[0], 0, "every record released");
    spool.close();
    let _ = std::fs::remove_dir_all(&dir);
}
