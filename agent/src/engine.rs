//! The agent's operations, independent of any transport: status, plan, apply, export,
//! profiles, validation, recovery. The D-Bus service calls these and does nothing else.
//!
//! One apply runs at a time: [`Engine::begin_apply`] takes the apply lock or fails with
//! [`EngineError::Busy`] at once; the lock travels with the [`ApplyJob`] until it ends.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpushare_proto::ERROR_PREFIX;
use gpushare_proto::types::{
    Export, GpuStatus, InstanceStatus, JobOutcome, ProfileDetail, ProfileList, ProfileSummary,
    Sharing, Status, Validation,
};
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

use crate::apply::hooks::Hooks;
use crate::apply::journal::{Journal, ProfileDocument};
use crate::apply::transaction::{TransactionError, Transactions};
use crate::apply::{self, Executor, Progress};
use crate::config::AgentConfig;
use crate::gpu::{GpuBackend, GpuError, GpuState, NodeState};
use crate::plan::{self, Plan, PlanError, PlanOptions};
use crate::profile::{self, Profile, ProfileStore, StoredProfile};

/// Why an operation failed, one line each. The service maps each kind to a D-Bus error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// No profile of that name.
    #[error("{0}")]
    UnknownProfile(String),
    /// Profile text that does not parse or validate.
    #[error("{0}")]
    InvalidProfile(String),
    /// The profile cannot be planned here.
    #[error("{0}")]
    Plan(#[from] PlanError),
    /// Another apply is running.
    #[error("{0}")]
    Busy(String),
    /// The backend failed.
    #[error("{0}")]
    Backend(#[from] GpuError),
    /// Anything else (state files).
    #[error("{0}")]
    Failed(String),
}

/// The agent's engine: one backend, the known profiles, the journal.
pub struct Engine {
    backend: Arc<dyn GpuBackend>,
    profiles: ProfileStore,
    journal: Arc<Journal>,
    transactions: Transactions,
    policy: PlanOptions,
    apply_lock: Arc<AsyncMutex<()>>,
    running: Arc<Mutex<Option<String>>>,
}

/// An apply that holds the apply lock and has its plan.
pub struct ApplyJob {
    plan: Plan,
    document: Option<ProfileDocument>,
    before: NodeState,
    _guard: RunningGuard,
}

/// Holds the apply lock and clears the running job's name when dropped.
struct RunningGuard {
    _lock: OwnedMutexGuard<()>,
    running: Arc<Mutex<Option<String>>>,
}

impl ApplyJob {
    /// The plan the job carries out.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        *self.running.lock().expect("running lock") = None;
    }
}

/// A profile given by name or as a document (`apply -f`).
#[derive(Debug, Clone, Copy)]
pub enum ProfileRef<'a> {
    /// A known profile.
    Named(&'a str),
    /// A gpushare profile (TOML) or a mig-parted config file with the config to use.
    Document {
        /// The document.
        text: &'a str,
        /// Its name in messages (a path).
        origin: &'a str,
        /// The mig-parted config; empty for TOML.
        config: &'a str,
    },
}

impl Engine {
    /// An engine over `backend` with `profiles`, keeping its journal in `state_dir`.
    pub fn new(
        backend: Arc<dyn GpuBackend>,
        profiles: ProfileStore,
        state_dir: &Path,
        config: &AgentConfig,
    ) -> Result<Self, String> {
        let journal = Arc::new(
            Journal::open(state_dir)
                .map_err(|e| format!("state directory {}: {e}", state_dir.display()))?,
        );
        let policy = PlanOptions {
            manage_mig: config.gpu.manage_mig,
            manage_compute_mode: config.gpu.manage_compute_mode,
            force: false,
        };
        let transactions = Transactions {
            executor: Executor {
                backend: Arc::clone(&backend),
                max_parallel_gpus: config.apply.max_parallel_gpus,
            },
            journal: Arc::clone(&journal),
            hooks: Hooks {
                pre_apply: config.hooks.pre_apply.clone(),
                post_apply: config.hooks.post_apply.clone(),
                timeout: Duration::from_secs(config.hooks.timeout_seconds),
            },
            policy,
        };
        Ok(Engine {
            backend,
            profiles,
            journal,
            transactions,
            policy,
            apply_lock: Arc::new(AsyncMutex::new(())),
            running: Arc::new(Mutex::new(None)),
        })
    }

