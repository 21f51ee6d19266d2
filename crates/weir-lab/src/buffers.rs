//! `weir-lab buffers`: seed 004, sizing the output buffer of an IoT edge
//! router (Khan, Shahzad and Butt, EdgeSys 2018), with real TCP flows over
//! a shaped link.
//!
//! The paper's setup (Section 5, NS-3): `n` IoT devices, one TCP Reno flow
//! each, through an edge router whose access link runs at 40 Mbit/s; MTU
//! 1500; 20 us from the devices to the router, 20 ms from the router to the
//! server; each device hands MTU - 40 = 1460-byte messages to TCP with
//! exponentially distributed gaps at `40/n` Mbit/s, so the link is just
//! congested. Buffers from Eq. 5, Appenzeller's `C T / sqrt(n)` and others;
//! link utilisation, queuing delay, loss and goodput per size.
//!
//! Here, four network namespaces the lab creates, joined by veth pairs:
//!
//! ```text
//! devices (n flows) -> router (tc tbf: the access link, its limit the buffer)
//!     -> wan (a TUN delay line, 20 ms each way) -> server
//! ```
//!
//! - The buffer is the router's drop-tail queue: `tbf`'s `limit`, in bytes,
//!   on the interface towards the wan. Its rate is 40 Mbit/s of IP packets
//!   (tbf also charges the 14-byte Ethernet header, so its rate is set
//!   1514/1500 higher, and the limit likewise).
//! - The 20 ms is a packet-level delay line (netem is not available here):
//!   a TUN device in the wan namespace that this process reads, holds each
//!   packet for the delay, and writes back, both directions; policy routing
//!   sends what arrives from either veth through it. TCP sees the delay on
//!   every packet, ACKs included, as it would on a long link.
//! - The devices' namespace runs Reno (`tcp_congestion_control`), without
//!   SACK or timestamps (Reno as the model assumes: one loss recovered per
//!   RTT; MSS 1460), no cached metrics (every new connection starts in slow
//!   start), one segment per packet (`gso_max_segs 1`), and a 128 KiB
//!   send buffer (NS-3's default).
//! - Short flows: a share `1 - alpha` of the devices close their connection
//!   when their application has nothing to send for twice the mean gap and
//!   open a new one for the next message (the paper's Section 3 rule for a
//!   device going to sleep); the rest keep one connection, long flows.
//!
//! Measured in a window after a warm-up: utilisation (bytes `tbf` sent over
//! what the rate allows), loss (`tbf`'s drops over packets offered), mean
//! queuing delay (the backlog, sampled every 10 ms, over the departure
//! rate: Little's law), goodput (message bytes the server read), each
//! message's one-way delay (send to read, the same clock), and `l`, the
//! drops per congestion event (drops in samples closer than one RTT form
//! one event).
//!
//! Eq. 5 needs `l`, which the paper measured and did not publish: each
//! `(n, alpha)` first runs Appenzeller's size and takes `l` from it, then
//! Eq. 5 as printed and as re-derived from Eq. 2-4
//! ([`khan_buffer_size_rederived`]) with that `l`, and the rule of thumb.
//! `T` is measured too: the smallest TCP connect time through the empty
//! testbed.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::buffer_sizing::{
    appenzeller, khan_buffer_size, khan_buffer_size_rederived, rule_of_thumb, BufferSizingError,
    BufferSizingInput,
};
use anyhow::{ensure, Context};
use serde_json::{json, Value};
use weir::config::units::HumanDuration;

use crate::compression::SplitMix;
use crate::netns::{self, delay_between, enter, in_ns, sh, veth_pair};
use crate::report::{self, HLine, LineChart, Mark, Series, Table};

const NS_DEV: &str = "weir-bsz-dev";
const NS_RTR: &str = "weir-bsz-rtr";
const NS_WAN: &str = "weir-bsz-wan";
const NS_SRV: &str = "weir-bsz-srv";
const NAMESPACES: [&str; 4] = [NS_DEV, NS_RTR, NS_WAN, NS_SRV];

