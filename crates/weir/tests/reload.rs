//! Hot reload against the real `weir run`: QoS 1 publishers keep sending
//! while a route and a bound change by SIGHUP; no connection drops, every
//! acknowledged record arrives, records after the reload land in the new
//! class; an invalid file and a change that needs a restart are refused
//! (the old config keeps running) and counted; `weir reload` reports both.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::mqtt::{publish_qos1, Pace};
use common::process::{
    file_batch_records, file_egress, free_port, metric, scrape, sigterm, spawn_weir, wait_port,
    wait_until_catching_sigterm, write_config, WEIR,
};
use common::{eventually, eventually_async, tmp};

fn config(mqtt: u16, admin: u16, out: &Path, ls_bound: &str, extra_route: &str) -> String {
    format!(
        "[[class]]\nname = \"ls\"\nbound = \"{ls_bound}\"\n\
         [[class]]\nname = \"lt\"\nbound = \"1s\"\n\
         [classify]\ndefault_class = \"lt\"\n\
         [[classify.route]]\nmqtt = \"plant/a/#\"\nclass = \"ls\"\n{extra_route}\n\
         [ingress.mqtt]\nlisten = \"127.0.0.1:{mqtt}\"\n[ingress.grpc]\nenabled = false\n\
         [admin]\nlisten = \"127.0.0.1:{admin}\"\n{}\n",
        file_egress(out)
    )
}

/// Every record in the batch files: payload -> class name.
fn classes_by_payload(dir: &Path) -> BTreeMap<Vec<u8>, String> {
    file_batch_records(dir)
        .into_iter()
        .map(|r| (r.payload.to_vec(), r.class))
        .collect()
}

fn sighup(pid: u32) {
    let sent = Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
}