    /// The backend's kind (`nvml`, `simulated`).
    pub fn backend_kind(&self) -> &'static str {
        self.backend.kind()
    }

    /// The profiles the engine knows.
    pub fn profiles(&self) -> &ProfileStore {
        &self.profiles
    }

    /// The profile last applied successfully.
    pub fn active_profile(&self) -> Option<String> {
        self.journal.active_profile()
    }

    /// Rolls back an apply that the journal shows interrupted (run before serving).
    pub async fn recover(&self) -> Result<Option<String>, String> {
        let _lock = self.apply_lock.lock().await;
        self.transactions.recover().await
    }

    /// A fresh observation of the GPUs.
    pub async fn observe(&self) -> Result<NodeState, EngineError> {
        Ok(apply::blocking(&self.backend, |b| b.observe()).await?)
    }

    /// The observed GPUs, the active profile and the apply in progress.
    pub async fn status(&self) -> Result<Status, EngineError> {
        let node = self.observe().await?;
        let journal = self.journal.snapshot();
        Ok(Status {
            active_profile: journal.active_profile,
            backend: self.backend.kind().to_string(),
            apply_in_progress: self.running.lock().expect("running lock").clone(),
            rollback_error: journal.transaction.and_then(|t| t.rollback_error),
            gpus: node.gpus.iter().map(gpu_status).collect(),
        })
    }

    fn resolve(&self, profile: ProfileRef<'_>) -> Result<Profile, EngineError> {
        match profile {
            ProfileRef::Named(name) => self
                .profiles
                .get(name)
                .map(|p| p.profile.clone())
                .map_err(EngineError::UnknownProfile),
            ProfileRef::Document { text, origin, config } => {
                profile::parse_document(text, origin, config)
                    .map_err(|e| EngineError::InvalidProfile(e.to_string()))
            }
        }
    }

    /// Plans a profile against a fresh observation.
    pub async fn plan(&self, profile: ProfileRef<'_>) -> Result<Plan, EngineError> {
        let profile = self.resolve(profile)?;
        let node = self.observe().await?;
        Ok(plan::plan(&node, &profile, &self.policy)?)
    }

    /// Takes the apply lock and plans the profile; fails at once when another apply runs
    /// or the profile cannot be planned. `job` names the job in Busy messages and status.
    pub async fn begin_apply(
        &self,
        source: ProfileRef<'_>,
        force: bool,
        job: &str,
    ) -> Result<ApplyJob, EngineError> {
        let profile = self.resolve(source)?;
        let lock = Arc::clone(&self.apply_lock).try_lock_owned().map_err(|_| {
            let running = self.running.lock().expect("running lock").clone();
            EngineError::Busy(format!(
                "another apply is running ({}); try again when it has finished",
                running.unwrap_or_else(|| "recovery at start-up".into())
            ))
        })?;
        *self.running.lock().expect("running lock") =
            Some(format!("{job}, profile {}", profile.name));
        let guard = RunningGuard { _lock: lock, running: Arc::clone(&self.running) };
        let before = self.observe().await?;
        let plan = plan::plan(&before, &profile, &PlanOptions { force, ..self.policy })?;
        let document = match source {
            ProfileRef::Named(_) => None,
            ProfileRef::Document { text, origin, config } => Some(ProfileDocument {
                text: text.to_string(),
                origin: origin.to_string(),
                config: config.to_string(),
            }),
        };
        Ok(ApplyJob { plan, document, before, _guard: guard })
    }

    /// Carries out an apply job as a transaction, sending progress.
    pub async fn run_apply(
        &self,
        job: ApplyJob,
        progress: UnboundedSender<Progress>,
    ) -> JobOutcome {
        let started = Instant::now();
        let plan = &job.plan;
        let total = u32::try_from(plan.step_count()).unwrap_or(u32::MAX);
        let result =
            self.transactions.apply(plan, job.document.clone(), &job.before, &progress).await;
        drop(progress);
        let mut outcome = JobOutcome {
            ok: result.is_ok(),
            profile: plan.profile.clone(),
            changed: total > 0,
            steps_done: 0,
            steps_total: total,
            duration_seconds: 0.0,
            error_name: None,
            error: None,
            warnings: Vec::new(),
        };
        match result {
            Ok(applied) => {
                outcome.steps_done = applied.steps_done;
                outcome.warnings = applied.warnings;
            }
            Err(e) => {
                let (name, steps_done) = match &e {
                    TransactionError::Hook(_) | TransactionError::Journal(_) => ("Failed", 0),
                    TransactionError::RolledBack { steps_done, .. }
                    | TransactionError::RollbackFailed { steps_done, .. } => {
                        ("Backend", *steps_done)
                    }
                };
                outcome.changed = matches!(e, TransactionError::RollbackFailed { .. });
                outcome.steps_done = steps_done;
                outcome.error_name = Some(format!("{ERROR_PREFIX}.{name}"));
                outcome.error = Some(format!("applying {}: {e}", plan.profile));
            }
        }
        outcome.duration_seconds = started.elapsed().as_secs_f64();
        drop(job);
        outcome
    }

    /// At start-up, the apply that brings the GPUs back to `boot_profile`, or else to the
    /// active profile (from its document when it was applied from one); `None` when
    /// there is nothing to re-apply.
    pub async fn begin_boot_apply(
        &self,
        boot_profile: Option<&str>,
    ) -> Option<Result<ApplyJob, EngineError>> {
        let job = "start-up";
        if let Some(name) = boot_profile {
            return Some(self.begin_apply(ProfileRef::Named(name), false, job).await);
        }
        let active = self.journal.active_profile()?;
        Some(match self.journal.active_document() {
            Some(d) => {
                let source =
                    ProfileRef::Document { text: &d.text, origin: &d.origin, config: &d.config };
                self.begin_apply(source, false, job).await
            }
            None => self.begin_apply(ProfileRef::Named(&active), false, job).await,
        })
    }

    /// Waits for a running apply to end and keeps any new one from starting: for shutdown.
    pub async fn quiesce(&self) -> OwnedMutexGuard<()> {
        Arc::clone(&self.apply_lock).lock_owned().await
    }

    /// The GPUs as they are, as a profile.
    pub async fn export(&self) -> Result<Export, EngineError> {
        let node = self.observe().await?;
        Ok(Export { text: profile::export::profile_text(&node) })
    }

    /// Every known profile.
    pub fn list_profiles(&self) -> ProfileList {
        let active = self.active_profile();
        ProfileList {
            profiles: self.profiles.iter().map(|p| summary(p, active.as_deref())).collect(),
            errors: self.profiles.errors().to_vec(),
        }
    }

    /// One profile with its text.
    pub fn show_profile(&self, name: &str) -> Result<ProfileDetail, EngineError> {
        let stored = self.profiles.get(name).map_err(EngineError::UnknownProfile)?;
        Ok(ProfileDetail {
            summary: summary(stored, self.active_profile().as_deref()),
            text: stored.text.clone(),
        })
    }

    /// Parses profile text and plans it against this node, changing nothing.
    pub async fn validate(&self, text: &str, origin: &str) -> Result<Validation, EngineError> {
        let stem = PathBuf::from(origin).file_stem().and_then(|s| s.to_str()).map(String::from);
        let profile = profile::parse_profile(text, origin, stem.as_deref())
            .map_err(|e| EngineError::InvalidProfile(e.to_string()))?;
        let node = self.observe().await?;
        let plan = plan::plan(&node, &profile, &self.policy)?;
        Ok(Validation { name: profile.name, plan: plan.report() })
    }
}

