//! Applies as transactions: hooks, checkpoint, journaled steps, verification, and on any
//! failure a rollback to the checkpoint; recovery of an interrupted transaction at
//! start-up (always a rollback: the commit record is what makes an apply durable).

use std::sync::Arc;

use tokio::sync::mpsc::UnboundedSender;

use super::hooks::{Hooks, Phase, Settled};
use super::journal::{GpuCheckpoint, Journal, ProfileDocument, Transaction};
use super::{ApplyError, Executor, NoLog, Progress, Purpose};
use crate::node::{MpsSpec, NodeState};
use crate::plan::{self, ComputeLayout, GpuTarget, Placed, Plan, PlanOptions};
use crate::sys::log;

/// How an apply that changed the GPUs ended well.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// Steps carried out.
    pub steps_done: u32,
    /// Problems that did not fail the apply (a failing `post_apply` hook).
    pub warnings: Vec<String>,
}

/// What a recovery did: rolled back an unfinished apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovered {
    /// One line for the log and the next apply's report.
    pub message: String,
    /// Steps the rollback carried out (0: the GPUs were already as before).
    pub steps: u32,
}

/// How an apply failed. Every message is one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransactionError {
    /// `pre_apply` failed: nothing was changed.
    #[error("{0}; nothing was changed")]
    Hook(String),
    /// The journal could not be written before the first change: nothing was changed.
    #[error("writing the journal failed: {0}; nothing was changed")]
    Journal(String),
    /// A step failed (or verification did) and the GPUs were rolled back.
    #[error("{error}; rolled back: GPU {} as before{}", list(.gpus), warning_suffix(.warnings))]
    RolledBack {
        /// The original failure.
        error: ApplyError,
        /// The GPUs restored.
        gpus: Vec<u32>,
        /// Steps carried out before the failure.
        steps_done: u32,
        /// Problems besides (a failing `post_apply` hook).
        warnings: Vec<String>,
    },
    /// A step failed and the rollback failed too.
    #[error("{error}; the rollback failed too: {rollback}; see `gpushare-ctl status`{}", warning_suffix(.warnings))]
    RollbackFailed {
        /// The original failure.
        error: ApplyError,
        /// Why the rollback failed.
        rollback: String,
        /// Steps carried out before the failure.
        steps_done: u32,
        /// Problems besides.
        warnings: Vec<String>,
    },
}

impl TransactionError {
    /// How the failed apply settled, as `post_apply` hooks are told it.
    pub fn settled(&self) -> Settled {
        match self {
            TransactionError::RolledBack { .. } => Settled::RolledBack,
            _ => Settled::Failed,
        }
    }

    /// Steps carried out before the failure.
    pub fn steps_done(&self) -> u32 {
        match self {
            TransactionError::Hook(_) | TransactionError::Journal(_) => 0,
            TransactionError::RolledBack { steps_done, .. }
            | TransactionError::RollbackFailed { steps_done, .. } => *steps_done,
        }
    }

    /// Whether the GPUs may have been left changed: the rollback failed.
    pub fn left_changed(&self) -> bool {
        matches!(self, TransactionError::RollbackFailed { .. })
    }
}

fn list(gpus: &[u32]) -> String {
    gpus.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
}

fn warning_suffix(w: &[String]) -> String {
    w.iter().map(|w| format!("; {w}")).collect()
}

/// Runs transactions against one backend and journal.
#[derive(Clone)]
pub struct Transactions {
    /// Executes plans.
    pub executor: Executor,
    /// Records them.
    pub journal: Arc<Journal>,
    /// Runs around them.
    pub hooks: Hooks,
    /// What the agent may change (rollbacks are forced: they restore what was).
    pub policy: PlanOptions,
}

