//! The engine's side of the GPUs' health (issue 42): the faults the watcher raises
//! ([`crate::health`]) reach every view from here. Each new fault is written to the journal
//! in one structured line naming the clients that were on its GPU or instance (whose
//! processes the clean check then waits for); the views are rendered again without what
//! it covers, and the metrics hear of it. An apply that would build on a faulted GPU or
//! instance is refused before its first step, naming the fault; `gpushare-ctl gpu reset`
//! resets a GPU that asks for it and applies the active profile again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpushare_proto::clients::GpuClient;
use gpushare_proto::health::{FAULTS_PER_GPU_MAX, HealthFault};
use tokio::sync::mpsc::UnboundedSender;

use super::clients::Viewer;
use super::{Engine, EngineError, EngineEvent, JobKind, JobReport, JobResult, ProfileRef};
use crate::apply::Progress;
use crate::health::{Action, Cause, Fault, Health};
use crate::node::NodeState;
use crate::plan::{MpsDevice, Plan, Step};

/// How long the journal line of a fault waits for the clients' read in `/proc`.
const CLIENTS_DEADLINE: Duration = Duration::from_secs(5);

impl Engine {
    /// The GPUs' faults.
    pub fn health(&self) -> &Arc<Health> {
        self.transactions.views().health()
    }

    /// The faults `status` shows for `gpu`, the newest [`FAULTS_PER_GPU_MAX`].
    pub(super) fn health_documents(&self, gpu: u32) -> Vec<HealthFault> {
        let faults = self.health().faults_on(gpu);
        let skip = faults.len().saturating_sub(FAULTS_PER_GPU_MAX);
        faults.iter().skip(skip).map(Fault::document).collect()
    }

    /// Refuses a plan that would build on a faulted GPU or MIG instance (create an
    /// instance, start an MPS server, set a mode or an interval there), naming the fault.
    /// Steps that only take things down are let through.
    pub(super) fn refuse_unhealthy(
        &self,
        plan: &Plan,
        before: &NodeState,
    ) -> Result<(), EngineError> {
        let health = self.health();
        for step in plan.steps() {
            let Some((gpu, instance)) = builds_on(step, before) else { continue };
            if let Some(fault) = health.blocking(gpu, instance) {
                return Err(EngineError::NotPossible(format!(
                    "{} is unhealthy ({}); the apply would {} there; nothing was changed",
                    fault.place(),
                    fault.describe_cause(),
                    step_words(step),
                )));
            }
        }
        Ok(())
    }

    /// Follows the faults for as long as the agent runs: a journal line for each new one,
    /// the views rendered again at every change, the metrics told.
    pub async fn follow_health(self: Arc<Self>) {
        let mut changes = self.health().subscribe();
        let mut journaled: Vec<u64> = Vec::new();
        loop {
            let faults = self.health().faults();
            journaled.retain(|id| faults.iter().any(|f| f.id == *id));
            let new: Vec<Fault> =
                faults.into_iter().filter(|f| !journaled.contains(&f.id)).collect();
            if !new.is_empty() {
                let clients = self.clients_now().await;
                for fault in &new {
                    let on: Vec<GpuClient> = match &fault.clients {
                        // Named when raised (a dead MPS server's): as far as they still run.
                        Some(pids) => pids
                            .iter()
                            .map(|&pid| known_or_bare(&clients, pid, fault.gpu))
                            .collect(),
                        None => clients
                            .iter()
                            .filter(|c| {
                                c.gpu == fault.gpu
                                    && (fault.gpu_instance.is_none()
                                        || c.gpu_instance_id == fault.gpu_instance)
                            })
                            .cloned()
                            .collect(),
                    };
                    journal_line(fault, &on);
                    if fault.clients.is_none() {
                        self.health().name_clients(fault.id, on.iter().map(|c| c.pid).collect());
                    }
                    journaled.push(fault.id);
                }
            }
            self.refresh_views().await;
            self.events.emit(EngineEvent::HealthChanged);
            if changes.changed().await.is_err() {
                return;
            }
            // Several changes at once (a burst of Xids) make one round.
            tokio::time::sleep(Duration::from_millis(50)).await;
            changes.mark_unchanged();
        }
    }

