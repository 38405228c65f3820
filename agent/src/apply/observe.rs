//! Observing the node: the GPUs through the GPU backend, the sharing on them through the
//! sharing tools, put together into one [`NodeState`].

use std::collections::BTreeMap;
use std::sync::Arc;

use std::path::{Path, PathBuf};

use crate::gpu::nvml::reset_blockers::join_labels;
use crate::gpu::{ErrorCode, GpuBackend, GpuError, ResetBlocker};
use crate::node::{MpsServerState, NodeState};
use crate::plan::{Plan, Step};
use crate::sharing::SharingTools;
use crate::sys::command::find_program;

/// The node as the agent reaches it: its GPUs through the backend, the sharing set up on
/// them through the sharing tools.
#[derive(Clone)]
pub struct NodeAccess {
    /// The hardware.
    pub backend: Arc<dyn GpuBackend>,
    /// MPS and time-slicing.
    pub sharing: Arc<SharingTools>,
    /// The observation read-only callers share ([`NodeAccess::observe_shared`]).
    pub shared: Arc<SharedObservation>,
    /// The host's root directory, for what is read of the host besides the GPUs (`/`; the
    /// simulated host under `--simulate`): agent.toml `host_root`.
    pub host_root: PathBuf,
}

/// An observation in progress that read-only callers join rather than each start their
/// own: the driver answers one caller at a time, so a thousand `Export`s from one user
/// would otherwise queue everyone's `status` behind them (issue 23: 3.2 s).
#[derive(Default)]
pub struct SharedObservation {
    current: std::sync::Mutex<Option<(Reads, u64, InFlight)>>,
}

/// An observation as a future every joiner polls; it runs on its own task.
type InFlight = futures_util::future::Shared<
    futures_util::future::BoxFuture<'static, Result<Arc<NodeState>, GpuError>>,
>;

impl NodeAccess {
    /// The node with `backend` and `sharing`.
    pub fn new(backend: Arc<dyn GpuBackend>, sharing: Arc<SharingTools>) -> NodeAccess {
        NodeAccess { backend, sharing, shared: Arc::default(), host_root: PathBuf::from("/") }
    }

    /// The same access, reading the host's files under `root` (see [`NodeAccess::host_root`]).
    pub fn with_host_root(self, root: impl Into<PathBuf>) -> NodeAccess {
        NodeAccess { host_root: root.into(), ..self }
    }

    /// An observation for a read-only answer (status, export, plans, environments): the
    /// one in progress, when it reads at least `reads` and began in the caller's `epoch`
    /// (no job began or ended since: the engine's count); else a new one, which later
    /// callers join. The answer is at most one observation's time old; anything that
    /// changes the GPUs observes afresh ([`NodeAccess::observe`]).
    pub async fn observe_shared(&self, reads: Reads, epoch: u64) -> Result<NodeState, GpuError> {
        use futures_util::FutureExt;
        let in_flight = {
            let mut current =
                self.shared.current.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match current.as_ref() {
                Some((covered, began, running))
                    if covered.covers(reads) && *began == epoch && running.peek().is_none() =>
                {
                    running.clone()
                }
                _ => {
                    let me = self.clone();
                    let task = tokio::spawn(async move { me.observe(reads).await.map(Arc::new) });
                    let running = async move {
                        task.await.unwrap_or_else(|e| {
                            Err(GpuError::new("observing the node", None, ErrorCode::Unknown)
                                .with_detail(crate::sys::task_failed(&e)))
                        })
                    }
                    .boxed()
                    .shared();
                    *current = Some((reads, epoch, running.clone()));
                    running
                }
            }
        };
        in_flight.await.map(|node| (*node).clone())
    }

    /// `node` with the live limits of its running MPS servers read where they were not
    /// (and the clients of the servers `with_clients` picks), off the async threads: one
    /// control run per daemon ([`SharingTools::read_mps_live`]).
    pub async fn read_live_limits(
        &self,
        mut node: NodeState,
        with_clients: impl Fn(&MpsServerState) -> bool + Send + Sync + 'static,
    ) -> Result<NodeState, GpuError> {
        if !node.mps.iter().any(|s| s.pid.is_some()) {
            return Ok(node);
        }
        let sharing = Arc::clone(&self.sharing);
        tokio::task::spawn_blocking(move || {
            sharing.read_mps_live(&mut node, with_clients);
            node
        })
        .await
        .map_err(panicked)
    }