/// IP packet size on the wire, and what TCP carries in it.
const MTU: usize = 1500;
const MSS: usize = MTU - 40;
/// What tbf charges per packet beyond the IP packet.
const ETHERNET: usize = 14;
/// tbf's bucket: two full packets, so no burst runs far past the rate.
const TBF_BURST: usize = 2 * (MTU + ETHERNET);
/// The interface whose queue is the buffer, in the router's namespace.
const UPLINK: &str = "r1";
/// The server's address and the first port (one per run: no TIME_WAIT
/// from one run meets the next).
const SERVER: Ipv4Addr = Ipv4Addr::new(10, 71, 2, 2);
const FIRST_PORT: u16 = 7100;
/// How often the router's queue is sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(10);
/// NS-3's default TCP send buffer, 128 KiB (Linux doubles what is set).
const SEND_BUFFER: libc::c_int = 64 * 1024;

/// Command line of `weir-lab buffers`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Flow counts `n` (devices, one flow each). The paper: 20-55 for its
    /// Figs. 9-11.
    #[arg(long, value_delimiter = ',', default_values_t = [20u64, 40, 55])]
    pub flows: Vec<u64>,
    /// Fractions of long flows `alpha` (the paper: 1, i.e. 0 % short,
    /// and 0.75, i.e. 25 % short).
    #[arg(long, value_delimiter = ',', default_values_t = [1.0f64, 0.75])]
    pub long_fractions: Vec<f64>,
    /// Access-link capacity `C` in Mbit/s of IP packets (the paper: 40).
    #[arg(long, default_value_t = 40.0)]
    pub link_mbit: f64,
    /// One-way delay between router and server (the paper: 20 ms); the
    /// round trip `T` is twice this, measured.
    #[arg(long, default_value = "20ms")]
    pub one_way: HumanDuration,
    /// Seconds measured per run, after the warm-up (the paper: 180
    /// simulated seconds).
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Seconds of each run not measured (slow start, queues filling).
    #[arg(long, default_value_t = 2.0)]
    pub warmup: f64,
    /// Buffer sizes swept at `--sweep-flows` between 2 MTU and
    /// `2 C T / sqrt(n)` (the paper's Figs. 5-6); 0 skips the sweep.
    #[arg(long, default_value_t = 6)]
    pub sweep_points: usize,
    /// `n` of the sweep (the paper: 40, each device at 1 Mbit/s).
    #[arg(long, default_value_t = 40)]
    pub sweep_flows: u64,
    /// Seed of the devices' message gaps.
    #[arg(long, default_value_t = 4)]
    pub seed: u64,
}

/// Which rule sized a run's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    Appenzeller,
    BandwidthDelay,
    Eq5Printed,
    Eq5Rederived,
    Sweep,
}

impl Rule {
    fn name(self) -> &'static str {
        match self {
            Rule::Appenzeller => "appenzeller",
            Rule::BandwidthDelay => "rule_of_thumb",
            Rule::Eq5Printed => "eq5_printed",
            Rule::Eq5Rederived => "eq5_rederived",
            Rule::Sweep => "sweep",
        }
    }
}

/// One run's conditions.
#[derive(Debug, Clone, Copy)]
struct Spec {
    flows: u64,
    alpha: f64,
    /// IP bytes the router may queue.
    buffer: f64,
    rule: Rule,
}

/// A run: its conditions, what it measured (or, for a size the model
/// could not give, the error short and in full), and the `l` it used.
type Row = (Spec, Result<Measured, (String, String)>, u64);

/// What one run measured.
#[derive(Debug, Clone, Default)]
struct Measured {
    utilization: f64,
    loss: f64,
    queuing_delay_ms: f64,
    max_backlog_bytes: f64,
    goodput_mbit: f64,
    drops: u64,
    events: u64,
    message_delay_ms: [f64; 3],
    connections: u64,
}

impl Measured {
    /// Mean drops per congestion event, `l` (0 without drops).
    fn drops_per_event(&self) -> f64 {
        if self.events == 0 {
            0.0
        } else {
            self.drops as f64 / self.events as f64
        }
    }
}

/// The four namespaces, their veths and routes, and the delay line;
/// removed when dropped.
struct Testbed {
    stop: Arc<AtomicBool>,
    delay_line: Vec<JoinHandle<()>>,
}

