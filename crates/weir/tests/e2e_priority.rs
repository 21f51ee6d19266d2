//! Priority end to end: with the egress emulated as JANUS Table III's 3G
//! link (100 ms per transaction, 780 kbit/s), a backlog of latency-tolerant
//! records is queued, then latency-sensitive records arrive; they must
//! overtake the backlog and stay within their bound while `lt` waits. Run
//! once per sink (RabbitMQ, Kafka): the classes are the sink's to keep.
//!
//! The assertions compare what happened within one run (arrival order, ls
//! latency against lt latency); the one absolute check is the class's own
//! configured bound, set with a wide margin over the expected worst case
//! (one lt batch of 8 KiB in flight, ~185 ms, plus the ls transaction,
//! ~100 ms).

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::amqp::*;
use common::ingress::LT;
use common::kafka::{create_topic, kafka_egress, read_until};
use common::process::{parse_config, GRPC_ONLY};
use common::*;
use weir::app::App;
use weir::intake::Intake;

const LT_BACKLOG: usize = 1200;
const LS_RECORDS: usize = 8;
const LS_BOUND_MS: u64 = 1000;

/// Where the batches go.
#[derive(Debug, Clone, Copy)]
enum Sink {
    Amqp,
    Kafka,
    /// The test Mosquitto, batch mode.
    Mqtt,
}

/// One scenario at a time: each runs its own weir against a 3G link.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn config(name: &str, sink: Sink) -> weir::config::Config {
    let egress = match sink {
        Sink::Amqp => amqp_egress(name),
        Sink::Kafka => kafka_egress(name),
        Sink::Mqtt => format!(
            "[egress]\nkind = \"mqtt\"\n[egress.mqtt]\nbroker = \"mqtt://{}\"\nmode = \"batch\"\ntopic = \"{name}/batches\"",
            common::mqtt::MOSQUITTO
        ),
    };
    let text = format!(
        r#"
[node]
id = 3
[[class]]
name = "ls"
bound = "{LS_BOUND_MS}ms"
[[class]]
name = "nm"
bound = "2s"
[[class]]
name = "lt"
bound = "30s"
[classify]
default_class = "lt"
[[classify.route]]
grpc = "ls"
class = "ls"
[scheduler]
window = "100ms"
uplink = "780kbit/s"
burst = "8KiB"
max_batch_bytes = "8KiB"
{GRPC_ONLY}
{egress}
[egress.link]
preset = "3g"
"#
    );
    parse_config(&text, "priority")
}

async fn put(ingress: &Intake, stream: &str, payload: Vec<u8>) {
    let record = ingress.grpc_record(stream, Bytes::from(payload));
    ingress
        .enqueue(record, Some(PATIENCE))
        .await
        .expect("queue has room");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ls_overtakes_an_lt_backlog_on_3g_and_meets_its_bound() {
    scenario(Sink::Amqp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ls_overtakes_an_lt_backlog_on_3g_into_kafka() {
    scenario(Sink::Kafka).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ls_overtakes_an_lt_backlog_on_3g_into_an_mqtt_broker() {
    scenario(Sink::Mqtt).await;
}

async fn scenario(sink: Sink) {
    let _turn = ONE_AT_A_TIME.lock().await;
    let name = common::kafka::topic_name(&format!("priority-{sink:?}").to_lowercase());
    match sink {
        Sink::Amqp => delete_queue(&format!("{name}.q")).await,
        Sink::Kafka => create_topic(&name, 1).await,
        Sink::Mqtt => {}
    }
    // The MQTT subscriber is in place before weir publishes anything.
    let (subscribed_tx, subscribed) = tokio::sync::oneshot::channel();
    let app = App::start(config(&name, sink)).await.unwrap();
    // Consume from the start: latency is measured when the cloud gets it.
    let total = LT_BACKLOG + LS_RECORDS;
    let (queue, topic) = (format!("{name}.q"), name.clone());
    let consumer = tokio::spawn(async move {
        match sink {
            Sink::Amqp => consume_until(&queue, |s| s.len() >= total).await,
            Sink::Kafka => read_until(&topic, |s| s.len() >= total).await,
            Sink::Mqtt => {
                let filter = format!("{topic}/#");
                common::mqtt::read_batches_until(&filter, subscribed_tx, |s| s.len() >= total).await
            }
        }
    });
    if let Sink::Mqtt = sink {
        subscribed.await.expect("the subscriber is in place");
    }

    for i in 0..LT_BACKLOG {
        put(
            &app.ingress,
            "bulk",
            format!("lt-{i:05}-{}", "x".repeat(240)).into_bytes(),
        )
        .await;
    }
    // Once the backlog has started draining (not after a fixed time: on a
    // loaded machine that may be before the first batch left), send ls
    // records spaced out.
    let lt_queue = app.ingress.queues().class(LT);
    eventually("the lt backlog to start draining", || {
        lt_queue.len() < LT_BACKLOG
    })
    .await;
    for i in 0..LS_RECORDS {
        put(&app.ingress, "ls", format!("ls-{i}").into_bytes()).await;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    let seen = consumer.await.unwrap();
    app.shutdown(Duration::from_secs(60)).await;
    if let Sink::Amqp = sink {
        delete_queue(&format!("{name}.q")).await;
    }
    assert_eq!(seen.len(), total, "every record arrived exactly once");

    let latency_ms = |s: &Seen| (s.consumed_us.saturating_sub(s.record.ingress_us)) as f64 / 1e3;
    let ls: Vec<&Seen> = seen.iter().filter(|s| s.record.class == "ls").collect();
    let lt: Vec<&Seen> = seen.iter().filter(|s| s.record.class == "lt").collect();
    assert_eq!(ls.len(), LS_RECORDS);
    let last_lt = seen.iter().rposition(|s| s.record.class == "lt").unwrap();
    let last_ls = seen.iter().rposition(|s| s.record.class == "ls").unwrap();
    assert!(
        last_ls < last_lt,
        "every ls record overtook the lt backlog (last ls at {last_ls}, last lt at {last_lt})"
    );
    let ls_lat: Vec<f64> = ls.iter().map(|s| latency_ms(s)).collect();
    eprintln!("ls latencies {ls_lat:?}");
    let ls_max = ls_lat.iter().copied().fold(0.0, f64::max);
    let mut lt_lat: Vec<f64> = lt.iter().map(|s| latency_ms(s)).collect();
    lt_lat.sort_by(f64::total_cmp);
    let lt_median = lt_lat[lt_lat.len() / 2];
    eprintln!("{sink:?}: ls max latency {ls_max:.1} ms, lt median {lt_median:.1} ms");
    assert!(
        ls_max < lt_median,
        "ls ({ls_max:.1} ms worst) waited less than lt ({lt_median:.1} ms median)"
    );
    assert!(
        ls_max <= LS_BOUND_MS as f64,
        "ls worst latency {ls_max:.1} ms within its {LS_BOUND_MS} ms bound"
    );
}
