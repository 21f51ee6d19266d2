//! `[node]`: who this node is (its id and name), as written, its defaults,
//! checked, and its validation.

use serde::Deserialize;
use weir_core::record::NodeId;

use super::problems::Problems;
use super::units::Size;

/// One node needs no id planning; nodes that peer must each set their own.
pub const NODE_ID: u64 = 1;

/// Short and recognisable in logs and metrics when nothing better is given.
pub const NODE_NAME: &str = "weir";

/// The most async worker threads weir starts by default: a 4-core
/// Raspberry Pi gets one per core; a bigger box gets no more, since weir's
/// work is one scheduler and the egress plus ingress, which 4 threads carry
/// (50k records/s used 0.45 of one core in docs/benchmarks.md), and every
/// worker costs a stack and an allocator arena.
pub const MAX_DEFAULT_WORKERS: usize = 4;

/// Most worker threads that can be asked for.
pub const MAX_WORKERS: u64 = 256;

/// `[node]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawNode {
    pub id: Option<u64>,
    pub name: Option<String>,
    pub worker_threads: Option<u64>,
    pub nice: Option<i64>,
    pub realtime_priority: Option<u64>,
    pub memory_limit: Option<String>,
}

/// The memory weir plans for (`node.memory_limit`): the class queues are
/// sized so that weir stays under it (`weir_core::queueing::memory`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MemoryLimit {
    /// The limit of the cgroup weir runs in (a container's `--memory`,
    /// systemd's `MemoryMax=`), if one is set.
    #[default]
    Auto,
    /// This many bytes.
    Bytes(u64),
    /// None: the queues as configured.
    Unlimited,
}

/// What weir asks of the kernel's CPU scheduler for its threads
/// (`node.nice`, `node.realtime_priority`; crate::priority applies it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuPriority {
    /// Nice value for weir's threads and its session's autogroup
    /// (-20..=19); `None`: as started.
    pub nice: Option<i32>,
    /// `SCHED_RR` at this priority (1..=99) for weir's threads; `None`:
    /// the normal time-sharing policy.
    pub realtime: Option<u8>,
}

impl CpuPriority {
    /// Whether anything is asked for.
    pub fn is_set(&self) -> bool {
        self.nice.is_some() || self.realtime.is_some()
    }
}

/// `[node]`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    /// Origin id stamped on every record entering here; never 0.
    pub id: NodeId,
    /// Name for logs and metrics.
    pub name: String,
    /// Async worker threads; `None`: one per core, at most
    /// [`MAX_DEFAULT_WORKERS`].
    pub worker_threads: Option<usize>,
    /// CPU priority of weir's threads; off by default.
    pub priority: CpuPriority,
    /// The memory weir plans for.
    pub memory_limit: MemoryLimit,
}

impl NodeConfig {
    /// The worker threads to start on a machine with `cores` cores.
    pub fn workers(&self, cores: usize) -> usize {
        self.worker_threads
            .unwrap_or_else(|| cores.clamp(1, MAX_DEFAULT_WORKERS))
    }
}

/// `[node]` checked, or `None` after recording why.
pub(crate) fn node(p: &mut Problems, raw: RawNode) -> Option<NodeConfig> {
    let before = p.len();
    let id = raw.id.unwrap_or(NODE_ID);
    if id == 0 {
        p.push(
            "node.id",
            "0 is reserved; give a positive id, unique among the nodes that peer",
        );
    }
    let name = raw.name.unwrap_or_else(|| NODE_NAME.to_owned());
    if name.trim().is_empty() {
        p.push("node.name", "must not be empty");
    }
    let worker_threads = p
        .within(
            "node.worker_threads",
            raw.worker_threads,
            1..=MAX_WORKERS,
            &format!("; leave it out for one per core (at most {MAX_DEFAULT_WORKERS})"),
        )
        .map(|n| n as usize);
    let nice = p
        .within(
            "node.nice",
            raw.nice,
            -20..=19,
            " (lower is more CPU for weir; leave it out to keep the priority weir was started with)",
        )
        .map(|n| n as i32);
    let realtime = p
        .within(
            "node.realtime_priority",
            raw.realtime_priority,
            1..=99,
            " (SCHED_RR priority; leave it out for the normal policy)",
        )
        .map(|n| n as u8);
    let memory_limit = match raw.memory_limit.as_deref().map(str::trim) {
        None | Some("auto") => MemoryLimit::Auto,
        Some("none") => MemoryLimit::Unlimited,
        Some(text) => match text.parse::<Size>() {
            Ok(size) if size.bytes() > 0 => MemoryLimit::Bytes(size.bytes()),
            Ok(_) => {
                p.push(
                    "node.memory_limit",
                    "must be more than 0; \"auto\" reads the cgroup's limit, \"none\" plans for none",
                );
                MemoryLimit::Auto
            }
            Err(e) => {
                p.push(
                    "node.memory_limit",
                    format!("{e}; or \"auto\" (the cgroup's limit) or \"none\""),
                );
                MemoryLimit::Auto
            }
        },
    };
    (p.len() == before).then_some(NodeConfig {
        id,
        name,
        worker_threads,
        priority: CpuPriority { nice, realtime },
        memory_limit,
    })
}