impl Testbed {
    fn build(one_way: Duration) -> anyhow::Result<Testbed> {
        Testbed::remove();
        for ns in NAMESPACES {
            sh("ip", &["netns", "add", ns])?;
            sh("ip", &["-n", ns, "link", "set", "lo", "up"])?;
        }
        let mut bed = Testbed {
            stop: Arc::new(AtomicBool::new(false)),
            delay_line: Vec::new(),
        };
        // (namespace, interface, address), in veth pairs.
        let pairs = [
            (
                (NS_DEV, "d0", "10.71.0.2/24"),
                (NS_RTR, "r0", "10.71.0.1/24"),
            ),
            (
                (NS_RTR, UPLINK, "10.71.1.1/24"),
                (NS_WAN, "w0", "10.71.1.2/24"),
            ),
            (
                (NS_WAN, "w1", "10.71.2.1/24"),
                (NS_SRV, "s0", "10.71.2.2/24"),
            ),
        ];
        for ((ns_a, a, cidr_a), (ns_b, b, cidr_b)) in pairs {
            // One segment per packet, as a device's NIC sends them.
            veth_pair((Some(ns_a), a, cidr_a), (Some(ns_b), b, cidr_b), true)?;
        }
        sh(
            "ip",
            &["-n", NS_DEV, "route", "add", "default", "via", "10.71.0.1"],
        )?;
        sh(
            "ip",
            &["-n", NS_SRV, "route", "add", "default", "via", "10.71.2.1"],
        )?;
        sh(
            "ip",
            &[
                "-n",
                NS_RTR,
                "route",
                "add",
                "10.71.2.0/24",
                "via",
                "10.71.1.2",
            ],
        )?;
        sh(
            "ip",
            &[
                "-n",
                NS_WAN,
                "route",
                "add",
                "10.71.0.0/24",
                "via",
                "10.71.1.1",
            ],
        )?;
        for ns in [NS_RTR, NS_WAN] {
            in_ns(ns, &["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
        }
        for ns in [NS_DEV, NS_SRV] {
            for kv in [
                "net.ipv4.tcp_congestion_control=reno",
                "net.ipv4.tcp_sack=0",
                "net.ipv4.tcp_timestamps=0",
                "net.ipv4.tcp_no_metrics_save=1",
            ] {
                in_ns(ns, &["sysctl", "-qw", kv])?;
            }
        }
        // The delay line: a TUN device in the wan namespace; what arrives
        // from either veth goes through it.
        bed.delay_line = delay_between(NS_WAN, ["w0", "w1"], one_way, bed.stop.clone())?;
        Ok(bed)
    }

    /// The access link with a buffer of `buffer` IP bytes.
    fn shape(&self, link_mbit: f64, buffer: f64) -> anyhow::Result<()> {
        let l2 = (MTU + ETHERNET) as f64 / MTU as f64;
        let rate = format!("{}bit", (link_mbit * 1e6 * l2).round() as u64);
        let limit = ((buffer * l2).round() as usize).max(TBF_BURST).to_string();
        let burst = TBF_BURST.to_string();
        sh(
            "tc",
            &[
                "-n", NS_RTR, "qdisc", "replace", "dev", UPLINK, "root", "tbf", "rate", &rate,
                "burst", &burst, "limit", &limit,
            ],
        )
        .context("tc tbf on the router's access link")
    }

    fn remove() {
        for ns in NAMESPACES {
            let _ = sh("ip", &["netns", "del", ns]);
        }
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.delay_line.drain(..) {
            let _ = t.join();
        }
        Testbed::remove();
    }
}

/// One sample of the router's queue (`tc -s qdisc`).
#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    at: Duration,
    bytes: u64,
    packets: u64,
    drops: u64,
    backlog: u64,
}

fn read_queue() -> anyhow::Result<Sample> {
    let q = netns::tbf_counters(None, UPLINK)?;
    Ok(Sample {
        at: Duration::ZERO,
        bytes: q.bytes,
        packets: q.packets,
        drops: q.drops,
        backlog: q.backlog,
    })
}

/// A message: when it was handed to TCP, in nanoseconds since `epoch`,
/// then filler to MSS bytes.
fn message(epoch: Instant) -> [u8; MSS] {
    let mut m = [0x5au8; MSS];
    m[..8].copy_from_slice(&(epoch.elapsed().as_nanos() as u64).to_le_bytes());
    m
}

/// A socket timeout (or a signal): the call can be made again.
fn timed_out(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        thread::sleep(t - now);
    }
}