    /// Every client of the node's GPUs as root sees them (users, units), for the journal;
    /// none when the node cannot be observed or `/proc` does not answer in time.
    async fn clients_now(&self) -> Vec<GpuClient> {
        let node = match self.observe().await {
            Ok(node) => node,
            Err(e) => {
                tracing::warn!("the clients of a faulted GPU are not named: {e}");
                return Vec::new();
            }
        };
        let read = tokio::task::spawn_blocking(move || {
            let mounts = crate::sys::mounts::Mounts::read();
            let user_name = &crate::sys::unix::cached_user_name;
            super::clients::table(
                &node,
                std::path::Path::new("/proc"),
                &Viewer::Root,
                &mounts,
                user_name,
            )
        });
        match tokio::time::timeout(CLIENTS_DEADLINE, read).await {
            Ok(Ok(table)) => table.clients,
            _ => {
                tracing::warn!(
                    "the clients of a faulted GPU are not named: /proc did not answer in time"
                );
                Vec::new()
            }
        }
    }

    /// MPS servers the health check found down (`(device, GPU, the clients the check before
    /// saw)`): each a fault on its GPU or MIG instance, asking for its clients to be
    /// restarted; the journal line names them.
    pub(super) async fn servers_died(&self, down: &[(String, u32, Vec<u32>)]) {
        if down.is_empty() {
            return;
        }
        let node = self.observe().await.ok();
        for (uuid, gpu, clients) in down {
            let instance = node.as_ref().and_then(|n| {
                n.gpu(*gpu)?.instances.iter().find_map(|i| {
                    let ci = i.compute_instances.iter().find(|c| &c.uuid == uuid)?;
                    Some((i.id, Some(ci.id)))
                })
            });
            let raised = self.health().raise(
                *gpu,
                instance,
                Cause::MpsServerDied,
                Action::RestartApplication,
                format!("the MPS server of {uuid} died"),
            );
            if let crate::health::Raised::New(id) = raised {
                self.health().name_clients(id, clients.clone());
            }
        }
    }

    /// Takes the apply lock for a reset of `gpu` and checks it before anything is touched:
    /// the GPU exists, has a fault a reset repairs, no client uses it, nothing on the host
    /// blocks a reset. `job` names the job in status and Busy messages.
    pub async fn begin_gpu_reset(&self, gpu: u32, job: &str) -> Result<GpuResetJob, EngineError> {
        self.gate.may_change()?;
        let profile = self.core.journal.snapshot().active_profile;
        let kind = JobKind::Apply { profile: format!("reset of GPU {gpu}") };
        let guard = self.gate.lock_for(job, kind).await?;
        let node = self.observe().await?;
        if node.gpu(gpu).is_none() {
            return Err(EngineError::NotPossible(format!(
                "no GPU {gpu} on this node (it has {}); nothing was reset",
                node.gpus.len()
            )));
        }
        let faults = self.health().faults_on(gpu);
        if faults.is_empty() {
            return Err(EngineError::NotPossible(format!(
                "GPU {gpu} is healthy: nothing to reset"
            )));
        }
        if let Some(f) = faults.iter().find(|f| f.action == Action::RebootNode) {
            return Err(EngineError::NotPossible(format!(
                "{}; a GPU reset does not repair it, nothing was reset",
                f.describe()
            )));
        }
        let users: Vec<String> = self
            .clients_now()
            .await
            .iter()
            .filter(|c| c.gpu == gpu)
            .map(|c| {
                format!(
                    "{}{}",
                    c.pid,
                    c.user.as_ref().map(|u| format!(" ({u})")).unwrap_or_default()
                )
            })
            .collect();
        if !users.is_empty() {
            return Err(EngineError::NotPossible(format!(
                "GPU {gpu} is in use by process {}; end them first, nothing was reset",
                users.join(", ")
            )));
        }
        let backend = Arc::clone(&self.core.node.backend);
        let host_root = self.core.node.host_root.clone();
        let blocker = tokio::task::spawn_blocking(move || backend.reset_blocker(gpu, &host_root))
            .await
            .ok()
            .flatten();
        if let Some(blocker) = blocker {
            return Err(EngineError::NotPossible(format!(
                "GPU {gpu} cannot be reset on this host: {}; {}; nothing was reset",
                blocker.cause(false),
                blocker.remedy(&[gpu], None)
            )));
        }
        let servers = node.mps.iter().filter(|s| s.gpu == gpu).map(|s| s.uuid.clone()).collect();
        Ok(GpuResetJob { gpu, profile, servers, guard: Some(guard) })
    }

