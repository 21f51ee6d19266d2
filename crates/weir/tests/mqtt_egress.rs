//! weir delivering to a real MQTT broker: Mosquitto instances of the
//! test's own (each on its own port, from `scripts/services.sh`'s
//! `mosquitto` binary), one with persistence that is restarted mid-stream,
//! one with TLS that wants client certificates, one that checks passwords.

mod common;

use std::collections::HashSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::mqtt::MqttClient;
use common::pki::Ca;
use common::process::*;
use common::*;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use weir::app::App;

/// A Mosquitto of the test's own, stopped when dropped.
struct Broker {
    child: Child,
    conf: std::path::PathBuf,
    port: u16,
}

impl Broker {
    /// Starts `mosquitto -c <dir>/<name>.conf` with `conf` and waits for
    /// `port`.
    async fn start(dir: &Path, name: &str, conf: &str, port: u16) -> Broker {
        // Run as whoever runs the test: Mosquitto started as root would
        // become user `mosquitto`, who cannot read the test's key files or
        // write its persistence directory.
        let user = std::env::var("USER").unwrap_or_else(|_| "root".into());
        let path = write_config(
            dir,
            &format!("{name}.conf"),
            &format!("user {user}\n{conf}"),
        );
        let mut b = Broker {
            child: spawn_mosquitto(&path, dir, name),
            conf: path,
            port,
        };
        b.wait_up().await;
        b
    }

    async fn wait_up(&mut self) {
        wait_port(std::net::SocketAddr::from(([127, 0, 0, 1], self.port))).await;
    }

    /// SIGTERM (Mosquitto saves its persistence file), then starts it
    /// again on the same config.
    async fn restart(&mut self, dir: &Path) {
        self.stop();
        self.start_again(dir).await;
    }

    /// SIGTERM, and waits for it to exit.
    fn stop(&mut self) {
        sigterm(self.child.id());
        self.child.wait().unwrap();
    }

    /// Starts it again after [`Broker::stop`].
    async fn start_again(&mut self, dir: &Path) {
        self.child = spawn_mosquitto(&self.conf, dir, "restarted");
        self.wait_up().await;
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_mosquitto(conf: &Path, dir: &Path, log: &str) -> Child {
    Command::new("mosquitto")
        .arg("-c")
        .arg(conf)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("{log}.log"))).unwrap())
        .spawn()
        .expect("mosquitto (run scripts/services.sh)")
}

/// A publish as a subscriber got it: topic and payload.
type Publish = (String, Vec<u8>);

/// A QoS 1 subscriber with a persistent session: every publish it gets,
/// as (topic, payload).
struct Subscriber {
    got: Arc<Mutex<Vec<Publish>>>,
    _task: tokio::task::JoinHandle<()>,
}

impl Subscriber {
    async fn start(port: u16, id: &str, filter: &str) -> Subscriber {
        Subscriber::start_as(port, id, filter, None).await
    }

    /// The same, logging in with `(user, password)`.
    async fn start_as(
        port: u16,
        id: &str,
        filter: &str,
        login: Option<(&str, &str)>,
    ) -> Subscriber {
        let mut o = MqttOptions::new(id, "127.0.0.1", port);
        if let Some((user, password)) = login {
            o.set_credentials(user, password);
        }
        o.set_clean_session(false)
            .set_keep_alive(Duration::from_secs(30))
            .set_max_packet_size(1 << 20, 1 << 20);
        let (client, mut events) = AsyncClient::new(o, 100);
        client.subscribe(filter, QoS::AtLeastOnce).await.unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let (subscribed_tx, subscribed) = tokio::sync::oneshot::channel();
        let mut subscribed_tx = Some(subscribed_tx);
        let task = {
            let got = Arc::clone(&got);
            tokio::spawn(async move {
                let _client = client;
                loop {
                    match events.poll().await {
                        Ok(Event::Incoming(Packet::SubAck(_))) => {
                            if let Some(tx) = subscribed_tx.take() {
                                let _ = tx.send(());
                            }
                        }
                        Ok(Event::Incoming(Packet::Publish(p))) => got
                            .lock()
                            .unwrap()
                            .push((p.topic.clone(), p.payload.to_vec())),
                        Ok(_) => {}
                        // The broker restarting: rumqttc reconnects on the
                        // next poll; the session (and what was queued for
                        // it) is the broker's to keep.
                        Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                    }
                }
            })
        };
        tokio::time::timeout(PATIENCE, subscribed)
            .await
            .expect("SUBACK")
            .unwrap();
        Subscriber { got, _task: task }
    }

    fn got(&self) -> Vec<Publish> {
        self.got.lock().unwrap().clone()
    }
}

