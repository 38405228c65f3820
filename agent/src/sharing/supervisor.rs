//! Supervision of the MPS control daemons, at every health check:
//!
//! - a daemon that no longer runs or answers is stopped (its directory cleaned) and
//!   started again from its `server.json`, limits read back and `restarts` counted; a
//!   failed restart is tried again after a backoff of 1 s doubling to 60 s;
//! - the limits a daemon that answers applies now (its live limits, read in the same one
//!   control run that tells it answers) are compared with what the agent set: its default
//!   limits with the record's, each server process's with the record's and the `mps limit`
//!   override recorded for it. Drift seen at one check is left for that check's drift report
//!   (`status`, the log, the metrics) and put back at the next check if it is still the
//!   same; a restore that fails (the daemon refuses, or the value does not take) is logged
//!   once per distinct drift and tried again only when the drift changes;
//! - the overrides of server processes that are gone are forgotten (a server started after
//!   them begins with the daemon's defaults).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::mps::{MpsController, MpsDaemon, ServerRecord};
use crate::node::{LimitDrift, LiveLimits, LiveServer, MpsServerDetail, limits_text};
use crate::sys::procfs::alive;

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

/// What the supervisor made of a server's drift at the last check.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    /// Seen once: put back at the next check if it is still this.
    Once(LimitDrift),
    /// A restore of this drift failed (and was logged).
    Failed(LimitDrift),
}

/// What one health check did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CheckReport {
    /// One line per server restarted, or whose restart failed.
    pub restarts: Vec<String>,
    /// One line per server whose drifted limits were put back, or could not be.
    pub restores: Vec<String>,
    /// The servers found down at this check (restarted or not) that had clients when the
    /// check before reached them, by the device they serve, their GPU and those clients:
    /// they died with it (issue 42). Listed once, at the check that finds it down.
    pub down: Vec<(String, u32, Vec<u32>)>,
    /// Those left down: their GPU or instance is unhealthy (`held`), one line each.
    pub held: Vec<String>,
}

impl CheckReport {
    /// Every line, restarts first.
    pub fn lines(&self) -> Vec<String> {
        self.restarts.iter().chain(&self.restores).cloned().collect()
    }
}

/// Restarts MPS control daemons that died and puts drifted limits back, with a backoff
/// per device.
#[derive(Debug, Default)]
pub struct MpsSupervisor {
    /// Devices (`GPU-…`, `MIG-…`) whose last restart failed.
    backoff: Mutex<HashMap<String, Backoff>>,
    /// The drift of each device seen at the last check.
    drift: Mutex<HashMap<String, Seen>>,
    /// Drifts put back, by device, since the agent started.
    restores: Mutex<HashMap<String, u32>>,
    /// Devices whose server is down and held down (their GPU is unhealthy).
    held: Mutex<std::collections::HashSet<String>>,
    /// The clients each server had at the last check that reached it.
    clients: Mutex<HashMap<String, Vec<u32>>>,
}

impl MpsSupervisor {
    /// A supervisor that has seen no failure yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// One health check of every server under `mps` (blocking: it runs the control tool),
    /// leaving the servers of GPUs `spared` alone (a bench's: neither asked nor restarted
    /// while it measures), and restarting a server that is down only where `unhealthy`
    /// says its GPU or instance has no fault (a server is not started again there).
    pub fn check(
        &self,
        mps: &MpsController,
        spared: &[u32],
        unhealthy: &dyn Fn(&ServerRecord) -> bool,
    ) -> CheckReport {
        self.check_with(mps, spared, unhealthy, Instant::now)
    }

