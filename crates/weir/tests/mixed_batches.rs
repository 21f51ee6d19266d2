//! Mixed batches end to end (`scheduler.mix_classes`, docs/scheduling.md):
//! over an emulated link with a fixed 100 ms per transaction, a trickle of
//! `ls` records (the next as soon as the scheduler took the last, so one
//! is waiting whenever the link frees) and an `lt` backlog. With one class
//! per batch, every transaction goes to `ls` and `lt` waits; with mixing,
//! `lt` records ride the `ls` transactions.
//!
//! Both nodes run side by side in one test, so the comparison is a ratio
//! measured in one run; nothing depends on absolute timings: the trickle
//! is paced by the scheduler, not by a clock, and "while `ls` kept
//! arriving" is read from the batches themselves (up to the one carrying
//! the last `ls` record), not from a snapshot taken at some instant. The
//! batch files are read back: mixed batches hold several classes, most
//! urgent first; per-class batches hold one.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use common::ingress::LS;
use common::process::{file_egress, parse_config, GRPC_ONLY};
use common::{eventually, tmp, PATIENCE, POLL};
use weir::app::App;
use weir::intake::Intake;

const LT_BACKLOG: usize = 600;
const LS_RECORDS: usize = 40;

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
# Should the trickle still miss a turn of the link (a thread starved for
# the length of a transaction), the per-class node sends one lt batch:
# 16 KiB, about 70 records, rather than a third of the backlog.
max_batch_bytes = "16KiB"
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
        .enqueue(record, Some(PATIENCE))
        .await
        .expect("queue has room");
}

/// Every batch in `dir`'s segments: the class names of its records, in
/// order.
fn batches(dir: &Path) -> Vec<Vec<String>> {
    weir::egress::file::read_batches(dir, 64 << 20)
        .unwrap()
        .into_iter()
        .map(|b| b.batch.records.into_iter().map(|r| r.class).collect())
        .collect()
}

fn delivered(batches: &[Vec<String>], class: &str) -> usize {
    batches.iter().flatten().filter(|c| *c == class).count()
}

/// The batches sent while ls kept arriving: up to and including the one
/// carrying the last ls record.
fn while_ls_arrived(batches: &[Vec<String>]) -> &[Vec<String>] {
    let last_ls = batches
        .iter()
        .rposition(|b| b.iter().any(|c| c == "ls"))
        .expect("ls records were delivered");
    &batches[..=last_ls]
}

/// Offers `ingress` the ls trickle and the lt backlog: ls first, so that
/// the link is already busy with it when the backlog arrives; then the
/// next ls record whenever the scheduler has taken the last (looked at
/// between backlog records too), until `LS_RECORDS`.
async fn offer(ingress: Arc<Intake>) {
    let ls = ingress.queues().class(LS);
    put(&ingress, "ls", 0).await;
    eventually("the first ls record to take the link", || ls.is_empty()).await;
    let (mut next_ls, mut lt) = (1, 0);
    while next_ls < LS_RECORDS {
        if ls.is_empty() {
            put(&ingress, "ls", next_ls).await;
            next_ls += 1;
        } else if lt < LT_BACKLOG {
            put(&ingress, "bulk", lt).await;
            lt += 1;
            // A queue with room never makes `put` wait: let the other
            // node's trickle, and the schedulers, have the thread too.
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(POLL / 10).await;
        }
    }
    for j in lt..LT_BACKLOG {
        put(&ingress, "bulk", j).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lower_classes_ride_urgent_transactions_instead_of_starving() {
    let base = tmp("mixed");
    let (mixed_dir, split_dir) = (base.join("mixed"), base.join("split"));
    let mixed = App::start(config(&mixed_dir, true)).await.unwrap();
    let split = App::start(config(&split_dir, false)).await.unwrap();

    let offers = [&mixed, &split].map(|app| tokio::spawn(offer(Arc::clone(&app.ingress))));
    for offer in offers {
        offer.await.expect("the offer did not panic");
    }
    // A deadline that passed would abandon records counted below.
    mixed.shutdown(PATIENCE).await;
    split.shutdown(PATIENCE).await;
    // What each had delivered while ls kept arriving.
    let (all_mixed, all_split) = (batches(&mixed_dir), batches(&split_dir));
    let during_mixed = while_ls_arrived(&all_mixed);
    let during_split = while_ls_arrived(&all_split);

    let lt_mixed = delivered(during_mixed, "lt");
    let lt_split = delivered(during_split, "lt");
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
    for all in [&all_mixed, &all_split] {
        assert_eq!(delivered(all, "ls"), LS_RECORDS);
        assert_eq!(delivered(all, "lt"), LT_BACKLOG);
    }
    // Mixed batches: several classes, most urgent first; split: one class.
    let rank: HashMap<&str, usize> = [("ls", 0), ("nm", 1), ("lt", 2)].into();
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
    for b in &all_split {
        assert!(b.windows(2).all(|w| w[0] == w[1]), "{b:?}");
    }
    let _ = std::fs::remove_dir_all(&base);
}
