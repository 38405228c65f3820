//! Apply jobs: an apply from its request to its report. Owns the apply job ([`ApplyJob`]:
//! its plan, the GPUs it was planned against, what an earlier unfinished apply's rollback
//! repaired) and why the re-apply at start-up failed, until an apply succeeds. Asks the
//! gate whether it may run, the core for the plan, and runs it as a transaction
//! (`super::transactions`); the recovery at start-up is here too.

use std::sync::PoisonError;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use super::Engine;
use super::core::ProfileRef;
use super::error::EngineError;
use super::events::EngineEvent;
use super::gate::{BOOT_JOB, LOCK_WAIT};
use super::health::Scope;
use super::jobs::{BenchClaim, JobGuard, JobKind, JobReport, JobResult};
use super::slurm::SlurmPass;
use crate::apply::Progress;
use crate::apply::journal::ProfileDocument;
use crate::apply::transaction::Recovered;
use crate::node::NodeState;
use crate::plan::{Plan, PlanOptions};
use crate::profile::{self, Profile};

/// An apply that holds the apply lock and has its plan. The lock is released when the
/// job is dropped: keep it until the outcome has been reported.
pub struct ApplyJob {
    plan: Plan,
    document: Option<ProfileDocument>,
    before: NodeState,
    /// What the rollback of an earlier unfinished apply repaired before this one.
    repaired: Option<Recovered>,
    /// Whether this is the re-apply at start-up.
    boot: bool,
    /// What it must do in Slurm (`[slurm]`; at start-up only where slurmd runs already).
    slurm: Option<SlurmPass>,
    _guard: JobGuard,
}

impl ApplyJob {
    /// The plan the job carries out.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }
}

impl Engine {
    /// Rolls back an apply that the journal shows interrupted (run before serving).
    /// Returns what was done, for the log.
    pub async fn recover(&self) -> Result<Option<String>, EngineError> {
        let _moment = self.gate.wait_for_moment("the recovery at start-up".into()).await;
        if let Some(why) = self.gate.hands_off_reason() {
            let pending = self.core.journal.snapshot().transaction;
            return Ok(pending.map(|t| {
                format!("the unfinished apply of {} is left as it is: {why}", t.profile)
            }));
        }
        let recovered = self.transactions.recover().await.map_err(EngineError::Recovery)?;
        Ok(recovered.map(|r| r.message))
    }

    /// Takes the apply lock and plans the profile; fails at once when another job runs
    /// or the profile cannot be planned. `job` names the job in Busy messages and status.
    pub async fn begin_apply(
        &self,
        source: ProfileRef<'_>,
        force: bool,
        job: &str,
    ) -> Result<ApplyJob, EngineError> {
        self.gate.may_change()?;
        let deadline = tokio::time::Instant::now() + LOCK_WAIT;
        let profile = self.core.resolve_request(source).await?;
        let kind = JobKind::Apply { profile: profile.name.clone() };
        let guard = self.gate.lock_for(job, kind).await?;
        let scope = if job == BOOT_JOB { Scope::StartUp } else { Scope::Whole };
        self.begin_apply_holding(source, profile, force, guard, deadline, scope).await
    }

    /// [`Engine::begin_apply`] with the apply lock already held by `guard` (a GPU reset's
    /// re-apply keeps the reset's), planned for `scope`.
    pub(super) async fn begin_apply_holding(
        &self,
        source: ProfileRef<'_>,
        profile: Profile,
        force: bool,
        mut guard: JobGuard,
        deadline: tokio::time::Instant,
        scope: Scope,
    ) -> Result<ApplyJob, EngineError> {
        let repaired = self.settle_unfinished(deadline).await?;
        let boot = scope == Scope::StartUp;
        let planned = self.plan_apply(source, profile, force, scope).await;
        let (plan, before, document, slurm) = match (planned, &repaired) {
            (Ok(planned), _) => planned,
            // The GPUs changed all the same: the refusal says how.
            (Err(error), Some(r)) => {
                let repaired = r.message.clone();
                return Err(EngineError::AfterRollback { repaired, error: Box::new(error) });
            }
            (Err(error), None) => return Err(error),
        };
        guard.start(u32::try_from(plan.step_count()).unwrap_or(u32::MAX));
        Ok(ApplyJob { plan, document, before, repaired, boot, slurm, _guard: guard })
    }

