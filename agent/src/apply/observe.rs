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

    /// A fresh observation: the GPUs and the MPS servers, and `for_planning` also what
    /// only plans need: the time-slice intervals (one nvidia-smi run; unknown when it
    /// fails) and the clients of running MPS servers (one control query each).
    pub async fn observe(&self, for_planning: bool) -> Result<NodeState, GpuError> {
        let (backend, sharing) = (Arc::clone(&self.backend), Arc::clone(&self.sharing));
        tokio::task::spawn_blocking(move || {
            let mut node = NodeState::of_gpus(backend.observe()?);
            node.mps = sharing.mps_servers();
            if for_planning {
                sharing.read_mps_clients(&mut node.mps);
                match sharing.timeslices() {
                    Ok(intervals) => node.timeslices = intervals,
                    Err(e) => tracing::debug!("time-slice intervals unknown: {e}"),
                }
            }
            Ok(node)
        })
        .await
        .unwrap_or_else(|e| Err(panicked(e)))
    }
}

/// The error of a backend call that panicked on the blocking pool.
pub(super) fn panicked(e: tokio::task::JoinError) -> GpuError {
    GpuError::new("backend", None, ErrorCode::Unknown)
        .with_detail(format!("the backend call panicked: {e}"))
}
