//! Observing the node: the GPUs through the GPU backend, the sharing on them through the
//! sharing tools, put together into one [`NodeState`].

use std::sync::Arc;

use std::path::Path;

use crate::gpu::{ErrorCode, GpuBackend, GpuError};
use crate::node::NodeState;
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
        NodeAccess { backend, sharing, shared: Arc::default() }
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

    /// A fresh observation: the GPUs and the MPS servers, and what `reads` asks for
    /// besides.
    pub async fn observe(&self, reads: Reads) -> Result<NodeState, GpuError> {
        let (backend, sharing) = (Arc::clone(&self.backend), Arc::clone(&self.sharing));
        tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let mut node = NodeState::of_gpus(backend.observe()?);
            let backend_ms = started.elapsed().as_secs_f64() * 1000.0;
            node.mps = sharing.mps_servers();
            if reads.mps_clients {
                sharing.read_mps_clients(&mut node.mps);
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

/// Whether this process may make directories in `dir`, or in the nearest of its
/// ancestors that exists when `dir` does not yet; why not, in a few words.
fn may_create_in(dir: &Path) -> Result<(), String> {
    // A relative root's last ancestor is "", the current directory.
    let existing = dir
        .ancestors()
        .map(|d| if d.as_os_str().is_empty() { Path::new(".") } else { d })
        .find(|d| d.exists())
        .unwrap_or(Path::new("/"));
    if !existing.is_dir() {
        return Err(format!("{} is not a directory", existing.display()));
    }
    crate::sys::unix::may_write_dir(existing)
        .map_err(|e| format!("this agent cannot write in {}: {e}", existing.display()))
}

/// What an observation reads besides the GPUs (the backend) and the MPS servers (their
/// files): each is an external program run, worth it only where it is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reads {
    /// The time-slice intervals: one nvidia-smi run (about 24 ms on an H100); unknown
    /// when it fails.
    pub timeslices: bool,
    /// The clients of each running MPS server: one control query each, side by side.
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
