//! Jobs: the applies and probes that hold the apply lock while they run, what they are
//! ([`JobKind`]), and how they ended ([`JobReport`], [`JobResult`]).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use gpushare_proto::types::ProbeReport;
use tokio::sync::{Notify, OwnedMutexGuard};

use super::error::EngineError;
use super::events::{EngineEvent, Events};
use crate::apply::hooks::Settled;

/// What a job does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobKind {
    /// Applies a profile.
    Apply {
        /// The profile.
        profile: String,
    },
    /// Probes a GPU or MIG instance.
    Probe {
        /// `GPU-…` or `MIG-…`.
        target: String,
    },
    /// Benches a command (or a built-in workload) under each strategy on a GPU.
    Bench {
        /// `GPU-…`.
        target: String,
    },
}

impl JobKind {
    /// What the job works on, for people: the profile, or `probe of <device>`.
    pub fn subject(&self) -> String {
        match self {
            JobKind::Apply { profile } => profile.clone(),
            JobKind::Probe { target } => format!("probe of {target}"),
            JobKind::Bench { target } => format!("bench on {target}"),
        }
    }

    /// Whether its whole outcome is its caller's alone (a bench: the caller's command,
    /// the report and what the replicas printed).
    pub fn is_private(&self) -> bool {
        matches!(self, JobKind::Bench { .. })
    }
}

/// The job holding the apply lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningJob {
    /// Its name: the job object's path, or `start-up`.
    pub id: String,
    /// What it does.
    pub kind: JobKind,
}

impl RunningJob {
    /// Whether the job is a probe.
    pub fn is_probe(&self) -> bool {
        matches!(self.kind, JobKind::Probe { .. })
    }

    /// Whether the job is an apply.
    pub fn is_apply(&self) -> bool {
        matches!(self.kind, JobKind::Apply { .. })
    }
}

/// `/io/gpushare/Agent1/jobs/3, profile half-balanced`, as `status` shows it.
impl fmt::Display for RunningJob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            JobKind::Apply { profile } => write!(f, "{}, profile {profile}", self.id),
            JobKind::Probe { target } => write!(f, "{}, probe of {target}", self.id),
            JobKind::Bench { target } => write!(f, "{}, bench on {target}", self.id),
        }
    }
}

/// How a job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobResult {
    /// It changed the GPUs (or probed them) as asked.
    Success,
    /// The GPUs were already as asked: nothing changed.
    Unchanged,
    /// It failed, and what it had changed was rolled back.
    RolledBack,
    /// It failed otherwise: refused by a hook, journal not written, rollback failed, a
    /// probe that could not measure.
    Failed,
}

impl JobResult {
    /// Whether the job did what was asked.
    pub fn is_ok(self) -> bool {
        matches!(self, JobResult::Success | JobResult::Unchanged)
    }

    /// `success`, `unchanged`, `rolled_back` or `failed` (the metrics' `result` label).
    pub fn as_str(self) -> &'static str {
        match self {
            JobResult::Success => "success",
            JobResult::Unchanged => "unchanged",
            JobResult::RolledBack => "rolled_back",
            JobResult::Failed => "failed",
        }
    }
}

impl From<Settled> for JobResult {
    fn from(settled: Settled) -> Self {
        match settled {
            Settled::Success => JobResult::Success,
            Settled::RolledBack => JobResult::RolledBack,
            Settled::Failed => JobResult::Failed,
        }
    }
}

/// Everything about a finished job that its client is told.
#[derive(Debug, Clone, PartialEq)]
pub struct JobReport {
    /// What the job did.
    pub kind: JobKind,
    /// How it ended.
    pub result: JobResult,
    /// Whether the GPUs changed (a failed rollback leaves them changed).
    pub changed: bool,
    /// Steps carried out.
    pub steps_done: u32,
    /// Steps planned.
    pub steps_total: u32,
    /// Wall time of the job.
    pub duration: Duration,
    /// Why it failed.
    pub error: Option<EngineError>,
    /// Problems that did not fail the job (a failing `post_apply` hook).
    pub warnings: Vec<String>,
    /// A probe's results.
    pub probe: Option<ProbeReport>,
    /// A bench's results.
    pub bench: Option<gpushare_proto::bench::BenchReport>,
}

