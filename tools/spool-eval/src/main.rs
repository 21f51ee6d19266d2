//! spool-eval: compare candidate storage engines for weir's durable spool.
//!
//! See README.md. Every step prints exactly one `RESULT k=v ...` line on stdout;
//! `suite` runs each step in a child process (optionally under `strace -c` to count
//! every sync syscall, including those made by library background threads).

mod common;
#[cfg(feature = "fjall")]
mod fj;
mod own;
#[cfg(feature = "okaywal")]
mod owal;
#[cfg(feature = "redb")]
mod rdb;

use common::{Group, PayloadPool, Report};
use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

type Args = BTreeMap<String, String>;

fn parse_args(v: &[String]) -> Args {
    let mut m = Args::new();
    let mut i = 0;
    while i < v.len() {
        if let Some(k) = v[i].strip_prefix("--") {
            if i + 1 < v.len() && !v[i + 1].starts_with("--") {
                m.insert(k.to_string(), v[i + 1].clone());
                i += 2;
            } else {
                m.insert(k.to_string(), "1".to_string());
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    m
}

fn get<T: std::str::FromStr>(a: &Args, k: &str, d: T) -> T {
    a.get(k).and_then(|v| v.parse().ok()).unwrap_or(d)
}

fn req<'a>(a: &'a Args, k: &str) -> &'a str {
    a.get(k).map(String::as_str).unwrap_or_else(|| {
        eprintln!("missing --{k}");
        std::process::exit(2)
    })
}

const BACKENDS: &[&str] = &[
    "own",
    #[cfg(feature = "fjall")]
    "fjall",
    #[cfg(feature = "redb")]
    "redb",
    #[cfg(feature = "okaywal")]
    "okaywal",
];

enum Writer {
    Own(own::Writer),
    #[cfg(feature = "fjall")]
    Fjall(fj::Writer),
    #[cfg(feature = "redb")]
    Redb(rdb::Writer),
    #[cfg(feature = "okaywal")]
    Okaywal(owal::Writer),
}

impl Writer {
    fn open(backend: &str, dir: &Path) -> io::Result<Writer> {
        Ok(match backend {
            "own" => Writer::Own(own::Writer::open(dir, 0)?),
            #[cfg(feature = "fjall")]
            "fjall" => Writer::Fjall(fj::Writer::open(dir)?),
            #[cfg(feature = "redb")]
            "redb" => Writer::Redb(rdb::Writer::open(dir)?),
            #[cfg(feature = "okaywal")]
            "okaywal" => Writer::Okaywal(owal::Writer::open(dir)?),
            b => return Err(io::Error::other(format!("unknown/disabled backend {b}"))),
        })
    }
    fn commit_group(&mut self, g: &Group) -> io::Result<u64> {
        match self {
            Writer::Own(w) => w.commit_group(g),
            #[cfg(feature = "fjall")]
            Writer::Fjall(w) => w.commit_group(g),
            #[cfg(feature = "redb")]
            Writer::Redb(w) => w.commit_group(g),
            #[cfg(feature = "okaywal")]
            Writer::Okaywal(w) => w.commit_group(g),
        }
    }
    fn finish(self, rep: &mut Report) -> io::Result<()> {
        match self {
            Writer::Own(_) => {}
            #[cfg(feature = "fjall")]
            Writer::Fjall(w) => w.finish(rep)?,
            #[cfg(feature = "redb")]
            Writer::Redb(_) => {}
            #[cfg(feature = "okaywal")]
            Writer::Okaywal(w) => w.finish(),
        }
        let _ = rep;
        Ok(())
    }
}

fn replay_backend(backend: &str, dir: &Path, f: &mut dyn FnMut(u64, usize)) -> io::Result<(f64, u64)> {
    match backend {
        "own" => own::replay(dir, f),
        #[cfg(feature = "fjall")]
        "fjall" => fj::replay(dir, f),
        #[cfg(feature = "redb")]
        "redb" => rdb::replay(dir, f),
        #[cfg(feature = "okaywal")]
        "okaywal" => owal::replay(dir, f),
        b => Err(io::Error::other(format!("unknown/disabled backend {b}"))),
    }
}

fn release_backend(backend: &str, dir: &Path, upto: u64, chunk: u64, rep: &mut Report) -> io::Result<()> {
    match backend {
        "own" => own::release(dir, upto, chunk, rep),
        #[cfg(feature = "fjall")]
        "fjall" => fj::release(dir, upto, chunk, rep),
        #[cfg(feature = "redb")]
        "redb" => rdb::release(dir, upto, chunk, rep),
        #[cfg(feature = "okaywal")]
        "okaywal" => owal::release(dir, upto, chunk, rep),
        b => Err(io::Error::other(format!("unknown/disabled backend {b}"))),
    }
}

/// Sectors written to the block device holding `dir` (whole device, all processes).
fn dev_write_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/diskstats").unwrap_or_default();
    let dev = std::env::var("SPOOL_EVAL_DEV").unwrap_or_else(|_| "vda".into());
    for l in s.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() > 9 && f[2] == dev {
            return f[9].parse::<u64>().unwrap_or(0) * 512;
        }
    }
    0
}