fn summary(stored: &StoredProfile, active: Option<&str>) -> ProfileSummary {
    ProfileSummary {
        name: stored.profile.name.clone(),
        description: stored.profile.description.clone(),
        source: stored.source.to_string(),
        active: active == Some(stored.profile.name.as_str()),
    }
}

fn gpu_status(gpu: &GpuState) -> GpuStatus {
    let profile = |id: u32| gpu.model.and_then(|m| m.profile_by_id(id));
    GpuStatus {
        index: gpu.index,
        uuid: gpu.uuid.clone(),
        model: gpu.model_name().to_string(),
        memory_total_bytes: gpu.memory_total_bytes,
        mig_enabled: gpu.mig_enabled,
        mig_pending: gpu.mig_pending,
        compute_mode: gpu.compute_mode.as_str().to_string(),
        sharing: Sharing::exclusive(),
        instances: gpu
            .instances
            .iter()
            .map(|gi| {
                let ci = gi.compute_instances.first();
                InstanceStatus {
                    profile: profile(gi.profile_id).map_or_else(
                        || format!("profile-{}", gi.profile_id),
                        |p| p.name.to_string(),
                    ),
                    placement_start: u32::from(gi.placement_start),
                    placement_size: u32::from(gi.placement_size),
                    gpu_instance_id: gi.id,
                    compute_instance_id: ci.map(|c| c.id),
                    uuid: ci.map(|c| c.uuid.clone()),
                    memory_bytes: profile(gi.profile_id).map_or(0, |p| p.memory_mib << 20),
                    sharing: Sharing::exclusive(),
                }
            })
            .collect(),
        processes: gpu.processes.iter().map(|p| p.pid).collect(),
    }
}