impl Transactions {
    /// Applies `plan`, made against `before`, of the profile in `document` if it came as
    /// one. A plan without steps only records the profile as active. `settled` runs once
    /// the outcome is settled (committed, rolled back, or refused by `pre_apply`) and
    /// before `post_apply`: what it writes (the views) is there for the hook to read.
    pub async fn apply(
        &self,
        plan: &Plan,
        document: Option<ProfileDocument>,
        before: &NodeState,
        progress: &UnboundedSender<Progress>,
        settled: impl AsyncFnOnce(Result<(), &TransactionError>),
    ) -> Result<Applied, TransactionError> {
        if plan.is_empty() {
            self.journal
                .set_active(Some(plan.profile.clone()), document)
                .map_err(|e| TransactionError::Journal(e.to_string()))?;
            return Ok(Applied { steps_done: 0, warnings: Vec::new() });
        }
        let gpus: Vec<u32> =
            plan.gpus.iter().filter(|g| !g.steps.is_empty()).map(|g| g.gpu).collect();
        // The transaction begins before pre_apply, so that a crash after the hook still
        // leaves a record: recovery then runs post_apply, which undoes what pre_apply did.
        let checkpoint = GpuCheckpoint::of(before, gpus.iter().copied());
        self.journal
            .begin(Transaction {
                profile: plan.profile.clone(),
                document,
                previous_profile: self.journal.active_profile(),
                previous_document: self.journal.active_document(),
                checkpoint: checkpoint.clone(),
                steps: plan.steps().map(ToString::to_string).collect(),
                completed: Vec::new(),
                rollback_error: None,
            })
            .map_err(|e| TransactionError::Journal(e.to_string()))?;
        if let Err(e) = self.hooks.run(Phase::PreApply, &plan.profile, &gpus).await {
            let mut warnings = Vec::new();
            if let Err(e) = self.journal.rolled_back() {
                warnings.push(format!("writing the journal failed: {e}"));
            }
            let error = TransactionError::Hook(e.to_string());
            settled(Err(&error)).await;
            // post_apply undoes what pre_apply did (starts what it stopped).
            self.post_hook(Settled::Failed, &plan.profile, &gpus, &mut warnings).await;
            return Err(TransactionError::Hook(format!("{e}{}", warning_suffix(&warnings))));
        }

        let log: Arc<dyn super::StepLog> = self.journal.clone();
        let result = match self.executor.execute(plan, progress, log).await {
            Ok(steps_done) => match self.journal.commit() {
                Ok(()) => Ok(steps_done),
                Err(e) => Err((ApplyError::Journal(e.to_string()), steps_done)),
            },
            Err(error) => {
                let done = self.journal.snapshot().transaction.map_or(0, |t| t.completed.len());
                Err((error, u32::try_from(done).unwrap_or(u32::MAX)))
            }
        };
        // The outcome is settled before the one post_apply that reports it.
        let outcome = match result {
            Ok(steps_done) => Ok(steps_done),
            Err((error, steps_done)) => {
                Err(self.roll_back(error, &checkpoint, steps_done, progress).await)
            }
        };
        settled(outcome.as_ref().map(|_| ())).await;
        let mut warnings = Vec::new();
        let result = outcome.as_ref().map_or_else(TransactionError::settled, |_| Settled::Success);
        self.post_hook(result, &plan.profile, &gpus, &mut warnings).await;
        match outcome {
            Ok(steps_done) => Ok(Applied { steps_done, warnings }),
            Err(TransactionError::RolledBack { error, gpus, steps_done, .. }) => {
                Err(TransactionError::RolledBack { error, gpus, steps_done, warnings })
            }
            Err(TransactionError::RollbackFailed { error, rollback, steps_done, .. }) => {
                Err(TransactionError::RollbackFailed { error, rollback, steps_done, warnings })
            }
            Err(other) => Err(other),
        }
    }

    async fn post_hook(
        &self,
        result: Settled,
        profile: &str,
        gpus: &[u32],
        warnings: &mut Vec<String>,
    ) {
        if let Err(e) = self.hooks.run(Phase::PostApply(result), profile, gpus).await {
            tracing::warn!("{e}");
            warnings.push(e);
        }
    }

    async fn roll_back(
        &self,
        error: ApplyError,
        checkpoint: &[GpuCheckpoint],
        steps_done: u32,
        progress: &UnboundedSender<Progress>,
    ) -> TransactionError {
        let warnings = Vec::new();
        // A failed step's line carries its GPU and number (in the journal).
        let span = match &error {
            ApplyError::Step { number, gpu, .. } => log::step_span(*gpu, *number),
            _ => tracing::Span::none(),
        };
        span.in_scope(|| tracing::warn!("{error}; rolling back"));
        let gpus: Vec<u32> = checkpoint.iter().map(|c| c.gpu).collect();
        let note = format!("rolling back GPU {} to the state before the apply", list(&gpus));
        let _ = progress.send(Progress::note(note));
        match self.restore(checkpoint, Purpose::Rollback, progress).await {
            Ok(_) => match self.journal.rolled_back() {
                Ok(()) => TransactionError::RolledBack { error, gpus, steps_done, warnings },
                Err(e) => TransactionError::RollbackFailed {
                    error,
                    rollback: format!(
                        "the GPUs were restored, but writing the journal failed: {e}"
                    ),
                    steps_done,
                    warnings,
                },
            },
            Err(rollback) => {
                if let Err(e) = self.journal.rollback_failed(&rollback) {
                    tracing::error!("writing the journal failed: {e}");
                }
                TransactionError::RollbackFailed { error, rollback, steps_done, warnings }
            }
        }
    }

