//! RabbitMQ restarted in the middle of a stream: nothing acknowledged at
//! ingress (MQTT PUBACK) is lost. The broker's application is stopped and
//! started again with `rabbitmqctl` (this test has its own binary, so no
//! other test runs while the broker is down).

mod common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::amqp::*;
use common::process::{metric, parse_config, scrape};
use common::*;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use weir::app::App;

const RECORDS: usize = 3000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_acknowledged_is_lost_when_rabbitmq_restarts() {
    let name = unique("restart");
    delete_queue(&format!("{name}.q")).await;
    let amqp = amqp_egress(&name);
    let text = format!(
        r#"
[node]
id = 11
[scheduler]
uplink = "1Gbit/s"
max_batch_records = 50
[ingress.mqtt]
listen = "127.0.0.1:0"
[ingress.grpc]
enabled = false
[admin]
listen = "127.0.0.1:0"
{amqp}
confirm_timeout = "3s"
reconnect_backoff_max = "1s"
"#
    );
    let cfg = parse_config(&text, "restart");
    let app = App::start(cfg).await.unwrap();
    let port = app.mqtt_addr.unwrap().port();
    let admin = app.admin_addr.unwrap();
    let scraped =
        |name: &'static str| async move { metric(&scrape(admin).await.unwrap_or_default(), name) };

    let mut opts = MqttOptions::new(format!("{name}-pub"), "127.0.0.1", port);
    opts.set_keep_alive(Duration::from_secs(60));
    opts.set_inflight(32);
    let (client, mut eventloop) = AsyncClient::new(opts, 64);
    // Packet id -> payload of publishes in flight, to know which were acked.
    let acked = Arc::new(Mutex::new(0usize));
    let poller = {
        let acked = Arc::clone(&acked);
        tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::PubAck(_))) => {
                        let mut a = acked.lock().unwrap();
                        *a += 1;
                        if *a == RECORDS {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(e) => panic!("MQTT client error: {e}"),
                }
            }
        })
    };
    let _guard = RestartGuard;
    for i in 0..RECORDS {
        client
            .publish(
                format!("{name}/t"),
                QoS::AtLeastOnce,
                false,
                format!("r{i}"),
            )
            .await
            .unwrap();
        if i == RECORDS / 3 {
            // In the middle of a stream: weir has delivered to the broker.
            eventually_async("a batch confirmed before the broker stops", || async {
                scraped("weir_batches_confirmed_total").await >= 1.0
            })
            .await;
            rabbitmqctl(&["stop_app"]);
        }
        if i == RECORDS / 2 {
            // Up again once weir has lost its connection to the stopped
            // broker (the endpoint gauge reads 0), not after a fixed time.
            eventually_async(
                "weir to drop its connection to the stopped broker",
                || async { scraped("weir_egress_amqp_endpoint").await == 0.0 },
            )
            .await;
            rabbitmqctl(&["start_app"]);
            rabbitmqctl(&["await_startup"]);
        }
        if i % 100 == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    tokio::time::timeout(PATIENCE, poller)
        .await
        .expect("every publish was acknowledged")
        .unwrap();
    assert_eq!(*acked.lock().unwrap(), RECORDS);

    let seen = consume_until(&format!("{name}.q"), |s| {
        s.iter()
            .map(|x| x.record.payload.clone())
            .collect::<HashSet<_>>()
            .len()
            >= RECORDS
    })
    .await;
    app.shutdown(Duration::from_secs(30)).await;
    delete_queue(&format!("{name}.q")).await;
    let payloads: HashSet<Vec<u8>> = seen.iter().map(|s| s.record.payload.to_vec()).collect();
    for i in 0..RECORDS {
        assert!(
            payloads.contains(format!("r{i}").as_bytes()),
            "acknowledged record r{i} was lost"
        );
    }
    let dups = seen.len() - payloads.len();
    eprintln!(
        "{} records, {} duplicates after the restart",
        seen.len(),
        dups
    );
}
