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
}

impl NodeAccess {
    /// The first external program `plan` needs that cannot run here, as one line naming
    /// it, what it is needed for and the agent.toml setting that points at it; `None` when
    /// every one can run. Checked before the first step, so that a missing tool changes
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
    GpuError::new("backend", None, ErrorCode::Unknown)
        .with_detail(format!("the backend call panicked: {e}"))
}
