//! Network namespaces from inside this process: entering one on a thread
//! (sockets it opens, and processes it starts, are in there), and the
//! packet-level delay line the real-process labs put on a path where
//! netem would be used (it is not available here): a TUN device whose
//! packets this process holds for a fixed time and writes back.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};

/// Runs a command to completion; its stderr in the error if it fails.
pub(crate) fn sh(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("cannot run {program}"))?;
    ensure!(
        out.status.success(),
        "`{program} {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// Enters network namespace `ns` on this thread: sockets it opens, and
/// processes it starts, are in there.
pub(crate) fn enter(ns: &str) -> anyhow::Result<()> {
    let f = File::open(format!("/run/netns/{ns}"))
        .with_context(|| format!("network namespace {ns} is missing"))?;
    // SAFETY: setns on a valid descriptor; it changes this thread only.
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    ensure!(rc == 0, "setns {ns}: {}", io::Error::last_os_error());
    Ok(())
}

/// Runs a command inside namespace `ns` (`ip netns exec`).
pub(crate) fn in_ns(ns: &str, args: &[&str]) -> anyhow::Result<()> {
    let mut all = vec!["netns", "exec", ns];
    all.extend_from_slice(args);
    sh("ip", &all)
}

/// Opens TUN device `name` (IP packets, no extra header) in namespace
/// `ns`, from a thread that enters it.
pub(crate) fn open_tun(ns: &str, name: &str) -> anyhow::Result<File> {
    let ns = ns.to_string();
    let name = name.to_string();
    thread::spawn(move || -> anyhow::Result<File> {
        enter(&ns)?;
        const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
        const IFF_TUN: libc::c_short = 0x0001;
        const IFF_NO_PI: libc::c_short = 0x1000;
        #[repr(C)]
        struct IfReq {
            name: [u8; libc::IFNAMSIZ],
            flags: libc::c_short,
            _pad: [u8; 22],
        }
        let mut req = IfReq {
            name: [0; libc::IFNAMSIZ],
            flags: IFF_TUN | IFF_NO_PI,
            _pad: [0; 22],
        };
        ensure!(
            name.len() < libc::IFNAMSIZ,
            "interface name {name} is too long"
        );
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        // SAFETY: a NUL-terminated path; the descriptor is owned by the File.
        let fd = unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        ensure!(fd >= 0, "open /dev/net/tun: {}", io::Error::last_os_error());
        // SAFETY: fd was just opened and is owned from here on.
        let file = unsafe { File::from_raw_fd(fd) };
        // SAFETY: TUNSETIFF reads and writes one struct ifreq.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF, &mut req) };
        ensure!(rc == 0, "TUNSETIFF {name}: {}", io::Error::last_os_error());
        Ok(file)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the TUN thread panicked"))?
}

/// Reads packets from `tun` and writes each back `delay` after it arrived,
/// in order, until `stop`.
pub(crate) fn delay_line(
    tun: File,
    delay: Duration,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<Vec<JoinHandle<()>>> {
    let mut writer = tun.try_clone().context("cannot clone the TUN descriptor")?;
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let reader = thread::spawn(move || {
        let mut tun = tun;
        let mut buf = vec![0u8; 65536];
        let mut poll = libc::pollfd {
            fd: tun.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        while !stop.load(Ordering::Relaxed) {
            // SAFETY: one valid pollfd.
            let ready = unsafe { libc::poll(&mut poll, 1, 100) };
            if ready <= 0 {
                continue;
            }
            match tun.read(&mut buf) {
                Ok(n) => {
                    if tx
                        .send((Instant::now() + delay, buf[..n].to_vec()))
                        .is_err()
                    {
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    });
    let sender = thread::spawn(move || {
        for (due, packet) in rx {
            let now = Instant::now();
            if due > now {
                thread::sleep(due - now);
            }
            // A packet the kernel refuses is a packet lost on the line.
            let _ = writer.write(&packet);
        }
    });
    Ok(vec![reader, sender])
}

/// Puts a delay line into namespace `ns` between its interfaces `sides`:
/// every packet arriving on either is held `delay`, then routed on as
/// usual (policy routing sends what arrives on `sides` into TUN `dly0`,
/// table 100; what this process writes back comes out of `dly0` and takes
/// the main table). Turns forwarding on and reverse-path filtering off in
/// `ns`. Runs until `stop`.
pub(crate) fn delay_between(
    ns: &str,
    sides: [&str; 2],
    delay: Duration,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<Vec<JoinHandle<()>>> {
    for kv in [
        "net.ipv4.ip_forward=1",
        "net.ipv4.conf.all.rp_filter=0",
        "net.ipv4.conf.default.rp_filter=0",
    ] {
        in_ns(ns, &["sysctl", "-qw", kv])?;
    }
    let tun = open_tun(ns, "dly0")?;
    in_ns(ns, &["sysctl", "-qw", "net.ipv4.conf.dly0.rp_filter=0"])?;
    sh(
        "ip",
        &["-n", ns, "link", "set", "dly0", "mtu", "1500", "up"],
    )?;
    sh(
        "ip",
        &[
            "-n", ns, "route", "add", "default", "dev", "dly0", "table", "100",
        ],
    )?;
    for (dev, pref) in sides.iter().zip(["100", "101"]) {
        sh(
            "ip",
            &[
                "-n", ns, "rule", "add", "iif", dev, "lookup", "100", "pref", pref,
            ],
        )?;
    }
    delay_line(tun, delay, stop)
}

/// One end of a veth pair: its namespace (`None`: this process's), its
/// name and its address.
pub(crate) type End<'a> = (Option<&'a str>, &'a str, &'a str);

/// Runs `ip args` in namespace `ns` (this process's when `None`).
fn ip(ns: Option<&str>, args: &[&str]) -> anyhow::Result<()> {
    match ns {
        Some(ns) => {
            let mut all = vec!["-n", ns];
            all.extend_from_slice(args);
            sh("ip", &all)
        }
        None => sh("ip", args),
    }
}

/// A veth pair between `a` and `b`, each end addressed and up; with
/// `one_segment`, each end hands the wire one TCP segment per packet
/// (`gso_max_segs 1`), as a device's NIC would.
pub(crate) fn veth_pair(a: End, b: End, one_segment: bool) -> anyhow::Result<()> {
    let mut add = vec!["link", "add", a.1];
    add.extend(a.0.iter().flat_map(|ns| ["netns", *ns]));
    add.extend(["type", "veth", "peer", "name", b.1]);
    add.extend(b.0.iter().flat_map(|ns| ["netns", *ns]));
    sh("ip", &add)?;
    for (ns, dev, cidr) in [a, b] {
        ip(ns, &["addr", "add", cidr, "dev", dev])?;
        if one_segment {
            ip(ns, &["link", "set", dev, "gso_max_segs", "1"])?;
        }
        ip(ns, &["link", "set", dev, "up"])?;
    }
    Ok(())
}

/// The counters of the `tbf` qdisc on `dev` (`tc -s qdisc`), in namespace
/// `ns` (`None`: the calling thread's).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct TbfCounters {
    /// Bytes sent (Ethernet frames, as tbf charges them).
    pub bytes: u64,
    /// Packets sent.
    pub packets: u64,
    /// Packets dropped (the queue was full).
    pub drops: u64,
    /// Bytes waiting now.
    pub backlog: u64,
}

/// Reads [`TbfCounters`] with `tc -s -j` (`tc -n ns` inside a namespace).
pub(crate) fn tbf_counters(ns: Option<&str>, dev: &str) -> anyhow::Result<TbfCounters> {
    let mut cmd = std::process::Command::new("tc");
    if let Some(ns) = ns {
        cmd.args(["-n", ns]);
    }
    let out = cmd
        .args(["-s", "-j", "qdisc", "show", "dev", dev])
        .output()
        .context("cannot run tc")?;
    ensure!(out.status.success(), "tc -s qdisc show dev {dev} failed");
    tbf_from_json(&out.stdout).with_context(|| format!("no tbf on {dev}"))
}

fn tbf_from_json(json: &[u8]) -> Option<TbfCounters> {
    let v: serde_json::Value = serde_json::from_slice(json).ok()?;
    let q = v.as_array()?.iter().find(|q| q["kind"] == "tbf")?;
    let n = |k: &str| q[k].as_u64().unwrap_or(0);
    Some(TbfCounters {
        bytes: n("bytes"),
        packets: n("packets"),
        drops: n("drops"),
        backlog: n("backlog"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tbf_counters_come_from_the_tbf_entry_of_tc_json() {
        let json = br#"[{"kind":"noqueue","handle":"0:"},
            {"kind":"tbf","handle":"8001:","root":true,"options":{"rate":2250000},
             "bytes":123456,"packets":99,"drops":3,"overlimits":7,"requeues":0,
             "backlog":4542,"qlen":3}]"#;
        assert_eq!(
            tbf_from_json(json),
            Some(TbfCounters {
                bytes: 123456,
                packets: 99,
                drops: 3,
                backlog: 4542
            })
        );
        assert_eq!(tbf_from_json(br#"[{"kind":"noqueue"}]"#), None);
        assert_eq!(tbf_from_json(b"not json"), None);
    }
}