/// weir (node 7) publishing to the broker `egress` names, batches of at
/// most `records` records.
fn weir_config(records: u32, egress: &str) -> String {
    format!("[node]\nid = 7\n[scheduler]\nmax_batch_records = {records}\nburst = \"1MiB\"\n[ingress.mqtt]\nlisten = \"127.0.0.1:0\"\n[ingress.grpc]\nenabled = false\n[egress]\nkind = \"mqtt\"\n[egress.mqtt]\n{egress}\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_are_republished_on_their_topics_through_a_broker_restart() {
    const N: usize = 2000;
    let name = unique("mqtt-egress-records");
    let dir = tmp(&name);
    let port = free_port();
    let conf = format!(
        "listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location {}/\nlog_dest stderr\n",
        dir.display()
    );
    let mut broker = Broker::start(&dir, "persistent", &conf, port).await;
    let sub = Subscriber::start(port, &format!("{name}-sub"), "site/7/#").await;
    let text = weir_config(
        50,
        &format!(
            "broker = \"mqtt://127.0.0.1:{port}\"\nmode = \"records\"\ntopic_prefix = \"site/7/\""
        ),
    );
    let app = App::start(parse_config(&text, "mqtt-egress"))
        .await
        .unwrap();
    let mut client =
        MqttClient::connect(app.mqtt_addr.unwrap().port(), &format!("{name}-pub")).await;
    let sent: Vec<(String, String)> = (0..N)
        .map(|i| (format!("dev/{}/t", i % 10), format!("{name}-r{i}")))
        .collect();
    for (i, (topic, payload)) in sent.iter().enumerate() {
        client
            .publish(topic, QoS::AtLeastOnce, payload.as_str())
            .await;
        if i == N / 2 {
            broker.restart(&dir).await;
        }
        if i % 100 == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    for _ in 0..N {
        client.next_ack().await;
    }
    eventually("every record at the subscriber", || {
        sub.got()
            .iter()
            .map(|(_, p)| p.clone())
            .collect::<HashSet<_>>()
            .len()
            >= N
    })
    .await;
    app.shutdown(Duration::from_secs(30)).await;
    let got = sub.got();
    let seen: HashSet<(String, Vec<u8>)> = got.iter().cloned().collect();
    for (topic, payload) in &sent {
        assert!(
            seen.contains(&(format!("site/7/{topic}"), payload.as_bytes().to_vec())),
            "{payload} on site/7/{topic} is missing"
        );
    }
    eprintln!(
        "{} publishes at the subscriber, {} duplicates",
        got.len(),
        got.len() - seen.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_leaves_in_batches_within_the_brokers_payload_limit() {
    const N: usize = 600;
    const LIMIT: usize = 128 * 1024;
    let name = unique("mqtt-egress-batch");
    let dir = tmp(&name);
    let port = free_port();
    let conf = format!(
        "listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location {}/\nlog_dest stderr\n",
        dir.display()
    );
    let mut broker = Broker::start(&dir, "persistent", &conf, port).await;
    let sub = Subscriber::start(port, &format!("{name}-sub"), "weir/#").await;
    // The broker away while 300 KiB queue up in weir: once it is back,
    // the backlog leaves in batches as large as the broker takes.
    let text = weir_config(
        10_000,
        &format!(
            "broker = \"mqtt://127.0.0.1:{port}\"\nmode = \"batch\"\nmax_payload = \"128KiB\""
        ),
    );
    broker.stop();
    let app = App::start(parse_config(&text, "mqtt-egress-batch"))
        .await
        .unwrap();
    let mut client =
        MqttClient::connect(app.mqtt_addr.unwrap().port(), &format!("{name}-pub")).await;
    // 600 records of 512 bytes: 300 KiB offered at once.
    let sent: Vec<Vec<u8>> = (0..N)
        .map(|i| format!("{i:06}-{}", "x".repeat(505)).into_bytes())
        .collect();
    for p in &sent {
        client.publish("dev/t", QoS::AtLeastOnce, p.clone()).await;
    }
    for _ in 0..N {
        client.next_ack().await;
    }
    broker.start_again(&dir).await;
    let records = || {
        sub.got()
            .iter()
            .flat_map(|(_, body)| {
                // The codec from the body's first bytes, as `weir decode` does.
                let encoding = weir_proto::Encoding::sniff(body).as_str();
                weir_proto::decode_batch(body, encoding, 64 << 20)
                    .expect("a weir batch")
                    .records
            })
            .map(|r| r.payload)
            .collect::<HashSet<_>>()
    };
    eventually("every record at the subscriber", || records().len() >= N).await;
    app.shutdown(Duration::from_secs(30)).await;
    let got = sub.got();
    let largest = got.iter().map(|(_, b)| b.len()).max().unwrap();
    eprintln!("{} batches, the largest {largest} bytes", got.len());
    assert!(got.len() > 1, "300 KiB went as more than one publish");
    assert!(largest <= LIMIT, "every publish within 128 KiB ({largest})");
    assert!(
        got.iter().all(|(t, _)| t == "weir/7/lt"),
        "batch mode's topic"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_delivers_and_a_certificate_from_another_ca_is_refused_at_start_up() {
    let name = unique("mqtt-egress-tls");
    let dir = tmp(&name);
    let ca = Ca::new(&dir, "ca");
    let server = ca.server("server");
    let client_cert = ca.client("weir", "weir-7");
    let other = Ca::new(&dir, "other");
    let stranger = other.client("stranger", "weir-7");
    let (tls_port, plain_port) = (free_port(), free_port());
    let conf = format!(
        "per_listener_settings true\nlistener {tls_port} 127.0.0.1\nallow_anonymous true\ncafile {}\ncertfile {}\nkeyfile {}\nrequire_certificate true\nlistener {plain_port} 127.0.0.1\nallow_anonymous true\nlog_dest stderr\n",
        ca.pair.cert.display(),
        server.cert.display(),
        server.key.display()
    );
    let _broker = Broker::start(&dir, "tls", &conf, tls_port).await;
    let sub = Subscriber::start(plain_port, &format!("{name}-sub"), "tls/#").await;
    let egress = |pair: &common::pki::Pair| {
        weir_config(50, &format!(
            "broker = \"mqtts://127.0.0.1:{tls_port}\"\nca_file = \"{}\"\ncert_file = \"{}\"\nkey_file = \"{}\"\ntopic_prefix = \"tls/\"",
            ca.pair.cert.display(),
            pair.cert.display(),
            pair.key.display()
        ))
    };
    // A certificate the broker does not trust: start-up stops, naming it.
    let why = refused_at_start_up(
        &egress(&stranger),
        "a client certificate the broker refuses",
    )
    .await;
    assert!(why.contains("egress.mqtt"), "names the section: {why}");

    delivers_200(&egress(&client_cert), &name, "tls", &sub).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Why weir with config `text` did not start; panics if it did (it was
/// given `what`).
async fn refused_at_start_up(text: &str, what: &str) -> String {
    match App::start(parse_config(text, "mqtt-egress-refused")).await {
        Ok(app) => {
            app.shutdown(Duration::from_secs(5)).await;
            panic!("weir started with {what}")
        }
        Err(e) => e.to_string(),
    }
}

/// weir with config `text` (records mode, `topic_prefix = "<prefix>/"`)
/// takes 200 QoS 1 records and, by its shutdown, `sub` has every one on
/// its topic under the prefix.
async fn delivers_200(text: &str, name: &str, prefix: &str, sub: &Subscriber) {
    let app = App::start(parse_config(text, &format!("mqtt-egress-{prefix}")))
        .await
        .unwrap();
    let mut client =
        MqttClient::connect(app.mqtt_addr.unwrap().port(), &format!("{name}-pub")).await;
    let sent: Vec<(String, Vec<u8>)> = (0..200)
        .map(|i| (format!("dev/{i}"), format!("{prefix}-{i}").into_bytes()))
        .collect();
    client.publish_confirmed(&sent).await;
    eventually(&format!("every {prefix} record at the subscriber"), || {
        sub.got().len() >= sent.len()
    })
    .await;
    app.shutdown(Duration::from_secs(30)).await;
    let got: HashSet<(String, Vec<u8>)> = sub.got().into_iter().collect();
    for (topic, payload) in &sent {
        assert!(got.contains(&(format!("{prefix}/{topic}"), payload.clone())));
    }
}

/// Adds `user` with `password` to Mosquitto's password file `file`.
fn add_password(file: &Path, user: &str, password: &str) {
    let mut cmd = Command::new("mosquitto_passwd");
    if !file.exists() {
        cmd.arg("-c");
    }
    let status = cmd
        .arg("-b")
        .arg(file)
        .arg(user)
        .arg(password)
        .status()
        .expect("mosquitto_passwd (run scripts/services.sh)");
    assert!(status.success(), "mosquitto_passwd failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_checking_passwords_refuses_a_wrong_one_at_start_up_and_takes_the_right_one() {
    let name = unique("mqtt-egress-login");
    let dir = tmp(&name);
    let port = free_port();
    let passwords = dir.join("passwd");
    add_password(&passwords, "weir", "s3cret");
    add_password(&passwords, "reader", "r3ad");
    let conf = format!(
        "listener {port} 127.0.0.1\nallow_anonymous false\npassword_file {}\nlog_dest stderr\n",
        passwords.display()
    );
    let _broker = Broker::start(&dir, "login", &conf, port).await;
    let sub = Subscriber::start_as(
        port,
        &format!("{name}-sub"),
        "login/#",
        Some(("reader", "r3ad")),
    )
    .await;
    let egress = |password: &str| {
        weir_config(
            50,
            &format!(
                "broker = \"mqtt://127.0.0.1:{port}\"\nusername = \"weir\"\npassword = \"{password}\"\ntopic_prefix = \"login/\""
            ),
        )
    };
    let why = refused_at_start_up(&egress("wrong"), "a password the broker refuses").await;
    assert!(
        why.contains("egress.mqtt.username"),
        "names the credentials: {why}"
    );

    delivers_200(&egress("s3cret"), &name, "login", &sub).await;
    let _ = std::fs::remove_dir_all(&dir);
}
