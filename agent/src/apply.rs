//! Executing a plan through the backend, step by step, then verifying the result against
//! a fresh observation.
//!
//! Backend calls block, so each runs on tokio's blocking pool. The executor reports each
//! step before running it; the first failing step stops the run.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::mpsc::UnboundedSender;

use crate::gpu::{GpuBackend, GpuError, MigModeActivation};
use crate::plan::{self, Plan, Step};

/// One progress report: steps done, steps in all, the step about to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// Steps finished so far.
    pub done: u32,
    /// Steps in the plan.
    pub total: u32,
    /// The step about to run, for people.
    pub step: String,
}

/// Why an apply failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// A step failed; the steps before it were carried out.
    #[error("step {number} of {total} ({step}) failed: {error}")]
    Step {
        /// 1-based step number.
        number: u32,
        /// Steps in the plan.
        total: u32,
        /// The step, for people.
        step: String,
        /// The backend's answer.
        error: GpuError,
    },
    /// Every step ran, but the GPUs do not look as planned.
    #[error("the GPUs differ from the plan after applying it: {0}")]
    Verification(String),
    /// Observing the GPUs failed.
    #[error("{0}")]
    Backend(GpuError),
}

/// Runs `plan` on `backend`, sending a [`Progress`] before each step, and verifies the
/// outcome. Returns the number of steps carried out.
pub async fn execute(
    backend: Arc<dyn GpuBackend>,
    plan: &Plan,
    progress: &UnboundedSender<Progress>,
) -> Result<u32, ApplyError> {
    let total = u32::try_from(plan.step_count()).unwrap_or(u32::MAX);
    // GPU instances the plan creates are known by placement until the driver gives ids.
    let mut created: HashMap<(u32, u8), u32> = HashMap::new();
    for (done, step) in plan.steps().enumerate() {
        let done = done as u32;
        // A client that went away must not stop the apply.
        let _ = progress.send(Progress {
            done,
            total,
            step: step.to_string(),
        });
        let outcome = run_step(&backend, step, &created).await;
        match outcome {
            Ok(Some(gi)) => {
                if let Step::CreateGpuInstance { gpu, start, .. } = step {
                    created.insert((*gpu, *start), gi);
                }
            }
            Ok(None) => {}
            Err(error) => {
                return Err(ApplyError::Step {
                    number: done + 1,
                    total,
                    step: step.to_string(),
                    error,
                });
            }
        }
    }
    let _ = progress.send(Progress {
        done: total,
        total,
        step: "verifying".into(),
    });
    let observed = blocking(&backend, |b| b.observe())
        .await
        .map_err(ApplyError::Backend)?;
    plan::verify(plan, &observed).map_err(ApplyError::Verification)?;
    Ok(total)
}

/// Runs one step; returns the id of a GPU instance it created.
async fn run_step(
    backend: &Arc<dyn GpuBackend>,
    step: &Step,
    created: &HashMap<(u32, u8), u32>,
) -> Result<Option<u32>, GpuError> {
    let step = step.clone();
    let gi_created = match &step {
        Step::CreateComputeInstance {
            gpu,
            start,
            gpu_instance: None,
            ..
        } => created.get(&(*gpu, *start)).copied(),
        _ => None,
    };
    blocking(backend, move |b| match step {
        Step::DestroyComputeInstance {
            gpu,
            gpu_instance,
            compute_instance,
            ..
        } => b
            .destroy_compute_instance(gpu, gpu_instance, compute_instance)
            .map(|()| None),
        Step::DestroyGpuInstance {
            gpu, gpu_instance, ..
        } => b.destroy_gpu_instance(gpu, gpu_instance).map(|()| None),
        Step::SetMigMode { gpu, enabled } => match b.set_mig_mode(gpu, enabled)? {
            MigModeActivation::Activated => Ok(None),
            MigModeActivation::PendingReset => Err(GpuError::new(
                "set_mig_mode",
                Some(gpu),
                crate::gpu::ErrorCode::ResetRequired,
            )
            .with_detail(
                "the new MIG mode waits for a GPU reset, which this version does not perform",
            )),
        },
        Step::CreateGpuInstance {
            gpu,
            profile,
            start,
        } => b.create_gpu_instance(gpu, profile, start).map(Some),
        Step::CreateComputeInstance {
            gpu,
            gpu_instance,
            start,
            ..
        } => {
            let gi = gpu_instance.or(gi_created).ok_or_else(|| {
                GpuError::new(
                    "create_compute_instance",
                    Some(gpu),
                    crate::gpu::ErrorCode::NotFound,
                )
                .with_detail(format!("no GPU instance at slot {start}"))
            })?;
            b.create_compute_instance(gpu, gi).map(|_| None)
        }
        Step::SetComputeMode { gpu, mode } => b.set_compute_mode(gpu, mode).map(|()| None),
    })
    .await
}

/// Runs a blocking backend call on tokio's blocking pool.
pub async fn blocking<T: Send + 'static>(
    backend: &Arc<dyn GpuBackend>,
    call: impl FnOnce(&dyn GpuBackend) -> Result<T, GpuError> + Send + 'static,
) -> Result<T, GpuError> {
    let backend = Arc::clone(backend);
    tokio::task::spawn_blocking(move || call(backend.as_ref()))
        .await
        .unwrap_or_else(|e| {
            Err(
                GpuError::new("backend", None, crate::gpu::ErrorCode::Unknown)
                    .with_detail(format!("the backend call panicked: {e}")),
            )
        })
}
