//! `node.nice` and `node.realtime_priority`: what weir asks of the kernel's
//! CPU scheduler, applied to the main thread before the runtime starts, so
//! that every thread weir starts (the async workers that run ingress, the
//! scheduler and the egress, and the blocking pool that compresses
//! batches) inherits it.
//!
//! A nice value alone is not enough on most Linux boxes: with
//! `kernel.sched_autogroup_enabled` (the default on Debian) the CPU is
//! shared between sessions before it is shared between the threads of one,
//! and weir is a session of its own (systemd starts every service as one),
//! so its threads' nice counts only against each other. weir therefore also
//! sets its session's autogroup nice (`/proc/self/autogroup`) to the same
//! value. Under a systemd unit with CPU accounting the service's cgroup
//! shares the CPU by `CPUWeight=` instead (docs/operations.md).
//!
//! Lowering the nice value or asking for `SCHED_RR` needs `CAP_SYS_NICE`
//! (or root); without it start-up fails with a message that says so, since
//! a bound the operator tuned the box for would otherwise silently not
//! hold.

use std::path::Path;

use crate::config::CpuPriority;

/// The session's autogroup, where the kernel has autogroups.
const AUTOGROUP: &str = "/proc/self/autogroup";

/// Why a priority could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum PriorityError {
    /// setpriority(2) or writing the autogroup's nice failed.
    #[error("node.nice = {nice}: {what}: {source}{hint}")]
    Nice {
        /// The value asked for.
        nice: i32,
        /// What was being set.
        what: &'static str,
        /// What the OS said.
        #[source]
        source: std::io::Error,
        /// How to grant it, when the OS refused permission.
        hint: &'static str,
    },
    /// sched_setscheduler(2) failed.
    #[error("node.realtime_priority = {priority}: cannot switch to SCHED_RR: {source}{hint}")]
    Realtime {
        /// The priority asked for.
        priority: u8,
        /// What the OS said.
        #[source]
        source: std::io::Error,
        /// How to grant it, when the OS refused permission.
        hint: &'static str,
    },
}

/// Said when the kernel refuses for want of permission.
const GRANT: &str = "; weir needs CAP_SYS_NICE for this (in its unit: AmbientCapabilities=CAP_SYS_NICE, or the unit's own Nice=/CPUSchedulingPolicy= settings instead; see docs/operations.md)";

fn hint(e: &std::io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => GRANT,
        _ => "",
    }
}

/// Applies `p` to the calling thread (and so to every thread it starts
/// afterwards) and, for a nice value, to the session's autogroup.
pub fn apply(p: &CpuPriority) -> Result<(), PriorityError> {
    if let Some(nice) = p.nice {
        // On Linux PRIO_PROCESS with 0 is the calling thread; threads
        // started from it inherit its nice value.
        // SAFETY: a plain syscall on the calling thread.
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) } != 0 {
            let source = std::io::Error::last_os_error();
            return Err(PriorityError::Nice {
                nice,
                what: "cannot set the threads' nice value",
                hint: hint(&source),
                source,
            });
        }
        set_autogroup(Path::new(AUTOGROUP), nice)?;
    }
    if let Some(priority) = p.realtime {
        let param = libc::sched_param {
            sched_priority: i32::from(priority),
        };
        // SAFETY: a plain syscall on the calling thread with a valid param.
        if unsafe { libc::sched_setscheduler(0, libc::SCHED_RR, &param) } != 0 {
            let source = std::io::Error::last_os_error();
            return Err(PriorityError::Realtime {
                priority,
                hint: hint(&source),
                source,
            });
        }
    }
    if p.is_set() {
        tracing::info!(nice = ?p.nice, realtime_priority = ?p.realtime, "CPU priority applied");
    }
    Ok(())
}

/// Sets the autogroup at `path` to `nice`; nothing where the kernel has no
/// autogroups.
fn set_autogroup(path: &Path, nice: i32) -> Result<(), PriorityError> {
    if !path.exists() {
        return Ok(());
    }
    std::fs::write(path, nice.to_string()).map_err(|source| PriorityError::Nice {
        nice,
        what: "cannot set the session's autogroup nice (/proc/self/autogroup)",
        hint: hint(&source),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_says_how_to_grant_the_capability() {
        let e = PriorityError::Realtime {
            priority: 10,
            source: std::io::Error::from_raw_os_error(libc::EPERM),
            hint: hint(&std::io::Error::from_raw_os_error(libc::EPERM)),
        };
        let text = e.to_string();
        assert!(text.contains("node.realtime_priority = 10"), "{text}");
        assert!(text.contains("CAP_SYS_NICE"), "{text}");
        assert_eq!(hint(&std::io::Error::from_raw_os_error(libc::EINVAL)), "");
    }

    #[test]
    fn nothing_asked_changes_nothing() {
        // SAFETY: plain syscalls on the calling thread.
        let before = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        apply(&CpuPriority::default()).unwrap();
        assert_eq!(unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) }, before);
    }

    #[test]
    fn no_autogroup_file_is_no_error() {
        set_autogroup(Path::new("/nonexistent/autogroup"), -5).unwrap();
    }
}
