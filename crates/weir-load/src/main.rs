//! `weir-load`: the load tool behind weir's relay figures (docs/benchmarks.md).
//!
//! It runs the real `weir` binary as a child process (MQTT listen mode, AMQP
//! egress to the local RabbitMQ with publisher confirms), drives it over
//! MQTT, consumes its batches back from RabbitMQ, and reports what the
//! issue asks for: records per second, latency against publishing straight
//! to RabbitMQ, resident memory idle and under load, and where the CPU goes.
//!
//! # Layout
//! - `throughput`: C MQTT connections publish QoS 1 as fast as weir
//!   acknowledges (a window of in-flight publishes each), or at `--rate`; a
//!   lapin consumer decodes the batches and counts records; `/proc` and
//!   weir's admin `/metrics` are sampled over the steady part.
//! - `latency`: a paced stream of `ls` records with the send time in the
//!   payload, through weir, then the same stream published straight to
//!   RabbitMQ (confirms on, persistent, one message per record); both are
//!   consumed the same way and compared. `--rounds` alternates the two so
//!   that noise from other programs on a shared machine falls on both.
//! - The generated weir config sets only what the figures need (loopback
//!   listeners, AMQP egress, a 10 Gbit/s uplink so token buckets never
//!   limit, batch limits); `--set table.key=value` changes anything else.
//! - The publisher is lean on purpose (rumqttc's MQTT 3.1.1 codec over a
//!   `TcpStream`, many publishes per write), because weir, RabbitMQ and this
//!   tool share the machine's cores; the report shows this tool's CPU per
//!   thread so that one can check it is not the bottleneck.
//! - Publisher and consumer each run on their own thread and single-threaded
//!   runtime (`load-pub`, `load-con`), so `/proc/self/task` attributes CPU.
//!
//! Every payload starts with the send time (microseconds since the Unix
//! epoch, little endian) and a load-wide sequence number; the consumer
//! uses the first for latency and the second to check that every
//! acknowledged record arrived (and how many arrived twice). The rest is
//! random bytes by default, so that weir's compression gains nothing it
//! would not gain on real data.
//!
//! Results and how to read them: `docs/benchmarks.md`.
//!
//! # Modules
//! - `cli`: the command line.
//! - `recovery`: the spool filled during an outage, SIGKILL, restart.
//! - `contention`: the class bounds with busy processes beside weir.
//! - `offer`: a lab's devices, per-class rates at a weir someone else
//!   started (`weir-lab cluster` runs one per node).
//! - `throughput`, `latency`: the two runs; `run`: the steps they share.
//! - `child`: the weir child process and its generated config.
//! - `broker`: the same MQTT load at another broker or a weir you started;
//!   `grpc`: that load shape over weir's gRPC ingress.
//! - `mqtt`: the MQTT publisher; `amqp`: the consumer, the direct
//!   publisher and the clean-up of queues; `pacer`: paced sends.
//! - `stamp`: the payload (stamp and filler) and its clock.
//! - `sample`: `/proc` and weir's `/metrics`; `report`: the figures (the
//!   `--json` file); `print`: the figures as text.
//! - `shared`: the run's environment, counters, names, threads.

mod amqp;
mod broker;
mod child;
mod cli;
mod contention;
mod grpc;
mod kafka;
mod latency;
mod mqtt;
mod mqtt_out;
mod offer;
mod pacer;
mod pki;
mod print;
mod priority;
mod recovery;
mod report;
mod run;
mod sample;
mod shared;
mod stamp;
mod throughput;
mod tls;

use anyhow::Context;
use clap::Parser;

use crate::cli::{Cli, Cmd, PayloadKind};
use crate::latency::latency;
use crate::print::{print_latency, print_throughput};
use crate::sample::clk_tck;
use crate::shared::Env;
use crate::stamp::init_random_filler;
use crate::throughput::throughput;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if cli.payload == PayloadKind::Random {
        init_random_filler();
    }
    let weir_bin = match &cli.weir {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .context("cannot find this executable's path; pass --weir")?
            .with_file_name("weir"),
    };
    let env = Env {
        weir_bin,
        amqp: cli.amqp.clone(),
        amqp_urls: cli.amqp_urls.clone(),
        queue_type: cli.queue_type,
        kafka: cli.kafka.clone(),
        mqtt_egress: cli.mqtt_egress,
        keep: cli.keep,
        clk_tck: clk_tck(),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the control runtime")?;
    let json = match &cli.command {
        Cmd::Throughput(a) => {
            let r = rt.block_on(throughput(&env, a))?;
            print_throughput(&r);
            serde_json::to_string_pretty(&r)?
        }
        Cmd::Latency(a) => {
            let r = rt.block_on(latency(&env, a))?;
            print_latency(&r);
            serde_json::to_string_pretty(&r)?
        }
        Cmd::Tls(a) => {
            let r = rt.block_on(crate::tls::tls(&env, a))?;
            crate::tls::print_tls(&r);
            serde_json::to_string_pretty(&r)?
        }
        Cmd::Recovery(a) => {
            let r = rt.block_on(crate::recovery::recovery(&env, a))?;
            crate::recovery::print_recovery(&r);
            serde_json::to_string_pretty(&r)?
        }
        Cmd::Contention(a) => {
            let r = rt.block_on(crate::contention::contention(&env, a))?;
            serde_json::to_string_pretty(&r)?
        }
        Cmd::Offer(a) => {
            let r = rt.block_on(crate::offer::offer(a))?;
            crate::offer::print_offer(&r);
            serde_json::to_string_pretty(&r)?
        }
        Cmd::Broker(a) => {
            let r = rt.block_on(crate::broker::broker(a, env.clk_tck))?;
            crate::broker::print_broker(&r);
            serde_json::to_string_pretty(&r)?
        }
        Cmd::Grpc(a) => {
            let r = rt.block_on(crate::grpc::grpc(a, env.clk_tck))?;
            crate::broker::print_broker(&r);
            serde_json::to_string_pretty(&r)?
        }
    };
    if let Some(path) = &cli.json {
        std::fs::write(path, json + "\n")
            .with_context(|| format!("writing the JSON report to {}", path.display()))?;
    }
    Ok(())
}