fn cmd_append(a: &Args) -> io::Result<Report> {
    let backend = req(a, "backend").to_string();
    let dir = PathBuf::from(req(a, "dir"));
    let payload: usize = get(a, "payload", 256);
    let n: u64 = get(a, "records", 100_000);
    let group: usize = get(a, "group", 64);
    let producers: usize = get(a, "producers", 0);
    let max_group: usize = get(a, "max-group", 4096);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;

    let mut rep = Report::default();
    rep.add("step", "append");
    rep.add("backend", backend.as_str());
    rep.add("payload", payload);
    rep.add("records", n);
    rep.add("group", if producers > 0 { format!("q<={max_group}") } else { group.to_string() });
    rep.add("producers", producers);

    // Snapshot before open: okaywal zero-fills its preallocated segment at open.
    let io0 = common::proc_io();
    let dev0 = dev_write_bytes();
    let mut w = Writer::open(&backend, &dir)?;
    let t = Instant::now();
    let mut syncs = 0u64;
    let mut groups = 0u64;
    let mut lat = Vec::new();
    let mut g = Group::default();
    if producers == 0 {
        let pool = PayloadPool::new(payload, 42);
        let mut seq = 0u64;
        while seq < n {
            g.clear();
            g.first_seq = seq;
            let end = (seq + group as u64).min(n);
            for s in seq..end {
                common::encode(&mut g.buf, s, 7, common::now_nanos(), (s % 4) as u8, pool.get(s));
                g.push_end();
            }
            let tc = Instant::now();
            syncs += w.commit_group(&g)?;
            lat.push(tc.elapsed().as_secs_f64() * 1e3);
            groups += 1;
            seq = end;
        }
    } else {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(8192);
        let per = n / producers as u64;
        let mut handles = Vec::new();
        for p in 0..producers {
            let tx = tx.clone();
            let cnt = if p == producers - 1 { n - per * (producers as u64 - 1) } else { per };
            handles.push(std::thread::spawn(move || {
                let pool = PayloadPool::new(payload, 42 + p as u64);
                for i in 0..cnt {
                    let mut rec = Vec::with_capacity(payload + 64);
                    common::encode(&mut rec, 0, p as u64, common::now_nanos(), (i % 4) as u8, pool.get(i));
                    if tx.send(rec).is_err() {
                        break;
                    }
                }
            }));
        }
        drop(tx);
        let mut seq = 0u64;
        'outer: loop {
            g.clear();
            g.first_seq = seq;
            let first = match rx.recv() {
                Ok(r) => r,
                Err(_) => break 'outer,
            };
            let push = |g: &mut Group, mut r: Vec<u8>, seq: &mut u64| {
                common::set_seq(&mut r, *seq);
                *seq += 1;
                g.buf.extend_from_slice(&r);
                g.push_end();
            };
            push(&mut g, first, &mut seq);
            while g.len() < max_group {
                match rx.try_recv() {
                    Ok(r) => push(&mut g, r, &mut seq),
                    Err(_) => break,
                }
            }
            let tc = Instant::now();
            syncs += w.commit_group(&g)?;
            lat.push(tc.elapsed().as_secs_f64() * 1e3);
            groups += 1;
        }
        for h in handles {
            let _ = h.join();
        }
        assert_eq!(seq, n);
    }
    let secs_commit = t.elapsed().as_secs_f64();
    if a.contains_key("crash") {
        // Simulate kill -9 right after the last acknowledged commit: no close, no
        // background-flush wait, no destructors (main exits with process::exit).
        std::mem::forget(w);
        rep.add("exit", "unclean");
    } else {
        w.finish(&mut rep)?;
        rep.add("exit", "clean");
    }
    let secs = t.elapsed().as_secs_f64();
    let io1 = common::proc_io();
    let dev1 = dev_write_bytes();
    let payload_bytes = n * payload as u64;
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    rep.add("secs", secs_commit);
    rep.add("secs_incl_bg", secs);
    rep.add("rec_per_s", n as f64 / secs_commit);
    rep.add("payload_MBps", payload_bytes as f64 / 1e6 / secs_commit);
    rep.add("groups", groups);
    rep.add("avg_group", n as f64 / groups as f64);
    rep.add("our_syncs", syncs);
    rep.add("commit_p50_ms", common::percentile(&lat, 0.5));
    rep.add("commit_p99_ms", common::percentile(&lat, 0.99));
    let wb = io1.1 - io0.1;
    rep.add("write_bytes", wb);
    rep.add("wa_proc", wb as f64 / payload_bytes as f64);
    rep.add("wa_dev_noisy", (dev1 - dev0) as f64 / payload_bytes as f64);
    let du = common::du(&dir);
    rep.add("du", du);
    rep.add("du_per_payload", du as f64 / payload_bytes as f64);
    rep.add("apparent", common::apparent(&dir));
    rep.add("files", common::count_files(&dir));
    Ok(rep)
}