    /// [`Self::check`] with the clock `now`, read once per server (a restart takes time).
    fn check_with(
        &self,
        mps: &MpsController,
        spared: &[u32],
        unhealthy: &dyn Fn(&ServerRecord) -> bool,
        now: impl Fn() -> Instant,
    ) -> CheckReport {
        let mut report = CheckReport::default();
        let mut down = Vec::new();
        let daemons = mps.daemons();
        // What is kept per server goes with the server (an apply removes it, a MIG layout
        // changes the devices).
        let known: std::collections::HashSet<String> =
            daemons.iter().map(|d| d.record.uuid.clone()).collect();
        self.clients_seen().retain(|uuid, _| known.contains(uuid));
        self.held_set().retain(|uuid| known.contains(uuid));
        for daemon in daemons.into_iter().filter(|d| !spared.contains(&d.record.gpu)) {
            let uuid = daemon.record.uuid.clone();
            let detail =
                MpsServerDetail::configured(daemon.record.spec(), daemon.record.overrides.clone());
            // The read of its limits is the check that it answers.
            let read = daemon
                .pid
                .filter(|&pid| alive(pid))
                .and_then(|_| mps.read_live(&uuid, &detail, true).ok());
            match read {
                Some(read) => {
                    self.release(&uuid);
                    // Who a server serves, kept for the day it dies: the driver lists its
                    // clients no more then.
                    if let Some(clients) = &read.clients {
                        self.clients_seen().insert(uuid.clone(), clients.clone());
                    }
                    let servers: Vec<LiveServer> = read
                        .servers
                        .iter()
                        .map(|&(pid, limits)| LiveServer { pid, uid: None, limits })
                        .collect();
                    let live = LiveLimits { defaults: read.defaults, servers };
                    self.forget_gone_overrides(mps, &daemon, &live);
                    let detail = MpsServerDetail { live: Some(live), ..detail };
                    if let Some(line) = self.put_back(mps, &daemon, &detail) {
                        report.restores.push(line);
                    }
                }
                None => down.push(daemon),
            }
        }
        for daemon in down {
            let (uuid, gpu) = (daemon.record.uuid.clone(), daemon.record.gpu);
            // Its clients are taken once: a server that stays down is not reported again.
            let clients = self.clients_seen().remove(&uuid).filter(|c| !c.is_empty());
            if let Some(clients) = clients.filter(|_| !self.is_held(&uuid)) {
                report.down.push((uuid.clone(), gpu, clients));
            }
            if unhealthy(&daemon.record) {
                if self.hold(&uuid) {
                    let line = format!(
                        "MPS server for {uuid} is down and stays down: its GPU is unhealthy (it restarts once the GPU is healthy)"
                    );
                    tracing::warn!("{line}");
                    report.held.push(line);
                }
                continue;
            }
            self.release(&uuid);
            if let Some(line) = self.restart(mps, daemon, now()) {
                report.restarts.push(line);
            }
        }
        report
    }

