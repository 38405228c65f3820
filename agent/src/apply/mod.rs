//! Executing plans: the GPUs of a plan are reconfigured concurrently, each GPU's steps in
//! order; every completed step is journaled; the result is verified against a fresh
//! observation. [`transaction`] wraps this in checkpoint, hooks and rollback.
//!
//! Backend calls block (NVML is synchronous), so each runs on tokio's blocking pool.

pub mod hooks;
pub mod journal;
mod observe;
pub mod transaction;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::future::join_all;
use tokio::sync::Semaphore;
use tokio::sync::mpsc::UnboundedSender;
use tracing::Instrument;

use crate::gpu::{ErrorCode, GpuError, MigModeActivation};
use crate::node::Operation;
use crate::plan::{self, MpsDevice, Plan, Step};
use crate::sharing::mps::ServerRecord;
use crate::sharing::{SharingError, SharingErrorKind};
use crate::sys::log as logging;
pub use observe::{NodeAccess, Reads};

/// One progress report, a job's `Progress(done, total, step)` signal: a step about to run,
/// number `done + 1` of `total`, or with `total` 0 a line without a count (verification,
/// a rollback).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// Steps begun before this one (of every GPU: the number counts steps as they start).
    pub done: u32,
    /// Steps in the plan; 0 for a line without a count.
    pub total: u32,
    /// The step about to run, or what is being done, for people.
    pub step: String,
}

impl Progress {
    /// Step `number` (from 1) of `total`.
    pub fn step(number: u32, total: u32, step: String) -> Progress {
        Progress { done: number.saturating_sub(1), total, step }
    }

    /// A line without a count.
    pub fn note(text: impl Into<String>) -> Progress {
        Progress { done: 0, total: 0, step: text.into() }
    }
}

/// What a plan is carried out for, which its progress lines say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// An apply: steps counted `[n/N]`, then `verifying`.
    Apply,
    /// A rollback: every line `rolling back: …`, uncounted, so that it cannot be taken for
    /// the apply's progress.
    Rollback,
    /// A return to a layout kept on purpose (after a bench): every line `restoring: …`,
    /// uncounted; nothing failed.
    Restore,
}

impl Purpose {
    /// The line of step `number` of `total`.
    fn line(self, number: u32, total: u32, text: String) -> Progress {
        match self {
            Purpose::Apply => Progress::step(number, total, text),
            Purpose::Rollback | Purpose::Restore => self.note(&text),
        }
    }

    /// A line without a count.
    fn note(self, text: &str) -> Progress {
        match self {
            Purpose::Apply => Progress::note(text),
            Purpose::Rollback | Purpose::Restore => {
                Progress::note(format!("{}: {text}", self.doing()))
            }
        }
    }

    /// What a rollback or restore line begins with.
    fn doing(self) -> &'static str {
        match self {
            Purpose::Apply => "applying",
            Purpose::Rollback => "rolling back",
            Purpose::Restore => "restoring",
        }
    }
}

/// Why executing a plan failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// A step failed.
    // "plan step": the number is the plan's (`gpushare-ctl plan`), not the progress line's,
    // which counts steps as they begin on any GPU.
    #[error("plan step {number} of {total} ({step}) failed: {error}")]
    Step {
        /// 1-based step number in plan order.
        number: u32,
        /// Steps in the plan.
        total: u32,
        /// The GPU it changes.
        gpu: u32,
        /// The step, for people.
        step: String,
        /// The backend's or the sharing tool's answer.
        error: StepError,
    },
    /// Recording a completed step failed.
    #[error("writing the journal failed: {0}")]
    Journal(String),
    /// Every step ran, but the GPUs do not look as planned.
    #[error("the GPUs differ from the plan after applying it: {0}")]
    Verification(String),
    /// Observing the GPUs failed.
    #[error("{0}")]
    Backend(GpuError),
}

/// Where completed steps are recorded (the journal); [`NoLog`] records nothing.
pub trait StepLog: Send + Sync {
    /// Step `index` (0-based, plan order) was carried out.
    fn step_done(&self, index: usize) -> std::io::Result<()>;
}

