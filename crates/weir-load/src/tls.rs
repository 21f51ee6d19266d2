//! MQTT over TLS against plain TCP (`weir-load tls`): the throughput of
//! each through the same weir build, alternated in one run, and TLS
//! handshakes per second, over the run's PKI (`pki.rs`).

use std::time::Duration;

use serde::Serialize;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::child::Weir;
use crate::cli::{ThroughputArgs, TlsArgs};
use crate::mqtt::{mqtt_connect, tls_handshake};
use crate::pki::Pki;
use crate::report::{machine_info, MachineInfo, ThroughputReport};
use crate::shared::{unique, Env};
use crate::throughput::throughput;

/// What `weir-load tls` reports.
#[derive(Serialize)]
pub struct TlsReport {
    pub kind: &'static str,
    pub machine: MachineInfo,
    pub params: TlsArgs,
    /// Records/s delivered, per round, over plain TCP.
    pub plain_per_sec: Vec<f64>,
    /// Records/s delivered, per round, over TLS.
    pub tls_per_sec: Vec<f64>,
    /// Median TLS / median plain.
    pub ratio: f64,
    /// New connections per second (TCP connect, MQTT CONNECT/CONNACK,
    /// DISCONNECT), plain.
    pub plain_connects_per_sec: f64,
    /// The same with a full TLS handshake each (no session resumption).
    pub tls_handshakes_per_sec: f64,
    /// weir's CPU per TLS connection, ms (its utime+stime over the
    /// handshake run / connections).
    pub weir_cpu_ms_per_tls_connection: f64,
    pub runs: Vec<ThroughputReport>,
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Plain and TLS throughput alternated `rounds` times, then connection
/// rates.
pub async fn tls(env: &Env, a: &TlsArgs) -> anyhow::Result<TlsReport> {
    let mut plain = Vec::new();
    let mut over_tls = Vec::new();
    let mut runs = Vec::new();
    for round in 0..a.rounds {
        for with_tls in [false, true] {
            let args = ThroughputArgs {
                tls: with_tls,
                ..a.throughput.clone()
            };
            eprintln!(
                "round {}/{}: {}",
                round + 1,
                a.rounds,
                if with_tls { "TLS" } else { "plain TCP" }
            );
            let r = throughput(env, &args).await?;
            if with_tls {
                over_tls.push(r.consumed_per_sec);
            } else {
                plain.push(r.consumed_per_sec);
            }
            runs.push(r);
        }
    }
    let (plain_connects_per_sec, _) = connection_rate(env, a, false).await?;
    let (tls_handshakes_per_sec, cpu_ms) = connection_rate(env, a, true).await?;
    Ok(TlsReport {
        kind: "tls",
        machine: machine_info(),
        params: a.clone(),
        ratio: median(&over_tls) / median(&plain).max(1e-9),
        plain_per_sec: plain,
        tls_per_sec: over_tls,
        plain_connects_per_sec,
        tls_handshakes_per_sec,
        weir_cpu_ms_per_tls_connection: cpu_ms,
        runs,
    })
}

/// Connections per second that `a.handshake_clients` clients open, each
/// in a loop of TCP connect, TLS handshake (when `with_tls`), CONNECT,
/// CONNACK, DISCONNECT; and weir's CPU ms per connection.
async fn connection_rate(env: &Env, a: &TlsArgs, with_tls: bool) -> anyhow::Result<(f64, f64)> {
    let name = unique(if with_tls { "hs-tls" } else { "hs-plain" });
    let dir = std::env::temp_dir().join(format!("{name}-pki"));
    let pki = Pki::create(&dir)?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut cfg = a.throughput.weir_config.clone();
    cfg.set.extend(pki.weir_settings(port));
    let weir = Weir::start(env, &name, &cfg).await?;
    let addr = if with_tls {
        format!("127.0.0.1:{port}").parse()?
    } else {
        weir.mqtt
    };
    // Both listeners are bound before weir answers on its plain port.
    let client = pki.client_config()?;
    let cpu_before = crate::sample::cpu_ticks(weir.pid).unwrap_or(0);
    let until = Instant::now() + Duration::from_secs(a.handshake_seconds);
    let started = Instant::now();
    let tasks: Vec<_> = (0..a.handshake_clients)
        .map(|i| {
            let client = client.clone();
            let name = name.clone();
            tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < until {
                    let tcp = TcpStream::connect(addr).await?;
                    tcp.set_nodelay(true)?;
                    let id = format!("{name}-{i}-{n}");
                    if with_tls {
                        let mut s = tls_handshake(tcp, client.clone()).await?;
                        mqtt_connect(&mut s, &id).await?;
                    } else {
                        let mut s = tcp;
                        mqtt_connect(&mut s, &id).await?;
                    }
                    n += 1;
                }
                anyhow::Ok(n)
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    let secs = started.elapsed().as_secs_f64();
    let cpu_after = crate::sample::cpu_ticks(weir.pid).unwrap_or(0);
    weir.stop(env.keep).await?;
    let _ = std::fs::remove_dir_all(&dir);
    let cpu_ms = (cpu_after - cpu_before) as f64 * 1000.0 / env.clk_tck;
    Ok((total as f64 / secs, cpu_ms / total.max(1) as f64))
}

pub fn print_tls(r: &TlsReport) {
    let fmt = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "MQTT QoS 1, {} B, {} connections, window {}:",
        r.params.throughput.size, r.params.throughput.connections, r.params.throughput.window
    );
    println!(
        "  plain TCP  records/s delivered: {}",
        fmt(&r.plain_per_sec)
    );
    println!("  TLS        records/s delivered: {}", fmt(&r.tls_per_sec));
    println!("  TLS / plain (medians): {:.1} %", r.ratio * 100.0);
    println!(
        "new connections/s with {} clients: plain {:.0}, TLS (full handshake) {:.0}; weir CPU {:.2} ms per TLS connection",
        r.params.handshake_clients,
        r.plain_connects_per_sec,
        r.tls_handshakes_per_sec,
        r.weir_cpu_ms_per_tls_connection
    );
}