fn connect(to: SocketAddr) -> io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&to, Duration::from_secs(3))?;
    s.set_nodelay(true)?;
    s.set_write_timeout(Some(Duration::from_millis(200)))?;
    set_socket_option(&s, libc::SO_SNDBUF, &SEND_BUFFER)?;
    Ok(s)
}

/// Closes at once (RST): what the device had not sent is not waited for.
fn abort(s: TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    let _ = set_socket_option(&s, libc::SO_LINGER, &linger);
}

/// Sets the `SOL_SOCKET` option `name` of `s` to `value`.
fn set_socket_option<T>(s: &TcpStream, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: `value` is a live `T`, and its size goes with it.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// One device: messages at `rate` a second with exponential gaps until
/// `end`; a short-flow device closes its connection after `2 / rate` idle.
/// Returns the connections it opened.
fn device(to: SocketAddr, rate: f64, short: bool, seed: u64, epoch: Instant, end: Instant) -> u64 {
    let mut rng = SplitMix(seed);
    let mean_gap = 1.0 / rate;
    let gap = |rng: &mut SplitMix| Duration::from_secs_f64(-(1.0 - rng.unit()).ln() * mean_gap);
    let idle_close = Duration::from_secs_f64(2.0 * mean_gap);
    let mut next = Instant::now() + gap(&mut rng);
    let mut last = Instant::now();
    let mut stream: Option<TcpStream> = None;
    let mut connections = 0;
    'messages: while next < end {
        if short && stream.is_some() && next.saturating_duration_since(last) > idle_close {
            sleep_until(last + idle_close);
            drop(stream.take());
        }
        sleep_until(next);
        if stream.is_none() {
            match connect(to) {
                Ok(s) => {
                    stream = Some(s);
                    connections += 1;
                }
                Err(_) => {
                    next += gap(&mut rng);
                    continue;
                }
            }
        }
        let Some(s) = stream.as_mut() else { continue };
        let m = message(epoch);
        let mut off = 0;
        while off < MSS {
            match s.write(&m[off..]) {
                Ok(k) => off += k,
                Err(e) if timed_out(&e) => {
                    if Instant::now() >= end {
                        break 'messages;
                    }
                }
                Err(_) => {
                    stream = None;
                    break;
                }
            }
        }
        last = Instant::now();
        next += gap(&mut rng);
    }
    if let Some(s) = stream {
        abort(s);
    }
    connections
}

/// What the server read within the window.
#[derive(Default)]
struct Received {
    bytes: AtomicU64,
    delays_us: Mutex<Vec<u32>>,
}

fn serve(
    listener: TcpListener,
    epoch: Instant,
    window: (Duration, Duration),
    stop: Arc<AtomicBool>,
    got: Arc<Received>,
) {
    let _ = listener.set_nonblocking(true);
    let mut readers = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((mut s, _)) => {
                let _ = s.set_nonblocking(false);
                let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
                let got = got.clone();
                let stop = stop.clone();
                readers.push(thread::spawn(move || {
                    let mut m = [0u8; MSS];
                    let mut delays = Vec::new();
                    'messages: loop {
                        // A read that times out keeps what it has; the
                        // connection ends at its close, or at `stop` (an
                        // RST lost in a full queue must not hold the run).
                        let mut filled = 0;
                        while filled < MSS {
                            match s.read(&mut m[filled..]) {
                                Ok(0) => break 'messages,
                                Ok(k) => filled += k,
                                Err(e) if timed_out(&e) => {
                                    if stop.load(Ordering::Relaxed) {
                                        break 'messages;
                                    }
                                }
                                Err(_) => break 'messages,
                            }
                        }
                        let now = epoch.elapsed();
                        let sent = Duration::from_nanos(u64::from_le_bytes(
                            m[..8].try_into().expect("8 bytes"),
                        ));
                        if now >= window.0 && now < window.1 {
                            got.bytes.fetch_add(MSS as u64, Ordering::Relaxed);
                        }
                        if sent >= window.0 && sent < window.1 {
                            delays.push(now.saturating_sub(sent).as_micros() as u32);
                        }
                    }
                    got.delays_us.lock().expect("not poisoned").extend(delays);
                }));
            }
            Err(_) => thread::sleep(Duration::from_millis(2)),
        }
    }
    for r in readers {
        let _ = r.join();
    }
}

