//! The agent's operations, independent of any transport: status, plan, apply, profiles,
//! validation. The D-Bus service calls these and does nothing else.
//!
//! One apply runs at a time: [`Engine::begin_apply`] takes the apply lock or fails with
//! [`EngineError::Busy`] at once; the lock travels with the [`ApplyJob`] until it ends.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use gpushare_proto::ERROR_PREFIX;
use gpushare_proto::types::{
    GpuStatus, InstanceStatus, JobOutcome, ProfileDetail, ProfileList, ProfileSummary, Sharing,
    Status, Validation,
};
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

use crate::apply::{self, Progress};
use crate::config::GpuPolicy;
use crate::gpu::{GpuBackend, GpuError, GpuState, NodeState};
use crate::plan::{self, Plan, PlanError, PlanOptions};
use crate::profile::{ProfileStore, StoredProfile, parse_profile};
use crate::state::{AgentState, StateFile};

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

/// The agent's engine: one backend, the known profiles, the persistent state.
pub struct Engine {
    backend: Arc<dyn GpuBackend>,
    profiles: ProfileStore,
    state_file: StateFile,
    state: Mutex<AgentState>,
    policy: GpuPolicy,
    apply_lock: Arc<AsyncMutex<()>>,
    running: Arc<Mutex<Option<String>>>,
}

/// An apply that holds the apply lock and has its plan.
pub struct ApplyJob {
    plan: Plan,
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

impl Engine {
    /// An engine over `backend` with `profiles`, keeping its state in `state_dir`.
    pub fn new(
        backend: Arc<dyn GpuBackend>,
        profiles: ProfileStore,
        state_dir: &std::path::Path,
        policy: GpuPolicy,
    ) -> Result<Self, String> {
        let state_file = StateFile::open(state_dir)
            .map_err(|e| format!("state directory {}: {e}", state_dir.display()))?;
        let state = state_file.load().map_err(|e| e.to_string())?;
        Ok(Engine {
            backend,
            profiles,
            state_file,
            state: Mutex::new(state),
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

    fn active_profile(&self) -> Option<String> {
        self.state
            .lock()
            .expect("state lock")
            .active_profile
            .clone()
    }

    fn set_active_profile(&self, name: Option<String>) -> Result<(), EngineError> {
        let mut state = self.state.lock().expect("state lock");
        let next = AgentState {
            active_profile: name,
        };
        self.state_file
            .store(&next)
            .map_err(|e| EngineError::Failed(format!("saving the agent state: {e}")))?;
        *state = next;
        Ok(())
    }

    /// A fresh observation of the GPUs.
    pub async fn observe(&self) -> Result<NodeState, EngineError> {
        Ok(apply::blocking(&self.backend, |b| b.observe()).await?)
    }

    /// The observed GPUs and the active profile.
    pub async fn status(&self) -> Result<Status, EngineError> {
        let node = self.observe().await?;
        Ok(Status {
            active_profile: self.active_profile(),
            backend: self.backend.kind().to_string(),
            gpus: node.gpus.iter().map(gpu_status).collect(),
        })
    }

    fn plan_options(&self, force: bool) -> PlanOptions {
        PlanOptions {
            manage_mig: self.policy.manage_mig,
            manage_compute_mode: self.policy.manage_compute_mode,
            force,
        }
    }

    fn profile(&self, name: &str) -> Result<&StoredProfile, EngineError> {
        self.profiles.get(name).map_err(EngineError::UnknownProfile)
    }

    /// Plans the named profile against a fresh observation.
    pub async fn plan(&self, name: &str) -> Result<Plan, EngineError> {
        let profile = &self.profile(name)?.profile;
        let node = self.observe().await?;
        Ok(plan::plan(&node, profile, &self.plan_options(false))?)
    }

    /// Takes the apply lock and plans the named profile; fails at once when another apply
    /// runs or the profile cannot be planned. `job` names the job in Busy messages.
    pub async fn begin_apply(
        &self,
        name: &str,
        force: bool,
        job: &str,
    ) -> Result<ApplyJob, EngineError> {
        let profile = &self.profile(name)?.profile;
        let lock = Arc::clone(&self.apply_lock).try_lock_owned().map_err(|_| {
            let running = self.running.lock().expect("running lock").clone();
            EngineError::Busy(format!(
                "another apply is running ({}); try again when it has finished",
                running.unwrap_or_else(|| "starting".into())
            ))
        })?;
        *self.running.lock().expect("running lock") = Some(format!("{job}, profile {name}"));
        let guard = RunningGuard {
            _lock: lock,
            running: Arc::clone(&self.running),
        };
        let node = self.observe().await?;
        let plan = plan::plan(&node, profile, &self.plan_options(force))?;
        Ok(ApplyJob {
            plan,
            _guard: guard,
        })
    }

    /// Carries out an apply job, sending progress, and records the outcome.
    pub async fn run_apply(
        &self,
        job: ApplyJob,
        progress: UnboundedSender<Progress>,
    ) -> JobOutcome {
        let started = Instant::now();
        let plan = &job.plan;
        let total = u32::try_from(plan.step_count()).unwrap_or(u32::MAX);
        let result = apply::execute(Arc::clone(&self.backend), plan, &progress).await;
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
        };
        let recorded = match &result {
            Ok(done) => {
                outcome.steps_done = *done;
                self.set_active_profile(Some(plan.profile.clone()))
            }
            Err(e) => {
                if let apply::ApplyError::Step { number, .. } = e {
                    outcome.steps_done = number - 1;
                }
                outcome.error_name = Some(format!("{ERROR_PREFIX}.Backend"));
                outcome.error = Some(format!(
                    "applying {}: {e}; the steps before it were carried out and nothing was rolled back",
                    plan.profile
                ));
                // The GPUs may be between layouts: no profile is active any more.
                self.set_active_profile(None)
            }
        };
        if let Err(e) = recorded {
            outcome.ok = false;
            outcome.error_name = Some(format!("{ERROR_PREFIX}.Failed"));
            outcome.error = Some(e.to_string());
        }
        outcome.duration_seconds = started.elapsed().as_secs_f64();
        drop(job);
        outcome
    }

    /// Waits for a running apply to end and keeps any new one from starting: for shutdown.
    pub async fn quiesce(&self) -> OwnedMutexGuard<()> {
        Arc::clone(&self.apply_lock).lock_owned().await
    }

    /// Every known profile.
    pub fn list_profiles(&self) -> ProfileList {
        let active = self.active_profile();
        ProfileList {
            profiles: self
                .profiles
                .iter()
                .map(|p| summary(p, active.as_deref()))
                .collect(),
            errors: self.profiles.errors().to_vec(),
        }
    }

    /// One profile with its text.
    pub fn show_profile(&self, name: &str) -> Result<ProfileDetail, EngineError> {
        let stored = self.profile(name)?;
        Ok(ProfileDetail {
            summary: summary(stored, self.active_profile().as_deref()),
            text: stored.text.clone(),
        })
    }

    /// Parses profile text and plans it against this node, changing nothing.
    pub async fn validate(&self, text: &str, origin: &str) -> Result<Validation, EngineError> {
        let stem = PathBuf::from(origin)
            .file_stem()
            .and_then(|s| s.to_str())
            .map(String::from);
        let profile = parse_profile(text, origin, stem.as_deref())
            .map_err(|e| EngineError::InvalidProfile(e.to_string()))?;
        let node = self.observe().await?;
        let plan = plan::plan(&node, &profile, &self.plan_options(false))?;
        Ok(Validation {
            name: profile.name,
            plan: plan.report(),
        })
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
