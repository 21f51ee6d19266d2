//! The memory limit weir plans for (`node.memory_limit`): given, or read
//! from the cgroup weir runs in (v2 `memory.max`, v1
//! `memory.limit_in_bytes`, the tightest of the cgroup and its parents),
//! and the class queues sized to fit it (`weir_core::queueing::memory`).

use std::path::{Path, PathBuf};

use weir_core::queueing::memory::Plan;
use weir_core::queueing::queue::QueueCapacity;

use crate::config::{Config, MemoryLimit};

/// A limit and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    /// Bytes.
    pub bytes: u64,
    /// `node.memory_limit`, or the cgroup file it was read from.
    pub source: String,
}

/// The limit `node.memory_limit` asks for: given, read from the cgroup
/// (`auto`), or none.
pub fn resolve(setting: MemoryLimit) -> Option<Limit> {
    match setting {
        MemoryLimit::Bytes(bytes) => Some(Limit {
            bytes,
            source: "node.memory_limit".to_owned(),
        }),
        MemoryLimit::Auto => cgroup_limit(Path::new("/proc/self")),
        MemoryLimit::Unlimited => None,
    }
}

/// The budget for `cfg` under `limit`: the egress's batches in flight are
/// planned at their largest (the pipe full, [`COPIES_IN_FLIGHT`] bytes
/// for each of its wire bytes).
pub fn plan(cfg: &Config, limit: Option<&Limit>) -> Plan {
    weir_core::queueing::memory::plan(
        limit.map(|l| l.bytes),
        &cfg.memory_capacities(),
        in_flight_bytes(cfg, limit),
    )
}

/// The queues to use for `cfg` under `limit`.
pub fn capacities(cfg: &Config, limit: Option<&Limit>) -> Vec<QueueCapacity> {
    plan(cfg, limit).queues
}

/// Memory per wire byte of a batch in flight: its body, and its records'
/// receipts (what a confirmation needs of each record, without its key and
/// payload: `weir_core::Receipt`, 48 bytes a record, a fifth of a 256 B
/// record), which together with the second body of the batch being
/// compressed stay under two copies.
const COPIES_IN_FLIGHT: u64 = 2;

/// Most wire bytes the egress keeps unconfirmed without a memory limit
/// (the pipe follows the bandwidth-delay product below it,
/// [`weir_core::delivery::pipe`]).
pub const PIPE_BYTES: u64 = 32 << 20;

/// Share of the usable memory (the limit less weir's base) the pipe may
/// hold, copies included, under a limit.
const PIPE_SHARE: f64 = 0.25;

/// Most wire bytes the egress keeps unconfirmed under `limit`.
pub fn pipe_bytes(limit: Option<&Limit>) -> u64 {
    match limit {
        None => PIPE_BYTES,
        Some(l) => {
            let usable = ((l.bytes as f64 * (1.0 - weir_core::queueing::memory::HEADROOM)) as u64)
                .saturating_sub(weir_core::queueing::memory::BASE_BYTES);
            let share = (usable as f64 * PIPE_SHARE) as u64 / COPIES_IN_FLIGHT;
            share.clamp(weir_core::delivery::pipe::MIN_PIPE_BATCH, PIPE_BYTES)
        }
    }
}

fn in_flight_bytes(cfg: &Config, limit: Option<&Limit>) -> u64 {
    // The pipe, and the urgent lane's window of batches beside it.
    let lane = match &cfg.egress.sink {
        crate::config::EgressSink::Amqp(a) if a.urgent_lane => {
            a.max_in_flight as u64 * weir_core::delivery::pipe::MIN_PIPE_BATCH
        }
        _ => 0,
    };
    (pipe_bytes(limit) + lane) * COPIES_IN_FLIGHT
}