fn evict(dir: &Path) -> io::Result<()> {
    use std::os::unix::io::AsRawFd;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                evict(&p)?;
            } else if let Ok(f) = std::fs::File::open(&p) {
                let _ = f.sync_all();
                unsafe {
                    libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
                }
            }
        }
    }
    Ok(())
}

fn cmd_replay(a: &Args) -> io::Result<Report> {
    let backend = req(a, "backend").to_string();
    let dir = PathBuf::from(req(a, "dir"));
    let expect: u64 = get(a, "expect", 0);
    let cold = a.contains_key("cold") || a.contains_key("cold-label");
    if a.contains_key("cold") {
        evict(&dir)?;
    }
    let mut rep = Report::default();
    rep.add("step", "replay");
    rep.add("backend", backend.as_str());
    rep.add("cache", if cold { "cold(fadvise)" } else { "warm" });
    let io0 = common::proc_io();
    let t = Instant::now();
    let mut last: Option<u64> = None;
    let mut in_order = true;
    let mut pbytes = 0u64;
    let (open_secs, n) = replay_backend(&backend, &dir, &mut |seq, plen| {
        if let Some(l) = last {
            if seq <= l {
                in_order = false;
            }
        }
        last = Some(seq);
        pbytes += plen as u64;
    })?;
    let secs = t.elapsed().as_secs_f64();
    let io1 = common::proc_io();
    rep.add("records", n);
    rep.add("ok", if (expect == 0 || n == expect) && in_order { "yes" } else { "NO" });
    rep.add("open_secs", open_secs);
    rep.add("secs", secs);
    rep.add("rec_per_s", n as f64 / secs);
    rep.add("payload_MBps", pbytes as f64 / 1e6 / secs);
    rep.add("read_bytes", io1.0 - io0.0);
    Ok(rep)
}

fn cmd_release(a: &Args) -> io::Result<Report> {
    let backend = req(a, "backend").to_string();
    let dir = PathBuf::from(req(a, "dir"));
    let n: u64 = get(a, "records", 0);
    let chunk: u64 = get(a, "chunk", 4096);
    let mut rep = Report::default();
    rep.add("step", "release");
    rep.add("backend", backend.as_str());
    rep.add("released", n / 2);
    let du0 = common::du(&dir);
    rep.add("du_before", du0);
    let io0 = common::proc_io();
    release_backend(&backend, &dir, n / 2, chunk, &mut rep)?;
    let io1 = common::proc_io();
    let du1 = common::du(&dir);
    if !rep.0.iter().any(|(k, _)| k == "du_after_release_nocompact") {
        rep.add("du_after_release_nocompact", du1);
        rep.add("compact_secs", 0.0f64);
    }
    rep.add("du_after_compact", du1);
    rep.add("reclaimed_pct", 100.0 * (du0 as f64 - du1 as f64) / du0 as f64);
    rep.add("write_bytes", io1.1 - io0.1);
    Ok(rep)
}

