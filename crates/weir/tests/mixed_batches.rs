//! Mixed batches end to end (`scheduler.mix_classes`, docs/scheduling.md):
//! over an emulated link with a fixed 100 ms per transaction, a trickle of
//! `ls` records (one every 30 ms) and an `lt` backlog. With one class per
//! batch, every transaction goes to `ls` and `lt` waits; with mixing, `lt`
//! records ride the `ls` transactions.
//!
//! Both nodes run side by side in one test, so the comparison is a ratio
//! measured in one run; nothing depends on absolute timings. The batch
//! files are read back: mixed batches hold several classes, most urgent
//! first; per-class batches hold one.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use common::process::{file_egress, parse_config, GRPC_ONLY};
use common::tmp;
use weir::app::App;
use weir::intake::Intake;

const LT_BACKLOG: usize = 600;
const LS_RECORDS: usize = 40;
const LS_EVERY: Duration = Duration::from_millis(30);

fn config(dir: &Path, mix: bool) -> weir::config::Config {
    let text = format!(
        r#"
[node]
id = {node}
[[class]]
name = "ls"
bound = "2s"
[[class]]
name = "nm"
bound = "5s"
[[class]]
name = "lt"
bound = "60s"
[classify]
default_class = "lt"
[[classify.route]]
grpc = "ls"
class = "ls"
[scheduler]
uplink = "8Mbit/s"
track_uplink = false
mix_classes = {mix}
[batching]
adaptive = false
[compression]
enabled = false
{GRPC_ONLY}
{file}
[egress.link]
bandwidth = "8Mbit/s"
delay = "100ms"
"#,
        node = if mix { 1 } else { 2 },
        file = file_egress(dir),
    );
    parse_config(&text, "mixed")
}

async fn put(ingress: &Intake, stream: &str, i: usize) {
    let record = ingress.grpc_record(stream, Bytes::from(vec![i as u8; 200]));
    ingress
        .enqueue(record, Some(Duration::from_secs(30)))
        .await
        .expect("queue has room");
}

/// Every batch file in `dir`: the class names of its records, in order.
fn batches(dir: &Path) -> Vec<Vec<String>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "weirbatch"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|f| {
            let body = std::fs::read(f).unwrap();
            weir_proto::decode_batch(&body, "identity", 64 << 20)
                .unwrap()
                .records
                .into_iter()
                .map(|r| r.class)
                .collect()
        })
        .collect()
}

fn delivered(batches: &[Vec<String>], class: &str) -> usize {
    batches.iter().flatten().filter(|c| *c == class).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lower_classes_ride_urgent_transactions_instead_of_starving() {
    let base = tmp("mixed");
    let (mixed_dir, split_dir) = (base.join("mixed"), base.join("split"));
    let mixed = App::start(config(&mixed_dir, true)).await.unwrap();
    let split = App::start(config(&split_dir, false)).await.unwrap();

    // The ls trickle first, so the link is already busy with it when the
    // lt backlog arrives.
    for i in 0..LS_RECORDS {
        put(&mixed.ingress, "ls", i).await;
        put(&split.ingress, "ls", i).await;
        if i == 3 {
            for app in [&mixed, &split] {
                for j in 0..LT_BACKLOG {
                    put(&app.ingress, "bulk", j).await;
                }
            }
        }
        tokio::time::sleep(LS_EVERY).await;
    }
    // What each had delivered while ls kept arriving.
    let during_mixed = batches(&mixed_dir);
    let during_split = batches(&split_dir);
    mixed.shutdown(Duration::from_secs(60)).await;
    split.shutdown(Duration::from_secs(60)).await;

    let lt_mixed = delivered(&during_mixed, "lt");
    let lt_split = delivered(&during_split, "lt");
    println!(
        "lt delivered while ls arrived: mixed {lt_mixed} in {} batches, per class {lt_split} in {} batches",
        during_mixed.len(),
        during_split.len()
    );
    assert!(
        lt_mixed >= 4 * lt_split.max(1),
        "mixing should carry far more lt: {lt_mixed} vs {lt_split}"
    );

    // Everything arrives exactly once either way, after the drain.
    for dir in [&mixed_dir, &split_dir] {
        let all = batches(dir);
        assert_eq!(delivered(&all, "ls"), LS_RECORDS);
        assert_eq!(delivered(&all, "lt"), LT_BACKLOG);
    }
    // Mixed batches: several classes, most urgent first; split: one class.
    let rank: HashMap<&str, usize> = [("ls", 0), ("nm", 1), ("lt", 2)].into();
    let all_mixed = batches(&mixed_dir);
    assert!(all_mixed
        .iter()
        .any(|b| b.contains(&"ls".to_owned()) && b.contains(&"lt".to_owned())));
    for b in &all_mixed {
        assert!(
            b.windows(2)
                .all(|w| rank[w[0].as_str()] <= rank[w[1].as_str()]),
            "{b:?}"
        );
    }
    for b in batches(&split_dir) {
        assert!(b.windows(2).all(|w| w[0] == w[1]), "{b:?}");
    }
    let _ = std::fs::remove_dir_all(&base);
}