    /// The first external program `plan` needs that cannot run here, or the MPS root it
    /// cannot write, as one line naming it, what it is needed for and the agent.toml
    /// setting that points at it; `None` when every one can run. Checked before the first step, so that a missing tool changes
    /// nothing rather than fail halfway and roll back.
    pub fn missing_tool(&self, plan: &Plan) -> Option<String> {
        let mps = self.sharing.mps.control_program();
        let nvidia_smi = self.sharing.timeslice.nvidia_smi();
        let mut checked: Vec<&Path> = Vec::new();
        for step in plan.steps() {
            let (program, purpose, setting) = match step {
                Step::StartMps { .. } | Step::StopMps { .. } => {
                    (mps, "to run MPS servers", "[mps] control")
                }
                Step::SetTimeslice { .. } => {
                    (nvidia_smi, "to set time-slice intervals", "[timeslice] nvidia_smi")
                }
                Step::ResetGpu { .. } => match self.backend.reset_program() {
                    Some(program) => (program, "to reset GPUs", "[timeslice] nvidia_smi"),
                    None => continue,
                },
                _ => continue,
            };
            if checked.contains(&program) {
                continue;
            }
            if let Err(why) = find_program(program) {
                return Some(format!(
                    "{} needs {} {purpose}, but it cannot run: {why} (set {setting} in agent.toml); nothing was changed",
                    plan.profile,
                    program.display()
                ));
            }
            checked.push(program);
        }
        let starts_mps = plan.steps().any(|s| matches!(s, Step::StartMps { .. }));
        let root = self.sharing.mps.root();
        if starts_mps && let Err(why) = may_create_in(root) {
            return Some(format!(
                "{} starts MPS servers, whose directories go under {}, but {why} (set [mps] root in agent.toml); nothing was changed",
                plan.profile,
                root.display()
            ));
        }
        None
    }

    /// GPU `gpu`'s PCI address as NVML writes it ([`GpuBackend::pci_bus_id`]), which names
    /// its sysfs directory under [`NodeAccess::host_root`].
    pub async fn pci_bus_id(&self, gpu: u32) -> Option<String> {
        let backend = Arc::clone(&self.backend);
        tokio::task::spawn_blocking(move || backend.pci_bus_id(gpu)).await.ok().flatten()
    }

    /// GPU `gpu`'s live readings ([`GpuBackend::telemetry`]), read off the async runtime.
    pub async fn telemetry(&self, gpu: u32) -> Option<crate::gpu::GpuTelemetry> {
        let backend = Arc::clone(&self.backend);
        tokio::task::spawn_blocking(move || backend.telemetry(gpu)).await.ok().flatten()
    }

    /// GPU `gpu`'s device minor number ([`GpuBackend::minor_number`]), which names its
    /// device node `/dev/nvidia<minor>` and its MIG capabilities under
    /// [`NodeAccess::host_root`] ([`crate::gpu::device_nodes`]).
    pub async fn minor_number(&self, gpu: u32) -> Option<u32> {
        let backend = Arc::clone(&self.backend);
        tokio::task::spawn_blocking(move || backend.minor_number(gpu)).await.ok().flatten()
    }

