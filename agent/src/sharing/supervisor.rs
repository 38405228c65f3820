//! Supervision of the MPS control daemons: a daemon that no longer runs or answers is
//! stopped (its directory cleaned) and started again from its `server.json`, limits read
//! back and `restarts` counted; a failed restart is tried again after a backoff of 1 s
//! doubling to 60 s.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::mps::{MpsController, ServerRecord};

/// The first wait after a failed restart.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait between restart attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// When a server whose restart failed may be tried again, and the wait after that.
#[derive(Debug, Clone, Copy)]
struct Backoff {
    next_try: Instant,
    delay: Duration,
}

/// Restarts MPS control daemons that died, with a backoff per device.
#[derive(Debug, Default)]
pub struct MpsSupervisor {
    /// Devices (`GPU-…`, `MIG-…`) whose last restart failed.
    backoff: Mutex<HashMap<String, Backoff>>,
}

impl MpsSupervisor {
    /// A supervisor that has seen no failure yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// One health check of every server under `mps` (blocking: it runs the control tool).
    /// Returns what it did, one line per server it restarted or failed to.
    pub fn check(&self, mps: &MpsController) -> Vec<String> {
        self.check_sparing(mps, &[])
    }

    /// [`Self::check`], leaving the servers of GPUs `spared` alone (a bench's: neither asked
    /// nor restarted while it measures).
    pub fn check_sparing(&self, mps: &MpsController, spared: &[u32]) -> Vec<String> {
        self.check_with(mps, spared, Instant::now)
    }

    /// [`Self::check_sparing`] with the clock `now`, read once per server (a restart takes
    /// time).
    fn check_with(
        &self,
        mps: &MpsController,
        spared: &[u32],
        now: impl Fn() -> Instant,
    ) -> Vec<String> {
        let down: Vec<_> = mps
            .daemons()
            .into_iter()
            .filter(|d| !spared.contains(&d.record.gpu))
            .filter(|d| !mps.healthy(d))
            .collect();
        let mut reports = Vec::new();
        for daemon in down {
            let now = now();
            let uuid = daemon.record.uuid.clone();
            let delay = match self.backoff().get(&uuid) {
                Some(b) if now < b.next_try => continue,
                Some(b) => b.delay,
                None => FIRST_BACKOFF,
            };
            let restarts = daemon.record.restarts + 1;
            let record = ServerRecord { restarts, ..daemon.record };
            let restarted = mps.stop(&uuid).and_then(|()| mps.start(&record));
            let mut backoff = self.backoff();
            match restarted {
                Ok(pid) => {
                    backoff.remove(&uuid);
                    let line = format!(
                        "MPS server for {uuid} was down: restarted with its limits (PID {pid}, restart {restarts})"
                    );
                    tracing::warn!("{line}");
                    reports.push(line);
                }
                Err(e) => {
                    let next =
                        Backoff { next_try: now + delay, delay: (delay * 2).min(MAX_BACKOFF) };
                    backoff.insert(uuid.clone(), next);
                    let line = format!(
                        "MPS server for {uuid} is down and did not restart: {e}; next try in {} s",
                        delay.as_secs()
                    );
                    tracing::error!("{line}");
                    reports.push(line);
                }
            }
        }
        reports
    }

    fn backoff(&self) -> std::sync::MutexGuard<'_, HashMap<String, Backoff>> {
        self.backoff.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::MpsLimits;
    use crate::sharing::mps::{MpsConfig, MpsLaunch};
    use crate::sys::files::{PRIVATE, write_json};

    #[test]
    fn a_server_that_will_not_restart_is_tried_again_after_a_growing_wait() {
        let dir = tempfile::tempdir().unwrap();
        let mps = MpsController::new(MpsConfig {
            control: "/nonexistent/nvidia-cuda-mps-control".into(),
            root: dir.path().to_path_buf(),
            launch: MpsLaunch::Direct,
        });
        let record = ServerRecord {
            uuid: "GPU-abc".into(),
            gpu: 0,
            placement_start: None,
            compute_instance: 0,
            limits: MpsLimits { active_thread_percentage: 50, pinned_memory_limit_bytes: None },
            restarts: 0,
            daemon: None,
        };
        // A server.json without a live daemon: a server that died.
        let write_record = || {
            std::fs::create_dir_all(mps.pipe_dir("GPU-abc")).unwrap();
            write_json(&mps.server_dir("GPU-abc").join("server.json"), &record, PRIVATE).unwrap();
        };
        write_record();
        let supervisor = MpsSupervisor::new();
        let t0 = Instant::now();
        // A benched GPU's server is left alone.
        assert!(supervisor.check_with(&mps, &[0], Instant::now).is_empty());
        let tries = |at: Instant| {
            write_record();
            supervisor.check_with(&mps, &[], || at)
        };
        let first = tries(t0);
        assert_eq!(first.len(), 1, "{first:?}");
        assert!(first[0].starts_with("MPS server for GPU-abc is down and did not restart: "));
        assert!(first[0].ends_with("; next try in 1 s"), "{first:?}");
        assert!(tries(t0 + Duration::from_millis(500)).is_empty());
        assert!(tries(t0 + Duration::from_secs(1))[0].ends_with("next try in 2 s"));
        assert!(tries(t0 + Duration::from_secs(2)).is_empty());
        assert!(tries(t0 + Duration::from_secs(3))[0].ends_with("next try in 4 s"));
        // The wait stops growing at a minute.
        let mut at = t0 + Duration::from_secs(3);
        for _ in 0..8 {
            at += Duration::from_secs(61);
            tries(at);
        }
        assert!(tries(at + Duration::from_secs(61))[0].ends_with("next try in 60 s"));
    }
}