/// The apply lock, held by one job: it names the job for `status` and for `Busy` errors
/// while the job runs. [`JobGuard::finish`] (or dropping it) clears the name and, for a
/// job that had started, tells the engine's listeners that the GPUs may have changed; the
/// lock itself goes only when the guard is dropped, after the outcome was reported, and
/// then wakes the calls that wait for it (those that arrived during the re-apply at
/// start-up).
pub struct JobGuard {
    /// `Some` until the guard is dropped.
    lock: Option<OwnedMutexGuard<()>>,
    released: Arc<Notify>,
    running: Arc<Mutex<Option<RunningJob>>>,
    events: Events,
    kind: JobKind,
    started: bool,
    finished: AtomicBool,
    /// Moved on when the job begins and when it ends (see `Engine::job_epoch`).
    epoch: Arc<AtomicU64>,
}

impl JobGuard {
    /// Holds `lock` for `job`, which `running` names while it is held; `released` is told
    /// when the lock goes.
    pub(super) fn new(
        lock: OwnedMutexGuard<()>,
        job: RunningJob,
        running: Arc<Mutex<Option<RunningJob>>>,
        released: Arc<Notify>,
        events: Events,
        epoch: Arc<AtomicU64>,
    ) -> Self {
        let kind = job.kind.clone();
        *running.lock().unwrap_or_else(PoisonError::into_inner) = Some(job);
        epoch.fetch_add(1, Ordering::SeqCst);
        JobGuard {
            lock: Some(lock),
            released,
            running,
            events,
            kind,
            started: false,
            finished: false.into(),
            epoch,
        }
    }

    /// The job has been planned and begins its `steps`.
    pub(super) fn start(&mut self, steps: u32) {
        self.started = true;
        self.events.emit(EngineEvent::JobStarted { kind: self.kind.clone(), steps });
    }

    /// The job's work is over: `status` no longer names it, before its client hears the
    /// outcome (a `status` right after `Finished` must not show the job running). The lock
    /// stays held until the guard is dropped, so no other job starts in between.
    pub(super) fn finish(&self) {
        if self.finished.swap(true, Ordering::SeqCst) {
            return;
        }
        self.epoch.fetch_add(1, Ordering::SeqCst);
        *self.running.lock().unwrap_or_else(PoisonError::into_inner) = None;
        if self.started {
            self.events.emit(EngineEvent::JobEnded { kind: self.kind.clone() });
        }
    }
}

impl Drop for JobGuard {
    fn drop(&mut self) {
        self.finish();
        drop(self.lock.take());
        self.released.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_jobs_read_as_status_shows_them() {
        let apply = RunningJob {
            id: "/io/gpushare/Agent1/jobs/3".into(),
            kind: JobKind::Apply { profile: "half-balanced".into() },
        };
        assert_eq!(apply.to_string(), "/io/gpushare/Agent1/jobs/3, profile half-balanced");
        assert!(apply.is_apply() && !apply.is_probe());
        let probe =
            RunningJob { id: "start-up".into(), kind: JobKind::Probe { target: "GPU-1".into() } };
        assert_eq!(probe.to_string(), "start-up, probe of GPU-1");
        assert_eq!(probe.kind.subject(), "probe of GPU-1");
    }

    #[test]
    fn busy_errors_name_the_running_job() {
        let probe = RunningJob {
            id: "/io/gpushare/Agent1/jobs/9".into(),
            kind: JobKind::Probe { target: "GPU-1".into() },
        };
        assert_eq!(
            EngineError::Busy(Some(probe)).to_string(),
            "a probe is running (/io/gpushare/Agent1/jobs/9, probe of GPU-1); try again when it has finished"
        );
        assert_eq!(
            EngineError::Busy(None).to_string(),
            "another apply is running (recovery at start-up); try again when it has finished"
        );
    }
}