/// A warning when `cfg` lets more MQTT devices connect than the memory
/// limit's headroom holds (their buffers are not in the plan).
pub fn connections_warning(cfg: &Config, limit: Option<&Limit>) -> Option<String> {
    let limit = limit?;
    let mqtt = cfg
        .ingress
        .mqtt
        .as_ref()
        .filter(|m| matches!(m.mode, crate::config::MqttMode::Listen(_)))?;
    let allowed = mqtt.limits.max_connections as u64;
    let fit = weir_core::queueing::memory::connections_that_fit(limit.bytes);
    (allowed > fit).then(|| {
        format!(
            "ingress.mqtt.max_connections = {allowed}: that many connections would take up to {:.0} MiB (about {} KiB each), beyond what the memory limit of {:.0} MiB leaves for them (about {fit}); lower max_connections to the devices this box serves",
            (allowed * weir_core::queueing::memory::CONNECTION_BYTES) as f64 / (1 << 20) as f64,
            weir_core::queueing::memory::CONNECTION_BYTES >> 10,
            limit.bytes as f64 / (1 << 20) as f64
        )
    })
}

/// One line saying what was derived under `setting`, for start-up and
/// `check-config`.
pub fn describe(plan: &Plan, setting: MemoryLimit, limit: Option<&Limit>) -> String {
    const MIB: f64 = (1 << 20) as f64;
    match limit {
        None => format!(
            "no memory limit ({}): class queues as configured, {:.1} MiB at capacity",
            match setting {
                MemoryLimit::Unlimited => "node.memory_limit = \"none\"",
                _ => "node.memory_limit = \"auto\" found no cgroup limit",
            },
            plan.queue_bytes as f64 / MIB
        ),
        Some(l) if plan.starved() => format!(
            "memory limit {:.1} MiB ({}) leaves nothing for the class queues after weir's base of {:.0} MiB: every queue at its minimum; give weir more memory",
            l.bytes as f64 / MIB,
            l.source,
            weir_core::queueing::memory::BASE_BYTES as f64 / MIB
        ),
        Some(l) => format!(
            "memory limit {:.1} MiB ({}): class queues {} ({:.1} MiB at capacity, scaled by {:.3} from {:.1} MiB configured), {:.1} MiB planned in all, {:.0} % of the limit left as headroom",
            l.bytes as f64 / MIB,
            l.source,
            plan.queues
                .iter()
                .map(|q| format!("{} records/{:.1} MiB", q.records, q.bytes as f64 / MIB))
                .collect::<Vec<_>>()
                .join(", "),
            plan.queue_bytes as f64 / MIB,
            plan.scale,
            plan.configured_bytes as f64 / MIB,
            plan.planned as f64 / MIB,
            weir_core::queueing::memory::HEADROOM * 100.0
        ),
    }
}

/// The memory limit of the cgroup the process of `proc` (`/proc/self`)
/// runs in: v2 and v1, the tightest of the cgroup and its parents up to
/// the hierarchy's mount. `None` when none is set.
fn cgroup_limit(proc: &Path) -> Option<Limit> {
    let cgroups = std::fs::read_to_string(proc.join("cgroup")).ok()?;
    let mounts = std::fs::read_to_string(proc.join("mountinfo")).ok()?;
    let mut found: Option<Limit> = None;
    for (version, mount, path) in hierarchies(&cgroups, &mounts) {
        let file = if version == 2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        // From the cgroup up to the mount's root: the tightest applies.
        let mut dir = mount.join(path.trim_start_matches('/'));
        loop {
            let at = dir.join(file);
            if let Some(bytes) = std::fs::read_to_string(&at)
                .ok()
                .and_then(|t| parse_limit(&t))
            {
                if found.as_ref().is_none_or(|f| bytes < f.bytes) {
                    found = Some(Limit {
                        bytes,
                        source: at.display().to_string(),
                    });
                }
            }
            if dir == mount || !dir.pop() {
                break;
            }
        }
    }
    found
}

/// The memory hierarchies `/proc/self/cgroup` names, with where each is
/// mounted (`/proc/self/mountinfo`): `(version, mount point, path)`.
fn hierarchies(cgroups: &str, mountinfo: &str) -> Vec<(u8, PathBuf, String)> {
    let mut out = Vec::new();
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (version, wanted) = if id == "0" && controllers.is_empty() {
            (2, None)
        } else if controllers.split(',').any(|c| c == "memory") {
            (1, Some("memory"))
        } else {
            continue;
        };
        if let Some(mount) = mount_of(mountinfo, version, wanted) {
            out.push((version, mount, path.to_owned()));
        }
    }
    out
}