/// A [`StepLog`] that records nothing, for rollbacks and recovery.
#[derive(Debug, Clone, Copy)]
pub struct NoLog;

impl StepLog for NoLog {
    fn step_done(&self, _index: usize) -> std::io::Result<()> {
        Ok(())
    }
}

impl StepLog for journal::Journal {
    fn step_done(&self, index: usize) -> std::io::Result<()> {
        journal::Journal::step_done(self, index)
    }
}

/// Why one step failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StepError {
    /// The GPU backend failed.
    #[error("{0}")]
    Gpu(#[from] GpuError),
    /// An MPS or time-slice step failed.
    #[error("{operation} on GPU {gpu}: failed ({error})")]
    Sharing {
        /// The step's operation.
        operation: Operation,
        /// The GPU.
        gpu: u32,
        /// The sharing tool's answer.
        error: SharingError,
    },
}

/// How a plan is executed.
#[derive(Clone)]
pub struct Executor {
    /// The GPUs and the sharing tools.
    pub node: NodeAccess,
    /// Most GPUs changed at once; 0 for all of a plan's GPUs.
    pub max_parallel_gpus: usize,
}

impl Executor {
    /// An executor for unit tests: all GPUs at once, and MPS and nvidia-smi that do not
    /// exist (a test that needs them uses the fakes end to end).
    #[cfg(test)]
    pub fn for_tests(backend: Arc<dyn crate::gpu::GpuBackend>) -> Executor {
        use crate::sharing::SharingTools;
        use crate::sharing::mps::{MpsConfig, MpsController, MpsLaunch};
        use crate::sharing::timeslice::TimesliceControl;
        let sharing = SharingTools {
            mps: MpsController::new(MpsConfig {
                control: "/nonexistent/nvidia-cuda-mps-control".into(),
                root: "/nonexistent/gpushare-mps".into(),
                launch: MpsLaunch::Direct,
            }),
            timeslice: TimesliceControl::new("/nonexistent/nvidia-smi"),
        };
        Executor { node: NodeAccess::new(backend, Arc::new(sharing)), max_parallel_gpus: 0 }
    }
}

/// What the per-GPU tasks share.
struct Shared {
    node: NodeAccess,
    progress: UnboundedSender<Progress>,
    purpose: Purpose,
    log: Arc<dyn StepLog>,
    /// Steps begun on any GPU. Taken and reported under the lock, so that the numbers go
    /// out in order.
    started: Mutex<u32>,
    /// Steps carried out: a conditional reset that was not needed is not one.
    carried_out: AtomicU32,
    abort: AtomicBool,
    total: u32,
}

impl Executor {
    /// Runs `plan` for an apply: see [`Executor::execute_for`].
    pub async fn execute(
        &self,
        plan: &Plan,
        progress: &UnboundedSender<Progress>,
        log: Arc<dyn StepLog>,
    ) -> Result<u32, ApplyError> {
        self.execute_for(Purpose::Apply, plan, progress, log).await
    }

