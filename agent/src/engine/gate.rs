//! The gate: whether a change may run now, and who holds the GPUs meanwhile. Owns the
//! apply lock and who holds it (a job, or a moment of the agent's own), the benches'
//! claims on their GPUs, hands-off (the configuration did not read), stopping (SIGTERM),
//! and the job epoch. Every operation that changes the GPUs asks here first, and an
//! out-of-phase request (an apply while another runs, a probe during a bench, anything
//! while hands-off) is refused here with the error that names why, in the manner of
//! firecracker's controllers that refuse actions out of their phase.
//!
//! One apply or probe runs at a time: [`Gate::lock`] takes the apply lock or fails with
//! [`EngineError::Busy`] at once, unless what holds it is the re-apply at start-up
//! ([`BOOT_JOB`]) or a holder without a name (the MPS health check), which it waits for a
//! while ([`LOCK_WAIT`]); the lock travels with the job's [`JobGuard`] until it is dropped.
//! A bench takes the apply lock only while it is checked, then claims its GPU for its whole
//! length ([`Gate::claim`]): an apply whose profile selects another GPU goes through
//! meanwhile.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Mutex as AsyncMutex, Notify, OwnedMutexGuard};

use super::error::EngineError;
use super::events::Events;
use super::jobs::{BenchClaim, Claims, JobGuard, JobKind, MomentGuard, Moments, RunningJob};

/// The name of the job that re-applies the active profile at start-up.
pub const BOOT_JOB: &str = "start-up";
/// How long, in all, a job waits for the apply lock while the re-apply at start-up holds
/// it, or a holder without a name (the MPS health check, for a moment; a job letting go)
/// does, before it is refused as busy. Below the 25 s after which D-Bus clients (libdbus,
/// busctl, gpushare-ctl) stop waiting for a reply, so that no job starts for a caller that
/// has given up; gpushare-ctl calls again while the start-up re-apply runs.
pub const LOCK_WAIT: Duration = Duration::from_secs(20);
/// How often a job waiting for the lock looks again while its holder has no name; a job's
/// release wakes it at once.
const LOCK_POLL: Duration = Duration::from_millis(20);

/// Whether a change may run now, and who holds the GPUs.
pub struct Gate {
    /// Held by an apply or probe for its whole length, and by a bench while it is checked
    /// and claims its GPU.
    apply_lock: Arc<AsyncMutex<()>>,
    /// The GPUs benches hold (added under the apply lock).
    pub claims: Arc<Claims>,
    /// The job holding the apply lock, changed together with taking the lock (under this
    /// mutex), so that a caller finding the lock held also finds who holds it.
    running: Arc<Mutex<Option<RunningJob>>>,
    /// Told when a job releases the apply lock: wakes the calls waiting for it.
    released: Arc<Notify>,
    /// What holds the apply lock for a moment without a job (the health check, a bench
    /// being checked), named to a caller whose wait runs out.
    pub moments: Moments,
    /// Why the agent changes nothing on this node (its configuration did not read), if so.
    hands_off: Option<String>,
    /// Set by SIGTERM: a bench that begins now is cancelled at once.
    pub stopping: AtomicBool,
    /// Moved on when a job begins and when it ends (and by each transaction's turn): an
    /// observation is shared only within one epoch, and drift is judged only from an
    /// observation no job began or ended during (the journal and the GPUs then tell of
    /// the same moment).
    epoch: Arc<AtomicU64>,
    /// Where the job guards tell of jobs starting and ending.
    events: Events,
}

impl Gate {
    /// An open gate whose job guards tell `events`.
    pub fn new(events: Events) -> Self {
        Gate {
            apply_lock: Arc::new(AsyncMutex::new(())),
            claims: Arc::new(Claims::default()),
            running: Arc::new(Mutex::new(None)),
            released: Arc::new(Notify::new()),
            moments: Moments::default(),
            hands_off: None,
            stopping: AtomicBool::new(false),
            epoch: Arc::new(AtomicU64::new(0)),
            events,
        }
    }

    /// The gate of an agent that changes nothing on the GPUs, saying `why`.
    pub fn hands_off(&mut self, why: String) {
        self.hands_off = Some(why);
    }

    /// Why the agent changes nothing, if it does not.
    pub fn hands_off_reason(&self) -> Option<&str> {
        self.hands_off.as_deref()
    }

    /// Refuses a change when the agent is hands-off.
    pub fn may_change(&self) -> Result<(), EngineError> {
        match &self.hands_off {
            Some(why) => Err(EngineError::HandsOff(why.clone())),
            None => Ok(()),
        }
    }