/// The smallest TCP connect time through the empty testbed: `T`.
fn base_rtt() -> anyhow::Result<Duration> {
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    let accept_stop = stop.clone();
    let server = thread::spawn(move || -> anyhow::Result<()> {
        enter(NS_SRV)?;
        let l = TcpListener::bind(SocketAddrV4::new(SERVER, FIRST_PORT - 1))?;
        l.set_nonblocking(true)?;
        tx.send(()).ok();
        while !accept_stop.load(Ordering::Relaxed) {
            if l.accept().is_err() {
                thread::sleep(Duration::from_millis(1));
            }
        }
        Ok(())
    });
    rx.recv_timeout(Duration::from_secs(5))
        .context("the server did not start")?;
    let rtt = thread::spawn(|| -> anyhow::Result<Duration> {
        enter(NS_DEV)?;
        let to = SocketAddr::V4(SocketAddrV4::new(SERVER, FIRST_PORT - 1));
        let mut best = Duration::MAX;
        for _ in 0..8 {
            let t = Instant::now();
            let s = TcpStream::connect_timeout(&to, Duration::from_secs(3))
                .context("cannot connect through the testbed")?;
            best = best.min(t.elapsed());
            drop(s);
            thread::sleep(Duration::from_millis(20));
        }
        Ok(best)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the probe panicked"))?;
    stop.store(true, Ordering::Relaxed);
    let _ = server.join();
    rtt
}

/// The `p` quantile of delays in microseconds, in milliseconds (0 when
/// none).
fn percentile(sorted: &[u32], p: f64) -> f64 {
    report::percentile(sorted, p).unwrap_or(0.0) / 1000.0
}

/// Runs `n` devices against the server for warm-up plus the window, with
/// the link already shaped.
fn run_one(a: &Args, spec: &Spec, port: u16, rtt: Duration) -> anyhow::Result<Measured> {
    let epoch = Instant::now();
    let warm = Duration::from_secs_f64(a.warmup);
    let window = (warm, warm + Duration::from_secs_f64(a.seconds));
    let stop = Arc::new(AtomicBool::new(false));
    let got = Arc::new(Received::default());
    let to = SocketAddr::V4(SocketAddrV4::new(SERVER, port));

    let (ready_tx, ready_rx) = mpsc::channel();
    let server = {
        let (stop, got) = (stop.clone(), got.clone());
        thread::spawn(move || -> anyhow::Result<()> {
            enter(NS_SRV)?;
            let l = TcpListener::bind(to).context("the server's listener")?;
            ready_tx.send(()).ok();
            serve(l, epoch, window, stop, got);
            Ok(())
        })
    };
    ready_rx
        .recv_timeout(Duration::from_secs(5))
        .context("the server did not start")?;

    let samples = {
        let stop = stop.clone();
        thread::spawn(move || -> anyhow::Result<Vec<Sample>> {
            enter(NS_RTR)?;
            let mut out = Vec::new();
            let mut next = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let mut s = read_queue()?;
                s.at = epoch.elapsed();
                out.push(s);
                next += SAMPLE_EVERY;
                sleep_until(next);
            }
            Ok(out)
        })
    };

    // Paper: messages of MTU - 40 bytes at R = gamma / MTU per second,
    // gamma = C / n, so the devices together offer the link's capacity.
    let rate = a.link_mbit * 1e6 / spec.flows as f64 / (MTU * 8) as f64;
    let short_devices = ((1.0 - spec.alpha) * spec.flows as f64).round() as u64;
    let end = epoch + window.1;
    let devices: Vec<_> = (0..spec.flows)
        .map(|i| {
            let seed = a.seed.wrapping_mul(1_000_003) ^ (spec.flows << 32) ^ i;
            thread::spawn(move || -> anyhow::Result<u64> {
                enter(NS_DEV)?;
                Ok(device(to, rate, i < short_devices, seed, epoch, end))
            })
        })
        .collect();
    let mut connections = 0;
    for d in devices {
        connections += d
            .join()
            .map_err(|_| anyhow::anyhow!("a device panicked"))??;
    }
    // What was in flight when the devices stopped reaches the server; then
    // the readers end.
    thread::sleep(rtt * 4);
    stop.store(true, Ordering::Relaxed);
    server
        .join()
        .map_err(|_| anyhow::anyhow!("the server panicked"))??;
    let samples = samples
        .join()
        .map_err(|_| anyhow::anyhow!("the sampler panicked"))??;

    let mut m = measure(&samples, window, rtt, a.link_mbit)?;
    m.connections = connections;
    let secs = window.1.saturating_sub(window.0).as_secs_f64();
    m.goodput_mbit = got.bytes.load(Ordering::Relaxed) as f64 * 8.0 / secs / 1e6;
    let mut delays = std::mem::take(&mut *got.delays_us.lock().expect("not poisoned"));
    delays.sort_unstable();
    let mean = delays.iter().map(|&d| f64::from(d)).sum::<f64>() / delays.len().max(1) as f64;
    m.message_delay_ms = [
        mean / 1000.0,
        percentile(&delays, 0.5),
        percentile(&delays, 0.99),
    ];
    Ok(m)
}

/// Utilisation, loss, queuing delay and congestion events from the
/// router's samples within `window`.
fn measure(
    samples: &[Sample],
    window: (Duration, Duration),
    rtt: Duration,
    link_mbit: f64,
) -> anyhow::Result<Measured> {
    let inside: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.at >= window.0 && s.at <= window.1)
        .collect();
    ensure!(inside.len() >= 2, "too few samples of the router's queue");
    let (first, last) = (inside[0], inside[inside.len() - 1]);
    let secs = last.at.saturating_sub(first.at).as_secs_f64();
    let sent = last.bytes.saturating_sub(first.bytes) as f64;
    let l2 = (MTU + ETHERNET) as f64 / MTU as f64;
    let capacity = link_mbit * 1e6 / 8.0 * l2;
    let drops = last.drops.saturating_sub(first.drops);
    let packets = last.packets.saturating_sub(first.packets);
    let backlog = inside.iter().map(|s| s.backlog as f64).sum::<f64>() / inside.len() as f64;
    let departures = sent / secs;
    // Congestion events: drops in samples closer than one RTT are one.
    let mut events = 0;
    let mut last_drop: Option<Duration> = None;
    for w in inside.windows(2) {
        if w[1].drops > w[0].drops {
            if last_drop.is_none_or(|t| w[1].at.saturating_sub(t) > rtt) {
                events += 1;
            }
            last_drop = Some(w[1].at);
        }
    }
    Ok(Measured {
        utilization: sent / secs / capacity,
        loss: drops as f64 / (packets + drops).max(1) as f64,
        queuing_delay_ms: if departures > 0.0 {
            backlog / departures * 1000.0
        } else {
            0.0
        },
        max_backlog_bytes: inside.iter().map(|s| s.backlog).max().unwrap_or(0) as f64 / l2,
        drops,
        events,
        ..Measured::default()
    })
}