    /// Runs `plan`, sending a [`Progress`] as each step begins (numbered in the order steps
    /// begin on any GPU, each number once) and recording each completed step in `log`, then
    /// verifies the outcome. On the first failing step no further step starts on any GPU;
    /// steps already running finish. Returns the steps carried out (a conditional reset
    /// that turned out unneeded is journaled but not counted).
    pub async fn execute_for(
        &self,
        purpose: Purpose,
        plan: &Plan,
        progress: &UnboundedSender<Progress>,
        log: Arc<dyn StepLog>,
    ) -> Result<u32, ApplyError> {
        let total = u32::try_from(plan.step_count()).unwrap_or(u32::MAX);
        let shared = Arc::new(Shared {
            node: self.node.clone(),
            progress: progress.clone(),
            purpose,
            log,
            started: Mutex::new(0),
            carried_out: AtomicU32::new(0),
            abort: AtomicBool::new(false),
            total,
        });
        let width = match self.max_parallel_gpus {
            0 => plan.gpus.len().max(1),
            n => n,
        };
        let permits = Arc::new(Semaphore::new(width));
        let mut offset = 0;
        let mut runs = Vec::new();
        for gpu in plan.gpus.iter().filter(|g| !g.steps.is_empty()) {
            let steps: Vec<(usize, Step)> =
                gpu.steps.iter().cloned().enumerate().map(|(i, s)| (offset + i, s)).collect();
            offset += steps.len();
            let shared = Arc::clone(&shared);
            let permits = Arc::clone(&permits);
            runs.push(async move {
                let _permit = permits.acquire_owned().await.expect("semaphore stays open");
                run_gpu(&shared, steps).await
            });
        }
        let mut failures: Vec<ApplyError> =
            join_all(runs).await.into_iter().filter_map(Result::err).collect();
        failures.sort_by_key(|e| match e {
            ApplyError::Step { number, .. } => *number,
            _ => 0,
        });
        if let Some(first) = failures.into_iter().next() {
            return Err(first);
        }
        let _ = progress.send(purpose.note("verifying"));
        let observed =
            self.node.observe(Reads::to_verify(plan)).await.map_err(ApplyError::Backend)?;
        plan::verify(plan, &observed).map_err(ApplyError::Verification)?;
        Ok(shared.carried_out.load(Ordering::SeqCst))
    }
}

impl Shared {
    /// Counts a step as begun and says so.
    fn begin(&self, text: String) {
        let mut started = self.started.lock().unwrap_or_else(|e| e.into_inner());
        *started += 1;
        // A client that went away must not stop the apply.
        let _ = self.progress.send(self.purpose.line(*started, self.total, text));
    }
}

/// Runs one GPU's steps in order. Each step is logged as it begins, inside a span that
/// gives its lines (and those of the driver calls it makes) the GPU and, for an apply, the
/// step's number in plan order (a rollback's plan is not the one its apply numbered).
async fn run_gpu(shared: &Shared, steps: Vec<(usize, Step)>) -> Result<(), ApplyError> {
    // GPU instances the plan creates are known by placement until the driver gives ids.
    let mut created: HashMap<u8, u32> = HashMap::new();
    let mut pending_reset = None;
    for (index, step) in steps {
        if shared.abort.load(Ordering::SeqCst) {
            return Ok(());
        }
        let number = index as u32 + 1;
        let span = match shared.purpose {
            Purpose::Apply => logging::step_span(step.gpu(), number),
            Purpose::Rollback | Purpose::Restore => logging::gpu_span(step.gpu()),
        };
        let skip = matches!(step, Step::ResetGpu { always: false, .. }) && pending_reset.is_none();
        let text = if skip {
            format!("GPU {}: no reset needed (the MIG mode change took effect)", step.gpu())
        } else {
            step.to_string()
        };
        span.in_scope(|| match shared.purpose {
            Purpose::Apply => tracing::info!("plan step {number} of {}: {text}", shared.total),
            Purpose::Rollback | Purpose::Restore => {
                tracing::info!("{}: {text}", shared.purpose.doing())
            }
        });
        shared.begin(text);
        if !skip {
            let effect = run_step(shared, &step, &created).instrument(span).await;
            if effect.is_ok() {
                shared.carried_out.fetch_add(1, Ordering::SeqCst);
            }
            match effect {
                Ok(StepEffect::CreatedGpuInstance(start, id)) => {
                    created.insert(start, id);
                }
                Ok(StepEffect::ModePending(gpu)) => pending_reset = Some(gpu),
                Ok(StepEffect::Reset) => pending_reset = None,
                Ok(StepEffect::None) => {}
                Err(error) => {
                    shared.abort.store(true, Ordering::SeqCst);
                    return Err(ApplyError::Step {
                        number,
                        total: shared.total,
                        gpu: step.gpu(),
                        step: step.to_string(),
                        error,
                    });
                }
            }
        }
        let log = Arc::clone(&shared.log);
        let logged = tokio::task::spawn_blocking(move || log.step_done(index))
            .await
            .map_err(|e| ApplyError::Journal(crate::sys::task_failed(&e)))
            .and_then(|r| r.map_err(|e| ApplyError::Journal(e.to_string())));
        if let Err(e) = logged {
            shared.abort.store(true, Ordering::SeqCst);
            return Err(e);
        }
    }
    match pending_reset {
        // A mode change the driver keeps pending, and no reset planned (unknown model).
        Some(gpu) => Err(ApplyError::Step {
            number: shared.total,
            total: shared.total,
            gpu,
            step: format!("GPU {gpu}: MIG mode change"),
            error: StepError::Gpu(
                GpuError::new(Operation::SetMigMode.as_str(), Some(gpu), ErrorCode::ResetRequired)
                    .with_detail("the new MIG mode waits for a GPU reset"),
            ),
        }),
        None => Ok(()),
    }
}

