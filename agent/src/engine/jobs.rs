//! Jobs: the guards of the applies and probes that hold the apply lock while they run
//! ([`JobGuard`]), the benches that claim their GPU for their whole length ([`BenchClaim`],
//! [`Claims`]), the moments the agent holds the lock for itself ([`Moments`]), and what a
//! finished job's client is told ([`JobReport`]). What a job is and how it ended
//! ([`JobKind`], [`RunningJob`], [`JobResult`]) are words of their own ([`super::job_kind`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use gpushare_proto::types::ProbeReport;
use tokio::sync::{Notify, OwnedMutexGuard};

use super::error::EngineError;
use super::events::{EngineEvent, Events};
pub use super::job_kind::{JobKind, JobResult, RunningJob};

/// A GPU a bench holds from its start to its end: no apply that selects the GPU, no
/// other bench or probe, no MPS limit or health check touches it meanwhile. Named in `Busy`
/// errors and `status` (open to all: who, which GPU, since when and what comes back; never
/// the command).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchClaim {
    /// The bench's job (its object path).
    pub job: String,
    /// The GPU's index.
    pub gpu: u32,
    /// `GPU-…`.
    pub uuid: String,
    /// Who started the bench.
    pub uid: u32,
    /// Their user name, when the password database knows it.
    pub user: Option<String>,
    /// When the bench began.
    pub since: SystemTime,
    /// The profile active when the bench began.
    pub profile_before: Option<String>,
    /// The GPU's layout the bench puts back, in words (`MIG off, compute mode default,
    /// MPS at 100 % threads`).
    pub restores: String,
}

impl BenchClaim {
    /// `ada (uid 1000)`, or `uid 1000` for a user the password database does not know.
    pub fn who(&self) -> String {
        match &self.user {
            Some(name) => format!("{name} (uid {})", self.uid),
            None => format!("uid {}", self.uid),
        }
    }

    /// The bench as a `Busy` error names it: `a bench is running (/io/gpushare/Agent1/jobs/3,
    /// bench on GPU 0, started by ada (uid 1000)); try again when it has finished`.
    pub fn holder(&self) -> RunningJob {
        RunningJob {
            id: self.job.clone(),
            kind: JobKind::Bench { target: format!("GPU {}, started by {}", self.gpu, self.who()) },
        }
    }
}

/// What holds the apply lock for a moment without being a job ([`JobKind::Moment`]), so
/// that a caller whose wait for the lock runs out is told what held it instead of a
/// nameless holder.
#[derive(Debug, Default, Clone)]
pub struct Moments(Arc<Mutex<Option<RunningJob>>>);

impl Moments {
    /// Names `what` as the lock's holder until the returned guard is dropped. Call it
    /// right after the lock is taken.
    pub(super) fn hold(&self, what: String) -> MomentGuard {
        let job = RunningJob { id: String::new(), kind: JobKind::Moment { what } };
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(job.clone());
        MomentGuard { slot: self.clone(), job }
    }

    /// Names `what` as the lock's holder from now on (shutdown, which keeps the lock).
    pub(super) fn name(&self, what: String) {
        let job = RunningJob { id: String::new(), kind: JobKind::Moment { what } };
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(job);
    }

    /// What holds the lock for a moment now, if anything says so.
    pub fn now(&self) -> Option<RunningJob> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// Names a moment's holder of the apply lock while it lives ([`Moments::hold`]).
#[derive(Debug)]
pub struct MomentGuard {
    slot: Moments,
    job: RunningJob,
}

impl Drop for MomentGuard {
    fn drop(&mut self) {
        let mut held = self.slot.0.lock().unwrap_or_else(PoisonError::into_inner);
        if held.as_ref() == Some(&self.job) {
            *held = None;
        }
    }
}

/// The GPUs benches claim now.
#[derive(Debug, Default)]
pub struct Claims {
    held: Mutex<Vec<BenchClaim>>,
    /// Bench guards not yet dropped: a bench whose claim went may still be reporting its
    /// outcome to its client, which a shutdown waits for.
    reporting: std::sync::atomic::AtomicUsize,
}

impl Claims {
    fn held(&self) -> std::sync::MutexGuard<'_, Vec<BenchClaim>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every claim, oldest first.
    pub fn all(&self) -> Vec<BenchClaim> {
        self.held().clone()
    }

