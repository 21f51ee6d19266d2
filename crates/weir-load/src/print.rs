//! The reports as text on stdout, next to the goals.

use std::collections::BTreeMap;

use crate::report::{CpuReport, Integrity, LatencyReport, Percentiles, ThroughputReport};

/// The goals, printed next to the figures.
const GOAL_RECORDS_PER_SEC: f64 = 50_000.0;

/// p99 latency weir may add over publishing straight to RabbitMQ, ms.
const GOAL_ADDED_P99_MS: f64 = 2.0;

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn print_cpu(cpu: &CpuReport, per_record: bool) {
    let threads = |m: &BTreeMap<String, f64>| {
        m.iter()
            .map(|(k, v)| format!("{k} {v:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if per_record {
        println!(
            "  weir CPU                       {:.2} cores, {:.1} us/record  [{}]",
            cpu.weir_cores,
            cpu.weir_us_per_record,
            threads(&cpu.weir_threads)
        );
        println!(
            "  RabbitMQ CPU (beam.smp)        {:.2} cores, {:.1} us/record",
            cpu.rabbitmq_cores, cpu.rabbitmq_us_per_record
        );
    } else {
        println!(
            "  weir CPU                       {:.2} cores  [{}]",
            cpu.weir_cores,
            threads(&cpu.weir_threads)
        );
        println!(
            "  RabbitMQ CPU (beam.smp)        {:.2} cores",
            cpu.rabbitmq_cores
        );
    }
    println!(
        "  load tool CPU                  [{}]",
        threads(&cpu.tool_threads)
    );
    println!(
        "  machine CPU busy               {:.0}%  (other processes {:.2} cores)",
        cpu.machine_busy * 100.0,
        cpu.other_cores
    );
}

/// The `--set` options of a run, for its header line.
fn settings(set: &[String]) -> String {
    set.iter().map(|s| format!("; --set {s}")).collect()
}

fn print_integrity(i: &Integrity) {
    println!(
        "  integrity                      acked {}, consumed {} (unique {}, duplicates {}, lost {})",
        i.acked, i.consumed, i.unique, i.duplicates, i.lost
    );
}

pub fn print_throughput(r: &ThroughputReport) {
    let p = &r.params;
    println!(
        "throughput: {} MQTT connection(s) x window {}, {}-byte records, QoS 1, class {}, {}; {} s measured after {} s warm-up",
        p.connections,
        p.window,
        p.size,
        p.class.name(),
        p.rate
            .map_or("unpaced".to_string(), |r| format!("paced at {r:.0}/s")),
        p.seconds,
        p.warmup
    );
    println!(
        "  {}{}; {} payloads; machine: {} x {}",
        config_label(&p.weir_config),
        settings(&p.weir_config.set),
        r.payload,
        r.machine.nproc,
        r.machine.cpu_model
    );
    println!(
        "  records/s at consumer          {:>10.0}   (goal >= {:.0})",
        r.consumed_per_sec, GOAL_RECORDS_PER_SEC
    );
    println!("  PUBACKs/s at publisher         {:>10.0}", r.acked_per_sec);
    println!(
        "  batches/s                      {:>10.1}   mean {:.1} records, {:.0} bytes per batch",
        r.batches_per_sec, r.records_per_batch, r.bytes_per_batch
    );
    println!("  pushes back-pressured          {:>10}", r.backpressured);
    println!(
        "  disk written per payload byte  {:>10.3}",
        r.disk_bytes_per_payload_byte
    );
    if r.spool_syncs_per_sec > 0.0 {
        println!(
            "  spool segment bytes per payload byte {:>4.3}   {:.0} syncs/s",
            r.segment_bytes_per_payload_byte, r.spool_syncs_per_sec
        );
    }
    println!(
        "  weir RSS start / idle          {} / {}",
        mib(r.weir_rss_start_kib),
        mib(r.weir_rss_idle_kib)
    );
    println!(
        "  weir RSS under load mean/peak  {} / {}   (VmHWM {})",
        mib(r.weir_rss_load_mean_kib),
        mib(r.weir_rss_load_peak_kib),
        mib(r.weir_rss_hwm_kib)
    );
    print_cpu(&r.cpu, true);
    let l = &r.latency_under_load_ms;
    println!(
        "  latency under this load (ms)   p50 {:.2}  p99 {:.2}  max {:.2}",
        l.p50, l.p99, l.max
    );
    let l = &r.ack_latency_ms;
    println!(
        "  PUBLISH to PUBACK (ms)         p50 {:.2}  p99 {:.2}  max {:.2}",
        l.p50, l.p99, l.max
    );
    let c = &r.egress_cycle_ms;
    println!(
        "  egress cycle per batch (ms)    p50 {:.2}  p99 {:.2}  max {:.2}",
        c.p50, c.p99, c.max
    );
    print_integrity(&r.integrity);
}

pub fn print_latency(r: &LatencyReport) {
    let p = &r.params;
    println!(
        "latency: {}-byte ls records at {:.0}/s ({:?} pacing), QoS 1 vs AMQP confirms; {} round(s) of {} s measured after {} s warm-up per side",
        p.size, p.rate, p.pacing, p.rounds, p.seconds, p.warmup
    );
    println!(
        "  {} payloads{}; machine: {} x {}",
        r.payload,
        settings(&p.weir_config.set),
        r.machine.nproc,
        r.machine.cpu_model
    );
    println!(
        "  {:<28} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8}   (ms, all rounds)",
        "", "n", "p50", "p90", "p99", "p99.9", "max"
    );
    let row = |name: &str, q: &Percentiles| {
        println!(
            "  {:<28} {:>7} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
            name, q.n, q.p50, q.p90, q.p99, q.p999, q.max
        );
    };
    if let Some(w) = &r.weir {
        row("via weir (send -> consume)", &w.end_to_end_ms);
        let legs = [
            ("  send -> weir ingress", &w.to_ingress_ms),
            ("  weir ingress -> consume", &w.ingress_to_consumer_ms),
            ("    in class queue", &w.queue_wait_ms),
            ("    batch encoded -> consume", &w.batch_to_consumer_ms),
            ("  egress cycle (per batch)", &w.egress_cycle_ms),
        ];
        for (name, q) in legs {
            if let Some(q) = q {
                row(name, q);
            }
        }
    }
    if let Some(d) = &r.direct {
        row("direct to RabbitMQ", &d.end_to_end_ms);
        if let Some(q) = &d.confirm_ms {
            row("  publish -> confirm", q);
        }
    }
    if let Some(added) = r.added_p99_ms {
        println!(
            "  added by weir: p99 {:.2} ms (goal <= {:.1} ms), p50 {:.2} ms",
            added,
            GOAL_ADDED_P99_MS,
            r.added_p50_ms.unwrap_or(f64::NAN)
        );
    }
    for (i, round) in r.rounds.iter().enumerate() {
        for (name, side) in [("weir", &round.weir), ("direct", &round.direct)] {
            let Some(s) = side else { continue };
            let q = &s.latency.end_to_end_ms;
            println!(
                "  round {} {name:<6}: p50 {:.2} p99 {:.2} max {:.2} ms; {:.0}/s, {:.1} rec/msg; CPU weir {:.2}, RabbitMQ {:.2}, tool {:.2}, other {:.2} cores{}; {}",
                i + 1,
                q.p50,
                q.p99,
                q.max,
                s.sent_per_sec,
                s.records_per_message,
                s.cpu.weir_cores,
                s.cpu.rabbitmq_cores,
                s.cpu.tool_threads.values().sum::<f64>(),
                s.cpu.other_cores,
                s.weir_rss_mean_kib
                    .map_or(String::new(), |k| format!(", weir RSS {}", mib(k))),
                if s.integrity.lost == 0 && s.integrity.duplicates == 0 {
                    format!("all {} arrived once", s.integrity.acked)
                } else {
                    format!(
                        "LOST {} DUPLICATED {} of {}",
                        s.integrity.lost, s.integrity.duplicates, s.integrity.acked
                    )
                }
            );
        }
    }
}

/// "weir's default config", or the tuned batch limits.
pub fn config_label(c: &crate::cli::WeirArgs) -> String {
    match (&c.max_batch_bytes, c.max_batch_records) {
        (None, None) => "weir's default config".to_string(),
        (bytes, records) => format!(
            "TUNED: batch limits {} records / {}, burst the same, uplink 10Gbit/s",
            records.unwrap_or(1024),
            bytes.as_deref().unwrap_or("1MiB")
        ),
    }
}