    /// Carries out a reset job: the GPU's MPS servers stopped, the GPU reset, its faults
    /// cleared, and the active profile applied again (which builds that GPU's part anew).
    pub async fn run_gpu_reset(
        &self,
        mut job: GpuResetJob,
        progress: UnboundedSender<Progress>,
    ) -> JobReport {
        let started = Instant::now();
        let gpu = job.gpu;
        let mut report = JobReport {
            kind: JobKind::Apply { profile: format!("reset of GPU {gpu}") },
            result: JobResult::Failed,
            changed: false,
            steps_done: 0,
            steps_total: 1,
            duration: Duration::ZERO,
            error: None,
            warnings: Vec::new(),
            probe: None,
            bench: None,
        };
        let mps = &self.core.node.sharing.mps;
        for uuid in &job.servers {
            let _ = progress.send(Progress::note(format!("stopping the MPS server of {uuid}")));
            if let Err(e) = mps.stop(uuid) {
                report.error = Some(EngineError::NotPossible(format!(
                    "stopping the MPS server of {uuid} before the reset of GPU {gpu}: {e}"
                )));
                report.duration = started.elapsed();
                return report;
            }
            report.changed = true;
        }
        let _ = progress.send(Progress::step(1, 1, format!("reset GPU {gpu}")));
        let backend = Arc::clone(&self.core.node.backend);
        let reset = tokio::task::spawn_blocking(move || backend.reset_gpu(gpu)).await;
        match reset {
            Ok(Ok(())) => {
                report.changed = true;
                report.steps_done = 1;
                for fault in self.health().clear_after_reset(gpu) {
                    tracing::info!(gpu, "{}: cleared by the reset", fault.describe());
                }
                tracing::info!(gpu, "GPU {gpu} reset");
            }
            Ok(Err(e)) => {
                report.error = Some(EngineError::NotPossible(format!("resetting GPU {gpu}: {e}")));
            }
            Err(e) => {
                report.error = Some(EngineError::NotPossible(format!(
                    "resetting GPU {gpu}: {}",
                    crate::sys::task_failed(&e)
                )));
            }
        }
        // The lock goes before the re-apply takes it again.
        drop(job.guard.take());
        if report.error.is_none() {
            report.result = JobResult::Success;
            if let Some(profile) = job.profile.clone() {
                let _ = progress.send(Progress::note(format!("applying {profile} again")));
                match self
                    .begin_apply(ProfileRef::Named(&profile), false, &format!("reset of GPU {gpu}"))
                    .await
                {
                    Ok(apply) => {
                        let applied = self.run_apply(&apply, progress.clone()).await;
                        report.steps_total += applied.steps_total;
                        report.steps_done += applied.steps_done;
                        report.warnings.extend(applied.warnings);
                        if let Some(e) = applied.error {
                            report.result = JobResult::Failed;
                            report.error = Some(EngineError::NotPossible(format!(
                                "GPU {gpu} was reset, but applying {profile} again failed: {e}"
                            )));
                        }
                    }
                    Err(e) => {
                        report.result = JobResult::Failed;
                        report.error = Some(EngineError::NotPossible(format!(
                            "GPU {gpu} was reset, but applying {profile} again was refused: {e}"
                        )));
                    }
                }
            } else {
                self.refresh_views().await;
            }
        }
        report.duration = started.elapsed();
        report
    }
}

