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
use gpushare_proto::health::HealthFault;
use tokio::sync::mpsc::UnboundedSender;

use super::clients::{Unread, Viewer};
use super::{Engine, EngineError, EngineEvent, JobKind, JobReport, JobResult, ProfileRef};
use crate::apply::Progress;
use crate::health::{Action, Cause, Fault, Health, Report};
use crate::node::NodeState;
use crate::plan::{MpsDevice, Plan, Step};

/// The most clients a fault's journal line names.
const JOURNAL_CLIENTS_MAX: usize = 32;

/// How long the journal line of a fault waits for the clients' read in `/proc`.
const CLIENTS_DEADLINE: Duration = Duration::from_secs(5);

impl Engine {
    /// The GPUs' faults.
    pub fn health(&self) -> &Arc<Health> {
        self.transactions.views().health()
    }

    /// The faults `status` shows for `gpu` (the registry keeps at most
    /// [`gpushare_proto::health::FAULTS_PER_GPU_MAX`] a GPU).
    pub(super) fn health_documents(&self, gpu: u32) -> Vec<HealthFault> {
        self.health().faults_on(gpu).iter().map(Fault::document).collect()
    }

    /// What a fault does to a plan (issue 42): a step that builds (creates an instance,
    /// starts an MPS server, sets a mode or an interval, puts limits back) on a faulted GPU
    /// or in a faulted MIG instance refuses an apply, naming the fault; steps that only take
    /// things down pass. At start-up the faulted GPUs' parts are left out instead (the
    /// other GPUs get their profile back), and a GPU reset's re-apply keeps the reset GPU's
    /// part alone.
    pub(super) fn unhealthy_scope(
        &self,
        mut plan: Plan,
        before: &NodeState,
        scope: Scope,
    ) -> Result<Plan, EngineError> {
        if let Scope::Gpu(gpu) = scope {
            plan.gpus.retain(|g| g.gpu == gpu);
        }
        let health = self.health();
        let mut left_out = Vec::new();
        for gpu_plan in &plan.gpus {
            let blocked = gpu_plan.steps.iter().find_map(|step| {
                let (gpu, instance) = builds_on(step, before)?;
                health.blocking(gpu, instance).map(|fault| (step, fault))
            });
            let Some((step, fault)) = blocked else { continue };
            if scope == Scope::StartUp {
                tracing::warn!(
                    gpu = gpu_plan.gpu,
                    "re-applying at start-up without GPU {}: {}",
                    gpu_plan.gpu,
                    fault.describe()
                );
                left_out.push(gpu_plan.gpu);
                continue;
            }
            return Err(EngineError::NotPossible(format!(
                "{} is unhealthy ({}); the apply would {} there; nothing was changed",
                fault.place(),
                fault.describe_cause(),
                step_words(step),
            )));
        }
        plan.gpus.retain(|g| !left_out.contains(&g.gpu));
        Ok(plan)
    }

    /// A planning error, with the lost GPUs' faults put first: a lost GPU is planned as
    /// last seen (or, after a restart, as a placeholder without a model), so its fault,
    /// not what the planner made of the placeholder, is what the operator needs.
    pub(super) fn lost_first(&self, error: EngineError) -> EngineError {
        let lost: Vec<String> = self
            .health()
            .faults()
            .iter()
            .filter(|f| f.cause == Cause::Lost)
            .map(Fault::describe)
            .collect();
        if lost.is_empty() {
            return error;
        }
        EngineError::NotPossible(format!("{}; and so: {error}", lost.join("; ")))
    }

