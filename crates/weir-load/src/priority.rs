//! Who competes for the CPU in `contention`: the box (weir and the busy
//! processes, each in a session of its own at normal priority, as services
//! and programs on an edge box are) and, only because this lab runs on one
//! machine, the outside world (the devices and the consumer in this
//! process, and RabbitMQ standing in for the cloud).
//!
//! Linux's autogroup (`kernel.sched_autogroup_enabled`) shares the CPU
//! between sessions before it shares it between the tasks of one, so a
//! process's nice value counts only inside its session. [`Outside`] raises
//! the outside world in both: its sessions' autogroup nice and every one of
//! its threads' nice, restored when dropped.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

/// Starts `cmd` in a session of its own (its own autogroup) at nice 0,
/// whatever the priority of this process.
pub fn own_session(cmd: &mut Command) {
    // SAFETY: setsid and setpriority are async-signal-safe and touch only
    // the child between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            if libc::setpriority(libc::PRIO_PROCESS, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The outside world raised to `nice` for as long as this lives.
pub struct Outside {
    /// Autogroup files and the nice they had.
    groups: Vec<(PathBuf, i32)>,
    /// Threads and the nice they had.
    threads: Vec<(i32, i32)>,
}

impl Outside {
    /// Raises this process and every process named `beam.smp` (RabbitMQ)
    /// to `nice`. What cannot be changed is reported and left alone.
    pub fn raise(nice: i32) -> Outside {
        let mut pids = vec![std::process::id() as i32];
        pids.extend(pids_named("beam.smp"));
        let mut out = Outside {
            groups: Vec::new(),
            threads: Vec::new(),
        };
        for pid in pids {
            let group = PathBuf::from(format!("/proc/{pid}/autogroup"));
            if let Some(old) = autogroup_nice(&group) {
                if !same_group(&out.groups, &group) {
                    match std::fs::write(&group, nice.to_string()) {
                        Ok(()) => out.groups.push((group, old)),
                        Err(e) => eprintln!("contention: {}: {e}", group.display()),
                    }
                }
            }
            for tid in tasks(pid) {
                // SAFETY: plain syscalls on a thread id.
                unsafe {
                    *libc::__errno_location() = 0;
                    let old = libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t);
                    if *libc::__errno_location() == 0
                        && libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) == 0
                    {
                        out.threads.push((tid, old));
                    }
                }
            }
        }
        out
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        for (group, old) in &self.groups {
            let _ = std::fs::write(group, old.to_string());
        }
        for &(tid, old) in &self.threads {
            // SAFETY: a plain syscall; a thread gone since is an error ignored.
            unsafe {
                libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, old);
            }
        }
    }
}

/// Whether `group` names an autogroup already in `groups` (processes of one
/// session share it).
fn same_group(groups: &[(PathBuf, i32)], group: &PathBuf) -> bool {
    let name = |p: &PathBuf| {
        std::fs::read_to_string(p)
            .ok()
            .and_then(|s| s.split_whitespace().next().map(str::to_owned))
    };
    let mine = name(group);
    mine.is_some() && groups.iter().any(|(g, _)| name(g) == mine)
}

/// The nice of the autogroup in `/proc/<pid>/autogroup` ("/autogroup-N nice K").
fn autogroup_nice(path: &PathBuf) -> Option<i32> {
    let text = std::fs::read_to_string(path).ok()?;
    text.split_whitespace().last()?.parse().ok()
}

/// The thread ids of `pid`.
fn tasks(pid: i32) -> Vec<i32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Processes whose command name is `name`.
fn pids_named(name: &str) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        (comm.trim() == name).then_some(pid)
    })
    .collect()
}