fn model_input(a: &Args, flows: u64, alpha: f64, rtt: Duration, l: u64) -> BufferSizingInput {
    BufferSizingInput {
        capacity_bytes_per_sec: a.link_mbit * 1e6 / 8.0,
        flows,
        mss_bytes: MSS as u32,
        rtt,
        long_flow_fraction: alpha,
        drops_per_event: l,
    }
}

fn check(a: &Args) -> anyhow::Result<()> {
    ensure!(
        !a.flows.is_empty() && a.flows.iter().all(|&n| (1..=200).contains(&n)),
        "--flows must list flow counts from 1 to 200"
    );
    ensure!(
        !a.long_fractions.is_empty() && a.long_fractions.iter().all(|f| (0.0..=1.0).contains(f)),
        "--long-fractions must be fractions within 0..=1"
    );
    ensure!(
        a.link_mbit.is_finite() && a.link_mbit > 0.0,
        "--link-mbit must be positive"
    );
    ensure!(
        a.seconds > 0.0 && a.warmup >= 0.0,
        "--seconds must be positive"
    );
    ensure!(
        (1..=200).contains(&a.sweep_flows),
        "--sweep-flows must be from 1 to 200"
    );
    Ok(())
}

/// Runs the experiment: table, JSON, SVG.
pub async fn run(a: &Args) -> anyhow::Result<(String, Value, String)> {
    check(a)?;
    let a = a.clone();
    tokio::task::spawn_blocking(move || run_blocking(&a))
        .await
        .context("the experiment's thread")?
}