    /// Returns the GPUs of `checkpoint` to their layout there, its lines told as
    /// `purpose` says (a rollback, or a restore on purpose); the steps that took.
    pub async fn restore(
        &self,
        checkpoint: &[GpuCheckpoint],
        purpose: Purpose,
        progress: &UnboundedSender<Progress>,
    ) -> Result<u32, String> {
        let node = self
            .executor
            .node
            .observe(super::Reads::FOR_PLANNING)
            .await
            .map_err(|e| e.to_string())?;
        let mut targets = Vec::new();
        for cp in checkpoint {
            let gpu = node.gpu(cp.gpu).ok_or_else(|| format!("GPU {} is gone", cp.gpu))?;
            if gpu.uuid != cp.uuid {
                return Err(format!("GPU {} is now {}, not {}", cp.gpu, gpu.uuid, cp.uuid));
            }
            let mut instances = Vec::new();
            for (i, &(profile_id, start)) in cp.instances.iter().enumerate() {
                let profile =
                    gpu.model.and_then(|m| m.profile_by_id(profile_id)).ok_or_else(|| {
                        format!(
                            "{}: MIG profile id {profile_id} is not in the catalog",
                            gpu.label()
                        )
                    })?;
                let mut placed = Placed::new(profile, start);
                // Subdivided: its compute instances as they were.
                if let Some(sizes) = cp.compute.get(i).filter(|s| !s.is_empty()) {
                    placed.compute = ComputeLayout::of(sizes);
                }
                instances.push(placed);
            }
            targets.push((
                cp.gpu,
                GpuTarget {
                    mig_enabled: cp.mig_enabled,
                    instances,
                    compute_mode: self.policy.manage_compute_mode.then_some(cp.compute_mode),
                    mps: cp.mps.iter().enumerate().find(|(_, (start, _))| start.is_none()).map(
                        |(i, &(_, limits))| MpsSpec {
                            limits,
                            multi_user: cp.mps_multi_user.get(i).copied().unwrap_or(false),
                        },
                    ),
                    instance_mps: cp
                        .mps
                        .iter()
                        .enumerate()
                        .filter_map(|(i, &(start, limits))| {
                            let index = cp.mps_compute.get(i).copied().unwrap_or(0);
                            let multi_user = cp.mps_multi_user.get(i).copied().unwrap_or(false);
                            start.map(|s| (s, index, MpsSpec { limits, multi_user }))
                        })
                        .collect(),
                    timeslice: cp.timeslice.filter(|_| self.policy.manage_timeslice),
                    // A rollback is no apply of a profile: the views keep the active one's.
                    replicas: None,
                },
            ));
        }
        let options = PlanOptions { force: true, ..self.policy };
        let plan =
            plan::plan_to(&node, "rollback", targets, &options).map_err(|e| e.to_string())?;
        self.executor
            .execute_for(purpose, &plan, progress, Arc::new(NoLog))
            .await
            .map_err(|e| e.to_string())
    }