/// The client of `pid` as the table has it, else what `/proc` says of it (its user).
fn known_or_bare(clients: &[GpuClient], pid: u32, gpu: u32) -> GpuClient {
    if let Some(known) = clients.iter().find(|c| c.pid == pid) {
        return known.clone();
    }
    let uid = crate::sys::procfs::real_user(pid);
    GpuClient {
        pid,
        uid,
        user: uid.and_then(crate::sys::unix::cached_user_name),
        command: None,
        unit: None,
        container: None,
        gpu,
        gpu_uuid: String::new(),
        instance: None,
        gpu_instance_id: None,
        via: "mps".to_string(),
        mps_server: None,
        memory_bytes: None,
        share: None,
        unhealthy: None,
    }
}

/// A reset of one GPU, checked and holding the apply lock.
pub struct GpuResetJob {
    gpu: u32,
    /// The active profile, applied again after the reset.
    profile: Option<String>,
    /// The MPS servers on the GPU, stopped first.
    servers: Vec<String>,
    guard: Option<super::JobGuard>,
}

impl GpuResetJob {
    /// The GPU.
    pub fn gpu(&self) -> u32 {
        self.gpu
    }
}

/// The GPU and GPU instance a step builds on (`None` for a new instance or the whole
/// GPU); `None` for a step that only takes something down.
fn builds_on(step: &Step, before: &NodeState) -> Option<(u32, Option<u32>)> {
    let instance_at = |gpu: u32, start: u8| {
        before.gpu(gpu)?.instances.iter().find(|i| i.placement_start == start).map(|i| i.id)
    };
    match step {
        Step::DestroyComputeInstance { .. }
        | Step::DestroyGpuInstance { .. }
        | Step::StopMps { .. } => None,
        Step::SetMigMode { gpu, .. }
        | Step::CreateGpuInstance { gpu, .. }
        | Step::ResetGpu { gpu, .. }
        | Step::SetComputeMode { gpu, .. }
        | Step::SetTimeslice { gpu, .. } => Some((*gpu, None)),
        Step::CreateComputeInstance { gpu, gpu_instance, start, .. } => {
            Some((*gpu, gpu_instance.or_else(|| instance_at(*gpu, *start))))
        }
        Step::StartMps { gpu, device, .. } => match device {
            MpsDevice::Gpu { .. } => Some((*gpu, None)),
            MpsDevice::Instance { start, .. } => Some((*gpu, instance_at(*gpu, *start))),
        },
        Step::SetMpsLimits { gpu, uuid, .. } => Some((
            *gpu,
            before.gpu(*gpu).and_then(|g| {
                g.instances
                    .iter()
                    .find(|i| i.compute_instances.iter().any(|c| &c.uuid == uuid))
                    .map(|i| i.id)
            }),
        )),
    }
}

/// What a step would do, in words for the refusal.
fn step_words(step: &Step) -> String {
    match step {
        Step::StartMps { .. } => "start an MPS server".into(),
        Step::CreateGpuInstance { profile, .. } => format!("create a {} instance", profile.name),
        Step::CreateComputeInstance { .. } => "create a compute instance".into(),
        _ => step.operation().as_str().replace('_', " "),
    }
}

/// The fault's journal line: structured fields (GPU, instance, Xid, class, action, the
/// clients with their users and units) and one message.
fn journal_line(fault: &Fault, clients: &[GpuClient]) {
    let named: Vec<String> = clients
        .iter()
        .map(|c| {
            let user = c.user.clone().or_else(|| c.uid.map(|u| format!("uid {u}")));
            let mut words = vec![format!("pid {}", c.pid)];
            words.extend(user);
            words.extend(c.unit.clone());
            words.extend(c.container.as_ref().map(|id| format!("container {id}")));
            words.join(" ")
        })
        .collect();
    let clients_text = if named.is_empty() { "none".to_string() } else { named.join(", ") };
    let xid = match fault.cause {
        Cause::Xid(x) => Some(x),
        _ => None,
    };
    tracing::error!(
        gpu = fault.gpu,
        gpu_instance = fault.gpu_instance,
        compute_instance = fault.compute_instance,
        xid,
        class = fault.cause.class(),
        action = fault.action.as_str(),
        clients = %clients_text,
        "{}; clients on it: {clients_text}",
        fault.describe()
    );
}