fn run_blocking(a: &Args) -> anyhow::Result<(String, Value, String)> {
    let bed = Testbed::build(a.one_way.0)?;
    bed.shape(a.link_mbit, 1e6)?;
    let rtt = base_rtt()?;
    let ct = rule_of_thumb(a.link_mbit * 1e6 / 8.0, rtt);
    let runs_per_cell = 4;
    let total = a.flows.len() * a.long_fractions.len() * runs_per_cell
        + a.long_fractions.len() * a.sweep_points;
    let bar = report::progress(total as u64, "buffers");
    let mut port = FIRST_PORT;
    let mut rows: Vec<Row> = Vec::new();
    let mut go = |spec: Spec, l: u64, rows: &mut Vec<_>| -> anyhow::Result<Measured> {
        bar.set_message(format!(
            "n {} alpha {} {} {:.0} B",
            spec.flows,
            spec.alpha,
            spec.rule.name(),
            spec.buffer
        ));
        bed.shape(a.link_mbit, spec.buffer)?;
        // The queue empties from the run before.
        thread::sleep(Duration::from_millis(300));
        let m = run_one(a, &spec, port, rtt)?;
        port += 1;
        bar.inc(1);
        rows.push((spec, Ok(m.clone()), l));
        Ok(m)
    };
    for &n in &a.flows {
        for &alpha in &a.long_fractions {
            let cell = |buffer, rule| Spec {
                flows: n,
                alpha,
                buffer,
                rule,
            };
            let app = appenzeller(a.link_mbit * 1e6 / 8.0, rtt, alpha * n as f64);
            let m = go(cell(app, Rule::Appenzeller), 0, &mut rows)?;
            // Eq. 5's l: drops per congestion event at Appenzeller's size
            // (at least 1: Eq. 5 sizes for a congestion event; the JSON keeps
            // what was measured).
            let l = m.drops_per_event().round().max(1.0) as u64;
            rows.last_mut().expect("just pushed").2 = l;
            go(cell(ct, Rule::BandwidthDelay), l, &mut rows)?;
            let input = model_input(a, n, alpha, rtt, l);
            for (rule, size) in [
                (Rule::Eq5Printed, khan_buffer_size(&input)),
                (Rule::Eq5Rederived, khan_buffer_size_rederived(&input)),
            ] {
                match size {
                    Ok(b) => {
                        go(cell(b, rule), l, &mut rows)?;
                    }
                    Err(e) => {
                        bar.inc(1);
                        let short = match e {
                            BufferSizingError::NegativeDenominator { denominator, .. } => {
                                format!("no size: Eq. 5's denominator is {denominator:.3} < 0")
                            }
                            e => e.to_string(),
                        };
                        rows.push((cell(f64::NAN, rule), Err((short, e.to_string())), l));
                    }
                }
            }
        }
    }
    if a.sweep_points > 0 {
        let n = a.sweep_flows;
        let hi = 2.0 * ct / (n as f64).sqrt();
        let lo = (2 * MTU) as f64;
        for &alpha in &a.long_fractions {
            for k in 0..a.sweep_points {
                let b = lo + (hi - lo) * k as f64 / (a.sweep_points - 1).max(1) as f64;
                let spec = Spec {
                    flows: n,
                    alpha,
                    buffer: b,
                    rule: Rule::Sweep,
                };
                go(spec, 0, &mut rows)?;
            }
        }
    }
    bar.finish_and_clear();
    drop(bed);
    Ok(report_of(a, rtt, ct, &rows))
}