    /// The plan of an apply of `profile` (from `source`) against a fresh observation,
    /// with the GPUs it was made against and the document to journal; refused where the
    /// profile selects a benched GPU, the host cannot carry the plan out, or a view's place
    /// cannot be written.
    async fn plan_apply(
        &self,
        source: ProfileRef<'_>,
        profile: Profile,
        force: bool,
        scope: Scope,
    ) -> Result<(Plan, NodeState, Option<ProfileDocument>, Option<SlurmPass>), EngineError> {
        let boot = scope == Scope::StartUp;
        let before = self.observe().await?;
        // A benched GPU is the bench's until it ends; refused before any plan is made (a
        // plan would describe the bench's setup, and the bench's restore would undo it).
        self.refuse_benched(&profile, &before)?;
        let options = PlanOptions { force, ..self.core.policy };
        let (plan, before, _) = match self.core.plan_request(before, profile, options).await {
            Ok(planned) => planned,
            // A GPU off the bus is planned as last seen (or as nothing): the fault is the
            // reason to give.
            Err(e) => return Err(self.lost_first(e)),
        };
        // Nothing is built where a fault lies (issue 42): refused, or at start-up and after
        // a GPU reset left out of the plan.
        let plan = self.unhealthy_scope(plan, &before, scope)?;
        self.core.check_host(&plan, &before).await?;
        // The views are rewritten at commit: a place one cannot go, or GPUs one cannot
        // say, is refused now. Not at start-up: the GPUs come first there (MIG instances
        // and MPS servers do not survive a reboot), and a view that cannot follow says so
        // in its render's error and the log.
        match self.transactions.views().check(&plan, &before) {
            Err(why) if boot => tracing::warn!("re-applying at start-up all the same: {why}"),
            checked => checked.map_err(EngineError::NotPossible)?,
        }
        // Slurm last: it is asked (slurmctld, squeue) only for a plan nothing else refuses.
        let slurm = self.slurm_prepare(&plan, &before, boot).await?;
        let document = match source {
            ProfileRef::Named(_) => None,
            ProfileRef::Document { text, origin, config } => Some(ProfileDocument {
                text: text.to_string(),
                origin: origin.to_string(),
                config: config.to_string(),
            }),
        };
        Ok((plan, before, document, slurm))
    }

    /// An apply whose rollback failed (or whose end could not be written) leaves its GPUs
    /// between layouts: it is rolled back first (again), or the new apply is refused,
    /// rather than its record overwritten. What that repairs is part of the new apply's
    /// report. A transaction the journal holds may also be running now (a bench's setup or
    /// its restore): it is waited for, up to `deadline`; an unsettled setup of a running
    /// bench is the bench's to settle (its restore does).
    async fn settle_unfinished(
        &self,
        deadline: tokio::time::Instant,
    ) -> Result<Option<Recovered>, EngineError> {
        if self.core.journal.snapshot().transaction.is_none() {
            return Ok(None);
        }
        let busy = || EngineError::Busy(self.gate.claims.all().first().map(BenchClaim::holder));
        let turn = tokio::time::timeout_at(deadline, self.transactions.turn())
            .await
            .map_err(|_| busy())?;
        let Some(pending) = self.core.journal.snapshot().transaction else { return Ok(None) };
        if let Some(claim) = pending.checkpoint.iter().find_map(|c| self.gate.claims.of_gpu(c.gpu))
        {
            return Err(EngineError::Busy(Some(claim.holder())));
        }
        let recovered = self.transactions.recover_in(turn).await;
        recovered.map_err(|e| {
            EngineError::Recovery(format!("{e}; no new apply until that rollback succeeds"))
        })
    }

    /// Refuses a profile that selects a GPU a bench holds, naming the bench.
    fn refuse_benched(&self, profile: &Profile, node: &NodeState) -> Result<(), EngineError> {
        let count = u32::try_from(node.gpus.len()).unwrap_or(u32::MAX);
        for claim in self.gate.claims.all() {
            let Some(g) = node.gpu(claim.gpu) else { continue };
            let gpu = profile::GpuRef {
                index: g.index,
                count,
                uuid: &g.uuid,
                pci_device_id: g.pci_device_id,
                model: g.model,
            };
            if profile.rules.iter().any(|r| r.selects(&gpu)) {
                let mut holder = claim.holder();
                holder.kind = JobKind::Bench {
                    target: format!(
                        "GPU {} (this profile selects it), started by {}",
                        claim.gpu,
                        claim.who()
                    ),
                };
                return Err(EngineError::Busy(Some(holder)));
            }
        }
        Ok(())
    }