fn cmd_fsync_lat(a: &Args) -> io::Result<Report> {
    use std::io::{Seek, SeekFrom};
    let dir = PathBuf::from(req(a, "dir"));
    let n: usize = get(a, "n", 1000);
    let size: usize = get(a, "size", 4096);
    std::fs::create_dir_all(&dir)?;
    let mut rep = Report::default();
    rep.add("step", "fsync-lat");
    rep.add("n", n);
    rep.add("size", size);
    let buf = vec![0xA5u8; size];
    // (1) append + sync_data (file grows: each sync also commits an inode size update)
    // (2) overwrite in place within a preallocated, already-synced file (pure data sync)
    for mode in ["append", "overwrite"] {
        let p = dir.join(format!("fsync-{mode}.dat"));
        let _ = std::fs::remove_file(&p);
        let mut f = std::fs::OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&p)?;
        if mode == "overwrite" {
            f.write_all(&vec![0u8; size * n])?;
            f.sync_all()?;
            f.seek(SeekFrom::Start(0))?;
        }
        let mut lat = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            f.write_all(&buf)?;
            f.sync_data()?;
            lat.push(t.elapsed().as_secs_f64() * 1e6);
        }
        lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
        rep.add(&format!("{mode}_p50_us"), common::percentile(&lat, 0.5));
        rep.add(&format!("{mode}_p90_us"), common::percentile(&lat, 0.9));
        rep.add(&format!("{mode}_p99_us"), common::percentile(&lat, 0.99));
        rep.add(&format!("{mode}_max_us"), *lat.last().unwrap());
        let _ = std::fs::remove_file(&p);
    }
    Ok(rep)
}

// ---------------------------------------------------------------- suite driver

struct Step {
    kv: BTreeMap<String, String>,
    order: Vec<String>,
}

fn run_child(args: &[String], strace: bool, tag: &str) -> io::Result<Step> {
    let exe = std::env::current_exe()?;
    let trace_file = std::env::temp_dir().join(format!("spool-eval-strace-{}-{tag}.txt", std::process::id()));
    // SPOOL_EVAL_RUNNER prefixes each child, e.g. "qemu-aarch64-static -L /usr/aarch64-linux-gnu"
    // to run a cross-built binary without binfmt_misc.
    let mut argv: Vec<std::ffi::OsString> = Vec::new();
    if strace {
        for a in ["strace", "-f", "-c", "-q", "--seccomp-bpf", "-e", "trace=fsync,fdatasync,sync_file_range,msync,syncfs", "-o"] {
            argv.push(a.into());
        }
        argv.push(trace_file.clone().into());
    }
    if let Ok(r) = std::env::var("SPOOL_EVAL_RUNNER") {
        argv.extend(r.split_whitespace().map(std::ffi::OsString::from));
    }
    argv.push(exe.into());
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    cmd.args(args);
    eprintln!("+ {}", args.join(" "));
    let out = cmd.output()?;
    io::stderr().write_all(&out.stderr)?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().find(|l| l.starts_with("RESULT")).ok_or_else(|| {
        io::Error::other(format!("step {tag} failed ({}): {stdout}", out.status))
    })?;
    eprintln!("{line}");
    let mut kv = BTreeMap::new();
    let mut order = Vec::new();
    for p in line.split_whitespace().skip(1) {
        if let Some((k, v)) = p.split_once('=') {
            kv.insert(k.to_string(), v.to_string());
            order.push(k.to_string());
        }
    }
    if strace {
        // strace -c table: "% time seconds usecs/call calls errors syscall"
        let s = std::fs::read_to_string(&trace_file).unwrap_or_default();
        let mut by = Vec::new();
        let mut total = 0u64;
        for l in s.lines() {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() >= 5 && f[0].parse::<f64>().is_ok() {
                let name = *f.last().unwrap();
                if name == "total" {
                    continue;
                }
                let calls: u64 = f[3].parse().unwrap_or(0);
                total += calls;
                by.push(format!("{name}:{calls}"));
            }
        }
        let _ = std::fs::remove_file(&trace_file);
        kv.insert("all_syncs".into(), total.to_string());
        kv.insert("sync_detail".into(), by.join(","));
        order.push("all_syncs".into());
        order.push("sync_detail".into());
    }
    Ok(Step { kv, order })
}