async fn reloads(admin: std::net::SocketAddr, result: &str) -> f64 {
    let text = scrape(admin).await.unwrap_or_default();
    metric(
        &text,
        &format!("weir_config_reload_total{{result=\"{result}\"}}"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_under_qos1_load_moves_the_route_and_loses_nothing() {
    let dir = tmp("reload-under-load");
    let out = dir.join("out");
    let (mqtt, admin_port) = (free_port(), free_port());
    let admin: std::net::SocketAddr = format!("127.0.0.1:{admin_port}").parse().unwrap();
    let path = write_config(
        &dir,
        "weir.toml",
        &config(mqtt, admin_port, &out, "100ms", ""),
    );
    let log = std::fs::File::create(dir.join("weir.log")).unwrap();
    let mut child = spawn_weir(&path, log);
    wait_until_catching_sigterm(&mut child);
    wait_port(format!("127.0.0.1:{mqtt}").parse().unwrap()).await;
    wait_port(admin).await;

    // Two publishers, 1,000 records/s each, for 8 s: plant/a (ls all
    // along) and plant/b (lt until the reload routes it to ls).
    let sent_b = Arc::new(AtomicU64::new(0));
    let until = tokio::time::Instant::now() + Duration::from_secs(8);
    let pace = || Pace {
        rate: Some(1000.0),
        ..Pace::unpaced(64, until)
    };
    let a = tokio::spawn(publish_qos1(mqtt, "pub-a", pace(), |i| {
        Some((b"plant/a/t".to_vec(), format!("a-{i}").into_bytes()))
    }));
    let counter = Arc::clone(&sent_b);
    let b = tokio::spawn(publish_qos1(mqtt, "pub-b", pace(), move |i| {
        counter.store(i + 1, Ordering::SeqCst);
        Some((b"plant/b/t".to_vec(), format!("b-{i}").into_bytes()))
    }));

    // Reloaded mid-stream: once plant/b's records are going out in lt.
    eventually_async("plant/b's records to be delivered in lt", || async {
        let text = scrape(admin).await.unwrap_or_default();
        metric(&text, "weir_records_forwarded_total{class=\"lt\"}") > 0.0
    })
    .await;
    // A route and a bound change.
    let route_b = "[[classify.route]]\nmqtt = \"plant/b/#\"\nclass = \"ls\"";
    write_config(
        &dir,
        "weir.toml",
        &config(mqtt, admin_port, &out, "200ms", route_b),
    );
    let before = sent_b.load(Ordering::SeqCst);
    let hup = std::time::Instant::now();
    sighup(child.id());
    eventually_async("the reload is applied", || async {
        reloads(admin, "applied").await == 1.0
    })
    .await;
    let took = hup.elapsed();
    let after = sent_b.load(Ordering::SeqCst);
    eprintln!("SIGHUP to applied (seen in /metrics): {took:?}");
    let text = scrape(admin).await.unwrap();
    assert_eq!(
        metric(&text, "weir_class_bound_seconds{class=\"ls\"}"),
        0.2,
        "the new bound is in force"
    );

    // The new route carries plant/b before the next reload is tried.
    eventually(
        "a plant/b record sent after the reload to be delivered in ls",
        || {
            classes_by_payload(&out).iter().any(|(p, class)| {
                class == "ls"
                    && p.strip_prefix(b"b-")
                        .and_then(|i| std::str::from_utf8(i).ok()?.parse::<u64>().ok())
                        .is_some_and(|i| i >= after + 64)
            })
        },
    )
    .await;
    // An invalid file: refused whole, counted, the old config runs on.
    std::fs::write(
        &path,
        "[[class]]\nname = \"ls\"\nbound = \"0ms\"\nnot_a_key = 1\n",
    )
    .unwrap();
    sighup(child.id());
    eventually_async("the invalid file is refused", || async {
        reloads(admin, "refused").await == 1.0
    })
    .await;
    // A change that needs a restart, through `weir reload`: refused, the
    // key named.
    let restart = config(free_port(), admin_port, &out, "200ms", route_b);
    std::fs::write(&path, &restart).unwrap();
    let answer = Command::new(WEIR)
        .args(["reload", "--config", path.to_str().unwrap()])
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&answer.stdout);
    assert_eq!(answer.status.code(), Some(1), "{said}");
    assert!(
        said.contains("ingress.mqtt.listen") && said.contains("restart"),
        "{said}"
    );
    assert_eq!(reloads(admin, "refused").await, 2.0);
    assert_eq!(reloads(admin, "applied").await, 1.0);

    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    let sent = sent_b.load(Ordering::SeqCst);
    // Paced at 1,000/s for 8 s: a dropped connection would end a publisher
    // early, with far fewer acknowledged.
    assert_eq!(
        b.len() as u64,
        sent,
        "every publish of plant/b acknowledged"
    );
    assert!(a.len() > 6000 && b.len() > 6000, "{} {}", a.len(), b.len());

    sigterm(child.id());
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "weir exited with {status}");
    let log = std::fs::read_to_string(dir.join("weir.log")).unwrap();
    let delivered = classes_by_payload(&out);
    let lost: Vec<_> = a
        .iter()
        .chain(&b)
        .filter(|p| !delivered.contains_key(*p))
        .take(5)
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    assert!(
        lost.is_empty(),
        "acknowledged but not delivered: {lost:?}\n{log}"
    );
    // Before the SIGHUP plant/b went to lt, after the reload to ls.
    let class_of = |i: u64| delivered[format!("b-{i}").as_bytes()].as_str();
    assert!((0..before).all(|i| class_of(i) == "lt"), "{log}");
    assert!((after + 64..sent).all(|i| class_of(i) == "ls"), "{log}");
    assert!(sent > after + 1000, "records were sent after the reload");
    assert!(log.contains("config reloaded"), "{log}");
    assert!(log.contains("config reload refused"), "{log}");
}

fn peer_config(id: u64, peering: u16, admin: u16, peers: &str, out: &Path) -> String {
    format!(
        "[node]\nid = {id}\n[ingress.mqtt]\nlisten = \"127.0.0.1:0\"\n[ingress.grpc]\nenabled = false\n\
         [admin]\nlisten = \"127.0.0.1:{admin}\"\n\
         [peering]\nlisten = \"127.0.0.1:{peering}\"\npeers = [{peers}]\nheartbeat = \"50ms\"\ndead_after = \"250ms\"\n{}\n",
        file_egress(out)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_adds_a_peer_and_drops_it_again() {
    let dir = tmp("reload-peers");
    let (pa, pb, aa, ab) = (free_port(), free_port(), free_port(), free_port());
    let admin_a: std::net::SocketAddr = format!("127.0.0.1:{aa}").parse().unwrap();
    let admin_b: std::net::SocketAddr = format!("127.0.0.1:{ab}").parse().unwrap();
    let peer = |id: u64, port: u16| format!("{{ id = {id}, addr = \"127.0.0.1:{port}\" }}");
    let path_a = write_config(&dir, "a.toml", &peer_config(1, pa, aa, "", &dir.join("a")));
    let path_b = write_config(
        &dir,
        "b.toml",
        &peer_config(2, pb, ab, &peer(1, pa), &dir.join("b")),
    );
    let mut a = spawn_weir(&path_a, std::fs::File::create(dir.join("a.log")).unwrap());
    let mut b = spawn_weir(&path_b, std::fs::File::create(dir.join("b.log")).unwrap());
    wait_until_catching_sigterm(&mut a);
    wait_until_catching_sigterm(&mut b);
    wait_port(admin_a).await;
    wait_port(admin_b).await;
    let alive =
        |admin| async move { metric(&scrape(admin).await.unwrap_or_default(), "weir_peers_alive") };
    // B has called A and been refused (not a moment's grace that a slow
    // machine could spend before B tried at all).
    let b_log = dir.join("b.log");
    eventually("A refuses B's heartbeat", || {
        std::fs::read_to_string(&b_log)
            .is_ok_and(|l| l.contains("node 2 is not in peering.peers of node 1"))
    })
    .await;
    assert_eq!(alive(admin_b).await, 0.0, "A refuses B: not in its peers");

    write_config(
        &dir,
        "a.toml",
        &peer_config(1, pa, aa, &peer(2, pb), &dir.join("a")),
    );
    sighup(a.id());
    eventually_async("A and B see each other", || async {
        alive(admin_a).await == 1.0 && alive(admin_b).await == 1.0
    })
    .await;

    write_config(&dir, "a.toml", &peer_config(1, pa, aa, "", &dir.join("a")));
    sighup(a.id());
    eventually_async("B sees A gone", || async {
        alive(admin_b).await == 0.0 && reloads(admin_a, "applied").await == 2.0
    })
    .await;
    for child in [&a, &b] {
        sigterm(child.id());
    }
    assert!(a.wait().unwrap().success());
    assert!(b.wait().unwrap().success());
    let log = std::fs::read_to_string(dir.join("a.log")).unwrap();
    assert!(log.contains("peering.peers reloaded"), "{log}");
}