/// What a step did that later steps of the same GPU need to know.
enum StepEffect {
    None,
    CreatedGpuInstance(u8, u32),
    ModePending(u32),
    Reset,
}

async fn run_step(
    shared: &Shared,
    step: &Step,
    created: &HashMap<u8, u32>,
) -> Result<StepEffect, StepError> {
    let step = step.clone();
    let gi_created = match &step {
        Step::CreateComputeInstance { start, gpu_instance: None, .. } => {
            created.get(start).copied()
        }
        _ => None,
    };
    let node = shared.node.clone();
    tokio::task::spawn_blocking(logging::in_current_span(move || {
        carry_out(&node, step, gi_created)
    }))
    .await
    .unwrap_or_else(|e| Err(StepError::Gpu(observe::panicked(e))))
}

/// Carries out one step (blocking): a backend call, or an MPS or time-slice change.
/// `gi_created` is the id of the GPU instance an earlier step created at the step's slot.
fn carry_out(
    node: &NodeAccess,
    step: Step,
    gi_created: Option<u32>,
) -> Result<StepEffect, StepError> {
    let b = node.backend.as_ref();
    let sharing = &node.sharing;
    let sharing_error = |operation: Operation, gpu: u32| {
        move |error: SharingError| StepError::Sharing { operation, gpu, error }
    };
    Ok(match step {
        Step::DestroyComputeInstance { gpu, gpu_instance, compute_instance, .. } => {
            b.destroy_compute_instance(gpu, gpu_instance, compute_instance)?;
            StepEffect::None
        }
        Step::DestroyGpuInstance { gpu, gpu_instance, .. } => {
            b.destroy_gpu_instance(gpu, gpu_instance)?;
            StepEffect::None
        }
        Step::SetMigMode { gpu, enabled } => match b.set_mig_mode(gpu, enabled)? {
            MigModeActivation::Activated => StepEffect::None,
            MigModeActivation::PendingReset => StepEffect::ModePending(gpu),
        },
        Step::ResetGpu { gpu, .. } => {
            b.reset_gpu(gpu)?;
            StepEffect::Reset
        }
        Step::CreateGpuInstance { gpu, profile, start } => {
            StepEffect::CreatedGpuInstance(start, b.create_gpu_instance(gpu, profile, start)?)
        }
        Step::CreateComputeInstance { gpu, gpu_instance, start, slices, .. } => {
            let gi = gpu_instance.or(gi_created).ok_or_else(|| {
                GpuError::new(
                    Operation::CreateComputeInstance.as_str(),
                    Some(gpu),
                    ErrorCode::NotFound,
                )
                .with_detail(format!("no GPU instance at slot {start}"))
            })?;
            b.create_compute_instance(gpu, gi, slices)?;
            StepEffect::None
        }
        Step::SetComputeMode { gpu, mode } => {
            b.set_compute_mode(gpu, mode)?;
            StepEffect::None
        }
        Step::StopMps { gpu, uuid } => {
            sharing.mps.stop(&uuid).map_err(sharing_error(Operation::StopMps, gpu))?;
            StepEffect::None
        }
        Step::StartMps { gpu, device, limits, multi_user } => {
            let (uuid, placement_start, compute_instance) = match device {
                MpsDevice::Gpu { uuid } => (uuid, None, 0),
                MpsDevice::Instance { start, compute_instance, .. } => {
                    // The instance may be new: its MIG UUID is known only now.
                    let index = compute_instance.map_or(0, |(index, _)| index);
                    let gpus = b.observe()?;
                    let uuid = gpus
                        .iter()
                        .find(|g| g.index == gpu)
                        .and_then(|g| g.instances.iter().find(|gi| gi.placement_start == start))
                        .and_then(|gi| gi.compute_instances.get(usize::from(index)))
                        .map(|ci| ci.uuid.clone())
                        .ok_or_else(|| {
                            let what = match compute_instance {
                                None => "a compute instance".to_string(),
                                Some(_) => format!("compute instance {index}"),
                            };
                            sharing_error(Operation::StartMps, gpu)(SharingError::new(
                                SharingErrorKind::NoDevice,
                                format!("no MIG instance with {what} at slot {start}"),
                            ))
                        })?;
                    (uuid, Some(start), index)
                }
            };
            let record = ServerRecord {
                uuid,
                gpu,
                placement_start,
                compute_instance,
                limits,
                multi_user,
                restarts: 0,
                daemon: None,
                overrides: Vec::new(),
            };
            sharing.mps.start(&record).map_err(sharing_error(Operation::StartMps, gpu))?;
            StepEffect::None
        }
        Step::SetMpsLimits { gpu, uuid, drift } => {
            sharing
                .mps
                .restore(&uuid, &drift)
                .map_err(sharing_error(Operation::SetMpsLimits, gpu))?;
            StepEffect::None
        }
        Step::SetTimeslice { gpu, interval } => {
            sharing
                .timeslice
                .set(gpu, interval)
                .map_err(sharing_error(Operation::SetTimeslice, gpu))?;
            StepEffect::None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::parse_node_spec as parse_spec;
    use crate::gpu::sim::{SimBackend, SimOptions};
    use crate::node::NodeState;
    use crate::profile::ProfileStore;

    /// Applies `profile` to simulated `spec` with `width` GPUs at once; the progress sent.
    fn progress_of(spec: &str, profile: &str, width: usize, options: SimOptions) -> Vec<Progress> {
        let sim = Arc::new(SimBackend::new(&parse_spec(spec).unwrap(), options));
        let node = NodeState::of_gpus(crate::gpu::GpuBackend::observe(sim.as_ref()).unwrap());
        let profile = ProfileStore::built_in().get(profile).unwrap().profile.clone();
        let plan = plan::plan(&node, &profile, &plan::PlanOptions::default()).unwrap();
        let executor = Executor { max_parallel_gpus: width, ..Executor::for_tests(sim) };
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
        let _ = rt.block_on(executor.execute(&plan, &tx, Arc::new(NoLog)));
        drop(tx);
        let mut sent = Vec::new();
        while let Ok(p) = rx.try_recv() {
            sent.push(p);
        }
        sent
    }

    #[test]
    fn steps_are_numbered_once_each_in_the_order_they_begin() {
        for width in [0, 1, 3] {
            let sent = progress_of("a100-40gb:8", "all-balanced", width, SimOptions::default());
            let (last, steps) = sent.split_last().unwrap();
            let total = steps.len() as u32;
            assert_eq!(total, 80);
            let numbers: Vec<(u32, u32)> = steps.iter().map(|p| (p.done, p.total)).collect();
            let expected: Vec<(u32, u32)> = (0..total).map(|done| (done, total)).collect();
            assert_eq!(numbers, expected, "width {width}");
            // Verification: a line without a count.
            assert_eq!((last.total, last.step.as_str()), (0, "verifying"), "width {width}");
        }
    }

    #[test]
    fn a_failure_stops_the_count_without_gaps() {
        let options =
            SimOptions { failures: vec![(Operation::CreateGpuInstance, 9)], ..Default::default() };
        let sent = progress_of("a100-40gb:8", "all-balanced", 0, options);
        let numbers: Vec<u32> = sent.iter().map(|p| p.done + 1).collect();
        assert_eq!(numbers, (1..=sent.len() as u32).collect::<Vec<_>>());
        assert!(sent.iter().all(|p| p.total == 80), "{sent:?}");
    }
}