    /// Follows the faults for as long as the agent runs: a journal line for each new one,
    /// the views rendered again at every change, the metrics told.
    /// `views` false keeps the views as they are (an agent that only reads); the views as
    /// the agent starts are the start-up's to render, so only later changes render them here.
    pub async fn follow_health(self: Arc<Self>, views: bool) {
        let mut changes = self.health().subscribe();
        let mut journaled: Vec<u64> = Vec::new();
        // Faults whose naming waits, warned of once.
        let mut waiting: Vec<u64> = Vec::new();
        let mut rendered = self.health().generation();
        let mut announced = None;
        loop {
            let faults = self.health().faults();
            journaled.retain(|id| faults.iter().any(|f| f.id == *id));
            waiting.retain(|id| faults.iter().any(|f| f.id == *id));
            let new: Vec<Fault> =
                faults.into_iter().filter(|f| !journaled.contains(&f.id)).collect();
            let mut unnamed = false;
            if !new.is_empty() {
                let read = self.clients_now().await;
                for fault in &new {
                    match naming(fault, &read) {
                        Naming::Later(why) => {
                            // A fault named with no client would pass the clean check at
                            // once: named at a later round.
                            if !waiting.contains(&fault.id) {
                                tracing::warn!(
                                    "the clients of {} are not named yet: {why}",
                                    fault.place()
                                );
                                waiting.push(fault.id);
                            }
                            unnamed = true;
                        }
                        Naming::Now { on, unknown } => {
                            journal_line(fault, &on, unknown.as_deref());
                            if fault.clients.is_none() && unknown.is_none() {
                                let pids = on.iter().map(|c| c.pid).collect();
                                self.health().name_clients(fault.id, pids);
                            }
                            journaled.push(fault.id);
                        }
                    }
                }
            }
            let generation = self.health().generation();
            if views && generation != rendered {
                self.refresh_views().await;
                rendered = generation;
            }
            // Told once per change (the metrics refresh on it), not at every round a
            // fault's naming waits.
            if announced != Some(generation) {
                self.events.emit(EngineEvent::HealthChanged);
                announced = Some(generation);
            }
            if unnamed {
                // Tried again in a second, or at the next change.
                let _ = tokio::time::timeout(Duration::from_secs(1), changes.changed()).await;
            } else if changes.changed().await.is_err() {
                return;
            }
            // Several changes at once (a burst of Xids) make one round.
            tokio::time::sleep(Duration::from_millis(50)).await;
            changes.mark_unchanged();
        }
    }

    /// Every client of the node's GPUs as root sees them (users, units), for the journal
    /// and the reset's check, with the MPS servers whose clients are not known; why not,
    /// when the node cannot be observed or `/proc` does not answer in time (never taken
    /// for "no client").
    async fn clients_now(&self) -> ClientRead {
        // The clients read from every control daemon, no intervals (as `clients` reads).
        let reads = crate::apply::Reads { timeslices: false, mps_clients: true };
        let observed = self.core.node.observe_shared(reads, self.epoch()).await;
        self.clients_in(observed.map_err(|e| e.to_string())?).await
    }

    /// The clients of an observation of the node, as [`Engine::clients_now`] reads them.
    async fn clients_in(&self, node: NodeState) -> ClientRead {
        let unread = super::clients::unread_clients(&node);
        match super::clients::table_within(node, Viewer::Root, CLIENTS_DEADLINE).await {
            Ok(table) => Ok((table.clients, unread)),
            Err(why) => Err(why.to_string()),
        }
    }

    /// MPS servers the health check found down (`(device, GPU, the clients the check before
    /// saw)`): each one that had clients is a fault on its GPU or MIG instance, asking for
    /// them to be restarted; the journal line names them.
    pub(super) async fn servers_died(&self, down: &[(String, u32, Vec<u32>)]) {
        if down.is_empty() {
            return;
        }
        // The instance a server's device is: the GPUs and the records are enough.
        let node = self.core.node.observe(crate::apply::Reads::GPUS_AND_SERVERS).await.ok();
        for (uuid, gpu, clients) in down {
            // No client died with it: the health check restarts it (or holds it down) and
            // says so; the GPU is no less healthy for it.
            if clients.is_empty() {
                continue;
            }
            let instance = node.as_ref().and_then(|n| {
                n.gpu(*gpu)?.instances.iter().find_map(|i| {
                    let ci = i.compute_instances.iter().find(|c| &c.uuid == uuid)?;
                    Some((i.id, Some(ci.id)))
                })
            });
            let what = format!("the MPS server of {uuid} died");
            let report =
                Report::on_gpu(*gpu, Cause::MpsServerDied, Action::RestartApplication, what);
            self.health().raise_with_clients(report.within(instance), clients.clone());
        }
    }

