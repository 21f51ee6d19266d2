//! Files weir reads once at start and again whenever they change on disk:
//! certificates and keys (rotation without a restart), password and ACL
//! files. A change that does not load (a half-written certificate, a typo
//! in the ACL) is logged and the previous version stays in force; existing
//! connections keep what they were admitted with.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::Problem;

/// How often the files are looked at: a `stat` per file, so cheap; a
/// rotated certificate is served within this long.
pub const WATCH_PERIOD: Duration = Duration::from_secs(2);

/// What identifies a version of a file without reading it.
type Stamp = Option<(SystemTime, u64, u64)>;

fn stamp(path: &PathBuf) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len(), m.ino()))
}

type Loader<T> = Box<dyn Fn() -> Result<T, Vec<Problem>> + Send + Sync>;

/// A value built from files, rebuilt when they change.
pub struct Watched<T> {
    what: String,
    paths: Vec<PathBuf>,
    load: Loader<T>,
    current: RwLock<Arc<T>>,
    stamps: Mutex<Vec<Stamp>>,
}

impl<T> std::fmt::Debug for Watched<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watched")
            .field("what", &self.what)
            .field("paths", &self.paths)
            .finish_non_exhaustive()
    }
}

impl<T> Watched<T> {
    /// Builds the value once; `what` names it in log lines.
    pub fn new(
        what: impl Into<String>,
        paths: Vec<PathBuf>,
        load: impl Fn() -> Result<T, Vec<Problem>> + Send + Sync + 'static,
    ) -> Result<Self, Vec<Problem>> {
        let stamps = paths.iter().map(stamp).collect();
        let value = load()?;
        Ok(Watched {
            what: what.into(),
            paths,
            load: Box::new(load),
            current: RwLock::new(Arc::new(value)),
            stamps: Mutex::new(stamps),
        })
    }

    /// The version in force.
    pub fn get(&self) -> Arc<T> {
        self.current.read().expect("not poisoned").clone()
    }

    /// Rebuilds the value if a file changed since the last look; returns
    /// whether a new version is in force.
    pub fn refresh(&self) -> bool {
        let now: Vec<Stamp> = self.paths.iter().map(stamp).collect();
        {
            let mut stamps = self.stamps.lock().expect("not poisoned");
            if *stamps == now {
                return false;
            }
            // Looked at once per change, loaded or not: a broken file is
            // reported once, and tried again when it changes again.
            *stamps = now;
        }
        match (self.load)() {
            Ok(value) => {
                *self.current.write().expect("not poisoned") = Arc::new(value);
                info!(what = %self.what, "reloaded after its files changed");
                true
            }
            Err(problems) => {
                for p in problems {
                    warn!(what = %self.what, problem = %p, "changed file not used; the previous version stays in force");
                }
                false
            }
        }
    }
}

/// Something [`watch`] refreshes.
pub trait Refresh: Send + Sync {
    /// See [`Watched::refresh`].
    fn refresh(&self) -> bool;
}

impl<T: Send + Sync> Refresh for Watched<T> {
    fn refresh(&self) -> bool {
        Watched::refresh(self)
    }
}

/// Refreshes `items` every [`WATCH_PERIOD`] until `shutdown`.
pub async fn watch(items: Vec<Arc<dyn Refresh>>, shutdown: CancellationToken) {
    if items.is_empty() {
        return;
    }
    let mut tick = tokio::time::interval(WATCH_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // Cancel safety: both branches only wait.
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let items = items.clone();
        // Loading reads files and may hash certificates: off the runtime.
        let _ = tokio::task::spawn_blocking(move || {
            for item in &items {
                item.refresh();
            }
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_file_is_reloaded_and_a_broken_one_is_not() {
        let dir = std::env::temp_dir().join(format!("weir-watch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("n");
        std::fs::write(&file, "1").unwrap();
        let path = file.clone();
        let w = Watched::new("n", vec![file.clone()], move || {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            text.trim().parse::<u32>().map_err(|e| {
                vec![Problem {
                    path: "n".into(),
                    message: e.to_string(),
                }]
            })
        })
        .unwrap();
        assert_eq!(*w.get(), 1);
        assert!(!w.refresh(), "nothing changed");
        std::fs::write(&file, "22").unwrap();
        assert!(w.refresh());
        assert_eq!(*w.get(), 22);
        std::fs::write(&file, "not a number").unwrap();
        assert!(!w.refresh());
        assert_eq!(*w.get(), 22, "the previous version stays");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