    /// The job epoch, shared with the transactions' turn (see `epoch`).
    pub fn epoch_counter(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.epoch)
    }

    /// The job epoch now: answers worked out within one epoch describe the same GPUs and
    /// journal.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// The job holding the apply lock, if any.
    pub fn running_job(&self) -> Option<RunningJob> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Takes the apply lock for job `id` doing `kind`, or says what holds it. Applies and
    /// probes share it: neither may overlap the other.
    pub async fn lock_for(&self, id: &str, kind: JobKind) -> Result<JobGuard, EngineError> {
        let job = RunningJob { id: id.to_string(), kind };
        let lock = self.lock(Some(&job)).await?;
        Ok(self.job_guard(lock, job))
    }

    /// The guard of `job`, holding `lock`.
    pub fn job_guard(&self, lock: OwnedMutexGuard<()>, job: RunningJob) -> JobGuard {
        let (running, released) = (Arc::clone(&self.running), Arc::clone(&self.released));
        let epoch = Arc::clone(&self.epoch);
        JobGuard::new(lock, job, running, released, self.events.clone(), epoch)
    }

    /// Takes the apply lock for a job, and names it `job` (when given) in the same moment.
    /// Another job holding the lock refuses this one at once (applies are never queued),
    /// except the re-apply at start-up: a caller that arrives while the agent is still
    /// bringing its GPUs back to the active profile (a boot script, right after `systemctl
    /// restart` without waiting for systemd, a D-Bus activation) did not choose to race
    /// it, so it waits for it, and then plans against the GPUs as that left them. A holder
    /// without a name (the MPS health check, a job letting go) is waited for too. Either
    /// wait lasts up to [`LOCK_WAIT`] in all, then the call is refused as busy naming the
    /// holder. A caller without a job yet (a probe or a bench, named once its target is
    /// known) is a measurement: refused while a bench runs, naming it (one measurement at a
    /// time on a node: they would share its CPUs, and a bench's replicas are pinned to them).
    pub async fn lock(&self, job: Option<&RunningJob>) -> Result<OwnedMutexGuard<()>, EngineError> {
        self.lock_by(job, tokio::time::Instant::now() + LOCK_WAIT).await
    }

    /// [`Gate::lock`] waiting until `deadline` at most (a bench counts the time its
    /// check took against its [`LOCK_WAIT`]).
    pub async fn lock_by(
        &self,
        job: Option<&RunningJob>,
        deadline: tokio::time::Instant,
    ) -> Result<OwnedMutexGuard<()>, EngineError> {
        let mut told = false;
        loop {
            // Listening before looking: a release in between is not missed.
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            let holder = {
                let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
                if let Ok(lock) = Arc::clone(&self.apply_lock).try_lock_owned() {
                    // Claims are added under the lock: none appears while it is held.
                    if job.is_none()
                        && let Some(claim) = self.claims.all().first()
                    {
                        return Err(EngineError::Busy(Some(claim.holder())));
                    }
                    if let Some(job) = job {
                        *running = Some(job.clone());
                    }
                    return Ok(lock);
                }
                running.clone()
            };
            let now = tokio::time::Instant::now();
            let look_again = match &holder {
                Some(held) if held.id != BOOT_JOB => return Err(EngineError::Busy(holder)),
                // A holder without a job may have said what it is.
                _ if now >= deadline => {
                    return Err(EngineError::Busy(holder.or_else(|| self.moments.now())));
                }
                // A job's release wakes this one; nothing else is worth looking at.
                Some(held) => {
                    if !told {
                        tracing::info!("waiting for the re-apply at start-up ({held})");
                        told = true;
                    }
                    deadline
                }
                None => (now + LOCK_POLL).min(deadline),
            };
            tokio::select! {
                () = &mut released => {}
                () = tokio::time::sleep_until(look_again) => {}
            }
        }
    }

    /// Waits for the apply lock, however long, and names its holder `what` while it is
    /// held (the recovery at start-up, before the agent serves).
    pub async fn wait_for_moment(&self, what: String) -> (OwnedMutexGuard<()>, MomentGuard) {
        let lock = Arc::clone(&self.apply_lock).lock_owned().await;
        (lock, self.moments.hold(what))
    }

    /// The apply lock for a moment named `what` (the health check), if nothing holds it
    /// and the agent may change the GPUs; never waits.
    pub fn try_moment(&self, what: &str) -> Option<(OwnedMutexGuard<()>, MomentGuard)> {
        if self.hands_off.is_some() {
            return None;
        }
        let lock = Arc::clone(&self.apply_lock).try_lock_owned().ok()?;
        Some((lock, self.moments.hold(what.to_string())))
    }

    /// Waits for a running job (and every bench: cancel them first) to end and keeps any
    /// new one from starting: for shutdown.
    pub async fn quiesce(&self) -> OwnedMutexGuard<()> {
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            let lock = Arc::clone(&self.apply_lock).lock_owned().await;
            // Claims are added under the lock: with none now, none comes. A bench whose
            // claim went may still be telling its client how it ended: waited for too.
            if self.claims.all_reported() {
                // Held until the agent exits: named as what it is.
                self.moments.name("the agent's shutdown".into());
                return lock;
            }
            drop(lock);
            released.await;
        }
    }

    /// Adds `claim` for the bench doing `kind` and lets `lock` (the apply lock, held while
    /// the bench was checked and its record written) go: from now on an apply whose
    /// profile leaves the GPU out runs beside the bench. The claim goes with the guard.
    pub fn claim(&self, lock: OwnedMutexGuard<()>, claim: BenchClaim, kind: JobKind) -> JobGuard {
        self.claims.add(claim.clone());
        let guard = JobGuard::claiming(
            &claim,
            kind,
            Arc::clone(&self.claims),
            Arc::clone(&self.released),
            self.events.clone(),
            Arc::clone(&self.epoch),
        );
        drop(lock);
        guard
    }
}
