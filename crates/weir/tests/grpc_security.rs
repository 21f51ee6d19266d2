//! gRPC ingress security against the real `weir` process: TLS with client
//! certificates made by `openssl`, bearer tokens from a token file, and the
//! per-stream allow list, with a tonic client over TLS.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Child;

use common::pki::{Ca, Pair};
use common::process::{
    file_batch_payloads, free_port, metric, scrape, sigterm, spawn_weir, wait_port, write_config,
};
use common::{tmp, PATIENCE};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic::{Code, Request};
use weir_proto::pb::ingress_client::IngressClient;
use weir_proto::pb::PublishRequest;

fn sha256_hex(text: &str) -> String {
    let out = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(text.as_bytes())?;
            c.wait_with_output()
        })
        .expect("run sha256sum");
    String::from_utf8(out.stdout).unwrap()[..64].to_owned()
}

async fn channel(
    port: u16,
    ca: &Path,
    me: Option<&Pair>,
) -> Result<Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(ca).unwrap()))
        .domain_name("localhost");
    if let Some(pair) = me {
        tls = tls.identity(Identity::from_pem(
            std::fs::read(&pair.cert).unwrap(),
            std::fs::read(&pair.key).unwrap(),
        ));
    }
    Channel::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(tls)?
        .connect()
        .await
}

fn request(stream: &str, payload: &str, token: Option<&str>) -> Request<PublishRequest> {
    let mut r = Request::new(PublishRequest {
        stream: stream.into(),
        payload: payload.as_bytes().to_vec().into(),
        id: 1,
    });
    if let Some(t) = token {
        r.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    r
}

struct Weir {
    child: Child,
    admin: SocketAddr,
}

impl Drop for Weir {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_and_tokens_name_callers_and_the_allow_list_binds_streams() {
    let dir = tmp("grpc-security");
    let ca = Ca::new(&dir, "ca");
    let server = ca.server("server");
    let gw1 = ca.client("gw1", "gw-1");
    let rogue = Ca::new(&dir, "rogue-ca").client("rogue-gw1", "gw-1");
    let tokens = dir.join("tokens");
    std::fs::write(
        &tokens,
        format!("gw-2 {}\n", sha256_hex("s3cret-token-of-gw2")),
    )
    .unwrap();
    let port = free_port();
    let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let out = dir.join("out");
    let config = format!(
        "[ingress.mqtt]\nenabled = false\n\
         [ingress.grpc]\nlisten = \"127.0.0.1:{port}\"\ntokens_file = \"{}\"\n\
         [ingress.grpc.allow]\n\"gw-1\" = [\"line1/*\"]\n\"gw-2\" = [\"alarms\"]\n\
         [ingress.grpc.tls]\ncertfile = \"{}\"\nkeyfile = \"{}\"\ncafile = \"{}\"\n\
         [egress.file]\ndir = \"{}\"\n[admin]\nlisten = \"{admin}\"\n",
        tokens.display(),
        server.cert.display(),
        server.key.display(),
        ca.pair.cert.display(),
        out.display()
    );
    let path = write_config(&dir, "weir.toml", &config);
    let log = std::fs::File::create(dir.join("weir.log")).unwrap();
    let mut weir = Weir {
        child: spawn_weir(&path, log),
        admin,
    };
    wait_port(format!("127.0.0.1:{port}").parse().unwrap()).await;

    // gw-1 by its certificate: its streams only.
    let mut c = IngressClient::new(channel(port, &ca.pair.cert, Some(&gw1)).await.unwrap());
    c.publish(request("line1/temp", "gw1-ok", None))
        .await
        .unwrap();
    let denied = c
        .publish(request("alarms", "gw1-denied", None))
        .await
        .unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    // A stream: the first record acknowledged, the denied one ends it.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    for (stream, payload) in [("line1/a", "gw1-stream"), ("line2/a", "gw1-stream-denied")] {
        tx.send(request(stream, payload, None).into_inner())
            .await
            .unwrap();
    }
    drop(tx);
    let mut acks = c
        .publish_stream(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    assert!(
        acks.message().await.unwrap().is_some(),
        "first record acknowledged"
    );
    let end = acks.message().await.unwrap_err();
    assert_eq!(end.code(), Code::PermissionDenied, "{end:?}");

    // gw-2 by its token (any TLS client; without a certificate too): its
    // stream only. A wrong token is refused outright.
    let mut anon = IngressClient::new(channel(port, &ca.pair.cert, None).await.unwrap());
    anon.publish(request("alarms", "gw2-ok", Some("s3cret-token-of-gw2")))
        .await
        .unwrap();
    let denied = anon
        .publish(request(
            "line1/temp",
            "gw2-denied",
            Some("s3cret-token-of-gw2"),
        ))
        .await
        .unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied);
    let wrong = anon
        .publish(request("alarms", "bad-token", Some("guess")))
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), Code::Unauthenticated, "{wrong:?}");
    // Neither token nor certificate: a token file is configured, so
    // anonymous callers are refused.
    let nobody = anon
        .publish(request("alarms", "anonymous", None))
        .await
        .unwrap_err();
    assert_eq!(nobody.code(), Code::Unauthenticated);
    // A certificate from another CA never gets a connection.
    let rogue_client = match channel(port, &ca.pair.cert, Some(&rogue)).await {
        Err(_) => None,
        Ok(ch) => Some(
            IngressClient::new(ch)
                .publish(request("line1/temp", "rogue", None))
                .await,
        ),
    };
    assert!(
        rogue_client.as_ref().is_none_or(|r| r.is_err()),
        "a client certificate from another CA is refused: {rogue_client:?}"
    );

    let m = scrape(weir.admin).await.unwrap();
    assert_eq!(metric(&m, "weir_grpc_publishes_denied_total"), 3.0, "{m}");
    assert!(
        m.contains("weir_grpc_calls_refused_total{reason=\"unknown_token\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("weir_grpc_calls_refused_total{reason=\"anonymous\"} 1"),
        "{m}"
    );
    assert!(
        metric(&m, "weir_tls_handshake_failures_total") >= 1.0,
        "{m}"
    );

    sigterm(weir.child.id());
    let status = tokio::time::timeout(PATIENCE, async {
        loop {
            if let Some(s) = weir.child.try_wait().unwrap() {
                return s;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap();
    assert!(status.success());
    let delivered: BTreeSet<String> = file_batch_payloads(&out)
        .into_iter()
        .map(|p| String::from_utf8(p).unwrap())
        .collect();
    let expected: BTreeSet<String> = ["gw1-ok", "gw1-stream", "gw2-ok"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(delivered, expected);
}