fn report_of(a: &Args, rtt: Duration, ct: f64, rows: &[Row]) -> (String, Value, String) {
    let mut t = Table::new([
        "n",
        "alpha",
        "rule",
        "buffer B",
        "l",
        "util %",
        "queuing ms",
        "loss %",
        "goodput Mbit/s",
        "msg delay mean/p99 ms",
        "conns",
    ]);
    let mut json_rows = Vec::new();
    for (spec, m, l) in rows {
        match m {
            Ok(m) => {
                t.row([
                    spec.flows.to_string(),
                    format!("{:.2}", spec.alpha),
                    spec.rule.name().to_string(),
                    format!("{:.0}", spec.buffer),
                    if spec.rule == Rule::Sweep {
                        format!("({:.1})", m.drops_per_event())
                    } else {
                        l.to_string()
                    },
                    format!("{:.1}", m.utilization * 100.0),
                    format!("{:.2}", m.queuing_delay_ms),
                    format!("{:.2}", m.loss * 100.0),
                    format!("{:.2}", m.goodput_mbit),
                    format!(
                        "{:.1} / {:.1}",
                        m.message_delay_ms[0], m.message_delay_ms[2]
                    ),
                    m.connections.to_string(),
                ]);
                json_rows.push(json!({
                    "flows": spec.flows,
                    "long_fraction": spec.alpha,
                    "rule": spec.rule.name(),
                    "buffer_bytes": spec.buffer.round(),
                    "drops_per_event_used": if spec.rule == Rule::Sweep { None } else { Some(l) },
                    "drops_per_event_measured": report::round(m.drops_per_event(), 2),
                    "utilization_pct": report::round(m.utilization * 100.0, 2),
                    "queuing_delay_ms": report::round(m.queuing_delay_ms, 3),
                    "max_backlog_bytes": m.max_backlog_bytes.round(),
                    "loss_pct": report::round(m.loss * 100.0, 3),
                    "goodput_mbit": report::round(m.goodput_mbit, 3),
                    "message_delay_ms": {
                        "mean": report::round(m.message_delay_ms[0], 2),
                        "p50": report::round(m.message_delay_ms[1], 2),
                        "p99": report::round(m.message_delay_ms[2], 2),
                    },
                    "connections": m.connections,
                }));
            }
            Err((short, e)) => {
                t.row([
                    spec.flows.to_string(),
                    format!("{:.2}", spec.alpha),
                    spec.rule.name().to_string(),
                    "-".into(),
                    l.to_string(),
                    short.clone(),
                ]);
                json_rows.push(json!({
                    "flows": spec.flows,
                    "long_fraction": spec.alpha,
                    "rule": spec.rule.name(),
                    "drops_per_event_used": l,
                    "error": e,
                }));
            }
        }
    }
    let mut text = format!(
        "seed 004: {} Mbit/s access link, T = {:.2} ms measured (C T = {:.0} B), {} s per run after {} s\n",
        a.link_mbit,
        rtt.as_secs_f64() * 1000.0,
        ct,
        a.seconds,
        a.warmup
    );
    text.push_str(&t.render());
    let json = json!({
        "experiment": "buffers",
        "paper": "Khan, Shahzad, Butt: Sizing Buffers of IoT Edge Routers (EdgeSys 2018)",
        "link_mbit": a.link_mbit,
        "rtt_ms": report::round(rtt.as_secs_f64() * 1000.0, 3),
        "bandwidth_delay_product_bytes": ct.round(),
        "seconds": a.seconds,
        "warmup_seconds": a.warmup,
        "runs": json_rows,
    });
    let svg = chart(rows).unwrap_or_default();
    (text, json, svg)
}

/// Queuing delay against buffer size: the sweep per alpha (the paper's
/// Fig. 6), each rule's run at the sweep's `n` marked.
fn chart(rows: &[Row]) -> anyhow::Result<String> {
    let mut series: Vec<Series> = Vec::new();
    let mut marks = Vec::new();
    let sweep_n = rows
        .iter()
        .find(|(s, _, _)| s.rule == Rule::Sweep)
        .map(|(s, _, _)| s.flows);
    for (spec, m, _) in rows {
        let Ok(m) = m else { continue };
        let point = (spec.buffer / 1000.0, m.queuing_delay_ms);
        if spec.rule == Rule::Sweep {
            let name = format!("sweep, n {}, alpha {}", spec.flows, spec.alpha);
            match series.iter_mut().find(|s| s.name == name) {
                Some(s) => s.points.push(point),
                None => series.push(Series {
                    name,
                    points: vec![point],
                }),
            }
        } else if Some(spec.flows) == sweep_n {
            marks.push(Mark {
                label: format!("{} a={}", spec.rule.name(), spec.alpha),
                x: point.0,
                y: point.1,
                paper: false,
            });
        }
    }
    report::line_chart_svg(&LineChart {
        title: "Seed 004: queuing delay against buffer size (real TCP Reno flows, tbf)".into(),
        x_label: "buffer (kB)".into(),
        y_label: "mean queuing delay (ms)".into(),
        series,
        hlines: Vec::<HLine>::new(),
        marks,
    })
}

#[cfg(test)]
mod tests;