    /// The GPUs `plan` resets that cannot be reset on this host ([`GpuBackend::reset_blocker`]),
    /// as one line naming each GPU (`node`'s label), why and what to do; `None` when every
    /// reset can run. Checked before the first step, beside [`NodeAccess::missing_tool`]:
    /// a plan resets a GPU to make a MIG mode change take effect (Ampere), and a reset that
    /// cannot happen would leave the mode pending, so nothing is changed instead. GPUs with
    /// the same blocker and remedy share one clause.
    pub async fn reset_blocked(&self, plan: &Plan, node: &NodeState) -> Option<String> {
        // Each GPU reset, with the MIG mode the plan sets on it (`None`: already pending).
        let mut resets: BTreeMap<u32, Option<bool>> = BTreeMap::new();
        for step in plan.steps() {
            if let Step::ResetGpu { gpu, .. } = *step {
                let mode = plan.steps().find_map(|s| match *s {
                    Step::SetMigMode { gpu: g, enabled } if g == gpu => Some(enabled),
                    _ => None,
                });
                resets.insert(gpu, mode);
            }
        }
        if resets.is_empty() {
            return None;
        }
        let (backend, root) = (Arc::clone(&self.backend), self.host_root.clone());
        let gpus: Vec<u32> = resets.keys().copied().collect();
        let found = tokio::task::spawn_blocking(move || {
            gpus.into_iter()
                .filter_map(|gpu| backend.reset_blocker(gpu, &root).map(|b| (gpu, b)))
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_else(|e| {
            tracing::warn!(
                "cannot tell whether the GPUs can be reset: {}",
                crate::sys::task_failed(&e)
            );
            Vec::new()
        });
        refusal_line(&plan.profile, node, &resets, found)
    }

    /// A fresh observation: the GPUs and the MPS servers, and what `reads` asks for
    /// besides.
    pub async fn observe(&self, reads: Reads) -> Result<NodeState, GpuError> {
        let (backend, sharing) = (Arc::clone(&self.backend), Arc::clone(&self.sharing));
        tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let mut node = NodeState::of_gpus(backend.observe()?);
            let backend_ms = started.elapsed().as_secs_f64() * 1000.0;
            (node.mps, node.mps_details) = sharing.mps_observed();
            if reads.mps_clients {
                // The clients and the live limits, in one control run per daemon.
                sharing.read_mps_live(&mut node, |_| true);
            }
            if reads.timeslices {
                match sharing.timeslices() {
                    Ok(intervals) => node.timeslices = intervals,
                    Err(e) => tracing::debug!("time-slice intervals unknown: {e}"),
                }
            }
            let ms = started.elapsed().as_secs_f64() * 1000.0;
            tracing::debug!(?reads, "observed in {ms:.1} ms (GPU backend {backend_ms:.1} ms)");
            Ok(node)
        })
        .await
        .unwrap_or_else(|e| Err(panicked(e)))
    }
}

/// The one line refusing `profile` for the `blocked` GPUs (with the MIG mode each is set
/// to in `resets`), grouped by blocker and mode; `None` when none is blocked.
fn refusal_line(
    profile: &str,
    node: &NodeState,
    resets: &BTreeMap<u32, Option<bool>>,
    blocked: Vec<(u32, ResetBlocker)>,
) -> Option<String> {
    let mut groups: Vec<(ResetBlocker, Option<bool>, Vec<u32>)> = Vec::new();
    for (gpu, blocker) in blocked {
        let mode = resets.get(&gpu).copied().flatten();
        match groups.iter_mut().find(|(b, m, _)| *b == blocker && *m == mode) {
            Some((_, _, gpus)) => gpus.push(gpu),
            None => groups.push((blocker, mode, vec![gpu])),
        }
    }
    if groups.is_empty() {
        return None;
    }
    let label = |gpu: u32| match node.gpus.iter().find(|g| g.index == gpu) {
        Some(g) => g.label(),
        None => format!("GPU {gpu}"),
    };
    let clauses: Vec<String> = groups
        .iter()
        .map(|(blocker, mode, gpus)| {
            let labels: Vec<String> = gpus.iter().map(|&g| label(g)).collect();
            let many = gpus.len() > 1;
            let their = if many { "their" } else { "its" };
            let what = match mode {
                Some(_) => format!("change {their} MIG mode"),
                None => format!("make {their} pending MIG mode take effect"),
            };
            format!(
                "{} cannot be reset to {what}: {} ({})",
                join_labels(&labels),
                blocker.cause(many),
                blocker.remedy(gpus, *mode)
            )
        })
        .collect();
    Some(format!("{profile}: {}; nothing was changed", clauses.join("; ")))
}

/// Whether this process may make directories in `dir`, or in the nearest of its
/// ancestors that exists when `dir` does not yet, and may trust them
/// ([`crate::sys::trusted::check_creatable`]); why not, in a few words.
fn may_create_in(dir: &Path) -> Result<(), String> {
    // The root, or what of it exists, must be the agent's to trust: records another user
    // could forge there would name processes for the agent to signal.
    let existing = crate::sys::trusted::check_creatable(dir)
        .map_err(|why| format!("{why}: another user could forge the servers' records"))?;
    crate::sys::unix::may_write_dir(&existing)
        .map_err(|e| format!("this agent cannot write in {}: {e}", existing.display()))
}

/// What an observation reads besides the GPUs (the backend) and the MPS servers (their
/// files): each is an external program run, worth it only where it is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reads {
    /// The time-slice intervals: one nvidia-smi run (about 24 ms on an H100); unknown
    /// when it fails.
    pub timeslices: bool,
    /// The clients of each running MPS server, and the limits its control daemon applies
    /// now (the live limits), in one control run each, side by side.
    pub mps_clients: bool,
}