/// Where the cgroup hierarchy is mounted: cgroup2, or cgroup v1 with the
/// `wanted` controller among its super options.
fn mount_of(mountinfo: &str, version: u8, wanted: Option<&str>) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        // mount-id parent major:minor root mount-point options ... - fstype source super-options
        let (left, right) = line.split_once(" - ")?;
        let mount_point = left.split(' ').nth(4)?;
        let mut r = right.split(' ');
        let fstype = r.next()?;
        let _source = r.next();
        let super_options = r.next().unwrap_or("");
        let matches = match (version, wanted) {
            (2, _) => fstype == "cgroup2",
            (_, Some(w)) => fstype == "cgroup" && super_options.split(',').any(|o| o == w),
            _ => false,
        };
        matches.then(|| PathBuf::from(mount_point))
    })
}

/// A limit file's value: `max` (v2) or a value of 2^62 or more (v1's
/// "unlimited", page-rounded) is no limit.
fn parse_limit(text: &str) -> Option<u64> {
    let v: u64 = text.trim().parse().ok()?;
    (v < 1 << 62).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
29 1 0:26 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs rw,mode=755
33 29 0:30 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
34 29 0:31 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
40 29 0:35 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn both_hierarchies_are_found_where_they_are_mounted() {
        let cgroups = "4:memory:/box/weir\n1:cpu:/\n0::/system.slice/weir.service\n";
        let h = hierarchies(cgroups, MOUNTINFO);
        assert_eq!(
            h,
            [
                (
                    1,
                    PathBuf::from("/sys/fs/cgroup/memory"),
                    "/box/weir".to_owned()
                ),
                (
                    2,
                    PathBuf::from("/sys/fs/cgroup/unified"),
                    "/system.slice/weir.service".to_owned()
                ),
            ]
        );
        assert!(hierarchies("1:cpu:/\n", MOUNTINFO).is_empty());
    }

    #[test]
    fn more_connections_than_the_headroom_holds_are_warned_of() {
        let limit = Limit {
            bytes: 64 << 20,
            source: "test".to_owned(),
        };
        let defaults = crate::config::parse("", "defaults").unwrap();
        let w = connections_warning(&defaults, Some(&limit)).expect("4096 do not fit");
        assert!(
            w.contains("max_connections = 4096") && w.contains("about 341"),
            "{w}"
        );
        assert_eq!(connections_warning(&defaults, None), None);
        let few = crate::config::parse("[ingress.mqtt]\nmax_connections = 300\n", "few").unwrap();
        assert_eq!(connections_warning(&few, Some(&limit)), None);
    }

    #[test]
    fn unlimited_is_no_limit() {
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("9223372036854771712\n"), None);
        assert_eq!(parse_limit("67108864\n"), Some(64 << 20));
        assert_eq!(parse_limit("garbage"), None);
    }

    #[test]
    fn the_tightest_of_a_cgroup_and_its_parents_applies() {
        let root = std::env::temp_dir().join(format!("weir-cgroup-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let mount = root.join("memory");
        let leaf = mount.join("box/weir");
        std::fs::create_dir_all(&leaf).unwrap();
        std::fs::write(mount.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        std::fs::write(mount.join("box/memory.limit_in_bytes"), "67108864\n").unwrap();
        std::fs::write(leaf.join("memory.limit_in_bytes"), "134217728\n").unwrap();
        let proc = root.join("proc");
        std::fs::create_dir_all(&proc).unwrap();
        std::fs::write(proc.join("cgroup"), "4:memory:/box/weir\n").unwrap();
        std::fs::write(
            proc.join("mountinfo"),
            format!(
                "33 29 0:30 / {} rw,relatime - cgroup cgroup rw,memory\n",
                mount.display()
            ),
        )
        .unwrap();
        let limit = cgroup_limit(&proc).expect("a limit");
        assert_eq!(limit.bytes, 64 << 20);
        assert!(
            limit.source.ends_with("box/memory.limit_in_bytes"),
            "{limit:?}"
        );
        std::fs::write(
            mount.join("box/memory.limit_in_bytes"),
            "9223372036854771712\n",
        )
        .unwrap();
        assert_eq!(cgroup_limit(&proc).unwrap().bytes, 128 << 20);
        std::fs::write(leaf.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        assert_eq!(cgroup_limit(&proc), None);
        std::fs::remove_dir_all(root).unwrap();
    }
}
