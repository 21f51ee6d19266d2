//! Gauges read as they are when scraped: an operator deciding whether
//! weir has drained reads `weir_class_queued_records`, so it must not wait
//! for the scheduler's next window step.

mod common;

use common::mqtt::MqttClient;
use common::process::{metric, parse_config, scrape};
use weir::app::App;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_records_are_current_when_scraped() {
    // One class with a long bound and a long scheduler window: the window
    // step that used to publish queue lengths does not run again during
    // the test. The broker is unreachable and batches hold one record, so
    // nearly every record stays queued.
    let text = r#"
[[class]]
name = "slow"
bound = "120s"
[classify]
default_class = "slow"
[scheduler]
window = "60s"
max_batch_records = 1
[ingress.mqtt]
listen = "127.0.0.1:0"
[ingress.grpc]
enabled = false
[admin]
listen = "127.0.0.1:0"
[egress]
kind = "amqp"
[egress.amqp]
url = "amqp://127.0.0.1:1/%2f"
max_in_flight = 1
"#;
    let app = App::start(parse_config(text, "metrics-live"))
        .await
        .unwrap();
    let admin = app.admin_addr.unwrap();
    let before = scrape(admin).await.unwrap();
    assert_eq!(metric(&before, "weir_class_queued_records"), 0.0);

    let mut client = MqttClient::connect(app.mqtt_addr.unwrap().port(), "metrics-live").await;
    let records: Vec<(String, Vec<u8>)> = (0..200)
        .map(|i| ("t/live".to_owned(), format!("r{i}").into_bytes()))
        .collect();
    client.publish_confirmed(&records).await;

    let after = scrape(admin).await.unwrap();
    let queued = metric(&after, "weir_class_queued_records");
    // The egress holds at most a batch in flight and one in its channel,
    // and the scheduler one more; every other record is queued.
    assert!(
        (197.0..=200.0).contains(&queued),
        "weir_class_queued_records = {queued} right after 200 acknowledged records"
    );
    app.shutdown(std::time::Duration::from_millis(100)).await;
}