impl Reads {
    /// Whether an observation with these reads has everything `other` asks for.
    pub fn covers(self, other: Reads) -> bool {
        (self.timeslices || !other.timeslices) && (self.mps_clients || !other.mps_clients)
    }

    /// What a plan is made from: the intervals (a plan resets one that is not the
    /// target's) and the servers' clients (a plan refuses to stop a server in use).
    pub const FOR_PLANNING: Reads = Reads { timeslices: true, mps_clients: true };
    /// The GPUs and the servers only.
    pub const GPUS_AND_SERVERS: Reads = Reads { timeslices: false, mps_clients: false };

    /// What verifying `plan` needs afresh: the intervals only where it set one (the rest
    /// of the plan is checked against the GPUs and the servers' records and pid files).
    pub fn to_verify(plan: &Plan) -> Reads {
        let sets_interval = plan.steps().any(|s| matches!(s, Step::SetTimeslice { .. }));
        Reads { timeslices: sets_interval, mps_clients: false }
    }
}

/// The error of a backend call that panicked on the blocking pool.
pub(super) fn panicked(e: tokio::task::JoinError) -> GpuError {
    GpuError::new("backend", None, ErrorCode::Unknown).with_detail(crate::sys::task_failed(&e))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::apply::Executor;
    use crate::catalog::{MigProfile, parse_node_spec};
    use crate::gpu::sim::{SimBackend, SimOptions};
    use crate::gpu::{BackendKind, MigModeActivation};
    use crate::node::{ComputeMode, GpuState};
    use crate::plan::{self, PlanOptions};
    use crate::profile::ProfileStore;

    /// The in-process double, with blockers for some GPUs and a log of the roots asked.
    struct Blocked {
        sim: SimBackend,
        blockers: HashMap<u32, ResetBlocker>,
        roots: std::sync::Mutex<Vec<PathBuf>>,
    }

    impl GpuBackend for Blocked {
        fn kind(&self) -> BackendKind {
            self.sim.kind()
        }
        fn observe(&self) -> Result<Vec<GpuState>, GpuError> {
            self.sim.observe()
        }
        fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<MigModeActivation, GpuError> {
            self.sim.set_mig_mode(gpu, enabled)
        }
        fn create_gpu_instance(
            &self,
            gpu: u32,
            profile: &MigProfile,
            start: u8,
        ) -> Result<u32, GpuError> {
            self.sim.create_gpu_instance(gpu, profile, start)
        }
        fn create_compute_instance(&self, gpu: u32, gi: u32, slices: u8) -> Result<u32, GpuError> {
            self.sim.create_compute_instance(gpu, gi, slices)
        }
        fn destroy_compute_instance(&self, gpu: u32, gi: u32, ci: u32) -> Result<(), GpuError> {
            self.sim.destroy_compute_instance(gpu, gi, ci)
        }
        fn destroy_gpu_instance(&self, gpu: u32, gi: u32) -> Result<(), GpuError> {
            self.sim.destroy_gpu_instance(gpu, gi)
        }
        fn set_compute_mode(&self, gpu: u32, mode: ComputeMode) -> Result<(), GpuError> {
            self.sim.set_compute_mode(gpu, mode)
        }
        fn reset_gpu(&self, gpu: u32) -> Result<(), GpuError> {
            self.sim.reset_gpu(gpu)
        }
        fn reset_blocker(&self, gpu: u32, host_root: &Path) -> Option<ResetBlocker> {
            self.roots.lock().unwrap().push(host_root.to_path_buf());
            self.blockers.get(&gpu).cloned()
        }
    }

    /// `spec`'s node with `blockers`, and the plan of `profile` on it.
    fn planned(
        spec: &str,
        profile: &str,
        blockers: &[(u32, ResetBlocker)],
    ) -> (Arc<Blocked>, NodeAccess, NodeState, Plan) {
        let sim = SimBackend::new(&parse_node_spec(spec).unwrap(), SimOptions::default());
        let backend = Arc::new(Blocked {
            sim,
            blockers: blockers.iter().cloned().collect(),
            roots: Default::default(),
        });
        let access = Executor::for_tests(backend.clone()).node.with_host_root("/host");
        let node = NodeState::of_gpus(backend.observe().unwrap());
        let profile = ProfileStore::built_in().get(profile).unwrap().profile.clone();
        let plan = plan::plan(&node, &profile, &PlanOptions::default()).unwrap();
        (backend, access, node, plan)
    }

    fn refusal(spec: &str, profile: &str, blockers: &[(u32, ResetBlocker)]) -> Option<String> {
        let (backend, access, node, plan) = planned(spec, profile, blockers);
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let line = rt.block_on(access.reset_blocked(&plan, &node));
        let roots = backend.roots.lock().unwrap();
        assert!(roots.iter().all(|r| r == Path::new("/host")), "{roots:?}");
        line
    }

    #[test]
    fn a_plan_resetting_a_blocked_gpu_is_refused_in_one_line() {
        let drm = (0, ResetBlocker::NvidiaDrmModeset);
        assert_eq!(
            refusal("a100-40gb:2", "all-balanced", std::slice::from_ref(&drm)).as_deref(),
            Some(
                "all-balanced: GPU 0 (A100-SXM4-40GB) cannot be reset to change its MIG mode: \
                 nvidia_drm holds it with modeset=Y (stop the display manager and run modprobe -r \
                 nvidia_drm, or boot with nvidia-drm.modeset=0, then apply again); nothing was \
                 changed"
            )
        );
        // The same blocker on both GPUs: one clause.
        let both = [drm.clone(), (1, ResetBlocker::NvidiaDrmModeset)];
        let line = refusal("a100-40gb:2", "all-balanced", &both).unwrap();
        assert!(
            line.starts_with(
                "all-balanced: GPU 0 (A100-SXM4-40GB) and GPU 1 (A100-SXM4-40GB) cannot be reset \
                 to change their MIG mode: nvidia_drm holds them with modeset=Y ("
            ),
            "{line}"
        );
        // A VM without FLR: the remedy sets the mode the plan wanted and reboots.
        let vm = ResetBlocker::PassthroughWithoutFlr { evidence: "reset methods bus".into() };
        let line = refusal("a100-40gb:2", "all-balanced", &[(1, vm.clone()), drm]).unwrap();
        assert_eq!(line.matches("; ").count(), 2, "two clauses: {line}");
        assert!(line.contains("GPU 1 (A100-SXM4-40GB) cannot be reset"), "{line}");
        assert!(line.contains("nvidia-smi -i 1 -mig 1 and reboot the VM"), "{line}");
        assert!(!line.contains('\n'));
    }

    #[test]
    fn plans_without_a_reset_or_blocker_pass() {
        let drm = [(0, ResetBlocker::NvidiaDrmModeset), (1, ResetBlocker::NvidiaDrmModeset)];
        // Nothing to reset: nothing asked.
        let (backend, access, node, plan) = planned("a100-40gb:2", "all-mps", &drm);
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        assert_eq!(rt.block_on(access.reset_blocked(&plan, &node)), None);
        assert!(backend.roots.lock().unwrap().is_empty());
        // Hopper changes MIG mode without a reset.
        assert_eq!(refusal("h100-80gb:2", "all-balanced", &drm), None);
        // Resets, none blocked.
        assert_eq!(refusal("a100-40gb:2", "all-balanced", &[]), None);
        // Only GPU 0 is reset by half-balanced on two GPUs; GPU 1's blocker is not asked
        // about.
        assert_eq!(
            refusal("a100-40gb:2", "half-balanced", &[(1, ResetBlocker::NvidiaDrmModeset)]),
            None
        );
    }

    #[test]
    fn a_pending_mode_that_cannot_take_effect_asks_for_a_reboot() {
        let vm = ResetBlocker::PassthroughWithoutFlr { evidence: "no reset method".into() };
        let mut gpus = NodeState::of_gpus(
            SimBackend::new(&parse_node_spec("a100-40gb:1").unwrap(), SimOptions::default())
                .observe()
                .unwrap(),
        );
        gpus.gpus[0].mig_pending = Some(true);
        let profile = ProfileStore::built_in().get("all-balanced").unwrap().profile.clone();
        let plan = plan::plan(&gpus, &profile, &PlanOptions::default()).unwrap();
        let resets = BTreeMap::from([(0, None)]);
        let line = refusal_line(&plan.profile, &gpus, &resets, vec![(0, vm)]).unwrap();
        assert_eq!(
            line,
            "all-balanced: GPU 0 (A100-SXM4-40GB) cannot be reset to make its pending MIG mode \
             take effect: it is passed through to a virtual machine that does not let it be \
             reset (no function-level reset: no reset method) (reboot the VM, which makes the \
             pending MIG mode take effect, then apply again); nothing was changed"
        );
    }
}