    fn clients_seen(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<u32>>> {
        self.clients.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn held_set(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `uuid`'s server is held down.
    fn is_held(&self, uuid: &str) -> bool {
        self.held_set().contains(uuid)
    }

    /// Holds `uuid`'s server down; true the first time.
    fn hold(&self, uuid: &str) -> bool {
        self.held_set().insert(uuid.to_string())
    }

    /// Lets `uuid`'s server be restarted again.
    fn release(&self, uuid: &str) {
        self.held_set().remove(uuid);
    }

    /// Restarts `daemon` (down) unless its backoff runs; the line for the log, if it tried.
    fn restart(&self, mps: &MpsController, daemon: MpsDaemon, now: Instant) -> Option<String> {
        let uuid = daemon.record.uuid.clone();
        let delay = match self.backoff().get(&uuid) {
            Some(b) if now < b.next_try => return None,
            Some(b) => b.delay,
            None => FIRST_BACKOFF,
        };
        self.drifts().remove(&uuid);
        let restarts = daemon.record.restarts + 1;
        let record = ServerRecord { restarts, ..daemon.record };
        let restarted = mps.stop(&uuid).and_then(|()| mps.start(&record));
        let mut backoff = self.backoff();
        Some(match restarted {
            Ok(pid) => {
                backoff.remove(&uuid);
                let line = format!(
                    "MPS server for {uuid} was down: restarted with its limits (PID {pid}, restart {restarts})"
                );
                tracing::warn!("{line}");
                line
            }
            Err(e) => {
                let next = Backoff { next_try: now + delay, delay: (delay * 2).min(MAX_BACKOFF) };
                backoff.insert(uuid.clone(), next);
                let line = format!(
                    "MPS server for {uuid} is down and did not restart: {e}; next try in {} s",
                    delay.as_secs()
                );
                tracing::error!("{line}");
                line
            }
        })
    }

    /// Puts `daemon`'s drifted limits back when the previous check saw the same drift; the
    /// line for the log when it tried.
    fn put_back(
        &self,
        mps: &MpsController,
        daemon: &MpsDaemon,
        detail: &MpsServerDetail,
    ) -> Option<String> {
        let uuid = &daemon.record.uuid;
        let drift = detail.drift();
        let mut seen = self.drifts();
        if drift.is_empty() {
            seen.remove(uuid);
            return None;
        }
        match seen.get(uuid) {
            Some(Seen::Once(before)) if *before == drift => {}
            Some(Seen::Failed(before)) if *before == drift => return None,
            // New: the drift check reports it; put back at the next check.
            _ => {
                seen.insert(uuid.clone(), Seen::Once(drift));
                return None;
            }
        }
        Some(match mps.restore_limits(uuid, detail, &drift) {
            Ok(restored) => {
                seen.remove(uuid);
                *self
                    .restores
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entry(uuid.clone())
                    .or_default() += 1;
                let mut what = Vec::new();
                if let Some((was, now)) = restored.defaults {
                    what.push(format!(
                        "its default limits {} -> {}",
                        limits_text(was),
                        limits_text(now)
                    ));
                }
                for (pid, was, now) in restored.servers {
                    what.push(format!(
                        "server {pid}'s limits {} -> {}",
                        limits_text(was),
                        limits_text(now)
                    ));
                }
                let line = format!(
                    "MPS server for {uuid} (GPU {}): limits changed outside gpushare put back: {}",
                    daemon.record.gpu,
                    what.join("; ")
                );
                tracing::warn!("{line}");
                line
            }
            Err(e) => {
                seen.insert(uuid.clone(), Seen::Failed(drift));
                let line = format!(
                    "MPS server for {uuid} (GPU {}): limits changed outside gpushare could not be put back: {e}",
                    daemon.record.gpu
                );
                tracing::error!("{line}");
                line
            }
        })
    }

    /// Forgets the overrides of `daemon`'s server processes that `live` no longer lists.
    fn forget_gone_overrides(&self, mps: &MpsController, daemon: &MpsDaemon, live: &LiveLimits) {
        let running: Vec<u32> = live.servers.iter().map(|s| s.pid).collect();
        let record = &daemon.record;
        if record.overrides.iter().all(|o| running.contains(&o.server_pid)) {
            return;
        }
        match mps.forget_overrides(&record.uuid, &running) {
            Ok(gone) => {
                for o in gone {
                    tracing::info!(
                        "MPS server for {} (GPU {}): the `mps limit` override of server {} ended with that server; servers started since have the profile's limits ({})",
                        record.uuid,
                        record.gpu,
                        o.server_pid,
                        limits_text(record.limits)
                    );
                }
            }
            Err(e) => tracing::warn!("{e}"),
        }
    }

    /// How often each device's drifted limits were put back since the agent started.
    pub fn restores(&self) -> HashMap<String, u32> {
        self.restores.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn backoff(&self) -> std::sync::MutexGuard<'_, HashMap<String, Backoff>> {
        self.backoff.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn drifts(&self) -> std::sync::MutexGuard<'_, HashMap<String, Seen>> {
        self.drift.lock().unwrap_or_else(PoisonError::into_inner)
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
            multi_user: false,
            restarts: 0,
            daemon: None,
            overrides: Vec::new(),
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
        assert!(supervisor.check_with(&mps, &[0], &|_| false, Instant::now).lines().is_empty());
        let tries = |at: Instant| {
            write_record();
            supervisor.check_with(&mps, &[], &|_| false, || at).lines()
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