    /// The claim on GPU `gpu`, if a bench holds it.
    pub fn of_gpu(&self, gpu: u32) -> Option<BenchClaim> {
        self.held().iter().find(|c| c.gpu == gpu).cloned()
    }

    /// Whether a bench holds GPU `gpu`.
    pub fn holds(&self, gpu: u32) -> bool {
        self.held().iter().any(|c| c.gpu == gpu)
    }

    /// Whether no bench runs.
    pub fn is_empty(&self) -> bool {
        self.held().is_empty()
    }

    /// Whether no bench runs or is still reporting its outcome (for shutdown).
    pub fn all_reported(&self) -> bool {
        self.is_empty() && self.reporting.load(Ordering::SeqCst) == 0
    }

    pub(super) fn add(&self, claim: BenchClaim) {
        self.held().push(claim);
    }

    pub(super) fn release(&self, job: &str) {
        self.held().retain(|c| c.job != job);
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

/// What a job holds while it runs: the apply lock (an apply, a probe), which names the job
/// for `status` and for `Busy` errors; or a claim on one GPU (a bench). [`JobGuard::finish`]
/// (or dropping it) clears the name or releases the claim and, for a job that had started,
/// tells the engine's listeners that the GPUs may have changed; the lock itself goes only
/// when the guard is dropped, after the outcome was reported, and then wakes the calls
/// that wait for it (those that arrived during the re-apply at start-up). A claim goes at
/// `finish`: the bench's GPU is restored by then, and an apply sent once its client heard
/// the outcome is not refused.
pub struct JobGuard {
    /// `Some` until the guard is dropped; `None` for a claim.
    lock: Option<OwnedMutexGuard<()>>,
    released: Arc<Notify>,
    /// What names the job while it holds the lock; `None` for a claim.
    running: Option<Arc<Mutex<Option<RunningJob>>>>,
    /// The claims and the job whose claim this guard releases.
    claim: Option<(Arc<Claims>, String)>,
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
            running: Some(running),
            claim: None,
            events,
            kind,
            started: false,
            finished: false.into(),
            epoch,
        }
    }

    /// Holds `claim` in `claims` for a bench doing `kind`, without the apply lock; `released`
    /// is told when the claim goes. The caller adds the claim under the apply lock.
    pub(super) fn claiming(
        claim: &BenchClaim,
        kind: JobKind,
        claims: Arc<Claims>,
        released: Arc<Notify>,
        events: Events,
        epoch: Arc<AtomicU64>,
    ) -> Self {
        epoch.fetch_add(1, Ordering::SeqCst);
        claims.reporting.fetch_add(1, Ordering::SeqCst);
        JobGuard {
            lock: None,
            released,
            running: None,
            claim: Some((claims, claim.job.clone())),
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
        if let Some(running) = &self.running {
            *running.lock().unwrap_or_else(PoisonError::into_inner) = None;
        }
        if let Some((claims, job)) = &self.claim {
            claims.release(job);
            self.released.notify_waiters();
        }
        if self.started {
            self.events.emit(EngineEvent::JobEnded { kind: self.kind.clone() });
        }
    }
}

impl Drop for JobGuard {
    fn drop(&mut self) {
        self.finish();
        drop(self.lock.take());
        if let Some((claims, _)) = &self.claim {
            claims.reporting.fetch_sub(1, Ordering::SeqCst);
        }
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
        let bench = BenchClaim {
            job: "/io/gpushare/Agent1/jobs/3".into(),
            gpu: 0,
            uuid: "GPU-0".into(),
            uid: 1000,
            user: Some("ada".into()),
            since: SystemTime::UNIX_EPOCH,
            profile_before: None,
            restores: String::new(),
        };
        assert_eq!(
            EngineError::Busy(Some(bench.holder())).to_string(),
            "a bench is running (/io/gpushare/Agent1/jobs/3, bench on GPU 0, started by ada (uid 1000)); try again when it has finished"
        );
        assert_eq!(BenchClaim { user: None, ..bench }.who(), "uid 1000");
        assert_eq!(
            EngineError::Busy(None).to_string(),
            "another job is starting or ending; try again in a moment"
        );
        // What holds the lock for a moment names itself.
        let moments = Moments::default();
        let held = moments.hold("the MPS health check".into());
        assert_eq!(
            EngineError::Busy(moments.now()).to_string(),
            "the MPS health check holds the apply lock; try again in a moment"
        );
        drop(held);
        assert_eq!(moments.now(), None);
    }
}