    /// Carries out an apply job as a transaction, sending progress.
    pub async fn run_apply(
        &self,
        job: &ApplyJob,
        progress: UnboundedSender<Progress>,
    ) -> JobReport {
        let started = Instant::now();
        let plan = &job.plan;
        let total = u32::try_from(plan.step_count()).unwrap_or(u32::MAX);
        if let Some(pass) = &job.slurm
            && let Err(refused) = self.slurm_drain(pass, &plan.profile).await
        {
            return self.apply_refused(job, refused, started);
        }
        let outcome =
            self.transactions.apply(plan, job.document.clone(), &job.before, &progress).await;
        drop(progress);
        let slurm = match &job.slurm {
            Some(pass) => {
                let settled = outcome.as_ref().map(drop).map_err(ToString::to_string);
                self.slurm_finish(pass, &plan.profile, settled).await.err()
            }
            None => None,
        };
        let repaired = job.repaired.as_ref().filter(|r| r.steps > 0);
        let changed = total > 0 || repaired.is_some();
        let result = if changed { JobResult::Success } else { JobResult::Unchanged };
        let mut report = apply_report(plan, result, changed);
        if let Some(repaired) = &job.repaired {
            report.warnings.push(format!("before this apply: {}", repaired.message));
        }
        match outcome {
            Ok(applied) => {
                report.steps_done = applied.steps_done;
                report.warnings.extend(applied.warnings);
                // The GPUs are as asked, Slurm is not: the node is left drained.
                if let Some(why) = slurm {
                    report.result = JobResult::Failed;
                    report.error = Some(EngineError::Slurm(why));
                }
            }
            Err(error) => {
                report.result = error.settled().into();
                report.changed = error.left_changed() || repaired.is_some();
                report.steps_done = error.steps_done();
                let profile = plan.profile.clone();
                report.error = Some(EngineError::Apply { profile, error: Box::new(error) });
                report.warnings.extend(slurm);
            }
        }
        self.apply_finished(job, report, started)
    }

    /// An apply refused after its job began (by Slurm: a job came on the node since the
    /// check before the first step): nothing changed.
    fn apply_refused(&self, job: &ApplyJob, error: EngineError, started: Instant) -> JobReport {
        let mut report = apply_report(&job.plan, JobResult::Failed, false);
        report.error = Some(error);
        self.apply_finished(job, report, started)
    }

    /// An apply's report, completed: its duration, the start-up error kept or cleared, the
    /// event sent, the job finished.
    fn apply_finished(&self, job: &ApplyJob, mut report: JobReport, started: Instant) -> JobReport {
        report.duration = started.elapsed();
        self.settle_start_up_error(job.boot, report.error.as_ref());
        self.events.emit(EngineEvent::ApplyFinished {
            profile: job.plan.profile.clone(),
            result: report.result,
            duration: report.duration,
        });
        job._guard.finish();
        report
    }

    /// At start-up, the apply that brings the GPUs back to `boot_profile`, or else to the
    /// active profile (from its document when it was applied from one); `None` when
    /// there is nothing to re-apply.
    pub async fn begin_boot_apply(
        &self,
        boot_profile: Option<&str>,
    ) -> Option<Result<ApplyJob, EngineError>> {
        let begun = if let Some(name) = boot_profile {
            self.begin_apply(ProfileRef::Named(name), false, BOOT_JOB).await
        } else {
            let active = self.core.journal.active_profile()?;
            match self.core.journal.active_document() {
                Some(d) => self.begin_apply(ProfileRef::of_document(&d), false, BOOT_JOB).await,
                None => self.begin_apply(ProfileRef::Named(&active), false, BOOT_JOB).await,
            }
        };
        if let Err(e) = &begun {
            self.settle_start_up_error(true, Some(e));
        }
        Some(begun)
    }

    /// Tells the views, at start-up, what the active profile meant for the GPUs that
    /// nothing on them records (time-slicing replicas), from the profile planned against
    /// the node: so a start-up whose re-apply does not commit (refused, failed, or none
    /// asked) still advertises what the profile set, rather than the GPUs as exclusive.
    pub async fn prime_views(&self) {
        let Some(active) = self.core.journal.active_profile() else { return };
        let document = self.core.journal.active_document();
        let source = match &document {
            Some(d) => ProfileRef::of_document(d),
            None => ProfileRef::Named(&active),
        };
        let planned = async {
            let profile = self.core.resolve_request(source).await?;
            let node = self.observe().await?;
            // Only its targets are read: planned as if the agent could change everything
            // (a policy that forbids the profile's interval refuses the re-apply, not this).
            let options = PlanOptions { force: true, ..PlanOptions::default() };
            self.core.plan_request(node, profile, options).await
        };
        match planned.await {
            Ok((plan, _, _)) => self.transactions.views().prime(&plan),
            Err(e) => tracing::warn!("the views know no time-slicing replicas of {active}: {e}"),
        }
    }

    /// Keeps why the start-up re-apply failed for `status`, until an apply succeeds.
    fn settle_start_up_error(&self, boot: bool, error: Option<&EngineError>) {
        let mut kept = self.start_up_error.lock().unwrap_or_else(PoisonError::into_inner);
        match error {
            Some(e) if boot => *kept = Some(e.to_string()),
            Some(_) => {}
            None => *kept = None,
        }
    }
}

/// The report of an apply of `plan` before it ran: no step done, no error or warning.
fn apply_report(plan: &Plan, result: JobResult, changed: bool) -> JobReport {
    JobReport {
        kind: JobKind::Apply { profile: plan.profile.clone() },
        result,
        changed,
        steps_done: 0,
        steps_total: u32::try_from(plan.step_count()).unwrap_or(u32::MAX),
        duration: Duration::ZERO,
        error: None,
        warnings: Vec::new(),
        probe: None,
        bench: None,
    }
}
