//! Observing the node: the GPUs through the GPU backend, the sharing on them through the
//! sharing tools, put together into one [`NodeState`].

use std::sync::Arc;

use crate::gpu::{ErrorCode, GpuBackend, GpuError};
use crate::node::NodeState;
use crate::sharing::SharingTools;

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
