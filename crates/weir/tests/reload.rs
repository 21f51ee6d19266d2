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
    file_egress, free_port, metric, scrape, sigterm, spawn_weir, wait_port,
    wait_until_catching_sigterm, write_config, WEIR,
};
use common::{eventually_async, tmp};

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
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let Some(encoding) = name
            .strip_suffix(".weirbatch")
            .and_then(|n| n.rsplit('.').next())
        else {
            continue;
        };
        let body = std::fs::read(&p).unwrap();
        let batch = weir_proto::decode_batch(&body, encoding, 64 << 20).unwrap();
        for r in batch.records {
            out.insert(r.payload.to_vec(), r.class);
        }
    }
    out
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

    tokio::time::sleep(Duration::from_secs(2)).await;
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

    tokio::time::sleep(Duration::from_secs(1)).await;
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