    /// Takes the apply lock for a reset of `gpu` and checks it before anything is touched:
    /// the GPU exists, has a fault a reset repairs, no client uses it, nothing on the host
    /// blocks a reset. `job` names the job in status and Busy messages.
    pub async fn begin_gpu_reset(&self, gpu: u32, job: &str) -> Result<GpuResetJob, EngineError> {
        self.gate.may_change()?;
        let profile = self.core.journal.snapshot().active_profile;
        let guard = self.gate.lock_for(job, reset_kind(gpu)).await?;
        let node = self.observe().await?;
        if node.gpu(gpu).is_none() {
            let named = gpu.to_string();
            let why = crate::plan::no_such_gpu(&node, &named, false);
            return Err(EngineError::NotPossible(format!("{why}; nothing was reset")));
        }
        if let Some(claim) = self.gate.claims.all().into_iter().find(|c| c.gpu == gpu) {
            let mut holder = claim.holder();
            holder.kind =
                JobKind::Bench { target: format!("GPU {gpu}, started by {}", claim.who()) };
            return Err(EngineError::Busy(Some(holder)));
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
        let unknown = |why: String| {
            EngineError::NotPossible(format!(
                "cannot tell who uses GPU {gpu} ({why}); nothing was reset"
            ))
        };
        let (clients, unread) = self.clients_in(node.clone()).await.map_err(unknown)?;
        if let Some(server) = unread.into_iter().find(|u| u.gpu == gpu) {
            return Err(unknown(server.why));
        }
        let users: Vec<String> = clients
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
        Ok(GpuResetJob { gpu, profile, servers, guard })
    }

    /// Carries out a reset job: the GPU's MPS servers stopped, the GPU reset, its faults
    /// cleared, and the active profile applied again (which builds that GPU's part anew).
    pub async fn run_gpu_reset(
        &self,
        job: GpuResetJob,
        progress: UnboundedSender<Progress>,
    ) -> JobReport {
        let started = Instant::now();
        let GpuResetJob { gpu, profile, servers, guard } = job;
        let mut report = JobReport {
            kind: reset_kind(gpu),
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
        // The servers stopped and the GPU reset off the async threads (a control run may
        // take its whole timeout): whether a server was stopped, and how it ended.
        let (sharing, backend) =
            (Arc::clone(&self.core.node.sharing), Arc::clone(&self.core.node.backend));
        let notes = progress.clone();
        let done = tokio::task::spawn_blocking(move || {
            let mut stopped = false;
            for uuid in &servers {
                let _ = notes.send(Progress::note(format!("stopping the MPS server of {uuid}")));
                if let Err(e) = sharing.mps.stop(uuid) {
                    let why = format!(
                        "stopping the MPS server of {uuid} before the reset of GPU {gpu}: {e}"
                    );
                    return (stopped, Err(why));
                }
                stopped = true;
            }
            let _ = notes.send(Progress::step(1, 1, format!("reset GPU {gpu}")));
            (stopped, backend.reset_gpu(gpu).map_err(|e| format!("resetting GPU {gpu}: {e}")))
        })
        .await;
        let (stopped, reset) = done.unwrap_or_else(|e| {
            (false, Err(format!("resetting GPU {gpu}: {}", crate::sys::task_failed(&e))))
        });
        report.changed = stopped;
        match reset {
            Ok(()) => {
                report.changed = true;
                report.steps_done = 1;
                for fault in self.health().clear_after_reset(gpu) {
                    tracing::info!(gpu, "{}: cleared by the reset", fault.describe());
                }
                tracing::info!(gpu, "GPU {gpu} reset");
            }
            Err(why) => report.error = Some(EngineError::NotPossible(why)),
        }
        if report.error.is_none() {
            report.result = JobResult::Success;
            match profile {
                Some(profile) => {
                    let _ = progress
                        .send(Progress::note(format!("applying {profile} to GPU {gpu} again")));
                    match self.reapply_to(gpu, guard, progress).await {
                        Ok(applied) => {
                            report.steps_total += applied.steps_total;
                            report.steps_done += applied.steps_done;
                            report.warnings.extend(applied.warnings);
                            if let Some(e) = applied.error {
                                report.result = JobResult::Failed;
                                report.error = Some(EngineError::NotPossible(format!(
                                    "GPU {gpu} was reset, but applying {profile} to it again failed: {e}"
                                )));
                            }
                        }
                        Err(e) => {
                            report.result = JobResult::Failed;
                            report.error = Some(EngineError::NotPossible(format!(
                                "GPU {gpu} was reset, but applying {profile} to it again was refused: {e}"
                            )));
                        }
                    }
                }
                None => self.refresh_views().await,
            }
        }
        report.duration = started.elapsed();
        report
    }
}

/// The clients of an observation (with the MPS servers whose clients are not known), or
/// why they could not be read at all.
type ClientRead = Result<(Vec<GpuClient>, Vec<Unread>), String>;

/// What a new fault's journal line can say of its clients.
#[derive(Debug, PartialEq)]
enum Naming {
    /// Not yet (why): a fault the clean check ends, whose clients are not all known.
    Later(String),
    /// The clients on it, and why others may be missing (`unknown`): its line is written
    /// now. It is named (for the clean check, in `status`) only where none is unknown.
    Now { on: Vec<GpuClient>, unknown: Option<String> },
}

/// What `fault`'s line can say of its clients from `read`: the clients named when it was
/// raised (a dead MPS server's, as far as they still run), else those on its GPU or
/// instance. Where some are not known, a fault that asks only for the application's
/// restart waits (its clean check needs them all); any other fault is told now, saying so.
fn naming(fault: &Fault, read: &ClientRead) -> Naming {
    let (clients, unknown) = match read {
        Ok((clients, unread)) => {
            let unknown = unread.iter().find(|u| fault.covers(u.gpu, u.gpu_instance));
            (clients.as_slice(), unknown.map(|u| u.why.clone()))
        }
        Err(why) => (&[][..], Some(why.clone())),
    };
    let on: Vec<GpuClient> = match &fault.clients {
        Some(pids) => {
            return Naming::Now {
                on: pids.iter().map(|&pid| known_or_bare(clients, pid, fault.gpu)).collect(),
                unknown: None,
            };
        }
        None => {
            clients.iter().filter(|c| fault.covers(c.gpu, c.gpu_instance_id)).cloned().collect()
        }
    };
    match unknown {
        Some(why) if fault.action == Action::RestartApplication => Naming::Later(why),
        unknown => Naming::Now { on, unknown },
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

/// Which GPUs an apply's plan covers, as faults allow (see [`Engine::unhealthy_scope`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Every GPU the profile selects; a fault refuses the apply.
    Whole,
    /// The start-up re-apply: a faulted GPU's part is left out.
    StartUp,
    /// The re-apply after a reset of this GPU: its part alone.
    Gpu(u32),
}

impl Engine {
    /// The active profile applied again to `gpu` alone, under the reset's `guard`.
    async fn reapply_to(
        &self,
        gpu: u32,
        guard: super::JobGuard,
        progress: UnboundedSender<Progress>,
    ) -> Result<JobReport, EngineError> {
        let deadline = tokio::time::Instant::now() + super::LOCK_WAIT;
        let document = self.core.journal.active_document();
        let active = self.core.journal.active_profile().unwrap_or_default();
        let source = match &document {
            Some(d) => ProfileRef::of_document(d),
            None => ProfileRef::Named(&active),
        };
        let profile = self.core.resolve_request(source).await?;
        let job = self
            .begin_apply_holding(source, profile, false, guard, deadline, Scope::Gpu(gpu))
            .await?;
        Ok(self.run_apply(&job, progress).await)
    }
}

/// A reset of one GPU, checked and holding the apply lock.
pub struct GpuResetJob {
    gpu: u32,
    /// The active profile, applied again after the reset.
    profile: Option<String>,
    /// The MPS servers on the GPU, stopped first.
    servers: Vec<String>,
    guard: super::JobGuard,
}

/// A GPU reset's job, as status and Busy messages name it.
fn reset_kind(gpu: u32) -> JobKind {
    JobKind::Apply { profile: format!("reset of GPU {gpu}") }
}

/// The GPU and GPU instance a step builds on (`None` for a new instance or the whole
/// GPU); `None` for a step that only takes something down.
fn builds_on(step: &Step, before: &NodeState) -> Option<(u32, Option<u32>)> {
    let instance_at = |gpu: u32, start: u8| before.gpu(gpu)?.instance_at(start).map(|i| i.id);
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
fn journal_line(fault: &Fault, clients: &[GpuClient], unknown: Option<&str>) {
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
    // One line, bounded: a busy GPU's clients beyond the first are counted (status lists
    // them all).
    let more = named.len().saturating_sub(JOURNAL_CLIENTS_MAX);
    let mut clients_text =
        if named.is_empty() { "none".to_string() } else { named[..named.len() - more].join(", ") };
    if more > 0 {
        clients_text.push_str(&format!(" and {more} more"));
    }
    if let Some(why) = unknown {
        clients_text = if named.is_empty() {
            format!("not known ({why})")
        } else {
            format!("{clients_text}, and others not known ({why})")
        };
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A fault raised in a fresh registry: `action` on GPU 1, or on its instance `gi`.
    fn fault(action: Action, gi: Option<u32>) -> Fault {
        let health = Health::default();
        let report =
            Report::on_gpu(1, Cause::Xid(31), action, "Xid 31").within(gi.map(|g| (g, Some(0))));
        health.raise(report);
        health.faults().remove(0)
    }

    fn client(pid: u32, gpu: u32, gi: Option<u32>) -> GpuClient {
        GpuClient { gpu_instance_id: gi, ..known_or_bare(&[], pid, gpu) }
    }

    fn unread(gpu: u32, gi: Option<u32>) -> Unread {
        Unread { gpu, gpu_instance: gi, why: format!("daemon of GPU {gpu} {gi:?} silent") }
    }

    fn pids(naming: &Naming) -> Vec<u32> {
        match naming {
            Naming::Now { on, .. } => on.iter().map(|c| c.pid).collect(),
            Naming::Later(why) => panic!("waits: {why}"),
        }
    }

    /// Issue 42 (CI): a fault's clients are its GPU's or instance's; where an MPS server
    /// there did not list its clients, an application fault waits (its clean check would
    /// pass on "nobody") and any other is told now, saying so; a server elsewhere, or
    /// clients named when raised, do not hold it up; a table not read at all holds up
    /// only application faults.
    #[test]
    fn a_fault_is_named_only_from_clients_that_are_all_known() {
        let clients = vec![client(10, 1, Some(3)), client(11, 1, Some(4)), client(12, 0, None)];
        let read: ClientRead = Ok((clients.clone(), vec![unread(0, None)]));
        let app = fault(Action::RestartApplication, Some(3));
        assert_eq!(pids(&naming(&app, &read)), [10]);
        let whole = fault(Action::ResetGpu, None);
        assert_eq!(pids(&naming(&whole, &read)), [10, 11]);
        assert!(matches!(naming(&whole, &read), Naming::Now { unknown: None, .. }));

        // A silent daemon on the instance: the application fault waits, the other is told.
        let read: ClientRead = Ok((clients.clone(), vec![unread(1, Some(3))]));
        assert!(matches!(naming(&app, &read), Naming::Later(why) if why.contains("silent")));
        let Naming::Now { on, unknown } = naming(&whole, &read) else { panic!() };
        assert_eq!((on.len(), unknown.is_some()), (2, true));
        // On the other instance, it does not hold the application fault up.
        let other = fault(Action::RestartApplication, Some(4));
        assert!(matches!(naming(&other, &read), Naming::Now { unknown: None, .. }));

        // Clients named when raised (a dead server's) are told whatever the read.
        let mut named = app.clone();
        named.clients = Some(vec![10, 99]);
        let failed: ClientRead = Err("/proc did not answer in time".into());
        assert_eq!(pids(&naming(&named, &failed)), [10, 99]);
        assert!(matches!(naming(&app, &failed), Naming::Later(_)));
        assert!(
            matches!(naming(&whole, &failed), Naming::Now { ref on, unknown: Some(_) } if on.is_empty())
        );
    }
}