    /// At start-up: rolls back a transaction the journal shows in flight. Returns what was
    /// done, for the log; an error means the GPUs could not be restored.
    pub async fn recover(&self) -> Result<Option<Recovered>, String> {
        let Some(transaction) = self.journal.snapshot().transaction else {
            return Ok(None);
        };
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let gpu_ids: Vec<u32> = transaction.checkpoint.iter().map(|c| c.gpu).collect();
        let gpus = list(&gpu_ids);
        let restored = match self.restore(&transaction.checkpoint, Purpose::Rollback, &tx).await {
            Ok(steps) => self
                .journal
                .rolled_back()
                .map(|()| steps)
                .map_err(|e| format!("writing the journal failed: {e}")),
            Err(e) => Err(e),
        };
        // The interrupted apply may have run pre_apply (stopped a service): post_apply
        // undoes it, whatever the rollback's outcome.
        let result = if restored.is_ok() { Settled::RolledBack } else { Settled::Failed };
        let mut warnings = Vec::new();
        self.post_hook(result, &transaction.profile, &gpu_ids, &mut warnings).await;
        match restored {
            Ok(steps) => Ok(Some(Recovered {
                message: format!(
                    "rolled back the unfinished apply of {} ({} of {} steps had completed) in {steps} steps: GPU {gpus} as before; active profile {}{}",
                    transaction.profile,
                    transaction.completed.len(),
                    transaction.steps.len(),
                    transaction.previous_profile.as_deref().unwrap_or("(none)"),
                    warning_suffix(&warnings)
                ),
                steps,
            })),
            Err(e) => {
                let message = format!(
                    "cannot roll back the interrupted apply of {} on GPU {gpus}: {e}{}",
                    transaction.profile,
                    warning_suffix(&warnings)
                );
                if let Err(e) = self.journal.rollback_failed(&message) {
                    tracing::error!("writing the journal failed: {e}");
                }
                Err(message)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::catalog::parse_node_spec;
    use crate::gpu::GpuBackend;
    use crate::gpu::sim::{SimBackend, SimOptions};
    use crate::node::Operation;
    use crate::profile::parse_profile;

    fn layouts(sim: &SimBackend) -> Vec<(u8, Vec<u8>)> {
        let gpus = sim.observe().unwrap();
        gpus[0].instances.iter().map(|gi| (gi.placement_start, gi.compute_layout())).collect()
    }

    /// A failure while creating the second compute instance of a new subdivision rolls
    /// the GPU back to its subdivision before, compute instances and all.
    #[test]
    fn a_rollback_restores_subdivided_instances() {
        let dir = tempfile::tempdir().unwrap();
        let models = parse_node_spec("h100-80gb:1").unwrap();
        // The sixth compute instance creation fails: the second of the change below.
        let failing = SimOptions {
            failures: vec![(Operation::CreateComputeInstance, 6)],
            ..SimOptions::default()
        };
        let sim = Arc::new(SimBackend::new(&models, failing));
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let observe = |sim: &Arc<SimBackend>| NodeState::of_gpus(sim.observe().unwrap());
        let profile = |mig: &str| {
            parse_profile(&format!("[[gpu]]\nselect = 0\nmig = {{ {mig} }}\n"), "t.toml", Some("t"))
                .unwrap()
        };
        let transactions = |sim: &Arc<SimBackend>| Transactions {
            executor: super::super::Executor::for_tests(sim.clone()),
            journal: Arc::new(Journal::open(dir.path()).unwrap()),
            hooks: super::super::hooks::Hooks {
                timeout: Duration::from_secs(5),
                ..Default::default()
            },
            policy: PlanOptions::default(),
        };
        // Packed as mig-parted packs it: 2c + 1c in one 3g, the other two 1c in the next.
        let before = profile("\"2c.3g\" = 1, \"1c.3g\" = 3");
        let plan = plan::plan(&observe(&sim), &before, &PlanOptions::default()).unwrap();
        rt.block_on(transactions(&sim).apply(&plan, None, &observe(&sim), &tx, async |_| {}))
            .unwrap();
        let was = layouts(&sim);
        assert_eq!(was, [(0, vec![2, 1]), (4, vec![1, 1])]);
        let checkpoint = GpuCheckpoint::of(&observe(&sim), [0]);
        assert_eq!(checkpoint[0].compute, [vec![2, 1], vec![1, 1]]);

        // Another subdivision of both instances, whose second compute instance (the
        // sixth creation of this double) fails: back to the subdivision before.
        let other = profile("\"1c.3g\" = 3, \"3g\" = 1");
        let change = plan::plan(&observe(&sim), &other, &PlanOptions::default()).unwrap();
        let e =
            rt.block_on(transactions(&sim).apply(&change, None, &observe(&sim), &tx, async |_| {}));
        let e = e.unwrap_err();
        assert!(matches!(e, TransactionError::RolledBack { .. }), "{e}");
        assert!(e.to_string().contains("create a 1c compute instance"), "{e}");
        assert_eq!(layouts(&sim), was);

        // Restoring a checkpoint after the layout changed also brings the subdivision back.
        rt.block_on(transactions(&sim).apply(&change, None, &observe(&sim), &tx, async |_| {}))
            .unwrap();
        assert_eq!(layouts(&sim), [(0, vec![1, 1, 1]), (4, vec![3])]);
        let t = transactions(&sim);
        rt.block_on(t.restore(&checkpoint, Purpose::Rollback, &tx)).unwrap();
        assert_eq!(layouts(&sim), was);

        // A journal written before compute layouts were recorded still loads: whole.
        let old = r#"{"gpu":0,"uuid":"GPU-x","mig_enabled":true,"instances":[[9,4]],
            "compute_mode":"default","mps":[[4,{"active_thread_percentage":50,
            "pinned_memory_limit_bytes":null}]]}"#;
        let old: GpuCheckpoint = serde_json::from_str(old).unwrap();
        assert!(old.compute.is_empty() && old.mps_compute.is_empty());
    }
}