/// Runs a step `repeat` times; returns the run with the median records/s, annotated
/// with the min and max records/s over all runs.
fn run_median(args: &[String], strace: bool, tag: &str, repeat: usize) -> io::Result<Step> {
    let mut runs = Vec::new();
    for _ in 0..repeat.max(1) {
        runs.push(run_child(args, strace, tag)?);
    }
    Ok(median_of(runs))
}

fn median_of(mut runs: Vec<Step>) -> Step {
    let repeat = runs.len();
    let rate = |st: &Step| st.kv.get("rec_per_s").and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    runs.sort_by(|a, b| rate(a).partial_cmp(&rate(b)).unwrap());
    let (lo, hi) = (rate(&runs[0]), rate(&runs[runs.len() - 1]));
    let mut st = runs.swap_remove(runs.len() / 2);
    st.kv.insert("runs".into(), repeat.max(1).to_string());
    st.kv.insert("rec_per_s_min".into(), format!("{lo:.0}"));
    st.kv.insert("rec_per_s_max".into(), format!("{hi:.0}"));
    for k in ["runs", "rec_per_s_min", "rec_per_s_max"] {
        if !st.order.iter().any(|o| o == k) {
            st.order.push(k.into());
        }
    }
    st
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

fn fmt_f(st: &Step, k: &str, prec: usize) -> String {
    st.kv
        .get(k)
        .and_then(|v| v.parse::<f64>().ok())
        .map(|x| format!("{x:.prec$}"))
        .unwrap_or_else(|| "-".into())
}

fn fmt_mib(st: &Step, k: &str) -> String {
    st.kv
        .get(k)
        .and_then(|v| v.parse::<f64>().ok())
        .map(|x| format!("{:.1}", x / 1048576.0))
        .unwrap_or_else(|| "-".into())
}

fn g(st: &Step, k: &str) -> String {
    st.kv.get(k).cloned().unwrap_or_else(|| "-".into())
}

fn cmd_suite(a: &Args) -> io::Result<()> {
    let base = PathBuf::from(a.get("dir").cloned().unwrap_or_else(|| "/work/spool-eval-data".into()));
    let mib: u64 = get(a, "mib", 256);
    let strace = !a.contains_key("no-strace");
    let backends: Vec<String> = a
        .get("backends")
        .map(|b| b.split(',').map(str::to_string).collect())
        .unwrap_or_else(|| BACKENDS.iter().map(|x| x.to_string()).collect());
    let payloads: Vec<usize> =
        a.get("payloads").map(|p| p.split(',').filter_map(|x| x.parse().ok()).collect()).unwrap_or(vec![256, 1024]);
    let groups: Vec<usize> =
        a.get("groups").map(|p| p.split(',').filter_map(|x| x.parse().ok()).collect()).unwrap_or(vec![64, 512]);
    let producers: usize = get(a, "producers", 4);
    let repeat: usize = get(a, "repeat", 1);
    let out = a.get("out").cloned();
    std::fs::create_dir_all(&base)?;

    let mut appends: Vec<Step> = Vec::new();
    let mut replays: Vec<(String, usize, Step)> = Vec::new();
    let mut releases: Vec<(String, usize, Step)> = Vec::new();
    let mut crashes: Vec<(String, usize, Step)> = Vec::new();
    let mut crash_replays: Vec<(String, usize, Step)> = Vec::new();

    let lat = run_child(&s(&["fsync-lat", "--dir", base.to_str().unwrap()]), false, "lat")?;

    for &payload in &payloads {
        let n = (mib << 20) / payload as u64;
        let ns = n.to_string();
        let ps = payload.to_string();
        for b in &backends {
            let keep_group = *groups.last().unwrap();
            for &grp in &groups {
                let d = base.join(format!("{b}-{payload}-g{grp}"));
                let ds = d.to_str().unwrap().to_string();
                let st = run_median(
                    &[
                        s(&["append", "--backend", b, "--dir", &ds, "--payload", &ps, "--records", &ns]),
                        s(&["--group", &grp.to_string()]),
                    ]
                    .concat(),
                    strace,
                    "append",
                    repeat,
                )?;
                appends.push(st);
                if grp == keep_group {
                    // cold-ish replay, then warm replay, then release of the first half.
                    // Cold: evict the pages in an untraced child first (its syncs are not
                    // counted), then replay with `--cold` only as a label.
                    let mut runs = Vec::new();
                    for _ in 0..repeat.max(1) {
                        run_child(&s(&["evict", "--dir", &ds]), false, "evict")?;
                        runs.push(run_median(
                            &s(&["replay", "--backend", b, "--dir", &ds, "--expect", &ns, "--cold-label"]),
                            strace,
                            "replay",
                            1,
                        )?);
                    }
                    let st = median_of(runs);
                    replays.push((b.clone(), payload, st));
                    let st = run_median(
                        &s(&["replay", "--backend", b, "--dir", &ds, "--expect", &ns]),
                        strace,
                        "replay",
                        repeat,
                    )?;
                    replays.push((b.clone(), payload, st));
                    let st =
                        run_child(&s(&["release", "--backend", b, "--dir", &ds, "--records", &ns]), strace, "release")?;
                    releases.push((b.clone(), payload, st));
                }
                let _ = std::fs::remove_dir_all(&d);
            }
            if !a.contains_key("no-crash") {
                // Unclean exit after the last commit, then recovery + replay in a fresh process.
                let d = base.join(format!("{b}-{payload}-crash"));
                let ds = d.to_str().unwrap().to_string();
                let grp = groups.last().unwrap().to_string();
                let st = run_child(
                    &s(&["append", "--backend", b, "--dir", &ds, "--payload", &ps, "--records", &ns, "--group", &grp, "--crash"]),
                    strace,
                    "append",
                )?;
                crashes.push((b.clone(), payload, st));
                run_child(&s(&["evict", "--dir", &ds]), false, "evict")?;
                let st = run_child(
                    &s(&["replay", "--backend", b, "--dir", &ds, "--expect", &ns, "--cold-label"]),
                    strace,
                    "replay",
                )?;
                crash_replays.push((b.clone(), payload, st));
                let _ = std::fs::remove_dir_all(&d);
            }
            if producers > 0 {
                let d = base.join(format!("{b}-{payload}-conc"));
                let ds = d.to_str().unwrap().to_string();
                let st = run_median(
                    &[
                        s(&["append", "--backend", b, "--dir", &ds, "--payload", &ps, "--records", &ns]),
                        s(&["--producers", &producers.to_string()]),
                    ]
                    .concat(),
                    strace,
                    "append",
                    repeat,
                )?;
                appends.push(st);
                let _ = std::fs::remove_dir_all(&d);
            }
        }
    }

    let mut md = String::new();
    md.push_str(&format!(
        "## fdatasync latency (4 KiB write + sync_data, n={})\n\n| mode | p50 µs | p90 µs | p99 µs | max µs |\n|---|---|---|---|---|\n",
        g(&lat, "n")
    ));
    for m in ["append", "overwrite"] {
        md.push_str(&format!(
            "| {m} | {} | {} | {} | {} |\n",
            fmt_f(&lat, &format!("{m}_p50_us"), 0),
            fmt_f(&lat, &format!("{m}_p90_us"), 0),
            fmt_f(&lat, &format!("{m}_p99_us"), 0),
            fmt_f(&lat, &format!("{m}_max_us"), 0)
        ));
    }
    md.push_str(&format!("\n## Append ({mib} MiB payload per run)\n\n"));
    md.push_str("| backend | payload | group | producers | records/s (median) | min–max records/s | payload MB/s | commits | our syncs | all sync syscalls | commit p50 ms | p99 ms | WA (proc write_bytes/payload) | WA (device, noisy) | du MiB | du/payload | files |\n");
    md.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for st in &appends {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {}–{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            g(st, "backend"),
            g(st, "payload"),
            g(st, "group"),
            g(st, "producers"),
            fmt_f(st, "rec_per_s", 0),
            g(st, "rec_per_s_min"),
            g(st, "rec_per_s_max"),
            fmt_f(st, "payload_MBps", 1),
            g(st, "groups"),
            g(st, "our_syncs"),
            g(st, "all_syncs"),
            fmt_f(st, "commit_p50_ms", 2),
            fmt_f(st, "commit_p99_ms", 2),
            fmt_f(st, "wa_proc", 2),
            fmt_f(st, "wa_dev_noisy", 2),
            fmt_mib(st, "du"),
            fmt_f(st, "du_per_payload", 2),
            g(st, "files"),
        ));
    }
    md.push_str("\n## Replay (fresh process; cold = pages dropped with posix_fadvise(DONTNEED))\n\n");
    md.push_str("| backend | payload | cache | records | ok | open/recover s | total s | records/s | payload MB/s | read MiB |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for (b, p, st) in &replays {
        md.push_str(&format!(
            "| {b} | {p} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            g(st, "cache"),
            g(st, "records"),
            g(st, "ok"),
            fmt_f(st, "open_secs", 3),
            fmt_f(st, "secs", 3),
            fmt_f(st, "rec_per_s", 0),
            fmt_f(st, "payload_MBps", 1),
            fmt_mib(st, "read_bytes")
        ));
    }
    md.push_str("\n## Recovery after an unclean exit (process ends right after the last commit, no close)\n\n");
    md.push_str("| backend | payload | records | ok | open/recover s | total replay s | records/s | read MiB | sync syscalls during recovery |\n|---|---|---|---|---|---|---|---|---|\n");
    for (b, p, st) in &crash_replays {
        md.push_str(&format!(
            "| {b} | {p} | {} | {} | {} | {} | {} | {} | {} |\n",
            g(st, "records"),
            g(st, "ok"),
            fmt_f(st, "open_secs", 3),
            fmt_f(st, "secs", 3),
            fmt_f(st, "rec_per_s", 0),
            fmt_mib(st, "read_bytes"),
            g(st, "all_syncs"),
        ));
    }
    md.push_str("\n## Release first half (FIFO)\n\n");
    md.push_str("| backend | payload | release s | du before MiB | du after release MiB | compaction s | du after compaction MiB | reclaimed % | written MiB | sync syscalls |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for (b, p, st) in &releases {
        md.push_str(&format!(
            "| {b} | {p} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            fmt_f(st, "release_secs", 3),
            fmt_mib(st, "du_before"),
            fmt_mib(st, "du_after_release_nocompact"),
            fmt_f(st, "compact_secs", 3),
            fmt_mib(st, "du_after_compact"),
            fmt_f(st, "reclaimed_pct", 1),
            fmt_mib(st, "write_bytes"),
            g(st, "all_syncs"),
        ));
    }
    md.push_str("\n## Raw results\n\n```\n");
    for st in appends
        .iter()
        .chain(replays.iter().map(|x| &x.2))
        .chain(crashes.iter().map(|x| &x.2))
        .chain(crash_replays.iter().map(|x| &x.2))
        .chain(releases.iter().map(|x| &x.2))
    {
        let line: Vec<String> = st.order.iter().map(|k| format!("{k}={}", st.kv[k])).collect();
        md.push_str(&line.join(" "));
        md.push('\n');
    }
    md.push_str("```\n");
    println!("{md}");
    if let Some(o) = out {
        std::fs::write(o, &md)?;
    }
    Ok(())
}

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    let sub = argv.get(1).map(String::as_str).unwrap_or("help");
    let a = parse_args(&argv[2.min(argv.len())..]);
    let r = match sub {
        "append" => cmd_append(&a).map(|r| println!("{}", r.line())),
        "replay" => cmd_replay(&a).map(|r| println!("{}", r.line())),
        "release" => cmd_release(&a).map(|r| println!("{}", r.line())),
        "fsync-lat" => cmd_fsync_lat(&a).map(|r| println!("{}", r.line())),
        "evict" => evict(Path::new(req(&a, "dir"))).map(|()| println!("RESULT step=evict")),
        "suite" => cmd_suite(&a),
        _ => {
            eprintln!(
                "usage: spool-eval <suite|append|replay|release|fsync-lat> [--dir D] ...\n\
                 backends compiled in: {BACKENDS:?}\nsee README.md"
            );
            std::process::exit(2);
        }
    };
    let _ = io::stdout().flush();
    match r {
        // Exit without running destructors: okaywal's checkpoint thread may be parked.
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1)
        }
    }
}
